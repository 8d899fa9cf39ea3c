'use strict';
// The processor of interop/cancel.js, in a file of its own so that it can also run sandboxed (as a
// processor path, in Node's child processes). Its Python twin: tests/sandbox_processors.py:cancel_twin.
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

module.exports = async function (job, token, signal) {
  if (job.attemptsMade > 0) return 'done';
  // tells interop/cancel.js that the attempt has started: it cancels on this progress event, so the
  // cancel can never reach the worker before the processor runs (a child process can start late)
  await job.updateProgress(1);
  if (job.data.ignore) {
    // ignores the signal: waits until it was aborted, then completes all the same
    for (let waited = 0; !signal.aborted && waited < 20000; waited += 20) await sleep(20);
    return 'ignored';
  }
  const { UnrecoverableError } = require('bullmq');
  const abort = () => (job.data.unrecoverable ? new UnrecoverableError(String(signal.reason)) : new Error(String(signal.reason)));
  if (signal.aborted) throw abort(); // the cancel can come while updateProgress is awaited
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('never cancelled')), 20000);
    signal.addEventListener('abort', () => { clearTimeout(timer); reject(abort()); }, { once: true });
  });
};
