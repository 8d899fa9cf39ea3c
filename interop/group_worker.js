'use strict';
// Unmodified Node BullMQ Workers for the per-group FIFO tests (tests/test_interop_groups.py).
//
//   node interop/group_worker.js '<json>'
//
// JSON fields: redis (URL), queue, prefix (default "bull"), workers (Worker objects in this
// process, default 1), concurrency (per Worker, default 1), rec (Redis key the handler records
// into, default "rec:<queue>"), lockDuration, stalledInterval, maxStalledCount, removeOnComplete,
// removeOnFail (Worker options, passed as given).
//
// The handler of a job with data {g, s, sleepMs, fail, failTimes} records its run in Redis,
// exactly as tests/group_helpers.py's Python processor does:
//   INCR  <rec>:run:<g>            at start (the reply, n, is how many of g's jobs run now)
//   RPUSH <rec>:starts {g,s,id,a,t0,w:"node",pid,p}   at start (p: job.processedOn)
//   ...sleep sleepMs...
//   DECR  <rec>:run:<g>  and  RPUSH <rec> {g,s,id,a,t0,t1,n,w:"node",pid}   at the end
// (a: the attempt, attemptsMade + 1; pid: this process, so a test that SIGKILLs it can tell which
// repeated runs the kill explains)
// then throws when data.fail (UnrecoverableError: fails for good) or while
// attemptsMade < data.failTimes. Times are Date.now() (whole ms, the wall clock).
//
// Prints {"ready": true, "pid": ...} once every Worker is connected; SIGTERM/SIGINT close the
// Workers (active jobs finish) and print {"stopped": true, "processed": n}.

const IORedis = require('ioredis');
const { Worker, UnrecoverableError } = require('bullmq');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const args = JSON.parse(process.argv[2] || '{}');
  if (!args.queue) throw new TypeError('"queue" is required');
  const url = args.redis || 'redis://127.0.0.1:6379';
  const prefix = args.prefix || 'bull';
  const rec = args.rec || `rec:${args.queue}`;
  const recorder = new IORedis(url, { maxRetriesPerRequest: null });
  let processed = 0;

  async function handler(job) {
    const data = job.data || {};
    const g = data.g;
    const a = job.attemptsMade + 1;
    const t0 = Date.now();
    const [[, n]] = await recorder.multi()
      .incr(`${rec}:run:${g}`)
      .rpush(`${rec}:starts`, JSON.stringify({ g, s: data.s, id: job.id, a, t0, w: 'node', pid: process.pid,
        p: job.processedOn }))
      .exec();
    if (data.sleepMs) await sleep(data.sleepMs);
    const t1 = Date.now();
    await recorder.multi()
      .decr(`${rec}:run:${g}`)
      .rpush(rec, JSON.stringify({ g, s: data.s, id: job.id, a, t0, t1, n, w: 'node', pid: process.pid }))
      .exec();
    processed += 1;
    if (data.fail) throw new UnrecoverableError(String(data.fail));
    if (data.failTimes !== undefined && job.attemptsMade < data.failTimes) throw new Error('failing on purpose');
    return { g, s: data.s };
  }

  const workerOpts = { prefix, concurrency: args.concurrency || 1 };
  if (args.lockDuration) workerOpts.lockDuration = args.lockDuration;
  if (args.stalledInterval) workerOpts.stalledInterval = args.stalledInterval;
  if (args.maxStalledCount !== undefined) workerOpts.maxStalledCount = args.maxStalledCount;
  if (args.removeOnComplete !== undefined) workerOpts.removeOnComplete = args.removeOnComplete;
  if (args.removeOnFail !== undefined) workerOpts.removeOnFail = args.removeOnFail;
  const workers = [];
  for (let i = 0; i < (args.workers || 1); i += 1) {
    const connection = new IORedis(url, { maxRetriesPerRequest: null });
    const worker = new Worker(args.queue, handler, { ...workerOpts, connection });
    worker.on('error', () => {});
    workers.push({ worker, connection });
  }
  await Promise.all(workers.map(({ worker }) => worker.waitUntilReady()));
  process.stdout.write(JSON.stringify({ ready: true, pid: process.pid }) + '\n');

  await new Promise((resolve) => {
    process.once('SIGTERM', resolve);
    process.once('SIGINT', resolve);
  });
  await Promise.all(workers.map(({ worker }) => worker.close()));
  await Promise.all(workers.map(({ connection }) => connection.quit().catch(() => connection.disconnect())));
  await recorder.quit().catch(() => recorder.disconnect());
  return { stopped: true, processed };
}

main().then(
  (result) => process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
