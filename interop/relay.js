'use strict';
// A Node BullMQ Relay for the interop tests (tests/test_interop_relay.py), driven over stdin.
//
//   node relay.js node <redis-url> <namespace> [options-json]
//
// Starts a Relay (options: Node's RelayOptions, e.g. {"nodeId": "n1", "leaseDuration": 1000}),
// prints {"ready": true, "nodeId": ...} once it is registered, then one JSON line per event:
//   {"event": "message", "sub": <pattern>, "message": {topic, data, mid, ts, retained}}
//   {"event": "swept", "ids": [...]} | {"event": "recovered"} | {"event": "lag", "backlog": n}
//   {"event": "error", "message": ...}
// and reads one JSON command per stdin line, answering {"id", "result"} or {"id", "error", "code"}:
//   {"id", "op": "subscribe", "pattern"}        -> {"pattern"}
//   {"id", "op": "unsubscribe", "pattern"}      -> true
//   {"id", "op": "publish", "topic", "data", "retain"?} -> Node's publish result
//   {"id", "op": "deleteRetained", "topic"}     -> boolean
//   {"id", "op": "getters"}                     -> {counts, nodes, subscriptions, patterns, retained}
//   {"id", "op": "getNodes"}                    -> Node's getNodes()
//   {"id", "op": "publishLoop", "topic", "intervalMs"} -> true; then publishes {"n": 1, 2, ...} every
//                                                 intervalMs (a failed publish is counted, and the
//                                                 next one has the next number)
//   {"id", "op": "loopState"}                   -> {n, sent, failed, routed}: the number of the publish
//                                                 under way (or last made), and how many were routed
//                                                 (endpoints >= 1) so far
//   {"id", "op": "stopLoop", "detail"?}         -> {sent, failed} (+ "routed": the numbers routed, in
//                                                 order, with "detail": true)
//   {"id", "op": "close"}                       -> closes the relay (unregisters) and exits
// End of stdin or SIGTERM closes the relay too; SIGKILL leaves its registration to be swept.

const readline = require('node:readline');
const { Relay } = require('bullmq');
const IORedis = require('ioredis');

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

async function main() {
  const [, , mode, url, namespace, optionsJson] = process.argv;
  if (mode !== 'node' || !url || !namespace) {
    throw new Error('usage: node relay.js node <redis-url> <namespace> [options-json]');
  }
  const options = JSON.parse(optionsJson || '{}');
  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  connection.on('error', () => {}); // reconnects on its own; relay errors are reported below
  const relay = new Relay({ connection, namespace, ...options });
  relay.on('error', err => out({ event: 'error', message: String((err && err.message) || err) }));
  relay.on('swept', ids => out({ event: 'swept', ids }));
  relay.on('recovered', () => out({ event: 'recovered' }));
  relay.on('lag', backlog => out({ event: 'lag', backlog }));
  await relay.waitUntilReady();
  out({ ready: true, nodeId: relay.nodeId, pid: process.pid });

  const subscriptions = new Map();
  let loop = null;
  let closing;
  const close = () => {
    if (!closing) {
      if (loop) loop.stop = true;
      closing = relay
        .close()
        .then(() => connection.quit())
        .catch(() => undefined)
        .then(() => process.exit(0));
    }
    return closing;
  };
  process.on('SIGTERM', close);

  const ops = {
    async subscribe({ pattern }) {
      const sub = await relay.subscribe(pattern, message =>
        out({ event: 'message', sub: pattern, message }),
      );
      subscriptions.set(pattern, sub);
      return { pattern: sub.pattern };
    },
    async unsubscribe({ pattern }) {
      await subscriptions.get(pattern).unsubscribe();
      subscriptions.delete(pattern);
      return true;
    },
    publish({ topic, data, retain }) {
      return relay.publish(topic, data, retain === undefined ? {} : { retain });
    },
    deleteRetained({ topic }) {
      return relay.deleteRetained(topic);
    },
    getNodes() {
      return relay.getNodes();
    },
    publishLoop({ topic, intervalMs }) {
      if (loop) throw new Error('a loop runs already');
      const state = { n: 0, sent: 0, failed: 0, routed: [], stop: false };
      state.done = (async () => {
        while (!state.stop) {
          state.n += 1;
          try {
            const result = await relay.publish(topic, { n: state.n });
            state.sent += 1;
            if (result.endpoints >= 1) state.routed.push(state.n);
          } catch (err) {
            state.failed += 1;
          }
          await new Promise(resolve => setTimeout(resolve, intervalMs || 100));
        }
      })();
      loop = state;
      return true;
    },
    loopState() {
      if (!loop) throw new Error('no loop runs');
      return { n: loop.n, sent: loop.sent, failed: loop.failed, routed: loop.routed.length };
    },
    async stopLoop({ detail }) {
      if (!loop) throw new Error('no loop runs');
      const state = loop;
      state.stop = true;
      await state.done;
      loop = null;
      return detail ? { sent: state.sent, failed: state.failed, routed: state.routed }
        : { sent: state.sent, failed: state.failed };
    },
    async getters() {
      return {
        counts: await relay.getCounts(),
        nodes: await relay.getNodes(),
        subscriptions: await relay.getSubscriptions(),
        patterns: await relay.getPatterns(),
        retained: await relay.getRetained(),
      };
    },
    async close() {
      await close();
    },
  };

  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const command = JSON.parse(line);
    try {
      const op = ops[command.op];
      if (!op) throw new Error(`unknown op ${command.op}`);
      out({ id: command.id, result: await op(command) });
    } catch (err) {
      out({ id: command.id, error: String((err && err.message) || err), code: err && err.code });
    }
  }
  await close();
}

main().catch(err => {
  process.stderr.write(`${(err && err.stack) || err}\n`);
  process.exit(1);
});
