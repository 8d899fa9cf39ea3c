'use strict';
// Node side of the meter tests: BullMQ 6 with bullmq-otel 2.0.1 (enableMetrics) and in-memory
// readers, doing the same work as tests/test_interop_meter.py does in Python.
//
//   node interop/otel_meter.js work '{"redis": url, "queue": q, "timeoutMs": 20000}'
//     → {"metrics": [...]}   a worker (and the queue) with a meter process one job of each kind:
//                            ok, retry (fails once, retried at once), backoff (fails once, retried
//                            after a 20 ms backoff), bad (fails for good), limited (rate-limited once:
//                            back to wait), delay (moves itself to delayed once), parent (adds a
//                            child, waits for it); then queue.recordJobCountsMetric(completed,
//                            failed, waiting, delayed)
//   node interop/otel_meter.js manage '{"redis": url, "queue": q}'
//     → {"spans": [...], "workerId"}   the spans of a queue's (and a worker's) management calls
//                                      (see MANAGE below)
// A metric is {scope, name, description, unit, type, dataPointType, points: [{attributes, value}]};
// a span {name, kind, spanId, parentSpanId, attributes}.
const IORedis = require('ioredis');
const { DelayedError, Queue, WaitingChildrenError, Worker } = require('bullmq');
const { BullMQOtel } = require('bullmq-otel');
const { context, metrics, trace, propagation } = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { W3CTraceContextPropagator } = require('@opentelemetry/core');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { MeterProvider, MetricReader, DataPointType } = require('@opentelemetry/sdk-metrics');

class TestReader extends MetricReader {
  async onForceFlush() {}
  async onShutdown() {}
}

const reader = new TestReader();
metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
propagation.setGlobalPropagator(new W3CTraceContextPropagator());
// as an application's SDK set-up does: spans made inside a span's callback are its children
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const POINT_TYPES = { [DataPointType.HISTOGRAM]: 'histogram', [DataPointType.GAUGE]: 'gauge', [DataPointType.SUM]: 'sum' };

async function collected() {
  const { resourceMetrics } = await reader.collect();
  const out = [];
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      out.push({
        scope: scope.scope.name,
        name: metric.descriptor.name,
        description: metric.descriptor.description,
        unit: metric.descriptor.unit,
        type: metric.descriptor.type,
        dataPointType: POINT_TYPES[metric.dataPointType] || String(metric.dataPointType),
        isMonotonic: metric.isMonotonic === undefined ? null : metric.isMonotonic,
        points: metric.dataPoints.map((p) => ({
          attributes: p.attributes,
          value: typeof p.value === 'number' ? p.value : { count: p.value.count, sum: p.value.sum },
        })),
      });
    }
  }
  return out;
}

const spans = () => exporter.getFinishedSpans().map((s) => ({
  name: s.name,
  kind: s.kind,
  spanId: s.spanContext().spanId,
  parentSpanId: (s.parentSpanContext && s.parentSpanContext.spanId) || s.parentSpanId || null,
  attributes: s.attributes,
}));

async function work(args, connection) {
  const telemetry = new BullMQOtel({ tracerName: 'bullmq', enableMetrics: true });
  const queue = new Queue(args.queue, { connection, telemetry });
  const seen = new Set();
  let worker;
  const processor = async (job, token) => {
    const first = !seen.has(job.id);
    seen.add(job.id);
    switch (job.name) {
      case 'retry':
      case 'backoff':
        if (job.attemptsMade === 0) throw new Error('first attempt fails');
        return 'ok';
      case 'bad':
        throw new Error('fails for good');
      case 'limited':
        if (first) {
          await worker.rateLimit(20);
          throw Worker.RateLimitError();
        }
        return 'ok';
      case 'delay':
        if (first) {
          await job.moveToDelayed(Date.now() + 20, token);
          throw new DelayedError();
        }
        return 'ok';
      case 'parent':
        if (first) {
          await queue.add('child', {}, { parent: { id: job.id, queue: job.queueQualifiedName } });
          if (await job.moveToWaitingChildren(token)) throw new WaitingChildrenError();
        }
        return 'ok';
      default:
        return 'ok';
    }
  };
  const completed = [];
  let failed = 0;
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  const check = () => { if (completed.length === 7 && failed) done(true); };
  worker = new Worker(args.queue, processor, { connection, telemetry, autorun: false });
  worker.on('completed', (job) => { completed.push(job.name); check(); });
  worker.on('failed', (job) => { if (job.name === 'bad') failed += 1; check(); });
  await queue.add('ok', {});
  await queue.add('retry', {}, { attempts: 2 });
  await queue.add('backoff', {}, { attempts: 2, backoff: { type: 'fixed', delay: 20 } });
  await queue.add('bad', {}, { attempts: 1 });
  await queue.add('limited', {});
  await queue.add('delay', {});
  await queue.add('parent', {});
  worker.run();
  const timeout = new Promise((resolve) => setTimeout(() => resolve(false), args.timeoutMs || 20000));
  const ok = await Promise.race([finished, timeout]);
  await worker.close();
  await queue.recordJobCountsMetric('completed', 'failed', 'waiting', 'delayed');
  await queue.close();
  return { ok, completed, metrics: await collected() };
}

// MANAGE: the same calls as test_interop_meter.py's, on a queue that only a tracer watches
async function manage(args, connection) {
  const telemetry = new BullMQOtel({ tracerName: 'bullmq' });
  const queue = new Queue(args.queue, { connection, telemetry });
  await queue.add('a', {}, { jobId: 'j1' });
  await queue.add('b', {}, { jobId: 'j2' });
  await queue.add('c', {}, { jobId: 'j3', delay: 60000 });
  exporter.reset();
  await queue.pause();
  await queue.resume();
  await queue.updateJobProgress('j1', { p: 1 });
  await queue.removeDeduplicationKey('k');
  await queue.removeDebounceKey('k');
  await queue.remove('j2');
  await queue.promoteJobs({ count: 50 });
  await queue.retryJobs({ count: 50 });
  await queue.rateLimit(10);
  await queue.clean(0, 100, 'wait');
  await queue.drain(true);
  await queue.trimEvents(10);
  const worker = new Worker(args.queue, null, { connection, telemetry, autorun: false, name: 'w1' });
  await worker.pause(true);
  await worker.resume();
  await worker.rateLimit(10);
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  return { spans: spans(), workerId: worker.id };
}

async function main() {
  const [op, json] = process.argv.slice(2);
  const args = JSON.parse(json || '{}');
  const connection = new IORedis(args.redis, { maxRetriesPerRequest: null });
  try {
    if (op === 'work') return await work(args, connection);
    if (op === 'manage') return await manage(args, connection);
    throw new Error(`unknown op ${op}`);
  } finally {
    connection.disconnect();
  }
}

main().then((result) => {
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(0);
}, (err) => {
  process.stdout.write(JSON.stringify({ error: err.stack || err.message }) + '\n');
  process.exit(1);
});
