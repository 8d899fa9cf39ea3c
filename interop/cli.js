'use strict';
// One-shot Node BullMQ command runner for the Python interop tests (driven by tests/node.py).
//
//   node interop/cli.js <op> '<json>'
//
// Prints exactly one line of JSON (the result) on stdout and exits 0; on error prints
// {"error": message, "name": err.name} and exits 1. Common fields: redis (URL), prefix
// (default "bull"), queue, connectTimeoutMs (default 10000: fail rather than wait forever for
// an unreachable Redis), caFile (for rediss://: the PEM CA the server's certificate must chain to). Ops: add, addBulk, getJob, getJobs, getJobCounts, getState,
// queueCall, work, getJobsMany, groupAdd (see the handlers below).
//
// `work` with {"ready": true} additionally prints {"ready": true} as a first line once the
// worker is connected, so a caller running it in the background knows when it is consuming.
// SIGTERM/SIGINT end `work` early: it still prints its result (with "interrupted": true).

const fs = require('node:fs');
const IORedis = require('ioredis');
const { Queue, Worker, Job, UnrecoverableError } = require('bullmq');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A job as plain JSON, with the fields the tests compare against the Python side. */
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
    progress: job.progress,
    parentKey: job.parentKey ?? null,
    state: await job.getState(),
  };
}

/** Turns whatever a Queue method returned into something JSON-able (Jobs become jobJSON). */
async function plain(value) {
  if (value === undefined) return null;
  if (value instanceof Job) return jobJSON(value);
  if (Array.isArray(value)) return Promise.all(value.map(plain));
  if (value instanceof Map) return plain(Object.fromEntries(value));
  if (value && typeof value === 'object' && value.constructor === Object) {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = await plain(v);
    return out;
  }
  return value;
}

/** The processor used by `work`: its behaviour comes from job.data.behave. */
async function processJob(job) {
  const behave = (job.data && job.data.behave) || null;
  if (!behave) return { echo: job.data };
  if (behave.sleepMs) await sleep(behave.sleepMs);
  if (behave.unrecoverable !== undefined) throw new UnrecoverableError(behave.unrecoverable);
  if (behave.fail !== undefined) throw new Error(behave.fail);
  if (behave.failTimes !== undefined) {
    if (job.attemptsMade < behave.failTimes) throw new Error(behave.message || 'failing on purpose');
    return { ok: true };
  }
  if ('return' in behave) return behave.return;
  return { echo: job.data };
}

function isFinalFailure(job, err) {
  if (err && (err instanceof UnrecoverableError || err.name === 'UnrecoverableError')) return true;
  return !!job && job.attemptsMade >= (job.opts.attempts || 1);
}

async function work(args, ctx) {
  const { count, concurrency = 1, timeoutMs = 30000, workerOpts = {}, ready = false } = args;
  const completed = [];
  const failed = [];
  let timedOut = false;
  let interrupted = false;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const check = () => { if (completed.length + failed.length >= count) finish(); };

  const worker = new Worker(args.queue, processJob, {
    ...workerOpts,
    connection: ctx.connection,
    prefix: ctx.prefix,
    concurrency,
    autorun: false,
  });
  worker.on('error', () => {}); // transient connection errors surface through the result instead
  worker.on('completed', (job) => { completed.push(job.id); check(); });
  worker.on('failed', (job, err) => {
    if (job && isFinalFailure(job, err)) { failed.push(job.id); check(); }
  });

  const timer = setTimeout(() => { timedOut = true; finish(); }, timeoutMs);
  const stop = () => { interrupted = true; finish(); };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);

  worker.run().catch(() => {});
  await worker.waitUntilReady();
  if (ready) process.stdout.write(JSON.stringify({ ready: true }) + '\n');
  check(); // count may be 0
  await finished;
  clearTimeout(timer);
  // A clean run has nothing left in flight; after a timeout or signal, do not wait for stuck jobs.
  await worker.close(timedOut || interrupted);
  const result = { completed, failed, timedOut };
  if (interrupted) result.interrupted = true;
  return result;
}

const ops = {
  async add({ name, data, opts }, { queue, connection }) {
    const job = await queue.add(name, data ?? {}, opts ?? {});
    return { id: job.id, hash: await connection.hgetall(`${queue.qualifiedName}:${job.id}`) };
  },
  async addBulk({ jobs }, { queue, connection }) {
    const added = await queue.addBulk(jobs.map((j) => ({ name: j.name, data: j.data ?? {}, opts: j.opts ?? {} })));
    const ids = added.map((job) => job.id);
    const hashes = await Promise.all(ids.map((id) => connection.hgetall(`${queue.qualifiedName}:${id}`)));
    return { ids, hashes };
  },
  async getJob({ id }, { queue }) {
    return jobJSON(await queue.getJob(id));
  },
  async getJobs({ types, start = 0, end = -1, asc = false }, { queue }) {
    const jobs = await queue.getJobs(types, start, end, asc);
    return jobs.map((job) => (job ? job.id : null));
  },
  async getJobCounts({ types = [] }, { queue }) {
    return queue.getJobCounts(...types);
  },
  async getState({ id }, { queue }) {
    return queue.getJobState(id);
  },
  async queueCall({ method, args = [] }, { queue }) {
    if (typeof queue[method] !== 'function') throw new TypeError(`Queue has no method ${method}`);
    return plain(await queue[method](...args));
  },
  work,
  // many jobs of many queues (same prefix) in one process: {items: [{queue, id}]} -> {json: text of
  // [jobJSON | null]}, the text ASCII-only (\\uXXXX escapes): JSON.stringify leaves U+0085, U+2028
  // and U+2029 raw, which Python's str.splitlines() would take for line ends
  async getJobsMany({ items }, { connection, prefix }) {
    const queues = new Map();
    try {
      const out = [];
      for (const { queue: name, id } of items) {
        if (!queues.has(name)) queues.set(name, new Queue(name, { connection, prefix, skipMetasUpdate: true }));
        out.push(await jobJSON(await queues.get(name).getJob(id)));
      }
      const json = JSON.stringify(out).replace(/[\u007f-\uffff]/g,
        (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
      return { json };
    } finally {
      await Promise.all([...queues.values()].map((q) => q.close().catch(() => {})));
    }
  },
  // bullmq-compat group jobs through interop/groups.js's GroupProducer, added one after another
  // in the order given: {jobs: [{name, data, opts: {group, orderMs, ...}}]} -> {ids}
  async groupAdd({ jobs }, { connection, prefix, queue }) {
    const { GroupProducer } = require('./groups');
    const producer = new GroupProducer(queue.name, { connection, prefix });
    const ids = [];
    for (const j of jobs) ids.push(await producer.add(j.name, j.data ?? {}, j.opts ?? {}));
    return { ids };
  },
};

/** Waits for Redis to answer; ioredis would otherwise retry (and we would hang) forever. */
function connected(connection, url, timeoutMs) {
  let lastError = null;
  connection.on('error', (err) => { lastError = err; }); // later errors surface via the commands
  if (connection.status === 'ready') return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      const why = lastError ? lastError.message : `no answer in ${timeoutMs} ms`;
      const shown = url.replace(/^([a-z]+:\/\/[^:@/]*):[^@]*@/i, '$1:***@'); // never the password
      reject(new Error(`cannot connect to Redis at ${shown}: ${why}`));
    }, timeoutMs);
    connection.once('ready', () => { clearTimeout(timer); resolve(); });
  });
}

async function main() {
  const [op, raw] = process.argv.slice(2);
  const args = raw ? JSON.parse(raw) : {};
  if (!Object.prototype.hasOwnProperty.call(ops, op)) throw new TypeError(`unknown op: ${op}`);
  if (!args.queue) throw new TypeError('"queue" is required');
  const prefix = args.prefix || 'bull';
  const url = args.redis || 'redis://127.0.0.1:6379';
  const tls = args.caFile ? { tls: { ca: fs.readFileSync(args.caFile) } } : {};
  const connection = new IORedis(url, { maxRetriesPerRequest: null, ...tls });
  let queue = null;
  try {
    await connected(connection, url, args.connectTimeoutMs || 10000);
    if (op !== 'work') queue = new Queue(args.queue, { connection, prefix });
    return await ops[op](args, { queue, connection, prefix });
  } finally {
    if (queue) await queue.close().catch(() => {});
    if (connection.status === 'ready') await connection.quit().catch(() => connection.disconnect());
    else connection.disconnect();
  }
}

function emit(line, code) {
  process.stdout.write(line + '\n', () => process.exit(code));
}

main().then(
  (result) => emit(JSON.stringify(result === undefined ? null : result), 0),
  (err) => emit(JSON.stringify({ error: String(err && err.message !== undefined ? err.message : err), name: err && err.name }), 1),
);
