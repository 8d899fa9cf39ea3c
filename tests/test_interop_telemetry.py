"""Traces across languages: bullmq-compat spans continue Node's bullmq-otel traces and back."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from bullmq_compat import Queue, Worker

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parent.parent


async def otel_js(op: str, **args: Any) -> Any:
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(ROOT / "interop" / "otel.js"), op, json.dumps(args),
        cwd=str(ROOT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert proc.returncode == 0, (result, err.decode())
    return result


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


async def _process_one(queue_name: str, redis_url: str, provider: TracerProvider) -> None:
    done = asyncio.Event()
    worker = Worker(queue_name, lambda job: {"ok": True}, redis_url, telemetry=provider, group_keeper=False)
    worker.on("completed", lambda *_: done.set())
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    await asyncio.wait_for(done.wait(), 10)
    await worker.close()
    await task


async def test_python_producer_span_is_the_parent_of_the_python_consumer_span(redis_url, queue_name, spans):
    provider, exporter = spans
    queue = Queue(queue_name, redis_url, telemetry=provider)
    job = await queue.add("traced", {"a": 1})
    await _process_one(queue_name, redis_url, provider)
    await queue.close()
    finished = {s.name: s for s in exporter.get_finished_spans()}
    producer = finished[f"add {queue_name}.traced"]
    consumer = finished[f"process {queue_name}"]
    assert producer.kind == SpanKind.PRODUCER and consumer.kind == SpanKind.CONSUMER
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent.span_id == producer.context.span_id
    assert producer.attributes["bullmq.job.id"] == job.id
    assert consumer.attributes["bullmq.queue.name"] == queue_name


async def test_the_context_is_stored_in_opts_tm_as_a_json_carrier(redis_url, queue_name, spans, redis):
    provider, exporter = spans
    queue = Queue(queue_name, redis_url, telemetry=provider)
    job = await queue.add("traced", {})
    await queue.close()
    stored = json.loads(json.loads(await redis.hget(f"bull:{queue_name}:{job.id}", "opts"))["tm"])
    producer = exporter.get_finished_spans()[0]
    version, trace_id, span_id, _flags = stored["traceparent"].split("-")
    assert (version, trace_id, span_id) == (
        "00", _hex(producer.context.trace_id, 32), _hex(producer.context.span_id, 16))


async def test_omit_context_stores_no_trace_context(redis_url, queue_name, spans, redis):
    provider, _ = spans
    queue = Queue(queue_name, redis_url, telemetry=provider)
    job = await queue.add("untraced", {}, telemetry={"omit_context": True})
    await queue.close()
    opts = json.loads(await redis.hget(f"bull:{queue_name}:{job.id}", "opts"))
    assert "tm" not in opts and opts["omc"] is True


async def test_a_node_producer_trace_continues_in_the_python_consumer(redis_url, queue_name, spans):
    provider, exporter = spans
    produced = await otel_js("produce", redis=redis_url, queue=queue_name, name="from-node", data={"n": 1})
    node_producer = next(s for s in produced["spans"] if s["name"] == f"add {queue_name}.from-node")
    assert json.loads(produced["tm"])["traceparent"].split("-")[1] == node_producer["traceId"]
    await _process_one(queue_name, redis_url, provider)
    consumer = next(s for s in exporter.get_finished_spans() if s.name == f"process {queue_name}")
    assert _hex(consumer.context.trace_id, 32) == node_producer["traceId"]
    assert _hex(consumer.parent.span_id, 16) == node_producer["spanId"]


async def test_a_python_producer_trace_continues_in_a_node_worker(redis_url, queue_name, spans):
    provider, exporter = spans
    queue = Queue(queue_name, redis_url, telemetry=provider)
    job = await queue.add("from-python", {"n": 2})
    await queue.close()
    producer = next(s for s in exporter.get_finished_spans() if s.name == f"add {queue_name}.from-python")
    consumed = await otel_js("consume", redis=redis_url, queue=queue_name, timeoutMs=10000)
    assert consumed["id"] == job.id
    node_consumer = next(s for s in consumed["spans"] if s["name"] == f"process {queue_name}")
    assert node_consumer["traceId"] == _hex(producer.context.trace_id, 32)
    assert node_consumer["parentSpanId"] == _hex(producer.context.span_id, 16)


async def test_a_failed_attempt_marks_its_consumer_span_and_a_success_does_not(redis_url, queue_name, spans):
    provider, exporter = spans
    queue = Queue(queue_name, redis_url, telemetry=provider)
    await queue.add("flaky", {}, attempts=2)
    await queue.close()
    done = asyncio.Event()

    async def flaky(job):
        if job.attempts_made == 0:
            raise RuntimeError("first attempt fails")
        return "ok"

    worker = Worker(queue_name, flaky, redis_url, telemetry=provider, group_keeper=False)
    worker.on("completed", lambda *_: done.set())
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    await asyncio.wait_for(done.wait(), 10)
    await worker.close()
    await task
    consumers = [s for s in exporter.get_finished_spans() if s.name == f"process {queue_name}"]
    assert len(consumers) == 2
    failed, succeeded = consumers
    assert [e.name for e in failed.events] == ["job failed"] and not failed.status.is_ok
    assert succeeded.events == () or not any(e.name == "job failed" for e in succeeded.events)
    assert succeeded.status.is_unset
