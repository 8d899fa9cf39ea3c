'use strict';
// Next run times of cron patterns, computed exactly as BullMQ's job schedulers compute them
// (bullmq's own defaultRepeatStrategy, over the cron-parser that bullmq depends on).
//
//   node interop/cron_next.js '{"cases": [{"pattern": "*/5 * * * * *", "from": 1700000000000,
//                                           "n": 5, "tz": "Europe/Paris", "startDate": ..., "endDate": ...}]}'
//
// For each case, prints the n successive times: each one is computed from the previous one
// (plus "stepMs", default 0: a worker picks a job up a little after its time), as a worker
// computes the next iteration from the job it took. The list stops early where BullMQ would
// stop the scheduler (no next time: past endDate, or no time matches). A case whose pattern
// does not parse gives {"error": message}. Prints one JSON line: {"results": [...]}.
// The request may also come on standard input (no argument), for tables too long for argv.

const { defaultRepeatStrategy } = require('bullmq');

function run(c) {
  const opts = { pattern: c.pattern };
  if (c.tz !== undefined) opts.tz = c.tz;
  if (c.startDate !== undefined) opts.startDate = c.startDate;
  if (c.endDate !== undefined) opts.endDate = c.endDate;
  const times = [];
  let t = c.from;
  for (let i = 0; i < (c.n || 1); i++) {
    let next;
    try {
      next = defaultRepeatStrategy(t, opts);
    } catch (err) {
      if (i === 0) return { error: String(err && err.message) };
      break;
    }
    if (next === undefined) break;
    times.push(next);
    t = next + (c.stepMs || 0);
  }
  return times;
}

// The request is the first argument, or standard input when there is none (long tables).
const raw = process.argv[2] !== undefined ? process.argv[2] : require('fs').readFileSync(0, 'utf8');
const args = JSON.parse(raw || '{}');
process.stdout.write(JSON.stringify({ results: (args.cases || []).map(run) }) + '\n');
