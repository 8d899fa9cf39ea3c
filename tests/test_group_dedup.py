"""Deduplication's keepLastIfActive and reschedule on group jobs (issue #16), Python and Node workers.

The five modes side by side with plain jobs are in tests/test_group_ordering.py
(test_deduplication_modes_decide_for_a_group_job_as_for_a_plain_job). See docs/groups.md
("Deduplication").
"""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import pytest
import redis.asyncio as aioredis

from bullmq_compat import Queue, Worker
from bullmq_compat._groups import GroupJobRefused
from tests.group_helpers import (
    a_queue,
    check_groups,
    held_ids,
    keeper_proc,
    node_workers,
    python_workers,
    read_records,
    rec_key,
    wait_records,
    wait_until,
)

KEEP = {"id": "k", "keep_last_if_active": True}


async def _events(redis: aioredis.Redis, queue_name: str, kind: str) -> list[dict[str, str]]:
    return [f for _, f in await redis.xrange(f"bull:{queue_name}:events") if f["event"] == kind]


async def _groups_done(queue: Queue) -> bool:
    # (a handler's record comes before its job's finish, and the release after that)
    return await queue.get_groups() == []


@contextlib.asynccontextmanager
async def _workers(kind: str, redis_url: str, queue_name: str) -> AsyncIterator[None]:
    if kind == "python":
        async with python_workers(redis_url, queue_name, 1, concurrency=5):
            yield
    else:  # unmodified Node BullMQ workers; a keeper releases what they finish (sweep 60 s: by the stream)
        async with keeper_proc(redis_url, queue_name, 60), node_workers(redis_url, queue_name, workers=1,
                                                                        concurrency=5):
            yield


@pytest.mark.parametrize("kind", ["python", pytest.param("node", marks=pytest.mark.node)])
async def test_keep_last_if_active_runs_one_job_with_the_latest_data_after_the_active_one_in_group_order(
        redis_url: str, queue_name: str, redis: aioredis.Redis, kind: str) -> None:
    """Ten deduplicated adds while the group's job of that id is active: each returns the active
    job's id and adds a 'deduplicated' event; nothing is created while it runs (as upstream keeps
    the add aside); once it finishes exactly one job with the last add's data runs, in the place
    of that last add in its group (after a job added before it), and never beside another job of
    the group."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        async with _workers(kind, redis_url, queue_name):
            first = await queue.add("d", {"g": "G", "s": 0, "sleepMs": 4000}, group="G", deduplication=KEEP)

            async def first_active() -> bool:
                return await queue.get_job_state(first.id) == "active"
            await wait_until(first_active, 30, "the first job to start")
            ids = []
            for v in range(1, 11):
                if v == 4:
                    await queue.add("d", {"g": "G", "s": 1}, group="G")
                ids.append((await queue.add("d", {"g": "G", "s": 2, "v": v}, group="G", deduplication=KEEP)).id)
            await queue.add("d", {"g": "H", "s": 0}, group="H")
            # the bound of this test: every add above landed while the first job ran
            assert await queue.get_job_state(first.id) == "active"
            assert ids == [first.id] * 10
            assert await queue.get_deduplication_job_id("k") == first.id
            assert await redis.exists(f"bull:{queue_name}:dn:k") == 0  # nothing for upstream's finish to add
            assert await queue.get_job_counts("waiting-children") == {"waiting-children": 1}  # the s=1 job
            await wait_records(redis, rec, 4, 60, queue)
            await wait_until(lambda: _groups_done(queue), 60, "the last jobs to be released")
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {"G": 3, "H": 1})
        kept = [s for s in starts if s["g"] == "G" and s["s"] == 2]
        assert len(kept) == 1
        job = await queue.get_job(kept[0]["id"])
        assert job is not None and job.data["v"] == 10
        dedup = await _events(redis, queue_name, "deduplicated")
        assert len(dedup) == 10 and {e["jobId"] for e in dedup} == {first.id}
        assert await queue.get_job_counts("completed", "waiting", "waiting-children", "active", "delayed") == {
            "completed": 4, "waiting": 0, "waiting-children": 0, "active": 0, "delayed": 0}
        assert await queue.get_groups() == []
        assert await redis.keys(f"bull:{queue_name}:grp:dn*") == []


async def test_keep_last_if_active_on_a_job_that_is_not_active_deduplicates_as_upstream(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """The id's job waits for its turn (held) or in wait: a plain deduplication, data unchanged."""
    async with a_queue(queue_name, redis_url) as queue:
        head = await queue.add("d", {"v": 0}, group="G", deduplication={"id": "h", "keep_last_if_active": True})
        held = await queue.add("d", {"v": 1}, group="G", deduplication=KEEP)
        assert (await queue.add("d", {"v": 2}, group="G", deduplication=KEEP)).id == held.id
        assert (await queue.add("d", {"v": 3}, group="G",
                                deduplication={"id": "h", "keep_last_if_active": True})).id == head.id
        assert await held_ids(queue, "G") == [held.id]
        assert (await queue.get_job(held.id)).data == {"v": 1}  # type: ignore[union-attr]
        assert await redis.keys(f"bull:{queue_name}:grp:dn*") == []


async def test_keep_last_if_active_behind_an_active_plain_job_is_refused_and_writes_nothing(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        plain = await queue.add("d", {}, deduplication=KEEP)
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            job = await worker.get_next_job("t", block=False)
            assert job is not None and job.id == plain.id
            counter = await redis.get(f"bull:{queue_name}:id")
            with pytest.raises(GroupJobRefused, match="keepLastIfActive.*'k'.*not a group job"):
                await queue.add("d", {"v": 1}, group="G", deduplication=KEEP)
            assert await redis.get(f"bull:{queue_name}:id") == counter
            assert await redis.keys(f"bull:{queue_name}:grp:*") == []
            assert await redis.exists(f"bull:{queue_name}:dn:k") == 0
            # a plain add keeps its latest add as upstream does
            assert (await queue.add("d", {"v": 2}, deduplication=KEEP)).id == plain.id
            assert await redis.exists(f"bull:{queue_name}:dn:k") == 1
        finally:
            await worker.close()


async def test_reschedule_re_times_a_held_group_job_and_a_released_delayed_one(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A held job with a delay ahead is re-timed by the deduplicated add's delay (applied when it is
    released); a held job without a delay is not (as upstream leaves a waiting job); a released
    group job in the delayed set is rescheduled by upstream itself."""
    resched = {"id": "r", "ttl": 120_000, "reschedule": True}
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")  # its jobs stay held while we look
        held = await queue.add("d", {"g": "G", "s": 0}, group="G", delay=120_000, deduplication=resched)
        assert await held_ids(queue, "G") == [held.id]
        again = await queue.add("d", {"v": 2}, group="G", delay=50, deduplication=resched)
        assert again.id == held.id
        job = await queue.get_job(held.id)
        assert job is not None and job.delay == 50 and job.data == {"g": "G", "s": 0}
        plain_held = await queue.add("d", {"g": "G", "s": 1}, group="G",
                                     deduplication={"id": "r2", "reschedule": True})
        await queue.add("d", {}, group="G", delay=120_000, deduplication={"id": "r2", "reschedule": True})
        assert (await queue.get_job(plain_held.id)).delay == 0  # type: ignore[union-attr]

        released = await queue.add("d", {"g": "Q", "s": 0}, group="Q", delay=120_000,
                                   deduplication={"id": "q", "ttl": 120_000, "reschedule": True})
        assert await queue.get_job_state(released.id) == "delayed"
        await queue.add("d", {}, group="Q", delay=50, deduplication={"id": "q", "ttl": 120_000, "reschedule": True})
        async with python_workers(redis_url, queue_name, 1, concurrency=5):
            await queue.resume_group("G")
            # far sooner than the first delays (120 s): re-timed
            await wait_records(redis, rec_key(queue_name), 3, 60, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        check_groups(ends, starts, {"G": 2, "Q": 1})
        assert await queue.get_groups() == []


@pytest.mark.node
async def test_an_add_after_a_node_worker_finished_the_job_but_before_any_release_finds_the_kept_job(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A Node worker finishes the active job (upstream's finish drops the deduplication key) and no
    keeper runs yet: the next add creates the kept job then, as upstream's finish would have, and
    is deduplicated on it; the kept job waits behind the gate until a keeper frees the slot."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        async with node_workers(redis_url, queue_name, workers=1, concurrency=5):
            first = await queue.add("d", {"g": "G", "s": 0, "sleepMs": 3000}, group="G", deduplication=KEEP)

            async def state_of_first(state: str) -> Any:
                async def check() -> bool:
                    return await queue.get_job_state(first.id) == state
                return check
            await wait_until(await state_of_first("active"), 30, "the first job to start")
            for v in range(1, 4):
                assert (await queue.add("d", {"g": "G", "s": 1, "v": v}, group="G",
                                        deduplication=KEEP)).id == first.id
            assert await queue.get_job_state(first.id) == "active"  # (the bound of this test)
            await wait_until(await state_of_first("completed"), 30, "the first job to finish")
            assert await queue.get_deduplication_job_id("k") is None  # upstream's finish dropped it
            kept = await queue.add("d", {"g": "G", "s": 1, "v": 9}, group="G", deduplication=KEEP)
            assert kept.id != first.id
            assert await queue.get_deduplication_job_id("k") == kept.id
            job = await queue.get_job(kept.id)
            assert job is not None and job.data["v"] == 3
            assert await held_ids(queue, "G") == [kept.id]  # its group's slot is not freed yet
            assert (await queue.add("d", {"g": "G", "s": 1, "v": 10}, group="G",
                                    deduplication=KEEP)).id == kept.id
            async with keeper_proc(redis_url, queue_name, 0.5):
                await wait_records(redis, rec, 2, 60, queue)
                await wait_until(lambda: _groups_done(queue), 60, "the kept job to be released")
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {"G": 2})
        assert await queue.get_groups() == []
        assert await redis.keys(f"bull:{queue_name}:grp:dn*") == []


@pytest.mark.node
async def test_node_group_producer_keeps_the_last_add_behind_an_active_group_job(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """interop/groups.js with keepLastIfActive and reschedule: decided by our add script as for
    Python adds; a Node worker runs the jobs, a keeper releases them."""
    from tests.node import node

    rec = rec_key(queue_name)
    keep = {"id": "nk", "keepLastIfActive": True}
    async with a_queue(queue_name, redis_url) as queue:
        async with keeper_proc(redis_url, queue_name, 60), node_workers(redis_url, queue_name, workers=1,
                                                                        concurrency=5):
            first = await queue.add("d", {"g": "N", "s": 0, "sleepMs": 4000}, group="N",
                                    deduplication={"id": "nk", "keep_last_if_active": True})

            async def first_active() -> bool:
                return await queue.get_job_state(first.id) == "active"
            await wait_until(first_active, 30, "the first job to start")
            out = await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[
                {"name": "n", "data": {"g": "N", "s": 1, "v": v}, "opts": {"group": "N", "deduplication": keep}}
                for v in range(1, 4)])
            assert out["ids"] == [first.id] * 3
            assert await queue.get_job_state(first.id) == "active"  # (the bound of this test)
            await wait_records(redis, rec, 2, 60, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {"N": 2})
        kept = await queue.get_job([s["id"] for s in starts if s["s"] == 1][0])
        assert kept is not None and kept.data["v"] == 3
        assert len(await _events(redis, queue_name, "deduplicated")) == 3
