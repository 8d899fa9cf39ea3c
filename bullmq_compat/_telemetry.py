"""OpenTelemetry traces across languages, with `opentelemetry-api` only (no SDK at run time).

Spans and the stored context follow Node's BullMQ with `bullmq-otel` 2.0.1: a producer span
``add <queue>.<job name>`` on add and for each job a job scheduler makes (``addFlow <queue>``,
``addBulkFlows`` and one ``addNode <queue>`` per job for flows), a consumer span
``process <queue>`` around processing, and the producer's context stored in the job's
``opts.tm`` as a JSON string of the propagated carrier (W3C ``traceparent``...), so a trace
started in Node continues in Python and back.
``opts.omc`` (omit context) is respected.

Management calls make Node's INTERNAL spans (``pause <queue>``, ``clean <queue>``...: see
`operation`), and a meter (``Telemetry(meter_provider=...)``, ``telemetry=True`` or a
``MeterProvider``) records Node 6's ``MetricNames`` (see `_meter`).
"""
from __future__ import annotations

import contextlib
import json
from typing import Any, ContextManager, Iterator, Mapping, Optional

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from bullmq_compat._meter import METER_NAME, JobMetrics

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
WORKER_RATE_LIMIT = "bullmq.worker.rate.limit"
WORKER_DO_NOT_WAIT_ACTIVE = "bullmq.worker.do.not.wait.active"
WORKER_FORCE_CLOSE = "bullmq.worker.force.close"
JOB_ATTEMPTS_MADE = "bullmq.job.attempts.made"
JOB_RESULT = "bullmq.job.result"
JOB_FAILED_REASON = "bullmq.job.failed.reason"
FLOW_NAME = "bullmq.flow.name"
JOB_SCHEDULER_ID = "bullmq.job.scheduler.id"
JOB_KEY = "bullmq.job.key"
JOB_OPTIONS = "bullmq.job.options"
JOB_PROGRESS = "bullmq.job.progress"
JOB_TYPE = "bullmq.job.type"
DEDUPLICATION_KEY = "bullmq.job.deduplication.key"
QUEUE_DRAIN_DELAY = "bullmq.queue.drain.delay"
QUEUE_GRACE = "bullmq.queue.grace"
QUEUE_CLEAN_LIMIT = "bullmq.queue.clean.limit"
QUEUE_CLEAN_COUNT = "bullmq.queue.clean.count"
QUEUE_RATE_LIMIT = "bullmq.queue.rate.limit"
QUEUE_OPTIONS = "bullmq.queue.options"
QUEUE_EVENT_MAX_LENGTH = "bullmq.queue.event.max.length"
# OpenTelemetry messaging semantic conventions, alongside bullmq's own
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION = "messaging.destination.name"
MESSAGING_OPERATION = "messaging.operation.type"
MESSAGING_MESSAGE_ID = "messaging.message.id"


class Telemetry:
    """Where spans and metrics go.

    ``Telemetry()`` traces to the global tracer provider (no metrics, as ``new BullMQOtel()``);
    ``Telemetry(tracer_provider=tp, meter_provider=mp)`` uses the given ones;
    ``Telemetry(enable_metrics=True)`` also records metrics on the global meter provider (as
    ``new BullMQOtel({enableMetrics: true})``); ``enable_tracing=False`` makes metrics only.
    The tracer and the meter are named ``bullmq`` (``tracer_name``/``meter_name`` change that)."""

    def __init__(self, tracer_provider: Any = None, tracer_name: str = TRACER_NAME, *,
                 meter_provider: Any = None, meter_name: Optional[str] = None,
                 enable_metrics: Optional[bool] = None, enable_tracing: bool = True) -> None:
        """Spans go to ``tracer_provider`` (the global one when None) unless
        ``enable_tracing=False``; metrics to ``meter_provider`` when given or
        ``enable_metrics=True``."""
        from opentelemetry import metrics

        from bullmq_compat import __version__

        self.tracer: Any = None
        if enable_tracing:
            provider = tracer_provider or trace.get_tracer_provider()
            self.tracer = provider.get_tracer(tracer_name, __version__)
        self.meter: Optional[JobMetrics] = None
        if enable_metrics or (enable_metrics is None and meter_provider is not None):
            meters = meter_provider or metrics.get_meter_provider()
            self.meter = JobMetrics(meters.get_meter(meter_name or METER_NAME, __version__))

    @staticmethod
    def metadata(ctx: Any) -> str:
        """The propagated carrier of ``ctx`` as bullmq-otel stores it (a JSON string)."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=ctx)
        return json.dumps(carrier, separators=(",", ":"))

    @staticmethod
    def context_from(metadata: Optional[str]) -> Any:
        """The OpenTelemetry context stored in a job's ``opts.tm`` (a JSON carrier, as
        ``bullmq-otel`` writes it), or None when there is none or it is unreadable."""
        if not metadata:
            return None
        try:
            carrier = json.loads(metadata)
        except ValueError:
            return None
        return propagate.extract(carrier) if isinstance(carrier, dict) else None

    def start(self, kind: SpanKind, queue_name: str, operation: str, destination: Optional[str] = None,
              parent: Any = None, attributes: Optional[Mapping[str, Any]] = None,
              messaging: bool = True) -> tuple[Any, Any]:
        """Start a span named and described as `span` does, under the context ``parent`` (else the
        current one), without making it current; returns (span, its context). End it yourself."""
        name = f"{operation} {destination}" if destination else operation
        span = self.tracer.start_span(name, context=parent, kind=kind)
        if not messaging:  # as Node's trace(): the queue and the operation only
            span.set_attributes({QUEUE_NAME: queue_name, QUEUE_OPERATION: operation})
        else:
            span.set_attributes({QUEUE_NAME: queue_name, QUEUE_OPERATION: operation,
                                 MESSAGING_SYSTEM: "bullmq", MESSAGING_DESTINATION: queue_name,
                                 MESSAGING_OPERATION: {SpanKind.PRODUCER: "send",
                                                       SpanKind.CONSUMER: "process"}.get(kind, operation)})
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


    @contextlib.contextmanager
    def operation(self, queue_name: str, operation: str, attributes: Optional[Mapping[str, Any]] = None,
                  kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Any]:
        """A management call's span as Node's ``trace(SpanKind.INTERNAL, op, queue.name, ...)``
        makes it: ``"<operation> <queue>"``, current while the call runs, with ``bullmq.queue.name``,
        ``bullmq.queue.operation`` and the call's own attributes; an error is recorded on it."""
        span, ctx = self.start(kind, queue_name, operation, queue_name, None, attributes, messaging=False)
        token = otel_context.attach(ctx)
        try:
            yield span
        except BaseException as err:
            span.record_exception(err)
            raise
        finally:
            otel_context.detach(token)
            span.end()


class _NoSpan:
    """What `operation_span` yields without telemetry: attributes go nowhere."""

    __slots__ = ()

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = _NoSpan()


def operation_span(telemetry: Optional[Telemetry], queue_name: str, operation: str,
                   attributes: Optional[Mapping[str, Any]] = None,
                   kind: SpanKind = SpanKind.INTERNAL) -> ContextManager[Any]:
    """`Telemetry.operation`, or a do-nothing context (yielding a span that takes attributes) when
    tracing is off."""
    if telemetry is None:
        return contextlib.nullcontext(_NO_SPAN)
    return telemetry.operation(queue_name, operation, attributes, kind)


def _parts(telemetry: Any) -> Optional[Telemetry]:
    """``telemetry=`` → a Telemetry (tracing and/or metrics) or None."""
    if telemetry is None or telemetry is False:
        return None
    if telemetry is True:
        return Telemetry(enable_metrics=True)
    if isinstance(telemetry, Telemetry):
        return telemetry
    if isinstance(telemetry, Mapping):
        given = telemetry
    elif hasattr(telemetry, "tracer_provider") or hasattr(telemetry, "meter_provider"):
        given = {"tracer_provider": getattr(telemetry, "tracer_provider", None),
                 "meter_provider": getattr(telemetry, "meter_provider", None)}
    elif hasattr(telemetry, "get_tracer"):
        return Telemetry(telemetry)
    elif hasattr(telemetry, "get_meter"):
        return Telemetry(meter_provider=telemetry, enable_tracing=False)
    else:
        given = None
    if given is not None and set(given) <= {"tracer_provider", "meter_provider"}:
        tracer_provider, meter_provider = given.get("tracer_provider"), given.get("meter_provider")
        if tracer_provider is not None or meter_provider is not None:
            return Telemetry(tracer_provider, meter_provider=meter_provider,
                             enable_tracing=tracer_provider is not None)
    from bullmq_compat._errors import InvalidArgument

    raise InvalidArgument(f"telemetry={telemetry!r} must be True, an OpenTelemetry TracerProvider or "
                          "MeterProvider, both ({'tracer_provider': ..., 'meter_provider': ...}), or a Telemetry")


def resolve(telemetry: Any) -> Optional[Telemetry]:
    """``telemetry=`` → the Telemetry spans go to, or None (no tracing): True, a TracerProvider,
    a Telemetry, or both providers; a MeterProvider alone traces nothing."""
    parts = _parts(telemetry)
    return parts if parts is not None and parts.tracer is not None else None


def resolve_both(telemetry: Any) -> tuple[Optional[Telemetry], Optional[JobMetrics]]:
    """``telemetry=`` → (the Telemetry for spans or None, the metrics recorder or None)."""
    parts = _parts(telemetry)
    if parts is None:
        return None, None
    return (parts if parts.tracer is not None else None), parts.meter
