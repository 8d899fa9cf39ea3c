'use strict';
// One-shot Node BullMQ command runner for the Python interop tests (driven by tests/node.py).
//
//   node interop/cli.js <op> '<json>'
//
// Prints exactly one line of JSON (the result) on stdout and exits 0; on error prints
// {"error": message, "name": err.name} and exits 1. Common fields: redis (URL), prefix
// (default "bull"), queue, connectTimeoutMs (default 10000: fail rather than wait forever for
// an unreachable Redis or PostgreSQL), caFile (for rediss://: the PEM CA the server's certificate must
// chain to). Ops: add, addBulk, getJob, getJobs, getJobCounts,
// getState, jobsRetry, queueCall, work, getJobsMany, groupAdd, groupFlow, oracle, migrate (see the handlers below).
//
// PostgreSQL instead of Redis (Node's own Postgres backend, see interop/backend.js): give
//   {"postgres": "postgresql://postgres@127.0.0.1:5432/test", "schema": "s_xxx", "migrate": true}
// in place of redis/prefix. Every op works the same, except: add/addBulk return the job's row of
// the schema's job table (to_jsonb, as "row"/"rows") where Redis gives its hash ("hash"/"hashes");
// groupAdd is Redis-only; and `migrate` ({postgres, schema}, no queue) runs Node's runMigrations
// and returns {version, before, applied}: the version after the call, the ledger's version
// before it (0 for a fresh schema) and the ledger rows this call added ([] for a no-op).
// Job schedulers go through queueCall (upsertJobScheduler, getJobScheduler, getJobSchedulers,
// removeJobScheduler) and run under `work`, as with Redis; getWorkers too (queueCall).
//
// `work` with {"ready": true} additionally prints {"ready": true} as a first line once the
// worker is connected, so a caller running it in the background knows when it is consuming.
// SIGTERM/SIGINT end `work` early: it still prints its result (with "interrupted": true).

const { Job, UnrecoverableError, runMigrations, quoteSchemaName, DEFAULT_SCHEMA } = require('bullmq');
const backend = require('./backend');

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

  const worker = new ctx.backend.Worker(args.queue, processJob, ctx.backend.options({
    ...workerOpts,
    concurrency,
    autorun: false,
  }));
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

/** What is stored for one job: its Redis hash, or its row of the Postgres schema's job table. */
function stored(ctx, id) {
  const { backend: b, queue } = ctx;
  if (b.kind === 'redis') return b.connection.hgetall(`${queue.qualifiedName}:${id}`);
  return b.sql('SELECT to_jsonb(j) AS row FROM job j WHERE j.queue = $1 AND j.id = $2', [queue.name, id])
    .then((rows) => (rows.length ? rows[0].row : null));
}

/** {version, before, applied}: Node's runMigrations on one session, and the ledger around it. */
async function migrate(args) {
  const pg = require('pg');
  const schema = args.schema || DEFAULT_SCHEMA;
  const ledger = `SELECT version, name, min_client_version FROM ${quoteSchemaName(schema)}.migration ORDER BY version`;
  const read = async (client) => {
    try {
      return (await client.query(ledger)).rows;
    } catch (err) {
      if (err.code === '42P01' || err.code === '3F000') return []; // no ledger / no schema yet
      throw err;
    }
  };
  const client = new pg.Client({ connectionString: args.postgres, connectionTimeoutMillis: args.connectTimeoutMs || 10000 });
  await client.connect();
  try {
    const before = await read(client);
    const version = await runMigrations(client, schema);
    const after = await read(client);
    const known = new Set(before.map((r) => r.version));
    return {
      version,
      before: before.reduce((max, r) => Math.max(max, r.version), 0),
      applied: after.filter((r) => !known.has(r.version)),
    };
  } finally {
    await client.end().catch(() => {});
  }
}

const ops = {
  async add({ name, data, opts }, ctx) {
    const job = await ctx.queue.add(name, data ?? {}, opts ?? {});
    const key = ctx.backend.kind === 'redis' ? 'hash' : 'row';
    return { id: job.id, [key]: await stored(ctx, job.id) };
  },
  async addBulk({ jobs }, ctx) {
    const added = await ctx.queue.addBulk(jobs.map((j) => ({ name: j.name, data: j.data ?? {}, opts: j.opts ?? {} })));
    const ids = added.map((job) => job.id);
    const key = ctx.backend.kind === 'redis' ? 'hashes' : 'rows';
    return { ids, [key]: await Promise.all(ids.map((id) => stored(ctx, id))) };
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
  // job.retry() (Bull-Board's Retry) on each job in turn: {ids, state} -> {at: [Date.now() after each]}
  async jobsRetry({ ids, state = 'failed' }, { queue }) {
    const at = [];
    for (const id of ids) {
      const job = await queue.getJob(id);
      if (!job) throw new Error(`no job ${id}`);
      await job.retry(state);
      at.push(Date.now());
    }
    return { at };
  },
  async queueCall({ method, args = [] }, { queue }) {
    if (typeof queue[method] !== 'function') throw new TypeError(`Queue has no method ${method}`);
    return plain(await queue[method](...args));
  },
  work,
  // many questions about one queue, answered by Node's API (interop/oracle.js): {questions} -> [answers]
  oracle: (args, ctx) => require('./oracle').answer(args, ctx),
  // many jobs of many queues (same prefix) in one process: {items: [{queue, id}]} -> {json: text of
  // [jobJSON | null]}, the text ASCII-only (\\uXXXX escapes): JSON.stringify leaves U+0085, U+2028
  // and U+2029 raw, which Python's str.splitlines() would take for line ends
  async getJobsMany({ items }, { backend: b }) {
    const queues = new Map();
    try {
      const out = [];
      for (const { queue: name, id } of items) {
        if (!queues.has(name)) queues.set(name, new b.Queue(name, b.options({ skipMetasUpdate: true })));
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
  async groupAdd({ jobs }, { backend: b, queue }) {
    if (b.kind !== 'redis') throw new TypeError('groupAdd needs Redis (our group script is Lua)');
    const { GroupProducer } = require('./groups');
    const producer = new GroupProducer(queue.name, { connection: b.connection, prefix: b.prefix });
    const ids = [];
    for (const j of jobs) ids.push(await producer.add(j.name, j.data ?? {}, j.opts ?? {}));
    return { ids };
  },
  // flows whose children may be group jobs: {flows, bulk?} -> {trees: [{id, children: [...]}]}. On
  // Redis through interop/groups.js's GroupFlowProducer (group nodes by our addGroupJob script, in
  // the flow's MULTI); on PostgreSQL Node's own FlowProducer (our trigger gates group jobs)
  async groupFlow({ flows, bulk }, { backend: b }) {
    const { GroupFlowProducer } = require('./groups');
    const producer = b.kind === 'redis' ? new GroupFlowProducer(b.options()) : new b.FlowProducer(b.options());
    const tree = (node) => ({ id: node.job.id, children: (node.children || []).map(tree) });
    try {
      const added = bulk ? await producer.addBulk(flows) : [await producer.add(flows[0])];
      return { trees: added.map(tree) };
    } finally {
      await producer.close().catch(() => {});
    }
  },
};

async function runOp(op, args) {
  if (op === 'migrate') {
    if (!args.postgres) throw new TypeError('"migrate" needs "postgres"');
    return migrate(args);
  }
  if (!Object.prototype.hasOwnProperty.call(ops, op)) throw new TypeError(`unknown op: ${op}`);
  if (!args.queue) throw new TypeError('"queue" is required');
  const b = backend.open(args);
  let queue = null;
  try {
    await b.ready();
    if (op !== 'work') queue = new b.Queue(args.queue, b.options());
    return await ops[op](args, { queue, backend: b });
  } finally {
    if (queue) await queue.close().catch(() => {});
    await b.close();
  }
}

// U+0085, U+2028 and U+2029 go out as \uXXXX escapes (the same JSON): JSON.stringify leaves them
// raw, and Python's str.splitlines() (tests/node.py) would cut the result line at them
function escapeLine(line) {
  return line.replace(/[\u0085\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

function emit(line, code) {
  process.stdout.write(escapeLine(line) + '\n', () => process.exit(code));
}

function errorJSON(err) {
  return { error: String(err && err.message !== undefined ? err.message : err), name: err && err.name };
}

// `cli.js serve`: the same ops, many in one process (tests/node.py keeps one per test process: a
// Node start-up per command is most of what the interop tests cost). One JSON request a line on
// stdin, {"id", "op", "args"}; one reply a line on stdout, {"id", "result"} or {"id", "error",
// "name"}, in the order they finish (requests run at once). Ends when stdin closes.
function serve() {
  const lines = require('readline').createInterface({ input: process.stdin, crlfDelay: Infinity });
  const reply = (obj) => process.stdout.write(escapeLine(JSON.stringify(obj)) + '\n');
  // what would end a one-command process (an 'error' event nobody listens to...) ends only its command
  process.on('uncaughtException', (err) => process.stderr.write(`uncaught: ${err && err.stack || err}\n`));
  process.on('unhandledRejection', (err) => process.stderr.write(`unhandled: ${err && err.stack || err}\n`));
  let running = 0;
  let closed = false;
  const done = () => {
    running -= 1;
    if (closed && running === 0) process.exit(0);
  };
  lines.on('line', (line) => {
    let req;
    try {
      req = JSON.parse(line);
    } catch (err) {
      process.stderr.write(`not a request: ${line.slice(0, 200)}\n`);
      return;
    }
    running += 1;
    Promise.resolve()
      .then(() => runOp(req.op, req.args || {}))
      .then((result) => reply({ id: req.id, result: result === undefined ? null : result }),
        (err) => reply({ id: req.id, ...errorJSON(err) }))
      .finally(done);
  });
  lines.on('close', () => {
    closed = true;
    if (running === 0) process.exit(0);
  });
}

if (process.argv[2] === 'serve') {
  serve();
} else {
  const [op, raw] = process.argv.slice(2);
  Promise.resolve()
    .then(() => runOp(op, raw ? JSON.parse(raw) : {}))
    .then((result) => emit(JSON.stringify(result === undefined ? null : result), 0),
      (err) => emit(JSON.stringify(errorJSON(err)), 1));
}
