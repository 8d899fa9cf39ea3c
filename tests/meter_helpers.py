"""The work of interop/otel_meter.js in Python, and the readers' output in one comparable shape."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum

from bullmq_compat import DelayedError, Queue, RateLimitError, WaitingChildrenError, Worker

# the jobs of the work: name → options
WORK_JOBS: list[tuple[str, dict[str, Any]]] = [
    ("ok", {}),
    ("retry", {"attempts": 2}),
    ("backoff", {"attempts": 2, "backoff": {"type": "fixed", "delay": 20}}),
    ("bad", {"attempts": 1}),
    ("limited", {}),
    ("delay", {}),
    ("parent", {}),
]


def meters() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


async def do_work(queue_name: str, redis_url: str, telemetry: Any, timeout: float = 20) -> list[str]:
    """What ``otel_meter.js work`` does, with ``telemetry=`` on the queue and the worker; returns the
    names of the completed jobs."""
    queue = Queue(queue_name, redis_url, telemetry=telemetry)
    seen: set[str] = set()
    worker: Worker

    async def processor(job: Any, token: str) -> Any:
        first = job.id not in seen
        seen.add(job.id)
        if job.name in ("retry", "backoff"):
            if job.attempts_made == 0:
                raise RuntimeError("first attempt fails")
        elif job.name == "bad":
            raise RuntimeError("fails for good")
        elif job.name == "limited" and first:
            await worker.rate_limit(20)
            raise RateLimitError()
        elif job.name == "delay" and first:
            await job.move_to_delayed(int(time.time() * 1000) + 20, token)
            raise DelayedError()
        elif job.name == "parent" and first:
            await queue.add("child", {}, parent={"id": str(job.id), "queue": f"bull:{queue_name}"})
            if await job.move_to_waiting_children(token):
                raise WaitingChildrenError()
        return "ok"

    completed: list[str] = []
    failed: list[str] = []
    done = asyncio.Event()

    def check(*_: Any) -> None:
        if len(completed) == 7 and failed:
            done.set()

    worker = Worker(queue_name, processor, redis_url, telemetry=telemetry, group_keeper=False, drain_delay=0.2)
    worker.on("completed", lambda job, *_: (completed.append(job.name), check()))
    worker.on("failed", lambda job, *_: (failed.append(job.name) if job.name == "bad" else None, check()))
    for name, opts in WORK_JOBS:
        await queue.add(name, {}, **opts)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        await worker.close()
        await task
    await queue.record_job_counts_metric("completed", "failed", "waiting", "delayed")
    await queue.close()
    return completed


def _kind(data: Any) -> tuple[str, str, Any]:
    if isinstance(data, Sum):
        return ("COUNTER" if data.is_monotonic else "UP_DOWN_COUNTER"), "sum", data.is_monotonic
    if isinstance(data, Histogram):
        return "HISTOGRAM", "histogram", None
    if isinstance(data, Gauge):
        return "GAUGE", "gauge", None
    return type(data).__name__, "?", None


def python_metrics(reader: InMemoryMetricReader) -> list[dict[str, Any]]:
    """The reader's metrics as otel_meter.js prints Node's."""
    out: list[dict[str, Any]] = []
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind, point_type, monotonic = _kind(metric.data)
                points = []
                for point in metric.data.data_points:
                    value: Any = ({"count": point.count, "sum": point.sum} if point_type == "histogram"
                                  else point.value)
                    points.append({"attributes": dict(point.attributes or {}), "value": value})
                out.append({"scope": scope.scope.name, "name": metric.name, "description": metric.description,
                            "unit": metric.unit, "type": kind, "dataPointType": point_type,
                            "isMonotonic": monotonic, "points": points})
    return out


def comparable(metrics: list[dict[str, Any]], queue_name: str) -> dict[str, Any]:
    """Metrics keyed by name: their kind, unit, description, scope and each point's attributes (the
    queue's name as ``Q``) with its value — a histogram's count only (durations differ)."""
    out: dict[str, Any] = {}
    for metric in metrics:
        points = []
        for point in metric["points"]:
            attributes = {key: ("Q" if value == queue_name else value) for key, value in point["attributes"].items()}
            value = point["value"]
            points.append((tuple(sorted(attributes.items())), value["count"] if isinstance(value, dict) else value))
        out[metric["name"]] = {key: metric[key] for key in ("scope", "description", "unit", "type", "dataPointType",
                                                            "isMonotonic")}
        out[metric["name"]]["points"] = sorted(points)
    return out
