'use strict';
// Node BullMQ's answers for the Queue/Job parity tests (tests/test_interop_parity.py):
//
//   node interop/parity.js '{"redis": url, "queue": name, "op": ..., ...}'
//
// Ops, each printing one JSON line:
//   {"op": "job", "id"}                      -> {"toJSON": JSON of the job as JSON.stringify shows it,
//                                               "asJSON": job.asJSON(), "queueName", "prefix",
//                                               "isWaitingChildren"}
//   {"op": "dependencies", "id", "type", "start", "end"} -> queue.getDependencies(...)
//   {"op": "fromJSON", "json"}               -> Job.fromJSON(queue, json) as JSON.stringify shows it
//   {"op": "removeDeduplicationKey", "id"}   -> {"removed": (await job.removeDeduplicationKey())}
//   {"op": "clearLogs", "id", "keep"}        -> {"logs": queue.getJobLogs(id)} after job.clearLogs(keep)

const { Job } = require('bullmq');
const backend = require('./backend');

async function main() {
  const args = JSON.parse(process.argv[2]);
  const b = backend.open(args);
  const queue = new b.Queue(args.queue, b.options({ skipMetasUpdate: true }));
  try {
    let out;
    if (args.op === 'job') {
      const job = await queue.getJob(args.id);
      out = {
        toJSON: JSON.parse(JSON.stringify(job)),
        asJSON: job.asJSON(),
        queueName: job.queueName,
        prefix: job.prefix,
        isWaitingChildren: await job.isWaitingChildren(),
      };
    } else if (args.op === 'dependencies') {
      out = await queue.getDependencies(args.id, args.type, args.start, args.end);
    } else if (args.op === 'fromJSON') {
      out = JSON.parse(JSON.stringify(Job.fromJSON(queue, args.json)));
    } else if (args.op === 'removeDeduplicationKey') {
      const job = await queue.getJob(args.id);
      out = { removed: await job.removeDeduplicationKey() };
    } else if (args.op === 'clearLogs') {
      const job = await queue.getJob(args.id);
      await job.clearLogs(args.keep);
      out = { logs: await queue.getJobLogs(args.id) };
    } else {
      throw new TypeError(`unknown op ${args.op}`);
    }
    process.stdout.write(JSON.stringify(out) + '\n');
  } finally {
    await queue.close();
    await b.close();
  }
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: err.message, name: err.name }) + '\n');
  process.exit(1);
});
