'use strict';
// Node BullMQ as the oracle for tests/test_interop_oracle.py: many questions about one queue in
// one call, each answered by Node's own API (Redis, or createPostgresBackend; see backend.js).
//
//   node interop/oracle.js '{"redis": url, "queue": name, "questions": [...]}'
//   or, in the cli.js command server: node("oracle", redis=..., queue=..., questions=[...])
//
// A question is one of
//   {"queue": method, "args": [...]}             -> await queue[method](...args)
//   {"job": id, "method": m, "args": [...]}      -> on queue.getJob(id): "toJSON" (JSON.stringify's
//                                                  view), "asJSON", or await job[m](...args)
//   {"backoff": [backoffOpts, attemptsMade]}     -> Backoffs.calculate(backoffOpts, attemptsMade)
// and gets the answer {"value": ...} (Jobs as their toJSON view, Maps as objects, an undefined
// answer as null, undefined fields left out) or {"error": message, "name": err.name}: one failing question does not stop the others.

const { Backoffs, Job } = require('bullmq');
const backend = require('./backend');

function plain(value) {
  if (value === undefined) return null;
  if (value instanceof Job) return JSON.parse(JSON.stringify(value));
  if (Array.isArray(value)) return value.map(plain);
  if (value instanceof Map) return plain(Object.fromEntries(value));
  if (value && typeof value === 'object' && value.constructor === Object) {
    const out = {};
    // a field holding undefined is left out, as JSON.stringify leaves it out
    for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = plain(v);
    return out;
  }
  return value;
}

async function answerOne(q, queue) {
  if (q.backoff) return Backoffs.calculate(q.backoff[0], q.backoff[1]);
  if (q.queue) {
    if (typeof queue[q.queue] !== 'function') throw new TypeError(`Queue has no method ${q.queue}`);
    return queue[q.queue](...(q.args || []));
  }
  if (q.job !== undefined) {
    const job = await queue.getJob(q.job);
    if (!job) return null;
    if (q.method === 'toJSON') return JSON.parse(JSON.stringify(job));
    if (q.method === 'asJSON') return job.asJSON();
    if (typeof job[q.method] !== 'function') throw new TypeError(`Job has no method ${q.method}`);
    return job[q.method](...(q.args || []));
  }
  throw new TypeError(`not a question: ${JSON.stringify(q)}`);
}

/** The answers, in order, to args.questions about ctx.queue (asked one after another). */
async function answer(args, ctx) {
  const out = [];
  for (const q of args.questions || []) {
    try {
      out.push({ value: plain(await answerOne(q, ctx.queue)) });
    } catch (err) {
      out.push({ error: String(err && err.message !== undefined ? err.message : err), name: err && err.name });
    }
  }
  return out;
}

module.exports = { answer };

if (require.main === module) {
  (async () => {
    const args = JSON.parse(process.argv[2]);
    const b = backend.open(args);
    await b.ready();
    const queue = new b.Queue(args.queue, b.options());
    try {
      process.stdout.write(JSON.stringify(await answer(args, { queue, backend: b })) + '\n');
    } finally {
      await queue.close().catch(() => {});
      await b.close();
    }
  })().catch((err) => {
    process.stdout.write(JSON.stringify({ error: err.message, name: err.name }) + '\n');
    process.exit(1);
  });
}
