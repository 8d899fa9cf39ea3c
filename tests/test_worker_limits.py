"""Issue #3: the worker's limits — rate limiter, RateLimitError, global rate limit and concurrency,
local concurrency — and how fast an idle worker wakes for a new or a delayed job.

Timings are measured with wall clocks around real Redis round trips, so every bound leaves
room for a loaded machine while still failing the known-bad behaviours (a broken limiter that
takes ~50 s for 10 jobs, an idle worker that sleeps through adds, a delayed job that runs late).
Lower bounds are what a limit must hold (a slow machine only adds to them); spacing is judged by
the median gap, which one late-started job does not move; "n at once" is reached by jobs that wait
(a while, bounded) for their peers, not by hoping the fetches land within one job's run.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Awaitable, Callable

import pytest

from bullmq_compat import RateLimitError, Worker
from tests.helpers import a_queue, running, wait_until

# the largest integer a JS number holds exactly: what Node's worker.rateLimit() stores
NODE_RATE_LIMIT_VALUE = str(2**53 - 1)


class InFlight:
    """Counts jobs running at once, across every worker that shares it."""

    def __init__(self) -> None:
        self.now = 0
        self.max = 0
        self.done = 0

    def wrap(self, seconds: float, *, peers: int = 1, total: int = 0) -> Callable[[Any], Awaitable[str]]:
        """A processor of ``seconds``; with ``peers``, it first waits (up to 5 s) until that many jobs
        run at once (or all ``total`` jobs are running or done)."""
        async def process(job: Any) -> str:
            self.now += 1
            self.max = max(self.max, self.now)
            try:
                deadline = time.monotonic() + 5
                while self.now < peers and self.now + self.done < total and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(seconds)
            finally:
                self.now -= 1
                self.done += 1
            return "ok"
        return process


# -- rate limiting -----------------------------------------------------------------------------

async def test_worker_limiter_spaces_jobs(redis_url: str, queue_name: str) -> None:
    """limiter={"max": 1, "duration": 200}: 10 jobs take ~1.8 s, one every ~200 ms."""
    starts: list[float] = []

    async def process(job: Any) -> int:
        starts.append(time.monotonic())
        return job.data["i"]

    async with a_queue(queue_name, redis_url) as queue, running(
            Worker(queue_name, process, connection=redis_url, limiter={"max": 1, "duration": 200})):
        t0 = time.monotonic()
        await queue.add_bulk([{"name": "limited", "data": {"i": i}} for i in range(10)])
        await wait_until(lambda: len(starts) == 10, 30, "10 rate-limited jobs")
        elapsed = time.monotonic() - t0
        print(f"limiter: 10 jobs in {elapsed:.3f}s")
        assert 1.6 <= elapsed <= 15.0, f"10 jobs at 1 per 200 ms took {elapsed:.2f}s"
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert starts[-1] - starts[0] >= 1.6, f"10 jobs started within {starts[-1] - starts[0]:.2f}s"
        assert statistics.median(gaps) >= 0.15, f"jobs started {gaps} s apart under a 1/200ms limit"
        assert await queue.get_job_counts("completed") == {"completed": 10}


def _state_other_than(job: Any, state: str) -> Callable[[], Awaitable[Any]]:
    async def other() -> Any:
        now = await job.get_state()
        return now if now != state else None
    return other


def _state_is(job: Any, state: str) -> Callable[[], Awaitable[bool]]:
    async def reached() -> bool:
        return bool(await job.get_state() == state)
    return reached


async def test_rate_limit_error_puts_job_back_to_waiting(redis_url: str, queue_name: str, redis: Any) -> None:
    """worker.rate_limit(1500) + RateLimitError: the job goes back to waiting and runs again ~1.5 s later,
    whichever worker takes it (the limit is the queue's, stored as Node stores it)."""
    runs: list[float] = []
    limiter = {"max": 10, "duration": 1000}
    first: Worker

    async def process(job: Any) -> str:
        runs.append(time.monotonic())
        if len(runs) == 1:
            await first.rate_limit(1500)
            raise RateLimitError()
        return "second time lucky"

    first = Worker(queue_name, process, connection=redis_url, limiter=limiter)
    # a second, idle worker: it must honour the limit too, not grab the job back at once
    second = Worker(queue_name, process, connection=redis_url, limiter=limiter)
    async with a_queue(queue_name, redis_url) as queue, running(first), running(second):
        job = await queue.add("limited", {"x": 1})
        await wait_until(lambda: len(runs) >= 1, 15, "the first run")
        state = await wait_until(_state_other_than(job, "active"), 5, "the job to leave active")
        limiter = await redis.get(f"bull:{queue_name}:limiter")
        if time.monotonic() - runs[0] < 1.4:  # looked within the limit (else the machine was too slow)
            assert state == "waiting"
            assert limiter == NODE_RATE_LIMIT_VALUE
        await wait_until(lambda: len(runs) >= 2, 15, "the job to run again")
        again = runs[1] - runs[0]
        assert 1.45 <= again <= 10, f"ran again {again * 1000:.0f} ms after rate_limit(1500)"
        await wait_until(_state_is(job, "completed"), 15, "the job to complete")
        done = await queue.get_job(job.id)
        assert done is not None and done.returnvalue == "second time lucky"
        assert done.failed_reason is None and len(runs) == 2


async def test_global_rate_limit_is_honoured(redis_url: str, queue_name: str) -> None:
    """queue.set_global_rate_limit(1, 250) limits workers that have no limiter of their own."""
    starts: list[float] = []

    async def process(job: Any) -> None:
        starts.append(time.monotonic())

    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_global_rate_limit(1, 250)
        async with running(Worker(queue_name, process, connection=redis_url, concurrency=4)):
            t0 = time.monotonic()
            await queue.add_bulk([{"name": "g", "data": {"i": i}} for i in range(6)])
            await wait_until(lambda: len(starts) == 6, 30, "6 globally rate-limited jobs")
            elapsed = time.monotonic() - t0
        assert 1.15 <= elapsed <= 15.0, f"6 jobs at 1 per 250 ms took {elapsed:.2f}s"
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert starts[-1] - starts[0] >= 1.15, f"6 jobs started within {starts[-1] - starts[0]:.2f}s"
        assert statistics.median(gaps) >= 0.2, f"jobs started {gaps} s apart under a 1/250ms limit"


async def test_global_concurrency_caps_all_workers(redis_url: str, queue_name: str) -> None:
    """set_global_concurrency(2): two workers of concurrency 5 never run more than 2 jobs at once."""
    flight = InFlight()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_global_concurrency(2)
        assert await queue.get_global_concurrency() == 2
        # each job waits for a peer (up to 5 s) before its 100 ms: 2 at once is reached on any machine;
        # a third would be seen if the cap let one in
        processor = flight.wrap(0.1, peers=2, total=12)
        async with running(Worker(queue_name, processor, connection=redis_url, concurrency=5)), \
                running(Worker(queue_name, processor, connection=redis_url, concurrency=5)):
            t0 = time.monotonic()
            await queue.add_bulk([{"name": "c", "data": {"i": i}} for i in range(12)])
            await wait_until(lambda: flight.done == 12, 30, "12 jobs under global concurrency 2")
            elapsed = time.monotonic() - t0
        assert flight.max == 2, f"{flight.max} jobs ran at once under global concurrency 2"
        assert elapsed >= 0.55, f"12 jobs of 100 ms, 2 at a time, took only {elapsed:.2f}s"
        assert await queue.get_job_counts("completed") == {"completed": 12}


# -- local concurrency -------------------------------------------------------------------------

async def test_concurrency_runs_jobs_in_parallel_and_no_more(redis_url: str, queue_name: str) -> None:
    """20 jobs of 200 ms at concurrency 10: two rounds, ~0.4 s; never more than 10 at once."""
    flight = InFlight()
    async with a_queue(queue_name, redis_url) as queue, running(
            Worker(queue_name, flight.wrap(0.2, peers=10, total=20), connection=redis_url, concurrency=10)):
        t0 = time.monotonic()
        await queue.add_bulk([{"name": "p", "data": {"i": i}} for i in range(20)])
        await wait_until(lambda: flight.done == 20, 30, "20 jobs at concurrency 10")
        elapsed = time.monotonic() - t0
        print(f"concurrency: 20 x 200 ms jobs in {elapsed:.3f}s")
    assert flight.max <= 10, f"{flight.max} jobs ran at once at concurrency 10"
    assert flight.max == 10, f"only {flight.max} jobs ran at once at concurrency 10"
    # (serial would be 4 s: flight.max says it was not; the upper bound only catches a hang-like stall)
    assert 0.4 <= elapsed <= 15, f"20 x 200 ms jobs at concurrency 10 took {elapsed:.2f}s"


# -- waking up ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
async def test_idle_worker_wakes_at_once_for_a_new_job(redis_url: str, queue_name: str, fast_path: bool) -> None:
    """After idling longer than drain_delay, a worker takes a newly added job at once: well within one
    drain_delay (2 s), which is how late a worker that sleeps through adds would be."""
    active_at: list[float] = []
    drained: list[float] = []
    worker = Worker(queue_name, lambda job: "woke", connection=redis_url, drain_delay=2, fast_path=fast_path)
    worker.on("active", lambda job, prev: active_at.append(time.monotonic()))
    worker.on("drained", lambda: drained.append(time.monotonic()))
    async with a_queue(queue_name, redis_url) as queue, running(worker):
        await queue.get_job_counts()  # connected: the add below is one round trip
        await asyncio.sleep(4.3)  # idle for more than two drain_delay periods
        assert drained and not active_at
        t0 = time.monotonic()
        await queue.add("wake", {})
        await wait_until(lambda: bool(active_at), 15, "the idle worker to take the job")
        latency = active_at[0] - t0
        print(f"idle wake ({'fast' if fast_path else 'redis-py'}): {latency * 1000:.1f} ms")
        assert latency < 1.0, f"idle worker took {latency * 1000:.0f} ms to take a new job"


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
async def test_delayed_job_runs_on_time_on_an_idle_worker(redis_url: str, queue_name: str, fast_path: bool) -> None:
    """A job delayed 8 s, added to an idle worker (drain_delay 5 s), runs 8 s later (not early; late by
    less than half the drain_delay it would wait if the worker missed it)."""
    active_at: list[float] = []
    worker = Worker(queue_name, lambda job: "late?", connection=redis_url, fast_path=fast_path)
    worker.on("active", lambda job, prev: active_at.append(time.monotonic()))
    async with a_queue(queue_name, redis_url) as queue, running(worker):
        await queue.get_job_counts()
        await asyncio.sleep(0.3)  # the worker is blocked on the marker
        t0 = time.monotonic()
        job = await queue.add("later", {}, delay=8000)
        assert await job.get_state() == "delayed"
        await wait_until(lambda: bool(active_at), 30, "the delayed job to become active")
        error = active_at[0] - t0 - 8.0
        print(f"delayed 8 s ({'fast' if fast_path else 'redis-py'}): ran {error * 1000:+.0f} ms off")
        assert -0.1 <= error <= 2.5, f"an 8 s delayed job ran {error:+.2f}s off schedule"
        await wait_until(_state_is(job, "completed"), 15, "the job to complete")
