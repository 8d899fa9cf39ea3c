'use strict';
// Runs a sequence of adds (and takes/completions by hand) with Node BullMQ, for the deduplication
// parity tests (tests/test_interop_dedup.py runs the same steps with bullmq-compat).
//
//   node interop/dedup.js '{"redis": url, "queue": name, "steps": [...]}'
//
// Steps, each giving one result in order:
//   {"add": {"name", "data", "opts"}}   -> {"id": the id queue.add returned}
//   {"sleep": ms}                        -> {}
//   {"take": token}                      -> {"id": id of the job worker.getNextJob(token) took, or null}
//   {"complete": token}                  -> {"id": id of the job completed} (the job taken with token)
//   {"probe": deduplicationId}           -> {"value": GET de key, "pttl": PTTL de key, "next": EXISTS dn key}
// Prints one JSON line: {"results": [...]}.
//
// PostgreSQL (Node's own backend, see interop/backend.js): {"postgres": url, "schema": s,
// "migrate"?: true, "queue", "steps"} in place of redis/prefix. A probe then reads the schema's
// dedup and dedup_next tables and answers in the Redis shape: value = dedup.job_id (null when
// there is no row, or its expire_at_ms has passed), pttl = expire_at_ms - now (-1 no expiry,
// -2 no live row), next = 1 when a dedup_next row exists, else 0; plus "row" (the dedup row as
// stored, expired or not, or null) since Postgres expires lazily.

const backend = require('./backend');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const args = JSON.parse(process.argv[2]);
  const b = backend.open(args);
  const { connection, prefix } = b;
  const queue = new b.Queue(args.queue, b.options());
  const worker = new b.Worker(args.queue, null, b.options({ autorun: false }));
  const held = {};
  const results = [];
  try {
    for (const step of args.steps) {
      if (step.add) {
        const job = await queue.add(step.add.name, step.add.data ?? {}, step.add.opts ?? {});
        results.push({ id: job.id });
      } else if (step.sleep !== undefined) {
        await sleep(step.sleep);
        results.push({});
      } else if (step.take !== undefined) {
        const job = await worker.getNextJob(step.take, { block: false });
        if (job) held[step.take] = job;
        results.push({ id: job ? job.id : null });
      } else if (step.complete !== undefined) {
        const job = held[step.complete];
        await job.moveToCompleted('done', step.complete, false);
        delete held[step.complete];
        results.push({ id: job.id });
      } else if (step.probe !== undefined && b.kind === 'postgres') {
        results.push(await probePostgres(b, args.queue, step.probe));
      } else if (step.probe !== undefined) {
        const key = `${prefix}:${args.queue}:de:${step.probe}`;
        const [value, pttl, next] = await Promise.all([
          connection.get(key), connection.pttl(key),
          connection.exists(`${prefix}:${args.queue}:dn:${step.probe}`)]);
        results.push({ value, pttl, next });
      } else {
        throw new TypeError(`unknown step ${JSON.stringify(step)}`);
      }
    }
  } finally {
    await worker.close(true).catch(() => {});
    await queue.close().catch(() => {});
    await b.close();
  }
  return { results };
}

async function probePostgres(b, queue, dedupId) {
  const [rows, next] = await Promise.all([
    b.sql('SELECT job_id, expire_at_ms FROM dedup WHERE queue = $1 AND dedup_id = $2', [queue, dedupId]),
    b.sql('SELECT 1 FROM dedup_next WHERE queue = $1 AND dedup_id = $2', [queue, dedupId]),
  ]);
  const row = rows.length ? { job_id: rows[0].job_id, expire_at_ms: rows[0].expire_at_ms === null ? null : Number(rows[0].expire_at_ms) } : null;
  const now = Date.now();
  const live = row && (row.expire_at_ms === null || row.expire_at_ms > now);
  return {
    value: live ? row.job_id : null,
    pttl: !live ? -2 : row.expire_at_ms === null ? -1 : row.expire_at_ms - now,
    next: next.length ? 1 : 0,
    row,
  };
}

main().then(
  (out) => process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
