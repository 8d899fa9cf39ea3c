"""Queue and Job against a real Redis: one behaviour per test."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from bullmq_compat import Job, Queue, Worker

ALL_STATES = {"active", "completed", "delayed", "failed", "prioritized", "waiting", "waiting-children"}


@pytest.fixture
async def queue(redis_url: str, queue_name: str) -> AsyncIterator[Queue]:
    async with Queue(queue_name, connection=redis_url) as q:
        yield q


def now_ms() -> int:
    return int(time.time() * 1000)


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def process_all(redis_url: str, queue: Queue, count: int) -> None:
    """Run a Python Worker until ``count`` jobs are finished (completed or failed).

    Jobs whose data has ``"fail"`` raise with that message; others return ``{"done": <data>}``.
    """
    async def processor(job: Job) -> Any:
        if isinstance(job.data, dict) and "fail" in job.data:
            raise RuntimeError(job.data["fail"])
        return {"done": job.data}

    worker = Worker(queue.name, processor, connection=redis_url)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        async def finished() -> bool:
            counts = await queue.get_job_counts("completed", "failed")
            return counts["completed"] + counts["failed"] >= count
        await wait_for(finished)
    finally:
        await worker.close()
        await task


# -- adding ---------------------------------------------------------------------------------------
async def test_add_returns_the_job(queue: Queue, redis: Any) -> None:
    before = now_ms()
    job = await queue.add("email", {"to": "a@example.org", "n": [1, 2]}, attempts=3)
    after = now_ms()
    assert isinstance(job, Job)
    assert job.id == "1"
    assert job.name == "email"
    assert job.data == {"to": "a@example.org", "n": [1, 2]}
    assert job.opts == {"attempts": 3}
    assert before <= job.timestamp <= after
    stored = await redis.hgetall(f"bull:{queue.name}:1")
    assert stored["name"] == "email"
    assert json.loads(stored["data"]) == job.data
    assert json.loads(stored["opts"]) == {"attempts": 3}
    assert int(stored["timestamp"]) == job.timestamp


async def test_add_without_data_stores_empty_object(queue: Queue, redis: Any) -> None:
    job = await queue.add("nodata")
    assert job.data == {}
    assert await redis.hget(f"bull:{queue.name}:{job.id}", "data") == "{}"


async def test_ids_are_sequential_numbers_as_strings(queue: Queue, redis: Any) -> None:
    ids = [(await queue.add("n", {"i": i})).id for i in range(3)]
    assert ids == ["1", "2", "3"]
    assert await redis.get(f"bull:{queue.name}:id") == "3"


async def test_custom_job_id(queue: Queue, redis: Any) -> None:
    job = await queue.add("n", {"v": 1}, job_id="order-42")
    assert job.id == "order-42"
    assert await redis.hget(f"bull:{queue.name}:order-42", "name") == "n"
    assert await redis.lrange(f"bull:{queue.name}:wait", 0, -1) == ["order-42"]
    fetched = await queue.get_job("order-42")
    assert fetched is not None and fetched.data == {"v": 1}


async def test_duplicate_job_id_returns_existing_without_overwriting(queue: Queue, redis: Any) -> None:
    first = await queue.add("first", {"v": 1}, job_id="same")
    second = await queue.add("second", {"v": 2}, job_id="same", delay=5000)
    assert second.id == first.id == "same"
    stored = await redis.hgetall(f"bull:{queue.name}:same")
    assert stored["name"] == "first" and stored["data"] == '{"v":1}' and stored["delay"] == "0"
    assert await redis.lrange(f"bull:{queue.name}:wait", 0, -1) == ["same"]
    assert await redis.zcard(f"bull:{queue.name}:delayed") == 0


class CountingConnection(Connection):
    """Counts writes to Redis: each send is one round trip (the replies are read after it)."""

    sends = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        await super().send_packed_command(command, check_health)


async def _evalsha_calls(redis: Any) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_add_bulk_keeps_order_in_one_round_trip(redis_url: str, queue_name: str, redis: Any) -> None:
    pool = aioredis.ConnectionPool.from_url(redis_url, decode_responses=True, connection_class=CountingConnection)
    client = aioredis.Redis(connection_pool=pool)
    try:
        async with Queue(queue_name, connection=client) as queue:
            # load the three add scripts and open the connection before counting
            await queue.add("warm", {}, job_id="w1")
            await queue.add("warm", {}, job_id="w2", delay=60000)
            await queue.add("warm", {}, job_id="w3", priority=1)
            sends, evals = CountingConnection.sends, await _evalsha_calls(redis)
            jobs = await queue.add_bulk([
                {"name": "a", "data": {"i": 0}},
                {"name": "b", "data": {"i": 1}, "opts": {"delay": 60000}},
                {"name": "c", "data": {"i": 2}, "opts": {"priority": 3}},
                {"name": "d", "data": {"i": 3}, "opts": {"job_id": "custom"}},
                {"name": "e"},
            ])
            assert CountingConnection.sends - sends == 1
            assert await _evalsha_calls(redis) - evals == 5
            # while the queue is open: a closed Queue's jobs raise QueueClosed
            assert [await j.get_state() for j in jobs] == ["waiting", "delayed", "prioritized", "waiting", "waiting"]
    finally:
        await client.aclose()
    assert [j.name for j in jobs] == ["a", "b", "c", "d", "e"]
    assert [j.data for j in jobs] == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}, {}]
    assert [j.id for j in jobs] == ["4", "5", "6", "custom", "8"]
    assert [await redis.hget(f"bull:{queue_name}:{j.id}", "name") for j in jobs] == ["a", "b", "c", "d", "e"]


async def test_add_bulk_of_nothing(queue: Queue) -> None:
    assert await queue.add_bulk([]) == []


async def test_delayed_job_is_delayed(queue: Queue, redis: Any) -> None:
    job = await queue.add("later", {}, delay=60000)
    assert await job.get_state() == "delayed"
    assert job.delay == 60000
    assert await redis.zscore(f"bull:{queue.name}:delayed", job.id) is not None
    assert await redis.llen(f"bull:{queue.name}:wait") == 0


async def test_priority_job_is_prioritized(queue: Queue, redis: Any) -> None:
    job = await queue.add("urgent", {}, priority=7)
    assert await job.get_state() == "prioritized"
    assert job.priority == 7
    assert await redis.zscore(f"bull:{queue.name}:prioritized", job.id) is not None


async def test_lifo_jobs_come_first(queue: Queue) -> None:
    await queue.add("a", {})
    await queue.add("b", {})
    await queue.add("c", {}, lifo=True)
    # asc=True is processing order: the LIFO job first, then the others oldest first
    assert [j.name for j in await queue.get_jobs("waiting", asc=True)] == ["c", "a", "b"]
    assert [j.name for j in await queue.get_jobs("waiting", asc=False)] == ["b", "a", "c"]
    assert [j.name for j in await queue.get_waiting()] == ["c", "a", "b"]


async def test_get_job_of_missing_id_is_none(queue: Queue) -> None:
    assert await queue.get_job("404") is None
    await queue.add("n", {})
    assert await queue.get_job("404") is None


async def test_get_job_reads_every_field(queue: Queue) -> None:
    added = await queue.add("n", {"v": [1, "x"]}, delay=60000, attempts=2)
    job = await queue.get_job(added.id)
    assert job is not None
    assert (job.id, job.name, job.data, job.timestamp) == (added.id, "n", {"v": [1, "x"]}, added.timestamp)
    assert job.opts == {"delay": 60000, "attempts": 2}
    assert (job.delay, job.priority, job.attempts_made, job.attempts_started) == (60000, 0, 0, 0)
    assert (job.processed_on, job.finished_on, job.returnvalue, job.failed_reason) == (None, None, None, None)
    assert (job.stacktrace, job.progress, job.parse_error) == ([], 0, None)


async def test_get_job_counts_default_states(queue: Queue) -> None:
    assert await queue.get_job_counts() == dict.fromkeys(ALL_STATES, 0)
    await queue.add("w", {})
    await queue.add("w", {})
    await queue.add("d", {}, delay=60000)
    await queue.add("p", {}, priority=2)
    counts = await queue.get_job_counts()
    assert set(counts) == ALL_STATES
    assert counts == {**dict.fromkeys(ALL_STATES, 0), "waiting": 2, "delayed": 1, "prioritized": 1}
    assert await queue.get_job_counts("delayed", "waiting") == {"delayed": 1, "waiting": 2}


async def test_get_jobs_types_start_end_asc(queue: Queue) -> None:
    for i in range(4):
        await queue.add(f"w{i}", {})
    for i in range(3):
        await queue.add(f"d{i}", {}, delay=60000 + i * 1000)
    names = lambda jobs: [j.name for j in jobs]  # noqa: E731
    assert names(await queue.get_jobs(["waiting"], 0, -1, asc=True)) == ["w0", "w1", "w2", "w3"]
    assert names(await queue.get_jobs(["waiting"], 1, 2, asc=True)) == ["w1", "w2"]
    assert names(await queue.get_jobs(["waiting"], 0, 0, asc=False)) == ["w3"]
    assert names(await queue.get_jobs(["delayed"], asc=True)) == ["d0", "d1", "d2"]
    assert names(await queue.get_jobs(["delayed"], asc=False)) == ["d2", "d1", "d0"]
    assert names(await queue.get_jobs(["delayed"], 0, 1, asc=True)) == ["d0", "d1"]
    assert names(await queue.get_jobs(["waiting", "delayed"], asc=True)) == [
        "w0", "w1", "w2", "w3", "d0", "d1", "d2"]
    assert names(await queue.get_jobs(["completed"])) == []


async def test_pause_and_resume(queue: Queue, redis: Any) -> None:
    job = await queue.add("n", {})
    assert await queue.is_paused() is False
    await queue.pause()
    assert await queue.is_paused() is True
    assert await redis.hget(f"bull:{queue.name}:meta", "paused") == "1"
    assert await job.get_state() == "waiting"
    assert (await queue.get_job_counts("waiting"))["waiting"] == 1
    later = await queue.add("added-while-paused", {})
    assert await later.get_state() == "waiting"
    await queue.resume()
    assert await queue.is_paused() is False
    assert await redis.hexists(f"bull:{queue.name}:meta", "paused") == 0
    assert [j.id for j in await queue.get_waiting()] == [job.id, later.id]


async def test_paused_queue_is_not_processed(redis_url: str, queue: Queue) -> None:
    await queue.pause()
    job = await queue.add("n", {})
    seen: list[str] = []

    async def processor(j: Job) -> None:
        seen.append(str(j.id))

    worker = Worker(queue.name, processor, connection=redis_url)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await asyncio.sleep(0.3)
        assert seen == [] and await job.get_state() == "waiting"
        await queue.resume()
        await wait_for(lambda: job.is_completed())
        assert seen == [job.id]
    finally:
        await worker.close()
        await task


async def test_drain_removes_waiting_and_keeps_delayed(queue: Queue, redis: Any) -> None:
    waiting = await queue.add("w", {})
    prioritized = await queue.add("p", {}, priority=1)
    delayed = await queue.add("d", {}, delay=60000)
    await queue.drain()
    assert await queue.get_job_counts("waiting", "prioritized", "delayed") == {
        "waiting": 0, "prioritized": 0, "delayed": 1}
    assert await queue.get_job(waiting.id) is None and await queue.get_job(prioritized.id) is None
    assert await queue.get_job(delayed.id) is not None
    await queue.drain(delayed=True)
    assert await queue.get_job(delayed.id) is None
    assert await redis.zcard(f"bull:{queue.name}:delayed") == 0


async def test_clean_completed(redis_url: str, queue: Queue, redis: Any) -> None:
    added = [await queue.add("n", {"i": i}) for i in range(3)]
    await process_all(redis_url, queue, 3)
    completed = await queue.get_completed()
    assert sorted(j.id for j in completed) == ["1", "2", "3"]
    assert {j.returnvalue["done"]["i"] for j in completed} == {0, 1, 2}
    assert await queue.clean(60_000, type="completed") == []  # younger than the grace period
    removed = await queue.clean(0, type="completed")
    assert sorted(removed) == sorted(j.id for j in added)
    assert await queue.get_job_counts("completed") == {"completed": 0}
    assert await redis.exists(*(f"bull:{queue.name}:{j.id}" for j in added)) == 0


async def test_clean_respects_limit(redis_url: str, queue: Queue) -> None:
    for i in range(3):
        await queue.add("n", {"i": i})
    await process_all(redis_url, queue, 3)
    assert len(await queue.clean(0, limit=2, type="completed")) == 2
    assert (await queue.get_job_counts("completed"))["completed"] == 1


async def test_obliterate(queue: Queue, redis: Any) -> None:
    await queue.add("w", {})
    await queue.add("d", {}, delay=60000)
    await queue.add("p", {}, priority=4)
    job = await queue.add("logged", {})
    await job.log("line")
    await queue.add("g", {}, group="G")
    await queue.add("g", {}, group="G")  # held
    await queue.pause_group("H")
    assert await redis.keys(f"bull:{queue.name}:grp:held:G")
    await queue.obliterate()
    assert await redis.keys(f"bull:{queue.name}:*") == []


async def test_remove(queue: Queue, redis: Any) -> None:
    keep = await queue.add("keep", {})
    gone = await queue.add("gone", {})
    await gone.log("bye")
    assert await queue.remove(gone.id) == 1
    assert await queue.get_job(gone.id) is None
    assert await redis.exists(f"bull:{queue.name}:{gone.id}:logs") == 0
    assert [j.id for j in await queue.get_waiting()] == [keep.id]
    delayed = await queue.add("delayed", {}, delay=60000)
    await delayed.remove()
    assert await redis.zcard(f"bull:{queue.name}:delayed") == 0


async def test_retry_jobs_of_failed_jobs(redis_url: str, queue: Queue) -> None:
    jobs = [await queue.add("n", {"fail": f"boom {i}"}) for i in range(2)]
    await process_all(redis_url, queue, 2)
    assert (await queue.get_job_counts("failed"))["failed"] == 2
    failed = await queue.get_job(jobs[0].id)
    assert failed is not None and failed.failed_reason == "boom 0" and failed.attempts_made == 1
    await queue.retry_jobs()
    assert await queue.get_job_counts("failed", "waiting") == {"failed": 0, "waiting": 2}
    assert {await j.get_state() for j in jobs} == {"waiting"}


async def test_job_retry_of_one_failed_job(redis_url: str, queue: Queue) -> None:
    job = await queue.add("n", {"fail": "nope"})
    await process_all(redis_url, queue, 1)
    await job.retry()
    assert await job.get_state() == "waiting"


async def test_promote_jobs(queue: Queue) -> None:
    jobs = [await queue.add("d", {"i": i}, delay=60000) for i in range(3)]
    await queue.promote_jobs()
    assert await queue.get_job_counts("delayed", "waiting") == {"delayed": 0, "waiting": 3}
    assert [j.id for j in await queue.get_waiting()] == [j.id for j in jobs]


async def test_update_data(queue: Queue, redis: Any) -> None:
    job = await queue.add("n", {"v": 1})
    await job.update_data({"v": 2, "s": "é"})
    assert job.data == {"v": 2, "s": "é"}
    assert await redis.hget(f"bull:{queue.name}:{job.id}", "data") == '{"v":2,"s":"é"}'


async def test_update_progress(queue: Queue) -> None:
    job = await queue.add("n", {})
    await job.update_progress(42)
    assert (await queue.get_job(job.id)).progress == 42  # type: ignore[union-attr]
    await job.update_progress({"step": "b", "pct": 50})
    assert (await queue.get_job(job.id)).progress == {"step": "b", "pct": 50}  # type: ignore[union-attr]


async def test_log_and_get_job_logs(queue: Queue) -> None:
    job = await queue.add("n", {})
    assert await job.log("first") == 1
    assert await job.log("second") == 2
    assert await queue.get_job_logs(job.id) == {"logs": ["first", "second"], "count": 2}
    assert await queue.get_job_logs(job.id, asc=False) == {"logs": ["second", "first"], "count": 2}
    assert await queue.get_job_logs(job.id, 0, 0) == {"logs": ["first"], "count": 2}


async def test_keep_logs_trims_old_lines(queue: Queue) -> None:
    job = await queue.add("n", {}, keep_logs=2)
    for line in ("a", "b", "c"):
        await job.log(line)
    assert await queue.get_job_logs(job.id) == {"logs": ["b", "c"], "count": 2}


async def test_change_delay(queue: Queue, redis: Any) -> None:
    job = await queue.add("d", {}, delay=60000)
    before = now_ms()
    await job.change_delay(120000)
    assert job.delay == 120000
    assert await redis.hget(f"bull:{queue.name}:{job.id}", "delay") == "120000"
    score = await redis.zscore(f"bull:{queue.name}:delayed", job.id)
    assert score is not None and int(score) // 0x1000 >= before + 120000 - 1000
    assert await job.get_state() == "delayed"


async def test_change_priority(queue: Queue, redis: Any) -> None:
    job = await queue.add("p", {}, priority=5)
    await job.change_priority(10)
    assert job.priority == 10
    assert await redis.hget(f"bull:{queue.name}:{job.id}", "priority") == "10"
    assert await job.get_state() == "prioritized"
    await job.change_priority(0)
    assert await job.get_state() == "waiting"


async def test_promote_one_job(queue: Queue) -> None:
    job = await queue.add("d", {}, delay=60000)
    other = await queue.add("d", {}, delay=60000)
    await job.promote()
    assert await job.get_state() == "waiting"
    assert await other.get_state() == "delayed"
    assert (await queue.get_job(job.id)).delay == 0  # type: ignore[union-attr]


async def test_default_job_options_merge(redis_url: str, queue_name: str, redis: Any) -> None:
    defaults = {"attempts": 5, "remove_on_complete": True, "backoff": {"type": "fixed", "delay": 100},
                "job_id": "never-used"}
    async with Queue(queue_name, connection=redis_url, default_job_options=defaults) as queue:
        plain = await queue.add("plain", {})
        override = await queue.add("override", {}, attempts=2, removeOnComplete=10)
    assert plain.id == "1" and override.id == "2"  # a default job_id is never used
    assert json.loads(await redis.hget(f"bull:{queue_name}:1", "opts")) == {
        "attempts": 5, "removeOnComplete": True, "backoff": {"type": "fixed", "delay": 100}}
    assert json.loads(await redis.hget(f"bull:{queue_name}:2", "opts")) == {
        "attempts": 2, "removeOnComplete": 10, "backoff": {"type": "fixed", "delay": 100}}
    assert override.opts["remove_on_complete"] == 10 and override.opts["attempts"] == 2


async def test_deduplication(queue: Queue, redis: Any) -> None:
    first = await queue.add("n", {"v": 1}, deduplication={"id": "dedup-1"})
    second = await queue.add("n", {"v": 2}, deduplication={"id": "dedup-1"})
    assert second.id == first.id
    assert await queue.get_job_counts("waiting") == {"waiting": 1}
    assert await redis.hget(f"bull:{queue.name}:{first.id}", "data") == '{"v":1}'
    assert await queue.get_deduplication_job_id("dedup-1") == first.id
    assert (await queue.get_job(first.id)).deduplication_id == "dedup-1"  # type: ignore[union-attr]
    other = await queue.add("n", {"v": 3}, deduplication={"id": "dedup-2"})
    assert other.id != first.id
    assert await queue.remove_deduplication_key("dedup-1") == 1
    assert await queue.get_deduplication_job_id("dedup-1") is None
    third = await queue.add("n", {"v": 4}, deduplication={"id": "dedup-1"})
    assert third.id not in (first.id, other.id)


async def test_deduplication_ttl(queue: Queue, redis: Any) -> None:
    job = await queue.add("n", {}, deduplication={"id": "short", "ttl": 5000})
    ttl = await redis.pttl(f"bull:{queue.name}:de:short")
    assert 0 < ttl <= 5000
    assert job.opts["deduplication"] == {"id": "short", "ttl": 5000}


async def test_job_state_of_missing_job_is_unknown(queue: Queue) -> None:
    assert await queue.get_job_state("nope") == "unknown"


async def test_prefix_is_used_for_every_key(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url, prefix="other") as queue:
        job = await queue.add("n", {})
    assert await redis.exists(f"other:{queue_name}:{job.id}") == 1
    assert await redis.keys(f"bull:{queue_name}:*") == []
