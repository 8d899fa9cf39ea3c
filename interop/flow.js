'use strict';
// Node BullMQ flows for the Python interop tests (tests/test_interop_flows.py).
//
//   node interop/flow.js <op> '<json>'
//
// Prints one line of JSON (the result) and exits 0; on error prints {"error", "name"} and exits 1.
// Common fields: redis (URL), prefix (default "bull"); or, for Node's PostgreSQL backend (see
// interop/backend.js), postgres (URL), schema, migrate (true lets Node create the schema). Ops:
//   add {flow}                          FlowProducer.add          -> tree of {id, queueName, parentKey, children}
//   addBulk {flows}                     FlowProducer.addBulk      -> [tree...]
//   get {id, queueName, depth?, maxChildren?}  FlowProducer.getFlow -> tree with state, returnvalue, failedReason
//   jobCall {queue, id, method, args?}  any Job method (getChildrenValues, getDependencies, ...) on Job.fromId
//   run {flow, queues, timeoutMs?}      adds the flow, runs one Worker (concurrency 1) per queue until the
//                                       root job is completed or failed -> {id, state}
//   work {queue, count, timeoutMs?, ready?}  a Worker until `count` jobs finished -> {completed, failed, timedOut}
//                                       ({"ready": true} also prints {"ready": true} first, for NodeProcess)
// The processor takes its behaviour from job.data.behave: {sleepMs, fail, children, return}; "children"
// returns what a parent sees of its children (values, ignored failures, dependency counts).

const { Job } = require('bullmq');
const backend = require('./backend');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function processJob(job) {
  const behave = (job.data && job.data.behave) || {};
  if (behave.sleepMs) await sleep(behave.sleepMs);
  if (behave.fail !== undefined) throw new Error(behave.fail);
  if (behave.children) {
    return {
      children: await job.getChildrenValues(),
      ignored: await job.getIgnoredChildrenFailures(),
      counts: await job.getDependenciesCount(),
    };
  }
  if ('return' in behave) return behave.return;
  return { echo: job.data };
}

async function treeJSON(node, detailed) {
  if (!node) return null;
  const { job } = node;
  const out = { id: job.id, name: job.name, queueName: job.queueName, parentKey: job.parentKey ?? null };
  if (detailed) {
    out.state = await job.getState();
    out.returnvalue = job.returnvalue ?? null;
    out.failedReason = job.failedReason ?? null;
  }
  if (node.children) out.children = await Promise.all(node.children.map((c) => treeJSON(c, detailed)));
  return out;
}

async function plain(value) {
  if (value === undefined) return null;
  if (value instanceof Map) return Object.fromEntries(value);
  return value;
}

function newWorker(queue, ctx, extra = {}) {
  const worker = new ctx.backend.Worker(queue, processJob, ctx.backend.options({
    concurrency: 1, autorun: false, ...extra,
  }));
  worker.on('error', () => {});
  worker.run().catch(() => {});
  return worker;
}

const ops = {
  async add({ flow }, ctx) {
    return treeJSON(await ctx.producer.add(flow), false);
  },
  async addBulk({ flows }, ctx) {
    return Promise.all((await ctx.producer.addBulk(flows)).map((t) => treeJSON(t, false)));
  },
  async get({ id, queueName, depth, maxChildren }, ctx) {
    const opts = { id, queueName };
    if (depth !== undefined) opts.depth = depth;
    if (maxChildren !== undefined) opts.maxChildren = maxChildren;
    return treeJSON(await ctx.producer.getFlow(opts), true);
  },
  async jobCall({ queue, id, method, args = [] }, ctx) {
    const q = new ctx.backend.Queue(queue, ctx.backend.options());
    try {
      const job = await Job.fromId(q, id);
      if (!job) throw new Error(`no job ${id} in ${queue}`);
      if (typeof job[method] !== 'function') throw new TypeError(`Job has no method ${method}`);
      return plain(await job[method](...args));
    } finally {
      await q.close();
    }
  },
  async run({ flow, queues, timeoutMs = 20000 }, ctx) {
    const workers = queues.map((q) => newWorker(q, ctx));
    await Promise.all(workers.map((w) => w.waitUntilReady()));
    const tree = await ctx.producer.add(flow);
    const root = new ctx.backend.Queue(flow.queueName, ctx.backend.options());
    const deadline = Date.now() + timeoutMs;
    let state;
    for (;;) {
      state = await root.getJobState(tree.job.id);
      if (state === 'completed' || state === 'failed' || Date.now() > deadline) break;
      await sleep(20);
    }
    await Promise.all(workers.map((w) => w.close()));
    await root.close();
    return { id: tree.job.id, state };
  },
  async work({ queue, count, timeoutMs = 20000, ready = false }, ctx) {
    const completed = [];
    const failed = [];
    let finish;
    const finished = new Promise((resolve) => { finish = resolve; });
    const check = () => { if (completed.length + failed.length >= count) finish(); };
    const worker = newWorker(queue, ctx);
    worker.on('completed', (job) => { completed.push(job.id); check(); });
    worker.on('failed', (job) => { if (job) { failed.push(job.id); check(); } });
    let timedOut = false;
    const timer = setTimeout(() => { timedOut = true; finish(); }, timeoutMs);
    process.once('SIGTERM', () => finish());
    await worker.waitUntilReady();
    if (ready) process.stdout.write(JSON.stringify({ ready: true }) + '\n');
    check();
    await finished;
    clearTimeout(timer);
    await worker.close(timedOut);
    return { completed, failed, timedOut };
  },
};

async function main() {
  const [op, raw] = process.argv.slice(2);
  const args = raw ? JSON.parse(raw) : {};
  if (!Object.prototype.hasOwnProperty.call(ops, op)) throw new TypeError(`unknown op: ${op}`);
  const b = backend.open(args);
  const producer = new b.FlowProducer(b.options());
  try {
    return await ops[op](args, { backend: b, producer });
  } finally {
    await producer.close().catch(() => {});
    await b.close();
  }
}

main().then(
  (result) => process.stdout.write(JSON.stringify(result === undefined ? null : result) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
