"""Queue: the producer side of a BullMQ queue, on the backend contract (Redis or PostgreSQL)."""
from __future__ import annotations

import asyncio
import copy
import sys
import time
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence, cast

from opentelemetry.trace import SpanKind

from bullmq_compat import _telemetry as telemetry_attrs
from bullmq_compat._backends import open_backend
from bullmq_compat._backends.base import NewJob, QueueBackend, WorkerChannel, WorkerSettings
from bullmq_compat._errors import (
    InvalidArgument,
    InvalidQueueName,
    QueueClosed,
    RedisOutOfMemory,
    is_out_of_memory,
    script_error,
)
from bullmq_compat._events import EventEmitter
from bullmq_compat._groups import (
    GROUP_OPTIONS,
    GroupsMixin,
    check_group_combination,
    group_add_refusal,
)
from bullmq_compat._job import Job
from bullmq_compat._job_ids import JobIdGenerator, id_generator
from bullmq_compat._meter import JobMetrics
from bullmq_compat._queue_manage import QueueManagementMixin
from bullmq_compat._scheduler import JobSchedulerMixin, _template_opts, _upsert, normalize_repeat_options
from bullmq_compat._telemetry import resolve_both as resolve_telemetry
from bullmq_compat._transactions import driver_connection
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import JobOptions, from_wire, merge_defaults, normalize_job_options, to_wire

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # typing_extensions>=4.6 (a dependency on Python 3.10)
    from typing_extensions import Unpack

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


def closed_error(owner: Any) -> QueueClosed:
    """What a call on ``owner`` (a Queue, Worker, QueueEvents ...) after its ``close()`` raises."""
    kind = type(owner).__name__
    subject = f"queue {owner.name!r}" if kind == "Queue" else f"{kind} of queue {owner.name!r}"
    return QueueClosed(f"{subject} is closed: create a new {kind} to use the queue again "
                       "(a closed one does not reconnect)")


class _ClosedBackend:
    """What a closed QueueBase holds instead of its backend: every call that would reach the
    datastore (and so reconnect) raises `QueueClosed`; plain descriptions of the queue still read."""

    _READABLE = frozenset({"kind", "label", "name", "prefix", "qualified_name", "description", "keys",
                           "client", "is_cluster", "transient_errors", "is_transient", "client_name"})

    def __init__(self, backend: QueueBackend, owner: QueueBase) -> None:
        self._backend = backend
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        if name in self._READABLE:
            return getattr(self._backend, name)
        raise closed_error(self._owner)


class QueueBase(EventEmitter):
    """What every queue-bound class shares: name, prefix and the backend that holds the queue."""

    #: Node's ``opts.telemetry.meter``: records MetricNames (`_meter.JobMetrics`), None when off
    meter: Optional[JobMetrics] = None

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
        self._is_closed = False  # close() has run: every later call raises QueueClosed

    # Redis-only views, for code and tests that look at the keys (AttributeError on PostgreSQL)
    @property
    def keys(self) -> Any:
        """The queue's key names in Redis (``keys.wait``, ``keys.active``...), as Node's
        ``queue.keys``; Redis only (AttributeError on PostgreSQL)."""
        return getattr(self.backend, "keys")

    @property
    def client(self) -> Any:
        """The redis-py client under this object (Node's ``queue.client``); Redis only
        (AttributeError on PostgreSQL)."""
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

    async def finishing(self, send: Callable[[], Awaitable[Any]], failed: Optional[Exception] = None) -> Any:
        """Send one finishing call (a Worker sends it again through connection trouble); ``failed``:
        what the caller's own first attempt raised (a Queue does not send again)."""
        if failed is not None:
            raise failed
        return await send()

    def _connection_ok(self) -> None:
        """A finishing call went through (a Worker notes the end of connection trouble)."""

    async def worker_channel(self) -> WorkerChannel:
        """The channel finishing calls go through; a Queue opens a plain one on first use."""
        await self.wait_until_ready()
        channel = self._plain_channel
        if channel is None:
            channel = await self.backend.open_worker_channel(WorkerSettings(), self.client_name(), fast=False)
            self._plain_channel = channel
        return channel

    def _readied(self) -> bool:
        """`wait_until_ready` has succeeded (a hot path's check, without awaiting it)."""
        ready = self._ready
        return ready is not None and ready.done() and not ready.cancelled() and ready.exception() is None

    async def wait_until_ready(self) -> None:
        """Check once that the datastore answers (naming where, without secrets) and run first-use set-up."""
        if self._readied():
            return  # every call after the first: no shield, no task
        if self._is_closed:
            raise closed_error(self)
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._first_use())
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            self._ready = None
            raise

    async def _first_use(self) -> None:
        await self.backend.connect()

    async def disconnect(self) -> None:
        """Drop this object's connections now (Node's ``disconnect``); unlike `close`, the object
        stays usable: its next call connects again (after `close`, nothing to drop)."""
        if self._is_closed:
            return
        channel = self._plain_channel
        if channel is not None:
            self._plain_channel = None
            await channel.close()
        self._ready = None
        await self.backend.disconnect()

    async def close(self) -> None:
        """Close the connections this object opened (a client passed as ``connection=`` stays open).
        For good: every later call that would reach the datastore raises `QueueClosed` (nothing
        reconnects); closing again does nothing."""
        if self._is_closed:
            return
        self.closing = True
        self._is_closed = True
        self._ready = None  # the hot paths' check (`_readied`) sends them to `wait_until_ready`
        backend, self.backend = self.backend, cast(QueueBackend, _ClosedBackend(self.backend, self))
        channel = self._plain_channel
        if channel is not None:
            self._plain_channel = None
            await channel.close()
        if self._owns_backend:
            await backend.close()

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

    async def get_workers_count(self) -> int:
        """How many workers (of any language) are connected to this queue (Node's getWorkersCount)."""
        return len(await self.get_workers())

    async def get_queue_events(self) -> list[dict[str, str]]:
        """The QueueEvents connections (of any language) reading this queue, as Node's
        getQueueEvents lists them: ``name`` is the queue name, ``rawname`` the connection's name."""
        await self.wait_until_ready()
        out = []
        for fields in await self.backend.get_queue_events_clients():
            fields = dict(fields)
            fields["rawname"] = fields.get("name", "")
            fields["name"] = self.name
            out.append(fields)
        return out

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
                 backend: Optional[QueueBackend] = None, repeat_strategy: Any = None,
                 streams: Optional[Mapping[str, Any]] = None, settings: Optional[Mapping[str, Any]] = None,
                 skip_metas_update: Optional[bool] = None, skip_version_check: bool = False,
                 skip_waiting_for_ready: bool = False, blocking_connection: Optional[bool] = None,
                 job_id_generator: Optional[JobIdGenerator] = None) -> None:
        """The producer side of queue ``name``; nothing connects until the first call.

        connection: a ``redis://`` / ``rediss://`` / ``unix://`` URL, a dict of client settings, a
            ready redis client (not closed by `close`), or a ``postgresql://`` URL. Default: local Redis.
        schema, migrate: PostgreSQL only: the schema (default "bullmq"), and ``migrate=True`` to
            create or upgrade it on first use (else `migrate_postgres` must have run).
        prefix: the key prefix (Node's ``prefix``; ``"{bull}"`` on Redis Cluster).
        default_job_options: options merged under every `add` (as `JobOptions`; checked now).
        max_len_events: about how many entries the events stream keeps (default 10000).
        skip_meta_update: do not write the queue's meta (version, maxLenEvents) on first use.
        telemetry: True or an OpenTelemetry TracerProvider: Node's spans and metrics.
        repeat_strategy: ``fn(millis, repeat_opts, name) -> next run in ms`` for cron schedulers.
        streams, settings, skip_metas_update: Node's forms of ``max_len_events``
            (``{"events": {"max_len": n}}``), ``repeat_strategy`` and ``skip_meta_update``.
        skip_version_check, skip_waiting_for_ready, blocking_connection: accepted as Node accepts
            them; they change nothing here.
        backend: a ready backend to share (internal: flows and tests).
        job_id_generator: makes the id of each add that gives no ``job_id`` (e.g. `uuid7_ids`).

        Bad values raise `InvalidArgument` naming the keyword and its rule, before anything connects.
        """
        # Node's QueueOptions under Python names (docs/compatibility.md has the table): streams and
        # settings in Node's nested form; skip_version_check, skip_waiting_for_ready and
        # blocking_connection change nothing here (no Redis version gate, connections open on
        # first use, and a Queue never blocks), so they are accepted as Node accepts them
        max_len_events = _events_max_len(streams, max_len_events)
        generator = id_generator(job_id_generator)  # refused before a connection is made
        repeat_strategy = _repeat_setting(settings, repeat_strategy)
        if skip_metas_update is not None:
            skip_meta_update = bool(skip_metas_update)
        super().__init__(name, connection, prefix=prefix, schema=schema, migrate=migrate, backend=backend)
        if repeat_strategy is not None and not callable(repeat_strategy):
            raise InvalidArgument(f"repeat_strategy={repeat_strategy!r} must be a function "
                                  "(millis, repeat_opts, name) -> next run in ms, or None")
        #: Node's settings.repeatStrategy: computes a cron scheduler's next time (None: the default)
        self.repeat_strategy = repeat_strategy
        self.default_job_options = normalize_job_options(default_job_options or {}, extra=GROUP_OPTIONS)
        if isinstance(max_len_events, bool) or not isinstance(max_len_events, int) or max_len_events < 0:
            raise InvalidArgument(f"max_len_events={max_len_events!r} must be an int >= 0")
        self.max_len_events = max_len_events
        self.skip_meta_update = skip_meta_update
        self.telemetry, self.meter = resolve_telemetry(telemetry)
        #: makes the id of each add that gives none (docs/queue.md, "Job ids"); None: the queue's counter
        self._id_generator = generator
        # an add with no options of its own: its script call made once per defaults (`_plain_add`)
        self._plain: Any = None
        self._plain_of: Any = None
        self._plain_defaults: Any = None

    @property
    def job_id_generator(self) -> Optional[JobIdGenerator]:
        """The ``job_id_generator=`` this queue was made with, or None."""
        return None if self._id_generator is None else self._id_generator.fn

    async def _first_use(self) -> None:
        try:
            await super()._first_use()
            if not self.skip_meta_update:
                await self.backend.set_meta({"opts.maxLenEvents": self.max_len_events, "version": LIBRARY_VERSION})
        except Exception as err:
            if self.listener_count("error"):  # as Node's Queue: connection trouble is also an 'error' event
                self.emit("error", err)
            raise

    # -- adding ---------------------------------------------------------------------------------
    def _new_job(self, name: str, data: Any, opts: Mapping[str, Any]) -> NewJob:
        merged = merge_defaults(self.default_job_options, normalize_job_options(opts, extra=GROUP_OPTIONS))
        if self._id_generator is not None and "jobId" not in merged:  # an explicit job_id wins
            merged["jobId"] = self._id_generator(name, data)
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
        return self._checked(result, prepared.opts, getattr(prepared, "job_id", None))

    def _checked(self, result: Any, opts: Mapping[str, Any], job_id: Optional[str]) -> Any:
        """An add script's reply (the new job's id), or the error it stands for raised."""
        if isinstance(result, BaseException):
            if is_out_of_memory(result) and not isinstance(result, RedisOutOfMemory):
                raise RedisOutOfMemory(f"add to queue {self.name!r}", result) from result
            raise result
        refusal = group_add_refusal(result, opts, self.name)
        if refusal is not None:
            raise refusal
        if isinstance(result, int) and result < 0:
            parent = opts.get("parent")
            parent_key = f"{parent['queue']}:{parent['id']}" if parent else None
            raise script_error(result, job_id=job_id or opts.get("jobId"), command="addJob", parent_key=parent_key)
        return result

    async def _send(self, prepared: Sequence[Any]) -> list[Any]:
        add_prepared = getattr(self.backend, "add_prepared", None)
        if add_prepared is not None:
            return list(await add_prepared(prepared))
        return list(await self.backend.add_jobs(prepared))

    async def _add_sent(self, prepared: Sequence[Any]) -> list[Job]:
        """Send prepared adds and make their Jobs: where the backend can write them before its
        replies come (`submit_prepared`), the Jobs are built while Redis runs the adds."""
        submit = getattr(self.backend, "submit_prepared", None)
        pending = submit(prepared) if submit is not None else None
        if pending is None:
            results = await self._send(prepared)
            return [self._job_from(p, self._check_result(p, r)) for p, r in zip(prepared, results)]
        return await self._jobs_of(prepared, pending)

    async def _jobs_of(self, prepared: Sequence[Any], pending: Awaitable[list[Any]]) -> list[Job]:
        """The Jobs of adds already written, built before their replies are read."""
        try:
            jobs = [self._job_from(p, None) for p in prepared]
        finally:
            results = await pending
        for job, p, result in zip(jobs, prepared, results):
            job.id = codec.to_str(self._check_result(p, result))
        return jobs

    async def _add_one(self, name: str, data: Any, opts: Mapping[str, Any]) -> Job:
        prepared = self._prepare(name, data, opts)
        if not self._readied():
            await self.wait_until_ready()
        submit = getattr(self.backend, "submit_one", None)
        pending = submit(prepared) if submit is not None else None
        if pending is None:
            return (await self._add_sent([prepared]))[0]
        job = self._job_from(prepared, None)  # while Redis runs the add
        job.id = codec.to_str(self._check_result(prepared, await pending))
        return job

    async def _add_emitting(self, name: str, data: Any, opts: Mapping[str, Any]) -> Job:
        job = await self._add_one(name, data, opts)
        self.emit("waiting", job)  # as Node's Queue.add (addBulk emits none)
        return job

    async def add(self, name: str, data: Any = None, *, transaction: Any = None, **opts: Unpack[JobOptions]) -> Job:
        """Add one job. Options by Python or Node name: delay, priority, lifo, attempts, backoff,
        job_id, remove_on_complete, remove_on_fail, deduplication, keep_logs, size_limit, ...
        (`JobOptions` lists them with their types, for type checkers; docs/queue.md has the table).

        ``transaction=`` (PostgreSQL queues): the caller's open transaction -- a psycopg 3
        connection, a SQLAlchemy session or connection over psycopg, or Django's connection
        inside ``transaction.atomic()``. The job is written on it by the same SQL, is seen by
        workers when the caller commits and is gone if it rolls back (docs/postgres.md,
        "Transactions").

        Bad input raises an `InvalidArgument` subclass before anything is written.
        """
        if transaction is not None:
            return await self._add_in_transaction(name, data, opts, transaction)
        if self.telemetry is not None:
            return await self._add_traced(name, data, opts)
        if opts or self._id_generator is not None or not self._readied():
            job = await self._add_one(name, data, opts)
            self.emit("waiting", job)  # as _add_emitting, one coroutine less
            return job
        # an add with no options of its own: the script call made from the queue's PlainAdd (its
        # defaults merged and packed once), the Job built while Redis runs it
        plain = self._plain_add()
        backend: Any = self.backend  # a backend that made a PlainAdd has submit_plain
        sent = None if plain is None else backend.submit_plain(plain, name, data)
        if sent is None:
            job = await self._add_one(name, data, {})
        else:
            timestamp, future, call = sent
            job = Job(self, name, {} if data is None else data, plain.job_opts)
            job.timestamp = timestamp
            try:
                result = await future
            except Exception as err:
                result = await backend.reply_after(call, err)
            if type(result) is not str:
                result = codec.to_str(self._checked(result, plain.merged, None))
            job.id = result
        self.emit("waiting", job)
        return job

    def _plain_add(self) -> Any:
        """The backend's PlainAdd for this queue's defaults (made again when they change), or None."""
        defaults = self.default_job_options
        if self._plain_of is not defaults or self._plain_defaults != defaults:
            make = getattr(self.backend, "plain_add", None)
            self._plain = None if make is None else make(merge_defaults(defaults, {}))
            self._plain_of, self._plain_defaults = defaults, copy.deepcopy(defaults)
        return self._plain

    @staticmethod
    def _with_trace_context(opts: Mapping[str, Any], metadata: str) -> dict[str, Any]:
        """Store the producer span's context in opts.tm unless the job omits it (omc), as Node does."""
        given = dict(opts.get("telemetry") or {})
        if given.get("omit_context") or given.get("omitContext"):
            return dict(opts)
        return {**opts, "telemetry": {"metadata": metadata}}

    async def _in_transaction(self, transaction: Any) -> QueueBackend:
        """This queue's backend writing in the caller's transaction (`QueueBackend.in_transaction`)."""
        await self.wait_until_ready()
        return self.backend.in_transaction(await driver_connection(transaction))

    async def _add_in_transaction(self, name: str, data: Any, opts: Mapping[str, Any], transaction: Any) -> Job:
        async def add(opts: Mapping[str, Any]) -> Job:
            prepared = self._prepare(name, data, opts)
            backend = await self._in_transaction(transaction)
            [result] = await backend.add_jobs([prepared])
            job = self._job_from(prepared, self._check_result(prepared, result))
            self.emit("waiting", job)
            return job

        if self.telemetry is None:
            return await add(opts)
        with self.telemetry.span(SpanKind.PRODUCER, self.name, "add", f"{self.name}.{name}") as (span, metadata):
            job = await add(self._with_trace_context(opts, metadata))
            span.set_attributes({telemetry_attrs.JOB_NAME: name, telemetry_attrs.JOB_ID: str(job.id),
                                 telemetry_attrs.MESSAGING_MESSAGE_ID: str(job.id)})
            return job

    async def _add_traced(self, name: str, data: Any, opts: Mapping[str, Any]) -> Job:
        assert self.telemetry is not None
        with self.telemetry.span(SpanKind.PRODUCER, self.name, "add", f"{self.name}.{name}") as (span, metadata):
            job = await self._add_emitting(name, data, self._with_trace_context(opts, metadata))
            span.set_attributes({telemetry_attrs.JOB_NAME: name, telemetry_attrs.JOB_ID: str(job.id),
                                 telemetry_attrs.MESSAGING_MESSAGE_ID: str(job.id)})
            return job

    async def add_bulk(self, jobs: Sequence[Mapping[str, Any]], *, transaction: Any = None) -> list[Job]:
        """Add many jobs in one round trip: ``[{"name": ..., "data": ..., "opts": {...}}, ...]``.

        Every item is validated before anything is sent, so bad input writes nothing.
        ``transaction=``: as for `add` (PostgreSQL), all of them in the caller's transaction.
        """
        if self.telemetry is not None:
            names = [item.get("name") for item in jobs if isinstance(item, Mapping)]
            with self.telemetry.span(SpanKind.PRODUCER, self.name, "addBulk", self.name, attributes={
                    telemetry_attrs.BULK_NAMES: [str(n) for n in names],
                    telemetry_attrs.BULK_COUNT: len(jobs)}) as (_span, metadata):
                return await self._add_bulk([
                    {**item, "opts": self._with_trace_context(item.get("opts") or {}, metadata)}
                    if isinstance(item, Mapping) else item for item in jobs], transaction)
        return await self._add_bulk(jobs, transaction)

    async def _add_bulk(self, jobs: Sequence[Mapping[str, Any]], transaction: Any = None) -> list[Job]:
        new_jobs: list[NewJob] = []
        for index, item in enumerate(jobs):
            if not isinstance(item, Mapping):
                raise InvalidArgument(f"add_bulk item {index} ({item!r}) must be a dict with name, data, opts")
            unknown = set(item) - {"name", "data", "opts"}
            if unknown:
                raise InvalidArgument(
                    f"add_bulk item {index} has unknown keys {sorted(unknown)}; use name, data, opts")
            if "name" not in item:
                raise InvalidArgument(f"add_bulk item {index} has no 'name'")
            new_jobs.append(self._new_job(item["name"], item.get("data"), item.get("opts") or {}))
        if transaction is not None:
            in_tx: Any = await self._in_transaction(transaction)
            prepared = [in_tx.prepare(job) for job in new_jobs]  # all of them before anything is sent
            results = await in_tx.add_jobs(prepared)
            return [self._job_from(p, self._check_result(p, r)) for p, r in zip(prepared, results)]
        check = getattr(self.backend, "check_add", None)
        if check is None:  # a backend without that split (PostgreSQL prepares nothing: add_jobs checks)
            prepare = getattr(self.backend, "prepare", None)
            prepared = [prepare(job) for job in new_jobs] if prepare is not None else new_jobs
            await self.wait_until_ready()
            return await self._add_sent(prepared)
        data_json = [check(job) for job in new_jobs]  # all of them before anything is sent
        await self.wait_until_ready()
        backend: Any = self.backend  # a backend with check_add has submit_new and prepare
        started = backend.submit_new(new_jobs, data_json)
        if started is not None:  # each prepared and written in turn: Redis starts on the first at once
            return await self._jobs_of(*started)
        return await self._add_sent([backend.prepare(job, data_json=text) for job, text in zip(new_jobs, data_json)])

    # -- reading --------------------------------------------------------------------------------
    async def get_job_counts(self, *types: str) -> dict[str, int]:
        """Counts per state, e.g. ``{"waiting": 3, "active": 1}``; all states when none are named."""
        states = check_states(types)
        await self.wait_until_ready()
        counts = await self.backend.get_counts(states)
        return {state: int(count or 0) for state, count in zip(states, counts)}

    async def record_job_counts_metric(self, *types: str) -> dict[str, int]:
        """`get_job_counts`, also recorded (with a meter, ``telemetry=``) on the gauge
        ``bullmq.queue.jobs``: each state's count with ``bullmq.queue.name`` and
        ``bullmq.queue.jobs.state``, as Node's ``recordJobCountsMetric``."""
        counts = await self.get_job_counts(*types)
        if self.meter is not None:
            self.meter.counts(self.name, counts)
        return counts

    async def close(self) -> None:
        """Close the connections this queue opened (a client passed as ``connection=`` stays open);
        with tracing, inside Node's ``close <queue>`` span."""
        if self.telemetry is None:
            return await super().close()
        with self._span("close"):
            await super().close()

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
        with self._span("removeDeduplicationKey", {telemetry_attrs.DEDUPLICATION_KEY: deduplication_id}):
            await self.wait_until_ready()
            return await self.backend.remove_deduplication_key(deduplication_id)

    async def get_debounce_job_id(self, debounce_id: str) -> Optional[str]:
        """Node's deprecated name of `get_deduplication_job_id`."""
        return await self.get_deduplication_job_id(debounce_id)

    async def remove_debounce_key(self, debounce_id: str) -> int:
        """Node's deprecated name of `remove_deduplication_key`."""
        with self._span("removeDebounceKey", {telemetry_attrs.JOB_KEY: debounce_id}):
            await self.wait_until_ready()
            return await self.backend.remove_deduplication_key(debounce_id)

    # -- Node's other getters -----------------------------------------------------------------
    async def get_waiting_count(self) -> int:
        """Jobs waiting (or paused) to be processed."""
        return await self.get_job_count_by_types("waiting")

    async def get_active_count(self) -> int:
        """Jobs being processed now."""
        return await self.get_job_count_by_types("active")

    async def get_delayed_count(self, timestamp: Optional[int] = None) -> int:
        """Delayed jobs; with ``timestamp`` (epoch ms), only those due strictly before it (Node 6.6+)."""
        if timestamp is None:
            return await self.get_job_count_by_types("delayed")
        if isinstance(timestamp, bool) or not isinstance(timestamp, int) or abs(timestamp) > 2**53 - 1:
            raise InvalidArgument(f"timestamp={timestamp!r} must be a safe integer in milliseconds")
        await self.wait_until_ready()
        return int((await self.backend.get_counts(["delayed"], timestamp))[0] or 0)

    async def get_completed_count(self) -> int:
        """How many jobs are completed (Node's ``getCompletedCount``)."""
        return await self.get_job_count_by_types("completed")

    async def get_failed_count(self) -> int:
        """How many jobs have failed for good (Node's ``getFailedCount``)."""
        return await self.get_job_count_by_types("failed")

    async def get_prioritized_count(self) -> int:
        """Jobs waiting with a priority."""
        return await self.get_job_count_by_types("prioritized")

    async def get_waiting_children_count(self) -> int:
        """Parents waiting for their children (and group jobs held behind their group's gate)."""
        return await self.get_job_count_by_types("waiting-children")

    async def get_prioritized(self, start: int = 0, end: int = -1) -> list[Job]:
        """Jobs waiting with a priority, in the order workers take them."""
        return await self.get_jobs(["prioritized"], start, end, True)

    async def get_waiting_children(self, start: int = 0, end: int = -1) -> list[Job]:
        """Parents waiting for their children."""
        return await self.get_jobs(["waiting-children"], start, end, True)

    async def get_global_rate_limit(self) -> Optional[dict[str, int]]:
        """``{"max": n, "duration": ms}`` set by `set_global_rate_limit`, or None."""
        await self.wait_until_ready()
        meta = await self.backend.get_meta()
        max_jobs, duration = meta.get("max"), meta.get("duration")
        if max_jobs and duration:
            return {"max": _js_number(max_jobs), "duration": _js_number(duration)}
        return None

    async def get_meta(self) -> dict[str, Any]:
        """The queue's meta hash as Node's getMeta parses it: ``concurrency``, ``max``,
        ``duration`` and ``maxLenEvents`` (from ``opts.maxLenEvents``) as numbers when set,
        ``paused`` as a bool, every other field (``version`` ...) as stored."""
        await self.wait_until_ready()
        meta = dict(await self.backend.get_meta())
        parsed: dict[str, Any] = {k: v for k, v in meta.items()
                                  if k not in ("concurrency", "max", "duration", "paused", "opts.maxLenEvents")}
        for field, key in (("concurrency", "concurrency"), ("opts.maxLenEvents", "maxLenEvents"),
                           ("max", "max"), ("duration", "duration")):
            if meta.get(field):
                parsed[key] = _js_number(meta[field])
        parsed["paused"] = meta.get("paused") == "1"
        return parsed

    async def get_version(self) -> Optional[str]:
        """The ``version`` field of the queue's meta (``"bullmq:6.7.0"`` when Node wrote it last,
        ``"bullmq-compat:…"`` when we did), or None when nobody has."""
        await self.wait_until_ready()
        return await self.backend.get_meta_field("version")

    async def get_dependencies(self, parent_id: str, type: str, start: int = 0, end: int = -1) -> dict[str, Any]:
        """One page of a parent's children, as Node's ``Queue.getDependencies``: ``type``
        "processed" (children done: ``items`` are ``{"id": child key, "v": return value}``) or
        "pending" (``{"id": child key}``); ``jobs`` the children's Node ``JobJson`` (see
        `Job.from_json`), ``total`` how many children of that type there are."""
        if type not in ("processed", "pending"):
            raise InvalidArgument(f"type={type!r} must be 'processed' or 'pending'")
        for label, value, minimum in (("start", start, 0), ("end", end, -1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidArgument(f"{label}={value!r} must be an int >= {minimum}")
        await self.wait_until_ready()
        page = await self.backend.paginate_dependencies(str(parent_id), type, start, end)
        from bullmq_compat._job import job_json_from_raw

        return {"items": page["items"], "jobs": [job_json_from_raw(raw) for raw in page["jobs"] if raw],
                "total": page["total"]}

    async def update_job_progress(self, job_id: str, progress: Any) -> None:
        """Set job ``job_id``'s progress (a number or JSON-serialisable object); emits 'progress'
        (job id, progress) on this queue, and upstream's 'progress' event for QueueEvents."""
        text = codec.dumps(progress, what="progress")
        with self._span("updateJobProgress", {telemetry_attrs.JOB_ID: str(job_id), telemetry_attrs.JOB_PROGRESS: text}):
            await self.wait_until_ready()
            await self.backend.update_progress(str(job_id), text)
            self.emit("progress", str(job_id), progress)

    async def add_job_log(self, job_id: str, row: str, keep_logs: Optional[int] = None) -> int:
        """Append a log line to job ``job_id``, keeping at most ``keep_logs`` (None or 0: all);
        returns how many lines it has now."""
        if keep_logs is not None and (isinstance(keep_logs, bool) or not isinstance(keep_logs, int) or keep_logs < 0):
            raise InvalidArgument(f"keep_logs={keep_logs!r} must be an int >= 0 (0: keep all) or None")
        if not isinstance(row, str):
            raise InvalidArgument(f"row={row!r} must be a str")
        await self.wait_until_ready()
        return int(await self.backend.add_log(str(job_id), row, keep_logs or None))

    async def export_prometheus_metrics(self, global_variables: Optional[Mapping[str, Any]] = None) -> str:
        """The queue's job counts and completed/failed totals in Prometheus' text format, the same
        text as Node's ``exportPrometheusMetrics`` for the same queue state; ``global_variables``
        adds labels to every sample (``{"env": "prod"}``)."""
        if global_variables is not None and not isinstance(global_variables, Mapping):
            raise InvalidArgument(f"global_variables={global_variables!r} must be a dict of label -> value")
        counts = await self.get_job_counts()
        name = _prometheus_label(self.name)
        labels = "".join(f', {key}="{_prometheus_label(value)}"' for key, value in (global_variables or {}).items())
        lines = ["# HELP bullmq_job_count Number of jobs in the queue by state",
                 "# TYPE bullmq_job_count gauge"]
        lines += [f'bullmq_job_count{{queue="{name}", state="{state}"{labels}}} {count}'
                  for state, count in counts.items()]
        completed, failed = await asyncio.gather(self.get_metrics("completed"), self.get_metrics("failed"))
        lines += ["# HELP bullmq_job_completed_total Total number of completed jobs",
                  "# TYPE bullmq_job_completed_total counter",
                  f'bullmq_job_completed_total{{queue="{name}"{labels}}} {completed["meta"]["count"]}',
                  "# HELP bullmq_job_failed_total Total number of failed jobs",
                  "# TYPE bullmq_job_failed_total counter",
                  f'bullmq_job_failed_total{{queue="{name}"{labels}}} {failed["meta"]["count"]}']
        return "\n".join(lines)


def _events_max_len(streams: Optional[Mapping[str, Any]], max_len_events: int) -> int:
    """Node's ``streams: {events: {maxLen}}`` → ``max_len_events``."""
    if streams is None:
        return max_len_events
    events = streams.get("events") if isinstance(streams, Mapping) else None
    if not isinstance(streams, Mapping) or set(streams) - {"events"} or not isinstance(events, Mapping) \
            or set(events) - {"max_len", "maxLen"} or len(events) != 1:
        raise InvalidArgument(f"streams={streams!r} must be {{'events': {{'max_len': n}}}} (Node's streams.events.maxLen)")
    return events.get("max_len", events.get("maxLen"))  # type: ignore[no-any-return]  # checked as max_len_events


def _repeat_setting(settings: Optional[Mapping[str, Any]], repeat_strategy: Any) -> Any:
    """Node's ``settings`` (AdvancedRepeatOptions) → the repeat strategy."""
    if settings is None:
        return repeat_strategy
    if not isinstance(settings, Mapping):
        raise InvalidArgument(f"settings={settings!r} must be a dict such as {{'repeat_strategy': f}}")
    for key in settings:
        if key in ("repeat_key_hash_algorithm", "repeatKeyHashAlgorithm"):
            raise InvalidArgument(f"settings.{key}: BullMQ 6.7 reads it nowhere (it hashed the keys of legacy "
                                  "repeatable jobs, which BullMQ 6 replaced by job schedulers); remove it")
        if key not in ("repeat_strategy", "repeatStrategy"):
            raise InvalidArgument(f"settings has an unknown key {key!r}; a Queue's settings take repeat_strategy")
    given = settings.get("repeat_strategy", settings.get("repeatStrategy"))
    if given is not None and repeat_strategy is not None and given is not repeat_strategy:
        raise InvalidArgument("repeat_strategy is given twice (as repeat_strategy= and in settings=): give one")
    return given if given is not None else repeat_strategy


def _js_string(value: Any) -> str:
    """``String(value)`` as JavaScript writes it for the JSON-able values a label can be."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _prometheus_label(value: Any) -> str:
    """A label value escaped as Prometheus' text format (and Node) escape it: backslash, double
    quote and newline."""
    return _js_string(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _js_number(text: str) -> Any:
    """``Number(text)`` for a meta field: an int when whole, else a float."""
    try:
        number = float(text)
    except ValueError:
        return float("nan")
    return int(number) if number.is_integer() else number


class JobScheduler(QueueBase):
    """Node's public ``JobScheduler`` class: a queue's job schedulers on their own, with Node's
    signatures (`Queue.upsert_job_scheduler` and friends run the same code).

    >>> schedulers = JobScheduler("reports", connection="redis://127.0.0.1:6379/0")
    >>> job = await schedulers.upsert_job_scheduler("daily", {"pattern": "0 9 * * *"}, "report", {"to": "ops"})
    """

    def __init__(self, name: str, connection: Connection = None, *, prefix: str = "bull",
                 repeat_strategy: Any = None, telemetry: Any = None, schema: Optional[str] = None,
                 migrate: bool = False, backend: Optional[QueueBackend] = None) -> None:
        """The job schedulers of queue ``name``.

        ``connection``, ``prefix``, ``schema``, ``migrate`` and ``backend`` as for `Queue`.
        ``repeat_strategy``: a function ``(millis, repeat_opts, name) -> next run in ms`` that
        replaces the built-in cron and ``every`` rules (Node's ``settings.repeatStrategy``;
        `default_repeat_strategy` is the built-in one). ``telemetry``: a `Telemetry`, or None for
        the process default.
        """
        super().__init__(name, connection, prefix=prefix, schema=schema, migrate=migrate, backend=backend)
        if repeat_strategy is not None and not callable(repeat_strategy):
            raise InvalidArgument(f"repeat_strategy={repeat_strategy!r} must be a function "
                                  "(millis, repeat_opts, name) -> next run in ms, or None")
        self.repeat_strategy = repeat_strategy
        self.telemetry, self.meter = resolve_telemetry(telemetry)
        self.default_job_options: dict[str, Any] = {}

    async def upsert_job_scheduler(self, job_scheduler_id: str, repeat: Mapping[str, Any], job_name: str,
                                   job_data: Any = None, opts: Optional[Mapping[str, Any]] = None, *,
                                   override: bool = True, producer_id: Optional[str] = None) -> Optional[Job]:
        """Node's ``JobScheduler.upsertJobScheduler``: with ``override`` (what `Queue` does) create or
        replace the scheduler and its next job; without, make the iteration after the job
        ``producer_id`` (what a worker does on taking one). Returns the job made, or None."""
        if not isinstance(job_scheduler_id, str) or not job_scheduler_id:
            raise InvalidArgument(f"job_scheduler_id={job_scheduler_id!r} must be a non-empty str")
        if not isinstance(job_name, str):
            raise InvalidArgument(f"job_name={job_name!r} must be a str")
        if not override and not producer_id:
            raise InvalidArgument("producer_id (the id of the iteration taken) is needed when override=False")
        repeat_opts = normalize_repeat_options(repeat)
        data = {} if job_data is None else job_data
        data_json = codec.dumps(data)
        node_opts = (_template_opts({}, opts or {}) if override
                     else normalize_job_options(opts or {}, extra=GROUP_OPTIONS))
        await self.wait_until_ready()
        return await _upsert(self, job_scheduler_id, repeat_opts, job_name, data, data_json, node_opts,
                             override=override, producer_id=producer_id,
                             wire_base=None if override else to_wire(node_opts))

    async def get_scheduler(self, job_scheduler_id: str) -> Optional[dict[str, Any]]:
        """The scheduler, as `Queue.get_job_scheduler` gives it, or None."""
        return await JobSchedulerMixin.get_job_scheduler(self, job_scheduler_id)

    async def get_job_schedulers(self, start: int = 0, end: int = -1, asc: bool = False) -> list[dict[str, Any]]:
        """Schedulers by next run time, as `Queue.get_job_schedulers`."""
        return await JobSchedulerMixin.get_job_schedulers(self, start, end, asc)

    async def get_schedulers_count(self) -> int:
        """How many job schedulers the queue has."""
        return await JobSchedulerMixin.get_job_schedulers_count(self)

    async def remove_job_scheduler(self, job_scheduler_id: str) -> bool:
        """Remove the scheduler and its next job; True when there was one (Node's JobScheduler
        answers the script's 0/1 instead; `Queue.remove_job_scheduler` turns it into this bool)."""
        return await JobSchedulerMixin.remove_job_scheduler(self, job_scheduler_id)
