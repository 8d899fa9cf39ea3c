"""Issue #7: Redis restarts and network faults under running workers — nothing lost, no busy loop.

Each test has a redis-server of its own, so it may kill it or its clients:

- Redis SIGKILLed mid-run and restarted on the same port from its AOF (``--appendonly yes
  --appendfsync always``): a fast-path worker, a ``fast_path=False`` worker and a QueueEvents
  reconnect with back-off (few 'error' events and log lines, little CPU while Redis is down) and
  finish all the work; the QueueEvents misses no completion.
- ``CLIENT KILL TYPE normal`` of every connection, several times mid-run: the workers carry on.
- ``CLIENT PAUSE <ms> ALL`` longer than lock_duration: afterwards every job still ends as its
  handler decided (at-least-once); only jobs active when the pause began (their locks expired)
  may have run twice.

Jobs and checks are those of the crash soak (tests/chaos_helpers.py): every job ends completed
or failed as its handler decided, finished once by the events stream; repeated runs only where a
fault explains them; groups in order. Any other repeat with a ``stalled`` event is a lock lost by a
live worker (the test process's event-loop lag then is recorded with it): `judge_lock_lost` fails
it in ``make chaos`` and reports it under a loaded ``make test``, as tests/test_chaos.py does; one
with no stalled event fails at once. BULLMQ_COMPAT_CHAOS=1 runs more jobs and more faults.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator, Optional

import redis.asyncio as aioredis

from bullmq_compat import Queue, QueueEvents, Worker
from bullmq_compat._backends.redis.backend import CONNECTION_ERRORS
from bullmq_compat._errors import JobLockMismatch, JobLockNotFound
from tests._redis_server import RedisServer
from tests.chaos_helpers import (
    CHAOS,
    KillableRedis,
    Plan,
    add_plan,
    check_runs,
    final_states,
    finish_events,
    judge_lock_lost,
    now_ms,
    plan_jobs,
    poll_until,
    read_list,
    report,
)
from tests.chaos_worker_proc import make_handler, retried, watch_lag
from tests.helpers import captured_logs

LOCK_MS = 1000
STALLED_MS = 500


def lock_lost_or_connection(err: BaseException) -> bool:
    """What a worker may report after an outage: a lock that expired meanwhile (its renewal, or
    the stale finish of the first run, refused) or the connection trouble itself."""
    return isinstance(err, (JobLockNotFound, JobLockMismatch, *CONNECTION_ERRORS)) \
        or "could not renew lock" in str(err)


class Rig:
    """A queue, its plan, two in-process workers (fast path and redis-py) and a QueueEvents."""

    def __init__(self, url: str, queue_name: str, plan: Plan, *, concurrency: int = 4) -> None:
        self.url = url
        self.name = queue_name
        self.rec = f"rec:{queue_name}"
        self.plan = plan
        self.record_client = aioredis.Redis.from_url(url, decode_responses=True)
        handler = make_handler(self.record_client, self.rec)
        self.queue = Queue(queue_name, connection=url, max_len_events=len(plan.items) * 20)
        self.workers = {
            label: Worker(queue_name, handler, connection=url, concurrency=concurrency, lock_duration=LOCK_MS,
                          stalled_interval=STALLED_MS, max_stalled_count=100, name=label, fast_path=fast,
                          drain_delay=1)
            for label, fast in (("fast", True), ("redispy", False))}
        self.errors: dict[str, list[tuple[float, BaseException]]] = {label: [] for label in self.workers}
        self.completed_at: dict[str, list[float]] = {label: [] for label in self.workers}
        for label, worker in self.workers.items():
            worker.on("error", lambda err, label=label: self.errors[label].append((time.monotonic(), err)))
            worker.on("completed", lambda job, *_, label=label: self.completed_at[label].append(time.monotonic()))
        self.events = QueueEvents(queue_name, connection=url, autorun=False, blocking_timeout=1000)
        self.event_errors: list[BaseException] = []
        self.events.on("error", self.event_errors.append)
        self.seen_completed: set[str] = set()
        self.events.on("completed", lambda args, _id: self.seen_completed.add(args["jobId"]))
        self._tasks: list[asyncio.Task[Any]] = []
        self._lag_watch: Optional[asyncio.Task[Any]] = None

    async def start(self) -> None:
        # the workers run in this process: its event-loop lags are theirs (``<rec>:lags``, pid = ours)
        self._lag_watch = asyncio.ensure_future(watch_lag(
            lambda lag: retried(lambda: self.record_client.rpush(f"{self.rec}:lags", json.dumps(lag)))))
        await add_plan(self.queue, self.plan)
        self._tasks.append(asyncio.ensure_future(self.events.run()))
        await self.events.wait_until_ready()
        for worker in self.workers.values():
            self._tasks.append(asyncio.ensure_future(worker.run(handle_signals=False)))
        await asyncio.sleep(0.05)
        for task in self._tasks:
            assert not task.done(), f"ended at once: {task.exception() if task.done() else ''}"

    async def finished_count(self) -> int:
        counts = await self.queue.get_job_counts("completed", "failed")
        return counts["completed"] + counts["failed"]

    async def wait_finished(self, timeout: float) -> float:
        async def done() -> bool:
            try:
                return await self.finished_count() >= len(self.plan.items)
            except CONNECTION_ERRORS:  # the test's own pooled connection, from before a restart
                return False

        async def progress() -> str:
            return f"counts {await self.queue.get_job_counts()}; errors { {k: len(v) for k, v in self.errors.items()} }"

        return await poll_until(done, timeout, f"all {len(self.plan.items)} jobs to finish", progress)

    async def wait_some(self, count: int, timeout: float = 30) -> None:
        async def some() -> bool:
            try:
                return await self.finished_count() >= count
            except CONNECTION_ERRORS:  # the test's own pooled connection, from before a restart
                return False

        await poll_until(some, timeout, f"{count} finished jobs", every=0.02)

    async def close(self) -> None:
        if self._lag_watch is not None:
            self._lag_watch.cancel()
        for worker in self.workers.values():
            await worker.close(force=True)
        await self.events.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 20)
        await self.queue.close()
        await self.record_client.aclose()

    async def check(self, **kwargs: Any) -> Any:
        client = aioredis.Redis.from_url(self.url, decode_responses=True)
        try:
            prefix = f"bull:{self.name}:"
            starts = await read_list(client, f"{self.rec}:starts")
            ends = await read_list(client, f"{self.rec}:ends")
            lags = await read_list(client, f"{self.rec}:lags")
            states = await final_states(client, prefix, self.plan.ids)
            events = await finish_events(client, f"{prefix}events")
            figures = check_runs(self.plan, states, starts, ends, {}, events, lags=lags, **kwargs)
            groups = await self.queue.get_groups()
            assert groups == [], f"groups left: {groups[:5]}"
            completed_ids = {i for i, st in states.items() if st["state"] == "completed"}

            async def all_seen() -> bool:
                return not completed_ids - self.seen_completed

            async def missing() -> str:
                return f"missing {sorted(completed_ids - self.seen_completed)[:10]}"

            await poll_until(all_seen, 10, "the QueueEvents to see every completion", missing)
            return figures
        finally:
            await client.aclose()


@contextlib.asynccontextmanager
async def rig(url: str, queue_name: str, plan: Plan) -> AsyncIterator[Rig]:
    r = Rig(url, queue_name, plan)
    try:
        await r.start()
        yield r
    finally:
        await r.close()


JOBS = 3000 if CHAOS else 600


async def test_redis_killed_and_restarted_mid_run(queue_name: str) -> None:
    """SIGKILL redis-server mid-run, keep it down ~2 s, restart it on the same port from its AOF;
    (CHAOS: three times). Workers and QueueEvents reconnect without busy-looping and finish."""
    server = KillableRedis().start()
    outages = 3 if CHAOS else 1
    down_s = 2.0
    windows: list[tuple[int, int]] = []
    plan = plan_jobs(JOBS, seed=11, ms=(5, 30))
    try:
        with captured_logs() as logs:
            async with rig(server.url, queue_name, plan) as r:
                for k in range(outages):
                    await r.wait_some(JOBS * (k + 1) // (outages + 2))
                    errors_before = {label: len(e) for label, e in r.errors.items()}
                    t_kill = now_ms()
                    server.kill()
                    cpu0, wall0, since = time.process_time(), time.monotonic(), time.time()
                    await asyncio.sleep(down_s)
                    cpu = time.process_time() - cpu0
                    wall = time.monotonic() - wall0
                    during = {label: len(e) - errors_before[label] for label, e in r.errors.items()}
                    lines = logs.lines(since)
                    server.restart()
                    t_back = now_ms()
                    windows.append((t_kill, t_back))
                    report(f"\nRedis down {wall:.1f}s: 'error' events {during}, QueueEvents errors "
                          f"{len(r.event_errors)}, {len(lines)} log lines, {cpu * 1000:.0f} ms CPU")
                    assert all(n <= 3 for n in during.values()), f"'error' events while Redis was down: {during}"
                    assert len(lines) <= 10, f"{len(lines)} log lines while Redis was down: {lines}"
                    assert cpu < 0.25 * wall, f"{cpu:.2f}s CPU in {wall:.1f}s with Redis down (busy loop?)"
                    restarted = time.monotonic()
                took = await r.wait_finished(90)
                # each worker is back: it completed jobs after the restart, or -- when the other one
                # finished the plan while its back-off (up to 1.6 s after a 2 s outage) ran -- it is
                # connected again (it may have found nothing left to take)
                for label, worker in r.workers.items():
                    async def back(label: str = label, worker: Worker = worker) -> bool:
                        return any(t > restarted for t in r.completed_at[label]) or not worker._connection_down

                    await poll_until(back, 30, f"worker {label} to be back after the restart")
                assert any(t > restarted for times in r.completed_at.values() for t in times), \
                    "no worker completed anything after the restart"
                # after a restart, jobs whose lock expired meanwhile are found stalled and rerun; the
                # stale finish of the first run is refused (its lock is gone): reported as an error
                after = {label: [e for t, e in errs if t > restarted] for label, errs in r.errors.items()}
                figures = await r.check(windows=windows)
        report(f"Redis restarts: {figures.short()}; finished {took:.1f}s after the last restart; "
              f"'error' events after it {({k: len(v) for k, v in after.items()})}")
        judge_lock_lost(figures, "Redis restarts")
        others = [repr(e) for errs in after.values() for e in errs if not lock_lost_or_connection(e)]
        assert not others, f"unexpected 'error' events after the restart: {others[:10]}"
    finally:
        server.stop()


async def test_client_kill_mid_run(queue_name: str) -> None:
    """CLIENT KILL TYPE normal (every client connection but ours) several times mid-run: the
    workers and the QueueEvents reconnect and finish everything."""
    server = RedisServer().start()
    kills = 10 if CHAOS else 3
    windows: list[tuple[int, int]] = []
    plan = plan_jobs(JOBS, seed=12, ms=(5, 30))
    admin = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        with captured_logs() as logs:
            async with rig(server.url, queue_name, plan) as r:
                await r.wait_some(JOBS // 5)
                killed = []
                for _ in range(kills):
                    t = now_ms()
                    killed.append(await admin.execute_command("CLIENT", "KILL", "TYPE", "normal"))
                    windows.append((t, now_ms()))
                    await asyncio.sleep(0.4)
                last_kill = time.monotonic()
                took = await r.wait_finished(60)
                for label, times in r.completed_at.items():
                    assert any(t > last_kill for t in times), f"worker {label} completed nothing after the kills"
                figures = await r.check(windows=windows)
                errors = {label: len(e) for label, e in r.errors.items()}
                others = [repr(e) for errs in r.errors.values() for _, e in errs if not lock_lost_or_connection(e)]
        report(f"\nCLIENT KILL x{kills} (connections killed {killed}): {figures.short()}; "
              f"'error' events {errors}; {len(logs.lines())} log lines; finished {took:.1f}s after")
        judge_lock_lost(figures, "CLIENT KILL")
        assert all(n >= 3 for n in killed), f"CLIENT KILL found too few connections: {killed}"
        assert not others, f"unexpected 'error' events: {others[:10]}"
    finally:
        await admin.aclose()
        server.stop()


async def test_client_pause_longer_than_the_lock(queue_name: str) -> None:
    """CLIENT PAUSE 2500 ALL (lock_duration 1000): every active job's lock expires during it.
    Afterwards all jobs end as their handlers decided; repeats only for the jobs active when the
    pause began (taken atomically with the pause, in one MULTI)."""
    server = RedisServer().start()
    pauses = 3 if CHAOS else 1
    pause_ms = 2500
    plan = plan_jobs(JOBS, seed=13, ms=(5, 30))
    admin = aioredis.Redis.from_url(server.url, decode_responses=True)
    active_at_pause: set[str] = set()
    try:
        async with rig(server.url, queue_name, plan) as r:
            for k in range(pauses):
                await r.wait_some(JOBS * (k + 1) // (pauses + 2))
                pipe = admin.pipeline(transaction=True)
                pipe.lrange(f"bull:{queue_name}:active", 0, -1)
                pipe.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")
                active, _ = await pipe.execute()
                active_at_pause |= set(active)
                await asyncio.sleep(pause_ms / 1000 + 0.2)
                assert active, "no job was active when the pause began"
            took = await r.wait_finished(60)
            figures = await r.check(may_repeat=active_at_pause)
        report(f"\nCLIENT PAUSE {pause_ms} ms x{pauses} (lock {LOCK_MS} ms): {figures.short()}; "
              f"{len(active_at_pause)} jobs active at the pause(s); finished {took:.1f}s after")
        judge_lock_lost(figures, "CLIENT PAUSE")
    finally:
        await admin.aclose()
        server.stop()


