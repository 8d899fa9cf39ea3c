"""Group rate limits (issue #28 section 1; BullMQ Pro's group.limit, rateLimitGroup,
getGroupRateLimitTtl) on Redis: Python workers, and unmodified Node workers with a keeper.

A limit is checked on the start times each run records (tests/group_helpers.py): per group, no
window of `duration` ms holds more than `max` starts, by the job's processedOn (the start the worker
writes into the job as it takes it, which the gate reads) -- never by one wall-clock bound. The
processor's own clock reading (t0) comes a moment later and is checked with a slack (`t0_slack`).
PostgreSQL is in tests/test_postgres_group_rate_limit.py. See docs/groups.md, "Group rate limits".
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, Mapping, Sequence

import pytest
import redis.asyncio as aioredis

from bullmq_compat import InvalidArgument, Worker
from bullmq_compat.sync import Queue as SyncQueue
from tests.group_helpers import (
    a_queue,
    check_groups,
    keeper_proc,
    node_workers,
    now_ms,
    python_workers,
    read_records,
    rec_key,
    recording_processor,
    wait_records,
    wait_until,
)


def t0_slack(duration: int) -> int:
    """The processor reads the clock a little after the worker wrote processedOn, and a loaded machine
    may delay one run's reading by hundreds of ms more than another's: the t0 check allows half a
    window (a gate that let starts bunch up would still fail it: its gaps would be near 0)."""
    return duration // 2


def starts_by_group(starts: Sequence[Mapping[str, Any]], key: str = "p") -> dict[str, list[int]]:
    by_group: dict[str, list[int]] = defaultdict(list)
    for start in starts:
        by_group[start["g"]].append(int(start[key]))
    return {g: sorted(times) for g, times in by_group.items()}


def assert_rate(times: Sequence[int], max_jobs: int, duration: int, what: str, slack: int = 0) -> None:
    """No window of `duration` ms holds more than `max_jobs` of `times` (sorted)."""
    for i in range(len(times) - max_jobs):
        gap = times[i + max_jobs] - times[i]
        assert gap >= duration - slack, (
            f"{what}: starts {i} and {i + max_jobs} are {gap} ms apart, so {max_jobs + 1} starts fell within "
            f"{duration} ms (limit {max_jobs}/{duration} ms): {list(times)}")


def check_rate_limited(starts: Sequence[Mapping[str, Any]], limits: Mapping[str, tuple[int, int]]) -> None:
    by_p, by_t0 = starts_by_group(starts, "p"), starts_by_group(starts, "t0")
    for g, (max_jobs, duration) in limits.items():
        assert_rate(by_p[g], max_jobs, duration, f"group {g} (processedOn)")
        assert_rate(by_t0[g], max_jobs, duration, f"group {g} (processor's clock)", t0_slack(duration))


def items(groups: Mapping[str, int], sleep_ms: int = 2) -> list[dict[str, Any]]:
    """add_bulk items, the groups' jobs interleaved, each group's in order s = 0, 1, ..."""
    out = []
    for s in range(max(groups.values())):
        for g, n in groups.items():
            if s < n:
                out.append({"name": "rl", "data": {"g": g, "s": s, "sleepMs": sleep_ms}, "opts": {"group": g}})
    return out


# -- settings and bad values --------------------------------------------------------------------------

@pytest.mark.parametrize("max_jobs, duration, bad", [
    (0, 1000, "max=0"), (-1, 1000, "max=-1"), (1.5, 1000, "max=1.5"), (True, 1000, "max=True"),
    ("10", 1000, "max='10'"), (10, 0, "duration=0"), (10, 1000.0, "duration=1000.0"),
    (10, False, "duration=False"), (10, None, "duration=None"), (2 ** 53, 1000, f"max={2 ** 53}"),
])
async def test_bad_values_are_refused_naming_the_value_and_nothing_is_written(
        redis_url: str, queue_name: str, redis: aioredis.Redis, max_jobs: Any, duration: Any, bad: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        for call in (lambda: queue.set_default_group_rate_limit(max_jobs, duration),
                     lambda: queue.set_group_rate_limit("A", max=max_jobs, duration=duration)):
            with pytest.raises(InvalidArgument, match="must be an int from 1 to") as info:
                await call()
            assert bad in str(info.value)
        with pytest.raises(InvalidArgument, match="group limit"):
            Worker(queue_name, lambda job: None, connection=redis_url,
                   group={"limit": {"max": max_jobs, "duration": duration}})
        assert await queue.get_group_rate_limit("A") is None
        assert await queue.get_group_rate_limit() is None
        assert not await redis.exists(f"bull:{queue_name}:grp:rlim")


async def test_bad_worker_group_option_shapes_are_refused(redis_url: str, queue_name: str) -> None:
    for group in ({"limit": {"max": 1}}, {"limit": [1, 1000]}, {"limits": {"max": 1, "duration": 1}}, "x",
                  {"concurrency": 0}):
        with pytest.raises(InvalidArgument, match="group"):
            Worker(queue_name, lambda job: None, connection=redis_url, group=group)


async def test_default_override_and_removal(redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_default_group_rate_limit(max=10, duration=1000)
        await queue.set_group_rate_limit("A", max=2, duration=500)
        assert await queue.get_group_rate_limit() == {"max": 10, "duration": 1000}
        assert await queue.get_group_rate_limit("A") == {"max": 2, "duration": 500}
        assert await queue.get_group_rate_limit("B") == {"max": 10, "duration": 1000}
        await queue.remove_group_rate_limit("A")
        assert await queue.get_group_rate_limit("A") == {"max": 10, "duration": 1000}
        await queue.remove_default_group_rate_limit()
        assert await queue.get_group_rate_limit("A") is None
        assert await queue.get_group_rate_limit_ttl("A") == 0


async def test_the_sync_api_mirrors_the_rate_limit_methods(redis_url: str, queue_name: str) -> None:
    def run() -> None:
        with SyncQueue(queue_name, connection=redis_url) as queue:
            queue.set_group_rate_limit("A", max=3, duration=700)
            assert queue.get_group_rate_limit("A") == {"max": 3, "duration": 700}
            assert queue.get_group_rate_limit_ttl("A") == 0
            with pytest.raises(InvalidArgument):
                queue.set_default_group_rate_limit(max=0, duration=1)
            queue.remove_group_rate_limit("A")
            assert queue.get_group_rate_limit("A") is None

    await asyncio.get_running_loop().run_in_executor(None, run)


async def test_a_limited_groups_next_job_waits_in_upstreams_delayed_set_and_get_groups_shows_it(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """max 1 per minute: the first job runs, the second is released to the delayed set due a
    minute after the first started (Bull-Board shows it delayed); the ttl says how long."""
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_rate_limit("A", max=1, duration=60_000)
        first = await queue.add("rl", {"g": "A", "s": 0}, group="A")
        second = await queue.add("rl", {"g": "A", "s": 1}, group="A")
        third = await queue.add("rl", {"g": "A", "s": 2}, group="A")
        assert await queue.get_job_state(second.id) == "waiting-children"
        process, client = recording_processor(redis_url, rec_key(queue_name))
        async with Worker(queue_name, process, connection=redis_url, drain_delay=0.5):
            await wait_records(redis, rec_key(queue_name), 1, 30, queue)
            await wait_until(lambda: _state_is(queue, second.id, "delayed"), 30, "the second job delayed")
        started = (await queue.get_job(first.id)).processed_on
        delayed = await queue.get_delayed()
        assert [job.id for job in delayed] == [second.id]
        score = await redis.zscore(f"bull:{queue_name}:delayed", second.id)
        assert int(score) // 0x1000 == started + 60_000
        assert await queue.get_job_state(third.id) == "waiting-children"
        ttl = await queue.get_group_rate_limit_ttl("A")
        assert 0 < ttl <= 60_000 and ttl >= started + 60_000 - now_ms() - 50
        groups = await queue.get_groups()
        assert [(g["id"], g["rate_limit"]) for g in groups] == [("A", {"max": 1, "duration": 60_000})]
        assert 0 < groups[0]["rate_limit_ttl"] <= 60_000
        assert await queue.get_group_rate_limit_ttl("other") == 0


async def _state_is(queue: Any, job_id: str, state: str) -> bool:
    return bool(await queue.get_job_state(job_id) == state)


# -- Python workers ---------------------------------------------------------------------------------------

async def test_python_workers_keep_each_limited_group_under_its_limit_and_others_are_not_slowed(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    rec = rec_key(queue_name)
    groups = {"A": 7, "B": 7, "free": 12}
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_rate_limit("A", max=2, duration=700)
        await queue.set_group_rate_limit("B", max=1, duration=400)
        await queue.add_bulk(items(groups))
        async with python_workers(redis_url, queue_name, 2, concurrency=5, sweep_interval=0.3):
            await wait_records(redis, rec, sum(groups.values()), 60, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, groups)
        check_rate_limited(starts, {"A": (2, 700), "B": (1, 400)})
        by_p = starts_by_group(starts)
        # the free group was not held back by the limited ones: it finished while they still waited
        assert by_p["free"][-1] < by_p["A"][-1] and by_p["free"][-1] < by_p["B"][-1]
        assert await queue.get_groups() == []


async def test_python_workers_rate_limit_with_group_concurrency(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """k = 3 at once, at most 4 starts per 800 ms: both hold; a group with k = 3 and no limit runs freely."""
    rec = rec_key(queue_name)
    groups = {"A": 14, "free": 14}
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_concurrency("A", 3)
        await queue.set_group_concurrency("free", 3)
        await queue.set_group_rate_limit("A", max=4, duration=800)
        await queue.add_bulk(items(groups, sleep_ms=30))
        async with python_workers(redis_url, queue_name, 2, concurrency=6, sweep_interval=0.3):
            await wait_records(redis, rec, sum(groups.values()), 60, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, groups, k=3)
        check_rate_limited(starts, {"A": (4, 800)})
        by_p = starts_by_group(starts)
        assert by_p["free"][-1] < by_p["A"][-1]


async def test_the_worker_group_limit_option_sets_the_default_for_every_group(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    rec = rec_key(queue_name)
    groups = {"A": 5, "B": 5, "C": 5}
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_rate_limit("C", max=5, duration=50)  # its own: the default does not apply
        await queue.add_bulk(items(groups))
        async with python_workers(redis_url, queue_name, 1, concurrency=6, sweep_interval=0.3,
                                  group={"limit": {"max": 2, "duration": 600}}) as workers:
            assert workers[0].group_options == {"limit": (2, 600)}
            await wait_records(redis, rec, sum(groups.values()), 60, queue)
        assert await queue.get_group_rate_limit() == {"max": 2, "duration": 600}
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, groups)
        check_rate_limited(starts, {"A": (2, 600), "B": (2, 600), "C": (5, 50)})
        by_p = starts_by_group(starts)
        assert by_p["C"][-1] < by_p["A"][-1]  # 5 per 50 ms: C is not held to the default


async def test_rate_limit_group_from_a_processor_holds_the_group_and_the_job_waits_its_turn(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Job A:0 calls rate_limit_group(job, 2500) on its first run: it goes back (delayed, first of its
    group) and no job of A starts for 2.5 s, while B runs; then A runs in order, A:0 first."""
    rec = rec_key(queue_name)
    limit_ms = 2500
    process, client = recording_processor(redis_url, rec)
    limited_at: list[int] = []
    ttl_seen: list[int] = []

    async def processor(job: Any) -> Any:
        if job.data["g"] == "A" and job.data["s"] == 0 and not limited_at:
            limited_at.append(now_ms())
            await worker.rate_limit_group(job, limit_ms)
            ttl_seen.append(await queue.get_group_rate_limit_ttl("A"))
            from bullmq_compat import RateLimitError

            raise RateLimitError()  # as Pro's docs ask (returning would do as well)
        return await process(job)

    groups = {"A": 4, "B": 12}
    async with a_queue(queue_name, redis_url) as queue:
        worker = Worker(queue_name, processor, connection=redis_url, concurrency=4, group_sweep_interval=0.3)
        errors: list[Any] = []
        worker.on("error", errors.append)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await queue.add_bulk(items(groups, sleep_ms=20))
            await wait_until(lambda: _true(bool(limited_at)), 30, "the rate limit call")
            await wait_records(redis, rec, sum(groups.values()), 60, queue)
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
            await client.aclose()
        assert errors == []
        assert 0 < ttl_seen[0] <= limit_ms
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, groups)
        a_starts = [s for s in starts if s["g"] == "A"]
        assert [s["s"] for s in a_starts][:1] == [0]
        for start in a_starts:
            assert start["p"] >= limited_at[0] + limit_ms - 5, start
        b_before = [s for s in starts if s["g"] == "B" and s["p"] < limited_at[0] + limit_ms]
        assert b_before, "group B did not run while A was rate-limited"
        job_a0 = [s for s in a_starts if s["s"] == 0][0]
        a0 = await queue.get_job(job_a0["id"])
        assert a0.failed_reason is None and a0.attempts_made == 1  # handed back, not failed: one attempt made
        assert await queue.get_group_rate_limit_ttl("A") == 0


async def test_rate_limit_group_also_delays_the_groups_released_jobs_not_started_yet(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """k = 2: A:0 and A:1 are both released; A:0 is taken and rate-limits its group: A:1, waiting in
    the queue where any Node worker could take it, goes to the delayed set until the limit ends too."""
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_concurrency("A", 2)
        first = await queue.add("rl", {}, group="A")
        second = await queue.add("rl", {}, group="A")
        third = await queue.add("rl", {}, group="A")
        assert await queue.get_job_state(second.id) == "waiting"
        taker = Worker(queue_name, None, connection=redis_url, group_keeper=False)
        try:
            job = await taker.get_next_job("manual-token", block=False)
            assert job is not None and job.id == first.id
            before = now_ms()
            await taker.rate_limit_group(job, 60_000)
            after = now_ms()
            with pytest.raises(Exception, match="lock|not active|Missing"):
                await taker.rate_limit_group(job, 60_000)  # no longer active: upstream's refusal
        finally:
            await taker.close()
        for job_id in (first.id, second.id):
            assert await queue.get_job_state(job_id) == "delayed"
            due = int(await redis.zscore(f"bull:{queue_name}:delayed", job_id)) // 0x1000
            assert before + 60_000 <= due <= after + 60_000
        assert await queue.get_job_state(third.id) == "waiting-children"
        assert (await queue.get_job(first.id)).processed_on is None  # not started, as far as the limit goes
        ttl = await queue.get_group_rate_limit_ttl("A")
        assert 50_000 < ttl <= 60_000
        groups = {g["id"]: g for g in await queue.get_groups()}
        assert groups["A"]["rate_limit"] is None and 50_000 < groups["A"]["rate_limit_ttl"] <= 60_000


async def _true(value: bool) -> bool:
    return value


async def test_rate_limit_group_refuses_a_plain_job_and_a_bad_ms(redis_url: str, queue_name: str) -> None:
    seen: list[BaseException] = []

    async def processor(job: Any) -> Any:
        for ms in (0, 1.5, True):
            try:
                await worker.rate_limit_group(job, ms)
            except InvalidArgument as err:
                seen.append(err)
        try:
            await worker.rate_limit_group(job, 100)
        except InvalidArgument as err:
            seen.append(err)
        return "ok"

    async with a_queue(queue_name, redis_url) as queue:
        worker = Worker(queue_name, processor, connection=redis_url)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        job = await queue.add("plain", {})
        await wait_until(lambda: _state_is(queue, job.id, "completed"), 30, "the plain job completed")
        await worker.close()
        await asyncio.wait_for(task, 20)
    assert len(seen) == 4
    assert all("ms=" in str(e) for e in seen[:3])
    assert "needs a group job" in str(seen[3])


# -- Node workers with a keeper ---------------------------------------------------------------------------

async def test_node_workers_with_a_keeper_honour_group_rate_limits(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    rec = rec_key(queue_name)
    groups = {"A": 6, "B": 6, "free": 10}
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_default_group_rate_limit(max=2, duration=700)
        await queue.set_group_rate_limit("free", max=1000, duration=1)
        await queue.set_group_concurrency("B", 2)
        await queue.add_bulk(items(groups))
        async with keeper_proc(redis_url, queue_name, 0.5), \
                node_workers(redis_url, queue_name, workers=2, concurrency=5):
            await wait_records(redis, rec, sum(groups.values()), 90, queue)
        ends, starts = await read_records(redis, rec)
        assert {s["w"] for s in starts} == {"node"}
        check_groups(ends, starts, groups, k=2)  # (A and free: one at a time, below)
        check_rate_limited(starts, {"A": (2, 700), "B": (2, 700)})
        by_p = starts_by_group(starts)
        assert by_p["free"][-1] < by_p["A"][-1]
        for g in ("A", "free"):
            assert [s["s"] for s in starts if s["g"] == g] == list(range(groups[g])), g


async def test_node_workers_honour_a_manual_group_rate_limit(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A Python worker takes A:0 and rate-limits its group for 10 s; Node workers (and a keeper) then
    run everything: no job of A (A:0 again first) starts before the limit ends; B runs meanwhile."""
    rec = rec_key(queue_name)
    limit_ms = 10_000
    async with a_queue(queue_name, redis_url) as queue:
        for s in range(3):
            await queue.add("rl", {"g": "A", "s": s, "sleepMs": 2}, group="A")
        taker = Worker(queue_name, None, connection=redis_url, group_keeper=False)
        job = await taker.get_next_job("manual-token", block=False)
        assert job is not None and job.data["s"] == 0
        limited_at = now_ms()
        await taker.rate_limit_group(job, limit_ms)
        await taker.close()
        assert await queue.get_job_state(job.id) == "delayed"
        assert 0 < await queue.get_group_rate_limit_ttl("A") <= limit_ms
        async with keeper_proc(redis_url, queue_name, 0.5), \
                node_workers(redis_url, queue_name, workers=1, concurrency=4):
            ready_at = now_ms()
            for s in range(5):
                await queue.add("rl", {"g": "B", "s": s, "sleepMs": 2}, group="B")
            await wait_records(redis, rec, 8, 90, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {"A": 3, "B": 5})
        for start in starts:
            if start["g"] == "A":
                assert start["p"] >= limited_at + limit_ms - 5, start
        if ready_at < limited_at + limit_ms - 3000:  # the machine kept up: B ran while A was limited
            assert all(s["p"] < limited_at + limit_ms for s in starts if s["g"] == "B"), starts


async def test_a_batch_worker_with_group_affinity_keeps_the_rate_limit(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """group_affinity takes a group's held jobs straight into a batch: no more of them than the
    group's rate limit lets start now (the rest are released, delayed, by the gate)."""
    started: list[tuple[str, int, int]] = []

    async def process(job: Any) -> None:
        for member in job.get_batch():
            started.append((member.data["g"], member.data["s"], int(member.processed_on)))
        await asyncio.sleep(0.01)

    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_rate_limit("A", max=2, duration=600)
        await queue.add_bulk(items({"A": 8, "B": 8}, sleep_ms=0))
        worker = Worker(queue_name, process, connection=redis_url, batch={"size": 5, "group_affinity": True},
                        group_sweep_interval=0.3, drain_delay=0.5)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await wait_until(lambda: _true(len(started) >= 16), 60, "16 jobs run")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
    assert sorted((g, s) for g, s, _ in started) == sorted([("A", s) for s in range(8)] + [("B", s) for s in range(8)])
    assert [s for g, s, _ in started if g == "A"] == list(range(8))
    assert_rate(sorted(p for g, _, p in started if g == "A"), 2, 600, "group A in batches (processedOn)")


async def test_a_processor_that_returns_after_rate_limit_group_is_not_finished_nor_renewed(
        redis_url: str, queue_name: str) -> None:
    """Returning (not raising) after rate_limit_group, even after its lock would have been renewed:
    no error, the job is not completed by that run, and it runs again once the limit is over."""
    runs: list[tuple[str, int]] = []
    errors: list[Any] = []

    async def processor(job: Any) -> str:
        runs.append((str(job.id), now_ms()))
        if len(runs) == 1:
            await worker.rate_limit_group(job, 1500)
            await asyncio.sleep(1.2)  # past two lock renewals (lock_duration 1000)
        return "done"

    async with a_queue(queue_name, redis_url) as queue:
        worker = Worker(queue_name, processor, connection=redis_url, lock_duration=1000, drain_delay=0.5)
        worker.on("error", errors.append)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            job = await queue.add("rl", {}, group="A")
            await wait_until(lambda: _state_is(queue, job.id, "completed"), 30, "the job completed")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
    assert errors == []
    assert [r[0] for r in runs] == [job.id, job.id]
    assert runs[1][1] >= runs[0][1] + 1500 - 5


# -- Redis Cluster: every key under the queue's prefix ------------------------------------------------------

async def _exercise_rate_limits(url: str, prefix: str, queue_name: str) -> None:
    """Every rate-limit path: the settings, releases (to wait and to delayed), a keeper sweep, the
    ttl, get_groups, batches with affinity, and rate_limit_group."""
    limited: list[str] = []

    async def process(job: Any) -> None:
        if job.data["g"] == "r0" and not limited:
            limited.append(str(job.id))
            await worker.rate_limit_group(job, 200)

    async with a_queue(queue_name, url, prefix=prefix) as queue:
        await queue.set_default_group_rate_limit(max=2, duration=300)
        await queue.set_group_rate_limit("r1", max=1, duration=200)
        await queue.set_group_concurrency("r0", 2)
        await queue.add_bulk(items({"r0": 4, "r1": 3}, sleep_ms=0))
        await queue.get_group_rate_limit_ttl("r1")
        await queue.get_groups()
        await queue.sweep_groups()
        worker = Worker(queue_name, process, connection=url, prefix=prefix, concurrency=3, group_sweep_interval=0.2,
                        drain_delay=0.5)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            async def settled() -> bool:
                counts = await queue.get_job_counts("completed")
                return counts["completed"] == 7
            await wait_until(settled, 30, "every job to finish")
        finally:
            await worker.close()
            await task
        assert limited
        await queue.add_bulk(items({"r2": 3}, sleep_ms=0))
        batcher = Worker(queue_name, lambda job: None, connection=url, prefix=prefix, drain_delay=0.5,
                         batch={"size": 3, "group_affinity": True})
        task = asyncio.ensure_future(batcher.run(handle_signals=False))
        try:
            await wait_until(lambda: _completed(queue, 10), 30, "the batch's jobs to finish")
        finally:
            await batcher.close()
            await task
        await queue.remove_group_rate_limit("r1")
        await queue.remove_default_group_rate_limit()


async def _completed(queue: Any, n: int) -> bool:
    return bool((await queue.get_job_counts("completed"))["completed"] >= n)


async def test_rate_limit_scripts_write_only_keys_under_a_hash_tagged_prefix() -> None:
    from tests.test_groups import private_redis

    async with private_redis() as url:
        await _exercise_rate_limits(url, "{bull}", "clustered")
        redis = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            keys = await redis.keys("*")
        finally:
            await redis.aclose()
        assert any(":grp:rlog:" in k for k in keys), keys
        stray = [k for k in keys if not k.startswith("{bull}:")]
        assert stray == [], f"keys outside the hash-tagged prefix: {stray}"


async def test_rate_limit_scripts_run_on_a_cluster_node_serving_only_the_prefix_slot() -> None:
    from tests.test_groups import _cluster_ok, _crc16, private_redis

    async with private_redis("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                             "--cluster-require-full-coverage", "no") as url:
        admin = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            await admin.execute_command("CLUSTER", "ADDSLOTS", _crc16(b"bull") % 16384)
            await wait_until(lambda: _cluster_ok(admin), 10, "the cluster node to take its slot")
            await _exercise_rate_limits(url.replace("/0", ""), "{bull}", "clustered")
        finally:
            await admin.aclose()
