'use strict';
// Node BullMQ's QueueEvents for the Python interop tests (tests/test_interop_events.py).
//
//   node interop/events.js listen '<json>'   {redis, queue, prefix?, lastEventId?, until, timeoutMs?}
//     Prints {"ready": true} once listening, then collects every event QueueEvents emits (name and
//     arguments exactly as Node's listeners get them) until the event named `until` arrives (or
//     the timeout), and prints {"events": [{name, args}], "timedOut"} as its last line.
//
//   node interop/events.js wait '<json>'     {redis, queue, prefix?, id, ttl?, lastEventId?}
//     Prints {"ready": true} once listening, then runs Node's job.waitUntilFinished(queueEvents, ttl)
//     and prints {"returnvalue": value} or {"rejected": message}.
//
// On a setup error prints {"error": message, "name": err.name} and exits 1 (as cli.js does).
//
// PostgreSQL (Node's own backend, see interop/backend.js): {postgres, schema, migrate?, queue, ...}
// in place of {redis, prefix}. Event ids are then the schema's event ids ("1", "2", ...; one
// sequence for all queues of the schema) instead of Redis stream ids, so lastEventId is one of those.

const { Job } = require('bullmq');
const backend = require('./backend');

function out(value) {
  return new Promise((resolve) => process.stdout.write(JSON.stringify(value) + '\n', resolve));
}

async function listen(args, b) {
  const queueEvents = new b.QueueEvents(args.queue, b.options({
    lastEventId: args.lastEventId || '$', autorun: false,
  }));
  const events = [];
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  const emit = queueEvents.emit.bind(queueEvents);
  queueEvents.emit = (name, ...rest) => {
    // record what listeners receive; skip the per-job copies ("completed:<id>")
    const perJob = rest[0] && typeof rest[0] === 'object' && rest[0].jobId !== undefined
      && name.endsWith(`:${rest[0].jobId}`);
    if (!perJob && name !== 'error') events.push({ name, args: rest });
    if (name === args.until) done(false);
    return emit(name, ...rest);
  };
  queueEvents.on('error', () => {});
  const timer = setTimeout(() => done(true), args.timeoutMs || 20000);
  process.once('SIGTERM', () => done(true));
  const running = queueEvents.run().catch(() => {});
  await queueEvents.waitUntilReady();
  await out({ ready: true });
  const timedOut = await finished;
  clearTimeout(timer);
  await queueEvents.close();
  // Node's Postgres QueueEvents: a read_events query in flight when close() ends the pool never
  // settles, so run() never does either (and Node would exit with nothing printed): wait a bounded time
  await Promise.race([running, new Promise((resolve) => setTimeout(resolve, 2000))]);
  return { events, timedOut };
}

async function wait(args, b) {
  const queueEvents = new b.QueueEvents(args.queue, b.options({ lastEventId: args.lastEventId || '$' }));
  queueEvents.on('error', () => {});
  const queue = new b.Queue(args.queue, b.options());
  try {
    await queueEvents.waitUntilReady();
    const job = await Job.fromId(queue, args.id);
    if (!job) throw new Error(`no job ${args.id}`);
    await out({ ready: true });
    try {
      return { returnvalue: await job.waitUntilFinished(queueEvents, args.ttl) };
    } catch (err) {
      return { rejected: String(err && err.message !== undefined ? err.message : err) };
    }
  } finally {
    await queueEvents.close();
    await queue.close();
  }
}

async function main() {
  const [op, raw] = process.argv.slice(2);
  const args = raw ? JSON.parse(raw) : {};
  if (!args.queue) throw new TypeError('"queue" is required');
  // Redis: QueueEvents blocks on its connection, so it gets one of its own (BullMQ duplicates it
  // anyway); PostgreSQL: each QueueEvents/Queue opens its own pool and LISTEN connection
  const b = backend.open(args);
  if (b.kind === 'redis') b.connection.on('error', () => {});
  try {
    if (op === 'listen') return await listen(args, b);
    if (op === 'wait') return await wait(args, b);
    throw new TypeError(`unknown op: ${op}`);
  } finally {
    if (b.kind === 'redis') b.connection.disconnect();
    else await b.close();
  }
}

main().then(
  (result) => process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
