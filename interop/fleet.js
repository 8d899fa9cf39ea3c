'use strict';
// A fleet in the middle of an upgrade (tests/test_interop_fleet.py): the same operations run by
// any of the BullMQ releases installed side by side in interop/node_modules:
//   bullmq     6.7.0 (the pin)   bullmq60   the latest 6.0.x   bullmq5   the latest 5.x
//
//   node interop/fleet.js '<json request>'          -> one line of JSON: the result
//   node interop/fleet.js '[<request>, <request>]'  -> one line: the list of results (run in order)
//
// On error it prints {"error", "name"} and exits 1. Every request has pkg (one of the names above),
// op, redis (URL), prefix (default "bull") and queue. Redis only. Ops:
//   add {jobs: [{name, data, opts}]}   Queue.add, one after another            -> [id...]
//   flow {flow}                        FlowProducer.add                         -> tree of {id, queueName, children}
//   call {method, args}                any Queue method (pause, upsertJobScheduler, getJobCounts...)
//   read {ids, flow?: {id, queueName}, countTypes}  what this release reports of a queue ->
//        {version, jobs: {id: job JSON with state, for ids and every completed job}, counts (of
//         countTypes), defaultCounts (getJobCounts()), completed (ids, oldest first), schedulers
//         (getJobSchedulers, or {error}), flow (getFlow's tree with state and returnvalue),
//         childrenValues (of the flow's root)}
//   work {tag, untilCompleted, add?, schedulers?, concurrency?, timeoutMs?}  a Worker (its processor
//        below) until the queue counts untilCompleted completed jobs; once connected it prints
//        {"ready": true}, then adds `add` (jobs as for op add) and upserts `schedulers` ([id, repeat,
//        template] each), so that it is both a producer and a consumer ->
//        {completed: [id...] (its 'completed' events), added: [id...], failedAttempts, errors, timedOut}
//
// The processor: job.data.behave = {sleepMs, failTimes: n} waits, then fails the first n attempts;
// otherwise it returns {by: tag, data}. SIGTERM/SIGINT end `work` early (it still prints its result).

const IORedis = require('ioredis');

const PACKAGES = new Set(['bullmq', 'bullmq60', 'bullmq5']);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function release(pkg) {
  if (!PACKAGES.has(pkg)) throw new TypeError(`pkg must be one of ${[...PACKAGES].join(', ')}, not ${pkg}`);
  return { bullmq: require(pkg), version: require(`${pkg}/package.json`).version };
}

async function jobJSON(job) {
  if (!job) return null;
  return {
    id: job.id,
    name: job.name,
    data: job.data,
    opts: job.opts,
    timestamp: job.timestamp,
    delay: job.delay,
    priority: job.priority,
    attemptsMade: job.attemptsMade,
    attemptsStarted: job.attemptsStarted,
    processedOn: job.processedOn ?? null,
    finishedOn: job.finishedOn ?? null,
    returnvalue: job.returnvalue ?? null,
    failedReason: job.failedReason ?? null,
    stacktrace: job.stacktrace ?? null,
    parentKey: job.parentKey ?? null,
    repeatJobKey: job.repeatJobKey ?? null,
    state: await job.getState(),
  };
}

async function treeJSON(node) {
  if (!node) return null;
  const { job } = node;
  const children = await Promise.all((node.children || []).map(treeJSON));
  children.sort((a, b) => String(a.id).localeCompare(String(b.id)));
  return { id: job.id, name: job.name, state: await job.getState(), returnvalue: job.returnvalue ?? null, children };
}

/** A thrown call as data, so that one release's refusal can be compared with another's. */
async function attempt(fn) {
  try {
    return await fn();
  } catch (err) {
    return { error: String(err && err.message !== undefined ? err.message : err) };
  }
}

async function read({ ids = [], flow, countTypes = [] }, { queue, lib, producer }) {
  const completed = (await queue.getJobs(['completed'], 0, -1, true)).map((job) => job.id);
  const jobs = {};
  for (const id of new Set([...ids, ...completed])) jobs[id] = await jobJSON(await queue.getJob(id));
  const out = {
    jobs,
    counts: await queue.getJobCounts(...countTypes),
    defaultCounts: await queue.getJobCounts(),
    completed,
    schedulers: await attempt(() => queue.getJobSchedulers(0, -1, true)),
  };
  if (flow) {
    out.flow = await treeJSON(await producer.getFlow(flow));
    const root = await lib.Job.fromId(queue, flow.id);
    out.childrenValues = root ? await root.getChildrenValues() : null;
  }
  return out;
}

async function processJob(job, tag) {
  const behave = (job.data && job.data.behave) || {};
  if (behave.sleepMs) await sleep(behave.sleepMs);
  if (behave.failTimes !== undefined && job.attemptsMade < behave.failTimes) {
    throw new Error(`failing on purpose (attempt ${job.attemptsMade + 1})`);
  }
  return { by: tag, data: job.data };
}

async function work(args, { queue, lib, connection, prefix }) {
  const { tag = args.pkg, untilCompleted, add = [], schedulers = [], concurrency = 1, timeoutMs = 60000 } = args;
  const result = { completed: [], added: [], failedAttempts: 0, errors: [], timedOut: false };
  const worker = new lib.Worker(args.queue, (job) => processJob(job, tag), {
    connection, prefix, concurrency, autorun: false, drainDelay: 1,
  });
  worker.on('error', (err) => { result.errors.push(String(err && err.message)); });
  worker.on('completed', (job) => { result.completed.push(job.id); });
  worker.on('failed', () => { result.failedAttempts += 1; });
  let stopped = false;
  const stop = () => { stopped = true; };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  worker.run().catch((err) => { result.errors.push(String(err && err.message)); });
  await worker.waitUntilReady();
  process.stdout.write(JSON.stringify({ ready: true }) + '\n');
  for (const { name, data, opts } of add) result.added.push((await queue.add(name, data ?? {}, opts ?? {})).id);
  for (const [id, repeat, template] of schedulers) await queue.upsertJobScheduler(id, repeat, template);
  const deadline = Date.now() + timeoutMs;
  while (!stopped) {
    if (untilCompleted !== undefined && (await queue.getJobCountByTypes('completed')) >= untilCompleted) break;
    if (Date.now() > deadline) { result.timedOut = true; break; }
    await sleep(100);
  }
  await worker.close(result.timedOut || stopped);
  if (stopped) result.interrupted = true;
  return result;
}

const ops = {
  async add({ jobs }, { queue }) {
    const ids = [];
    for (const { name, data, opts } of jobs) ids.push((await queue.add(name, data ?? {}, opts ?? {})).id);
    return ids;
  },
  async flow({ flow }, { producer }) {
    const tree = await producer.add(flow);
    const shape = (node) => ({
      id: node.job.id, queueName: node.job.queueName, children: (node.children || []).map(shape),
    });
    return shape(tree);
  },
  async call({ method, args = [] }, { queue }) {
    if (typeof queue[method] !== 'function') throw new TypeError(`Queue has no method ${method}`);
    const value = await queue[method](...args);
    if (value && typeof value === 'object' && typeof value.getState === 'function') return jobJSON(value);
    return value === undefined ? null : value;
  },
  read,
  work,
};

async function run(request) {
  const { pkg, op, redis, prefix = 'bull', queue: name } = request;
  if (!Object.prototype.hasOwnProperty.call(ops, op)) throw new TypeError(`unknown op: ${op}`);
  if (!name) throw new TypeError('"queue" is required');
  const { bullmq: lib, version } = release(pkg);
  const connection = new IORedis(redis, { maxRetriesPerRequest: null });
  const queue = new lib.Queue(name, { connection, prefix });
  const producer = op === 'flow' || op === 'read' ? new lib.FlowProducer({ connection, prefix }) : null;
  try {
    const result = await ops[op](request, { queue, lib, connection, prefix, producer });
    return op === 'read' ? { version, ...result } : result;
  } finally {
    if (producer) await producer.close().catch(() => {});
    await queue.close().catch(() => {});
    await connection.quit().catch(() => connection.disconnect());
  }
}

async function main(raw) {
  const request = JSON.parse(raw);
  if (!Array.isArray(request)) return run(request);
  const results = [];
  for (const one of request) results.push(await run(one));
  return results;
}

// U+2028/U+2029 go out escaped: Python's str.splitlines() (tests/node.py) would cut the line at them
const line = (value) => JSON.stringify(value).replace(/[\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16)}`);

main(process.argv[2] || '{}').then(
  (result) => process.stdout.write(line(result === undefined ? null : result) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(line({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)));
