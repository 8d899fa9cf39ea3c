"""OpenTelemetry traces across languages, with `opentelemetry-api` only (no SDK at run time).

Spans and the stored context follow Node's BullMQ with `bullmq-otel` 2.0.1: a producer span
``add <queue>.<job name>`` on add and for each job a job scheduler makes (``addFlow <queue>``,
``addBulkFlows`` and one ``addNode <queue>`` per job for flows), a consumer span
``process <queue>`` around processing, and the producer's context stored in the job's
``opts.tm`` as a JSON string of the propagated carrier (W3C ``traceparent``...), so a trace
started in Node continues in Python and back.
``opts.omc`` (omit context) is respected.
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator, Mapping, Optional

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

TRACER_NAME = "bullmq"

# attribute names, as bullmq's TelemetryAttributes
QUEUE_NAME = "bullmq.queue.name"
QUEUE_OPERATION = "bullmq.queue.operation"
JOB_NAME = "bullmq.job.name"
JOB_ID = "bullmq.job.id"
BULK_NAMES = "bullmq.job.bulk.names"
BULK_COUNT = "bullmq.job.bulk.count"
WORKER_ID = "bullmq.worker.id"
WORKER_NAME = "bullmq.worker.name"
JOB_ATTEMPTS_MADE = "bullmq.job.attempts.made"
JOB_RESULT = "bullmq.job.result"
JOB_FAILED_REASON = "bullmq.job.failed.reason"
FLOW_NAME = "bullmq.flow.name"
JOB_SCHEDULER_ID = "bullmq.job.scheduler.id"
# OpenTelemetry messaging semantic conventions, alongside bullmq's own
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION = "messaging.destination.name"
MESSAGING_OPERATION = "messaging.operation.type"
MESSAGING_MESSAGE_ID = "messaging.message.id"


class Telemetry:
    """Where spans go: ``Queue(..., telemetry=True)`` uses the global tracer provider;
    ``telemetry=provider`` a given one."""

    def __init__(self, tracer_provider: Any = None, tracer_name: str = TRACER_NAME) -> None:
        from bullmq_compat import __version__

        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer(tracer_name, __version__)

    @staticmethod
    def metadata(ctx: Any) -> str:
        """The propagated carrier of ``ctx`` as bullmq-otel stores it (a JSON string)."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=ctx)
        return json.dumps(carrier, separators=(",", ":"))

    @staticmethod
    def context_from(metadata: Optional[str]) -> Any:
        if not metadata:
            return None
        try:
            carrier = json.loads(metadata)
        except ValueError:
            return None
        return propagate.extract(carrier) if isinstance(carrier, dict) else None

    def start(self, kind: SpanKind, queue_name: str, operation: str, destination: Optional[str] = None,
              parent: Any = None, attributes: Optional[Mapping[str, Any]] = None) -> tuple[Any, Any]:
        """Start a span named and described as `span` does, under the context ``parent`` (else the
        current one), without making it current; returns (span, its context). End it yourself."""
        name = f"{operation} {destination}" if destination else operation
        span = self.tracer.start_span(name, context=parent, kind=kind)
        span.set_attributes({QUEUE_NAME: queue_name, QUEUE_OPERATION: operation,
                             MESSAGING_SYSTEM: "bullmq", MESSAGING_DESTINATION: queue_name,
                             MESSAGING_OPERATION: {SpanKind.PRODUCER: "send", SpanKind.CONSUMER: "process"}.get(
                                 kind, operation)})
        if attributes:
            span.set_attributes(dict(attributes))
        return span, trace.set_span_in_context(span, parent if parent is not None else otel_context.get_current())

    @contextlib.contextmanager
    def span(self, kind: SpanKind, queue_name: str, operation: str, destination: Optional[str] = None,
             parent_metadata: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None
             ) -> Iterator[tuple[Any, str]]:
        """A span named ``"<operation> <destination>"`` as bullmq names it; yields (span, metadata)
        where metadata is the carrier to store in a job's ``opts.tm``."""
        parent = self.context_from(parent_metadata)
        span, _ = self.start(kind, queue_name, operation, destination, parent, attributes)
        base = parent if (kind == SpanKind.CONSUMER and parent is not None) else otel_context.get_current()
        ctx = trace.set_span_in_context(span, base)
        token = otel_context.attach(ctx)
        try:
            yield span, self.metadata(ctx)
        except BaseException as err:
            span.record_exception(err)
            span.set_status(Status(StatusCode.ERROR, str(err)))
            raise
        finally:
            otel_context.detach(token)
            span.end()


def resolve(telemetry: Any) -> Optional[Telemetry]:
    """``telemetry=`` → a Telemetry or None: True, a TracerProvider, or a Telemetry."""
    if telemetry is None or telemetry is False:
        return None
    if telemetry is True:
        return Telemetry()
    if isinstance(telemetry, Telemetry):
        return telemetry
    if hasattr(telemetry, "get_tracer"):
        return Telemetry(telemetry)
    from bullmq_compat._errors import InvalidArgument

    raise InvalidArgument(f"telemetry={telemetry!r} must be True, an OpenTelemetry TracerProvider, or a Telemetry")
