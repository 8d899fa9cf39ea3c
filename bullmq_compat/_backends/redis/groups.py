"""Per-group FIFO: one job at a time per group (or k), groups in parallel, under any worker.

Jobs of a group wait behind a gate our scripts own (``bullmq_compat/_backends/redis/lua/``): only the head of
each group is visible to workers, whichever language they are written in. The rest are held,
and listed in upstream's ``waiting-children`` set so Bull-Board and ``getJobCounts`` show them.
Whoever finishes a group job releases the next: a bullmq-compat worker finishes group jobs through
our moveToFinishedGroup script (upstream's moveToFinished, unchanged, then the release, in one
call); jobs finished by Node workers are released by a
`GroupKeeper` that follows the queue's events stream and sweeps the group index. Release is
idempotent, and safety never depends on the keeper: without one, held jobs only wait longer.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

import redis.exceptions as redis_exc

from bullmq_compat._backends.base import GroupGate
from bullmq_compat._backends.redis.keys import QueueKeys
from bullmq_compat._backends.redis.lua import Script, own_script
from bullmq_compat._errors import InvalidArgument, script_error
from bullmq_compat._groups import held_priority_refusal, stored_max_size
from bullmq_compat._wire import codec

if TYPE_CHECKING:
    from bullmq_compat._backends.redis.backend import RedisBackend
    from bullmq_compat._backends.redis.connection import Connection

logger = logging.getLogger("bullmq_compat.groups")

GROUP_SEQ_DIGITS = 15  # as in lua/includes/groupGate.lua
#: a held job with group priority p >= 1 is scored GROUP_PRIORITY_BASE + p (groupOrderScore)
GROUP_PRIORITY_BASE = 2 ** 42


def add_script() -> Script:
    return own_script("addGroupJob-12.lua")


def update_script() -> Script:
    return own_script("updateGroups-11.lua")


def gate_keys(keys: QueueKeys) -> list[str]:
    """KEYS[1..11] of our group scripts (group keys themselves are derived from the prefix)."""
    return [keys.wait, keys.meta, keys.active, keys.marker, keys.prioritized, keys.pc, keys.delayed,
            keys.events, keys.waiting_children, keys.completed, keys.failed]


def release_call(keys: QueueKeys, job_id: str, gid: str) -> tuple[Script, list[str], list[Any]]:
    """Free ``job_id``'s slot in group ``gid`` if it has finished and release the group's next jobs."""
    return update_script(), gate_keys(keys), [keys.prefix_key, "release", job_id, gid, int(time.time() * 1000)]


def gate_scheduler_jobs_call(keys: QueueKeys, job_ids: Sequence[str]) -> tuple[Script, list[str], list[Any]]:
    """Put jobs made by upstream's scheduler scripts alone (a Node worker's updateJobScheduler) whose
    options hold a group through their group's gate (idempotent; see lua/includes/groupSchedulerJob)."""
    return (own_script("gateSchedulerJobs-12.lua"), [*gate_keys(keys), keys.paused],
            [keys.prefix_key, int(time.time() * 1000), *job_ids])


def update_call(keys: QueueKeys, op: str, arg: Any = "", arg2: Any = "") -> tuple[Script, list[str], list[Any]]:
    return update_script(), gate_keys(keys), [keys.prefix_key, op, arg, arg2, int(time.time() * 1000)]


def regate_call(keys: QueueKeys, job_id: str) -> tuple[Script, list[str], list[Any]]:
    """Put ``job_id`` back behind its group's gate after a retry that bypassed it (Node's)."""
    return (own_script("regateRetriedJob-12.lua"), [*gate_keys(keys), keys.paused],
            [keys.prefix_key, job_id, int(time.time() * 1000)])


#: updateGroups' "ratelimit" answer for a job that is not a group job
NOT_A_GROUP_JOB = -9


def parse_rate_limit(spec: Any) -> Optional[tuple[int, int]]:
    """A stored rate limit ``"<max>:<duration>"`` → ``(max, duration)``; None for none."""
    if not spec:
        return None
    max_jobs, _, duration = str(spec).partition(":")
    return int(max_jobs), int(duration)


def held_job_id(member: str) -> str:
    return member[GROUP_SEQ_DIGITS:]


class GroupKeeper:
    """Releases groups whose jobs were finished by Node workers, and sweeps the group index.

    Run it beside Node-only workers (``bullmq-compat keeper --queue Q``); every bullmq-compat
    Worker also runs one. Any number may run at once: release is idempotent.

    >>> keeper = GroupKeeper("emails", connection="redis://127.0.0.1:6379/0")
    >>> await keeper.run()        # until close()
    """

    FINISH_EVENTS = frozenset({"completed", "failed", "removed"})
    #: the ``prev`` of the 'waiting' event upstream's retries (reprocessJob, moveJobsToWait) emit
    RETRY_PREV = frozenset({"failed", "completed"})
    #: how many released jobs' groups a keeper remembers (see `learn`); past it, the oldest are
    #: forgotten (their finish is then noticed by a sweep if their hash is gone)
    MAX_KNOWN = 200_000
    #: a sweep costs Redis about 10 commands per group: after one that took d seconds, no keeper of
    #: the queue sweeps again for SWEEP_DUTY_FACTOR * d (so sweeping takes at most ~5% of Redis)
    SWEEP_DUTY_FACTOR = 20

    def __init__(self, queue_name: str, connection: "Connection" = None, *, prefix: str = "bull",
                 sweep_interval: float = 5.0, block_ms: int = 5000, follow_stream: bool = True,
                 regate_retries: bool = True) -> None:
        """A keeper for queue ``queue_name`` on Redis: sweeps every ``sweep_interval`` seconds and,
        with ``follow_stream``, follows the events stream (each read blocking up to ``block_ms``),
        putting group jobs that a Node retry moved past their gate back behind it (``regate_retries``)."""
        from bullmq_compat._backends.redis.backend import RedisBackend

        self._queue: "RedisBackend" = RedisBackend(queue_name, connection, prefix=prefix)
        self.sweep_interval = sweep_interval
        self.block_ms = block_ms
        self.follow_stream = follow_stream
        self.regate_retries = regate_retries
        self.closing = False
        self._blocking: Any = None
        self._task: Optional[asyncio.Task[None]] = None
        self.released = 0
        self.sweeps = 0
        #: retried group jobs put back behind their gate / found started already (see `regate`)
        self.regated = 0
        self.regated_late = 0
        self._gids: dict[str, str] = {}

    @classmethod
    def for_queue(cls, queue: Any, *, sweep_interval: float = 5.0, follow_stream: bool = True,
                  regate_retries: bool = True) -> "GroupKeeper":
        """A keeper sharing an existing queue's (or worker's) connection."""
        keeper = cls.__new__(cls)
        keeper._queue = getattr(queue, "backend", queue)
        keeper.sweep_interval = sweep_interval
        keeper.block_ms = 5000
        keeper.follow_stream = follow_stream
        keeper.regate_retries = regate_retries
        keeper.closing = False
        keeper._blocking = None
        keeper._task = None
        keeper.released = 0
        keeper.sweeps = 0
        keeper.regated = 0
        keeper.regated_late = 0
        keeper._gids = {}
        return keeper

    def __repr__(self) -> str:
        return f"<GroupKeeper {self._queue.qualified_name} {self._queue.description}>"

    async def sweep(self) -> int:
        """Release every group whose slot holder has finished; returns how many jobs were released."""
        queue = self._queue
        await queue.ready()
        cursor, total = "0", 0
        while True:
            script, keys, args = update_call(queue.keys, "sweep", cursor, 200)
            cursor, released = codec.to_str(await queue.runner.call(script, keys, args))
            total += int(released)
            if cursor == "0":
                break
        self.released += total
        self.sweeps += 1
        await self.gate_scheduler_jobs()
        return total

    async def gate_scheduler_jobs(self, job_ids: Optional[Sequence[str]] = None) -> int:
        """Gate the jobs of schedulers with a group template that a Node worker made (upstream's
        updateJobScheduler knows no gate): ``job_ids`` (from "added" events), or, as a sweep's
        repair, each scheduler's next job (up to 1,000 schedulers per sweep)."""
        queue = self._queue
        if job_ids is None:
            entries = await queue.client.zrange(queue.keys.repeat, 0, 999, withscores=True)
            job_ids = [f"repeat:{codec.to_str(member)}:{int(score)}" for member, score in entries]
        if not job_ids:
            return 0
        return int(await queue.runner.call(*gate_scheduler_jobs_call(queue.keys, job_ids)))

    async def sweep_if_due(self) -> Optional[int]:
        """Sweep unless another keeper of this queue (every Worker runs one) swept within the last
        ``sweep_interval``: the keepers share a lease in Redis, so the queue is swept about once per
        interval however many keepers run. Returns how many jobs were released, or None when not due."""
        queue = self._queue
        await queue.ready()
        base = queue.keys.prefix_key
        if not await queue.client.exists(base + "grp:index"):
            return 0  # no groups: nothing to sweep (and no lease written on queues without groups)
        interval_ms = max(1, int(self.sweep_interval * 1000))
        lease = base + "grp:sweep"
        if not await queue.client.set(lease, "1", nx=True, px=interval_ms):
            return None
        started = time.monotonic()
        released = await self.sweep()
        quiet_ms = int((time.monotonic() - started) * 1000 * self.SWEEP_DUTY_FACTOR)
        if quiet_ms > interval_ms:  # a big index: space sweeps out so they stay a small share of Redis
            await queue.client.pexpire(lease, quiet_ms)
        return released

    def learn(self, job_id: str, gid: str) -> None:
        """Remember the group of a released job (from its "waiting" event, or a running set): once
        it has finished, its hash may be gone (removeOnComplete) and with it the group's name."""
        known = self._gids
        known[job_id] = gid
        if len(known) > self.MAX_KNOWN:
            del known[next(iter(known))]

    async def learn_running(self) -> None:
        """Learn the groups of the jobs that hold a slot now (released before this keeper read the
        stream): one SMEMBERS per group of the index."""
        queue = self._queue
        base = queue.keys.prefix_key
        gids = [codec.to_str(gid) async for gid in queue.client.sscan_iter(base + "grp:index", count=1000)]
        for start in range(0, len(gids), 1000):
            page = gids[start:start + 1000]
            pipe = queue.client.pipeline(transaction=False)
            for gid in page:
                pipe.smembers(base + "grp:run:" + gid)
            for gid, members in zip(page, await pipe.execute()):
                for job_id in members:
                    self.learn(codec.to_str(job_id), gid)

    async def learn_delayed(self, job_ids: Sequence[str]) -> None:
        """Learn the groups of jobs just gone to the delayed set (upstream's 'delayed' event has no
        "gid": a gate releases a job with a delay, or one waiting out its ordering window, there),
        from their hashes while these exist; upstream promotes them with no event of ours."""
        queue = self._queue
        base = queue.keys.prefix_key
        pipe = queue.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(base + job_id, "gid")
        for job_id, gid in zip(job_ids, await pipe.execute()):
            if gid:
                self.learn(job_id, codec.to_str(gid))

    async def release(self, job_ids: Sequence[str]) -> int:
        """Free the group slots of these finished jobs and release their groups' next jobs."""
        queue = self._queue
        base = queue.keys.prefix_key
        # (an id twice in a batch, say 'completed' then 'removed', keeps what its first pop found)
        found = {job_id: self._gids.pop(job_id, None) for job_id in dict.fromkeys(job_ids)}
        unknown = [job_id for job_id, gid in found.items() if gid is None]
        if unknown:  # not seen released: its hash names its group, unless gone (a sweep frees those)
            pipe = queue.client.pipeline(transaction=False)
            for job_id in unknown:
                pipe.hget(base + job_id, "gid")
            found.update(zip(unknown, await pipe.execute()))
        candidates = [(job_id, codec.to_str(gid)) for job_id, gid in found.items() if gid]
        if not candidates:
            return 0
        # most were released by whoever finished them (a bullmq-compat worker): only a job still in
        # its group's running set costs a script call
        pipe = queue.client.pipeline(transaction=False)
        for job_id, gid in candidates:
            pipe.sismember(base + "grp:run:" + gid, job_id)
        holding = [c for c, member in zip(candidates, await pipe.execute()) if member]
        if not holding:
            return 0
        results = await queue.runner.call_many([release_call(queue.keys, job_id, gid) for job_id, gid in holding])
        released = sum(int(r) for r in results if isinstance(r, int))
        self.released += released
        return released

    async def regate(self, job_ids: Sequence[str]) -> int:
        """Put these jobs, which a retry of upstream's moved to wait (their 'waiting' event, prev
        failed or completed, without our "gid"), back behind their groups' gates; returns how many.
        A plain job, or a group job its gate released itself, is left alone (in the script). One
        that a worker took first is counted in its group's running set while it runs (`regated_late`
counts those, and those already finished again)."""
        queue = self._queue
        results = await queue.runner.call_many([regate_call(queue.keys, job_id) for job_id in dict.fromkeys(job_ids)])
        regated = sum(1 for r in results if r == 1)
        self.regated += regated
        self.regated_late += sum(1 for r in results if r in (2, 3))
        return regated

    async def run(self) -> None:
        """Follow the events stream (XREAD BLOCK) and sweep every ``sweep_interval`` seconds.

        The stream is read only while the queue has groups, so a keeper costs nothing on queues
        without group jobs; with ``follow_stream=False`` it only sweeps.
        """
        from bullmq_compat._backends.redis.channel import blocking_client

        queue = self._queue
        await queue.ready()
        if not self.follow_stream:
            await self._sweep_only()
            return
        self._blocking = blocking_client(queue.client)
        index_key = queue.keys.prefix_key + "grp:index"
        last_id = "$"
        next_sweep = 0.0
        trouble = False
        while not self.closing:
            try:
                if last_id == "$":
                    # read on from the stream's end as it is *before* the sweep: with "$", whatever
                    # finished between the sweep and XREAD (or between two empty XREADs) would wait
                    # for the next sweep
                    newest = await self._blocking.xrevrange(queue.keys.events, count=1)
                    last_id = codec.to_str(newest[0][0]) if newest else "0-0"
                    # jobs released before that point are not in what it reads: learn their groups now
                    await self.learn_running()
                if time.monotonic() >= next_sweep:
                    # the first sweep is this keeper's own: its stream reading starts there
                    await (self.sweep() if next_sweep == 0.0 else self.sweep_if_due())
                    next_sweep = time.monotonic() + self.sweep_interval
                if not await queue.client.exists(index_key):
                    # no groups: nothing to release; note where the stream ends and look again soon
                    newest = await self._blocking.xrevrange(queue.keys.events, count=1)
                    last_id = codec.to_str(newest[0][0]) if newest else "0-0"
                    await asyncio.sleep(min(0.5, max(0.0, next_sweep - time.monotonic())) or 0.05)
                    continue
                block = max(1, min(self.block_ms, int((next_sweep - time.monotonic()) * 1000)))
                reply = await self._blocking.xread({queue.keys.events: last_id}, count=1000, block=block)
                trouble = False
            except (redis_exc.ConnectionError, redis_exc.TimeoutError, OSError, ConnectionError,
                    redis_exc.OutOfMemoryError) as err:  # OOM: Redis full (noeviction), refused whole
                if self.closing:
                    break
                if not trouble:
                    logger.warning("group keeper for %s lost Redis (%s); retrying", queue.name, err)
                    trouble = True
                await asyncio.sleep(1.0)
                continue
            finished: list[str] = []
            delayed: list[str] = []
            retried: list[str] = []
            scheduled: list[str] = []
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last_id = codec.to_str(entry_id)
                    fields = codec.str_dict(fields)
                    job_id = fields.get("jobId")
                    if not job_id:
                        continue
                    event = fields.get("event")
                    if event in self.FINISH_EVENTS:
                        finished.append(job_id)
                    elif event == "waiting" and fields.get("gid"):  # released by a gate (ours)
                        self.learn(job_id, fields["gid"])
                    elif event == "waiting" and fields.get("prev") in self.RETRY_PREV and self.regate_retries:
                        retried.append(job_id)  # upstream's retry: past the gate, if a group job
                    elif event == "delayed" and job_id not in self._gids:
                        delayed.append(job_id)
                    if event == "added" and job_id.startswith("repeat:"):  # a scheduler's job: a group's?
                        scheduled.append(job_id)
            if scheduled:  # (before the releases: the batch's finishes come after these adds)
                await self.gate_scheduler_jobs(scheduled)
            if delayed:
                await self.learn_delayed(delayed)
            if retried:
                await self.regate(retried)
            if finished:
                await self.release(finished)

    async def _sweep_only(self) -> None:
        trouble = False
        while not self.closing:
            try:
                await self.sweep_if_due()
                trouble = False
            except (redis_exc.ConnectionError, redis_exc.TimeoutError, OSError, ConnectionError,
                    redis_exc.OutOfMemoryError) as err:  # OOM: Redis full (noeviction), refused whole
                if self.closing:
                    break
                if not trouble:
                    logger.warning("group keeper for %s lost Redis (%s); retrying", self._queue.name, err)
                    trouble = True
            await asyncio.sleep(self.sweep_interval)

    async def close(self) -> None:
        """Stop the keeper (started by `run` or `start`) and close its blocking connection."""
        self.closing = True
        if self._blocking is not None and self._blocking is not self._queue.client:
            await self._blocking.aclose()
        if self._task is not None:
            self._task.cancel()

    def start(self) -> "asyncio.Task[None]":
        """Run the keeper as a background task (errors are logged, not raised)."""
        self._task = asyncio.ensure_future(self._run_quietly())
        return self._task

    async def _run_quietly(self) -> None:
        try:
            await self.run()
        except asyncio.CancelledError:
            pass
        except Exception:
            if not self.closing:
                logger.exception("group keeper for %s stopped", self._queue.name)


class RedisGroups(GroupGate):
    """The Redis side of the group API of `Queue` (see bullmq_compat/_groups.py)."""

    def __init__(self, backend: "RedisBackend") -> None:
        self.backend = backend

    async def op(self, op: str, arg: Any = "", arg2: Any = "") -> Any:
        script, keys, args = update_call(self.backend.keys, op, arg, arg2)
        return await self.backend.runner.call(script, keys, args)

    async def set_concurrency(self, gid: Optional[str], concurrency: int) -> None:
        await self.op("concurrency", "*" if gid is None else gid, concurrency)
        if gid is None:
            await self.sweep()

    async def set_ordering_delay(self, gid: Optional[str], ms: Optional[int]) -> None:
        await self.op("odelay", "*" if gid is None else gid, "" if ms is None else ms)

    async def set_rate_limit(self, gid: Optional[str], limit: Optional[tuple[int, int]]) -> None:
        await self.op("rlimit", "*" if gid is None else gid, "" if limit is None else f"{limit[0]}:{limit[1]}")

    async def get_rate_limit(self, gid: Optional[str]) -> Optional[tuple[int, int]]:
        b = self.backend
        own, default = codec.to_str(await b.client.hmget(b.keys.prefix_key + "grp:rlim", "*" if gid is None else gid,
                                                         "*"))
        return parse_rate_limit(own or default)

    async def rate_limit_ttl(self, gid: str) -> int:
        return max(0, int(await self.op("rlttl", gid)))

    async def rate_limit_job(self, job_id: str, token: str, ms: int) -> int:
        reply = await self.op("ratelimit", job_id, f"{ms}:{token}")
        if isinstance(reply, int) and reply < 0:
            if reply == NOT_A_GROUP_JOB:
                raise InvalidArgument(f"job {job_id}: rate_limit_group needs a group job (this one has no group)")
            raise script_error(reply, job_id=job_id, command="rateLimitGroup", state="active")
        return int(reply)

    async def set_paused(self, gid: str, paused: bool) -> None:
        await self.op("pause" if paused else "resume", gid)

    async def delete_held(self, gid: str) -> int:
        return int(await self.op("delete", gid))

    async def get_concurrency(self, gid: str) -> int:
        b = self.backend
        own, default = await b.client.hmget(b.keys.prefix_key + "grp:conc", gid, "*")
        return int(own or default or 1)

    async def get_ordering_delay(self, gid: Optional[str]) -> int:
        b = self.backend
        own, default = await b.client.hmget(b.keys.prefix_key + "grp:odelay", "*" if gid is None else gid, "*")
        return int(own if own is not None else default or 0)

    async def is_paused(self, gid: str) -> bool:
        b = self.backend
        return bool(await b.client.sismember(b.keys.prefix_key + "grp:paused", gid))

    async def held_count(self, gid: str) -> int:
        b = self.backend
        return int(await b.client.zcard(b.keys.prefix_key + "grp:held:" + gid))

    async def held_ids(self, gid: str, start: int, end: int) -> list[str]:
        b = self.backend
        members = codec.to_str(await b.client.zrange(b.keys.prefix_key + "grp:held:" + gid, start, end))
        return [held_job_id(m) for m in members]

    async def counts_per_priority(self, gid: str, priorities: Sequence[int]) -> list[int]:
        b = self.backend
        key = b.keys.prefix_key + "grp:held:" + gid
        pipe = b.client.pipeline(transaction=False)
        for priority in priorities:
            if priority > 0:
                score = GROUP_PRIORITY_BASE + priority
                pipe.zcount(key, score, score)
            else:  # the unprioritised: scored by their order, below GROUP_PRIORITY_BASE
                pipe.zcount(key, "-inf", f"({GROUP_PRIORITY_BASE}")
        return [int(n) for n in await pipe.execute()]

    async def change_held_priority(self, job_id: str, priority: int, lifo: bool) -> bool:
        b = self.backend
        result = int(await b.runner.call(own_script("changeGroupPriority-11.lua"), gate_keys(b.keys),
                                         [b.keys.prefix_key, job_id, priority, 1 if lifo else 0]))
        refused = held_priority_refusal(result, job_id, priority)
        if refused is not None:
            raise refused
        return result == 1

    async def held_total(self, batch: int) -> int:
        b = self.backend
        base = b.keys.prefix_key
        total, cursor = 0, 0
        while True:  # the group index a batch at a time (SSCAN), each batch's held counts in one round trip
            cursor, gids = await b.client.sscan(base + "grp:index", cursor, count=batch)
            if gids:
                pipe = b.client.pipeline(transaction=False)
                for gid in codec.to_str(gids):
                    pipe.zcard(base + "grp:held:" + gid)
                total += sum(int(n) for n in await pipe.execute())
            if int(cursor) == 0:
                return total

    async def active_count(self, gid: str) -> int:
        """The group's released jobs (``grp:run:<gid>``: waiting or active) that are in the active list."""
        b = self.backend
        released = codec.to_str(await b.client.smembers(b.keys.prefix_key + "grp:run:" + gid))
        if not released:
            return 0
        pipe = b.client.pipeline(transaction=False)
        for job_id in released:
            pipe.lpos(b.keys.active, job_id)
        return sum(1 for pos in await pipe.execute() if pos is not None)

    async def list(self) -> list[dict[str, Any]]:
        """Every group with jobs: ``{"id", "waiting", "running", "paused", "concurrency"}``, by id (and
        the ``max_size`` and rate-limit fields of `GroupGate.list`)."""
        b = self.backend
        base = b.keys.prefix_key
        gids = set(codec.to_str(await b.client.smembers(base + "grp:index")))
        gids |= set(codec.to_str(await b.client.smembers(base + "grp:paused")))
        ordered = sorted(gids)
        pipe = b.client.pipeline(transaction=False)
        for gid in ordered:
            pipe.zcard(base + "grp:held:" + gid)
            pipe.scard(base + "grp:run:" + gid)
            pipe.sismember(base + "grp:paused", gid)
            pipe.hmget(base + "grp:conc", gid, "*")
            pipe.hmget(base + "grp:rlim", gid, "*")
            pipe.pttl(base + "grp:rlt:" + gid)
        replies = await pipe.execute() if ordered else []
        groups = []
        for i, gid in enumerate(ordered):
            held, running, paused, conc, rlim, manual_ttl = replies[6 * i: 6 * i + 6]
            limit = parse_rate_limit(codec.to_str(rlim[0] or rlim[1]))
            group: dict[str, Any] = {"id": gid, "waiting": int(held), "running": int(running),
                                     "paused": bool(paused), "concurrency": int(conc[0] or conc[1] or 1)}
            if limit is not None or int(manual_ttl) > 0:  # a rate limit in force (set, or rate_limit_group's)
                group["rate_limit"] = None if limit is None else {"max": limit[0], "duration": limit[1]}
                group["rate_limit_ttl"] = max(0, int(manual_ttl))
            groups.append(group)
        for group in groups:  # the ttl of a limit by count needs the group's starts: one script call each
            if group.get("rate_limit") is not None:
                group["rate_limit_ttl"] = await self.rate_limit_ttl(group["id"])
        max_sizes = await self._max_sizes(ordered)
        for group in groups:  # (only where a job carries one: the other fields' shape is unchanged)
            if group["id"] in max_sizes:
                group["max_size"] = max_sizes[group["id"]]
        return groups

    #: held entries of a group whose options one round of `_max_sizes` reads
    MAX_SIZE_BATCH = 64

    async def _max_sizes(self, gids: Sequence[str]) -> dict[str, Optional[int]]:
        """Per group, `stored_max_size` of its most recently added job (highest add sequence, "gseq")
        that is still in the queue and not finished -- held, or released (``grp:run``) -- and carries
        one. Derived from the jobs: the add path writes nothing for it. The group's held entries are
        read newest first, ``MAX_SIZE_BATCH`` jobs' options a round trip, until one carries a maxSize
        (usually the first round: producers that cap a group cap every add)."""
        b = self.backend
        base = b.keys.prefix_key
        if not gids:
            return {}
        pipe = b.client.pipeline(transaction=False)
        for gid in gids:
            pipe.zrange(base + "grp:held:" + gid, 0, -1)
            pipe.smembers(base + "grp:run:" + gid)
        replies = await pipe.execute()
        # per group: its held entries (seq, job id), newest first; its released jobs (at most its concurrency)
        pending: dict[str, list[tuple[str, str]]] = {}
        released: dict[str, list[str]] = {}
        for i, gid in enumerate(gids):
            members = [codec.to_str(m) for m in replies[2 * i]]
            pending[gid] = sorted(((m[:GROUP_SEQ_DIGITS], held_job_id(m)) for m in members), reverse=True)
            released[gid] = [codec.to_str(m) for m in replies[2 * i + 1]]
        best: dict[str, tuple[str, int]] = {}  # gid -> (seq, maxSize) of the newest job seen with one
        first = True
        while True:
            wanted: list[tuple[str, Optional[str], str]] = []  # (gid, seq the entry names or None, job id)
            for gid in gids:
                if first:
                    wanted.extend((gid, None, job_id) for job_id in released[gid])
                batch, pending[gid] = pending[gid][:self.MAX_SIZE_BATCH], pending[gid][self.MAX_SIZE_BATCH:]
                wanted.extend((gid, seq, job_id) for seq, job_id in batch)
            first = False
            if not wanted:
                break
            pipe = b.client.pipeline(transaction=False)
            for _, _, job_id in wanted:
                pipe.hmget(base + job_id, "gid", "gseq", "finishedOn", "opts")
            for (gid, seq, _), fields in zip(wanted, await pipe.execute()):
                job_gid, gseq, finished_on, raw_opts = codec.to_str(fields)
                if job_gid != gid or not gseq or finished_on or (seq is not None and gseq != seq):
                    continue  # gone, finished, or another job that reuses a removed one's custom id
                try:
                    max_size = stored_max_size(json.loads(raw_opts)) if raw_opts else None
                except ValueError:
                    max_size = None
                if max_size is not None and (gid not in best or gseq > best[gid][0]):
                    best[gid] = (gseq, max_size)
            for gid in gids:  # done with a group once no entry left to read is newer than its best
                if pending[gid] and gid in best and pending[gid][0][0] < best[gid][0]:
                    pending[gid] = []
        return {gid: found[1] for gid, found in best.items()}

    async def sweep(self) -> int:
        return await GroupKeeper.for_queue(self.backend).sweep()


async def delete_group_jobs(backend: "RedisBackend", gid: str) -> int:
    """Remove the group's held jobs (running ones are left); returns how many."""
    script, keys, args = update_call(backend.keys, "delete", gid)
    return int(await backend.runner.call(script, keys, args))


__all__ = ["GroupKeeper", "RedisGroups", "delete_group_jobs"]
