'use strict';
// Bull-Board over the given queues: what `bullmq-compat board` runs (docs/cli.md), and the board
// of the Python interop tests (tests/node.py). It ships inside the Python package
// (bullmq_compat/_board/, with the package.json and package-lock.json of the Node modules it
// needs), so it requires nothing of interop/: only bullmq, ioredis, pg, express and @bull-board/*.
// Those come from interop/node_modules in a clone (NODE_PATH) or from the per-user directory
// `bullmq-compat board --install` fills (a copy of this folder, next to its node_modules).
//
//   node board.js --redis URL --port P [--prefix bull] [--host 127.0.0.1] [--read-only true]
//                 --queue Q [--queue Q2 ...]
//
// Serves on host:P (default 127.0.0.1) with base path "/", prints
// {"listening": "http://host:P/", "readOnly": false} once ready (`bullmq-compat board` turns it
// into a line for a person unless given --json), and exits cleanly on SIGTERM/SIGINT. Without
// --redis the URL comes from $BULLMQ_COMPAT_REDIS_URL (how `bullmq-compat board` passes it: off
// the process list, which every local user can read). --read-only true is Bull-Board's
// readOnlyMode: no retry, promote, clean or remove buttons, and its API refuses those actions (405).
//
// PostgreSQL instead of Redis (Node's own backend, bullmq's createPostgresBackend):
//
//   node board.js --postgres URL --schema S [--migrate true|false] --port P --queue Q ...
//
// (or the URL in $BULLMQ_COMPAT_POSTGRES_URL instead of --postgres)
//
// The board's BullMQAdapter is then given Queues bound to createPostgresBackend on that schema;
// the JSON API below answers the same. (Bull-Board lists no workers for such queues: it keeps
// only clients that have an "addr", which Node's Postgres getWorkers entries lack.)
//
// JSON API that lists the jobs of one queue in one status (@bull-board/api dist/routes.js,
// handler dist/handlers/queues.js; query schema in dist/schemas/requests.js):
//
//   GET /api/queues?activeQueue=<queue>&status=<status>&page=1&jobsPerPage=<n>
//
// status is one of the queue's "statuses" (for BullMQ: latest, active, waiting, waiting-children,
// prioritized, completed, failed, delayed); jobsPerPage defaults to 10. The response is
// {"queues": [...]}, one entry per registered queue:
//   {name, counts: {waiting: 1, ...}, isPaused, pagination: {pageCount, range: {start, end}},
//    jobs: [{id, name, data, opts, timestamp, delay, attempts, failedReason, returnValue, ...}]}
// and only the activeQueue's entry has its jobs filled in.
// One job with its status: GET /api/queues/<queue>/<jobId>.

const http = require('node:http');
const express = require('express');
const { createBullBoard } = require('@bull-board/api');
const { BullMQAdapter } = require('@bull-board/api/bullMQAdapter');
const { ExpressAdapter } = require('@bull-board/express');

/** The Queue class and options for Redis or for Node's PostgreSQL backend (the part of
 * interop/backend.js the board needs: this file ships without interop/). */
function openBackend(conn) {
  const bullmq = require('bullmq');
  if (conn.postgres && conn.redis) throw new TypeError('give either --redis or --postgres, not both');
  if (conn.postgres) {
    const schema = conn.schema || bullmq.DEFAULT_SCHEMA;
    bullmq.quoteSchemaName(schema); // validates the name before anything connects
    const connection = { connectionString: conn.postgres, schema, connectionTimeoutMillis: 10000 };
    if (conn.migrate !== undefined) connection.migrate = Boolean(conn.migrate);
    const bound = bullmq.withBackend(bullmq.createPostgresBackend);
    return {
      kind: 'postgres',
      Queue: bound.Queue,
      // every Queue gets its own copy: Node's backend reads (and may keep) the object
      options: () => ({ connection: { ...connection } }),
      close: async () => {},
    };
  }
  const IORedis = require('ioredis');
  const connection = new IORedis(conn.redis, { maxRetriesPerRequest: null });
  const prefix = conn.prefix || 'bull';
  return {
    kind: 'redis',
    Queue: bullmq.Queue,
    connection,
    options: () => ({ connection, prefix }),
    close: () => connection.quit().catch(() => connection.disconnect()),
  };
}

function parseArgs(argv) {
  const opts = { port: 3000, queues: [], conn: {}, host: '127.0.0.1', readOnly: false };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`missing value for ${flag}`);
    if (flag === '--redis') opts.conn.redis = value;
    else if (flag === '--postgres') opts.conn.postgres = value;
    else if (flag === '--schema') opts.conn.schema = value;
    else if (flag === '--migrate') opts.conn.migrate = value === 'true' || value === '1';
    else if (flag === '--port') opts.port = Number(value);
    else if (flag === '--prefix') opts.conn.prefix = value;
    else if (flag === '--queue') opts.queues.push(value);
    else if (flag === '--host') opts.host = value;
    else if (flag === '--read-only') opts.readOnly = value === 'true';
    else throw new Error(`unknown option ${flag}`);
  }
  if (opts.queues.length === 0) throw new Error('at least one --queue is required');
  // a URL not on the command line comes from the environment (off the process list)
  if (!opts.conn.redis && !opts.conn.postgres) {
    if (process.env.BULLMQ_COMPAT_POSTGRES_URL) opts.conn.postgres = process.env.BULLMQ_COMPAT_POSTGRES_URL;
    else opts.conn.redis = process.env.BULLMQ_COMPAT_REDIS_URL || 'redis://127.0.0.1:6379';
  }
  return opts;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const b = openBackend(opts.conn);
  if (b.kind === 'redis') b.connection.on('error', (err) => console.error(`redis: ${err.message}`));
  const queues = opts.queues.map((name) => new b.Queue(name, b.options()));
  // Postgres: fail now (e.g. SchemaMigrationRequiredError) rather than on the first request
  if (b.kind === 'postgres') await Promise.all(queues.map((q) => q.waitUntilReady()));

  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath('/');
  // showWorkers: the board lists the workers connected to each queue (Python ones included)
  createBullBoard({ queues: queues.map((q) => new BullMQAdapter(q, { readOnlyMode: opts.readOnly })), serverAdapter, options: { uiConfig: { showWorkers: true } } });
  const app = express();
  app.use('/', serverAdapter.getRouter());

  const server = http.createServer(app);
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, resolve);
  });
  const shownHost = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await Promise.all(queues.map((q) => q.close().catch(() => {})));
    await b.close();
    process.exit(0);
  };
  // before the line that says we are ready: whoever reads it may stop us at once
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.stdout.write(JSON.stringify({ listening: `http://${shownHost}:${opts.port}/`, readOnly: opts.readOnly }) + '\n');
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
