'use strict';
// Node BullMQ side of scripts/bench.py: one measurement per invocation.
//
//   node interop/bench.js '<json>'
//
// Input: {redis, queue, op, jobs, concurrency, removeOnComplete, batch, interval}
//   op = "add"      add `jobs` jobs one at a time (sequential awaits)
//        "addBulk"  add `jobs` jobs with addBulk, `batch` per call
//        "process"  pre-load `jobs` jobs (addBulk, untimed), then time a Worker at `concurrency`
//                   from its start until the last 'completed' event
//        "latency"  idle Worker; add `jobs` jobs one at a time, `interval` ms apart; each job's
//                   latency is the handler's start time minus job.timestamp
// Output (one line of JSON): {seconds, jobs, cpuUserMs, cpuSysMs, redisCommandstats, redisCpuBefore,
//   redisCpuAfter, latenciesMs?}. CPU is process.cpuUsage() over the timed section only; the
//   Redis figures are the raw INFO texts, parsed by scripts/bench.py (same parser for every client).
//   Every job is {name: "bench", data: {i}} with no options: the same work as the Python runners.
// With {postgres: url, schema} instead of redis: Node's own PostgreSQL backend (interop/backend.js,
//   migrate: true, so the queue creates the schema as it connects, untimed), no Redis figures.

const IORedis = require('ioredis');
const bullmq = require('bullmq');
const { open } = require('./backend');

const JOB_NAME = 'bench';

function connectionOf(url) {
  const u = new URL(url);
  const db = u.pathname && u.pathname.length > 1 ? Number(u.pathname.slice(1)) : 0;
  return { host: u.hostname, port: Number(u.port || 6379), db };
}

const nowMs = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** CONFIG RESETSTAT before and INFO after the timed section, on a connection of its own. */
class RedisStats {
  constructor(url) {
    this.client = new IORedis(connectionOf(url));
  }
  async reset() {
    await this.client.config('RESETSTAT');
    this.cpuBefore = await this.client.info('cpu');
  }
  async read() {
    return {
      redisCpuBefore: this.cpuBefore,
      redisCpuAfter: await this.client.info('cpu'),
      redisCommandstats: await this.client.info('commandstats'),
    };
  }
  async close() {
    await this.client.quit();
  }
}

/** Stands in for RedisStats on PostgreSQL: no server figures. */
class NoStats {
  async reset() {}
  async read() { return {}; }
  async close() {}
}

/** The classes and constructor options for the args' datastore. */
function datastore(args) {
  if (!args.postgres) {
    return {
      Queue: bullmq.Queue,
      Worker: bullmq.Worker,
      options: (extra = {}) => ({ ...extra, connection: connectionOf(args.redis) }),
      stats: () => new RedisStats(args.redis),
      close: async () => {},
    };
  }
  const b = open({ postgres: args.postgres, schema: args.schema, migrate: true });
  return { Queue: b.Queue, Worker: b.Worker, options: (extra = {}) => b.options(extra), stats: () => new NoStats(),
    close: () => b.close() };
}

class Meter {
  start() {
    this.cpu0 = process.cpuUsage();
    this.t0 = process.hrtime.bigint();
  }
  stop() {
    this.t1 = process.hrtime.bigint();
    this.cpu = process.cpuUsage(this.cpu0);
  }
  result(jobs) {
    return {
      seconds: Number(this.t1 - this.t0) / 1e9,
      jobs,
      cpuUserMs: this.cpu.user / 1000,
      cpuSysMs: this.cpu.system / 1000,
    };
  }
}

async function preload(queue, jobs, batch) {
  for (let start = 0; start < jobs; start += batch) {
    const items = [];
    for (let i = start; i < Math.min(start + batch, jobs); i++) items.push({ name: JOB_NAME, data: { i } });
    await queue.addBulk(items);
  }
}

async function opAdd(args, queue, stats, meter) {
  await stats.reset();
  meter.start();
  for (let i = 0; i < args.jobs; i++) await queue.add(JOB_NAME, { i });
  meter.stop();
  return {};
}

async function opAddBulk(args, queue, stats, meter) {
  await stats.reset();
  meter.start();
  await preload(queue, args.jobs, args.batch || 1000);
  meter.stop();
  return {};
}

function workerOptions(args, ds) {
  const opts = ds.options({ concurrency: args.concurrency || 1, autorun: false });
  if (args.removeOnComplete) opts.removeOnComplete = { count: 0 };
  return opts;
}

async function opProcess(args, queue, stats, meter, ds) {
  await preload(queue, args.jobs, args.batch || 1000);
  let done = 0;
  let finished;
  const allDone = new Promise((resolve) => { finished = resolve; });
  const worker = new ds.Worker(args.queue, async () => undefined, workerOptions(args, ds));
  worker.on('error', (err) => process.stderr.write(`worker error: ${err}\n`));
  worker.on('completed', () => {
    done += 1;
    if (done === args.jobs) {
      meter.stop();
      finished();
    }
  });
  await worker.waitUntilReady();
  await stats.reset();
  meter.start();
  const running = worker.run();
  await allDone;
  await worker.close();
  await running;
  return {};
}

async function opLatency(args, queue, stats, meter, ds) {
  const latencies = [];
  let finished;
  const allDone = new Promise((resolve) => { finished = resolve; });
  const processor = async (job) => {
    latencies.push(nowMs() - job.timestamp);
  };
  const worker = new ds.Worker(args.queue, processor, workerOptions(args, ds));
  worker.on('error', (err) => process.stderr.write(`worker error: ${err}\n`));
  worker.on('completed', () => {
    if (latencies.length === args.jobs) {
      meter.stop();
      finished();
    }
  });
  await worker.waitUntilReady();
  const running = worker.run();
  await sleep(300); // let the worker go idle: blocked on the queue marker
  await stats.reset();
  meter.start();
  const interval = args.interval ?? 20;
  const t0 = nowMs();
  for (let i = 0; i < args.jobs; i++) {
    const wait = t0 + i * interval - nowMs();
    if (wait > 0) await sleep(wait);
    await queue.add(JOB_NAME, { i });
  }
  await allDone;
  await worker.close();
  await running;
  return { latenciesMs: latencies };
}

const OPS = { add: opAdd, addBulk: opAddBulk, process: opProcess, latency: opLatency };

async function main() {
  const args = JSON.parse(process.argv[2] || '{}');
  const op = OPS[args.op];
  if (!op) throw new Error(`unknown op ${args.op}`);
  const ds = datastore(args);
  const queue = new ds.Queue(args.queue, ds.options());
  await queue.waitUntilReady();
  const stats = ds.stats();
  const meter = new Meter();
  const extra = await op(args, queue, stats, meter, ds);
  const out = Object.assign(meter.result(args.jobs), extra, await stats.read());
  await queue.close();
  await stats.close();
  await ds.close();
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().then(() => process.exit(0), (err) => {
  process.stdout.write(`${JSON.stringify({ error: String(err && err.stack || err) })}\n`);
  process.exit(1);
});
