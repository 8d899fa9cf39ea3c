"""The Redis backend: each queue semantic of the contract as upstream's Lua script (or ours)."""
from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Awaitable, Iterator, Mapping, Optional, Sequence

import redis.exceptions as redis_exc

from bullmq_compat._backends.base import (
    EventsReader,
    FinishJob,
    JobFields,
    NewJob,
    NextJob,
    QueueBackend,
    QueueFigures,
    WorkerChannel,
    WorkerSettings,
    metrics_total,
)
from bullmq_compat._backends.redis.adding import PlainAdd, PreparedAdd, checked_data, prepare_add
from bullmq_compat._backends.redis.channel import Channel, FastChannel, blocking_client, open_channel
from bullmq_compat._backends.redis.connection import Connection, RedisHandle
from bullmq_compat._backends.redis.fastconn import FastPathUnavailable, ReplyError
from bullmq_compat._backends.redis.keys import QueueKeys
from bullmq_compat._backends.redis.lua import Script, own_script, upstream_scripts
from bullmq_compat._backends.redis.runner import Call, ScriptRunner, _argv
from bullmq_compat._backends.redis.worker_calls import WorkerCalls, WorkerWireOptions, parse_next_job
from bullmq_compat._errors import BullMQCompatError, InvalidArgument, InvalidJobOptions, script_error
from bullmq_compat._wire import codec

#: what means "Redis could not be reached" (retried with back-off by workers and QueueEvents)
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError, ConnectionError, redis_exc.ConnectionError, redis_exc.TimeoutError, asyncio.TimeoutError)
# Replies of a server that takes no writes for now (a failover, a resync, a cluster change): the
# command did not run (a script stops at its first write), so it is safely sent again.
# (redis-py strips the codes it knows from the message and raises its own classes for them)
# OOM (maxmemory reached, noeviction): a script is refused only at a first write (once it wrote,
# Redis lets it finish), so a refused script wrote nothing either; workers retry it once memory frees.
TRANSIENT_REPLIES = frozenset({"READONLY", "NOREPLICAS", "MASTERDOWN", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "OOM"})
_TRANSIENT_ERRORS = (*CONNECTION_ERRORS, redis_exc.ReadOnlyError, redis_exc.TryAgainError,
                     redis_exc.ClusterDownError, redis_exc.BusyLoadingError, redis_exc.OutOfMemoryError)

#: any error Redis or redis-py raises
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis_exc.RedisError,)

_WIRE_STATE = {"waiting": "wait"}


def _to_int(value: Any) -> Optional[int]:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def wire_state(state: str) -> str:
    return _WIRE_STATE.get(state, state)


class RedisBackend(QueueBackend):
    """One queue on Redis: its keys, the shared redis-py client, the scripts and the fast channel."""

    kind = "redis"
    label = "Redis"
    transient_errors = CONNECTION_ERRORS

    def __init__(self, name: str, connection: Connection, *, prefix: str = "bull",
                 handle: Optional[RedisHandle] = None) -> None:
        self.name = name
        self.prefix = prefix
        self.keys = QueueKeys(prefix, name)
        self.qualified_name = self.keys.qualified_name
        self._handle = handle or RedisHandle(connection)
        self._owns_handle = handle is None
        self.client: Any = self._handle.client
        self.is_cluster = self._handle.is_cluster
        self.runner = ScriptRunner(self.client)
        # the pipelined hiredis connection for hot script calls (adds); False once known unusable
        self._fast: Any = None
        self._fast_opening: Optional[asyncio.Future[Any]] = None
        self._connected: Optional[asyncio.Future[None]] = None

    @property
    def description(self) -> str:
        return self._handle.description

    def is_transient(self, err: BaseException) -> bool:
        """Connection trouble, or a reply of a server that cannot take writes for now."""
        return isinstance(err, _TRANSIENT_ERRORS) or (
            isinstance(err, redis_exc.ResponseError) and str(err).split(" ", 1)[0] in TRANSIENT_REPLIES)

    def client_name(self, suffix: str = "") -> str:
        """Upstream's connection name, ``<prefix>:<base64(queue)><suffix>``, as CLIENT LIST shows it."""
        return f"{self.prefix}:{base64.b64encode(self.name.encode()).decode()}{suffix}"

    # -- life cycle ------------------------------------------------------------------------
    async def connect(self) -> None:
        await self._handle.check()

    async def ready(self) -> None:
        """`connect` once (again after a failure), however many callers wait."""
        if self._connected is None:
            self._connected = asyncio.ensure_future(self.connect())
        try:
            await asyncio.shield(self._connected)
        except BaseException:
            self._connected = None
            raise

    # -- the group gate (Redis only) ---------------------------------------------------------
    def groups(self) -> Any:
        from bullmq_compat._backends.redis.groups import RedisGroups

        return RedisGroups(self)

    def group_keeper(self, *, sweep_interval: float, follow_stream: bool) -> Any:
        from bullmq_compat._backends.redis.groups import GroupKeeper

        return GroupKeeper.for_queue(self, sweep_interval=sweep_interval, follow_stream=follow_stream)

    async def close(self) -> None:
        if self._fast:
            await self._fast.close()
        if self._owns_handle:
            await self._handle.close()

    async def disconnect(self) -> None:
        """Drop the fast channel and (when we opened it) the client's connections; redis-py opens
        new ones on the next command, and the fast channel is opened again on the next add."""
        fast, self._fast = self._fast, None
        self._connected = None
        if fast:
            await fast.close()
        if self._owns_handle:
            await self._handle.close()

    def for_queue(self, name: str, prefix: Optional[str] = None) -> "RedisBackend":
        return RedisBackend(name, None, prefix=prefix or self.prefix, handle=self._handle)

    def split_job_key(self, key: str) -> tuple[Optional[str], str, str]:
        """``<prefix>:<queue>:<id>``: the prefix may hold colons, a queue name holds none."""
        last = key.rfind(":")
        previous = key.rfind(":", 0, last) if last > 0 else -1
        if last == -1 or previous == -1:
            parts = (key.split(":") + ["", "", ""])[:3]
            return parts[0], parts[1], parts[2]
        return key[:previous], key[previous + 1:last], key[last + 1:]

    async def fast_channel(self) -> Optional[Any]:
        """The fast channel for this queue's hot script calls, or None where redis-py must serve
        (Redis Cluster, Sentinel-managed pools, unknown connection classes)."""
        if self._fast is None:
            if self.is_cluster:
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
        channel = self._fast or await self.fast_channel()
        if channel is None:
            return list(await self.runner.call_many(list(calls)))
        return list(await channel.call_many(list(calls), raise_errors=False))

    def submit_prepared(self, prepared: Sequence[PreparedAdd]) -> Optional[Awaitable[list[Any]]]:
        """`add_prepared` in two steps: the adds are written now, and the awaitable returned gives
        their replies, so that the caller works (builds its Job objects) while Redis runs them.
        None where that does not serve (no fast channel open yet): then call `add_prepared`."""
        channel = self._fast
        if not channel:
            return None
        calls = [(p.script, p.keys, p.args) for p in prepared]
        futures = channel.submit(calls)
        return None if futures is None else channel.collect(calls, futures, raise_errors=False)

    async def _run(self, script: Any, keys: list[Any], args: list[Any], *, job_id: str = "",
                   state: str = "", command: str = "") -> Any:
        result = await self.runner.call(script, keys, args)
        if isinstance(result, int) and result < 0:
            raise script_error(result, job_id=job_id, command=command or str(script), state=state)
        return result

    # -- adding ------------------------------------------------------------------------------
    def submit_one(self, prepared: PreparedAdd) -> Optional[Awaitable[Any]]:
        """`submit_prepared` of one add (its reply, not a list of one)."""
        channel = self._fast
        if not channel:
            return None
        call = (prepared.script, prepared.keys, prepared.args)
        future = channel.submit_one(call)
        return None if future is None else channel.reply_of(call, future)

    def plain_add(self, merged: Mapping[str, Any]) -> Optional[PlainAdd]:
        """What every add of a queue whose merged defaults are ``merged`` sends when it gives no
        options of its own; None where its defaults make each add's arguments its own."""
        return PlainAdd.of(self.keys, merged)

    def submit_plain(self, plain: PlainAdd, name: str, data: Any) -> Optional[tuple[int, Awaitable[Any], Call]]:
        """`submit_one` of a `PlainAdd`: its timestamp, its reply's future and its call (for
        `reply_after`, where the future raises); None where no fast channel is open (then add it
        the general way)."""
        channel = self._fast
        if not channel:
            return None
        timestamp, _, call = plain.call(name, data)  # refuses bad input before anything is written
        future = channel.submit_one(call)
        return None if future is None else (timestamp, future, call)

    async def reply_after(self, call: Call, err: Exception) -> Any:
        """The reply of a `submit_plain` call whose future raised ``err`` (`FastChannel.reply_after`)."""
        channel = self._fast
        return await channel.reply_after(call, err) if channel else err

    def check_add(self, job: NewJob) -> str:
        """Everything that can refuse ``job`` (its data's JSON text is returned, for `submit_new`).
        Only `Queue.add_bulk` calls it: a group ``max_size`` is refused there (as BullMQ Pro does),
        since the bulk's adds are separate script calls and a refusal could not undo the others."""
        group = job.opts.get("group")
        if isinstance(group, dict) and "maxSize" in group:
            raise InvalidJobOptions(
                f"option group={group!r}: max_size is not supported in add_bulk on Redis (as in BullMQ Pro: its "
                "adds are separate script calls, so a full group could not refuse the bulk as a whole); add such "
                "jobs one by one with add(), or drop max_size")
        return checked_data(job.name, job.data, job.opts)

    def submit_new(self, jobs: Sequence[NewJob], data_json: Sequence[str]
                   ) -> Optional[tuple[list[PreparedAdd], Awaitable[list[Any]]]]:
        """`submit_prepared` for jobs `check_add` passed: each is prepared and written in turn, so
        Redis runs the first adds while the later ones are still being encoded. The prepared adds
        and the awaitable of their replies; None where that does not serve (then prepare and send)."""
        channel = self._fast
        if not channel or not channel.is_open:
            return None
        prepared: list[PreparedAdd] = []
        calls: list[Call] = []

        def each() -> Iterator[Call]:
            for job, text in zip(jobs, data_json):
                p = self.prepare(job, data_json=text)
                prepared.append(p)
                call = (p.script, p.keys, p.args)
                calls.append(call)
                yield call
        futures = channel.submit(each())
        assert futures is not None
        return prepared, channel.collect(calls, futures, raise_errors=False)

    def prepare(self, job: NewJob, *, data_json: Optional[str] = None, **link: Any) -> PreparedAdd:
        """Validate and encode one add (refusing bad input before anything is sent)."""
        opts = job.opts
        parent = opts.get("parent")
        if parent and "parent_key" not in link:
            # As Node's Job: parent.queue is the parent's qualified name ("<prefix>:<queue>").
            parent_key = f"{parent['queue']}:{parent['id']}"
            flags = {"failParentOnFailure": "fpof", "removeDependencyOnFailure": "rdof",
                     "ignoreDependencyOnFailure": "idof", "continueParentOnFailure": "cpof"}
            parent_link: dict[str, Any] = {"id": parent["id"], "queueKey": parent["queue"]}
            for flag, short in flags.items():
                if opts.get(flag):
                    parent_link[short] = True
            link = {"parent_key": parent_key, "parent_dependencies_key": f"{parent_key}:dependencies",
                    "parent": parent_link, **link}
        return prepare_add(self.keys, job.name, job.data, opts, data_json=data_json, **link)

    async def add_prepared(self, prepared: Sequence[PreparedAdd]) -> list[Any]:
        """Send prepared adds in one round trip; per item the id, or the error (an int code < 0 or
        an exception) the script answered."""
        return await self.call_scripts([(p.script, p.keys, p.args) for p in prepared])

    async def add_jobs(self, jobs: Sequence[NewJob]) -> list[Any]:
        return await self.add_prepared([self.prepare(job) for job in jobs])

    def prepare_flow_node(self, job: NewJob, *, parent_key: Optional[str], parent_link: Optional[dict[str, Any]],
                          has_children: bool) -> PreparedAdd:
        """One node of a flow, for `add_flow`: a parent is added to waiting-children, and its release
        (when it has no pending children left) waits until every node of the flow is added."""
        prepared = prepare_add(
            self.keys, job.name, job.data, job.opts, job_id=job.job_id, parent_key=parent_key,
            parent_dependencies_key=f"{parent_key}:dependencies" if parent_key else None, parent=parent_link,
            add_to_waiting_children=has_children, defer_parent_release=True)
        prepared.parent_key = parent_key
        prepared.parent_link = parent_link
        setattr(prepared, "job_key", self.keys.job(job.job_id))  # what its children's parent_key names
        return prepared

    async def add_flow(self, nodes: Sequence[Any]) -> list[Any]:
        """Every node's add, then each parent's release, in one MULTI/EXEC; per node its script's reply."""
        now = int(time.time() * 1000)
        calls: list[tuple[Script, list[Any], list[Any]]] = [(n.script, n.keys, n.args) for n in nodes]
        release = upstream_scripts()["releaseParentIfNoPendingDependencies"]
        parents: dict[str, dict[str, Any]] = {}
        for node in nodes:
            if node.parent_key and node.parent_link:
                parents[node.parent_key] = node.parent_link
        for parent_key, link in parents.items():
            calls.append((release, [parent_key, f"{parent_key}:dependencies"], [link["queueKey"], link["id"], now]))
        # parents named from outside this call (a root's parent=): checked under WATCH, so that a
        # missing one writes nothing at all (the scripts would refuse that tree's nodes, but the
        # other trees of an add_bulk would be written)
        own = {getattr(node, "job_key", None) for node in nodes}
        external = sorted({key for key in parents if key not in own})
        results = await self._transaction(calls, must_exist=external)
        for result in results[len(nodes):]:
            if isinstance(result, BaseException):
                raise result
        return results[:len(nodes)]

    async def _transaction(self, calls: list[tuple[Script, list[Any], list[Any]]],
                           must_exist: Sequence[str] = ()) -> list[Any]:
        """All calls in one MULTI/EXEC. Scripts are loaded first: a NOSCRIPT inside the transaction
        would fail that one call and let the others run, breaking the all-or-nothing add.

        ``must_exist``: keys (external flow parents) checked under WATCH first; a missing one
        raises `ParentJobNotFound` with nothing sent, and a change to one before EXEC (the
        transaction is then dropped by Redis) makes the check run again."""
        scripts = list({script.sha: script for script, _, _ in calls}.values())
        loaded = await self.client.script_exists(*(s.sha for s in scripts))
        for script, present in zip(scripts, loaded):
            if not present:
                await self.client.script_load(script.lua)
        if must_exist and self.is_cluster:
            # redis-py's cluster pipeline cannot run commands between WATCH and MULTI: check plainly
            # (a parent removed in the instant before EXEC would leave that one tree refused)
            for key in must_exist:
                if not await self.client.exists(key):
                    raise script_error(-5, command="addJob", parent_key=key)
            must_exist = ()
        for _ in range(100):
            async with self.client.pipeline(transaction=True) as pipe:
                if must_exist:
                    await pipe.watch(*must_exist)
                    for key in must_exist:
                        if not await pipe.exists(key):
                            await pipe.reset()
                            raise script_error(-5, command="addJob", parent_key=key)
                    pipe.multi()
                for script, keys, args in calls:
                    # execute_command, not pipe.evalsha: a RedisCluster pipeline blocks its evalsha method
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *_argv(keys, args))
                try:
                    results = list(await pipe.execute(raise_on_error=False))
                except redis_exc.WatchError:
                    continue  # a parent changed meanwhile: check again
                break
        else:
            raise BullMQCompatError("the flow's parents kept changing during the add; nothing was written")
        if any(isinstance(r, redis_exc.NoScriptError) or (
                isinstance(r, redis_exc.ResponseError) and str(r).startswith("NOSCRIPT")) for r in results):
            raise BullMQCompatError(
                "Redis dropped the flow scripts during the add (SCRIPT FLUSH or a restart?): "
                "part of the flow may be missing; check it with get_flow")
        return results

    # -- reading -----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> Optional[JobFields]:
        raw = await self.client.hgetall(self.keys.job(job_id))
        return codec.str_dict(raw) if raw else None

    async def get_state(self, job_id: str) -> str:
        k = self.keys
        state = await self.runner.call("getStateV2", [
            k.completed, k.failed, k.delayed, k.active, k.wait, k.paused, k.waiting_children,
            k.prioritized], [job_id])
        return str(codec.to_str(state))

    async def is_finished(self, job_id: str) -> tuple[int, Optional[str]]:
        k = self.keys
        reply = await self.runner.call("isFinished", [k.completed, k.failed, k.job(job_id)], [job_id, "1"])
        status = int(reply[0]) if isinstance(reply, list) else int(reply)
        result = codec.to_str(reply[1]) if isinstance(reply, list) and len(reply) > 1 else None
        return status, (str(result) if result is not None else None)

    def _counts_call(self, states: Sequence[str], delayed_timestamp: Optional[int] = None) -> Call:
        cutoff: list[Any] = [] if delayed_timestamp is None else [int(delayed_timestamp)]
        return self.runner.script("getCounts"), [self.keys.prefix_key], [*cutoff, *(wire_state(t) for t in states)]

    async def get_counts(self, states: Sequence[str], delayed_timestamp: Optional[int] = None) -> list[int]:
        counts = await self.runner.call(*self._counts_call(states, delayed_timestamp))
        return [int(count or 0) for count in counts]

    def _jobs_call(self, states: Sequence[str], start: int, end: int, asc: bool) -> Call:
        wire_states: list[str] = []
        for state in states:
            if wire_state(state) not in wire_states:
                wire_states.append(wire_state(state))
        return self.runner.script("getJobs"), [self.keys.prefix_key], [start, end, "1" if asc else "0", 5, *wire_states]

    async def get_jobs(self, states: Sequence[str], start: int, end: int, asc: bool
                       ) -> list[tuple[str, JobFields]]:
        return self._jobs_from(await self.runner.call(*self._jobs_call(states, start, end, asc)))

    @staticmethod
    def _jobs_from(per_type: Any) -> list[tuple[str, JobFields]]:
        seen: set[str] = set()
        jobs: list[tuple[str, JobFields]] = []
        for entries in per_type or []:
            for job_id, flat in entries or []:
                job_id = codec.to_str(job_id)
                if job_id in seen:
                    continue
                seen.add(job_id)
                jobs.append((job_id, codec.flat_to_dict(flat)))
        return jobs

    async def get_job_logs(self, job_id: str, start: int, end: int, asc: bool) -> tuple[list[str], int]:
        key = self.keys.job(job_id) + ":logs"
        pipe = self.client.pipeline(transaction=True)
        if asc:
            pipe.lrange(key, start, end)
        else:
            pipe.lrange(key, -(end + 1), -(start + 1))
        pipe.llen(key)
        logs, count = await pipe.execute()
        logs = codec.to_str(logs)
        return (logs if asc else list(reversed(logs))), int(count)

    async def get_counts_per_priority(self, priorities: Sequence[int]) -> list[int]:
        counts = await self.runner.call("getCountsPerPriority", [self.keys.wait, self.keys.prioritized],
                                        list(priorities))
        return [int(count or 0) for count in counts]

    def _metrics_call(self, type: str, start: int, end: int) -> Call:
        return (self.runner.script("getMetrics"), [self.keys[f"metrics:{type}"], self.keys[f"metrics:{type}:data"]],
                [start, end])

    async def get_metrics(self, type: str, start: int, end: int) -> tuple[list[Any], list[Any], int]:
        meta, data, count = await self.runner.call(*self._metrics_call(type, start, end))
        return list(meta or []), list(data or []), int(count)

    async def get_figures(self, states: Sequence[str]) -> QueueFigures:
        """The scrape's reads in one pipelined round trip (counts, both metrics totals, the next
        waiting and prioritized jobs), beside CLIENT LIST for the workers."""
        replies, clients = await asyncio.gather(self.runner.call_many([
            self._counts_call(states), self._metrics_call("completed", 0, 0), self._metrics_call("failed", 0, 0),
            self._jobs_call(["waiting", "prioritized"], 0, 0, True)]), self.get_client_list())
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        counts, completed, failed, waiting = replies
        return QueueFigures(counts=[int(c or 0) for c in counts], completed_total=metrics_total(completed[0] or []),
                            failed_total=metrics_total(failed[0] or []),
                            next_waiting=[fields for _, fields in self._jobs_from(waiting)], workers=len(clients))

    async def get_rate_limit_ttl(self, max_jobs: Optional[int]) -> int:
        return int(await self.runner.call("getRateLimitTtl", [self.keys.limiter, self.keys.meta],
                                          [max_jobs if max_jobs is not None else "0"]))

    async def get_deduplication_job_id(self, deduplication_id: str) -> Optional[str]:
        found = codec.to_str(await self.client.get(f"{self.keys.de}:{deduplication_id}"))
        return str(found) if found is not None else None

    async def get_client_list(self) -> list[dict[str, str]]:
        """CLIENT LIST parsed; on a Cluster, the node listing the most clients of this queue."""
        unnamed, named = self.client_name(), self.client_name(":w:")
        return await self._clients(lambda name: name == unnamed or name.startswith(named))

    async def _clients(self, matches: Any) -> list[dict[str, str]]:
        """CLIENT LIST's clients whose name ``matches``; on a Cluster, the node listing most of them."""
        if self.is_cluster:
            per_node = await self.client.execute_command("CLIENT LIST", target_nodes=self.client.ALL_NODES)
            listings = list(per_node.values()) if isinstance(per_node, dict) else [per_node]
        else:
            listings = [await self.client.execute_command("CLIENT", "LIST")]
        best: list[dict[str, str]] = []
        for listing in listings:
            lines = codec.to_str(listing)
            if isinstance(lines, str):
                lines = lines.splitlines()
            clients = []
            for line in lines or []:
                # a raw line, or a dict when redis-py's cluster client parsed it
                fields = dict(line) if isinstance(line, dict) else dict(
                    kv.split("=", 1) for kv in str(line).split(" ") if "=" in kv)
                name = fields.get("name", "")
                if name and matches(name):
                    clients.append(fields)
            if len(clients) > len(best):
                best = clients
        return best

    async def get_queue_events_clients(self) -> list[dict[str, str]]:
        """CLIENT LIST's connections named ``<client name>:qe`` (on a Cluster, the node listing most)."""
        return await self._clients(lambda name, qe=self.client_name(":qe"): name == qe)

    async def is_maxed(self) -> bool:
        return bool(await self.runner.call("isMaxed", [self.keys.meta, self.keys.active]))

    async def paginate_dependencies(self, parent_id: str, type: str, start: int, end: int) -> dict[str, Any]:
        """Upstream's paginate script over ``<parent>:processed`` (a hash) or ``:dependencies`` (a
        set), called as Node's paginate calls it: up to 5 SCAN rounds a call, until the page is
        full or the cursor is back at 0."""
        key = self.keys.job(f"{parent_id}:{'processed' if type == 'processed' else 'dependencies'}")
        page_size = end - start + 1 if end >= 0 else float("inf")
        cursor: Any = "0"
        offset: Any = 0
        page: list[Any] = []
        jobs: list[JobFields] = []
        total = 0
        while True:
            reply = await self.runner.call("paginate", [key], [start + len(page), end, cursor, offset, 5, 1])
            cursor, offset, items, total = reply[0], reply[1], reply[2], reply[3]
            raw_jobs = reply[4] if len(reply) > 4 else None
            page.extend(items or [])
            for flat in raw_jobs or []:
                jobs.append(codec.flat_to_dict(flat))
            if str(codec.to_str(cursor)) == "0" or len(page) >= page_size:
                break
        out: list[dict[str, Any]] = []
        for item in page:
            if isinstance(item, (list, tuple)):
                child, value = codec.to_str(item[0]), codec.to_str(item[1])
                try:
                    out.append({"id": child, "v": codec.loads(value)})
                except ValueError as err:
                    out.append({"id": child, "err": str(err)})
            else:
                out.append({"id": codec.to_str(item)})
        return {"items": out, "jobs": jobs, "total": int(total or 0)}

    async def remove_orphaned_jobs(self, count: int, limit: int) -> int:
        """Node's removeOrphanedJobs: SCAN ``<prefix>:<queue>:*``, take the job ids among the keys
        (not the queue's own keys, nor their sub-keys), and let upstream's script delete, atomically
        per batch, those no state lists. Our group gate's keys (``grp:``) and upstream's
        deduplication-next keys (``dn:``) are skipped too."""
        from bullmq_compat._backends.redis.keys import QUEUE_KEY_TYPES

        base = self.keys.prefix_key
        states = [t for t in QUEUE_KEY_TYPES if t]
        infrastructure = set(QUEUE_KEY_TYPES) | {"grp", "dn"}
        sub_keys = ["logs", "dependencies", "processed", "failed", "unsuccessful", "lock"]
        removed = 0
        candidates: list[str] = []
        checked: set[str] = set()  # ids sent once already: a job's key and its sub-keys can come in different batches
        seen = 0

        async def check() -> int:
            found = int(await self.runner.call("removeOrphanedJobs", [base], [
                len(states), *states, len(sub_keys), *sub_keys, *candidates]) or 0)
            candidates.clear()
            return found

        # scan_iter: SCAN rounds of about ``count`` keys (on a Cluster, over every node); the
        # candidates are checked each ``count`` keys scanned, as Node checks each SCAN reply
        async for key in self.client.scan_iter(match=_glob_escape(base) + "*", count=count):
            seen += 1
            suffix = codec.to_str(key)[len(base):]
            job_id, colon, sub = suffix.partition(":")
            if not (suffix in infrastructure or (colon and (job_id in infrastructure or sub not in sub_keys))) \
                    and job_id not in checked:
                candidates.append(job_id)
                checked.add(job_id)
            if seen % count == 0 and candidates:
                removed += await check()
                if limit > 0 and removed >= limit:
                    return removed
        if candidates:
            removed += await check()
        return removed

    # -- queue meta --------------------------------------------------------------------------
    async def set_meta(self, values: Mapping[str, Any]) -> None:
        await self.client.hset(self.keys.meta, mapping=dict(values))

    async def get_meta_field(self, field: str) -> Optional[str]:
        value = codec.to_str(await self.client.hget(self.keys.meta, field))
        return str(value) if value is not None else None

    async def get_meta(self) -> dict[str, str]:
        return codec.str_dict(await self.client.hgetall(self.keys.meta))

    async def remove_meta_fields(self, fields: Sequence[str]) -> int:
        return int(await self.client.hdel(self.keys.meta, *fields))

    # -- changing one job --------------------------------------------------------------------
    async def update_data(self, job_id: str, data_json: str) -> None:
        await self._run("updateData", [self.keys.job(job_id)], [data_json], job_id=job_id)

    async def update_progress(self, job_id: str, progress_json: str) -> None:
        k = self.keys
        await self._run("updateProgress", [k.job(job_id), k.events, k.meta], [job_id, progress_json], job_id=job_id)

    async def add_log(self, job_id: str, row: str, keep_logs: Optional[int]) -> int:
        key = self.keys.job(job_id)
        return int(await self._run("addLog", [key, key + ":logs"], [job_id, row, keep_logs if keep_logs else ""],
                                   job_id=job_id))

    async def clear_logs(self, job_id: str, keep_logs: Optional[int] = None) -> None:
        key = self.keys.job(job_id) + ":logs"
        if keep_logs:
            await self.client.ltrim(key, -keep_logs, -1)
        else:
            await self.client.delete(key)

    async def remove(self, job_id: str, remove_children: bool) -> int:
        result = await self._run("removeJob", [self.keys.job(job_id), self.keys.repeat],
                                 [job_id, 1 if remove_children else 0, self.keys.prefix_key],
                                 job_id=job_id, command="removeJob")
        return int(result)

    async def reprocess_job(self, job_id: str, state: str, lifo: bool, reset_attempts_made: bool,
                            reset_attempts_started: bool, group_id: Optional[str] = None) -> None:
        k = self.keys
        result = 0
        if group_id is not None:
            # a group job goes back behind its group's gate (held, or waiting if its group is free)
            from bullmq_compat._backends.redis.groups import update_call

            flags = f"{state}:{int(reset_attempts_made)}{int(reset_attempts_started)}"
            script, gate_keys, args = update_call(k, "retry", job_id, flags)
            result = await self.runner.call(script, gate_keys, args)
        if result == 0:  # not a job the gate held: as upstream
            result = await self.runner.call("reprocessJob", [
                k.job(job_id), k.events, k[state], k.wait, k.meta, k.active, k.marker, k.prioritized, k.pc,
            ], [job_id, ("R" if lifo else "L") + "PUSH", "failedReason" if state == "failed" else "returnvalue",
                state, "1" if reset_attempts_made else "0", "1" if reset_attempts_started else "0"])
        if result != 1:
            raise script_error(result, job_id=job_id, command="reprocessJob", state=state)

    async def promote(self, job_id: str) -> None:
        k = self.keys
        await self._run("promote", [k.delayed, k.wait, k.paused, k.meta, k.prioritized, k.active, k.pc, k.events,
                                    k.marker], [k.prefix_key, job_id], job_id=job_id, state="delayed")

    async def change_delay(self, job_id: str, delay: int, now: int) -> None:
        k = self.keys
        await self._run("changeDelay", [k.delayed, k.meta, k.marker, k.events],
                        [delay, str(now), job_id, k.job(job_id)], job_id=job_id, state="delayed")

    async def change_priority(self, job_id: str, priority: int, lifo: bool) -> None:
        k = self.keys
        await self._run("changePriority", [k.wait, k.paused, k.meta, k.prioritized, k.active, k.pc, k.marker],
                        [priority, k.prefix_key, job_id, 1 if lifo else 0], job_id=job_id)

    # -- managing the queue ------------------------------------------------------------------
    async def _pause(self, pause: bool, emit: bool = True) -> int:
        k = self.keys
        src, dst = (k.wait, k.paused) if pause else (k.paused, k.wait)
        return int(await self.runner.call("pause", [src, dst, k.meta, k.prioritized, k.events, k.delayed,
                                                    k.marker], ["paused" if pause else "resumed",
                                                                "1" if emit else "0"]) or 0)

    async def pause(self, paused: bool) -> None:
        if paused:
            await self._pause(True)
            return
        emit = True
        while await self._pause(False, emit) > 0:  # legacy 'paused' lists are moved in batches
            emit = False

    async def drain(self, delayed: bool) -> None:
        k = self.keys
        await self.runner.call("drain", [k.wait, k.paused, k.delayed, k.prioritized, k.repeat],
                               [k.prefix_key, "1" if delayed else "0"])

    async def clean(self, state: str, timestamp: int, limit: int) -> list[str]:
        state = wire_state(state)
        max_count = limit or float("inf")
        per_call = int(min(10000, max_count))
        deleted: list[str] = []
        k = self.keys
        while len(deleted) < max_count:
            ids = codec.to_str(await self.runner.call(
                "cleanJobsInSet", [k[state], k.events, k.repeat], [k.prefix_key, timestamp, per_call, state]))
            deleted.extend(ids)
            if len(ids) < per_call:
                break
        if state == "waiting-children" and deleted:  # jobs held by our group gates may be among them
            await self._prune_group_bookkeeping()
        return deleted

    async def _prune_group_bookkeeping(self) -> None:
        """After upstream's clean of waiting-children (it knows nothing of our gates): each group
        forgets the held jobs it deleted, so counts and listings match what is there."""
        from bullmq_compat._backends.redis.groups import update_call

        async for gid in self.client.sscan_iter(self.keys.prefix_key + "grp:index", count=1000):
            script, keys, args = update_call(self.keys, "prune", codec.to_str(gid))
            await self.runner.call(script, keys, args)

    async def obliterate(self, force: bool, count: int) -> None:
        from bullmq_compat._backends.redis.groups import delete_group_jobs

        await self._pause(True)
        if not force and await self.client.llen(self.keys.active):  # refuse before deleting anything
            raise InvalidArgument(f"Cannot obliterate queue {self.name!r} with active jobs; pass force=True")
        # jobs held by our group gates are in waiting-children, which upstream's obliterate leaves
        async for gid in self.client.sscan_iter(self.keys.prefix_key + "grp:index", count=1000):
            await delete_group_jobs(self, codec.to_str(gid))
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

    async def retry_jobs(self, state: str, count: int, timestamp: int) -> None:
        await self._move_jobs_to_wait(state, count, timestamp)

    async def promote_jobs(self, count: int) -> None:
        await self._move_jobs_to_wait("delayed", count, 1.7976931348623157e308)

    async def set_rate_limit(self, expire_ms: int) -> None:
        # Node stores Number.MAX_SAFE_INTEGER: above any limiter max, so every worker (and the
        # queue's global rate limit) sees the queue as limited until the key expires
        await self.client.set(self.keys.limiter, str(2**53 - 1), px=expire_ms)

    async def remove_rate_limit_key(self) -> int:
        return int(await self.client.delete(self.keys.limiter))

    async def remove_deduplication_key(self, deduplication_id: str, job_id: Optional[str] = None) -> int:
        key = f"{self.keys.de}:{deduplication_id}"
        if job_id is None:
            return int(await self.client.delete(key))
        return int(await self.runner.call("removeDeduplicationKey", [key], [job_id]) or 0)

    async def trim_events(self, max_length: int) -> int:
        return int(await self.client.xtrim(self.keys.events, maxlen=max_length, approximate=True))

    async def publish_event(self, fields: Mapping[str, Any], max_events: int) -> str:
        return str(codec.to_str(await self.client.xadd(
            self.keys.events, dict(fields), maxlen=max_events, approximate=True)))

    # -- flows --------------------------------------------------------------------------------
    def _child_key(self, job_id: str, kind: str) -> str:
        return self.keys.job(f"{job_id}:{kind}")

    async def get_processed_children_values(self, job_id: str) -> dict[str, str]:
        return codec.str_dict(await self.client.hgetall(self._child_key(job_id, "processed")))

    async def get_ignored_children_failures(self, job_id: str) -> dict[str, str]:
        return codec.str_dict(await self.client.hgetall(self._child_key(job_id, "failed")))

    async def get_dependencies(self, job_id: str, pages: Mapping[str, Optional[tuple[int, int]]]) -> dict[str, Any]:
        """The children by state (``processed``/``ignored`` as {key: text}, ``unprocessed``/``failed``
        as [key]); with pages, one page of each asked state and ``next_<state>_cursor``."""
        ck = self._child_key
        pipe = self.client.pipeline(transaction=False)
        if all(page is None for page in pages.values()):
            pipe.hgetall(ck(job_id, "processed"))
            pipe.smembers(ck(job_id, "dependencies"))
            pipe.hgetall(ck(job_id, "failed"))
            pipe.zrange(ck(job_id, "unsuccessful"), 0, -1)
            done, pending, ignored_map, unsuccessful = await pipe.execute()
            return {
                "processed": codec.str_dict(done),
                "unprocessed": sorted(codec.to_str(list(pending))),
                "failed": codec.to_str(list(unsuccessful)),
                "ignored": codec.str_dict(ignored_map),
            }
        asked = [name for name, page in pages.items() if page is not None]
        for name in asked:
            cursor, count = pages[name]  # type: ignore[misc]
            if name == "processed":
                pipe.hscan(ck(job_id, "processed"), cursor, count=count)
            elif name == "unprocessed":
                pipe.sscan(ck(job_id, "dependencies"), cursor, count=count)
            elif name == "ignored":
                pipe.hscan(ck(job_id, "failed"), cursor, count=count)
            else:
                pipe.zrange(ck(job_id, "unsuccessful"), cursor, cursor + count - 1)
        out: dict[str, Any] = {}
        for name, reply in zip(asked, await pipe.execute()):
            if name == "failed":
                out["failed"] = codec.to_str(list(reply))
                cursor, count = pages["failed"]  # type: ignore[misc]
                out["next_failed_cursor"] = cursor + count
                continue
            next_cursor, entries = reply
            if name in ("processed", "ignored"):
                out[name] = codec.str_dict(entries)
            else:
                out["unprocessed"] = codec.to_str(list(entries))
            out[f"next_{name}_cursor"] = int(next_cursor)
        return out

    async def get_dependency_counts(self, job_id: str, types: Sequence[str]) -> list[int]:
        ck = self._child_key
        counts = await self.runner.call("getDependencyCounts", [
            ck(job_id, "processed"), ck(job_id, "dependencies"), ck(job_id, "failed"),
            ck(job_id, "unsuccessful")], list(types))
        return [int(count or 0) for count in counts]

    async def remove_child_dependency(self, job_id: str, parent_key: str) -> bool:
        result = await self.runner.call(
            "removeChildDependency", [self.keys.prefix_key], [self.keys.job(job_id), parent_key])
        if result == 0:
            return True
        if result == 1:
            return False
        raise script_error(int(result), job_id=job_id, command="removeChildDependency", parent_key=parent_key)

    async def remove_unprocessed_children(self, job_id: str) -> None:
        k = self.keys
        await self.runner.call("removeUnprocessedChildren", [k.job(job_id), k.meta], [k.prefix_key, job_id])

    # -- job schedulers ------------------------------------------------------------------------
    def _scheduler_keys(self) -> list[str]:
        k = self.keys
        return [k.repeat, k.delayed, k.wait, k.paused, k.meta, k.prioritized, k.marker, k.id, k.events, k.pc]

    async def add_job_scheduler(self, scheduler_id: str, next_millis: Optional[int], scheduler_opts: Mapping[str, Any],
                                template_data_json: str, template_opts: Mapping[str, Any],
                                delayed_job_opts: Mapping[str, Any], now: int,
                                producer_id: Optional[str]) -> tuple[str, int]:
        k = self.keys
        script: Any = "addJobScheduler"
        keys = [*self._scheduler_keys(), k.active]
        if delayed_job_opts.get("group") is not None:  # our gate takes the job it makes (groups.md)
            script = own_script("addGroupJobScheduler-14.lua")
            keys += [k.waiting_children, k.completed, k.failed]
        result = await self.runner.call(script, keys, [
            next_millis, codec.pack(dict(scheduler_opts)), scheduler_id, template_data_json,
            codec.pack(dict(template_opts)), codec.pack(dict(delayed_job_opts)), now, k.prefix_key,
            k.job(producer_id) if producer_id else ""])
        if isinstance(result, int):
            raise script_error(result, command="addJobScheduler")
        return str(codec.to_str(result[0])), int(result[1])

    async def update_job_scheduler(self, scheduler_id: str, next_millis: Optional[int], template_data_json: str,
                                   delayed_job_opts: Mapping[str, Any], now: int, producer_id: str) -> Optional[str]:
        k = self.keys
        script: Any = "updateJobScheduler"
        keys = [*self._scheduler_keys(), k.job(producer_id), k.active]
        if delayed_job_opts.get("group") is not None:  # our gate takes the job it makes (groups.md)
            script = own_script("updateGroupJobScheduler-15.lua")
            keys += [k.waiting_children, k.completed, k.failed]
        result = await self.runner.call(script, keys, [
            next_millis, scheduler_id, template_data_json, codec.pack(dict(delayed_job_opts)), now, k.prefix_key,
            producer_id])
        if not result:
            return None
        if isinstance(result, int):
            raise script_error(result, command="updateJobScheduler")
        return str(codec.to_str(result))

    async def remove_job_scheduler(self, scheduler_id: str) -> bool:
        k = self.keys
        result = await self.runner.call("removeJobScheduler", [k.repeat, k.delayed, k.events],
                                        [scheduler_id, k.prefix_key])
        return not int(result)

    async def get_job_scheduler(self, scheduler_id: str) -> tuple[dict[str, str], Optional[int]]:
        reply = await self.runner.call("getJobScheduler", [self.keys.repeat], [scheduler_id])
        flat, score = reply if reply else (None, None)
        raw = codec.flat_to_dict(flat) if flat else {}
        return raw, _to_int(codec.to_str(score)) if score else None

    async def get_job_schedulers(self, start: int, end: int, asc: bool
                                 ) -> list[tuple[str, dict[str, str], Optional[int]]]:
        key = self.keys.repeat
        if asc:
            entries = await self.client.zrange(key, start, end, withscores=True)
        else:
            entries = await self.client.zrevrange(key, start, end, withscores=True)
        pipe = self.client.pipeline(transaction=False)
        for member, _ in entries:
            pipe.hgetall(f"{key}:{codec.to_str(member)}")
        hashes = await pipe.execute() if entries else []
        return [(str(codec.to_str(member)), codec.str_dict(raw or {}), int(score))
                for (member, score), raw in zip(entries, hashes)]

    async def get_job_schedulers_count(self) -> int:
        return int(await self.client.zcard(self.keys.repeat))

    async def is_job_scheduler(self, scheduler_id: str) -> bool:
        return bool(await self.client.hexists(f"{self.keys.repeat}:{scheduler_id}", "ic"))

    # -- workers and events ------------------------------------------------------------------
    async def open_worker_channel(self, settings: WorkerSettings, client_name: str, *,
                                  fast: bool = True) -> "RedisWorkerChannel":
        calls = WorkerCalls(self.keys, WorkerWireOptions(
            name=settings.name, lock_duration=settings.lock_duration, limiter=settings.limiter,
            remove_on_complete=settings.remove_on_complete, remove_on_fail=settings.remove_on_fail,
            max_metrics_size=settings.max_metrics_size, max_stalled_count=settings.max_stalled_count,
            stalled_interval=settings.stalled_interval))
        channel = await open_channel(self.client, client_name, fast=fast)
        return RedisWorkerChannel(self, calls, channel)

    def worker_calls(self, settings: Optional[WorkerSettings] = None) -> WorkerCalls:
        s = settings or WorkerSettings()
        return WorkerCalls(self.keys, WorkerWireOptions(
            name=s.name, lock_duration=s.lock_duration, limiter=s.limiter,
            remove_on_complete=s.remove_on_complete, remove_on_fail=s.remove_on_fail,
            max_metrics_size=s.max_metrics_size, max_stalled_count=s.max_stalled_count,
            stalled_interval=s.stalled_interval))

    async def open_events_reader(self, client_name: str) -> "RedisEventsReader":
        return RedisEventsReader(self, blocking_client(self.client, client_name))


class RedisWorkerChannel(WorkerChannel):
    """A worker's calls (`WorkerCalls`) sent over its channel (fast hiredis, or redis-py)."""

    def __init__(self, backend: RedisBackend, calls: WorkerCalls, channel: Channel) -> None:
        self.backend = backend
        self.calls = calls
        self.channel = channel

    async def send(self, call: Any) -> Any:
        """One prepared call (script, keys, args), as the worker's retrying finish path sends it."""
        return await self.channel.call(call)

    async def move_to_active(self, token: str, now: int) -> NextJob:
        return parse_next_job(await self.channel.call(self.calls.move_to_active(token, now)))

    async def move_to_finished(self, job_id: str, job_opts: Mapping[str, Any], target: str, value: str,
                               token: str, now: int, fetch_next: bool,
                               fields_to_update: Optional[Mapping[str, str]] = None,
                               group_id: Optional[str] = None) -> Optional[NextJob]:
        call = self.calls.move_to_finished(
            job_id, job_opts, target, value, token, now, fetch_next, fields_to_update, group_id=group_id)
        # a worker's every job: awaited here, without `call`'s coroutine, where the channel writes it at once
        future = self.channel.submit_one(call) if call[0].function is None else None
        if future is None:
            reply = await self.channel.call(call)
        else:
            try:
                reply = await future
            except ReplyError as err:
                if err.code != "NOSCRIPT":
                    raise
                reply = await self.channel.call(call)  # Redis lacked the script: it did not run
        if isinstance(reply, int) and reply < 0:
            raise script_error(reply, job_id=job_id, command="moveToFinished", state="active")
        return parse_next_job(reply) if fetch_next else None

    async def move_to_active_many(self, tokens: Sequence[str], now: int) -> list[NextJob]:
        """A batch's claims in one call: our moveToActiveBatch, upstream's moveToActive once per token."""
        if not tokens:
            return []
        reply = await self.channel.call(self.calls.move_to_active_batch(tokens, now))
        return [parse_next_job(one) for one in reply or []]

    async def take_group_jobs(self, group_id: str, tokens: Sequence[str], now: int) -> list[NextJob]:
        """Group affinity: our takeGroupJobs, the group's next held jobs straight into active."""
        if not tokens:
            return []
        reply = await self.channel.call(self.calls.take_group_jobs(group_id, tokens, now))
        return [parse_next_job(one) for one in reply or []]

    async def finish_many(self, jobs: Sequence[FinishJob], now: int) -> list[Optional[BaseException]]:
        """A batch's finishes in one round trip: its completions in one call of our moveToFinishedBatch
        (upstream's moveToFinished once per job), other finishes (failed for good, group jobs)
        pipelined after it as calls of their own."""
        if not jobs:
            return []
        calls = self.calls
        plain = [i for i, j in enumerate(jobs) if j.target == "completed" and j.group_id is None]
        others = [i for i in range(len(jobs)) if jobs[i].target != "completed" or jobs[i].group_id is not None]
        batch: list[Any] = []
        if plain:
            batch.append(calls.complete_batch(
                [(jobs[i].job_id, jobs[i].value, jobs[i].token, jobs[i].job_opts) for i in plain], now))
        for i in others:
            j = jobs[i]
            batch.append(calls.move_to_finished(j.job_id, j.job_opts, j.target, j.value, j.token, now, False,
                                                j.fields_to_update, group_id=j.group_id))
        replies = await self.channel.call_many(batch, raise_errors=False) if len(batch) > 1 else [
            await self._call_quietly(batch[0])]
        for reply in replies:  # the connection went: the worker sends the batch's finishes again
            if isinstance(reply, BaseException) and self.backend.is_transient(reply):
                raise reply
        per_job: list[Any] = [None] * len(jobs)
        if plain:
            completed = replies[0]
            for n, i in enumerate(plain):
                per_job[i] = completed if isinstance(completed, BaseException) else completed[n]
        for i, reply in zip(others, replies[1 if plain else 0:]):
            per_job[i] = reply
        results: list[Optional[BaseException]] = []
        for job, reply in zip(jobs, per_job):
            if isinstance(reply, BaseException):
                results.append(reply)
            elif isinstance(reply, int) and reply < 0:
                results.append(script_error(reply, job_id=job.job_id, command="moveToFinished", state="active"))
            else:
                results.append(None)
        return results

    async def _call_quietly(self, call: Any) -> Any:
        try:
            return await self.channel.call(call)
        except Exception as err:
            return err

    async def move_to_delayed(self, job_id: str, now: int, delay: int, token: str, *,
                              skip_attempt: bool = False, fields_to_update: Optional[Mapping[str, str]] = None,
                              fetch_next: bool = False) -> Optional[NextJob]:
        reply = await self.channel.call(self.calls.move_to_delayed(
            job_id, now, delay, token, skip_attempt=skip_attempt, fields_to_update=fields_to_update,
            fetch_next=fetch_next))
        if isinstance(reply, int) and reply < 0:
            raise script_error(reply, job_id=job_id, command="moveToDelayed", state="active")
        return parse_next_job(reply) if fetch_next else None

    async def retry_job(self, job_id: str, lifo: bool, token: str, now: int,
                        fields_to_update: Optional[Mapping[str, str]] = None) -> None:
        reply = await self.channel.call(self.calls.retry_job(job_id, lifo, token, now, fields_to_update))
        if isinstance(reply, int) and reply < 0:
            raise script_error(reply, job_id=job_id, command="retryJob", state="active")

    async def extend_locks(self, job_ids: Sequence[str], tokens: Sequence[str], duration: int) -> list[str]:
        failed = await self.channel.call(self.calls.extend_locks(job_ids, tokens, duration))
        return list(codec.to_str(failed) or [])

    async def extend_lock(self, job_id: str, token: str, duration: int) -> bool:
        return bool(await self.channel.call(self.calls.extend_lock(job_id, token, duration)))

    async def move_stalled_jobs_to_wait(self, now: int) -> list[str]:
        return list(codec.to_str(await self.channel.call(self.calls.move_stalled_to_wait(now))) or [])

    async def move_job_from_active_to_wait(self, job_id: str, token: str) -> int:
        reply = await self.channel.call(self.calls.move_from_active_to_wait(job_id, token))
        if isinstance(reply, int) and reply < 0:
            raise script_error(reply, job_id=job_id, command="moveJobFromActiveToWait", state="active")
        return int(reply or 0)

    async def move_to_waiting_children(self, job_id: str, token: str, now: int, child_key: str = "") -> bool:
        reply = await self.channel.call(self.calls.move_to_waiting_children(job_id, token, now, child_key))
        if isinstance(reply, int) and reply < 0:
            raise script_error(reply, job_id=job_id, command="moveToWaitingChildren", state="active")
        return bool(reply == 0)

    async def wait_for_job(self, timeout: float) -> Optional[tuple[str, float]]:
        return await self.channel.wait_marker(self.backend.keys.marker, timeout)

    async def wake_at(self, due_ms: int) -> None:
        await self.backend.client.zadd(self.backend.keys.marker, {"1": due_ms})

    async def close(self) -> None:
        await self.channel.close()


class RedisEventsReader(EventsReader):
    """XREAD BLOCK on the queue's events stream, on a connection of its own."""

    def __init__(self, backend: RedisBackend, client: Any) -> None:
        self.backend = backend
        self.client = client

    async def last_id(self) -> str:
        last = await self.client.xrevrange(self.backend.keys.events, "+", "-", count=1)
        return str(codec.to_str(last[0][0])) if last else "0-0"

    async def read(self, after_id: str, block_ms: int) -> list[tuple[str, dict[str, str]]]:
        reply = await self.client.xread({self.backend.keys.events: after_id}, block=block_ms)
        return stream_entries(reply)

    async def close(self) -> None:
        if self.client is not self.backend.client:
            await self.client.aclose()


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a SCAN MATCH pattern (a prefix such as ``{bull}`` or ``a*b``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def stream_entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """(id, fields) pairs from an XREAD reply, RESP2 (list) or RESP3 (dict), bytes or str."""
    if not reply:
        return []
    if isinstance(reply, Mapping):
        streams = list(reply.values())
    else:
        streams = [stream[1] for stream in reply]
    entries: list[tuple[str, dict[str, str]]] = []
    for stream in streams:
        for entry in stream or []:
            entry_id, fields = entry[0], entry[1]
            if isinstance(fields, list):
                fields = codec.flat_to_dict(fields)
            entries.append((str(codec.to_str(entry_id)), codec.str_dict(fields or {})))
    return entries


async def discover_queues(url: str, prefix: str) -> list[str]:
    """The names of the queues under ``prefix`` (those with a ``meta`` key), sorted."""
    handle = RedisHandle(url)  # refuses what is not a Redis URL, naming it masked
    try:
        await handle.check()
        names = set()
        async for key in handle.client.scan_iter(match=f"{prefix}:*:meta", count=1000):
            names.add(key[len(prefix) + 1:-len(":meta")])
        return sorted(names)
    finally:
        await handle.close()
