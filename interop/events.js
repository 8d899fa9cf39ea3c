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

const IORedis = require('ioredis');
const { Queue, QueueEvents, Job } = require('bullmq');

function out(value) {
  return new Promise((resolve) => process.stdout.write(JSON.stringify(value) + '\n', resolve));
}

async function listen(args, connection, prefix) {
  const queueEvents = new QueueEvents(args.queue, {
    connection, prefix, lastEventId: args.lastEventId || '$', autorun: false,
  });
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
  await running;
  return { events, timedOut };
}

async function wait(args, connection, prefix) {
  const queueEvents = new QueueEvents(args.queue, { connection, prefix, lastEventId: args.lastEventId || '$' });
  queueEvents.on('error', () => {});
  const queue = new Queue(args.queue, { connection, prefix });
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
  const prefix = args.prefix || 'bull';
  const url = args.redis || 'redis://127.0.0.1:6379';
  // QueueEvents blocks on its connection: give it one of its own (BullMQ duplicates it anyway)
  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  connection.on('error', () => {});
  try {
    if (op === 'listen') return await listen(args, connection, prefix);
    if (op === 'wait') return await wait(args, connection, prefix);
    throw new TypeError(`unknown op: ${op}`);
  } finally {
    connection.disconnect();
  }
}

main().then(
  (result) => process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0)),
  (err) => process.stdout.write(JSON.stringify({ error: String(err && err.message), name: err && err.name }) + '\n',
    () => process.exit(1)),
);
