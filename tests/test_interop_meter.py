"""Metrics and management spans as Node records them: the same work in Node (bullmq-otel with
enableMetrics, interop/otel_meter.js) and in Python, each read by an in-memory reader, compared."""
from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bullmq_compat import Queue, Worker
from tests.meter_helpers import comparable, do_work, meters, python_metrics
from tests.node import INTEROP, run_node

pytestmark = pytest.mark.node


async def otel_meter_js(op: str, **args: Any) -> Any:
    result = await run_node([str(INTEROP / "otel_meter.js"), op, json.dumps(args)],
                            label=f"otel_meter.js {op}", budget=60)
    assert "error" not in result, result
    return result


async def test_the_same_work_records_the_same_metrics_in_node_and_python(redis_url, queue_name):
    node_queue, python_queue = f"{queue_name}-node", f"{queue_name}-py"
    from_node = await otel_meter_js("work", redis=redis_url, queue=node_queue, timeoutMs=20000)
    assert from_node["ok"], from_node
    provider, reader = meters()
    completed = await do_work(python_queue, redis_url, provider)
    assert sorted(completed) == sorted(from_node["completed"])
    ours = comparable(python_metrics(reader), python_queue)
    theirs = comparable(from_node["metrics"], node_queue)
    assert set(ours) == set(theirs) == {
        "bullmq.jobs.completed", "bullmq.jobs.failed", "bullmq.jobs.delayed", "bullmq.jobs.retried",
        "bullmq.jobs.waiting", "bullmq.jobs.waiting_children", "bullmq.job.duration", "bullmq.queue.jobs"}
    for name in theirs:
        assert ours[name] == theirs[name], name
    # what the work was, read from Node's side
    delayed = dict(theirs["bullmq.jobs.delayed"]["points"])
    assert {dict(k)["bullmq.job.name"] for k in delayed} == {"backoff", "delay"}
    gauge = {dict(k)["bullmq.queue.jobs.state"]: v for k, v in theirs["bullmq.queue.jobs"]["points"]}
    assert gauge == {"completed": 7, "failed": 1, "waiting": 0, "delayed": 0}


def _spans(exported: list[dict[str, Any]], queue_name: str, worker_id: str) -> list[tuple[str, int, Any, Any]]:
    by_id = {s["spanId"]: s for s in exported}
    out = []
    for span in exported:
        parent = by_id.get(span["parentSpanId"] or "")
        attributes = {k: {queue_name: "Q", worker_id: "W"}.get(v, v) if isinstance(v, str) else v
                      for k, v in span["attributes"].items()}
        out.append((span["name"].replace(queue_name, "Q"), span["kind"],
                    parent["name"].replace(queue_name, "Q") if parent else None, sorted(attributes.items())))
    return sorted(out, key=lambda s: (s[0], str(s[2])))


async def test_management_calls_make_the_spans_node_makes(redis_url, queue_name):
    node_queue, python_queue = f"{queue_name}-node", f"{queue_name}-py"
    from_node = await otel_meter_js("manage", redis=redis_url, queue=node_queue)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = Queue(python_queue, redis_url, telemetry=provider)
    await queue.add("a", {}, job_id="j1")
    await queue.add("b", {}, job_id="j2")
    await queue.add("c", {}, job_id="j3", delay=60000)
    exporter.clear()
    await queue.pause()
    await queue.resume()
    await queue.update_job_progress("j1", {"p": 1})
    await queue.remove_deduplication_key("k")
    await queue.remove_debounce_key("k")
    await queue.remove("j2")
    await queue.promote_jobs(count=50)
    await queue.retry_jobs(count=50)
    await queue.rate_limit(10)
    await queue.clean(0, 100, "wait")
    await queue.drain(True)
    await queue.trim_events(10)
    worker = Worker(python_queue, None, redis_url, telemetry=provider, name="w1", group_keeper=False)
    await worker.pause(True)
    worker.resume()
    await worker.rate_limit(10)
    await worker.close()
    await queue.obliterate(force=True)
    await queue.close()
    ours = [{"name": s.name, "kind": s.kind.value, "spanId": format(s.context.span_id, "016x"),
             "parentSpanId": format(s.parent.span_id, "016x") if s.parent else None,
             "attributes": dict(s.attributes or {})} for s in exporter.get_finished_spans()]
    theirs = _spans(from_node["spans"], node_queue, from_node["workerId"])
    assert [s[0] for s in theirs] == sorted(
        ["pause Q", "pause Q", "resume Q", "updateJobProgress Q", "removeDeduplicationKey Q", "removeDebounceKey Q",
         "remove Q", "promoteJobs Q", "retryJobs Q", "rateLimit Q", "clean Q", "drain Q", "trimEvents Q",
         "obliterate Q", "close Q", "pause Q", "resume Q", "rateLimit Q", "close Q"])
    assert _spans(ours, python_queue, worker.id) == theirs
