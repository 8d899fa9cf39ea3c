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

const IORedis = require('ioredis');
const { Queue, Worker } = require('bullmq');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const args = JSON.parse(process.argv[2]);
  const prefix = args.prefix || 'bull';
  const connection = new IORedis(args.redis, { maxRetriesPerRequest: null });
  const queue = new Queue(args.queue, { connection, prefix });
  const worker = new Worker(args.queue, null, { connection, prefix, autorun: false });
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
    await connection.quit().catch(() => connection.disconnect());
  }
  return { results };
}

main().then(
  (out) => process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
