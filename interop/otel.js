'use strict';
// Node side of the trace tests: BullMQ with bullmq-otel 2.0.1 and an in-memory span exporter.
//
//   node interop/otel.js produce '{"redis": url, "queue": q, "name": n, "data": {...}}'
//     → {"id", "tm", "spans": [...]}            (the producer span Node made)
//   node interop/otel.js consume '{"redis": url, "queue": q, "timeoutMs": 10000}'
//     → {"id", "spans": [...]}                  (the spans Node made while processing one job)
//   node interop/otel.js produceFlow '{"redis": url, "flow": {...}}'
//     → {"ids": [...], "tms": {id: tm}, "spans": [...]}   (a FlowProducer's flow: every job's id
//                                                          and stored tm, and the spans Node made)
// A span is {name, kind, traceId, spanId, parentSpanId, attributes}.
const IORedis = require('ioredis');
const { FlowProducer, Queue, Worker } = require('bullmq');
const { BullMQOtel } = require('bullmq-otel');
const { trace, propagation } = require('@opentelemetry/api');
const { W3CTraceContextPropagator } = require('@opentelemetry/core');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
propagation.setGlobalPropagator(new W3CTraceContextPropagator());

const spans = () => exporter.getFinishedSpans().map((s) => ({
  name: s.name,
  kind: s.kind,
  traceId: s.spanContext().traceId,
  spanId: s.spanContext().spanId,
  parentSpanId: (s.parentSpanContext && s.parentSpanContext.spanId) || s.parentSpanId || null,
  attributes: s.attributes,
}));

async function main() {
  const [op, json] = process.argv.slice(2);
  const args = JSON.parse(json || '{}');
  const connection = new IORedis(args.redis, { maxRetriesPerRequest: null });
  const telemetry = new BullMQOtel({ tracerName: 'node-test' });
  try {
    if (op === 'produce') {
      const queue = new Queue(args.queue, { connection, telemetry });
      const job = await queue.add(args.name || 'traced', args.data || {}, args.opts || {});
      const tm = await connection.hget(`bull:${args.queue}:${job.id}`, 'opts');
      await queue.close();
      return { id: job.id, tm: JSON.parse(tm).tm || null, spans: spans() };
    }
    if (op === 'produceFlow') {
      const flows = new FlowProducer({ connection, telemetry });
      const tree = await flows.add(args.flow);
      const ids = [];
      const tms = {};
      const walk = async (node) => {
        ids.push(node.job.id);
        const opts = await connection.hget(`bull:${node.job.queueName}:${node.job.id}`, 'opts');
        tms[node.job.id] = JSON.parse(opts).tm || null;
        for (const child of node.children || []) await walk(child);
      };
      await walk(tree);
      await flows.close();
      return { ids, tms, spans: spans() };
    }
    if (op === 'consume') {
      let done;
      const finished = new Promise((resolve) => { done = resolve; });
      const worker = new Worker(args.queue, async (job) => ({ ok: job.id }), { connection, telemetry });
      worker.on('completed', (job) => done(job.id));
      const timeout = new Promise((resolve) => setTimeout(() => resolve(null), args.timeoutMs || 10000));
      const id = await Promise.race([finished, timeout]);
      await worker.close();
      return { id, spans: spans() };
    }
    throw new Error(`unknown op ${op}`);
  } finally {
    connection.disconnect();
  }
}

main().then((result) => {
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(0);
}, (err) => {
  process.stdout.write(JSON.stringify({ error: err.message }) + '\n');
  process.exit(1);
});
