"""Issue #31 §4: Redis at ``maxmemory`` with ``noeviction``, and ``CLIENT PAUSE WRITE``.

- Redis full (its OOM reply): every kind of add (plain, with options, add_bulk, group, delayed,
  FlowProducer) raises `RedisOutOfMemory`, naming the queue and maxmemory, and writes nothing:
  the queue's keys are byte for byte what they were (DUMP of each). Once memory frees, adds work.
- Redis full while workers have active jobs (lock_duration 10 s, full for ~2 s): no job is lost or
  run twice, every job ends as its handler decided; the refused calls (moveToActive, extendLocks,
  the stalled check, finishes refused at their first write) are retried with back-off, reported
  once per outage ('error' events, log lines), not once per attempt.
  Why this holds with upstream's scripts: a script without shebang flags is refused only at a
  first deny-oom write made before any other write, so a refused call wrote nothing and is safely
  sent again; renewals (extendLocks: SET) are refused while Redis is full, so an OOM shorter than
  the lock keeps every job.
- ``CLIENT PAUSE <ms> WRITE``: an add blocks until the pause ends, then succeeds; workers keep
  their active jobs (the pause is far shorter than the lock), no job repeats, no 'error' event,
  little CPU while paused.

The handlers record their runs in a second redis-server (records must not be refused with the
queue's Redis). BULLMQ_COMPAT_CHAOS=1 runs more jobs and more outages.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import redis.asyncio as aioredis

from bullmq_compat import FlowProducer, Queue, Worker
from bullmq_compat.errors import RedisOutOfMemory
from tests._redis_server import RedisServer
from tests.chaos_helpers import (
    CHAOS,
    Plan,
    add_plan,
    check_runs,
    final_states,
    finish_events,
    plan_jobs,
    poll_until,
    read_list,
    report,
)
from tests.chaos_worker_proc import make_handler
from tests.helpers import captured_logs

LOCK_MS = 10000
FILLER_KEYS, FILLER_BYTES = 40, 100_000  # 4 MB; maxmemory is set 2 MB under the memory used with it


async def fill(admin: aioredis.Redis) -> None:
    """Make Redis full: 4 MB of filler, then maxmemory 2 MB under what it uses (noeviction)."""
    for i in range(FILLER_KEYS):
        await admin.set(f"filler:{i}", b"x" * FILLER_BYTES)
    used = int((await admin.info("memory"))["used_memory"])
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", used - FILLER_KEYS * FILLER_BYTES // 2)


async def free(admin: aioredis.Redis) -> None:
    """Memory frees: the filler goes (DEL is allowed while full); maxmemory stays set."""
    await admin.delete(*(f"filler:{i}" for i in range(FILLER_KEYS)))


async def snapshot(admin: aioredis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key under ``prefix``: its serialized value (DUMP), and a stream's length and last id."""
    out: dict[bytes, Any] = {}
    async for key in admin.scan_iter(match=f"{prefix}*", count=1000):
        kind = await admin.type(key)
        extra = None
        if kind == b"stream":
            info = await admin.xinfo_stream(key)
            extra = (info["length"], info["last-generated-id"])
        out[key] = (await admin.dump(key), extra)
    return out


async def test_adds_refused_with_nothing_written_when_redis_is_full(queue_name: str) -> None:
    server = RedisServer().start()
    admin = aioredis.Redis.from_url(server.url)
    queue = Queue(queue_name, connection=server.url)
    flows = FlowProducer(connection=server.url)
    try:
        await queue.add("before", {"n": 0})  # the queue exists: id counter, wait list, events, meta
        await queue.add("before-g", {"n": 1}, group={"id": "g"})
        await fill(admin)
        prefix = f"bull:{queue_name}:"
        before = await snapshot(admin, prefix)
        assert {f"{prefix}{k}".encode() for k in ("id", "wait", "events", "meta", "1")} <= set(before)
        adds = {
            "add": lambda: queue.add("j", {"x": 1}),
            "add with options": lambda: queue.add("j", {"x": 1}, attempts=3, priority=2),
            "delayed add": lambda: queue.add("j", {"x": 1}, delay=60000),
            "add_bulk": lambda: queue.add_bulk([{"name": "a", "data": {"k": k}} for k in range(5)]),
            "group add": lambda: queue.add("j", {"x": 1}, group={"id": "g"}),
            "flow add": lambda: flows.add({"name": "parent", "queue_name": queue_name,
                                           "children": [{"name": "child", "queue_name": queue_name}]}),
        }
        for what, add in adds.items():
            try:
                await asyncio.wait_for(add(), 15)
            except RedisOutOfMemory as err:
                text = str(err)
                assert "maxmemory" in text and "noeviction" in text, f"{what}: {text}"
                assert what == "flow add" or repr(queue_name) in text, f"{what} does not name the queue: {text}"
                assert "OOM" in type(err.reply).__name__ + str(err.reply) or "OutOfMemory" in type(err.reply).__name__
            else:
                raise AssertionError(f"{what} succeeded on a full Redis")
            after = await snapshot(admin, prefix)
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            assert not changed, f"{what} was refused but wrote {changed}"
        await free(admin)
        job = await queue.add("after", {"n": 2})
        assert job.id == "3"  # the refused adds took no ids (1: before, 2: before-g)
        assert len(await queue.add_bulk([{"name": "a", "data": {}}] * 2)) == 2
    finally:
        await flows.close()
        await queue.close()
        await admin.aclose()
        server.stop()


class Workers:
    """Two in-process workers (fast path, redis-py) on a queue; runs recorded in another Redis."""

    def __init__(self, url: str, record_url: str, queue_name: str, plan: Plan) -> None:
        self.name, self.plan, self.rec = queue_name, plan, f"rec:{queue_name}"
        self.url, self.record_url = url, record_url
        self.record_client = aioredis.Redis.from_url(record_url, decode_responses=True)
        handler = make_handler(self.record_client, self.rec)
        self.queue = Queue(queue_name, connection=url, max_len_events=len(plan.items) * 20)
        self.workers = {
            label: Worker(queue_name, handler, connection=url, concurrency=4, lock_duration=LOCK_MS,
                          stalled_interval=500, name=label, fast_path=fast, drain_delay=1)
            for label, fast in (("fast", True), ("redispy", False))}
        self.errors: dict[str, list[tuple[float, BaseException]]] = {label: [] for label in self.workers}
        self.completed_at: dict[str, list[float]] = {label: [] for label in self.workers}
        for label, worker in self.workers.items():
            worker.on("error", lambda err, label=label: self.errors[label].append((time.monotonic(), err)))
            worker.on("completed", lambda job, *_, label=label: self.completed_at[label].append(time.monotonic()))
        self.tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        await add_plan(self.queue, self.plan)
        for worker in self.workers.values():
            self.tasks.append(asyncio.ensure_future(worker.run(handle_signals=False)))

    async def finished(self) -> int:
        counts = await self.queue.get_job_counts("completed", "failed")
        return counts["completed"] + counts["failed"]

    async def wait_finished(self, count: int, timeout: float) -> float:
        async def done() -> bool:
            return await self.finished() >= count

        async def progress() -> str:
            return f"counts {await self.queue.get_job_counts()}; errors {self.errors}"

        return await poll_until(done, timeout, f"{count} finished jobs", progress, every=0.02)

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.close(force=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 20)
        await self.queue.close()
        await self.record_client.aclose()

    async def check(self) -> Any:
        client = aioredis.Redis.from_url(self.url, decode_responses=True)
        try:
            prefix = f"bull:{self.name}:"
            starts = await read_list(self.record_client, f"{self.rec}:starts")
            ends = await read_list(self.record_client, f"{self.rec}:ends")
            states = await final_states(client, prefix, self.plan.ids)
            events = await finish_events(client, f"{prefix}events")
            # no windows, no may_repeat: a repeated run fails the check (unless a stalled event
            # explains it, and there must be none)
            figures = check_runs(self.plan, states, starts, ends, {}, events)
            assert figures.duplicates == 0 and figures.stalled_events == 0, figures.line()
            assert await self.queue.get_groups() == []
            return figures
        finally:
            await client.aclose()


JOBS = 400 if CHAOS else 80
OUTAGES = 3 if CHAOS else 1
OUTAGE_S = 2.0


async def _active_when(admin: aioredis.Redis, queue_name: str, *then: Any) -> list[Any]:
    """The active list, and the commands ``then``, in one MULTI (the fault starts with jobs active)."""
    pipe = admin.pipeline(transaction=True)
    pipe.lrange(f"bull:{queue_name}:active", 0, -1)
    for args in then:
        pipe.execute_command(*args)
    return list(await pipe.execute())


async def test_workers_keep_their_jobs_while_redis_is_full(queue_name: str) -> None:
    server, records = RedisServer().start(), RedisServer().start()
    admin = aioredis.Redis.from_url(server.url)
    plan = plan_jobs(JOBS, seed=31, ms=(100, 400))
    w = Workers(server.url, records.url, queue_name, plan)
    active_at_fill: set[str] = set()
    oom_errors = {label: 0 for label in w.workers}
    try:
        with captured_logs() as logs:
            await w.start()
            for k in range(OUTAGES):
                await w.wait_finished(JOBS * (k + 1) // (OUTAGES + 2), 60)
                await admin.config_set("maxmemory", 0)  # the previous outage's limit would refuse the filler
                for i in range(FILLER_KEYS):
                    await admin.set(f"filler:{i}", b"x" * FILLER_BYTES)
                used = int((await admin.info("memory"))["used_memory"])
                await admin.config_set("maxmemory-policy", "noeviction")
                active, _ = await _active_when(
                    admin, queue_name, ("CONFIG", "SET", "maxmemory", used - FILLER_KEYS * FILLER_BYTES // 2))
                active_at_fill |= {a.decode() for a in active}
                assert active, "no job was active when Redis became full"
                since, errors_before = time.time(), {label: len(e) for label, e in w.errors.items()}
                # (jobs go on being taken meanwhile: a completion's moveToFinished deletes the lock
                # first, and a script that wrote is let finish, its fetch of the next job included)
                await asyncio.sleep(OUTAGE_S)
                during = {label: w.errors[label][errors_before[label]:] for label in w.workers}
                lines = logs.lines(since)
                await free(admin)
                freed = time.monotonic()
                for label, errs in during.items():
                    oom_errors[label] += len(errs)
                    assert all("maxmemory" in str(e) for _, e in errs), f"{label}: {errs}"
                    assert len(errs) <= 3, f"{label}: {len(errs)} 'error' events while full (once per attempt?)"
                assert len(lines) <= 6, f"{len(lines)} log lines while Redis was full: {lines}"
                await w.wait_finished(JOBS * (k + 1) // (OUTAGES + 2) + 8, 30)
            took = await w.wait_finished(JOBS, 90)
            for label, times in w.completed_at.items():
                assert any(t > freed for t in times), f"worker {label} completed nothing once memory freed"
            figures = await w.check()
        report(f"\nRedis full {OUTAGE_S}s x{OUTAGES} (lock {LOCK_MS} ms): {figures.short()}; "
               f"{len(active_at_fill)} jobs active at the fill(s); OOM 'error' events {oom_errors}; "
               f"finished {took:.1f}s after")
        # Redis refused each worker something (moveToActive, the stalled check) while full
        assert all(n >= 1 for n in oom_errors.values()), oom_errors
    finally:
        await w.close()
        await admin.aclose()
        server.stop()
        records.stop()


async def test_client_pause_write(queue_name: str) -> None:
    server, records = RedisServer().start(), RedisServer().start()
    admin = aioredis.Redis.from_url(server.url)
    plan = plan_jobs(JOBS, seed=32, ms=(100, 400))
    w = Workers(server.url, records.url, queue_name, plan)
    pause_ms = 2000
    try:
        # an add waits for the end of the pause, then succeeds
        t0 = time.monotonic()
        await admin.execute_command("CLIENT", "PAUSE", pause_ms, "WRITE")
        add = asyncio.ensure_future(w.queue.add("paused", {"plan": "ok"}))
        await asyncio.sleep(0.5)
        if time.monotonic() - t0 < pause_ms / 1000 - 0.5:  # the check only means something before the end
            assert not add.done(), f"the add returned during CLIENT PAUSE WRITE: {add}"
        job = await asyncio.wait_for(add, 30)
        assert time.monotonic() - t0 >= pause_ms / 1000 - 0.05
        assert await w.queue.get_job_state(str(job.id)) == "waiting"
        await w.queue.remove(str(job.id))
        # workers keep their active jobs through pauses far shorter than the lock
        await w.start()
        for k in range(OUTAGES):
            await w.wait_finished(JOBS * (k + 1) // (OUTAGES + 2), 60)
            errors_before = {label: len(e) for label, e in w.errors.items()}
            active, _ = await _active_when(admin, queue_name, ("CLIENT", "PAUSE", pause_ms, "WRITE"))
            assert active, "no job was active when the pause began"
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(pause_ms / 1000)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            assert cpu < 0.25 * wall, f"{cpu:.2f}s CPU in {wall:.1f}s of CLIENT PAUSE WRITE (busy loop?)"
            await w.wait_finished(JOBS * (k + 1) // (OUTAGES + 2) + 8, 30)
            new = {label: w.errors[label][errors_before[label]:] for label in w.workers}
            assert not any(new.values()), f"'error' events around the pause: {new}"
        took = await w.wait_finished(JOBS, 90)
        figures = await w.check()
        report(f"\nCLIENT PAUSE {pause_ms} ms WRITE x{OUTAGES} (lock {LOCK_MS} ms): {figures.short()}; "
               f"finished {took:.1f}s after")
    finally:
        await w.close()
        await admin.aclose()
        server.stop()
        records.stop()
