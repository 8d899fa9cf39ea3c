"""Issue #3: the worker survives what production throws at it — long jobs (lock renewal), a worker
killed mid-job (stalled recovery), jobs that keep stalling, SIGTERM during a job, Redis going
away and coming back, a processor that kills its own process — and operators can see it.

Worker subprocesses run tests/worker_proc.py (``python -m tests.worker_proc``).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from bullmq_compat import Queue, Worker
from tests._redis_server import RedisServer
from tests.helpers import Records, a_queue, running, wait_until
from tests.node import node

ROOT = Path(__file__).resolve().parent.parent
STALLED_REASON = "job stalled more than allowable limit"


async def wait_state(queue: Queue, job_id: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (current := await queue.get_job_state(job_id)) != state:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {current!r}, not {state!r}, after {timeout}s")
        await asyncio.sleep(0.02)


class WorkerProcess:
    """``python -m tests.worker_proc`` in the background; reads its JSON event lines."""

    def __init__(self, url: str, queue: str, *args: str) -> None:
        self.argv = [sys.executable, "-m", "tests.worker_proc", url, queue, *args]
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.events: list[dict[str, Any]] = []
        self._reader: Optional[asyncio.Task[None]] = None
        self._stderr: Optional[asyncio.Task[bytes]] = None

    async def __aenter__(self) -> "WorkerProcess":
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=str(ROOT), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._reader = asyncio.ensure_future(self._read())
        self._stderr = asyncio.ensure_future(self.proc.stderr.read())  # type: ignore[union-attr]
        try:
            await self.wait_event("ready", 20)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))

    def has(self, key: str, value: Any = None) -> bool:
        return any(key in e and (value is None or e[key] == value) for e in self.events)

    async def wait_event(self, key: str, timeout: float, value: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while not self.has(key, value):
            if self.proc is not None and self.proc.returncode is not None and self._reader is not None \
                    and self._reader.done():
                raise AssertionError(f"worker process exited ({self.proc.returncode}) before {key!r}; "
                                     f"events {self.events}; stderr {await self.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {key!r} from the worker process in {timeout}s; events {self.events}")
            await asyncio.sleep(0.01)

    async def stderr(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(asyncio.TimeoutError):
            return (await asyncio.wait_for(asyncio.shield(self._stderr), 2)).decode(errors="replace")
        return "(still running)"

    async def __aexit__(self, *exc: Any) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.kill()
        if proc is not None:
            await proc.wait()
        for task in (self._reader, self._stderr):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 5)


# -- locks and stalls --------------------------------------------------------------------------

async def test_lock_renewal_keeps_a_long_job(redis_url: str, queue_name: str, redis: Any) -> None:
    """lock_duration=1000 and a 2.5 s job: the lock is renewed, the stalled checker (every 300 ms)
    never takes the job back, and it completes exactly once."""
    runs: list[str] = []
    stalled: list[str] = []
    completed: list[str] = []
    lock_ttls: list[int] = []

    async def process(job: Any) -> str:
        runs.append(job.id)
        await asyncio.sleep(2.5)
        return "long"

    worker = Worker(queue_name, process, connection=redis_url, lock_duration=1000, stalled_interval=300,
                    concurrency=2)
    worker.on("stalled", lambda job_id, prev: stalled.append(job_id))
    worker.on("completed", lambda job, result, prev: completed.append(job.id))
    async with a_queue(queue_name, redis_url) as queue, running(worker):
        job = await queue.add("long", {})
        await wait_until(lambda: bool(runs), 5, "the job to start")
        for _ in range(4):  # well past the first lock's expiry
            await asyncio.sleep(0.45)
            lock_ttls.append(await redis.pttl(f"bull:{queue_name}:{job.id}:lock"))
        await wait_until(lambda: bool(completed), 5, "the long job to complete")
        await asyncio.sleep(0.4)  # another stalled check or two
        done = await queue.get_job(job.id)  # while the queue is open (a closed one raises QueueClosed)
        state = await queue.get_job_state(job.id)
    assert all(ttl > 0 for ttl in lock_ttls), f"the lock lapsed during the job: PTTLs {lock_ttls}"
    assert stalled == [] and runs == [job.id] and completed == [job.id]
    assert done is not None and done.returnvalue == "long" and done.attempts_started == 1
    assert state == "completed"


async def test_job_of_a_killed_worker_is_recovered(redis_url: str, queue_name: str) -> None:
    """A worker process SIGKILLed mid-job (lock 1000 ms): another worker's stalled check
    (every 500 ms) moves the job back to waiting, emits 'stalled', and completes it."""
    stalled: list[str] = []
    completed: list[Any] = []
    async with a_queue(queue_name, redis_url) as queue:
        async with WorkerProcess(redis_url, queue_name, "--lock-duration", "1000",
                                 "--stalled-interval", "500") as doomed:
            job = await queue.add("victim", {"sleep": 60})
            await doomed.wait_event("started", 10, job.id)
            assert await queue.get_job_state(job.id) == "active"
            assert doomed.proc is not None
            doomed.proc.send_signal(signal.SIGKILL)
            await doomed.proc.wait()
            assert doomed.proc.returncode == -signal.SIGKILL
        killed_at = time.monotonic()

        rescuer = Worker(queue_name, lambda j: {"pid": os.getpid()}, connection=redis_url,
                         lock_duration=1000, stalled_interval=500)
        rescuer.on("stalled", lambda job_id, prev: stalled.append(job_id))
        rescuer.on("completed", lambda j, result, prev: completed.append((j.id, result)))
        async with running(rescuer):
            await wait_until(lambda: bool(completed), 30, "the stalled job to be recovered and completed")
            recovered_in = time.monotonic() - killed_at
        print(f"killed worker's job recovered {recovered_in:.2f}s after SIGKILL")
        assert stalled == [job.id]
        assert completed == [(job.id, {"pid": os.getpid()})]
        # (a lost job waits for the next check: 0.5 s here; 15 s leaves room for a loaded machine)
        assert recovered_in < 15, f"recovery took {recovered_in:.1f}s"
        done = await queue.get_job(job.id)
        assert done is not None and done.attempts_started == 2 and done.stalled_counter == 1
        assert await queue.get_job_state(job.id) == "completed"


async def test_job_stalling_too_often_fails_as_node_says(redis_url: str, queue_name: str) -> None:
    """A job that keeps losing its lock (here: lock renewal off) is taken back once
    (max_stalled_count=1); on its second stall the check marks it (Node's deferred failure) and
    the worker that takes it next fails it, without running it, with Node's reason
    "job stalled more than allowable limit"."""
    starts: list[float] = []
    stalled: list[str] = []
    failed_events: list[tuple[str, str]] = []

    async def process(job: Any) -> str:
        starts.append(time.monotonic())
        await asyncio.sleep(2.0)
        return "too late"

    worker = Worker(queue_name, process, connection=redis_url, concurrency=3, lock_duration=400,
                    stalled_interval=300, max_stalled_count=1, skip_lock_renewal=True)
    worker.on("stalled", lambda job_id, prev: stalled.append(job_id))
    worker.on("failed", lambda job, err, prev: failed_events.append((job.id, str(err))))
    worker.on("error", lambda err: None)  # the stale attempts cannot finish a job they lost
    async with a_queue(queue_name, redis_url) as queue:
        async with running(worker, force_close=True):
            job = await queue.add("flaky", {})
            await wait_state(queue, job.id, "failed", 8)
            # Redis holds it failed a moment before the worker reads the reply and emits 'failed'
            await wait_until(lambda: failed_events, 15, "the worker's 'failed' event")
        failed = await queue.get_job(job.id)
        assert failed is not None
        assert failed.failed_reason == STALLED_REASON
        assert failed_events == [(job.id, STALLED_REASON)]
        assert stalled == [job.id, job.id]  # back to waiting twice; the third taker fails it
        assert len(starts) == 2, "the processor ran again after the stall limit was passed"
        assert failed.attempts_started == 3 and failed.stalled_counter == 2
        assert failed.returnvalue is None
        await asyncio.sleep(0.1)
        assert await queue.get_job_state(job.id) == "failed"
        assert await queue.get_job_counts("active", "waiting", "failed") == {
            "active": 0, "waiting": 0, "failed": 1}


# -- graceful shutdown -------------------------------------------------------------------------

async def test_sigterm_finishes_the_running_job_then_exits(redis_url: str, queue_name: str) -> None:
    """SIGTERM to a worker process running a job: the job completes, no new job is taken,
    and the process exits 0 soon after the job ends (its block of 30 s is not waited out)."""
    async with a_queue(queue_name, redis_url) as queue:
        async with WorkerProcess(redis_url, queue_name, "--drain-delay", "30") as proc:
            running_job = await queue.add("in-flight", {"sleep": 1.5})
            await proc.wait_event("started", 10, running_job.id)
            waiting_job = await queue.add("next", {"sleep": 0})
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.wait_for(proc.proc.wait(), 60)
            took = time.monotonic() - signalled
            print(f"SIGTERM: worker exited {took:.2f}s after the signal")
            await proc.wait_event("exit", 2)
            stderr = await proc.stderr()
            assert proc.proc.returncode == 0, stderr
        # (the job had <=1.5 s left; a worker that waits out its 30 s block takes ~30 s)
        assert took < 15, f"the worker took {took:.1f}s to stop after SIGTERM"
        assert proc.has("completed", running_job.id)
        assert not proc.has("started", waiting_job.id)
        assert await queue.get_job_state(running_job.id) == "completed"
        assert await queue.get_job_state(waiting_job.id) == "waiting"
        done = await queue.get_job(running_job.id)
        assert done is not None and done.returnvalue == {"pid": proc.proc.pid}


# -- Redis going away --------------------------------------------------------------------------


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
async def test_idle_worker_rides_out_a_redis_outage(fast_path: bool, queue_name: str) -> None:
    """Redis stops under an idle worker: it backs off quietly (few errors and log lines, little CPU),
    and once Redis is back on the same port it processes a new job."""
    server = RedisServer().start()
    port = server.port
    errors: list[BaseException] = []
    completed: list[str] = []
    records = Records()
    log = logging.getLogger("bullmq_compat")
    log.addHandler(records)
    old_level = log.level
    log.setLevel(logging.DEBUG)
    try:
        worker = Worker(queue_name, lambda job: "after outage", connection=server.url, drain_delay=1,
                        fast_path=fast_path)
        worker.on("error", errors.append)
        worker.on("completed", lambda job, result, prev: completed.append(job.id))
        async with running(worker, force_close=True):
            await asyncio.sleep(0.3)
            server.stop()
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(3)
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - wall0
            noisy = [r for r in records.records if r.levelno >= logging.INFO]
            print(f"outage ({'fast' if fast_path else 'redis-py'}): {len(errors)} error events, "
                  f"{len(noisy)} log lines, {cpu * 1000:.0f} ms CPU in {wall:.1f}s")
            assert len(errors) <= 5, f"{len(errors)} 'error' events in {wall:.1f}s of outage: {errors[:8]}"
            assert len(noisy) <= 5, f"{len(noisy)} log lines in {wall:.1f}s: {[r.getMessage() for r in noisy[:8]]}"
            assert cpu < 0.5, f"the idle worker used {cpu:.2f}s CPU in {wall:.1f}s of outage (busy loop?)"

            server = RedisServer(port=port).start()
            async with a_queue(queue_name, server.url) as queue:
                job = await queue.add("after", {})
                await wait_until(lambda: bool(completed), 15, "the job added after Redis came back")
                assert completed == [job.id]
                assert await queue.get_job_state(job.id) == "completed"
    finally:
        log.removeHandler(records)
        log.setLevel(old_level)
        server.stop()


# -- process isolation -------------------------------------------------------------------------

async def test_use_processes_runs_the_processor_in_a_child(redis_url: str, queue_name: str) -> None:
    results: list[Any] = []
    worker = Worker(queue_name, "tests.processors:cpu_task", use_processes=True, connection=redis_url)
    worker.on("completed", lambda job, result, prev: results.append(result))
    async with a_queue(queue_name, redis_url) as queue, running(worker):
        job = await queue.add("cpu", {"n": 1000})
        await wait_until(lambda: bool(results), 20, "the child-process job")
        done = await queue.get_job(job.id)  # while the queue is open (a closed one raises QueueClosed)
    assert results[0]["sum"] == sum(i * i for i in range(1000))
    assert results[0]["pid"] != os.getpid()
    assert done is not None and done.returnvalue == results[0]


async def test_a_crashing_child_fails_only_its_job(redis_url: str, queue_name: str) -> None:
    """A processor that calls os._exit(1) fails that job with a reason naming the child process;
    the next job runs in a fresh child and succeeds."""
    finished: list[tuple[str, str]] = []
    worker = Worker(queue_name, "tests.processors:crash_task", use_processes=True, connection=redis_url)
    worker.on("completed", lambda job, result, prev: finished.append((job.id, "completed")))
    worker.on("failed", lambda job, err, prev: finished.append((job.id, "failed")))
    async with a_queue(queue_name, redis_url) as queue, running(worker):
        crash = await queue.add("crash", {"crash": True})
        await wait_until(lambda: len(finished) >= 1, 20, "the crashing job to fail")
        after = await queue.add("fine", {"crash": False})
        await wait_until(lambda: len(finished) >= 2, 20, "the job after the crash")
        failed = await queue.get_job(crash.id)  # while the queue is open
        ok = await queue.get_job(after.id)
    assert finished == [(crash.id, "failed"), (after.id, "completed")]
    assert failed is not None and failed.failed_reason is not None
    assert "child process" in failed.failed_reason, failed.failed_reason
    assert ok is not None and ok.returnvalue["pid"] not in (os.getpid(), None)


# -- visible to operators ----------------------------------------------------------------------

@pytest.mark.node
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
async def test_named_worker_is_listed_in_python_and_node(redis_url: str, queue_name: str,
                                                         fast_path: bool) -> None:
    """name="billing-1": listed by queue.get_workers() and Node's queue.getWorkers() with rawname
    bull:<base64 queue>:w:billing-1, and stamped on the jobs it processes (processed_by)."""
    rawname = f"bull:{base64.b64encode(queue_name.encode()).decode()}:w:billing-1"
    completed: list[str] = []
    worker = Worker(queue_name, lambda job: "billed", connection=redis_url, name="billing-1", fast_path=fast_path)
    worker.on("completed", lambda job, result, prev: completed.append(job.id))
    async with a_queue(queue_name, redis_url) as queue, running(worker):
        job = await queue.add("invoice", {})
        await wait_until(lambda: bool(completed), 5, "the job")
        await asyncio.sleep(0.1)  # back to blocking on the marker
        ours = await queue.get_workers()
        assert [w["rawname"] for w in ours] == [rawname], ours
        assert ours[0]["name"] == queue_name
        theirs = await node("queueCall", redis=redis_url, queue=queue_name, method="getWorkers", args=[])
        assert [w["rawname"] for w in theirs] == [rawname], theirs
        assert theirs[0]["name"] == queue_name
        done = await queue.get_job(job.id)
        assert done is not None and done.processed_by == "billing-1"


async def test_closed_worker_leaves_the_list(redis_url: str, queue_name: str) -> None:
    worker = Worker(queue_name, lambda job: None, connection=redis_url, name="billing-2")
    async with a_queue(queue_name, redis_url) as queue:
        async with running(worker):
            await asyncio.sleep(0.1)
            assert len(await queue.get_workers()) == 1
        await asyncio.sleep(0.1)
        assert await queue.get_workers() == []
