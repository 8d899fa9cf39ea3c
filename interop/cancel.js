'use strict';
// Job cancellation with Node BullMQ's Worker, for tests/test_worker_cancellation.py, which runs the
// same jobs through bullmq-compat's Worker and compares what Node reads back.
//
//   node interop/cancel.js '{"redis": url, "queue": name, "op": "work", "jobs": [...], "reason": "..."}'
//   node interop/cancel.js '{"redis": url, "queue": name, "op": "read", "ids": [...]}'
//
// work: adds the jobs ({name, data, opts}), runs a Worker whose processor takes (job, token, signal)
// and, on each job's first attempt, calls worker.cancelJob(job.id, reason) once the processor has
// started (its first act is job.updateProgress(1); the worker's 'progress' event triggers the cancel).
// The processor's answer to the abort comes from job.data: {"unrecoverable": true} rejects with an
// UnrecoverableError(signal.reason), {"ignore": true} ignores the signal and returns "ignored"
// once it is aborted, otherwise it rejects with new Error(signal.reason); a retried attempt returns "done"
// (interop/cancel_processor.js). With "sandboxed": true the processor runs in Node's child processes.
// Prints {"ids": [...], "cancelled": {id: cancelJob's answer}, "jobs": [job, ...]} once every job
// is finished. read: prints {"jobs": [job, ...]} (each as below, or null).
const path = require('path');
const { Job } = require('bullmq');
const backend = require('./backend');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function view(queue, id) {
  const job = await Job.fromId(queue, id);
  if (!job) return null;
  return {
    id: job.id, state: await job.getState(), attemptsMade: job.attemptsMade,
    attemptsStarted: job.attemptsStarted, failedReason: job.failedReason ?? null,
    returnvalue: job.returnvalue ?? null, stacktraceCount: (job.stacktrace || []).length,
    finished: Boolean(job.finishedOn),
  };
}

const processor = require('./cancel_processor');

async function main() {
  const args = JSON.parse(process.argv[2]);
  const b = backend.open(args);
  const queue = new b.Queue(args.queue, b.options());
  try {
    if (args.op === 'read') {
      const jobs = [];
      for (const id of args.ids) jobs.push(await view(queue, id));
      return { jobs };
    }
    const proc = args.sandboxed ? path.join(__dirname, 'cancel_processor.js') : processor;
    const worker = new b.Worker(args.queue, proc, b.options({ autorun: false, concurrency: 4 }));
    worker.on('error', () => {});
    const cancelled = {};
    worker.on('progress', (job) => {
      if (job.attemptsMade === 0 && !(job.id in cancelled)) cancelled[job.id] = worker.cancelJob(job.id, args.reason);
    });
    const ids = [];
    for (const spec of args.jobs) ids.push((await queue.add(spec.name, spec.data || {}, spec.opts || {})).id);
    worker.run().catch(() => {});
    const deadline = Date.now() + 30000;
    let jobs = [];
    while (Date.now() < deadline) {
      jobs = await Promise.all(ids.map((id) => view(queue, id)));
      // finished too: view() reads the hash, then the state, so a job that moved between the two reads
      // shows a final state with its active hash (no finishedOn) — read again then
      if (jobs.every((j) => j && (j.state === 'completed' || j.state === 'failed') && j.finished)) break;
      await sleep(50);
    }
    await worker.close();
    return { ids, cancelled, jobs };
  } finally {
    await queue.close();
    await b.close();
  }
}

main().then((result) => {
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(0);
}, (err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.message || err), name: err && err.name }) + '\n');
  process.exit(1);
});
