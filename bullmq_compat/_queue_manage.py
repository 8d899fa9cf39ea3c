"""Queue management: pause, drain, clean, obliterate, retries, limits, metrics (on the backend).

With tracing on (``telemetry=``), the calls Node traces make Node's spans (`_span`): INTERNAL
``pause``, ``resume``, ``drain``, ``clean``, ``obliterate``, ``remove``, ``promoteJobs``,
``rateLimit`` and ``trimEvents``, PRODUCER ``retryJobs``, each named ``"<operation> <queue>"``."""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Mapping, Optional

from opentelemetry.trace import SpanKind

from bullmq_compat import _telemetry as attrs
from bullmq_compat._errors import InvalidArgument

if TYPE_CHECKING:
    from bullmq_compat._backends.base import QueueBackend

_CLEANABLE = {"completed", "wait", "waiting", "active", "paused", "delayed", "failed", "prioritized",
              "waiting-children"}


def _positive_int(label: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{label}={value!r} must be an int >= {minimum}")
    return value


class QueueManagementMixin:
    """The management methods of `Queue`."""

    name: str
    backend: "QueueBackend"
    telemetry: Optional["attrs.Telemetry"]
    if TYPE_CHECKING:
        async def wait_until_ready(self) -> None: ...  # provided by QueueBase

        def emit(self, event: str, *args: Any) -> bool: ...  # provided by EventEmitter

    def _span(self, operation: str, attributes: Optional[Mapping[str, Any]] = None,
              kind: SpanKind = SpanKind.INTERNAL) -> ContextManager[Any]:
        """Node's ``this.trace(kind, operation, this.name, ...)`` around a management call."""
        return attrs.operation_span(self.telemetry, self.name, operation, attributes, kind)

    async def pause(self) -> None:
        """Stop workers from taking new jobs of this queue (all languages)."""
        with self._span("pause"):
            await self.wait_until_ready()
            await self.backend.pause(True)
            self.emit("paused")

    async def resume(self) -> None:
        """Let workers (all languages) take jobs of this queue again after `pause`."""
        with self._span("resume"):
            await self.wait_until_ready()
            await self.backend.pause(False)
            self.emit("resumed")

    async def is_paused(self) -> bool:
        """Whether the queue is paused (by any client, Python or Node)."""
        await self.wait_until_ready()
        return await self.backend.get_meta_field("paused") is not None

    async def drain(self, delayed: bool = False) -> None:
        """Remove waiting (and, with delayed=True, delayed) jobs; active ones are kept."""
        with self._span("drain", {attrs.QUEUE_DRAIN_DELAY: delayed}):
            await self.wait_until_ready()
            await self.backend.drain(delayed)

    async def clean(self, grace: int, limit: int = 0, type: str = "completed") -> list[str]:
        """Remove jobs of one state older than ``grace`` ms (at most ``limit``, 0 = all); returns their ids.

        As Node, the jobs go in batches of at most 10000, and each batch emits ``'cleaned'`` (ids,
        type; ``'wait'`` for ``'waiting'``)."""
        if type not in _CLEANABLE:
            raise InvalidArgument(f"type={type!r} cannot be cleaned; one of {', '.join(sorted(_CLEANABLE))}")
        if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
            raise InvalidArgument(f"grace={grace!r} must be an int number of ms >= 0")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidArgument(f"limit={limit!r} must be an int >= 0 (0: all)")
        with self._span("clean") as span:
            await self.wait_until_ready()
            max_count = limit or float("inf")
            per_call = int(min(10000, max_count))
            timestamp = int(time.time() * 1000) - grace
            normalized = "wait" if type == "waiting" else type
            deleted: list[str] = []
            while len(deleted) < max_count:
                ids = list(await self.backend.clean(type, timestamp, per_call))
                self.emit("cleaned", ids, normalized)
                deleted.extend(ids)
                if len(ids) < per_call:
                    break
            span.set_attributes({attrs.QUEUE_GRACE: grace, attrs.JOB_TYPE: type,
                                 attrs.QUEUE_CLEAN_LIMIT: max_count, attrs.QUEUE_CLEAN_COUNT: len(deleted)})
            return deleted

    async def obliterate(self, force: bool = False, count: int = 1000) -> None:
        """Delete the whole queue; refuses while jobs are active unless force=True."""
        with self._span("obliterate"):
            await self.pause()  # as Node: paused first (its span and 'paused' event), then deleted
            await self.backend.obliterate(force, count)

    async def remove(self, job_id: str, remove_children: bool = True) -> int:
        """Remove a job; 1 when removed, 0 when it is locked by a worker."""
        with self._span("remove", {attrs.JOB_ID: str(job_id),
                                   attrs.JOB_OPTIONS: json.dumps({"removeChildren": remove_children},
                                                              separators=(",", ":"))}):
            await self.wait_until_ready()
            code = await self.backend.remove(str(job_id), remove_children)
            if code == 1:
                self.emit("removed", str(job_id))
            return code

    async def retry_jobs(self, count: int = 1000, state: str = "failed",
                         timestamp: Optional[int] = None) -> None:
        """Move failed (or completed) jobs finished before ``timestamp`` back to waiting."""
        if state not in ("failed", "completed"):
            raise InvalidArgument(f"state={state!r}: jobs can be retried from 'failed' or 'completed' only")
        # Node's span has the options as given: here those that differ from the defaults
        given = {key: value for key, value, default in (("count", count, 1000), ("state", state, "failed"),
                                                        ("timestamp", timestamp, None)) if value != default}
        with self._span("retryJobs", {attrs.QUEUE_OPTIONS: json.dumps(given, separators=(",", ":"))},
                        SpanKind.PRODUCER):
            await self.wait_until_ready()
            await self.backend.retry_jobs(state, count, timestamp or int(time.time() * 1000))

    async def promote_jobs(self, count: int = 1000) -> None:
        """Move every delayed job to waiting now."""
        given = {"count": count} if count != 1000 else {}
        with self._span("promoteJobs", {attrs.QUEUE_OPTIONS: json.dumps(given, separators=(",", ":"))}):
            await self.wait_until_ready()
            await self.backend.promote_jobs(count)

    async def set_global_concurrency(self, concurrency: int) -> None:
        """At most ``concurrency`` jobs of this queue active at once, across all workers and languages."""
        _positive_int("concurrency", concurrency)
        await self.wait_until_ready()
        await self.backend.set_meta({"concurrency": concurrency})

    async def remove_global_concurrency(self) -> int:
        """Remove the limit set by `set_global_concurrency`; returns the number of fields removed
        (1, or 0 when there was none), as Node."""
        await self.wait_until_ready()
        return int(await self.backend.remove_meta_fields(["concurrency"]))

    async def set_global_rate_limit(self, max: int, duration: int) -> None:
        """At most ``max`` jobs per ``duration`` ms for the whole queue."""
        _positive_int("max", max)
        _positive_int("duration", duration)
        await self.wait_until_ready()
        await self.backend.set_meta({"max": max, "duration": duration})

    async def remove_global_rate_limit(self) -> int:
        """Remove the limit set by `set_global_rate_limit`; returns the number of fields removed
        (2: max and duration, or 0 when there was none), as Node."""
        await self.wait_until_ready()
        return int(await self.backend.remove_meta_fields(["max", "duration"]))

    async def is_maxed(self) -> bool:
        """Whether the global concurrency (`set_global_concurrency`) is reached: as many jobs
        active as it allows."""
        await self.wait_until_ready()
        return bool(await self.backend.is_maxed())

    async def rate_limit(self, expire_ms: int) -> None:
        """Rate-limit the whole queue for ``expire_ms`` ms: no worker (of any language) takes a job
        of it until then (Node's ``queue.rateLimit``)."""
        _positive_int("expire_ms", expire_ms)
        with self._span("rateLimit", {attrs.QUEUE_RATE_LIMIT: expire_ms}):
            await self.wait_until_ready()
            await self.backend.set_rate_limit(expire_ms)

    async def remove_rate_limit_key(self) -> int:
        """End the queue's current rate-limit window now; 1 when there was one, else 0."""
        await self.wait_until_ready()
        return int(await self.backend.remove_rate_limit_key())

    async def remove_orphaned_jobs(self, count: int = 1000, limit: int = 0) -> int:
        """Delete job data no state of the queue lists (left by BullMQ 5.66.6's removal-by-age bug;
        not needed otherwise), scanning about ``count`` keys a round and stopping once ``limit``
        jobs are removed (0: no limit); returns how many were removed."""
        _positive_int("count", count)
        _positive_int("limit", limit, 0)
        await self.wait_until_ready()
        return int(await self.backend.remove_orphaned_jobs(count, limit))

    async def get_global_concurrency(self) -> Optional[int]:
        """The limit set by `set_global_concurrency`, or None."""
        await self.wait_until_ready()
        value = await self.backend.get_meta_field("concurrency")
        return int(value) if value is not None else None

    async def get_rate_limit_ttl(self, max_jobs: Optional[int] = None) -> int:
        """Milliseconds until the queue's rate limit lets jobs through again (0 or less: not limited)."""
        await self.wait_until_ready()
        return await self.backend.get_rate_limit_ttl(max_jobs)

    async def get_metrics(self, type: str, start: int = 0, end: int = -1) -> dict[str, Any]:
        """Jobs finished per minute, newest first, as Node's getMetrics: ``{"meta": {"count",
        "prevTS", "prevCount"}, "data": [...], "count": n}`` (workers need ``metrics=`` to record)."""
        if type not in ("completed", "failed"):
            raise InvalidArgument(f"type={type!r}: metrics are kept for 'completed' and 'failed'")
        await self.wait_until_ready()
        meta, data, count = await self.backend.get_metrics(type, start, end)

        def number(value: Any) -> int:
            try:
                return int(float(value if isinstance(value, (int, float)) else str(value, "utf-8")
                                  if isinstance(value, bytes) else str(value)))
            except (TypeError, ValueError):
                return 0
        meta = list(meta) + [0] * (3 - len(meta))
        return {"meta": {"count": number(meta[0]), "prevTS": number(meta[1]), "prevCount": number(meta[2])},
                "data": [number(point) for point in data or []], "count": int(count)}

    async def get_counts_per_priority(self, priorities: Iterable[int]) -> dict[str, int]:
        """Waiting jobs per priority (0: no priority), keyed as Node keys them: ``{"0": 3, "5": 1}``."""
        unique: list[int] = []
        for priority in priorities:
            if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
                raise InvalidArgument(f"priority {priority!r} must be an int >= 0")
            if priority not in unique:
                unique.append(priority)
        await self.wait_until_ready()
        counts = await self.backend.get_counts_per_priority(unique)
        return {str(priority): int(count or 0) for priority, count in zip(unique, counts)}

    async def trim_events(self, max_length: int) -> int:
        """Trim the events stream to about ``max_length`` entries; returns how many were removed."""
        _positive_int("max_length", max_length, 0)
        with self._span("trimEvents", {attrs.QUEUE_EVENT_MAX_LENGTH: max_length}):
            await self.wait_until_ready()
            return await self.backend.trim_events(max_length)
