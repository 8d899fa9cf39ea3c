"""The meter (Node 6's MetricNames) and management spans, in Python alone: how telemetry= turns
them on, what is recorded where, and that nothing is recorded with telemetry off."""
from __future__ import annotations

import json
import types

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from bullmq_compat import InvalidArgument, Queue, Telemetry, Worker, _meter, _telemetry
from tests.meter_helpers import comparable, do_work, meters, python_metrics


def _tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


# -- telemetry= --------------------------------------------------------------------------------

def test_telemetry_forms_give_spans_and_or_metrics():
    tracer_provider, _ = _tracing()
    meter_provider, _ = meters()
    assert _telemetry.resolve_both(None) == (None, None) and _telemetry.resolve_both(False) == (None, None)
    spans, metrics = _telemetry.resolve_both(tracer_provider)  # today's form: spans only
    assert spans is not None and metrics is None
    spans, metrics = _telemetry.resolve_both(meter_provider)  # metrics only
    assert spans is None and isinstance(metrics, _meter.JobMetrics)
    for both in ({"tracer_provider": tracer_provider, "meter_provider": meter_provider},
                 types.SimpleNamespace(tracer_provider=tracer_provider, meter_provider=meter_provider),
                 Telemetry(tracer_provider, meter_provider=meter_provider)):
        spans, metrics = _telemetry.resolve_both(both)
        assert spans is not None and metrics is not None, both
    assert Telemetry().meter is None  # as new BullMQOtel(): no metrics unless asked
    for bad in ("yes", 3, {"tracer": tracer_provider}, {}):
        with pytest.raises(InvalidArgument):
            _telemetry.resolve_both(bad)


def test_telemetry_true_uses_the_global_tracer_and_meter_providers(monkeypatch):
    meter_provider, reader = meters()
    tracer_provider, exporter = _tracing()
    from opentelemetry import metrics, trace

    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meter_provider)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tracer_provider)
    spans, recorder = _telemetry.resolve_both(True)
    assert spans is not None and recorder is not None
    recorder.job("q", "n", "completed", None)
    with spans.operation("q", "pause"):
        pass
    assert [m["name"] for m in python_metrics(reader)] == ["bullmq.jobs.completed"]
    assert [s.name for s in exporter.get_finished_spans()] == ["pause q"]


def test_objects_take_the_meter(redis_url, queue_name):
    meter_provider, _ = meters()
    queue = Queue(queue_name, redis_url, telemetry=meter_provider)
    worker = Worker(queue_name, lambda job: None, redis_url, telemetry=meter_provider, group_keeper=False)
    assert queue.meter is not None and worker.meter is not None
    assert queue.telemetry is None and worker.telemetry is None  # a MeterProvider alone: no spans
    plain = Worker(queue_name, lambda job: None, redis_url, group_keeper=False)
    assert plain.meter is None and plain.telemetry is None


# -- what is recorded ----------------------------------------------------------------------------

async def test_the_work_records_node_s_instruments_and_attributes(redis_url, queue_name):
    provider, reader = meters()
    await do_work(queue_name, redis_url, provider)
    got = comparable(python_metrics(reader), queue_name)

    def per_job(metric: str) -> dict[str, int]:
        return {dict(k)["bullmq.job.name"]: v for k, v in got[metric]["points"]}

    assert per_job("bullmq.jobs.completed") == dict.fromkeys(
        ["ok", "retry", "backoff", "limited", "delay", "parent", "child"], 1)
    assert per_job("bullmq.jobs.retried") == {"retry": 1}
    assert per_job("bullmq.jobs.delayed") == {"backoff": 1, "delay": 1}
    assert per_job("bullmq.jobs.failed") == {"bad": 1}
    assert per_job("bullmq.jobs.waiting") == {"limited": 1}
    assert per_job("bullmq.jobs.waiting_children") == {"parent": 1}
    for name, state in (("bullmq.jobs.waiting_children", "waiting-children"), ("bullmq.jobs.retried", "retried")):
        [(attributes, _)] = got[name]["points"]
        assert dict(attributes) == {"bullmq.queue.name": "Q", "bullmq.job.name": dict(attributes)["bullmq.job.name"],
                                    "bullmq.job.state": state}
        assert got[name]["unit"] == "1" and got[name]["description"] == f"Number of jobs {state}"
        assert got[name]["type"] == "COUNTER"
    duration = got["bullmq.job.duration"]
    assert (duration["type"], duration["unit"], duration["description"]) == (
        "HISTOGRAM", "ms", "Job processing duration")
    assert sum(count for _, count in duration["points"]) == 13  # every move above, each with processedOn
    gauge = got["bullmq.queue.jobs"]
    assert (gauge["type"], gauge["unit"], gauge["description"]) == (
        "GAUGE", "{jobs}", "Number of jobs in the queue by state")
    assert {dict(k)["bullmq.queue.jobs.state"]: v for k, v in gauge["points"]} == {
        "completed": 7, "failed": 1, "waiting": 0, "delayed": 0}
    assert {m["scope"] for m in python_metrics(reader)} == {"bullmq"}


async def test_record_job_counts_metric_without_a_meter_only_counts(redis_url, queue_name):
    async with Queue(queue_name, redis_url) as queue:
        await queue.add("a", {})
        assert await queue.record_job_counts_metric("waiting") == {"waiting": 1}


async def test_with_telemetry_off_nothing_touches_a_meter(redis_url, queue_name, monkeypatch):
    def boom(*_args):
        raise AssertionError("recorded with telemetry off")

    monkeypatch.setattr("bullmq_compat._job.record_job", boom)
    completed = await do_work(queue_name, redis_url, None)
    assert len(completed) == 7


async def test_spans_and_metrics_together(redis_url, queue_name):
    tracer_provider, exporter = _tracing()
    meter_provider, reader = meters()
    telemetry = Telemetry(tracer_provider, meter_provider=meter_provider)
    await do_work(queue_name, redis_url, telemetry)
    names = {s.name for s in exporter.get_finished_spans()}
    assert f"process {queue_name}" in names and f"add {queue_name}.ok" in names
    assert "bullmq.jobs.completed" in {m["name"] for m in python_metrics(reader)}


# -- management spans ----------------------------------------------------------------------------

async def test_management_spans_carry_node_s_attributes(redis_url, queue_name):
    provider, exporter = _tracing()
    queue = Queue(queue_name, redis_url, telemetry=provider)
    await queue.add("a", {}, job_id="j1")
    exporter.clear()
    await queue.update_job_progress("j1", 40)
    await queue.clean(0, 0, "waiting")
    await queue.retry_jobs(state="completed")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    clean = spans[f"clean {queue_name}"]
    assert clean.kind == SpanKind.INTERNAL
    assert dict(clean.attributes) == {
        "bullmq.queue.name": queue_name, "bullmq.queue.operation": "clean", "bullmq.queue.grace": 0,
        "bullmq.job.type": "waiting", "bullmq.queue.clean.limit": float("inf"), "bullmq.queue.clean.count": 1}
    assert spans[f"updateJobProgress {queue_name}"].attributes["bullmq.job.progress"] == "40"
    retry = spans[f"retryJobs {queue_name}"]
    assert retry.kind == SpanKind.PRODUCER
    assert json.loads(retry.attributes["bullmq.queue.options"]) == {"state": "completed"}
    await queue.close()
    assert exporter.get_finished_spans()[-1].name == f"close {queue_name}"


async def test_a_failing_management_call_records_its_error_on_the_span(redis_url, queue_name):
    provider, exporter = _tracing()
    async with Queue(queue_name, redis_url, telemetry=provider) as queue:
        await queue.add("a", {})
        worker = Worker(queue_name, None, redis_url, group_keeper=False)
        job = await worker.get_next_job("tok", block=False)
        assert job is not None
        with pytest.raises(InvalidArgument):
            await queue.obliterate()  # an active job and no force
        await worker.close()
    obliterate = next(s for s in exporter.get_finished_spans() if s.name == f"obliterate {queue_name}")
    assert [e.name for e in obliterate.events] == ["exception"]
    pause = next(s for s in exporter.get_finished_spans() if s.name == f"pause {queue_name}")
    assert pause.parent.span_id == obliterate.context.span_id  # obliterate pauses first, as Node's
