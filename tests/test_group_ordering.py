"""Group ordering delay and deduplication on group jobs (issue #16 part 2), Python workers.

Node workers, the keeper and Node producers under an ordering delay are in
tests/test_interop_groups.py. See docs/groups.md ("Ordering delay", "Deduplication").
"""
from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import redis.asyncio as aioredis

from bullmq_compat import InvalidArgument, Queue, Worker
from bullmq_compat._wire import codec
from tests.group_helpers import (
    a_queue,
    check_groups,
    held_ids,
    now_ms,
    python_workers,
    read_records,
    rec_key,
    wait_records,
)

# generous: every add of a test lands well within it even on a loaded machine
WINDOW_MS = 3000


async def events(redis: aioredis.Redis, queue_name: str) -> list[dict[str, str]]:
    return [fields for _, fields in await redis.xrange(f"bull:{queue_name}:events")]


# -- ordering delay ------------------------------------------------------------------------------------

async def test_out_of_order_producers_within_the_window_run_in_order_ms_order(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Three producers add the jobs of four groups out of order, with pauses, while workers run:
    each group's jobs start in order_ms order."""
    rec = rec_key(queue_name)
    base = now_ms()
    per_group = 6
    jobs = [(f"G{g}", s) for g in range(4) for s in range(per_group)]
    random.Random(3).shuffle(jobs)
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(WINDOW_MS)
        assert await queue.get_group_ordering_delay() == WINDOW_MS

        async def producer(mine: list[tuple[str, int]]) -> None:
            async with a_queue(queue_name, redis_url) as own:
                for g, s in mine:
                    await own.add("o", {"g": g, "s": s}, group=g, order_ms=base + 10 * s)
                    await asyncio.sleep(0.02)

        async with python_workers(redis_url, queue_name, 2, concurrency=5, sweep_interval=0.3):
            await asyncio.gather(*(producer(jobs[i::3]) for i in range(3)))
            assert now_ms() < base + WINDOW_MS, "the adds took longer than the window (machine overloaded?)"
            await wait_records(redis, rec, len(jobs), 30, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {f"G{g}": per_group for g in range(4)})
        # none ran before its order_ms + the delay
        for start in starts:
            assert start["t0"] >= base + 10 * start["s"] + WINDOW_MS - 5, start
        assert await queue.get_groups() == []


async def test_the_head_waits_out_its_window_in_delayed_and_an_earlier_job_takes_its_place(
        redis_url: str, queue_name: str) -> None:
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(60_000)
        later = await queue.add("o", {}, group="A", order_ms=base + 20)
        assert await queue.get_job_state(later.id) == "delayed"  # released, due at order_ms + delay
        delayed = await queue.get_delayed()
        assert [j.id for j in delayed] == [later.id]
        behind = await queue.add("o", {}, group="A", order_ms=base + 30)
        assert await queue.get_job_state(behind.id) == "waiting-children"
        earlier = await queue.add("o", {}, group="A", order_ms=base + 10)
        # the earlier job took the slot: the later one went back behind the gate, in its place
        assert await queue.get_job_state(earlier.id) == "delayed"
        assert await queue.get_job_state(later.id) == "waiting-children"
        assert await held_ids(queue, "A") == [later.id, behind.id]
        assert await queue.get_groups() == [
            {"id": "A", "waiting": 2, "running": 1, "paused": False, "concurrency": 1}]
        counts = await queue.get_job_counts("delayed", "waiting-children", "waiting")
        assert counts == {"delayed": 1, "waiting-children": 2, "waiting": 0}
        # a job without order_ms is due at once, but keeps its place (its add time) in the order
        plain = await queue.add("o", {}, group="B")
        assert await queue.get_job_state(plain.id) == "waiting"


async def test_a_job_whose_window_has_passed_runs_at_once_and_a_later_arrival_runs_after_it(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Past its window a job is released as usual; an earlier order_ms arriving after that runs
    after it (the window is what the delay buys)."""
    rec = rec_key(queue_name)
    base = now_ms() - 10_000
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(500)
        first = await queue.add("o", {"g": "P", "s": 0}, group="P", order_ms=base + 20)
        assert await queue.get_job_state(first.id) == "waiting"
        late = await queue.add("o", {"g": "P", "s": 1}, group="P", order_ms=base + 10)
        assert await queue.get_job_state(late.id) == "waiting-children"
        async with python_workers(redis_url, queue_name, 1, concurrency=2):
            await wait_records(redis, rec, 2, 15, queue)
        ends, starts = await read_records(redis, rec)
        assert [s["id"] for s in starts] == [first.id, late.id]
        check_groups(ends, starts, {"P": 2})


async def test_a_delayed_head_is_released_without_any_keeper_and_the_group_goes_on(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """No keeper, no sweep: upstream promotes the head when it is due, and each finish releases the
    next job (itself waiting out its window in delayed). Nothing is stranded."""
    rec = rec_key(queue_name)
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(400)
        for s in (2, 0, 3, 1):
            await queue.add("o", {"g": "N", "s": s}, group="N", order_ms=base + 100 * s)
        async with python_workers(redis_url, queue_name, 1, concurrency=3, group_keeper=False):
            await wait_records(redis, rec, 4, 20, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {"N": 4})
        assert await queue.get_groups() == []
        assert await queue.get_job_counts("completed") == {"completed": 4}


async def test_per_group_ordering_delay_overrides_the_queues_and_none_removes_it(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(60_000)
        await queue.set_group_options("fast", ordering_delay_ms=0)
        await queue.set_group_options("slow", ordering_delay_ms=120_000, concurrency=2)
        assert await queue.get_group_ordering_delay("fast") == 0
        assert await queue.get_group_ordering_delay("slow") == 120_000
        assert await queue.get_group_ordering_delay("other") == 60_000
        assert await queue.get_group_concurrency("slow") == 2
        fast = await queue.add("o", {}, group="fast", order_ms=base)
        assert await queue.get_job_state(fast.id) == "waiting"
        other = await queue.add("o", {}, group="other", order_ms=base)
        assert await queue.get_job_state(other.id) == "delayed"
        slow = [await queue.add("o", {}, group="slow", order_ms=base + i) for i in range(3)]
        assert [await queue.get_job_state(j.id) for j in slow] == ["delayed", "delayed", "waiting-children"]
        score = await redis.zscore(f"bull:{queue_name}:delayed", slow[0].id)
        assert score is not None and int(score) // 0x1000 == base + 120_000
        await queue.set_group_options("slow", ordering_delay_ms=None)
        assert await queue.get_group_ordering_delay("slow") == 60_000
        await queue.set_group_options("slow", concurrency=3)  # the delay is left as it is
        assert await queue.get_group_ordering_delay("slow") == 60_000
        assert await redis.hget(f"bull:{queue_name}:meta", "bullmq-compat:group-settings") == "1"


async def test_bad_ordering_delays_are_refused_before_anything_is_written(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        for bad in (-1, 1.5, "100", True, None):
            with pytest.raises(InvalidArgument, match="ordering_delay_ms"):
                await queue.set_group_ordering_delay(bad)  # type: ignore[arg-type]
        for bad in (-5, 2.0, "x", False):
            with pytest.raises(InvalidArgument, match="ordering_delay_ms"):
                await queue.set_group_options("g", ordering_delay_ms=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="concurrency"):
            await queue.set_group_options("g", ordering_delay_ms=10, concurrency=0)
        with pytest.raises(Exception):
            await queue.set_group_options("", ordering_delay_ms=10)
        assert await redis.keys(f"bull:{queue_name}:grp:*") == []
        assert await redis.hget(f"bull:{queue_name}:meta", "bullmq-compat:group-settings") is None


async def test_a_retried_job_with_an_earlier_order_takes_back_a_later_job_in_its_window(
        redis_url: str, queue_name: str) -> None:
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        first = await queue.add("o", {}, group="R", order_ms=base - 10_000)
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            job = await worker.get_next_job("tok")
            assert job is not None and job.id == first.id
            await job.move_to_failed(RuntimeError("no"), "tok")
            await queue.set_group_ordering_delay(60_000)
            later = await queue.add("o", {}, group="R", order_ms=base)
            assert await queue.get_job_state(later.id) == "delayed"
            await (await queue.get_job(first.id)).retry()  # type: ignore[union-attr]
            # back in its place, first: it took the slot (its own window runs too), the later one waits
            assert await queue.get_job_state(first.id) == "delayed"
            assert await queue.get_job_state(later.id) == "waiting-children"
            assert await held_ids(queue, "R") == [later.id]
        finally:
            await worker.close()


# -- deduplication on group jobs -----------------------------------------------------------------------

async def _run_dedup_steps(queue: Queue, worker: Worker, steps: list[Any], group: bool) -> list[Any]:
    out: list[Any] = []
    held: dict[str, Any] = {}
    for step in steps:
        if step[0] == "add":
            _, data, dedup, extra = step
            opts = {"deduplication": dedup, **extra}
            if group:
                opts["group"] = "D"
            out.append((await queue.add("d", data, **opts)).id)
        elif step[0] == "sleep":
            await asyncio.sleep(step[1])
        elif step[0] == "take":
            job = await worker.get_next_job(step[1], block=False)
            held[step[1]] = job
            out.append(job.id if job else None)
        elif step[0] == "complete":
            job = held.pop(step[1])
            await job.move_to_completed("done", step[1])
        elif step[0] == "probe":
            out.append(await queue.get_deduplication_job_id(step[1]))
        elif step[0] == "inspect":  # the delay of the job the step-th output names
            job = await queue.get_job(out[step[1]])
            out.append(job.delay if job else None)
    return out


DEDUP_SCENARIOS = {
    "simple": [("add", {"v": 1}, {"id": "k"}, {}), ("add", {"v": 2}, {"id": "k"}, {}), ("probe", "k"),
               ("take", "t"), ("add", {"v": 3}, {"id": "k"}, {}), ("complete", "t"), ("probe", "k"),
               ("add", {"v": 4}, {"id": "k"}, {})],
    "throttle": [("add", {"v": 1}, {"id": "k", "ttl": 400}, {}), ("add", {"v": 2}, {"id": "k", "ttl": 400}, {}),
                 ("sleep", 0.6), ("add", {"v": 3}, {"id": "k", "ttl": 400}, {}), ("probe", "k")],
    "extend": [("add", {"v": 1}, {"id": "k", "ttl": 700, "extend": True}, {}), ("sleep", 0.4),
               ("add", {"v": 2}, {"id": "k", "ttl": 700, "extend": True}, {}), ("sleep", 0.4),
               ("add", {"v": 3}, {"id": "k", "ttl": 700, "extend": True}, {}), ("probe", "k"), ("sleep", 1.0),
               ("add", {"v": 4}, {"id": "k", "ttl": 700, "extend": True}, {})],
    "debounce": [("add", {"v": 1}, {"id": "k", "ttl": 5000, "extend": True, "replace": True}, {"delay": 3000}),
                 ("add", {"v": 2}, {"id": "k", "ttl": 5000, "extend": True, "replace": True}, {"delay": 3000}),
                 ("probe", "k"),
                 ("add", {"v": 3}, {"id": "k", "ttl": 5000, "extend": True, "replace": True}, {}), ("probe", "k"),
                 ("add", {"v": 4}, {"id": "k", "ttl": 5000, "extend": True, "replace": True}, {"delay": 3000})],
    "keep_last_if_active": [
        ("add", {"v": 1}, {"id": "k", "keep_last_if_active": True}, {}),
        ("add", {"v": 2}, {"id": "k", "keep_last_if_active": True}, {}), ("take", "t"),
        ("add", {"v": 3}, {"id": "k", "keep_last_if_active": True}, {}),
        ("add", {"v": 4}, {"id": "k", "keep_last_if_active": True}, {}), ("probe", "k"), ("complete", "t"),
        ("probe", "k"), ("add", {"v": 5}, {"id": "k", "keep_last_if_active": True}, {}), ("take", "u"),
        ("add", {"v": 6}, {"id": "k", "keep_last_if_active": True}, {}), ("complete", "u"), ("probe", "k"),
        ("take", "w"), ("complete", "w"), ("probe", "k")],
    "reschedule": [("add", {"v": 0}, {"id": "head"}, {}),
                   ("add", {"v": 1}, {"id": "k", "ttl": 60_000, "reschedule": True}, {"delay": 30_000}),
                   ("add", {"v": 2}, {"id": "k", "ttl": 60_000, "reschedule": True}, {"delay": 45_000}),
                   ("inspect", 1), ("probe", "k"),
                   ("add", {"v": 3}, {"id": "n", "reschedule": True}, {}),
                   ("add", {"v": 4}, {"id": "n", "reschedule": True}, {"delay": 45_000}), ("inspect", 5)],
    "replace": [("add", {"v": 1}, {"id": "k", "replace": True}, {"delay": 3000}),
                ("add", {"v": 2}, {"id": "k", "replace": True}, {"delay": 3000}), ("probe", "k"),
                ("add", {"v": 3}, {"id": "k", "replace": True}, {}), ("probe", "k")],
}


@pytest.mark.parametrize("scenario", list(DEDUP_SCENARIOS))
async def test_deduplication_modes_decide_for_a_group_job_as_for_a_plain_job(
        redis_url: str, queue_name: str, redis: aioredis.Redis, scenario: str) -> None:
    """The same steps on a plain queue and on a queue of group jobs give the same ids, the same
    deduplication keys and the same 'deduplicated'/'removed' events."""
    results = {}
    for group in (False, True):
        name = f"{queue_name}-{'g' if group else 'p'}"
        async with a_queue(name, redis_url) as queue:
            worker = Worker(name, connection=redis_url, group_keeper=False)
            try:
                results[group] = await _run_dedup_steps(queue, worker, DEDUP_SCENARIOS[scenario], group)
            finally:
                await worker.close()
            results[(group, "events")] = [
                {k: v for k, v in e.items() if k in ("event", "jobId", "deduplicatedJobId", "deduplicationId")}
                for e in await events(redis, name) if e["event"] in ("deduplicated", "removed", "added")]
            results[(group, "data")] = {
                job.id: job.data for job in await queue.get_jobs(["waiting", "delayed", "completed", "active",
                                                                  "waiting-children"])}
    assert results[True] == results[False]
    assert results[(True, "events")] == results[(False, "events")]
    assert results[(True, "data")] == results[(False, "data")]
    assert any(e["event"] == "deduplicated" for e in results[(True, "events")])


async def test_a_deduplicated_group_add_returns_the_held_job_and_adds_nothing(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        head = await queue.add("d", {}, group="G")
        held = await queue.add("d", {"v": 1}, group="G", deduplication={"id": "k"})
        again = await queue.add("d", {"v": 2}, group="G", deduplication={"id": "k"})
        assert again.id == held.id
        assert await held_ids(queue, "G") == [held.id]
        assert (await queue.get_job(held.id)).data == {"v": 1}  # type: ignore[union-attr]
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 1}
        dedup = [e for e in await events(redis, queue_name) if e["event"] == "deduplicated"]
        assert dedup == [{"event": "deduplicated", "jobId": held.id, "deduplicationId": "k",
                          "deduplicatedJobId": str(int(held.id) + 1)}]
        assert head.id != held.id


async def test_replacing_a_held_group_job_keeps_the_group_whole_and_in_order(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A held job with a delay still ahead is replaced as upstream replaces a delayed job: it is
    removed (from its group's bookkeeping too) and the new job takes its own place in the order;
    a held job whose delay has run out is kept, as a waiting plain job is."""
    rec = rec_key(queue_name)
    dd = {"id": "k", "replace": True, "ttl": 10_000, "extend": True}
    async with a_queue(queue_name, redis_url) as queue:
        head = await queue.add("d", {"g": "G", "s": 0}, group="G")
        old = await queue.add("d", {"g": "G", "s": -1}, group="G", delay=1000, deduplication=dd)
        mid = await queue.add("d", {"g": "G", "s": 1}, group="G")
        new = await queue.add("d", {"g": "G", "s": 2}, group="G", delay=1000, deduplication=dd)
        assert new.id != old.id
        assert await queue.get_job(old.id) is None
        assert await held_ids(queue, "G") == [mid.id, new.id]
        assert await queue.get_job_counts("waiting", "waiting-children", "delayed") == {
            "waiting": 1, "waiting-children": 2, "delayed": 0}
        assert await queue.get_deduplication_job_id("k") == new.id
        got = [e for e in await events(redis, queue_name) if e.get("jobId") in (old.id, new.id)]
        assert {"event": "removed", "jobId": old.id, "prev": "delayed"} in got
        assert any(e["event"] == "deduplicated" and e["deduplicatedJobId"] == old.id for e in got)
        async with python_workers(redis_url, queue_name, 1, concurrency=3):
            await wait_records(redis, rec, 3, 20, queue)
        ends, starts = await read_records(redis, rec)
        assert [s["id"] for s in starts] == [head.id, mid.id, new.id]
        check_groups(ends, starts, {"G": 3})
        assert await queue.get_groups() == []
        # its delay has run out while held: kept, as upstream keeps a waiting job
        await queue.pause_group("H")
        kept = await queue.add("d", {}, group="H", delay=1, deduplication={"id": "h", "replace": True})
        await asyncio.sleep(0.05)
        assert (await queue.add("d", {}, group="H", deduplication={"id": "h", "replace": True})).id == kept.id
        assert await held_ids(queue, "H") == [kept.id]


async def test_replacing_a_released_delayed_group_job_frees_its_slot_and_another_groups_job(
        redis_url: str, queue_name: str) -> None:
    dd = {"id": "k", "replace": True}
    async with a_queue(queue_name, redis_url) as queue:
        first = await queue.add("d", {}, group="A", delay=60_000, deduplication=dd)
        assert await queue.get_job_state(first.id) == "delayed"
        follower = await queue.add("d", {}, group="A")
        second = await queue.add("d", {}, group="A", delay=60_000, deduplication=dd)
        # the replaced head's slot went to the group's next job; the new job is held behind it
        assert await queue.get_job(first.id) is None
        assert await queue.get_job_state(follower.id) == "waiting"
        assert await held_ids(queue, "A") == [second.id]
        # a job of another group replaces it: group A's bookkeeping forgets it
        third = await queue.add("d", {}, group="B", delay=60_000, deduplication=dd)
        assert await queue.get_job(second.id) is None
        assert await held_ids(queue, "A") == []
        assert await queue.get_job_state(third.id) == "delayed"
        groups = {g["id"]: (g["waiting"], g["running"]) for g in await queue.get_groups()}
        assert groups == {"A": (0, 1), "B": (0, 1)}


async def test_replace_within_the_ordering_window_replaces_the_not_yet_due_job(
        redis_url: str, queue_name: str) -> None:
    base = now_ms()
    dd = {"id": "w", "replace": True}
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(60_000)
        head = await queue.add("d", {}, group="W", order_ms=base)
        held = await queue.add("d", {"v": 1}, group="W", order_ms=base + 5, deduplication=dd)
        assert await queue.get_job_state(head.id) == "delayed"
        new = await queue.add("d", {"v": 2}, group="W", order_ms=base + 6, deduplication=dd)
        assert await queue.get_job(held.id) is None
        assert await held_ids(queue, "W") == [new.id]
        assert await queue.get_job_counts("delayed", "waiting-children") == {"delayed": 1, "waiting-children": 1}


async def test_bad_deduplication_on_a_group_job_is_refused_before_anything_is_written(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """(What a group job still refuses of deduplication at run time, keepLastIfActive behind an
    active plain job, is in tests/test_group_dedup.py.)"""
    async with a_queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidArgument):
            await queue.add_bulk([{"name": "ok", "data": {}, "opts": {"group": "F"}},
                                  {"name": "bad", "data": {}, "opts": {"group": "F", "deduplication": {"id": 3}}}])
        with pytest.raises(InvalidArgument):
            await queue.add("d", {}, group="F", deduplication={"id": "x", "ttl": "soon"})
        with pytest.raises(InvalidArgument):
            await queue.add("d", {}, group="F", deduplication={"id": ""})
        counts = await queue.get_job_counts()
        assert sum(counts.values()) == 0, counts
        assert await redis.exists(f"bull:{queue_name}:id") == 0  # not even an id was taken
        assert await redis.keys(f"bull:{queue_name}:grp:*") == []
        assert await redis.keys(f"bull:{queue_name}:de:*") == []


async def test_with_concurrency_two_an_earlier_job_takes_back_only_the_latest_delayed_job(
        redis_url: str, queue_name: str) -> None:
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_options("K", ordering_delay_ms=60_000, concurrency=2)
        j30 = await queue.add("o", {}, group="K", order_ms=base + 30)
        j20 = await queue.add("o", {}, group="K", order_ms=base + 20)
        assert [await queue.get_job_state(j.id) for j in (j30, j20)] == ["delayed", "delayed"]
        j10 = await queue.add("o", {}, group="K", order_ms=base + 10)
        assert [await queue.get_job_state(j.id) for j in (j10, j20, j30)] == ["delayed", "delayed",
                                                                           "waiting-children"]
        assert await held_ids(queue, "K") == [j30.id]
        assert [j.id for j in await queue.get_delayed()] == [j10.id, j20.id]


async def test_an_older_caller_without_the_order_flag_is_read_as_before(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """ARGV[7] (was order_ms given?) is new: a caller of the add script that does not pass it (an
    older interop/groups.js) has an order other than the timestamp read as an order_ms."""
    base = now_ms()
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_ordering_delay(60_000)
        sent = []
        # an order before any timestamp this add can take (base + 5 matched the add's own timestamp
        # whenever the add was prepared exactly 5 ms after base: then it reads as "no order given")
        for order_ms in (base - 1000, None):
            opts: dict[str, Any] = {"group": "L"} if order_ms is None else {"group": "L", "order_ms": order_ms}
            prepared = queue._prepare("o", {}, opts)
            assert prepared.args[-1] == (0 if order_ms is None else 1)
            await queue.wait_until_ready()
            sent.append(codec.to_str(await queue.backend.runner.call(prepared.script, prepared.keys, prepared.args[:-1])))
        ordered, plain = sent
        assert await redis.hget(f"bull:{queue_name}:{ordered}", "gord") == str(base - 1000)
        assert await redis.hget(f"bull:{queue_name}:{plain}", "gord") is None
        assert await queue.get_job_state(ordered) == "delayed"
