"""Queue: the producer side of a BullMQ queue, over the upstream scripts."""
from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Iterable, Mapping, Optional, Sequence

from bullmq_compat._backends.redis.connection import Connection, RedisHandle
from bullmq_compat._errors import InvalidArgument, InvalidQueueName, script_error
from bullmq_compat._events import EventEmitter
from bullmq_compat._groups import GROUP_OPTIONS, FLOW_PARENT_REFUSED, GroupJobRefused, GroupsMixin
from bullmq_compat._job import Job
from bullmq_compat._scheduler import JobSchedulerMixin
from bullmq_compat import _telemetry as telemetry_attrs
from bullmq_compat._telemetry import resolve as resolve_telemetry
from opentelemetry.trace import SpanKind
from bullmq_compat._wire import codec
from bullmq_compat._backends.redis.adding import PreparedAdd, prepare_add
from bullmq_compat._backends.redis.keys import QueueKeys
from bullmq_compat._backends.redis.lua import own_script
from bullmq_compat._wire.options import from_wire, merge_defaults, normalize_job_options
from bullmq_compat._backends.redis.channel import FastChannel
from bullmq_compat._backends.redis.fastconn import FastPathUnavailable
from bullmq_compat._backends.redis.runner import ScriptRunner
from bullmq_compat._backends.redis.worker_calls import WorkerCalls, WorkerWireOptions

LIBRARY_VERSION = "bullmq-compat:0.1.0"

ALL_STATES = ("active", "completed", "delayed", "failed", "prioritized", "waiting", "waiting-children")
_KNOWN_STATES = set(ALL_STATES) | {"paused", "wait"}
_CLEANABLE = {"completed", "wait", "waiting", "active", "paused", "delayed", "failed", "prioritized",
              "waiting-children"}


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


def _types(types: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for state in types:
        if state not in _KNOWN_STATES:
            raise InvalidArgument(f"job state {state!r} is not one of {', '.join(sorted(_KNOWN_STATES))}")
        if state not in seen:
            seen.append(state)
    return seen or list(ALL_STATES)


def _wire_state(state: str) -> str:
    return "wait" if state == "waiting" else state


class QueueBase(EventEmitter):
    """What every queue-bound class shares: name, prefix, keys, the connection and the scripts."""

    def __init__(self, name: str, connection: Connection = None, *, prefix: str = "bull") -> None:
        super().__init__()
        self.name = check_queue_name(name)
        self.prefix = check_prefix(prefix)
        self.keys = QueueKeys(self.prefix, self.name)
        self._redis = RedisHandle(connection)
        self.client: Any = self._redis.client
        self.runner = ScriptRunner(self.client)
        self._ready: Optional[asyncio.Future[None]] = None
        self._worker_calls: Optional[WorkerCalls] = None
        # the pipelined hiredis connection for hot script calls (adds); False once known unusable
        self._fast: Any = None
        self._fast_opening: Optional[asyncio.Future[Any]] = None
        self.closing = False

    @property
    def qualified_name(self) -> str:
        """``"<prefix>:<queue>"``, as Node's qualifiedName (the ``queue`` of a ``parent=`` option)."""
        return self.keys.qualified_name

    def client_name(self, suffix: str = "") -> str:
        """Upstream's connection name, ``<prefix>:<base64(queue)><suffix>``, as CLIENT LIST shows it."""
        return f"{self.prefix}:{base64.b64encode(self.name.encode()).decode()}{suffix}"

    # a Worker overrides these three: its own options, channel and retry settings
    backoff_strategy: Any = None
    max_started_attempts: Optional[int] = None

    async def finish_call(self, call: Any) -> Any:
        """Send one worker-side script call (see `WorkerCalls`)."""
        await self.wait_until_ready()
        script, keys, args = call
        return await self.runner.call(script, keys, args)

    def worker_calls(self) -> "WorkerCalls":
        """Builders of worker-side script calls, with this queue's worker options (defaults here)."""
        if self._worker_calls is None:
            self._worker_calls = WorkerCalls(self.keys, WorkerWireOptions())
        return self._worker_calls

    async def wait_until_ready(self) -> None:
        """Check once that Redis answers (naming the URL when it does not) and run first-use set-up."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._first_use())
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            self._ready = None
            raise

    async def _first_use(self) -> None:
        await self._redis.check()

    async def fast_channel(self) -> Optional[Any]:
        """The fast channel for this queue's hot script calls, or None where redis-py must serve
        (Redis Cluster, Sentinel-managed pools, unknown connection classes)."""
        if self._fast is None:
            if self._redis.is_cluster:
                self._fast = False
                return None
            if self._fast_opening is None:
                self._fast_opening = asyncio.ensure_future(FastChannel.open(self.client, None))
            opening = self._fast_opening
            try:
                self._fast = await asyncio.shield(opening)
            except FastPathUnavailable:
                self._fast = False
            except Exception:
                return None  # not reachable now: redis-py reports it, and we try again next time
            finally:
                if self._fast_opening is opening:
                    self._fast_opening = None
        return self._fast or None

    async def call_scripts(self, calls: Sequence[Any]) -> list[Any]:
        """Hot script calls (adds) in one round trip, on the fast channel where it serves."""
        channel = await self.fast_channel()
        if channel is None:
            return await self.runner.call_many(list(calls))
        return await channel.call_many(list(calls), raise_errors=False)

    async def close(self) -> None:
        """Close the connections this object opened (a client passed as ``connection=`` stays open)."""
        self.closing = True
        if self._fast:
            await self._fast.close()
        await self._redis.close()

    def __repr__(self) -> str:  # the connection as errors name it: never its password
        return f"<{type(self).__name__} {self.qualified_name} {self._redis.description}>"

    async def __aenter__(self) -> "QueueBase":
        await self.wait_until_ready()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- reads shared by Queue, Worker and Job -------------------------------------------------
    async def get_job(self, job_id: str) -> Optional[Job]:
        """The job with this id, or None."""
        await self.wait_until_ready()
        raw = await self.client.hgetall(self.keys.job(str(job_id)))
        if not raw:
            return None
        return Job.from_raw(self, str(job_id), codec.str_dict(raw))

    async def get_workers(self) -> list[dict[str, str]]:
        """The workers (of any language) connected to this queue, from CLIENT LIST, as Node lists them."""
        await self.wait_until_ready()
        unnamed, named = self.client_name(), self.client_name(":w:")
        if self._redis.is_cluster:  # one listing per node; as Node, keep the node with the most workers
            per_node = await self.client.execute_command("CLIENT LIST", target_nodes=self.client.ALL_NODES)
            listings = list(per_node.values()) if isinstance(per_node, dict) else [per_node]
        else:
            listings = [await self.client.execute_command("CLIENT", "LIST")]
        best: list[dict[str, str]] = []
        for listing in listings:
            lines = codec.to_str(listing)
            if isinstance(lines, str):
                lines = lines.splitlines()
            workers = []
            for line in lines or []:
                # a raw line, or a dict when redis-py's cluster client parsed it
                fields = dict(line) if isinstance(line, dict) else dict(
                    kv.split("=", 1) for kv in str(line).split(" ") if "=" in kv)
                name = fields.get("name", "")
                if name and (name == unnamed or name.startswith(named)):
                    fields["rawname"] = name
                    fields["name"] = self.name  # as Node's getWorkers: the queue name; rawname has the rest
                    workers.append(fields)
            if len(workers) > len(best):
                best = workers
        return best

    async def get_job_state(self, job_id: str) -> str:
        """The state of job ``job_id``, as `Job.get_state` gives it ('unknown' when it does not exist)."""
        await self.wait_until_ready()
        k = self.keys
        state = await self.runner.call("getStateV2", [
            k.completed, k.failed, k.delayed, k.active, k.wait, k.paused, k.waiting_children,
            k.prioritized], [job_id])
        return codec.to_str(state)


class Queue(GroupsMixin, JobSchedulerMixin, QueueBase):
    """The producer side of a queue, compatible with Node BullMQ's Queue.

    >>> queue = Queue("emails", connection="redis://127.0.0.1:6379/0")
    >>> job = await queue.add("send", {"to": "a@b"}, attempts=3, delay=500)
    >>> await queue.get_job_counts("waiting", "delayed")
    {'waiting': 0, 'delayed': 1}
    """

    def __init__(self, name: str, connection: Connection = None, *, prefix: str = "bull",
                 default_job_options: Optional[Mapping[str, Any]] = None,
                 max_len_events: int = 10000, skip_meta_update: bool = False, telemetry: Any = None) -> None:
        super().__init__(name, connection, prefix=prefix)
        self.default_job_options = normalize_job_options(default_job_options or {}, extra=GROUP_OPTIONS)
        if isinstance(max_len_events, bool) or not isinstance(max_len_events, int) or max_len_events < 0:
            raise InvalidArgument(f"max_len_events={max_len_events!r} must be an int >= 0")
        self.max_len_events = max_len_events
        self.skip_meta_update = skip_meta_update
        self.telemetry = resolve_telemetry(telemetry)

    async def _first_use(self) -> None:
        await super()._first_use()
        if not self.skip_meta_update:
            await self.client.hset(self.keys.meta, mapping={
                "opts.maxLenEvents": self.max_len_events, "version": LIBRARY_VERSION})

    # -- adding ---------------------------------------------------------------------------------
    def _prepare(self, name: str, data: Any, opts: Mapping[str, Any]) -> PreparedAdd:
        merged = merge_defaults(self.default_job_options, normalize_job_options(opts, extra=GROUP_OPTIONS))
        parent = merged.get("parent")
        if not parent:
            return prepare_add(self.keys, name, data, merged)
        # As Node's Job: parent.queue is the parent's qualified name ("<prefix>:<queue>").
        parent_key = f"{parent['queue']}:{parent['id']}"
        link: dict[str, Any] = {"id": parent["id"], "queueKey": parent["queue"]}
        for flag, short in (("failParentOnFailure", "fpof"), ("removeDependencyOnFailure", "rdof"),
                            ("ignoreDependencyOnFailure", "idof"), ("continueParentOnFailure", "cpof")):
            if merged.get(flag):
                link[short] = True
        return prepare_add(self.keys, name, data, merged, parent_key=parent_key,
                           parent_dependencies_key=f"{parent_key}:dependencies", parent=link)

    def _job_from(self, prepared: PreparedAdd, job_id: Any) -> Job:
        job = Job(self, prepared.name, prepared.data, from_wire(prepared.wire_opts), codec.to_str(job_id))
        job.timestamp = prepared.timestamp
        if prepared.opts.get("repeatJobKey"):
            job.repeat_job_key = prepared.opts["repeatJobKey"]
        dedup = prepared.opts.get("deduplication")
        if dedup:
            job.deduplication_id = dedup["id"]
        parent = prepared.opts.get("parent")
        if parent:
            job.parent_key = f"{parent['queue']}:{parent['id']}"
        return job

    def _check_result(self, prepared: PreparedAdd, result: Any) -> Any:
        if isinstance(result, BaseException):
            raise result
        if result == FLOW_PARENT_REFUSED and prepared.opts.get("group"):
            raise GroupJobRefused(f"group {prepared.opts['group']['id']!r}: a group job cannot be a flow child")
        if isinstance(result, int) and result < 0:
            parent = prepared.opts.get("parent")
            parent_key = f"{parent['queue']}:{parent['id']}" if parent else None
            raise script_error(result, job_id=prepared.job_id, command="addJob", parent_key=parent_key)
        return result

    async def add(self, name: str, data: Any = None, **opts: Any) -> Job:
        """Add one job. Options by Python or Node name: delay, priority, lifo, attempts, backoff,
        job_id, remove_on_complete, remove_on_fail, deduplication, keep_logs, size_limit, ...

        Bad input raises an `InvalidArgument` subclass before anything is written.
        """
        if self.telemetry is not None:
            return await self._add_traced(name, data, opts)
        prepared = self._prepare(name, data, opts)
        await self.wait_until_ready()
        result = (await self.call_scripts([(prepared.script, prepared.keys, prepared.args)]))[0]
        return self._job_from(prepared, self._check_result(prepared, result))

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
            prepared = self._prepare(name, data, self._with_trace_context(opts, metadata))
            await self.wait_until_ready()
            result = (await self.call_scripts([(prepared.script, prepared.keys, prepared.args)]))[0]
            job = self._job_from(prepared, self._check_result(prepared, result))
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
        prepared: list[PreparedAdd] = []
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
        results = await self.call_scripts([(p.script, p.keys, p.args) for p in prepared])
        return [self._job_from(p, self._check_result(p, r)) for p, r in zip(prepared, results)]

    # -- reading --------------------------------------------------------------------------------
    async def get_job_counts(self, *types: str) -> dict[str, int]:
        """Counts per state, e.g. ``{"waiting": 3, "active": 1}``; all states when none are named."""
        states = _types(types)
        await self.wait_until_ready()
        counts = await self.runner.call("getCounts", [self.keys.prefix_key], [_wire_state(t) for t in states])
        return {state: int(count or 0) for state, count in zip(states, counts)}

    async def get_job_count_by_types(self, *types: str) -> int:
        """The sum of `get_job_counts` over ``types`` (all states when none are named)."""
        return sum((await self.get_job_counts(*types)).values())

    async def count(self) -> int:
        """Jobs waiting to be processed: waiting, delayed, prioritized and waiting-children."""
        return await self.get_job_count_by_types("waiting", "delayed", "prioritized", "waiting-children")

    async def get_jobs(self, types: Optional[Iterable[str] | str] = None, start: int = 0, end: int = -1,
                       asc: bool = False) -> list[Job]:
        """Jobs in the given states, in Node's order, reading ids and hashes in one script call."""
        if isinstance(types, str):
            types = [types]
        states = _types(types or ())
        await self.wait_until_ready()
        wire_states: list[str] = []
        for state in states:
            if _wire_state(state) not in wire_states:
                wire_states.append(_wire_state(state))
        per_type = await self.runner.call("getJobs", [self.keys.prefix_key],
                                          [start, end, "1" if asc else "0", 5, *wire_states])
        seen: set[str] = set()
        jobs: list[Job] = []
        for entries in per_type or []:
            for job_id, flat in entries or []:
                job_id = codec.to_str(job_id)
                if job_id in seen:
                    continue
                seen.add(job_id)
                jobs.append(Job.from_raw(self, job_id, codec.flat_to_dict(flat)))
        return jobs

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
        key = self.keys.job(job_id) + ":logs"
        pipe = self.client.pipeline(transaction=True)
        if asc:
            pipe.lrange(key, start, end)
        else:
            pipe.lrange(key, -(end + 1), -(start + 1))
        pipe.llen(key)
        logs, count = await pipe.execute()
        logs = codec.to_str(logs)
        return {"logs": logs if asc else list(reversed(logs)), "count": int(count)}

    async def get_deduplication_job_id(self, deduplication_id: str) -> Optional[str]:
        """The id of the job that holds ``deduplication_id``, or None when no job does."""
        await self.wait_until_ready()
        return codec.to_str(await self.client.get(f"{self.keys.de}:{deduplication_id}"))

    async def remove_deduplication_key(self, deduplication_id: str) -> int:
        """Forget ``deduplication_id`` so the next add with it makes a new job; 1 when it was set."""
        await self.wait_until_ready()
        return int(await self.client.delete(f"{self.keys.de}:{deduplication_id}"))

    # -- managing -------------------------------------------------------------------------------
    async def _pause(self, pause: bool, emit: bool = True) -> int:
        k = self.keys
        src, dst = (k.wait, k.paused) if pause else (k.paused, k.wait)
        return int(await self.runner.call("pause", [src, dst, k.meta, k.prioritized, k.events, k.delayed,
                                                    k.marker], ["paused" if pause else "resumed",
                                                                "1" if emit else "0"]) or 0)

    async def pause(self) -> None:
        """Stop workers from taking new jobs of this queue (all languages)."""
        await self.wait_until_ready()
        await self._pause(True)

    async def resume(self) -> None:
        """Let workers (all languages) take jobs of this queue again after `pause`."""
        await self.wait_until_ready()
        emit = True
        while await self._pause(False, emit) > 0:  # legacy 'paused' lists are moved in batches
            emit = False

    async def is_paused(self) -> bool:
        """Whether the queue is paused (by any client, Python or Node)."""
        await self.wait_until_ready()
        return bool(await self.client.hexists(self.keys.meta, "paused"))

    async def drain(self, delayed: bool = False) -> None:
        """Remove waiting (and, with delayed=True, delayed) jobs; active ones are kept."""
        await self.wait_until_ready()
        k = self.keys
        await self.runner.call("drain", [k.wait, k.paused, k.delayed, k.prioritized, k.repeat],
                               [k.prefix_key, "1" if delayed else "0"])

    async def clean(self, grace: int, limit: int = 0, type: str = "completed") -> list[str]:
        """Remove jobs of one state older than ``grace`` ms (at most ``limit``, 0 = all); returns their ids."""
        if type not in _CLEANABLE:
            raise InvalidArgument(f"type={type!r} cannot be cleaned; one of {', '.join(sorted(_CLEANABLE))}")
        if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
            raise InvalidArgument(f"grace={grace!r} must be an int number of ms >= 0")
        await self.wait_until_ready()
        state = _wire_state(type)
        max_count = limit or float("inf")
        per_call = int(min(10000, max_count))
        timestamp = int(time.time() * 1000) - grace
        deleted: list[str] = []
        k = self.keys
        while len(deleted) < max_count:
            ids = codec.to_str(await self.runner.call(
                "cleanJobsInSet", [k[state], k.events, k.repeat], [k.prefix_key, timestamp, per_call, state]))
            deleted.extend(ids)
            if len(ids) < per_call:
                break
        return deleted

    async def obliterate(self, force: bool = False, count: int = 1000) -> None:
        """Delete the whole queue; refuses while jobs are active unless force=True."""
        await self.wait_until_ready()
        await self._pause(True)
        if not force and await self.client.llen(self.keys.active):  # refuse before deleting anything
            raise InvalidArgument(f"Cannot obliterate queue {self.name!r} with active jobs; pass force=True")
        # jobs held by our group gates are in waiting-children, which upstream's obliterate leaves
        async for gid in self.client.sscan_iter(self.keys.prefix_key + "grp:index", count=1000):
            await self.delete_group_jobs(codec.to_str(gid))
        while True:
            cursor = await self.runner.call("obliterate", [self.keys.meta, self.keys.prefix_key],
                                            [count, "force" if force else None])
            if cursor == -1:
                raise InvalidArgument("Cannot obliterate non-paused queue")
            if cursor == -2:
                raise InvalidArgument(f"Cannot obliterate queue {self.name!r} with active jobs; pass force=True")
            if not cursor:
                break
        # our group gates' keys (upstream's obliterate knows only its own)
        async for key in self.client.scan_iter(match=self.keys.prefix_key + "grp:*", count=1000):
            await self.client.delete(key)

    async def remove(self, job_id: str, remove_children: bool = True) -> int:
        """Remove a job; 1 when removed, 0 when it is locked by a worker."""
        await self.wait_until_ready()
        result = await self.runner.call("removeJob", [self.keys.job(job_id), self.keys.repeat],
                                        [job_id, 1 if remove_children else 0, self.keys.prefix_key])
        if isinstance(result, int) and result < 0:
            raise script_error(result, job_id=job_id, command="removeJob")
        return int(result)

    async def _move_jobs_to_wait(self, state: str, count: int, timestamp: float) -> None:
        k = self.keys
        keys = [k.prefix_key, k.events, k[state], k.wait, k.paused, k.meta, k.active, k.marker]
        if state != "delayed":
            # retries: group jobs go back behind their group's gate, the rest as upstream moves them
            script: Any = own_script("moveJobsToWaitGated-12.lua")
            keys += [k.waiting_children, k.prioritized, k.pc, k.delayed]
        else:
            script = "moveJobsToWait"
        while True:
            args = [count, timestamp, state] + ([int(time.time() * 1000)] if state != "delayed" else [])
            cursor = await self.runner.call(script, keys, args)
            if not cursor:
                break

    async def retry_jobs(self, count: int = 1000, state: str = "failed",
                         timestamp: Optional[int] = None) -> None:
        """Move failed (or completed) jobs finished before ``timestamp`` back to waiting."""
        if state not in ("failed", "completed"):
            raise InvalidArgument(f"state={state!r}: jobs can be retried from 'failed' or 'completed' only")
        await self.wait_until_ready()
        await self._move_jobs_to_wait(state, count, timestamp or int(time.time() * 1000))

    async def promote_jobs(self, count: int = 1000) -> None:
        """Move every delayed job to waiting now."""
        await self.wait_until_ready()
        await self._move_jobs_to_wait("delayed", count, 1.7976931348623157e308)

    async def set_global_concurrency(self, concurrency: int) -> None:
        """At most ``concurrency`` jobs of this queue active at once, across all workers and languages."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency={concurrency!r} must be an int >= 1")
        await self.wait_until_ready()
        await self.client.hset(self.keys.meta, "concurrency", concurrency)

    async def remove_global_concurrency(self) -> None:
        """Remove the limit set by `set_global_concurrency`."""
        await self.wait_until_ready()
        await self.client.hdel(self.keys.meta, "concurrency")

    async def set_global_rate_limit(self, max: int, duration: int) -> None:
        """At most ``max`` jobs per ``duration`` ms for the whole queue."""
        for label, value in (("max", max), ("duration", duration)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{label}={value!r} must be an int >= 1")
        await self.wait_until_ready()
        await self.client.hset(self.keys.meta, mapping={"max": max, "duration": duration})

    async def remove_global_rate_limit(self) -> None:
        """Remove the limit set by `set_global_rate_limit`."""
        await self.wait_until_ready()
        await self.client.hdel(self.keys.meta, "max", "duration")

    async def get_global_concurrency(self) -> Optional[int]:
        """The limit set by `set_global_concurrency`, or None."""
        await self.wait_until_ready()
        value = await self.client.hget(self.keys.meta, "concurrency")
        return int(value) if value is not None else None

    async def get_rate_limit_ttl(self, max_jobs: Optional[int] = None) -> int:
        """Milliseconds until the queue's rate limit lets jobs through again (0 or less: not limited)."""
        await self.wait_until_ready()
        return int(await self.runner.call("getRateLimitTtl", [self.keys.limiter, self.keys.meta],
                                          [max_jobs if max_jobs is not None else "0"]))

    # -- metrics and the events stream (issue #5) ------------------------------------------------
    async def get_metrics(self, type: str, start: int = 0, end: int = -1) -> dict[str, Any]:
        """Jobs finished per minute, newest first, as Node's getMetrics: ``{"meta": {"count",
        "prevTS", "prevCount"}, "data": [...], "count": n}`` (workers need ``metrics=`` to record)."""
        if type not in ("completed", "failed"):
            raise InvalidArgument(f"type={type!r}: metrics are kept for 'completed' and 'failed'")
        await self.wait_until_ready()
        meta, data, count = await self.runner.call(
            "getMetrics", [self.keys[f"metrics:{type}"], self.keys[f"metrics:{type}:data"]], [start, end])

        def number(value: Any) -> int:
            try:
                return int(float(codec.to_str(value)))
            except (TypeError, ValueError):
                return 0
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
        counts = await self.runner.call("getCountsPerPriority", [self.keys.wait, self.keys.prioritized], unique)
        return {str(priority): int(count or 0) for priority, count in zip(unique, counts)}

    async def trim_events(self, max_length: int) -> int:
        """Trim the events stream to about ``max_length`` entries; returns how many were removed."""
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
            raise InvalidArgument(f"max_length={max_length!r} must be an int >= 0")
        await self.wait_until_ready()
        return int(await self.client.xtrim(self.keys.events, maxlen=max_length, approximate=True))
