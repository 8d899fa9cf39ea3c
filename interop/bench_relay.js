'use strict';
// Node's runner of scripts/bench_relay.py: one publisher relay and N subscriber relays (each its
// own node, own connection), all in this process, on Redis or on bullmq's PostgreSQL backend.
//
//   node interop/bench_relay.js '<json>'
//     {backend: "redis" | "postgres", redis?: url, postgres?: url, schema?: name, namespace,
//      subscribers, messages, warmup, latencyRate, latencySeconds, inboxMaxLength, idleTimeoutMs}
//
// Prints one JSON line: {throughput: {...}, latency: {...}} (see scripts/bench_relay.py), or
// {"error": message} and exits 1. The Python runner (scripts/bench_relay.py --runner) does the same
// work with bullmq_compat.Relay.

const { performance } = require('node:perf_hooks');
const { Relay, createPostgresRelayBackend } = require('bullmq');

const TOPIC = 'bench.fanout';

function nowMs() {
  return performance.timeOrigin + performance.now();
}

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

function relayOptions(args, nodeId) {
  const common = { namespace: args.namespace, nodeId, inboxMaxLength: args.inboxMaxLength };
  if (args.backend === 'postgres') {
    return {
      ...common,
      connection: { connectionString: args.postgres, schema: args.schema, connectionTimeoutMillis: 10000 },
      backend: createPostgresRelayBackend,
    };
  }
  const url = new URL(args.redis);
  return {
    ...common,
    connection: {
      host: url.hostname,
      port: Number(url.port || 6379),
      db: Number((url.pathname || '/0').slice(1) || 0),
      maxRetriesPerRequest: null,
    },
  };
}

async function main() {
  const args = JSON.parse(process.argv[2] || '{}');
  const errors = [];
  const relays = [];
  // the phase deliveries are counted for: messages with lo <= i < hi
  let phase = null;
  const onMessage = message => {
    const now = nowMs();
    const p = phase;
    const { i, t } = message.data;
    if (p && i >= p.lo && i < p.hi) {
      p.count += 1;
      p.last = now;
      p.latencies.push(Math.round((now - t) * 1000) / 1000);
      if (p.count >= p.expected && p.resolve) p.resolve();
    }
  };
  try {
    for (let s = 0; s < args.subscribers; s++) {
      const relay = new Relay(relayOptions(args, `sub${s}`));
      relay.on('error', err => errors.push(String((err && err.message) || err)));
      relays.push(relay);
    }
    const publisher = new Relay(relayOptions(args, 'pub'));
    publisher.on('error', err => errors.push(String((err && err.message) || err)));
    relays.push(publisher);
    await Promise.all(relays.map(r => r.waitUntilReady()));
    for (const relay of relays.slice(0, args.subscribers)) {
      await relay.subscribe(TOPIC, onMessage);
    }

    let next = 0;
    const startPhase = count => {
      phase = { lo: next, hi: next + count, expected: count * args.subscribers, count: 0, last: 0, latencies: [] };
      phase.done = new Promise(resolve => {
        phase.resolve = resolve;
      });
      next += count;
      return phase;
    };
    const waitDeliveries = async p => {
      // until every delivery arrived, or none for idleTimeoutMs (a lost message: at most once)
      let seen = -1;
      while (p.count < p.expected && p.count !== seen) {
        seen = p.count;
        await Promise.race([p.done, sleep(args.idleTimeoutMs)]);
      }
    };

    // warm-up (not measured): scripts loaded, inbox readers blocking
    if (args.warmup > 0) {
      const p = startPhase(args.warmup);
      for (let i = p.lo; i < p.hi; i++) await publisher.publish(TOPIC, { i, t: nowMs() });
      await waitDeliveries(p);
    }

    // throughput: sequential awaits, as fast as they go
    const tp = startPhase(args.messages);
    const cpu0 = process.cpuUsage();
    const t0 = nowMs();
    for (let i = tp.lo; i < tp.hi; i++) {
      await publisher.publish(TOPIC, { i, t: nowMs() });
    }
    const published = nowMs();
    await waitDeliveries(tp);
    const cpu = process.cpuUsage(cpu0);
    const throughput = {
      published: args.messages,
      publishSeconds: (published - t0) / 1000,
      expected: tp.expected,
      deliveries: tp.count,
      deliverySeconds: ((tp.last || published) - t0) / 1000,
      cpuMs: (cpu.user + cpu.system) / 1000,
      latencies: tp.latencies,
    };

    // latency: a modest fixed rate, so queueing does not dominate
    const count = Math.max(1, Math.round(args.latencyRate * args.latencySeconds));
    const lp = startPhase(count);
    const interval = 1000 / args.latencyRate;
    const l0 = nowMs();
    for (let k = 0; k < count; k++) {
      const wait = l0 + k * interval - nowMs();
      if (wait > 0) await sleep(wait);
      await publisher.publish(TOPIC, { i: lp.lo + k, t: nowMs() });
    }
    await waitDeliveries(lp);
    const latency = { published: count, expected: lp.expected, deliveries: lp.count, latencies: lp.latencies };

    await Promise.all(relays.map(r => r.close()));
    relays.length = 0;
    // exit once written: a pipe's writes may be asynchronous, and the line is large
    const line = JSON.stringify({ throughput, latency, errors: errors.slice(0, 10) }) + '\n';
    process.stdout.write(line, () => process.exit(0));
  } finally {
    await Promise.all(relays.map(r => r.close().catch(() => undefined)));
  }
}

main().catch(err => {
  process.stdout.write(JSON.stringify({ error: String((err && err.stack) || err) }) + '\n');
  process.exit(1);
});
