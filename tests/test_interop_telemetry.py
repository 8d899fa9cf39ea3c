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

from bullmq_compat import FlowProducer, Queue, Worker

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


# -- flows ----------------------------------------------------------------------------------------

def _traceparent(tm: str) -> tuple[str, str]:
    """(trace id, span id) of a stored opts.tm carrier."""
    _version, trace_id, span_id, _flags = json.loads(tm)["traceparent"].split("-")
    return trace_id, span_id


async def test_python_flow_spans_as_node_makes_them_and_each_job_carries_its_own(redis_url, queue_name, spans):
    """FlowProducer(telemetry=...): "addFlow <queue>" with the flow's name, an "addNode <queue>" per
    job (a child's under its parent's, all one trace), each job's opts.tm holding its own addNode
    span's context; omit_context stores none. add_bulk: "addBulkFlows" above the roots' addNodes."""
    provider, exporter = spans
    parents, children = f"{queue_name}-p", f"{queue_name}-c"
    async with FlowProducer(redis_url, telemetry=provider) as flows:
        tree = await flows.add({"name": "render", "queue_name": parents, "data": {}, "children": [
            {"name": "frame", "queue_name": children, "data": {"n": 0}},
            {"name": "frame", "queue_name": children, "data": {"n": 1}, "opts": {"telemetry": {"omit_context": True}}},
        ]})
        finished = {s.name: s for s in exporter.get_finished_spans() if s.name.startswith("addFlow")}
        flow_span = finished[f"addFlow {parents}"]
        assert flow_span.kind == SpanKind.PRODUCER and flow_span.attributes["bullmq.flow.name"] == "render"
        nodes = [s for s in exporter.get_finished_spans() if s.name.startswith("addNode")]
        by_job = {s.attributes["bullmq.job.id"]: s for s in nodes}
        root, first, second = tree.job, tree.children[0].job, tree.children[1].job
        assert set(by_job) == {root.id, first.id, second.id}
        assert by_job[root.id].name == f"addNode {parents}" and by_job[first.id].name == f"addNode {children}"
        assert by_job[root.id].parent.span_id == flow_span.context.span_id
        assert by_job[first.id].parent.span_id == by_job[root.id].context.span_id
        assert {s.context.trace_id for s in nodes} == {flow_span.context.trace_id}
        for job in (root, first):
            stored = await job.queue.get_job(job.id)
            trace_id, span_id = _traceparent(stored.opts["telemetry"]["metadata"])
            assert (trace_id, span_id) == (_hex(by_job[job.id].context.trace_id, 32),
                                           _hex(by_job[job.id].context.span_id, 16))
        stored = await flows.queue(children).get_job(second.id)
        assert "metadata" not in stored.opts.get("telemetry", {})

        exporter.clear()
        await flows.add_bulk([{"name": f"b{i}", "queue_name": parents, "data": {}} for i in range(2)])
        finished = exporter.get_finished_spans()
        bulk = next(s for s in finished if s.name == "addBulkFlows")
        assert bulk.attributes["bullmq.job.bulk.count"] == 2 and bulk.attributes["bullmq.job.bulk.names"] == "b0,b1"
        assert [s.parent.span_id for s in finished if s.name.startswith("addNode")] == [bulk.context.span_id] * 2


async def test_a_python_flow_child_processed_by_node_continues_its_addnode_span(redis_url, queue_name, spans):
    provider, _exporter = spans
    parents, children = f"{queue_name}-p", f"{queue_name}-c"
    async with FlowProducer(redis_url, telemetry=provider) as flows:
        tree = await flows.add({"name": "p", "queue_name": parents, "data": {},
                                "children": [{"name": "c", "queue_name": children, "data": {}}]})
    child = tree.children[0].job
    stored = await Queue(children, redis_url).get_job(child.id)
    trace_id, span_id = _traceparent(stored.opts["telemetry"]["metadata"])
    result = await otel_js("consume", redis=redis_url, queue=children)
    assert result["id"] == child.id
    process = next(s for s in result["spans"] if s["name"].startswith("process"))
    assert process["traceId"] == trace_id and process["parentSpanId"] == span_id


async def test_a_node_flow_child_processed_by_python_continues_nodes_addnode_span(redis_url, queue_name, spans):
    provider, exporter = spans
    parents, children = f"{queue_name}-p", f"{queue_name}-c"
    # (Node stores a node's context only when the node has opts: {} will do)
    result = await otel_js("produceFlow", redis=redis_url, flow={
        "name": "p", "queueName": parents, "data": {}, "opts": {},
        "children": [{"name": "c", "queueName": children, "data": {}, "opts": {}}]})
    node_spans = {s["attributes"].get("bullmq.job.id"): s for s in result["spans"] if s["name"].startswith("addNode")}
    root_id, child_id = result["ids"]
    # the spans Node makes for this flow are the ones FlowProducer(telemetry=...) makes (above)
    assert sorted(s["name"] for s in result["spans"]) == [f"addFlow {parents}", f"addNode {children}",
                                                          f"addNode {parents}"]
    assert next(s for s in result["spans"] if s["name"].startswith("addFlow"))["attributes"]["bullmq.flow.name"] == "p"
    assert _traceparent(result["tms"][child_id])[1] == node_spans[child_id]["spanId"]
    await _process_one(children, redis_url, provider)
    process = next(s for s in exporter.get_finished_spans() if s.name.startswith("process"))
    assert process.attributes["bullmq.job.id"] == child_id
    assert _hex(process.context.trace_id, 32) == node_spans[child_id]["traceId"]
    assert _hex(process.parent.span_id, 16) == node_spans[child_id]["spanId"]


# -- job schedulers ---------------------------------------------------------------------------------

async def test_scheduler_iterations_carry_the_upserts_trace_in_python_and_node(redis_url, queue_name, spans):
    """upsert_job_scheduler makes Node's producer span "add <queue>.<name>" (with the scheduler id),
    whose context its job carries; the next iteration, made by whichever worker takes a job, keeps
    that context, so every iteration's processing joins the upsert's trace; Node's worker too."""
    provider, exporter = spans
    queue = Queue(queue_name, redis_url, telemetry=provider)
    first = await queue.upsert_job_scheduler("tick", {"every": 200}, {"name": "t", "data": {}})
    assert first is not None
    add = next(s for s in exporter.get_finished_spans() if s.name == f"add {queue_name}.t")
    assert add.kind == SpanKind.PRODUCER and add.attributes["bullmq.job.scheduler.id"] == "tick"
    assert add.attributes["bullmq.job.id"] == first.id
    stored = await queue.get_job(first.id)
    trace_id, span_id = _traceparent(stored.opts["telemetry"]["metadata"])
    assert (trace_id, span_id) == (_hex(add.context.trace_id, 32), _hex(add.context.span_id, 16))

    await _process_one(queue_name, redis_url, provider)  # a Python worker: runs it, makes the next
    process = next(s for s in exporter.get_finished_spans() if s.name.startswith("process"))
    assert process.parent.span_id == add.context.span_id
    upcoming = [j for j in await queue.get_jobs(["delayed", "waiting"]) if j.id != first.id]
    assert len(upcoming) == 1
    assert _traceparent(upcoming[0].opts["telemetry"]["metadata"]) == (trace_id, span_id)

    result = await otel_js("consume", redis=redis_url, queue=queue_name)  # Node runs that one
    assert result["id"] == upcoming[0].id
    node_process = next(s for s in result["spans"] if s["name"].startswith("process"))
    assert (node_process["traceId"], node_process["parentSpanId"]) == (trace_id, span_id)
    await queue.remove_job_scheduler("tick")
    await queue.obliterate(force=True)
    await queue.close()
