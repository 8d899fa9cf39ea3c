'use strict';
// Node BullMQ over a Redis Cluster, for tests/test_cluster.py.
//
//   node interop/cluster.js '<json>'      (tests/node_scripts.py's run_script; the json names the op)
//
// Common fields: op, nodes ([{host, port}], the cluster's startup nodes), queue, prefix (default
// "{bull}": a hash tag, so every key of a queue lives in one slot). Prints one line of JSON (the
// result) and exits 0; on error prints {"error", "name"} and exits 1. Ops:
//   work {count, concurrency?, timeoutMs?, ready?}  a Worker until `count` jobs are finished
//        -> {completed: [ids], failed: [ids], results: {id: returnvalue}, timedOut}
//        ({"ready": true} first prints {"ready": true} once the worker is connected)
//   getJobs {ids}  -> [{id, name, data, opts, state, returnvalue, attemptsMade} | null]
//   getWorkers {}  -> Queue.getWorkers() names

const IORedis = require('ioredis');
const { Queue, Worker } = require('bullmq');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function processJob(job) {
  const behave = (job.data && job.data.behave) || {};
  if (behave.sleepMs) await sleep(behave.sleepMs);
  if (behave.fail !== undefined) throw new Error(behave.fail);
  return { by: 'node', echo: job.data };
}

async function work(args, ctx) {
  const { count, concurrency = 1, timeoutMs = 30000, ready = false } = args;
  const completed = [];
  const failed = [];
  const results = {};
  let timedOut = false;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const check = () => { if (completed.length + failed.length >= count) finish(); };
  const worker = new Worker(args.queue, processJob, {
    connection: ctx.connection, prefix: ctx.prefix, concurrency, autorun: false,
  });
  worker.on('error', () => {});
  worker.on('completed', (job, value) => { completed.push(job.id); results[job.id] = value; check(); });
  worker.on('failed', (job) => {
    if (job && job.attemptsMade >= (job.opts.attempts || 1)) { failed.push(job.id); check(); }
  });
  const timer = setTimeout(() => { timedOut = true; finish(); }, timeoutMs);
  process.once('SIGTERM', () => { timedOut = true; finish(); });
  worker.run().catch(() => {});
  await worker.waitUntilReady();
  if (ready) process.stdout.write(JSON.stringify({ ready: true }) + '\n');
  check();
  await finished;
  clearTimeout(timer);
  await worker.close(timedOut);
  return { completed, failed, results, timedOut };
}

const ops = {
  work,
  async getJobs({ ids }, ctx) {
    const queue = new Queue(ctx.queueName, { connection: ctx.connection, prefix: ctx.prefix });
    try {
      return await Promise.all(ids.map(async (id) => {
        const job = await queue.getJob(id);
        if (!job) return null;
        return {
          id: job.id, name: job.name, data: job.data, opts: job.opts, state: await job.getState(),
          returnvalue: job.returnvalue ?? null, attemptsMade: job.attemptsMade,
        };
      }));
    } finally {
      await queue.close();
    }
  },
  async getWorkers(_args, ctx) {
    const queue = new Queue(ctx.queueName, { connection: ctx.connection, prefix: ctx.prefix });
    try {
      return (await queue.getWorkers()).map((w) => w.rawname || w.name);
    } finally {
      await queue.close();
    }
  },
};

async function main() {
  const args = JSON.parse(process.argv[2] || '{}');
  const { op } = args;
  if (!Object.prototype.hasOwnProperty.call(ops, op)) throw new TypeError(`unknown op: ${op}`);
  if (!args.queue || !Array.isArray(args.nodes)) throw new TypeError('"queue" and "nodes" are required');
  const connection = new IORedis.Cluster(args.nodes, { redisOptions: { maxRetriesPerRequest: null } });
  connection.on('error', () => {});
  await Promise.race([
    new Promise((resolve) => connection.once('ready', resolve)),
    sleep(args.connectTimeoutMs || 10000).then(() => { throw new Error('cannot connect to the cluster'); }),
  ]);
  try {
    return await ops[op](args, { connection, prefix: args.prefix || '{bull}', queueName: args.queue });
  } finally {
    await connection.quit().catch(() => connection.disconnect());
  }
}

function emit(line, code) {
  process.stdout.write(line + '\n', () => process.exit(code));
}

main().then(
  (result) => emit(JSON.stringify(result === undefined ? null : result), 0),
  (err) => emit(JSON.stringify({ error: String(err && err.message !== undefined ? err.message : err), name: err && err.name }), 1),
);
