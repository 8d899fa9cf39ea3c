"""Queue: the producer side of a BullMQ queue, on the backend contract (Redis or PostgreSQL)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence

from opentelemetry.trace import SpanKind

from bullmq_compat import _telemetry as telemetry_attrs
from bullmq_compat._backends import open_backend
from bullmq_compat._backends.base import NewJob, QueueBackend, WorkerChannel, WorkerSettings
from bullmq_compat._errors import InvalidArgument, InvalidQueueName, script_error
from bullmq_compat._events import EventEmitter
from bullmq_compat._groups import (
    FLOW_PARENT_REFUSED, GROUP_OPTIONS, GroupJobRefused, GroupsMixin, check_group_combination,
)
from bullmq_compat._job import Job
from bullmq_compat._queue_manage import QueueManagementMixin
from bullmq_compat._scheduler import JobSchedulerMixin
from bullmq_compat._telemetry import resolve as resolve_telemetry
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import from_wire, merge_defaults, normalize_job_options, to_wire

LIBRARY_VERSION = "bullmq-compat:0.1.0"

ALL_STATES = ("active", "completed", "delayed", "failed", "prioritized", "waiting", "waiting-children")
_KNOWN_STATES = set(ALL_STATES) | {"paused", "wait"}

Connection = Any


def check_queue_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidQueueName(f"queue name {name!r} must be a non-empty str")
    if ":" in name:
        raise InvalidQueueName(f"queue name {name!r} cannot contain ':' (it separates key parts in Redis)")
    if not codec.is_utf8(name):
        raise InvalidQueueName(f"queue name {name!r} is not valid UTF-8 text (a lone surrogate)")
    return name


def check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not prefix or not codec.is_utf8(prefix):
        raise InvalidArgument(f"prefix {prefix!r} must be a non-empty str such as 'bull' or '{{bull}}'")
    return prefix


def check_states(types: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for state in types:
        if state not in _KNOWN_STATES:
            raise InvalidArgument(f"job state {state!r} is not one of {', '.join(sorted(_KNOWN_STATES))}")
        if state not in seen:
            seen.append(state)
    return seen or list(ALL_STATES)


class QueueBase(EventEmitter):
    """What every queue-bound class shares: name, prefix and the backend that holds the queue."""

    def __init__(self, name: str, connection: Connection = None, *, prefix: str = "bull",
                 schema: Optional[str] = None, migrate: bool = False,
                 backend: Optional[QueueBackend] = None) -> None:
        super().__init__()
        self.name = check_queue_name(name)
        self.prefix = check_prefix(prefix)
        self.backend: QueueBackend = backend or open_backend(
            self.name, connection, prefix=self.prefix, schema=schema, migrate=migrate)
        self._owns_backend = backend is None
        self._plain_channel: Optional[WorkerChannel] = None
        self._ready: Optional[asyncio.Future[None]] = None
        self.closing = False

    # Redis-only views, for code and tests that look at the keys (AttributeError on PostgreSQL)
    @property
    def keys(self) -> Any:
        return getattr(self.backend, "keys")

    @property
    def client(self) -> Any:
        return getattr(self.backend, "client")

    @property
    def qualified_name(self) -> str:
        """``"<prefix>:<queue>"`` on Redis, as Node's qualifiedName (the ``queue`` of ``parent=``)."""
        return self.backend.qualified_name

    def client_name(self, suffix: str = "") -> str:
        """The name of this client's connection, as Node names it (CLIENT LIST / application_name)."""
        return str(getattr(self.backend, "client_name")(suffix))

    # a Worker overrides these: its retry settings
    backoff_strategy: Any = None
    max_started_attempts: Optional[int] = None

    async def finishing(self, send: Callable[[], Awaitable[Any]]) -> Any:
        """Send one finishing call (a Worker sends it again through connection trouble)."""
        return await send()

    async def worker_channel(self) -> WorkerChannel:
        """The channel finishing calls go through; a Queue opens a plain one on first use."""
        await self.wait_until_ready()
        channel = self._plain_channel
        if channel is None:
            channel = await self.backend.open_worker_channel(WorkerSettings(), self.client_name(), fast=False)
            self._plain_channel = channel
        return channel

    async def wait_until_ready(self) -> None:
        """Check once that the datastore answers (naming where, without secrets) and run first-use set-up."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._first_use())
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            self._ready = None
            raise

    async def _first_use(self) -> None:
        await self.backend.connect()

    async def close(self) -> None:
        """Close the connections this object opened (a client passed as ``connection=`` stays open)."""
        self.closing = True
        channel = self._plain_channel
        if channel is not None:
            self._plain_channel = None
            await channel.close()
        if self._owns_backend:
            await self.backend.close()

    def __repr__(self) -> str:  # the connection as errors name it: never its password
        return f"<{type(self).__name__} {self.qualified_name} {self.backend.description}>"

    async def __aenter__(self) -> "QueueBase":
        await self.wait_until_ready()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- reads shared by Queue, Worker and Job -------------------------------------------------
    async def get_job(self, job_id: str) -> Optional[Job]:
        """The job with this id, or None."""
        await self.wait_until_ready()
        raw = await self.backend.get_job(str(job_id))
        if not raw:
            return None
        return Job.from_raw(self, str(job_id), raw)

    async def get_workers(self) -> list[dict[str, str]]:
        """The workers (of any language) connected to this queue, as Node's getWorkers lists them."""
        await self.wait_until_ready()
        workers = []
        for fields in await self.backend.get_client_list():
            fields = dict(fields)
            fields["rawname"] = fields.get("name", "")
            fields["name"] = self.name  # as Node's getWorkers: the queue name; rawname has the rest
            workers.append(fields)
        return workers

    async def get_job_state(self, job_id: str) -> str:
        """The state of job ``job_id``, as `Job.get_state` gives it ('unknown' when it does not exist)."""
        await self.wait_until_ready()
        return await self.backend.get_state(str(job_id))


class Queue(GroupsMixin, JobSchedulerMixin, QueueManagementMixin, QueueBase):
    """The producer side of a queue, compatible with Node BullMQ's Queue.

    >>> queue = Queue("emails", connection="redis://127.0.0.1:6379/0")
    >>> job = await queue.add("send", {"to": "a@b"}, attempts=3, delay=500)
    >>> await queue.get_job_counts("waiting", "delayed")
    {'waiting': 0, 'delayed': 1}

    A ``postgresql://`` connection (with ``schema=``, default ``"bullmq"``) puts the queue on
    Node BullMQ's PostgreSQL backend instead.
    """

    def __init__(self, name: str, connection: Connection = None, *, prefix: str = "bull",
                 default_job_options: Optional[Mapping[str, Any]] = None,
                 max_len_events: int = 10000, skip_meta_update: bool = False, telemetry: Any = None,
                 schema: Optional[str] = None, migrate: bool = False,
                 backend: Optional[QueueBackend] = None) -> None:
        super().__init__(name, connection, prefix=prefix, schema=schema, migrate=migrate, backend=backend)
        self.default_job_options = normalize_job_options(default_job_options or {}, extra=GROUP_OPTIONS)
        if isinstance(max_len_events, bool) or not isinstance(max_len_events, int) or max_len_events < 0:
            raise InvalidArgument(f"max_len_events={max_len_events!r} must be an int >= 0")
        self.max_len_events = max_len_events
        self.skip_meta_update = skip_meta_update
        self.telemetry = resolve_telemetry(telemetry)

    async def _first_use(self) -> None:
        await super()._first_use()
        if not self.skip_meta_update:
            await self.backend.set_meta({"opts.maxLenEvents": self.max_len_events, "version": LIBRARY_VERSION})

    # -- adding ---------------------------------------------------------------------------------
    def _new_job(self, name: str, data: Any, opts: Mapping[str, Any]) -> NewJob:
        merged = merge_defaults(self.default_job_options, normalize_job_options(opts, extra=GROUP_OPTIONS))
        check_group_combination(merged)
        if merged.get("group") is not None:
            from bullmq_compat._groups import group_support

            group_support(self.backend)  # refused where the backend has no group gate
        return NewJob(name=name, data=data, opts=merged,
                      timestamp=int(merged.get("timestamp") or time.time() * 1000))

    def _prepare(self, name: str, data: Any, opts: Mapping[str, Any]) -> Any:
        """Validate and encode one add for the backend (nothing is sent)."""
        job = self._new_job(name, data, opts)
        prepare = getattr(self.backend, "prepare", None)
        return prepare(job) if prepare is not None else job

    def _job_from(self, prepared: Any, job_id: Any) -> Job:
        opts = prepared.opts
        wire = getattr(prepared, "wire_opts", None)
        job = Job(self, prepared.name, prepared.data if prepared.data is not None else {},
                  from_wire(wire if wire is not None else to_wire(opts)), codec.to_str(job_id))
        job.timestamp = prepared.timestamp
        if opts.get("repeatJobKey"):
            job.repeat_job_key = opts["repeatJobKey"]
        dedup = opts.get("deduplication")
        if dedup:
            job.deduplication_id = dedup["id"]
        parent = opts.get("parent")
        if parent:
            job.parent_key = f"{parent['queue']}:{parent['id']}"
        return job

    def _check_result(self, prepared: Any, result: Any) -> Any:
        if isinstance(result, BaseException):
            raise result
        if result == FLOW_PARENT_REFUSED and prepared.opts.get("group"):
            raise GroupJobRefused(f"group {prepared.opts['group']['id']!r}: a group job cannot be a flow child")
        if isinstance(result, int) and result < 0:
            parent = prepared.opts.get("parent")
            parent_key = f"{parent['queue']}:{parent['id']}" if parent else None
            raise script_error(result, job_id=getattr(prepared, "job_id", None) or prepared.opts.get("jobId"),
                               command="addJob", parent_key=parent_key)
        return result

    async def _send(self, prepared: Sequence[Any]) -> list[Any]:
        add_prepared = getattr(self.backend, "add_prepared", None)
        if add_prepared is not None:
            return list(await add_prepared(prepared))
        return list(await self.backend.add_jobs(prepared))

    async def _add_one(self, name: str, data: Any, opts: Mapping[str, Any]) -> Job:
        prepared = self._prepare(name, data, opts)
        await self.wait_until_ready()
        result = (await self._send([prepared]))[0]
        return self._job_from(prepared, self._check_result(prepared, result))

    async def add(self, name: str, data: Any = None, **opts: Any) -> Job:
        """Add one job. Options by Python or Node name: delay, priority, lifo, attempts, backoff,
        job_id, remove_on_complete, remove_on_fail, deduplication, keep_logs, size_limit, ...

        Bad input raises an `InvalidArgument` subclass before anything is written.
        """
        if self.telemetry is not None:
            return await self._add_traced(name, data, opts)
        return await self._add_one(name, data, opts)

    @staticmethod
    def _with_trace_context(opts: Mapping[str, Any], metadata: str) -> dict[str, Any]:
        """Store the producer span's context in opts.tm unless the job omits it (omc), as Node does."""
        given = dict(opts.get("telemetry") or {})
        if given.get("omit_context") or given.get("omitContext"):
            return dict(opts)
        return {**opts, "telemetry": {"metadata": metadata}}

    async def _add_traced(self, name: str, data: Any, opts: Mapping[str, Any]) -> Job:
        assert self.telemetry is not None
        with self.telemetry.span(SpanKind.PRODUCER, self.name, "add", f"{self.name}.{name}") as (span, metadata):
            job = await self._add_one(name, data, self._with_trace_context(opts, metadata))
            span.set_attributes({telemetry_attrs.JOB_NAME: name, telemetry_attrs.JOB_ID: str(job.id),
                                 telemetry_attrs.MESSAGING_MESSAGE_ID: str(job.id)})
            return job

    async def add_bulk(self, jobs: Sequence[Mapping[str, Any]]) -> list[Job]:
        """Add many jobs in one round trip: ``[{"name": ..., "data": ..., "opts": {...}}, ...]``.

        Every item is validated before anything is sent, so bad input writes nothing.
        """
        if self.telemetry is not None:
            names = [item.get("name") for item in jobs if isinstance(item, Mapping)]
            with self.telemetry.span(SpanKind.PRODUCER, self.name, "addBulk", self.name, attributes={
                    telemetry_attrs.BULK_NAMES: [str(n) for n in names],
                    telemetry_attrs.BULK_COUNT: len(jobs)}) as (_span, metadata):
                return await self._add_bulk([
                    {**item, "opts": self._with_trace_context(item.get("opts") or {}, metadata)}
                    if isinstance(item, Mapping) else item for item in jobs])
        return await self._add_bulk(jobs)

    async def _add_bulk(self, jobs: Sequence[Mapping[str, Any]]) -> list[Job]:
        prepared: list[Any] = []
        for index, item in enumerate(jobs):
            if not isinstance(item, Mapping):
                raise InvalidArgument(f"add_bulk item {index} ({item!r}) must be a dict with name, data, opts")
            unknown = set(item) - {"name", "data", "opts"}
            if unknown:
                raise InvalidArgument(
                    f"add_bulk item {index} has unknown keys {sorted(unknown)}; use name, data, opts")
            if "name" not in item:
                raise InvalidArgument(f"add_bulk item {index} has no 'name'")
            prepared.append(self._prepare(item["name"], item.get("data"), item.get("opts") or {}))
        await self.wait_until_ready()
        results = await self._send(prepared)
        return [self._job_from(p, self._check_result(p, r)) for p, r in zip(prepared, results)]

    # -- reading --------------------------------------------------------------------------------
    async def get_job_counts(self, *types: str) -> dict[str, int]:
        """Counts per state, e.g. ``{"waiting": 3, "active": 1}``; all states when none are named."""
        states = check_states(types)
        await self.wait_until_ready()
        counts = await self.backend.get_counts(states)
        return {state: int(count or 0) for state, count in zip(states, counts)}

    async def get_job_count_by_types(self, *types: str) -> int:
        """The sum of `get_job_counts` over ``types`` (all states when none are named)."""
        return sum((await self.get_job_counts(*types)).values())

    async def count(self) -> int:
        """Jobs waiting to be processed: waiting, delayed, prioritized and waiting-children."""
        return await self.get_job_count_by_types("waiting", "delayed", "prioritized", "waiting-children")

    async def get_jobs(self, types: Optional[Iterable[str] | str] = None, start: int = 0, end: int = -1,
                       asc: bool = False) -> list[Job]:
        """Jobs in the given states, in Node's order (ids and fields read in one call on Redis)."""
        if isinstance(types, str):
            types = [types]
        states = check_states(types or ())
        await self.wait_until_ready()
        return [Job.from_raw(self, job_id, raw)
                for job_id, raw in await self.backend.get_jobs(states, start, end, asc)]

    async def get_waiting(self, start: int = 0, end: int = -1) -> list[Job]:
        """Waiting jobs, in the order workers take them."""
        return await self.get_jobs(["waiting"], start, end, True)

    async def get_completed(self, start: int = 0, end: int = -1) -> list[Job]:
        """Completed jobs, newest first."""
        return await self.get_jobs(["completed"], start, end, False)

    async def get_failed(self, start: int = 0, end: int = -1) -> list[Job]:
        """Failed jobs, newest first."""
        return await self.get_jobs(["failed"], start, end, False)

    async def get_delayed(self, start: int = 0, end: int = -1) -> list[Job]:
        """Delayed jobs, the soonest due first."""
        return await self.get_jobs(["delayed"], start, end, True)

    async def get_active(self, start: int = 0, end: int = -1) -> list[Job]:
        """Jobs being processed now."""
        return await self.get_jobs(["active"], start, end, True)

    async def get_job_logs(self, job_id: str, start: int = 0, end: int = -1, asc: bool = True
                           ) -> dict[str, Any]:
        """``{"logs": [...], "count": n}`` as Node's getJobLogs."""
        await self.wait_until_ready()
        logs, count = await self.backend.get_job_logs(str(job_id), start, end, asc)
        return {"logs": logs, "count": count}

    async def get_deduplication_job_id(self, deduplication_id: str) -> Optional[str]:
        """The id of the job that holds ``deduplication_id``, or None when no job does."""
        await self.wait_until_ready()
        return await self.backend.get_deduplication_job_id(deduplication_id)

    async def remove_deduplication_key(self, deduplication_id: str) -> int:
        """Forget ``deduplication_id`` so the next add with it makes a new job; 1 when it was set."""
        await self.wait_until_ready()
        return await self.backend.remove_deduplication_key(deduplication_id)
