"""Per-group FIFO with Python workers only: the invariants of ../shared/design/groups.md.

Node workers, Node producers and Bull-Board are in tests/test_interop_groups.py. Handlers record
their runs in Redis (tests/group_helpers.py) and `check_groups` asserts the invariants on them.

Sizes are the issue's: 2,000 jobs over 50 groups; 100,000 held jobs in the one-job-group test.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from typing import Any, AsyncIterator

import pytest
import redis.asyncio as aioredis

from bullmq_compat import InvalidArgument, InvalidJobOptions, Queue, Worker
from bullmq_compat._errors import JobLockMismatch
from bullmq_compat._groups import GroupJobRefused, GroupKeeper
from tests._redis_server import RedisServer, redis_server_binary
from tests.chaos_helpers import check_group_kills, finish_events, judge_lock_lost, read_list, report
from tests.group_helpers import (
    HELD_JOBS,
    a_queue,
    add_in_batches,
    check_groups,
    counts_by_group,
    finish_as_node,
    group_jobs,
    held_ids,
    keeper_proc,
    now_ms,
    python_worker_proc,
    python_workers,
    read_records,
    rec_key,
    recording_processor,
    wait_completed,
    wait_records,
    wait_until,
)


@contextlib.asynccontextmanager
async def private_redis(*extra: str) -> AsyncIterator[str]:
    """A redis-server of this test's own (an empty keyspace), stopped afterwards."""
    redis_server_binary()  # $REDIS_SERVER or redis-server: says what to install when there is none
    for attempt in range(3):  # a free port may be taken by someone else before the server binds it
        server = RedisServer(extra_args=extra)
        try:
            server.start()
            break
        except RuntimeError:
            server.stop()
            if attempt == 2:
                raise
    try:
        yield server.url
    finally:
        server.stop()


async def group_keys_left(redis: aioredis.Redis, queue_name: str) -> set[str]:
    """The queue's group keys, named after "grp:": once every job is done only the bookkeeping
    ones (add sequence, sweep lease, settings) may be left, no per-job or per-group state."""
    return {key.split(":grp:", 1)[1] for key in await redis.keys(f"bull:{queue_name}:grp:*")}


async def leave_a_stale_slot(queue: Queue, worker: Worker, gid: str) -> Any:
    """Job "X" of group ``gid`` (removeOnComplete) finished as a Node worker finishes it, with no
    keeper running: its hash is gone and its slot never freed. Returns the group's next job, added
    behind X and still held."""
    await queue.add("k", {}, group=gid, job_id="X", remove_on_complete=True)
    after = await queue.add("k", {}, group=gid)
    job = await worker.get_next_job("tok")
    assert job is not None and job.id == "X"
    await finish_as_node(queue, worker, job, "tok")
    return after


# -- invariants 1 and 2: at most one job of a group runs, in add order ------------------------------

async def test_python_workers_run_each_group_one_at_a_time_in_add_order(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """(1a) 2,000 jobs over 50 groups, 4 Workers at concurrency 20: no two jobs of a group overlap,
    each group runs in add order, and groups do run in parallel."""
    items = group_jobs(50, 40)
    async with a_queue(queue_name, redis_url) as queue:
        await add_in_batches(queue, items)
        counts = await queue.get_job_counts("waiting", "waiting-children")
        assert counts == {"waiting": 50, "waiting-children": 1950}
        started = time.monotonic()
        async with python_workers(redis_url, queue_name, 4, concurrency=20):
            await wait_records(redis, rec_key(queue_name), len(items), 60, queue)
        took = time.monotonic() - started
        ends, starts = await read_records(redis, rec_key(queue_name))
        check_groups(ends, starts, counts_by_group(items))
        print(f"2,000 jobs / 50 groups, 4 Python workers x 20: {took:.2f}s")
        # groups ran in parallel: the busiest instant had many groups running
        events = sorted([(e["t0"], 1) for e in ends] + [(e["t1"], -1) for e in ends])
        level = peak = 0
        for _, delta in events:
            level += delta
            peak = max(peak, level)
        assert peak >= 10, f"only {peak} groups ever ran at once"
        assert await queue.get_job_counts("completed", "waiting-children", "waiting", "active") == {
            "completed": 2000, "waiting-children": 0, "waiting": 0, "active": 0}
        assert await queue.get_groups() == []
        assert await redis.keys(f"bull:{queue_name}:grp:held:*") == []
        assert await redis.keys(f"bull:{queue_name}:grp:run:*") == []
        assert await group_keys_left(redis, queue_name) <= {"seq", "sweep"}


async def test_group_jobs_mixed_with_plain_jobs_priority_delay_and_lifo(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Group jobs keep their upstream options when released: a delayed head waits its delay, a
    prioritized one goes to 'prioritized'; plain jobs of the queue are untouched."""
    async with a_queue(queue_name, redis_url) as queue:
        before_add = now_ms()
        # (2 s: the checks below are done before it is due, even on a loaded machine)
        d0 = await queue.add("d", {"g": "D", "s": 0}, group="D", delay=2000)
        d1 = await queue.add("d", {"g": "D", "s": 1}, group="D", priority=5)
        p0 = await queue.add("p", {"g": "P", "s": 0}, group={"id": "P"}, priority=3)
        plain = await queue.add("plain", {"g": "plain", "s": 0})
        assert await queue.get_job_state(d0.id) == "delayed"
        assert await queue.get_job_state(d1.id) == "waiting-children"
        assert await queue.get_job_state(p0.id) == "prioritized"
        assert await queue.get_job_state(plain.id) == "waiting"
        stored = await queue.get_job(d1.id)
        assert stored is not None and stored.opts["group"] == {"id": "D"} and stored.group_id == "D"
        assert await redis.hget(f"bull:{queue_name}:{d1.id}", "gid") == "D"
        assert json.loads(await redis.hget(f"bull:{queue_name}:{d1.id}", "opts"))["group"] == {"id": "D"}
        async with python_workers(redis_url, queue_name, 1, concurrency=5):
            await wait_records(redis, rec_key(queue_name), 4, 30, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        check_groups(ends, starts, {"D": 2, "P": 1, "plain": 1})
        d_first = next(e for e in ends if e["g"] == "D" and e["s"] == 0)
        assert d_first["t0"] >= before_add + 2000, "the delayed head ran before its delay"
        assert await queue.get_job_state(d1.id) == "completed"


async def test_delayed_group_jobs_start_on_time_under_a_worker_with_idle_slots(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Two delayed jobs (100 and 300 ms) on a worker with 4 slots: the second one's due time is
    learnt from a script reply while the worker blocks on the marker; it must still start on time
    (not after drain_delay, 5 s), or every later job of its group waits with it."""
    async with a_queue(queue_name, redis_url) as queue:
        async with python_workers(redis_url, queue_name, 1, concurrency=4):
            await asyncio.sleep(0.2)  # every slot idle, the marker waiter blocked
            added = now_ms()
            await queue.add("d", {"g": "D1", "s": 0}, group="D1", delay=100)
            await queue.add("d", {"g": "D2", "s": 0}, group="D2", delay=300)
            await queue.add("d", {"g": "D2", "s": 1}, group="D2")
            await wait_records(redis, rec_key(queue_name), 3, 10, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        late = {(s["g"], s["s"]): s["t0"] - added for s in starts}
        print(f"delayed group jobs started at (ms after add): {late}")
        assert late[("D1", 0)] < 100 + 1000 and late[("D2", 0)] < 300 + 1000, late
        check_groups(ends, starts, {"D1": 1, "D2": 2})


# -- invariant 3: failures and removals do not block a group ------------------------------------------

async def test_a_job_failing_for_good_does_not_block_its_group_and_retries_keep_the_slot(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """s0 fails for good; s1 fails twice (backoff 100 ms) and then completes — its retries keep the
    group's slot, so s2 never starts before s1's last attempt ended; s3 runs last."""
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [
            await queue.add("f", {"g": "G", "s": 0, "fail": "no way"}, group="G", attempts=3),
            await queue.add("f", {"g": "G", "s": 1, "failTimes": 2}, group="G", attempts=3,
                            backoff={"type": "fixed", "delay": 100}),
            await queue.add("f", {"g": "G", "s": 2, "sleepMs": 5}, group="G"),
            await queue.add("f", {"g": "G", "s": 3}, group="G"),
        ]
        async with python_workers(redis_url, queue_name, 2, concurrency=4):
            await wait_records(redis, rec_key(queue_name), 6, 15, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert [(s["s"]) for s in starts] == [0, 1, 1, 1, 2, 3]
        check_groups(ends, starts, {"G": 4}, allow_reruns=True)
        assert await queue.get_job_state(jobs[0].id) == "failed"
        failed = await queue.get_job(jobs[0].id)
        assert failed is not None and failed.failed_reason == "no way" and failed.attempts_made == 1
        retried = await queue.get_job(jobs[1].id)
        assert retried is not None and retried.attempts_made == 3
        assert [await queue.get_job_state(j.id) for j in jobs[1:]] == ["completed"] * 3
        assert await queue.get_groups() == []


async def test_retrying_a_finished_group_job_from_python_goes_back_behind_its_gate(
        redis_url: str, queue_name: str) -> None:
    """job.retry() and queue.retry_jobs() put a group job back in its group, in its place: it waits
    while another job of the group runs, and runs before the group's jobs added after it."""
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("x", {"s": s}, group="G") for s in range(4)]
        plain = await queue.add("x", {"plain": True})
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            # s0 fails for good (s1 released), then plain fails too
            job = await worker.get_next_job("t0")
            assert job is not None and job.id == jobs[0].id
            await job.move_to_failed(RuntimeError("boom"), "t0")
            job = await worker.get_next_job("tp")
            assert job is not None and job.id == plain.id
            await job.move_to_failed(RuntimeError("boom"), "tp")
            # s1 is running: a retried s0 waits behind the gate, first in line
            running = await worker.get_next_job("t1")
            assert running is not None and running.id == jobs[1].id
            failed = await queue.get_job(jobs[0].id)
            assert failed is not None
            await failed.retry()
            assert await queue.get_job_state(jobs[0].id) == "waiting-children"
            assert [j.id for j in await queue.get_group_jobs("G")] == [jobs[0].id, jobs[2].id, jobs[3].id]
            again = await queue.get_job(jobs[0].id)
            assert again is not None and again.failed_reason is None and again.finished_on is None

            # s1 fails for good too; retry_jobs() retries it behind the gate and plain straight to wait
            await running.move_to_failed(RuntimeError("boom"), "t1")  # releases s0
            assert await queue.get_job_state(jobs[0].id) == "waiting"
            await queue.retry_jobs()
            assert await queue.get_job_state(plain.id) == "waiting"
            assert await queue.get_job_state(jobs[1].id) == "waiting-children"
            assert [j.id for j in await queue.get_group_jobs("G")] == [jobs[1].id, jobs[2].id, jobs[3].id]

            order = []
            for n in range(5):
                job = await worker.get_next_job(f"r{n}")
                assert job is not None
                states = [await queue.get_job_state(j.id) for j in jobs]
                assert sum(state in ("waiting", "active") for state in states) == 1, states
                order.append(job.id)
                await job.move_to_completed(None, f"r{n}")
            assert [i for i in order if i != plain.id] == [jobs[0].id, jobs[1].id, jobs[2].id, jobs[3].id]
            assert await queue.get_groups() == []
        finally:
            await worker.close()


async def test_removing_a_held_or_released_job_removes_only_it_and_the_group_goes_on(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Job.remove() (upstream's removeJob, as Bull-Board calls it) on a held job and on the
    group's released head: only that job goes; the rest of the group remains and then runs."""
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("r", {"g": "R", "s": s}, group="R") for s in range(5)]
        other = [await queue.add("r", {"g": "O", "s": s}, group="O") for s in range(2)]
        assert await queue.get_job_state(jobs[0].id) == "waiting"
        held = await queue.get_job(jobs[2].id)
        assert held is not None
        await held.remove()
        head = await queue.get_job(jobs[0].id)
        assert head is not None
        await head.remove()
        assert await queue.get_job(jobs[0].id) is None and await queue.get_job(jobs[2].id) is None
        for job in (jobs[1], jobs[3], jobs[4], *other):
            assert await queue.get_job(job.id) is not None, f"job {job.id} went with the removed ones"
        assert await held_ids(queue, "R") == [jobs[1].id, jobs[3].id, jobs[4].id]
        async with python_workers(redis_url, queue_name, 1, concurrency=4, sweep_interval=0.3):
            await wait_records(redis, rec_key(queue_name), 5, 10, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert [s["s"] for s in starts if s["g"] == "R"] == [1, 3, 4]
        assert {(s["g"], s["s"]) for s in starts if s["g"] == "O"} == {("O", 0), ("O", 1)}
        assert await queue.get_groups() == []


async def test_a_running_job_cannot_be_removed_and_a_finished_one_can(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Upstream refuses to remove a locked (running) job; removing it once completed changes
    nothing for the group."""
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("r", {"g": "A", "s": s, "sleepMs": 600 if s == 0 else 1}, group="A")
                for s in range(3)]
        async with python_workers(redis_url, queue_name, 1, concurrency=3):
            await wait_until(lambda: _llen_at_least(redis, f"{rec_key(queue_name)}:starts", 1), 5, "s0 to start")
            assert await queue.remove(jobs[0].id) == 0
            assert await queue.get_job_state(jobs[0].id) == "active"
            await wait_records(redis, rec_key(queue_name), 3, 10, queue)
        assert await queue.remove(jobs[0].id) == 1
        ends, starts = await read_records(redis, rec_key(queue_name))
        check_groups(ends, starts, {"A": 3})


async def _llen_at_least(redis: aioredis.Redis, key: str, n: int) -> bool:
    return int(await redis.llen(key)) >= n


async def test_finishing_a_group_job_releases_the_next_in_the_same_call_and_a_refused_finish_does_not(
        redis_url: str, queue_name: str) -> None:
    """A worker finishes a group job and releases its group's next job in one script call, with no
    keeper at all; a finish that upstream refuses (the lock is someone else's) keeps the slot."""
    async with a_queue(queue_name, redis_url) as queue:
        first = await queue.add("f", {}, group="G")
        second = await queue.add("f", {}, group="G")
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            job = await worker.get_next_job("tok")
            assert job is not None and job.id == first.id
            with pytest.raises(JobLockMismatch):
                await job.move_to_completed(None, "someone-else")
            assert await queue.get_job_state(first.id) == "active"
            assert await queue.get_job_state(second.id) == "waiting-children"

            reply = await job.move_to_completed({"ok": 1}, "tok", fetch_next=True)
            assert await queue.get_job_state(first.id) == "completed"
            # the next job was released after the finish, so the finish's own fetch did not see it
            assert reply in (0, None) or not reply[0]
            assert await queue.get_job_state(second.id) == "waiting"
            assert (await queue.get_job(first.id)).returnvalue == {"ok": 1}

            job = await worker.get_next_job("tok2")
            assert job is not None and job.id == second.id
            await job.move_to_failed(RuntimeError("for good"), "tok2")
            assert await queue.get_job_state(second.id) == "failed"
            assert await queue.get_groups() == []
        finally:
            await worker.close()


async def test_a_job_released_by_a_finish_is_announced_by_the_queue_marker_unless_paused(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A released job must wake idle workers (Node's too) through the queue's marker, as upstream's
    add would: whether the finish fetched a next job (upstream's fetch sets the marker then, and the
    release relies on it) or not; and a paused queue gets no marker, as upstream's add gives none."""
    async with a_queue(queue_name, redis_url) as queue:
        marker = queue.keys.marker
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            for fetch_next in (True, False):
                first = await queue.add("f", {}, group="M")
                second = await queue.add("f", {}, group="M")
                plain = await queue.add("p", {})
                job = await worker.get_next_job("tok")
                assert job is not None and job.id == first.id
                await redis.delete(marker)
                reply = await job.move_to_completed(None, "tok", fetch_next=fetch_next)
                if fetch_next:  # the finish's fetch took the plain job: the released one is left waiting
                    assert reply and reply[1] == plain.id
                assert await queue.get_job_state(second.id) == "waiting"
                assert await redis.zscore(marker, "0") == 0, f"fetch_next={fetch_next}: no marker"
                for job_id in (plain.id, second.id):  # finish both, so the next round starts empty
                    if await queue.get_job_state(job_id) == "waiting":
                        await worker.get_next_job("tok")
                    await (await queue.get_job(job_id)).move_to_completed(None, "tok")

            first = await queue.add("f", {}, group="P")
            second = await queue.add("f", {}, group="P")
            job = await worker.get_next_job("tok")
            assert job is not None and job.id == first.id
            await queue.pause()
            await redis.delete(marker)
            await job.move_to_completed(None, "tok", fetch_next=True)
            assert await queue.get_job_state(second.id) == "waiting"
            assert await redis.zscore(marker, "0") is None
        finally:
            await worker.close()


async def test_jobs_with_corrupt_or_foreign_group_fields_still_finish(redis_url: str, queue_name: str) -> None:
    """A hash not written by our gate (BullMQ Pro's opts.group, a junk gid) finishes like a plain job."""
    client = aioredis.Redis.from_url(redis_url)  # bytes in, bytes out: the gid may be undecodable
    hashes = {
        "pro": {"opts": json.dumps({"group": {"id": "user:1"}})},
        "list-id": {"opts": json.dumps({"group": {"id": []}})},
        "junk-gid": {"opts": "{}", "gid": b"\xff\xfe"},
        "ungated-gid": {"opts": "{}", "gid": "G"},
    }
    try:
        for job_id, fields in hashes.items():
            await client.hset(f"bull:{queue_name}:{job_id}",
                              mapping={"name": "n", "data": "{}", "timestamp": now_ms(), **fields})
            await client.lpush(f"bull:{queue_name}:wait", job_id)
        async with a_queue(queue_name, redis_url) as queue:
            worker = Worker(queue_name, connection=redis_url, group_keeper=False)
            try:
                for _ in hashes:
                    job = await worker.get_next_job("tok")
                    assert job is not None
                    await job.move_to_completed("done", "tok")
                assert {job_id: await queue.get_job_state(job_id) for job_id in hashes} == dict.fromkeys(
                    hashes, "completed")
            finally:
                await worker.close()
    finally:
        await client.aclose()


async def test_reusing_the_custom_id_of_a_finished_unreleased_job_does_not_wedge_its_group(
        redis_url: str, queue_name: str) -> None:
    """Job "X" finished with removeOnComplete by a worker that does not release (a Node worker, keeper
    down), then a new job "X" is added to the group: the stale slot must not pass for the new job's
    (it would never look finished, and the group would wait forever)."""
    async with a_queue(queue_name, redis_url) as queue:
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            after = await leave_a_stale_slot(queue, worker, "G")
            assert await queue.get_job("X") is None
            await queue.add("k", {"again": True}, group="G", job_id="X")
            # the stale slot was freed: the group's next job (added before the new X) is released
            assert await queue.get_job_state(after.id) == "waiting"
            assert await queue.get_job_state("X") == "waiting-children"
            for tok in ("t1", "t2"):
                job = await worker.get_next_job(tok)
                assert job is not None
                await job.move_to_completed(None, tok)
            assert await queue.get_job_state("X") == "completed"
            assert await queue.get_groups() == []
        finally:
            await worker.close()


async def test_a_custom_id_reused_in_another_group_frees_the_old_groups_stale_slot_at_a_sweep(
        redis_url: str, queue_name: str) -> None:
    """As above, but the new "X" goes to group B: A's stale slot is freed by the next sweep (X's hash
    now names B), and B's X is not taken for A's job."""
    async with a_queue(queue_name, redis_url) as queue:
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            a1 = await leave_a_stale_slot(queue, worker, "A")
            await queue.add("k", {"again": True}, group="B", job_id="X")
            assert await queue.get_job_state("X") == "waiting"  # B was free
            assert await queue.get_job_state(a1.id) == "waiting-children"
            assert await queue.sweep_groups() == 1
            assert await queue.get_job_state(a1.id) == "waiting"
            assert await queue.get_job_state("X") == "waiting"
        finally:
            await worker.close()


async def test_reusing_the_custom_id_of_a_removed_held_job_keeps_both_groups_gated(
        redis_url: str, queue_name: str) -> None:
    """Held job "X" of group A is removed (Bull-Board), then "X" is added to group B behind B's
    running head: A's stale entry must not release B's "X" (two B jobs would run at once), nor may
    deleting A's held jobs remove it."""
    async with a_queue(queue_name, redis_url) as queue:
        a0 = await queue.add("k", {}, group="A")
        await queue.add("k", {}, group="A", job_id="X")
        a2 = await queue.add("k", {}, group="A")
        b0 = await queue.add("k", {}, group="B")
        removed = await queue.get_job("X")
        assert removed is not None
        await removed.remove()
        await queue.add("k", {"again": True}, group="B", job_id="X")
        assert await queue.delete_group_jobs("A") == 1  # a2 only
        assert await queue.get_job("X") is not None and await queue.get_job(a2.id) is None
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            job = await worker.get_next_job("t0")
            assert job is not None and job.id in (a0.id, b0.id)
            first = job
            job = await worker.get_next_job("t1")
            assert job is not None and {first.id, job.id} == {a0.id, b0.id}
            a_job = first if first.id == a0.id else job
            b_job = job if a_job is first else first
            await a_job.move_to_completed(None, "t0" if a_job is first else "t1")
            assert await queue.get_job_state("X") == "waiting-children", "A's stale entry released B's X"
            await b_job.move_to_completed(None, "t1" if a_job is first else "t0")
            assert await queue.get_job_state("X") == "waiting"
        finally:
            await worker.close()


# -- invariant 4: SIGKILL never wedges a group ----------------------------------------------------

async def test_sigkilled_python_worker_never_wedges_a_group(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Two Python worker processes (lock 1000 ms, stalled check every 300 ms) and a keeper process
    run 600 jobs over 30 groups; one worker and then the keeper are SIGKILLed mid-run. After stall
    recovery every job of every group completes, with no overlap, in add order. Every run records
    its pid, start and end: a repeated run is accepted only where the kill explains it (the earlier
    run's process was killed before that run ended, and before the job stalled); any other repeat
    is a lock lost by the live worker -- failed in ``make chaos``, reported under a loaded ``make
    test`` (`chaos_helpers.judge_lock_lost`, as tests/test_chaos.py) -- or, with no stalled event,
    fails at once."""
    items = group_jobs(30, 20, sleep_ms=(20, 40))
    expected = counts_by_group(items)
    rec = rec_key(queue_name)
    opts = dict(concurrency=15, lock_duration=1000, stalled_interval=300, sweep_interval=0.5)
    async with a_queue(queue_name, redis_url, max_len_events=100_000) as queue:  # every stalled event kept
        async with python_worker_proc(redis_url, queue_name, **opts) as doomed, \
                python_worker_proc(redis_url, queue_name, **opts) as survivor, \
                keeper_proc(redis_url, queue_name) as keeper:
            started = time.monotonic()
            await add_in_batches(queue, items)  # once every process is up
            await wait_records(redis, rec, 150, 30, queue)
            cut_off = {doomed.pid: await doomed.kill()}
            await wait_records(redis, rec, 300, 30, queue)
            cut_off[keeper.pid] = await keeper.kill()
            await wait_completed(queue, len(items), 30)
            assert survivor.proc is not None and survivor.proc.returncode is None
        took = time.monotonic() - started
        ends, starts = await read_records(redis, rec)
        figures = check_group_kills(ends, starts, expected, cut_off,
                                    await finish_events(redis, f"bull:{queue_name}:events"),
                                    lags=await read_list(redis, f"{rec}:lags"))
        figures.seconds = took
        report(f"\ngroup SIGKILL (Python worker and keeper): {figures.line()}")
        judge_lock_lost(figures, "group SIGKILL (Python worker and keeper)")
        finished = {(e["g"], e["s"], e["pid"], e["t0"]) for e in ends}
        cut_short = sum(1 for st in starts if st["pid"] == doomed.pid
                        and (st["g"], st["s"], st["pid"], st["t0"]) not in finished)
        assert cut_short > 0, "the kill landed between jobs"
        assert figures.duplicates >= cut_short, f"{cut_short} runs cut short, {figures.duplicates} repeated"
        assert await queue.get_job_counts("completed", "failed", "waiting-children", "waiting", "active") == {
            "completed": len(items), "failed": 0, "waiting-children": 0, "waiting": 0, "active": 0}
        assert await queue.get_groups() == []


async def test_held_jobs_wait_for_a_stalled_head_and_go_on_after_recovery(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """The head of a group runs in a worker that is SIGKILLed: the group's next job is not released
    while the head is stalled (it is still the group's current job); once recovered and done, it is."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        head = await queue.add("h", {"g": "S", "s": 0, "sleepMs": 60_000}, group="S")
        nxt = await queue.add("h", {"g": "S", "s": 1}, group="S")
        async with python_worker_proc(redis_url, queue_name, lock_duration=1000, stalled_interval=300) as doomed:
            await wait_until(lambda: _llen_at_least(redis, f"{rec}:starts", 1), 10, "the head to start")
            killed_at = await doomed.kill()
        await redis.hset(f"bull:{queue_name}:{head.id}", "data", json.dumps({"g": "S", "s": 0, "sleepMs": 1}))
        # no worker: whatever sweeps happen, the group's next job stays held behind its stalled head
        assert await queue.sweep_groups() == 0
        assert await queue.get_job_state(nxt.id) == "waiting-children"
        async with python_workers(redis_url, queue_name, 1, concurrency=2, lock_duration=1000,
                                  stalled_interval=300):
            await wait_records(redis, rec, 2, 15, queue)
        ends, starts = await read_records(redis, rec)
        figures = check_group_kills(ends, starts, {"S": 2}, {doomed.pid: killed_at},
                                    await finish_events(redis, f"bull:{queue_name}:events"))
        assert (figures.killed_runs, figures.duplicates) == (1, 1)
        judge_lock_lost(figures, "stalled group head")
        assert [s["s"] for s in starts] == [0, 0, 1]
        recovered = await queue.get_job(head.id)
        assert recovered is not None and recovered.stalled_counter == 1


# -- invariants 5 and 6: visible while held; a huge group does not delay a small one ---------------

async def test_held_jobs_count_as_waiting_children(redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("c", {"g": "C", "s": s}, group="C") for s in range(4)]
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 3}
        assert await queue.count() == 4
        assert [await queue.get_job_state(j.id) for j in jobs] == ["waiting"] + ["waiting-children"] * 3
        listed = await queue.get_jobs(["waiting-children"], asc=True)
        assert sorted(j.id for j in listed) == sorted(j.id for j in jobs[1:])
        assert await queue.get_group_job_count("C") == 3
        assert await held_ids(queue, "C") == [j.id for j in jobs[1:]]


async def test_held_jobs_are_listed_in_add_order_under_their_own_score(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A held job's waiting-children score is its add sequence (+0.5 when its release needs its
    options: priority, delay, lifo), so Node and Bull-Board list held jobs in add order and the gate
    takes exactly that job out. One held by an earlier version (scored by its timestamp) is still
    released, with its options."""
    async with a_queue(queue_name, redis_url) as queue:
        head = await queue.add("s", {}, group="S")
        plain = await queue.add("s", {}, group="S")
        prio = await queue.add("s", {}, group="S", priority=5)
        lifo = await queue.add("s", {}, group="S", lifo=True)
        old = await queue.add("s", {}, group="S", priority=2)
        wc = f"bull:{queue_name}:waiting-children"
        seq = {j.id: int(await redis.hget(f"bull:{queue_name}:{j.id}", "gseq")) for j in (plain, prio, lifo, old)}
        assert seq[plain.id] < seq[prio.id] < seq[lifo.id] < seq[old.id]
        assert await redis.zscore(wc, plain.id) == seq[plain.id]
        assert await redis.zscore(wc, prio.id) == seq[prio.id] + 0.5
        assert await redis.zscore(wc, lifo.id) == seq[lifo.id] + 0.5
        assert [j.id for j in await queue.get_jobs(["waiting-children"], asc=True)] == [
            plain.id, prio.id, lifo.id, old.id]
        await redis.zadd(wc, {old.id: old.timestamp})  # as an earlier version scored it
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            expected = [(head, "waiting"), (plain, "waiting"), (prio, "prioritized"), (lifo, "waiting"),
                        (old, "prioritized")]
            for (job, _), (after, state) in zip(expected, expected[1:]):
                assert await queue.get_job_state(after.id) == "waiting-children"
                running = await worker.get_next_job("t")
                assert running is not None and running.id == job.id
                await running.move_to_completed(None, "t")
                assert await queue.get_job_state(after.id) == state, after.id
            assert await redis.zcard(wc) == 0
        finally:
            await worker.close()


async def test_a_group_with_many_held_jobs_does_not_delay_a_one_job_group() -> None:
    """HELD_JOBS jobs in group A (add_bulk, 1,000 a batch), then one in group B: a worker started
    afterwards starts B within a second, and a one-job group C added while A churns starts at once."""
    async with private_redis() as url:
        redis = aioredis.Redis.from_url(url, decode_responses=True)
        queue_name = "big"
        rec = rec_key(queue_name)
        try:
            async with a_queue(queue_name, url) as queue:
                began = time.monotonic()
                items = [{"name": "a", "data": {"g": "A", "s": s}, "opts": {"group": "A"}} for s in range(HELD_JOBS)]
                await add_in_batches(queue, items, batch=1000)
                add_took = time.monotonic() - began
                await queue.add("b", {"g": "B", "s": 0}, group="B")
                counted = time.monotonic()
                counts = await queue.get_job_counts("waiting", "waiting-children")
                count_took = time.monotonic() - counted
                assert counts == {"waiting": 2, "waiting-children": HELD_JOBS - 1}

                async def start_of(g: str) -> int | None:
                    for raw in await redis.lrange(f"{rec}:starts", 0, -1):
                        entry = json.loads(raw)
                        if entry["g"] == g:
                            return int(entry["t0"])
                    return None

                async def started(g: str) -> bool:
                    return await start_of(g) is not None

                run_at = now_ms()
                async with python_workers(url, queue_name, 1, concurrency=4):
                    await wait_until(lambda: started("B"), 30, "B to start")
                    b_latency = (await start_of("B") or 0) - run_at
                    await wait_records(redis, rec, 200, 20)  # A churns, one job at a time
                    c_added = now_ms()
                    await queue.add("c", {"g": "C", "s": 0}, group="C")
                    await wait_until(lambda: started("C"), 30, "C to start")
                    c_latency = (await start_of("C") or 0) - c_added
                    a_done = sum(1 for raw in await redis.lrange(rec, 0, -1) if json.loads(raw)["g"] == "A")
                    a_rate = a_done / max((now_ms() - run_at) / 1000, 1e-3)
                print(f"{HELD_JOBS:,} held jobs in group A: added in {add_took:.1f}s, getJobCounts {count_took * 1000:.1f} ms; "
                      f"one-job group B started {b_latency} ms after the worker; C (added mid-run) started "
                      f"{c_latency} ms after its add; A ran at {a_rate:.0f} jobs/s")
                # (behind A it would wait for minutes; 5 s leaves room for a loaded machine)
                assert b_latency < 5000, f"B started {b_latency} ms after the worker started"
                assert c_latency < 5000, f"C started {c_latency} ms after it was added"
                ends, starts = await read_records(redis, rec)
                a_order = [s["s"] for s in starts if s["g"] == "A"]
                assert a_order == list(range(len(a_order))), "group A ran out of order"
                a_runs = sorted((e["t0"], e["t1"]) for e in ends if e["g"] == "A")
                assert all(b0 >= a1 for (_, a1), (b0, _) in zip(a_runs, a_runs[1:])), "group A overlapped"
        finally:
            await redis.aclose()


# -- invariant 1 with k > 1: group concurrency ------------------------------------------------------

async def test_group_concurrency_three_runs_three_at_most_and_uses_them(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        await queue.set_group_concurrency("K", 3)
        assert await queue.get_group_concurrency("K") == 3
        assert await queue.get_group_concurrency("other") == 1
        items = [{"name": "k", "data": {"g": "K", "s": s, "sleepMs": 40}, "opts": {"group": "K"}} for s in range(30)]
        items += [{"name": "k", "data": {"g": "L", "s": s, "sleepMs": 10}, "opts": {"group": "L"}} for s in range(10)]
        await queue.add_bulk(items)
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 4, "waiting-children": 36}
        async with python_workers(redis_url, queue_name, 2, concurrency=10):
            await wait_records(redis, rec_key(queue_name), 40, 20, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        k_overlap = check_groups([e for e in ends if e["g"] == "K"], [s for s in starts if s["g"] == "K"],
                                 {"K": 30}, k=3)
        check_groups([e for e in ends if e["g"] == "L"], [s for s in starts if s["g"] == "L"], {"L": 10})
        assert k_overlap["K"] == 3, f"group K never ran 3 at once (max {k_overlap['K']})"
        assert max(e["n"] for e in ends if e["g"] == "K") == 3


async def test_raising_concurrency_releases_held_jobs_and_default_applies_to_all(
        redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        for s in range(5):
            await queue.add("k", {"s": s}, group="M")
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 4}
        await queue.set_group_concurrency("M", 3)
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 3, "waiting-children": 2}
        await queue.set_default_group_concurrency(2)
        for s in range(3):
            await queue.add("k", {"s": s}, group="N")
        assert await queue.get_group_concurrency("N") == 2
        assert await queue.get_group_concurrency("M") == 3
        groups = {g["id"]: g for g in await queue.get_groups()}
        assert groups["N"] == {"id": "N", "waiting": 1, "running": 2, "paused": False, "concurrency": 2}
        assert groups["M"] == {"id": "M", "waiting": 2, "running": 3, "paused": False, "concurrency": 3}
        with pytest.raises(InvalidArgument):
            await queue.set_group_concurrency("M", 0)


async def test_group_settings_are_flagged_in_meta_and_a_sweep_flags_older_ones(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """Releases read the queue's meta hash anyway (paused, global concurrency): a flag there says
    whether any group has a setting, so a queue without settings reads no more. Settings written
    before the flag existed are flagged by the next sweep, and hold again from then on."""
    meta, flag = f"bull:{queue_name}:meta", "bullmq-compat:group-settings"
    async with a_queue(queue_name, redis_url) as queue:
        await queue.add("k", {}, group="A")
        assert await redis.hget(meta, flag) is None
        await queue.set_group_concurrency("B", 2)
        assert await redis.hget(meta, flag) == "1"
        await redis.hdel(meta, flag)  # as an earlier version left it
        await queue.sweep_groups()
        assert await redis.hget(meta, flag) == "1"
        for s in range(3):
            await queue.add("k", {"s": s}, group="B")
        assert (await queue.get_groups())[-1] == {"id": "B", "waiting": 1, "running": 2, "paused": False,
                                                   "concurrency": 2}


# -- invariant 2 with order_ms; pause, resume, listing, deleting, refusing ----------------------------

async def test_a_late_job_with_an_earlier_order_ms_runs_before_jobs_not_yet_started(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    base = now_ms() - 1000
    async with a_queue(queue_name, redis_url) as queue:
        j0 = await queue.add("o", {"g": "O", "s": 0}, group="O", order_ms=base)  # released at once
        j1 = await queue.add("o", {"g": "O", "s": 2}, group="O", order_ms=base + 20)
        j2 = await queue.add("o", {"g": "O", "s": 3}, group="O", order_ms=base + 30)
        late = await queue.add("o", {"g": "O", "s": 1}, group="O", order_ms=base + 10)
        plain = await queue.add("o", {"g": "O", "s": 4}, group="O")  # order = its add time
        assert await held_ids(queue, "O") == [late.id, j1.id, j2.id, plain.id]
        assert await queue.get_job_state(j0.id) == "waiting"
        async with python_workers(redis_url, queue_name, 1, concurrency=5):
            await wait_records(redis, rec_key(queue_name), 5, 10, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert [s["id"] for s in starts] == [j0.id, late.id, j1.id, j2.id, plain.id]
        check_groups(ends, starts, {"O": 5})


async def test_order_ms_ties_keep_add_order_and_order_ms_needs_a_group(
        redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("T")
        jobs = [await queue.add("t", {"i": i}, group="T", orderMs=1000) for i in range(5)]
        earlier = await queue.add("t", {"i": -1}, group="T", order_ms=999)
        assert await held_ids(queue, "T") == [earlier.id, *(j.id for j in jobs)]
        with pytest.raises(InvalidJobOptions):
            await queue.add("t", {}, order_ms=5)
        with pytest.raises(InvalidJobOptions):
            await queue.add("t", {}, group="T", order_ms=-1)


async def test_pause_and_resume_a_group(redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A paused group finishes its released job and releases nothing more (sweeps included); other
    groups go on; resume releases the next job."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, redis_url) as queue:
        for s in range(4):
            await queue.add("p", {"g": "P", "s": s}, group="P")
        for s in range(3):
            await queue.add("q", {"g": "Q", "s": s}, group="Q")
        await queue.pause_group("P")  # P's s0 is already released: it still runs
        assert await queue.is_group_paused("P") and not await queue.is_group_paused("Q")
        async with python_workers(redis_url, queue_name, 1, concurrency=4, sweep_interval=0.2):
            await wait_records(redis, rec, 4, 10, queue)  # P's s0 and Q's three
            await asyncio.sleep(0.6)  # sweeps happen; P stays paused
            ends, _ = await read_records(redis, rec)
            assert sorted((e["g"], e["s"]) for e in ends) == [("P", 0), ("Q", 0), ("Q", 1), ("Q", 2)]
            assert await queue.get_group_job_count("P") == 3
            paused = await queue.get_groups("paused")
            assert paused == [{"id": "P", "waiting": 3, "running": 0, "paused": True, "concurrency": 1}]
            assert await queue.get_groups("running") == []
            await queue.resume_group("P")
            assert not await queue.is_group_paused("P")
            await wait_records(redis, rec, 7, 10, queue)
        ends, starts = await read_records(redis, rec)
        check_groups(ends, starts, {"P": 4, "Q": 3})
        assert await queue.get_groups() == []


async def test_pausing_a_group_before_adding_holds_even_its_first_job(
        redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        await queue.pause_group("Z")
        job = await queue.add("z", {}, group="Z")
        assert await queue.get_job_state(job.id) == "waiting-children"
        await queue.resume_group("Z")
        assert await queue.get_job_state(job.id) == "waiting"


async def test_get_groups_reports_waiting_running_paused_and_concurrency(
        redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        for s in range(3):
            await queue.add("x", {}, group="X")
        await queue.add("y", {}, group="Y")
        await queue.set_group_concurrency("W", 2)
        for s in range(3):
            await queue.add("w", {}, group="W")
        await queue.pause_group("V")
        assert await queue.get_groups() == [
            {"id": "V", "waiting": 0, "running": 0, "paused": True, "concurrency": 1},
            {"id": "W", "waiting": 1, "running": 2, "paused": False, "concurrency": 2},
            {"id": "X", "waiting": 2, "running": 1, "paused": False, "concurrency": 1},
            {"id": "Y", "waiting": 0, "running": 1, "paused": False, "concurrency": 1},
        ]
        assert [g["id"] for g in await queue.get_groups("waiting")] == ["W", "X"]
        assert [g["id"] for g in await queue.get_groups("running")] == ["W", "X", "Y"]
        assert [g["id"] for g in await queue.get_groups("paused")] == ["V"]
        with pytest.raises(Exception):
            await queue.get_groups("bogus")


async def test_delete_group_jobs_removes_only_the_groups_held_jobs(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        doomed = [await queue.add("d", {"g": "D", "s": s}, group="D") for s in range(4)]
        kept = [await queue.add("e", {"g": "E", "s": s}, group="E") for s in range(3)]
        assert await queue.delete_group_jobs("D") == 3
        assert await queue.get_job_state(doomed[0].id) == "waiting"  # the released head is left
        for job in doomed[1:]:
            assert await queue.get_job(job.id) is None
        for job in kept:
            assert await queue.get_job(job.id) is not None
        assert await queue.get_group_job_count("D") == 0 and await queue.get_group_job_count("E") == 2
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 2, "waiting-children": 2}
        assert await queue.delete_group_jobs("D") == 0
        async with python_workers(redis_url, queue_name, 1, concurrency=3):
            await wait_records(redis, rec_key(queue_name), 4, 10, queue)
        ends, starts = await read_records(redis, rec_key(queue_name))
        check_groups(ends, starts, {"D": 1, "E": 3})
        assert await queue.get_groups() == []
        assert await group_keys_left(redis, queue_name) <= {"seq", "sweep", "conc"}


async def test_bad_group_options_are_refused(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """(Deduplication works on group jobs, all five modes: tests/test_group_ordering.py and
    tests/test_group_dedup.py, which also has what it still refuses. Group jobs as flow children,
    and group flow parents refused: tests/test_group_flows.py.)"""
    async with a_queue(queue_name, redis_url) as queue:
        await queue.add("plain", {})
        assert issubclass(GroupJobRefused, InvalidJobOptions)
        for bad in ("", {"id": ""}, {"id": 5}, {"name": "x"}, 42):
            with pytest.raises(InvalidJobOptions):
                await queue.add("bad", {}, group=bad)
        assert await queue.get_group_job_count("F") == 0
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 0}
        assert await redis.keys(f"bull:{queue_name}:grp:*") == []


# -- the keeper alone, and sweeps ---------------------------------------------------------------------

async def test_keeper_releases_jobs_finished_outside_a_group_aware_worker(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    """A job finished without our release (as a Node worker would) stays the group's current job
    until a keeper sees its 'completed' event, or a sweep notices it."""
    async with a_queue(queue_name, redis_url) as queue:
        first = await queue.add("k", {}, group="K")
        second = await queue.add("k", {}, group="K")
        third = await queue.add("k", {}, group="K")
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            job = await worker.get_next_job("tok1")
            assert job is not None and job.id == first.id
            await finish_as_node(queue, worker, job, "tok1")
            assert await queue.get_job_state(first.id) == "completed"
            await asyncio.sleep(0.1)
            assert await queue.get_job_state(second.id) == "waiting-children"
            assert await queue.sweep_groups() == 1
            assert await queue.get_job_state(second.id) == "waiting"
            assert await queue.sweep_groups() == 0

            keeper = GroupKeeper(queue_name, redis_url, sweep_interval=60)
            task = keeper.start()
            try:
                await asyncio.sleep(0.2)  # the keeper has made its first sweep and follows the stream
                job = await worker.get_next_job("tok2")
                assert job is not None and job.id == second.id
                await finish_as_node(queue, worker, job, "tok2", "failed", "boom")
                await wait_until(lambda: _state_is(queue, third.id, "waiting"), 5, "the keeper to release")
                await wait_until(lambda: _true(keeper.released >= 1), 5, "the keeper to count its release")
            finally:
                await keeper.close()
                await asyncio.wait_for(task, 10)
        finally:
            await worker.close()


async def test_keeper_releases_jobs_whose_hash_the_finish_removed(
        redis_url: str, queue_name: str) -> None:
    """A job finished with removeOnComplete by a worker that does not release (a Node worker) leaves
    no hash naming its group: the keeper knows the group all the same, for a job that held its slot
    before the keeper started (read from the running sets) and for one it saw released (its
    "waiting" event names the group). Sweeps are 60 s apart here: they cannot be what releases."""
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("k", {}, group="K", remove_on_complete=True) for _ in range(3)]
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        keeper = GroupKeeper(queue_name, redis_url, sweep_interval=60)
        task = keeper.start()
        try:
            await asyncio.sleep(0.2)  # the keeper has made its first sweep and follows the stream
            for n, token in ((0, "t0"), (1, "t1")):
                job = await worker.get_next_job(token)
                assert job is not None and job.id == jobs[n].id
                await finish_as_node(queue, worker, job, token)
                assert await queue.get_job(job.id) is None
                await wait_until(lambda: _state_is(queue, jobs[n + 1].id, "waiting"), 5,
                                 f"the keeper to release job {n + 1}")
            assert keeper.released == 2
        finally:
            await keeper.close()
            await asyncio.wait_for(task, 10)
            await worker.close()
        # an id twice in one batch of events (say 'completed', then 'removed') is released once
        more = [await queue.add("k", {}, group="L", remove_on_complete=True) for _ in range(2)]
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            job = await worker.get_next_job("t2")  # K's last job, released above: done first
            assert job is not None and job.id == jobs[2].id
            await job.move_to_completed(None, "t2")
            job = await worker.get_next_job("t")
            assert job is not None and job.id == more[0].id
            await finish_as_node(queue, worker, job, "t")
            idle = GroupKeeper.for_queue(queue)
            idle.learn(job.id, "L")
            assert await idle.release([job.id, job.id]) == 1
            assert await queue.get_job_state(more[1].id) == "waiting"
        finally:
            await worker.close()


async def _true(value: bool) -> bool:
    return value


async def _state_is(queue: Queue, job_id: str, state: str) -> bool:
    return await queue.get_job_state(job_id) == state


async def test_keeper_misses_no_event_between_its_first_sweep_and_first_read(
        redis_url: str, queue_name: str) -> None:
    """A job finished (by a non-releasing worker) right after the keeper's first sweep, before it
    first reads the events stream, is released from its 'completed' event — not at the next sweep
    (60 s away here)."""
    async with a_queue(queue_name, redis_url) as queue:
        first = await queue.add("k", {}, group="K")
        second = await queue.add("k", {}, group="K")
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        keeper = GroupKeeper(queue_name, redis_url, sweep_interval=60)
        sweep = keeper.sweep
        job = await worker.get_next_job("tok")
        assert job is not None and job.id == first.id

        async def sweep_then_finish() -> int:
            released = await sweep()
            if await queue.get_job_state(first.id) == "active":
                await finish_as_node(queue, worker, job, "tok")
            return released

        keeper.sweep = sweep_then_finish  # type: ignore[method-assign]
        task = keeper.start()
        try:
            await wait_until(lambda: _state_is(queue, second.id, "waiting"), 5, "the keeper to release")
        finally:
            await keeper.close()
            await asyncio.wait_for(task, 10)
            await worker.close()


async def test_obliterate_refused_for_active_jobs_leaves_the_groups_whole(
        redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("o", {}, group="G") for _ in range(3)]
        worker = Worker(queue_name, connection=redis_url, group_keeper=False)
        try:
            assert (await worker.get_next_job("tok")).id == jobs[0].id
            with pytest.raises(InvalidArgument, match="active jobs"):
                await queue.obliterate()
            assert [j.id for j in await queue.get_group_jobs("G")] == [jobs[1].id, jobs[2].id]
            await queue.obliterate(force=True)
            assert await queue.get_groups() == [] and await queue.get_job(jobs[2].id) is None
        finally:
            await worker.close()


async def test_a_sweep_costs_a_few_commands_per_busy_group() -> None:
    """A group whose one slot is taken by a job still running costs a sweep its running set and one
    read of that job's hash (not a release attempt); a slot whose job finished outside any
    group-aware worker is freed and the next job released by the same sweep."""
    async with private_redis() as url:
        admin = aioredis.Redis.from_url(url, decode_responses=True)
        async with a_queue("sq", url) as queue:
            for s in range(2):
                await queue.add_bulk([{"name": "s", "data": {}, "opts": {"group": f"g{g}"}} for g in range(40)])
            worker = Worker("sq", connection=url, group_keeper=False)
            try:
                heads = [await worker.get_next_job(f"t{g}") for g in range(40)]
                assert all(heads)
                await admin.config_resetstat()
                assert await queue.sweep_groups() == 0
                stats = await admin.info("commandstats")
                nested = sum(v["calls"] for k, v in stats.items()
                             if k not in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_config|resetstat"))
                assert nested <= 3 * 40 + 10, stats
                # finished as a Node worker would (upstream's script, no release): the sweep releases
                head = heads[0]
                await finish_as_node(queue, worker, head, "t0")
                assert await queue.sweep_groups() == 1
                assert (await queue.get_job_counts("waiting"))["waiting"] == 1
            finally:
                await worker.close()
        await admin.aclose()


async def test_keepers_of_a_queue_share_one_sweep_per_interval(redis_url: str, queue_name: str) -> None:
    """Every Worker runs a keeper: they take turns through a lease in Redis, so the group index is
    swept about once per interval in all, not once per keeper (a sweep costs ~10 commands a group)."""
    async with a_queue(queue_name, redis_url) as queue:
        await queue.add("s", {}, group="A")
        keepers = [GroupKeeper(queue_name, redis_url, sweep_interval=0.25, follow_stream=False) for _ in range(4)]
        tasks = [keeper.start() for keeper in keepers]
        try:
            await asyncio.sleep(1.6)
        finally:
            for keeper in keepers:
                await keeper.close()
            await asyncio.gather(*tasks, return_exceptions=True)
        total = sum(keeper.sweeps for keeper in keepers)
        # 1.6 s / 0.25 s: at most about 7 sweeps in all, where 4 keepers on their own would make ~28
        assert 2 <= total <= 10, [keeper.sweeps for keeper in keepers]
        # while the lease is held, a due sweep is skipped; an explicit sweep never waits for it
        await queue.client.set(queue.keys.prefix_key + "grp:sweep", "1", px=10_000)
        probe = GroupKeeper.for_queue(queue, sweep_interval=0.25)
        assert await probe.sweep_if_due() is None and probe.sweeps == 0
        assert await probe.sweep() == 0 and probe.sweeps == 1


async def test_keeper_command_starts_and_stops_on_sigterm(redis_url: str, queue_name: str) -> None:
    async with keeper_proc(redis_url, queue_name, sweep_interval=0.2) as keeper:
        assert queue_name in keeper.first_line
        assert keeper.proc is not None
        keeper.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(keeper.proc.wait(), 10) == 0


# -- the group finish as a Redis Function -------------------------------------------------------------

async def _run_grouped(url: str, name: str, jobs: int, groups: int, on_job: Any = None) -> dict[str, list[int]]:
    """Add ``jobs`` jobs over ``groups`` groups, run them with one worker; the order each group ran in."""
    ran: dict[str, list[int]] = {}
    done = asyncio.Event()
    count = 0

    async def process(job: Any) -> None:
        nonlocal count
        ran.setdefault(job.data["g"], []).append(job.data["s"])
        if on_job is not None:
            await on_job(count)
        count += 1
        if count == jobs:
            done.set()

    async with a_queue(name, url) as queue:
        await queue.add_bulk([{"name": "f", "data": {"g": f"g{i % groups}", "s": i // groups},
                               "opts": {"group": f"g{i % groups}"}} for i in range(jobs)])
        worker = Worker(name, process, connection=url, concurrency=5)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await asyncio.wait_for(done.wait(), 30)
            async def all_completed() -> bool:
                return (await queue.get_job_counts("completed"))["completed"] == jobs

            await wait_until(all_completed, 10, f"{jobs} completed jobs")
        finally:
            await worker.close()
            await task
    return ran


async def test_group_finishes_run_by_fcall_and_the_library_is_loaded_again_after_a_flush() -> None:
    """On Redis 7 a group job finishes by FCALL of our function library, which the worker loads
    once; a library deleted meanwhile (FUNCTION FLUSH) is loaded again and no finish is lost."""
    from bullmq_compat._backends.redis.lua import own_library

    async with private_redis() as url:
        admin = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            async def flush_once(n: int) -> None:
                if n == 20:
                    await admin.function_flush()

            ran = await _run_grouped(url, "fq", 60, 3, flush_once)
            assert ran == {f"g{g}": list(range(20)) for g in range(3)}
            stats = await admin.info("commandstats")
            assert stats["cmdstat_fcall"]["calls"] >= 60
            assert stats["cmdstat_function|load"]["calls"] >= 2  # at first use, and after the flush
            libraries = [dict(zip(lib[::2], lib[1::2])) for lib in await admin.function_list()]
            assert [lib["library_name"] for lib in libraries] == [own_library().name]
        finally:
            await admin.aclose()


async def test_group_finishes_fall_back_to_evalsha_where_redis_refuses_functions() -> None:
    """Where Redis will not run our library (here an ACL without FCALL and FUNCTION; also Redis
    before 7.0), group jobs still finish and release their groups, by EVALSHA."""
    async with private_redis() as url:
        admin = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            await admin.execute_command("ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all",
                                        "-fcall", "-fcall_ro", "-function")
            ran = await _run_grouped(url.replace("redis://", "redis://nofn:pw@"), "fq", 40, 4)
            assert ran == {f"g{g}": list(range(10)) for g in range(4)}
            assert await admin.function_list() == []
            stats = await admin.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] >= 40
        finally:
            await admin.aclose()
    # a Redis that does not know FCALL (as before 7.0): "unknown command"
    async with private_redis("--rename-command", "FCALL", "") as url:
        ran = await _run_grouped(url, "fq", 20, 2)
        assert ran == {f"g{g}": list(range(10)) for g in range(2)}


# -- invariant 7: Redis Cluster safety -----------------------------------------------------------------

def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), Redis Cluster's key hash."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


async def _exercise_groups(url: str, prefix: str, queue_name: str) -> None:
    """Every group script path: add (released, held, delayed, prioritized, order_ms), concurrency,
    pause/resume, a worker's release, a keeper sweep, remove, delete, a failure."""
    rec = rec_key(queue_name)
    async with a_queue(queue_name, url, prefix=prefix) as queue:
        await queue.set_default_group_concurrency(1)
        await queue.set_group_concurrency("g1", 2)
        await queue.pause_group("g2")
        await queue.set_group_ordering_delay(0)
        await queue.set_group_options("g0", ordering_delay_ms=100)
        items = [{"name": "x", "data": {"g": f"g{i % 3}", "s": i}, "opts": {"group": f"g{i % 3}"}} for i in range(12)]
        items[4]["opts"]["order_ms"] = 1
        items[5]["opts"]["priority"] = 2
        items[6]["opts"]["delay"] = 50
        await queue.add_bulk(items)
        # the ordering window (released to delayed, taken back by an earlier job) and dedup's replace
        await queue.add("w", {"g": "g0", "s": 50}, group="g0", order_ms=now_ms() + 20)
        await queue.add("w", {"g": "g0", "s": 51}, group="g0", order_ms=now_ms() - 20)
        dd = {"id": "dd", "replace": True, "ttl": 5000, "extend": True}
        await queue.add("r", {"g": "g1", "s": 60}, group="g1", delay=100, deduplication=dd)
        await queue.add("r", {"g": "g0", "s": 61}, group="g0", delay=100, deduplication=dd)
        await queue.add("fails", {"g": "g0", "s": 99, "fail": "boom"}, group="g0")
        held = await queue.get_group_jobs("g2")
        await held[0].remove()
        await queue.resume_group("g2")
        assert await queue.delete_group_jobs("g1") >= 1
        await queue.sweep_groups()
        process, client = recording_processor(url, rec)
        worker = Worker(queue_name, process, connection=url, prefix=prefix, concurrency=4, group_sweep_interval=0.2)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            async def settled() -> bool:
                counts = await queue.get_job_counts("waiting", "active", "delayed", "prioritized", "waiting-children")
                return sum(counts.values()) == 0
            await wait_until(settled, 15, "every group job to finish")
        finally:
            await worker.close()
            await task
            await client.aclose()
        assert await queue.get_groups() == []
        await queue.get_groups("paused")
        await queue.get_group_concurrency("g1")


async def test_group_scripts_write_only_keys_under_a_hash_tagged_prefix() -> None:
    """With prefix "{bull}", every key the group scripts (and the worker around them) write starts
    with "{bull}:" (so one hash slot): checked by listing an otherwise empty Redis."""
    async with private_redis() as url:
        await _exercise_groups(url, "{bull}", "clustered")
        redis = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            keys = [k for k in await redis.keys("*") if not k.startswith("rec:")]
        finally:
            await redis.aclose()
        assert any(":grp:" in k for k in keys), keys
        stray = [k for k in keys if not k.startswith("{bull}:")]
        assert stray == [], f"keys outside the hash-tagged prefix: {stray}"


async def test_group_scripts_run_on_a_cluster_node_serving_only_the_prefix_slot() -> None:
    """A real cluster-mode Redis that serves only the hash slot of "{bull}": any key of another
    slot — declared or built inside a script — would fail with CROSSSLOT / non-local-key errors."""
    async with private_redis("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                             "--cluster-require-full-coverage", "no") as url:
        admin = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            slot = _crc16(b"bull") % 16384
            await admin.execute_command("CLUSTER", "ADDSLOTS", slot)
            await wait_until(lambda: _cluster_ok(admin), 10, "the cluster node to take its slot")
            with pytest.raises(Exception):  # the node really refuses other slots
                await admin.set("bull:elsewhere", 1)
            await _exercise_groups(url.replace("/0", ""), "{bull}", "clustered")
        finally:
            await admin.aclose()


async def _cluster_ok(admin: aioredis.Redis) -> bool:
    info = await admin.execute_command("CLUSTER", "INFO")
    text = info if isinstance(info, str) else str(info)
    return "cluster_slots_assigned:1" in text and "cluster_state:ok" in text
