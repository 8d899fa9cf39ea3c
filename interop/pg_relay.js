'use strict';
// A Node BullMQ Relay on its PostgreSQL backend (bullmq's createPostgresRelayBackend), driven line
// by line by the Python interop tests (tests/test_interop_pg_relay.py).
//
//   node interop/pg_relay.js '<json>'
//     {postgres, schema, namespace, nodeId, name?, leaseDuration?, heartbeatInterval?,
//      sweepInterval?, blockTimeout?}
//
// Prints {"ready": true, "nodeId": id} once the relay is registered, then reads one JSON command a
// line on stdin and answers each with {"id": <its id>, "result": value} or {"id", "error", "code"}:
//
//   {"id", "op": "subscribe", "pattern"}            -> {"pattern"}; each message for it is printed
//                                                      as {"event": "message", "pattern", "message":
//                                                      {topic, mid, ts, data, retained}}
//   {"id", "op": "unsubscribe", "pattern"}          -> true
//   {"id", "op": "publish", "topic", "data", "retain"?}  -> Node's {mid, nodes, endpoints}
//   {"id", "op": "deleteRetained", "topic"}         -> boolean
//   {"id", "op": "getCounts" | "getNodes" | "getRetained" | "getNamespaces"}
//   {"id", "op": "getSubscriptions", "filter"?}     -> Node's getSubscriptions(filter)
//   {"id", "op": "getNodeConnections", "nodeId"?}
//   {"id", "op": "publishLoop", "topic", "intervalMs"}  -> true; then publishes {"n": 1, 2, ...}
//                                                      every intervalMs (a failed publish is counted
//                                                      and retried with the next number)
//   {"id", "op": "loopState"}                       -> {n, sent, failed, routed}: the number of the
//                                                      publish under way (or last made), and how many
//                                                      were routed (endpoints >= 1) so far
//   {"id", "op": "stopLoop", "detail"?}             -> {sent, failed} (+ "routed": the numbers routed,
//                                                      in order, with "detail": true)
//   {"id", "op": "close"}                           -> true, then exits 0
//
// The relay's events are printed as {"event": "swept", "ids"}, {"event": "recovered"},
// {"event": "lag", "backlog"}, {"event": "error", "message"}. A setup error prints
// {"error": message} and exits 1.

const readline = require('node:readline');
const { Relay, createPostgresRelayBackend } = require('bullmq');

function out(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}

async function main() {
  const args = JSON.parse(process.argv[2] || '{}');
  if (!args.postgres || !args.schema) throw new TypeError('"postgres" and "schema" are required');
  const opts = {
    connection: { connectionString: args.postgres, schema: args.schema, connectionTimeoutMillis: 10000 },
    backend: createPostgresRelayBackend,
    namespace: args.namespace,
    nodeId: args.nodeId,
  };
  for (const key of ['name', 'leaseDuration', 'heartbeatInterval', 'sweepInterval', 'blockTimeout',
    'inboxMaxLength', 'lagThreshold', 'maxMessageSize']) {
    if (args[key] !== undefined) opts[key] = args[key];
  }
  const relay = new Relay(opts);
  relay.on('error', (err) => out({ event: 'error', message: String(err && err.message) }));
  relay.on('swept', (ids) => out({ event: 'swept', ids }));
  relay.on('recovered', () => out({ event: 'recovered' }));
  relay.on('lag', (backlog) => out({ event: 'lag', backlog }));
  await relay.waitUntilReady();
  out({ ready: true, nodeId: relay.nodeId });

  const subscriptions = new Map();
  let loop = null;

  async function run(cmd) {
    switch (cmd.op) {
      case 'subscribe': {
        const sub = await relay.subscribe(cmd.pattern, (message) => {
          out({ event: 'message', pattern: cmd.pattern, message });
        });
        subscriptions.set(cmd.pattern, sub);
        return { pattern: sub.pattern };
      }
      case 'unsubscribe': {
        const sub = subscriptions.get(cmd.pattern);
        if (!sub) throw new Error(`not subscribed to ${cmd.pattern}`);
        subscriptions.delete(cmd.pattern);
        await sub.unsubscribe();
        return true;
      }
      case 'publish':
        return relay.publish(cmd.topic, cmd.data, cmd.retain !== undefined ? { retain: cmd.retain } : {});
      case 'deleteRetained':
        return relay.deleteRetained(cmd.topic);
      case 'getCounts':
        return relay.getCounts();
      case 'getNodes':
        return relay.getNodes();
      case 'getRetained':
        return relay.getRetained();
      case 'getNamespaces':
        return relay.getNamespaces();
      case 'getSubscriptions':
        return relay.getSubscriptions(cmd.filter);
      case 'getNodeConnections':
        return relay.getNodeConnections(cmd.nodeId);
      case 'publishLoop': {
        if (loop) throw new Error('a loop runs already');
        const state = { sent: 0, failed: 0, n: 0, routed: [], stop: false };
        state.done = (async () => {
          while (!state.stop) {
            state.n += 1;
            try {
              const result = await relay.publish(cmd.topic, { n: state.n });
              state.sent += 1;
              if (result.endpoints >= 1) state.routed.push(state.n);
            } catch (err) {
              state.failed += 1;
            }
            await new Promise((resolve) => setTimeout(resolve, cmd.intervalMs || 100));
          }
        })();
        loop = state;
        return true;
      }
      case 'loopState': {
        if (!loop) throw new Error('no loop runs');
        return { n: loop.n, sent: loop.sent, failed: loop.failed, routed: loop.routed.length };
      }
      case 'stopLoop': {
        if (!loop) throw new Error('no loop runs');
        loop.stop = true;
        await loop.done;
        const { sent, failed, routed } = loop;
        loop = null;
        return cmd.detail ? { sent, failed, routed } : { sent, failed };
      }
      case 'close':
        if (loop) {
          loop.stop = true;
          await loop.done;
        }
        await relay.close();
        return true;
      default:
        throw new Error(`unknown op ${cmd.op}`);
    }
  }

  const lines = readline.createInterface({ input: process.stdin });
  let closing = false;
  for await (const line of lines) {
    if (!line.trim()) continue;
    const cmd = JSON.parse(line);
    // commands run concurrently (a publish answers while a loop runs), each answered by its id
    run(cmd).then(
      (result) => {
        out({ id: cmd.id, result: result === undefined ? null : result });
        if (cmd.op === 'close') process.exit(0);
      },
      (err) => out({ id: cmd.id, error: String(err && err.message), code: err && err.code }),
    );
    if (cmd.op === 'close') closing = true;
  }
  if (!closing) {
    // stdin closed without "close": close the relay (unregistering the node) and exit
    await relay.close();
    process.exit(0);
  }
}

main().catch((err) => {
  out({ error: String(err && err.message) });
  process.exit(1);
});
