'use strict';
// The processor of interop/cancel.js, in a file of its own so that it can also run sandboxed (as a
// processor path, in Node's child processes). Its Python twin: tests/sandbox_processors.py:cancel_twin.
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

module.exports = async function (job, token, signal) {
  if (job.attemptsMade > 0) return 'done';
  if (job.data.ignore) { await sleep(300); return 'ignored'; }
  const { UnrecoverableError } = require('bullmq');
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('never cancelled')), 20000);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      if (job.data.unrecoverable) reject(new UnrecoverableError(String(signal.reason)));
      else reject(new Error(String(signal.reason)));
    }, { once: true });
  });
};
