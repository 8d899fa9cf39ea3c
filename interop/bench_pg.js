'use strict';
// Node BullMQ's PostgreSQL worker, timed: the Node side of scripts/bench_postgres.py.
//
//   node interop/bench_pg.js '{"postgres": url, "schema": s, "migrate": true, "queue": q,
//                              "jobs": 3000, "concurrency": 10}'
//
// Pre-loads `jobs` no-op jobs with addBulk (1,000 per call, untimed), then times a Worker at
// `concurrency` from run() until its last 'completed' event. Prints one line of JSON:
// {jobs, concurrency, seconds, jobsPerSec, cpuUserMs, cpuSysMs} (CPU: this process, timed part).

const { open } = require('./backend');

async function main() {
  const args = JSON.parse(process.argv[2] || '{}');
  const jobs = args.jobs || 3000;
  const concurrency = args.concurrency || 1;
  const b = open(args);
  const queue = new b.Queue(args.queue, b.options());
  await queue.waitUntilReady();
  for (let i = 0; i < jobs; i += 1000) {
    const n = Math.min(1000, jobs - i);
    await queue.addBulk(Array.from({ length: n }, (_, k) => ({ name: 'bench', data: { i: i + k } })));
  }
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const worker = new b.Worker(args.queue, async () => null, b.options({ concurrency, autorun: false }));
  worker.on('error', () => {});
  worker.on('completed', () => { done += 1; if (done >= jobs) finish(); });
  await worker.waitUntilReady();
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  worker.run().catch(() => {});
  await finished;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  await worker.close();
  await queue.close();
  await b.close();
  process.stdout.write(JSON.stringify({
    jobs, concurrency, seconds, jobsPerSec: jobs / seconds,
    cpuUserMs: cpu.user / 1000, cpuSysMs: cpu.system / 1000,
  }) + '\n');
}

main().catch((err) => { process.stderr.write(`${err.stack || err}\n`); process.exit(1); });
