'use strict';
// Which datastore an interop script talks to, from its JSON args (shared by cli.js, flow.js,
// events.js and dedup.js; bullmq_compat/_board/board.js has its own copy of the little it needs).
//
//   Redis (the default):  {"redis": "redis://127.0.0.1:6379", "prefix": "bull"}
//   PostgreSQL:           {"postgres": "postgresql://postgres@127.0.0.1:5432/test",
//                          "schema": "s_xxx", "migrate": true}
//
// With "postgres" the BullMQ classes are bound to Node's own PostgreSQL backend
// (bullmq's createPostgresBackend, through bullmq's withBackend) and every one of them gets
// the connection {connectionString, schema, migrate, connectionTimeoutMillis}. "schema" is the
// PostgreSQL schema the queues live in (Node's default is "bullmq"); "migrate": true lets the
// first Queue/Worker create or upgrade it (Node's runMigrations), otherwise Node only checks
// the schema's migration ledger and fails with SchemaMigrationRequiredError on a fresh one.
// "prefix" means nothing there. Both "redis" and "postgres" at once is an error.
//
// open(args) -> {
//   kind: 'redis' | 'postgres',
//   Queue, Worker, QueueEvents, FlowProducer,   the BullMQ classes for that backend
//   options(extra) -> {...extra, connection[, prefix]}   constructor options for them
//   connection, prefix,                          Redis: the shared IORedis client and prefix
//   schema, url,                                 PostgreSQL: the schema and connection string
//   ready() -> Promise                           Redis: waits for the client (bounded)
//   sql(text, params) -> rows                    PostgreSQL: a query of our own (search_path =
//                                                the schema; lazily opened, no application_name
//                                                so getWorkers never lists it)
//   close() -> Promise                           closes what open() opened
// }

const bullmq = require('bullmq');

const DEFAULT_REDIS = 'redis://127.0.0.1:6379';

function connectTimeout(args) {
  return args.connectTimeoutMs || 10000;
}

/** Waits for Redis to answer; ioredis would otherwise retry (and we would hang) forever. */
function redisReady(connection, url, timeoutMs) {
  let lastError = null;
  connection.on('error', (err) => { lastError = err; }); // later errors surface via the commands
  if (connection.status === 'ready') return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      const why = lastError ? lastError.message : `no answer in ${timeoutMs} ms`;
      const shown = url.replace(/^([a-z]+:\/\/[^:@/]*):[^@]*@/i, '$1:***@'); // never the password
      reject(new Error(`cannot connect to Redis at ${shown}: ${why}`));
    }, timeoutMs);
    connection.once('ready', () => { clearTimeout(timer); resolve(); });
  });
}

function openRedis(args) {
  const IORedis = require('ioredis');
  const url = args.redis || DEFAULT_REDIS;
  const prefix = args.prefix || 'bull';
  // caFile: for rediss://, the PEM CA the server's certificate must chain to
  const tls = args.caFile ? { tls: { ca: require('node:fs').readFileSync(args.caFile) } } : {};
  const connection = new IORedis(url, { maxRetriesPerRequest: null, ...tls });
  return {
    kind: 'redis',
    Queue: bullmq.Queue,
    Worker: bullmq.Worker,
    QueueEvents: bullmq.QueueEvents,
    FlowProducer: bullmq.FlowProducer,
    connection,
    prefix,
    url,
    options(extra = {}) {
      return { ...extra, connection, prefix };
    },
    ready() {
      return redisReady(connection, url, connectTimeout(args));
    },
    sql() {
      throw new TypeError('sql() needs the PostgreSQL backend ("postgres" in the args)');
    },
    async close() {
      if (connection.status === 'ready') await connection.quit().catch(() => connection.disconnect());
      else connection.disconnect();
    },
  };
}

function openPostgres(args) {
  const url = args.postgres;
  const schema = args.schema || bullmq.DEFAULT_SCHEMA;
  const quoted = bullmq.quoteSchemaName(schema); // validates the name before anything connects
  const connection = { connectionString: url, schema, connectionTimeoutMillis: connectTimeout(args) };
  if (args.migrate !== undefined && args.migrate !== null) connection.migrate = Boolean(args.migrate);
  const bound = bullmq.withBackend(bullmq.createPostgresBackend);
  let pool = null;
  return {
    kind: 'postgres',
    Queue: bound.Queue,
    Worker: bound.Worker,
    QueueEvents: bound.QueueEvents,
    FlowProducer: bound.FlowProducer,
    connection,
    prefix: undefined,
    schema,
    url,
    options(extra = {}) {
      // every class gets its own copy: Node's backend reads (and may keep) the object
      return { ...extra, connection: { ...connection } };
    },
    async ready() {},
    async sql(text, params = []) {
      if (!pool) {
        const pg = require('pg');
        pool = new pg.Pool({
          connectionString: url, max: 2, connectionTimeoutMillis: connectTimeout(args),
          options: `-c search_path=${quoted}`,
        });
        pool.on('error', () => {});
      }
      return (await pool.query(text, params)).rows;
    },
    async close() {
      if (pool) await pool.end().catch(() => {});
    },
  };
}

function open(args) {
  if (args.postgres && args.redis) throw new TypeError('give either "redis" or "postgres", not both');
  return args.postgres ? openPostgres(args) : openRedis(args);
}

module.exports = { open, DEFAULT_REDIS };
