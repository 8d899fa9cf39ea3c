"""Priority within a group (issue #28 section 3; BullMQ Pro's ``group.priority``) on Redis, Python
workers. Node workers with a keeper and a Node producer are at the end (marked ``node``); PostgreSQL
is tests/test_postgres_group_priority.py. See docs/groups.md ("Priority within a group").

Order is checked by the start records the processors write (tests/group_helpers.py), in the order
Redis saw them, with group concurrency 1: never by wall-clock bounds.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from bullmq_compat import InvalidArgument, InvalidJobOptions, Queue, Worker
from tests.group_helpers import (
    a_queue,
    held_ids,
    keeper_proc,
    node_workers,
    now_ms,
    python_workers,
    read_records,
    rec_key,
    wait_records,
    wait_until,
)
from tests.node import node

# (label, group priority or None): the order they are added in
MIX = [("a", 5), ("b", None), ("c", 1), ("d", 5), ("e", 0), ("f", 2), ("g", 1), ("h", None), ("i", 2097151)]
# unprioritised first (add order), then 1, 2, 5, 2097151, FIFO among equals
EXPECTED = ["b", "e", "h", "c", "g", "f", "a", "d", "i"]


def group_opt(gid: str, priority: Any) -> dict[str, Any]:
    return {"id": gid} if priority is None else {"id": gid, "priority": priority}


async def add_mix(queue: Queue, gid: str) -> dict[str, str]:
    """MIX added to group ``gid`` (paused by the caller, so all are held); label -> job id."""
    ids = {}
    for s, (label, priority) in enumerate(MIX):
        job = await queue.add("p", {"g": gid, "s": s, "label": label}, group=group_opt(gid, priority))
        ids[label] = job.id
    return ids


def start_order(starts: list[dict[str, Any]], gid: str) -> list[str]:
    return [st["id"] for st in starts if st["g"] == gid]


def check_one_at_a_time(ends: list[dict[str, Any]], starts: list[dict[str, Any]], counts: dict[str, int]) -> None:
    """No two runs of a group overlapped (group concurrency 1), by the run counter and by time; the
    order is checked by the caller (check_groups' own order check is add order, `s`)."""
    assert len(starts) == sum(counts.values()), starts
    for end in ends:
        assert end["n"] == 1, end
    by_group: dict[str, list[tuple[int, int]]] = {}
    for end in ends:
        by_group.setdefault(end["g"], []).append((end["t0"], end["t1"]))
    for g, runs in by_group.items():
        assert len(runs) == counts[g]
        runs.sort()
        for (_, a1), (b0, _) in zip(runs, runs[1:]):
            assert b0 >= a1, (g, runs)


# -- the option --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [True, False, 1.0, 2.5, -1, 2097152, 2 ** 40, "1", None])
async def test_a_group_priority_outside_0_to_2097151_is_refused_and_nothing_is_written(
        redis_url: str, queue_name: str, redis: aioredis.Redis, bad: Any) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidJobOptions, match=r"priority=.* must be an int from 0 to 2097151") as info:
            await queue.add("p", {}, group={"id": "G", "priority": bad})
        assert repr(bad) in str(info.value)
        with pytest.raises(InvalidJobOptions, match="must be an int from 0 to 2097151"):
            await queue.add_bulk([{"name": "p", "data": {}, "opts": {"group": {"id": "G", "priority": bad}}}])
        assert await redis.keys(f"bull:{queue_name}:*") in ([], [f"bull:{queue_name}:meta"])


async def test_order_ms_with_a_group_priority_is_refused_but_works_with_priority_0(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidJobOptions, match="order_ms orders a group's unprioritised jobs"):
            await queue.add("p", {}, group={"id": "G", "priority": 3}, order_ms=now_ms())
        with pytest.raises(InvalidJobOptions, match=r"below 2\*\*42"):
            await queue.add("p", {}, group="G", order_ms=2 ** 42)
        assert not await redis.exists(f"bull:{queue_name}:id")
        job = await queue.add("p", {}, group={"id": "G", "priority": 0}, order_ms=now_ms())
        assert job.opts["group"] == {"id": "G", "priority": 0}


async def test_the_group_priority_is_stored_as_pro_stores_it_beside_the_jobs_own_priority(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")
        job = await queue.add("p", {}, group={"id": "G", "priority": 7, "max_size": 10}, priority=3)
        stored = json.loads(await redis.hget(f"bull:{queue_name}:{job.id}", "opts"))
        assert stored["group"] == {"id": "G", "maxSize": 10, "priority": 7}
        assert stored["priority"] == 3
        fetched = await queue.get_job(job.id)
        assert fetched is not None and fetched.opts["group"]["priority"] == 7 and fetched.priority == 3
        # released, it goes to upstream's prioritized set by its own priority (3)
        await queue.resume_group("G")
        assert await queue.get_job_state(job.id) == "prioritized"
        assert await redis.zscore(f"bull:{queue_name}:prioritized", job.id) is not None


# -- the order ----------------------------------------------------------------------------------------

async def test_held_jobs_are_released_in_group_priority_order_fifo_among_equals(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """0 (or none) first in add order, then 1, 2, ...: by get_group_jobs, and by the start records of
    Python workers (concurrency 8, group concurrency 1); another group's plain FIFO is unchanged."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")
        ids = await add_mix(queue, "G")
        plain = [(await queue.add("p", {"g": "H", "s": s}, group="H")).id for s in range(4)]
        assert await held_ids(queue, "G") == [ids[label] for label in EXPECTED]
        async with python_workers(redis_url, queue_name, 2, concurrency=4):
            await queue.resume_group("G")
            await wait_records(redis, rec, len(MIX) + 4, 30, queue)
        ends, starts = await read_records(redis, rec)
        assert start_order(starts, "G") == [ids[label] for label in EXPECTED]
        assert start_order(starts, "H") == plain
        check_one_at_a_time(ends, starts, {"G": len(MIX), "H": 4})
        assert await queue.get_groups() == []


async def test_a_prioritised_job_waits_behind_the_running_head_and_jumps_the_held_ones(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Without a pause: the head runs at once whatever its priority; later adds are ordered behind it."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        head = await queue.add("p", {"g": "G", "s": 0}, group={"id": "G", "priority": 9})
        assert await queue.get_job_state(head.id) == "waiting"
        low = await queue.add("p", {"g": "G", "s": 1}, group={"id": "G", "priority": 4})
        plain = await queue.add("p", {"g": "G", "s": 2}, group="G")
        high = await queue.add("p", {"g": "G", "s": 3}, group={"id": "G", "priority": 1})
        assert await held_ids(queue, "G") == [plain.id, high.id, low.id]
        async with python_workers(redis_url, queue_name, 1, concurrency=4):
            await wait_records(redis, rec, 4, 30, queue)
        ends, starts = await read_records(redis, rec)
        assert start_order(starts, "G") == [head.id, plain.id, high.id, low.id]
        check_one_at_a_time(ends, starts, {"G": 4})


async def test_add_bulk_orders_by_group_priority(redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")
        jobs = await queue.add_bulk([{"name": "p", "data": {"g": "G", "s": s, "label": label},
                                      "opts": {"group": group_opt("G", priority)}}
                                     for s, (label, priority) in enumerate(MIX)])
        ids = {job.data["label"]: job.id for job in jobs}
        assert await held_ids(queue, "G") == [ids[label] for label in EXPECTED]
        assert jobs[0].opts["group"] == {"id": "G", "priority": 5}
        async with python_workers(redis_url, queue_name, 1, concurrency=4):
            await queue.resume_group("G")
            await wait_records(redis, rec, len(MIX), 30, queue)
        ends, starts = await read_records(redis, rec)
        assert start_order(starts, "G") == [ids[label] for label in EXPECTED]
        check_one_at_a_time(ends, starts, {"G": len(MIX)})


async def test_order_ms_and_the_ordering_delay_keep_working_for_the_unprioritised(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Unprioritised jobs with order_ms are ordered by it, all before the prioritised ones; with an
    ordering delay, a prioritised add never takes back the head waiting out its window, and a late
    job with an earlier order_ms still does."""
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")
        p1 = await queue.add("p", {}, group={"id": "G", "priority": 1})
        late = await queue.add("p", {}, group="G", order_ms=base + 600_000)
        early = await queue.add("p", {}, group={"id": "G", "priority": 0}, order_ms=base - 50)
        plain = await queue.add("p", {}, group="G")  # ordered by its add time
        assert await held_ids(queue, "G") == [early.id, plain.id, late.id, p1.id]
        assert await queue.get_counts_per_priority_for_group("G", [0, 1, 2]) == {0: 3, 1: 1, 2: 0}

        await queue.set_group_options("W", ordering_delay_ms=60_000)
        head = await queue.add("p", {}, group="W", order_ms=base + 20)
        assert await queue.get_job_state(head.id) == "delayed"  # waits out its window, holding the slot
        prio = await queue.add("p", {}, group={"id": "W", "priority": 1})
        assert await queue.get_job_state(head.id) == "delayed"
        assert await queue.get_job_state(prio.id) == "waiting-children"
        earlier = await queue.add("p", {}, group="W", order_ms=base + 10)
        assert await queue.get_job_state(earlier.id) == "delayed"  # took the head's place
        assert await held_ids(queue, "W") == [head.id, prio.id]
        # a prioritised job has no order_ms: released under an ordering delay, it is due at once
        await queue.set_group_options("V", ordering_delay_ms=60_000)
        first = await queue.add("p", {}, group={"id": "V", "priority": 2})
        assert await queue.get_job_state(first.id) == "waiting"


async def test_counts_per_priority_for_group(redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")
        await add_mix(queue, "G")
        await queue.add("p", {}, group={"id": "other", "priority": 1})
        assert await queue.get_counts_per_priority_for_group("G", [0, 1, 5]) == {0: 3, 1: 2, 5: 2}
        assert await queue.get_counts_per_priority_for_group("G", [2097151, 3, 2]) == {2097151: 1, 3: 0, 2: 1}
        assert await queue.get_counts_per_priority_for_group("none", [0, 1]) == {0: 0, 1: 0}
        assert await queue.get_counts_per_priority_for_group("G", []) == {}
        for bad in ([-1], [True], [2097152], "0"):
            with pytest.raises(InvalidArgument):
                await queue.get_counts_per_priority_for_group("G", bad)  # type: ignore[arg-type]


# -- change_priority --------------------------------------------------------------------------------

async def test_change_priority_moves_a_held_job_within_its_group(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """On a held group job, change_priority sets its group priority (opts.group.priority) and moves
    it to its place among the held jobs of that priority (by add order); its own priority stays;
    lifo is refused; a job with order_ms cannot get a priority >= 1. On a released group job it
    changes the job's own priority, as upstream does."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("G")
        ids = await add_mix(queue, "G")
        a = await queue.get_job(ids["a"])  # priority 5, added first
        assert a is not None
        await a.change_priority(1)
        assert a.opts["group"]["priority"] == 1 and a.priority == 0
        order = ["b", "e", "h", "a", "c", "g", "f", "d", "i"]  # first of the 1s: added before c and g
        assert await held_ids(queue, "G") == [ids[label] for label in order]
        stored = json.loads(await redis.hget(f"bull:{queue_name}:{a.id}", "opts"))
        assert stored["group"] == {"id": "G", "priority": 1} and "priority" not in stored
        i = await queue.get_job(ids["i"])
        assert i is not None
        await i.change_priority(0)  # unprioritised: by its add time, after b, e and h
        order = ["b", "e", "h", "i", "a", "c", "g", "f", "d"]
        assert await held_ids(queue, "G") == [ids[label] for label in order]
        assert await queue.get_counts_per_priority_for_group("G", [0, 1, 2097151]) == {0: 4, 1: 3, 2097151: 0}
        with pytest.raises(InvalidArgument, match="lifo"):
            await i.change_priority(3, lifo=True)
        with pytest.raises(InvalidJobOptions, match="priority=-1"):
            await i.change_priority(-1)
        timed = await queue.add("p", {"g": "G", "s": 9}, group="G", order_ms=now_ms())
        with pytest.raises(InvalidArgument, match="order_ms"):
            await timed.change_priority(2)
        await timed.remove()
        assert await held_ids(queue, "G") == [ids[label] for label in order]

        async with python_workers(redis_url, queue_name, 1, concurrency=4):
            await queue.resume_group("G")
            await wait_records(redis, rec, len(MIX), 30, queue)
        ends, starts = await read_records(redis, rec)
        assert start_order(starts, "G") == [ids[label] for label in order]
        check_one_at_a_time(ends, starts, {"G": len(MIX)})

        # a released group job: upstream's changePriority of its own priority
        released = await queue.add("p", {"g": "R", "s": 0}, group="R")
        assert await queue.get_job_state(released.id) == "waiting"
        await released.change_priority(4)
        assert await queue.get_job_state(released.id) == "prioritized"
        fetched = await queue.get_job(released.id)
        assert fetched is not None and fetched.priority == 4 and fetched.opts["group"] == {"id": "R"}


async def test_a_retried_prioritised_job_goes_back_to_its_priority_place(
        redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        failing = await queue.add("p", {"fail": "once"}, group={"id": "G", "priority": 3})

        async def process(job: Any) -> None:
            from bullmq_compat import UnrecoverableError

            raise UnrecoverableError("on purpose")

        async with Worker(queue_name, process, connection=redis_url, drain_delay=1):
            await wait_until(lambda: state_is(queue, failing.id, "failed"), 20, "the job to fail")
        await queue.pause_group("G")
        before = await queue.add("p", {}, group={"id": "G", "priority": 3})  # added after it, same priority
        zero = await queue.add("p", {}, group="G")
        low = await queue.add("p", {}, group={"id": "G", "priority": 8})
        job = await queue.get_job(failing.id)
        assert job is not None
        await job.retry()
        assert await held_ids(queue, "G") == [zero.id, failing.id, before.id, low.id]


async def state_is(queue: Queue, job_id: str, state: str) -> bool:
    return await queue.get_job_state(job_id) == state


# -- Node workers, a keeper and a Node producer -------------------------------------------------------

@pytest.mark.node
async def test_node_workers_with_a_keeper_run_prioritised_group_jobs_of_a_node_producer_in_order(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """interop/groups.js's GroupProducer adds prioritised group jobs (opts.group.priority) beside
    Python ones; unmodified Node BullMQ workers run them, a keeper releasing each group's next job:
    each group starts its jobs in group priority order, one at a time."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        for gid in ("G", "N"):
            await queue.pause_group(gid)
        py_ids = await add_mix(queue, "G")
        added = await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[
            {"name": "n", "data": {"g": "N", "s": s, "label": label}, "opts": {"group": group_opt("N", priority)}}
            for s, (label, priority) in enumerate(MIX)])
        node_ids = dict(zip([label for label, _ in MIX], added["ids"]))
        assert await held_ids(queue, "N") == [node_ids[label] for label in EXPECTED]
        stored = await queue.get_job(node_ids["a"])
        assert stored is not None and stored.opts["group"] == {"id": "N", "priority": 5}
        assert await queue.get_counts_per_priority_for_group("N", [0, 1, 5]) == {0: 3, 1: 2, 5: 2}
        with pytest.raises(Exception, match="priority"):
            await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[
                {"name": "n", "data": {}, "opts": {"group": {"id": "N", "priority": 2.5}}}])
        with pytest.raises(Exception, match="orderMs"):
            await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[
                {"name": "n", "data": {}, "opts": {"group": {"id": "N", "priority": 2}, "orderMs": 5}}])
        async with keeper_proc(redis_url, queue_name, 0.5), \
                node_workers(redis_url, queue_name, workers=2, concurrency=4):
            for gid in ("G", "N"):
                await queue.resume_group(gid)
            await wait_records(redis, rec, 2 * len(MIX), 60, queue)
        ends, starts = await read_records(redis, rec)
        assert {e["w"] for e in ends} == {"node"}
        assert start_order(starts, "G") == [py_ids[label] for label in EXPECTED]
        assert start_order(starts, "N") == [node_ids[label] for label in EXPECTED]
        check_one_at_a_time(ends, starts, {"G": len(MIX), "N": len(MIX)})


@pytest.mark.node
async def test_python_and_node_workers_at_once_keep_group_priority_order(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    rec = rec_key(queue_name)
    groups = [f"P{g}" for g in range(4)]
    async with a_queue(queue_name, redis_url) as queue:
        ids: dict[str, dict[str, str]] = {}
        for gid in groups:
            await queue.pause_group(gid)
            ids[gid] = await add_mix(queue, gid)
        async with node_workers(redis_url, queue_name, workers=1, concurrency=4), \
                python_workers(redis_url, queue_name, 1, concurrency=4, group_keeper="stream"):
            for gid in groups:
                await queue.resume_group(gid)
            await wait_records(redis, rec, len(groups) * len(MIX), 60, queue)
        ends, starts = await read_records(redis, rec)
        for gid in groups:
            assert start_order(starts, gid) == [ids[gid][label] for label in EXPECTED], gid
        check_one_at_a_time(ends, starts, {gid: len(MIX) for gid in groups})


async def test_a_prioritised_job_a_node_retry_moved_past_the_gate_is_regated_in_its_priority_place(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """What the keeper does on the 'waiting' event of Node's job.retry() (regateRetriedJob): the job
    goes back behind its gate by its group priority (its hash's gpri), not by its add time."""
    from bullmq_compat._backends.redis.groups import GroupKeeper

    async with a_queue(queue_name, redis_url) as queue:
        failing = await queue.add("p", {}, group={"id": "G", "priority": 3})

        async def process(job: Any) -> None:
            from bullmq_compat import UnrecoverableError

            raise UnrecoverableError("on purpose")

        async with Worker(queue_name, process, connection=redis_url, drain_delay=1):
            await wait_until(lambda: state_is(queue, failing.id, "failed"), 20, "the job to fail")
        await queue.pause_group("G")
        same = await queue.add("p", {}, group={"id": "G", "priority": 3})
        zero = await queue.add("p", {}, group="G")
        # Node's retry, as upstream's reprocessJob leaves it: out of failed, finish fields gone, in wait
        base = f"bull:{queue_name}"
        await redis.zrem(f"{base}:failed", failing.id)
        await redis.hdel(f"{base}:{failing.id}", "finishedOn", "processedOn", "failedReason")
        await redis.lpush(f"{base}:wait", failing.id)
        assert await GroupKeeper.for_queue(queue).regate([failing.id]) == 1
        assert await queue.get_job_state(failing.id) == "waiting-children"
        assert await held_ids(queue, "G") == [zero.id, failing.id, same.id]
