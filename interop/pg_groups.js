'use strict';
// Unmodified Node BullMQ on its PostgreSQL backend (createPostgresBackend) against bullmq-compat's
// per-group gate (our triggers, bullmq_compat/_backends/postgres/groups_sql/), for
// tests/test_interop_pg_groups.py.
//
//   node interop/pg_groups.js <op> '<json>'
//
// Common fields: postgres (URL), schema, migrate (passed to the connection as given; see
// interop/backend.js), queue, connectTimeoutMs.
//
// Ops:
//   work     {workers?, concurrency?, name?, drainDelay?, lockDuration?}: `workers` Worker objects
//            (default 1) of `concurrency` (default 1) each, in this process, with the recording
//            handler below. Prints {"ready": true, "pid"} once every Worker is connected; SIGTERM /
//            SIGINT close them (active jobs finish) and print {"stopped": true, "processed": n}.
//   retry    {id, state?}: Node's Job.fromId(queue, id).retry(state || 'failed') -> {state}
//            (the job's state as Node reads it right after)
//   retryJobs {state?, count?}: Node's queue.retryJobs({state, count}) -> {counts}
//   ready    {}: a Queue on the connection (migrate true: Node's runMigrations; false or absent:
//            its read-only ledger check), waitUntilReady, then getJobCounts -> {ready, counts}
//   jobStates {ids}: Node's Job.fromId(...).getState() of each id -> {states: [...]} (null: no job)
//
// The recording handler (`work`). Tables in the schema, created by the test beforehand
// (tests/pg_group_interop_helpers.py): interop_group_run, interop_group_count,
// interop_group_signal. For a job whose opts.group.id is g (a plain job: '') and data {s, sleepMs, fail, failUnless,
// holdUntil}:
//   at start  n := ++interop_group_count[queue, g] (how many of g's jobs run now, this one included)
//             INSERT interop_group_run (queue, g, s, job_id, w: 'node', name, pid, attempt, t0, n)
//   holdUntil: wait until interop_group_signal has (queue, holdUntil) (polled every 25 ms)
//   sleepMs:   sleep
//   at end    --interop_group_count[queue, g]; interop_group_run.t1 of this run
//   then throws UnrecoverableError(fail) when data.fail, or when data.failUnless names a signal
//   that is not there yet. t0 / t1 are the database's clock_timestamp() in ms, the same clock the
//   Python recorder uses.

const { Job, UnrecoverableError } = require('bullmq');
const backend = require('./backend');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const NOW_MS = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

const START_SQL = `
  WITH c AS (
    INSERT INTO interop_group_count AS c (queue, g, n) VALUES ($1, $2, 1)
    ON CONFLICT (queue, g) DO UPDATE SET n = c.n + 1
    RETURNING n
  )
  INSERT INTO interop_group_run (queue, g, s, job_id, w, name, pid, attempt, t0, n)
  SELECT $1, $2, $3, $4, 'node', $5, $6, $7, ${NOW_MS}, c.n FROM c
  RETURNING run_id`;

const END_SQL = `
  WITH d AS (UPDATE interop_group_count SET n = n - 1 WHERE queue = $1 AND g = $2 RETURNING n)
  UPDATE interop_group_run SET t1 = ${NOW_MS} WHERE run_id = $3`;

const SIGNAL_SQL = 'SELECT 1 FROM interop_group_signal WHERE queue = $1 AND key = $2';

function recorderPool(args, size) {
  const pg = require('pg');
  const { quoteSchemaName } = require('bullmq');
  const pool = new pg.Pool({
    connectionString: args.postgres, max: size, connectionTimeoutMillis: args.connectTimeoutMs || 10000,
    options: `-c search_path=${quoteSchemaName(args.schema)}`,
  });
  pool.on('error', () => {});
  return pool;
}

async function waitSignal(pool, queue, key, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (!(await pool.query(SIGNAL_SQL, [queue, key])).rows.length) {
    if (Date.now() > deadline) throw new Error(`signal ${key} never came`);
    await sleep(25);
  }
}

async function work(args, b) {
  const workersN = args.workers || 1;
  const concurrency = args.concurrency || 1;
  const name = args.name || 'node';
  const pool = recorderPool(args, workersN * concurrency + 2);
  let processed = 0;

  async function handler(job) {
    const data = job.data || {};
    const g = job.opts && job.opts.group ? job.opts.group.id : ''; // '': a plain job (a flow parent, say)
    const { rows } = await pool.query(START_SQL, [
      args.queue, g, data.s === undefined ? null : data.s, job.id, name, process.pid, job.attemptsStarted,
    ]);
    const runId = rows[0].run_id;
    if (data.holdUntil) await waitSignal(pool, args.queue, data.holdUntil, 120000);
    if (data.sleepMs) await sleep(data.sleepMs);
    await pool.query(END_SQL, [args.queue, g, runId]);
    processed += 1;
    if (data.fail) throw new UnrecoverableError(String(data.fail));
    if (data.failUnless && !(await pool.query(SIGNAL_SQL, [args.queue, data.failUnless])).rows.length) {
      throw new UnrecoverableError(`no ${data.failUnless} yet`);
    }
    return { g, s: data.s };
  }

  const workerOpts = { concurrency };
  if (args.drainDelay !== undefined) workerOpts.drainDelay = args.drainDelay;
  if (args.lockDuration !== undefined) workerOpts.lockDuration = args.lockDuration;
  const workers = [];
  for (let i = 0; i < workersN; i += 1) {
    const worker = new b.Worker(args.queue, handler, b.options(workerOpts));
    worker.on('error', (err) => process.stderr.write(`worker error: ${err && err.stack || err}\n`));
    workers.push(worker);
  }
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  await pool.query('SELECT 1 FROM interop_group_run LIMIT 0'); // the recorder's tables are there
  process.stdout.write(JSON.stringify({ ready: true, pid: process.pid }) + '\n');

  await new Promise((resolve) => {
    process.once('SIGTERM', resolve);
    process.once('SIGINT', resolve);
  });
  await Promise.all(workers.map((w) => w.close()));
  await pool.end().catch(() => {});
  return { stopped: true, processed };
}

async function withQueue(args, b, fn) {
  const queue = new b.Queue(args.queue, b.options());
  try {
    return await fn(queue);
  } finally {
    await queue.close().catch(() => {});
  }
}

const ops = {
  work,
  async retry(args, b) {
    return withQueue(args, b, async (queue) => {
      const job = await Job.fromId(queue, args.id);
      if (!job) throw new Error(`no job ${args.id}`);
      await job.retry(args.state || 'failed');
      return { state: await job.getState() };
    });
  },
  async retryJobs(args, b) {
    return withQueue(args, b, async (queue) => {
      const opts = { state: args.state || 'failed' };
      if (args.count !== undefined) opts.count = args.count;
      await queue.retryJobs(opts);
      return { counts: await queue.getJobCounts() };
    });
  },
  async ready(args, b) {
    return withQueue(args, b, async (queue) => {
      await queue.waitUntilReady();
      return { ready: true, counts: await queue.getJobCounts() };
    });
  },
  async jobStates(args, b) {
    return withQueue(args, b, async (queue) => {
      const states = [];
      for (const id of args.ids) {
        const job = await Job.fromId(queue, id);
        states.push(job ? await job.getState() : null);
      }
      return { states };
    });
  },
};

async function main() {
  const [op, raw] = process.argv.slice(2);
  const args = raw ? JSON.parse(raw) : {};
  if (!Object.prototype.hasOwnProperty.call(ops, op)) throw new TypeError(`unknown op: ${op}`);
  if (!args.postgres) throw new TypeError('"postgres" is required');
  if (!args.queue) throw new TypeError('"queue" is required');
  const b = backend.open(args);
  try {
    return await ops[op](args, b);
  } finally {
    await b.close();
  }
}

main().then(
  (result) => process.stdout.write(JSON.stringify(result === undefined ? null : result) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
