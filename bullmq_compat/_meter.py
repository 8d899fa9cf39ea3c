"""OpenTelemetry metrics as Node's BullMQ 6 records them (``MetricNames``, through ``bullmq-otel``'s meter).

Node records, on the object that owns the job (the worker for a job it processes, else the queue):

- a counter per state a job is moved to: ``bullmq.jobs.<state>`` (completed, failed, delayed,
  retried, waiting, waiting_children), unit ``1``, description ``Number of jobs <state>``, +1 with
  ``bullmq.queue.name``, ``bullmq.job.name`` and ``bullmq.job.state`` (``waiting-children`` for
  ``bullmq.jobs.waiting_children``);
- with the counter, when the job has a ``processedOn``, the histogram ``bullmq.job.duration``
  (unit ``ms``, ``Job processing duration``): now - processedOn, with the same attributes;
- on ``Queue.recordJobCountsMetric``, the gauge ``bullmq.queue.jobs`` (unit ``{jobs}``,
  ``Number of jobs in the queue by state``): each state's count with ``bullmq.queue.name`` and
  ``bullmq.queue.jobs.state``.

Instruments are made on first use and kept (as ``BullMQOTelMeter`` caches them).
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Optional

METER_NAME = "bullmq"

# MetricNames
QUEUE_JOBS_COUNT = "bullmq.queue.jobs"
JOBS_COMPLETED = "bullmq.jobs.completed"
JOBS_FAILED = "bullmq.jobs.failed"
JOBS_DELAYED = "bullmq.jobs.delayed"
JOBS_RETRIED = "bullmq.jobs.retried"
JOBS_WAITING = "bullmq.jobs.waiting"
JOBS_WAITING_CHILDREN = "bullmq.jobs.waiting_children"
JOB_DURATION = "bullmq.job.duration"

# the states recordJobMetrics takes, and their counters
STATE_COUNTERS = {
    "completed": JOBS_COMPLETED,
    "failed": JOBS_FAILED,
    "delayed": JOBS_DELAYED,
    "retried": JOBS_RETRIED,
    "waiting": JOBS_WAITING,
    "waiting-children": JOBS_WAITING_CHILDREN,
}

# TelemetryAttributes used on measurements
QUEUE_NAME = "bullmq.queue.name"
JOB_NAME = "bullmq.job.name"
JOB_STATE = "bullmq.job.state"
QUEUE_JOBS_STATE = "bullmq.queue.jobs.state"


class JobMetrics:
    """Node's ``recordJobMetrics`` and ``recordJobCountsMetric`` over an OpenTelemetry ``Meter``."""

    __slots__ = ("meter", "_counters", "_histogram", "_gauge")

    def __init__(self, meter: Any) -> None:
        self.meter = meter
        self._counters: dict[str, Any] = {}
        self._histogram: Any = None
        self._gauge: Any = None

    def _counter(self, state: str) -> Any:
        counter = self._counters.get(state)
        if counter is None:
            counter = self.meter.create_counter(STATE_COUNTERS[state], unit="1",
                                                description=f"Number of jobs {state}")
            self._counters[state] = counter
        return counter

    def job(self, queue_name: str, job_name: str, state: str, processed_on: Optional[int]) -> None:
        """A job moved to ``state``: +1 on its counter; its duration when it was processed."""
        attributes = {QUEUE_NAME: queue_name, JOB_NAME: job_name, JOB_STATE: state}
        self._counter(state).add(1, attributes)
        if processed_on:
            if self._histogram is None:
                self._histogram = self.meter.create_histogram(JOB_DURATION, unit="ms",
                                                              description="Job processing duration")
            self._histogram.record(int(time.time() * 1000) - processed_on, attributes)

    def counts(self, queue_name: str, counts: Mapping[str, int]) -> None:
        """Each state's count on the gauge ``bullmq.queue.jobs``."""
        if self._gauge is None:
            self._gauge = self.meter.create_gauge(QUEUE_JOBS_COUNT, unit="{jobs}",
                                                  description="Number of jobs in the queue by state")
        for state, count in counts.items():
            self._gauge.set(count, {QUEUE_NAME: queue_name, QUEUE_JOBS_STATE: state})


def record_job(job: Any, state: str) -> None:
    """``job.recordJobMetrics(state)``: on the meter of the job's queue (or worker), if it has one."""
    metrics: Optional[JobMetrics] = getattr(job.queue, "meter", None)
    if metrics is not None:
        metrics.job(job.queue.name, job.name, state, job.processed_on)
