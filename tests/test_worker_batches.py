"""Batch workers (issue #16): ``Worker(..., batch={"size", "min_size", "timeout", "max_bytes",
"group_affinity"})`` on Redis and PostgreSQL -- sizes, waiting for min_size, failures (all, or one
with set_as_failed), per-job return values, max_bytes, locks of a long batch, stalled recovery,
group affinity, and the options refused."""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import BatchJob, InvalidArgument, Queue, Worker
from bullmq_compat._batch import BatchOptions, batch_options
from tests.helpers import EventRecorder, running, wait_until

BACKENDS = ["redis", "postgres"]


@pytest.fixture(params=BACKENDS)
def conn(request: Any) -> dict[str, Any]:
    """Queue/Worker connection keywords for each backend (a fresh PostgreSQL schema per test)."""
    if request.param == "redis":
        return {"connection": request.getfixturevalue("redis_url")}
    url = request.getfixturevalue("postgres_url")
    schema = request.getfixturevalue("pg_migrated")
    return {"connection": url, "schema": schema}


@pytest.fixture
async def queue(conn: dict[str, Any], queue_name: str) -> AsyncIterator[Queue]:
    q = Queue(queue_name, **conn)
    try:
        yield q
    finally:
        await q.close()


def batch_worker(queue_name: str, conn: dict[str, Any], process: Any, **kwargs: Any) -> Worker:
    return Worker(queue_name, process, drain_delay=0.5, **conn, **kwargs)


async def states(queue: Queue, ids: list[str]) -> list[str]:
    return [await queue.get_job_state(job_id) for job_id in ids]


async def all_in(queue: Queue, ids: list[str], *wanted: str) -> bool:
    return all(state in wanted for state in await states(queue, ids))


async def add_jobs(queue: Queue, count: int, **opts: Any) -> list[str]:
    jobs = await queue.add_bulk([{"name": "n", "data": {"i": i}, "opts": dict(opts)} for i in range(count)])
    return [str(job.id) for job in jobs]


# -- sizes and return values -------------------------------------------------------------------------
async def test_batches_hold_at_most_size_jobs_and_every_job_completes(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 23)
    sizes: list[int] = []
    seen: list[int] = []

    async def process(job: Any) -> None:
        assert isinstance(job, BatchJob) and job.id is None
        batch = job.get_batch()
        sizes.append(len(batch))
        seen.extend(b.data["i"] for b in batch)
        assert job.data == [b.data for b in batch]

    worker = batch_worker(queue.name, conn, process, batch={"size": 10})
    events = EventRecorder(worker, "active", "completed")
    async with running(worker):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    assert sorted(seen) == list(range(23))
    assert max(sizes) <= 10 and sum(sizes) == 23
    assert max(sizes) == 10  # 23 jobs waiting when the worker started: full batches
    assert len(events.of("active")) == 23 and len(events.of("completed")) == 23
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and job.returnvalue is None and job.attempts_made == 1


async def test_a_list_of_the_batch_length_gives_each_job_its_value(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 12)

    async def process(job: Any) -> list[Any]:
        return [{"double": b.data["i"] * 2} for b in job.get_batch()]

    async with running(batch_worker(queue.name, conn, process, batch={"size": 5})):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    for i, job_id in enumerate(ids):
        job = await queue.get_job(job_id)
        assert job is not None and job.returnvalue == {"double": i * 2}


async def test_a_value_that_is_not_a_list_goes_to_every_job(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 4)

    def process(job: Any) -> dict[str, int]:  # a sync processor runs in the worker's threads
        return {"batch_of": len(job.get_batch())}

    async with running(batch_worker(queue.name, conn, process, batch={"size": 4})):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    values = [(await queue.get_job(job_id)).returnvalue for job_id in ids]  # type: ignore[union-attr]
    assert values == [{"batch_of": 4}] * 4  # the 4 jobs were waiting: one batch, one value for all


async def test_a_list_of_another_length_fails_the_batch_naming_both_lengths(queue: Queue,
                                                                         conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 3)

    async def process(job: Any) -> list[int]:
        return [1] * (len(job.get_batch()) + 1)

    async with running(batch_worker(queue.name, conn, process, batch={"size": 3})):
        await wait_until(lambda: all_in(queue, ids, "failed"), 60, "every job failed")
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and "returned a list of" in (job.failed_reason or "")
        assert "values for a batch of" in (job.failed_reason or "")


# -- failures --------------------------------------------------------------------------------------------
async def test_an_exception_fails_every_job_of_the_batch_with_its_retries(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 6, attempts=2)
    once = await queue.add("once", {"i": 99})  # one attempt only: fails for good

    async def process(job: Any) -> str:
        if any(b.attempts_made == 0 for b in job.get_batch()):
            raise RuntimeError("batch broke")
        return "second time lucky"

    worker = batch_worker(queue.name, conn, process, batch={"size": 10})
    events = EventRecorder(worker, "failed")
    async with running(worker):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "the retried jobs completed")
        await wait_until(lambda: all_in(queue, [str(once.id)], "failed"), 60, "the one-attempt job failed")
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and job.attempts_made == 2 and job.returnvalue == "second time lucky"
    failed = await queue.get_job(str(once.id))
    assert failed is not None and failed.failed_reason == "batch broke" and failed.attempts_made == 1
    assert len(events.of("failed")) >= 7  # each job's first attempt failed


async def test_set_as_failed_fails_one_job_and_the_others_complete(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 8)

    async def process(job: Any) -> str:
        for b in job.get_batch():
            if b.data["i"] % 3 == 0:
                b.set_as_failed(ValueError(f"bad item {b.data['i']}"))
        return "ok"

    async with running(batch_worker(queue.name, conn, process, batch={"size": 8})):
        await wait_until(lambda: all_in(queue, ids, "completed", "failed"), 60, "every job finished")
    for i, job_id in enumerate(ids):
        job = await queue.get_job(job_id)
        assert job is not None
        if i % 3 == 0:
            assert await job.get_state() == "failed" and job.failed_reason == f"bad item {i}"
        else:
            assert await job.get_state() == "completed" and job.returnvalue == "ok"


async def test_set_as_failed_needs_an_exception(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 1)
    refused: list[str] = []

    async def process(job: Any) -> None:
        try:
            job.get_batch()[0].set_as_failed("not an exception")
        except InvalidArgument as err:
            refused.append(str(err))

    async with running(batch_worker(queue.name, conn, process, batch={"size": 2})):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "the job completed")
    assert refused and "'not an exception'" in refused[0] and "needs an exception" in refused[0]


# -- waiting for min_size ----------------------------------------------------------------------------
async def test_min_size_waits_for_enough_jobs(queue: Queue, conn: dict[str, Any]) -> None:
    sizes: list[int] = []

    async def process(job: Any) -> None:
        sizes.append(len(job.get_batch()))

    async with running(batch_worker(queue.name, conn, process, batch={"size": 10, "min_size": 5})):
        first = await add_jobs(queue, 3)
        await wait_until(lambda: all_in(queue, first, "active"), 30, "the 3 jobs claimed")
        await asyncio.sleep(1.0)
        assert sizes == [] and await all_in(queue, first, "active")  # 3 < min_size: held, not run
        more = await add_jobs(queue, 2)
        await wait_until(lambda: all_in(queue, first + more, "completed"), 60, "the 5 jobs completed")
    assert sizes == [5]


async def test_timeout_caps_the_wait_for_min_size(queue: Queue, conn: dict[str, Any]) -> None:
    started: list[float] = []

    async def process(job: Any) -> None:
        started.append(time.monotonic())

    async with running(batch_worker(queue.name, conn, process, batch={"size": 10, "min_size": 5, "timeout": 1500})):
        t0 = time.monotonic()
        ids = await add_jobs(queue, 2)
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "the 2 jobs completed after the timeout")
    assert len(started) == 1
    assert started[0] - t0 >= 1.4  # not before the timeout (the upper bound is the machine's load)


# -- max_bytes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["batch", "keyword"])
async def test_max_bytes_caps_a_batch_by_the_size_of_its_jobs_data(queue: Queue, conn: dict[str, Any],
                                                                    where: str) -> None:
    jobs = await queue.add_bulk([{"name": "n", "data": {"i": i, "pad": "x" * 90}} for i in range(9)])
    ids = [str(job.id) for job in jobs]
    batches: list[list[int]] = []

    async def process(job: Any) -> None:
        batches.append([b.data["i"] for b in job.get_batch()])

    options: dict[str, Any] = {"batch": {"size": 10, "max_bytes": 250}} if where == "batch" else {
        "batch": {"size": 10}, "max_bytes": 250}
    async with running(batch_worker(queue.name, conn, process, **options)):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    # each job's data is ~110 bytes of JSON: two fit in 250, three do not
    assert sorted(i for batch in batches for i in batch) == list(range(9))
    assert all(1 <= len(batch) <= 2 for batch in batches) and max(len(b) for b in batches) == 2
    assert all(batch == sorted(batch) for batch in batches)  # jobs kept over a cut run next, in order


async def test_a_job_larger_than_max_bytes_runs_alone(queue: Queue, conn: dict[str, Any]) -> None:
    big = await queue.add("big", {"pad": "y" * 500})
    sizes: list[int] = []

    async def process(job: Any) -> None:
        sizes.append(len(job.get_batch()))

    async with running(batch_worker(queue.name, conn, process, batch={"size": 5, "max_bytes": 100})):
        await wait_until(lambda: all_in(queue, [str(big.id)], "completed"), 60, "the big job completed")
    assert sizes == [1]


# -- concurrency, locks, stalls ---------------------------------------------------------------------------
async def test_concurrency_is_the_number_of_batches_in_flight(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 30)
    in_flight = 0
    most = 0
    gate = asyncio.Event()

    async def process(job: Any) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        if most >= 2:
            gate.set()
        await asyncio.wait_for(gate.wait(), 30)
        in_flight -= 1

    async with running(batch_worker(queue.name, conn, process, batch={"size": 5}, concurrency=2)):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    assert most == 2


async def test_a_long_batch_keeps_its_locks(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 4)

    async def process(job: Any) -> None:
        await asyncio.sleep(3.0)  # six lock durations

    worker = batch_worker(queue.name, conn, process, batch={"size": 4}, lock_duration=500, stalled_interval=300)
    events = EventRecorder(worker, "stalled", "lockRenewalFailed", "locksRenewed")
    async with running(worker):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    assert events.of("stalled") == [] and events.of("lockRenewalFailed") == []
    assert events.of("locksRenewed")
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and job.attempts_started == 1 and job.stalled_counter == 0


async def test_jobs_of_a_killed_batch_worker_are_recovered_by_the_stalled_check(queue: Queue,
                                                                                 conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 5)
    taken = asyncio.Event()

    async def hang(job: Any) -> None:
        taken.set()
        await asyncio.sleep(3600)

    killed = batch_worker(queue.name, conn, hang, batch={"size": 5}, lock_duration=1000, skip_stalled_check=True)
    async with running(killed, force_close=True):  # force: the batch is abandoned, its locks not renewed
        await asyncio.wait_for(taken.wait(), 30)
    assert await all_in(queue, ids, "active")

    async def process(job: Any) -> str:
        return "recovered"

    rescuer = batch_worker(queue.name, conn, process, batch={"size": 5}, stalled_interval=500)
    events = EventRecorder(rescuer, "stalled")
    async with running(rescuer):
        await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job recovered and completed")
    assert sorted(args[0] for args in events.of("stalled")) == sorted(ids)
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and job.returnvalue == "recovered" and job.attempts_started == 2


async def test_close_is_prompt_even_when_called_as_a_slot_claims(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 6)
    closing: list[asyncio.Future[Any]] = []
    done = 0

    async def process(job: Any) -> None:
        return None

    worker = batch_worker(queue.name, conn, process, batch={"size": 2}, concurrency=3, shutdown_timeout=120)

    def on_completed(*_: Any) -> None:  # as the benchmark does: close on the last completion, while
        nonlocal done                    # the slot that finished it goes on to claim its next batch
        done += 1
        if done == len(ids):
            closing.append(asyncio.ensure_future(worker.close()))

    worker.on("completed", on_completed)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    await wait_until(lambda: closing, 60, "every job completed")
    started = time.monotonic()
    await asyncio.wait_for(asyncio.shield(closing[0]), 110)
    took = time.monotonic() - started
    await asyncio.wait_for(task, 15)
    # every slot saw close(): none parked after it woke the parked ones (far below shutdown_timeout)
    assert took < 30, f"close() took {took:.1f} s"
    assert await all_in(queue, ids, "completed")


# -- the backend contract: claims and finishes of a batch in one call ------------------------------------
async def test_move_to_active_many_and_finish_many(queue: Queue, conn: dict[str, Any]) -> None:
    from bullmq_compat._backends.base import FinishJob

    ids = await add_jobs(queue, 3)
    worker = batch_worker(queue.name, conn, None, batch={"size": 5})
    try:
        channel = await worker.worker_channel()
        lanes = getattr(channel, "lanes", None)  # PostgreSQL: count the transactions of several calls
        before = lanes.batches if lanes is not None else 0
        now = int(time.time() * 1000)
        replies = await channel.move_to_active_many(["t1", "t2", "t3", "t4", "t5"], now)
        assert [reply[1] for reply in replies] == [*ids, None]  # stops at the first claim that found none
        if lanes is not None:
            assert lanes.batches == before + 1  # the five claims: one transaction
        items = [FinishJob(ids[0], {}, "completed", '"a"', "t1"), FinishJob(ids[1], {}, "completed", '"b"', "wrong"),
                 FinishJob(ids[2], {}, "failed", "nope", "t3")]
        results = await channel.finish_many(items, now)
        assert results[0] is None and results[2] is None
        assert results[1] is not None  # a lock held with another token: only that finish is refused
        assert await states(queue, ids) == ["completed", "active", "failed"]
        assert (await queue.get_job(ids[0])).returnvalue == "a"  # type: ignore[union-attr]
        assert (await queue.get_job(ids[2])).failed_reason == "nope"  # type: ignore[union-attr]
    finally:
        await worker.close()


async def test_cancel_job_of_any_batched_job_aborts_the_batch_signal(queue: Queue, conn: dict[str, Any]) -> None:
    ids = await add_jobs(queue, 3)
    started = asyncio.Event()
    tokens: list[str] = []

    async def process(job: Any, token: str, signal: Any) -> None:
        tokens.append(token)
        started.set()
        await signal.wait()
        raise RuntimeError(f"cancelled: {signal.reason}")

    worker = batch_worker(queue.name, conn, process, batch={"size": 3})
    async with running(worker):
        await asyncio.wait_for(started.wait(), 30)
        await wait_until(lambda: all_in(queue, ids, "active"), 30, "the batch's jobs active")
        assert worker.cancel_job(ids[1], "stop") is True
        await wait_until(lambda: all_in(queue, ids, "failed"), 60, "every job of the batch failed")
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and job.failed_reason == "cancelled: stop"
    first = await queue.get_job(ids[0])
    assert tokens and first is not None and tokens[0].startswith(worker.id)


# -- options ----------------------------------------------------------------------------------------------
def test_batch_options_accept_python_and_node_names() -> None:
    assert batch_options({"size": 50, "min_size": 10, "timeout": 1000}) == BatchOptions(50, 10, 1000)
    assert batch_options({"size": 5, "minSize": 2, "maxBytes": 10, "groupAffinity": True}) == BatchOptions(
        5, 2, 0, 10, True)
    assert batch_options({"size": 5}, max_bytes=64) == BatchOptions(5, max_bytes=64)
    assert batch_options({"size": 5}, group_affinity=True) == BatchOptions(5, group_affinity=True)
    assert batch_options(None) is None
    worker = Worker("q", lambda job: None, connection="redis://127.0.0.1:1/0", batch={"size": 4},
                    group_affinity=True)
    assert worker.batch == BatchOptions(4, group_affinity=True)


@pytest.mark.parametrize("batch, affinity, words", [
    (None, True, "needs batch="),
    ({"size": 5, "group_affinity": False}, True, "differ"),
    ({"size": 5}, "yes", "group_affinity='yes' must be True or False"),
])
def test_the_group_affinity_keyword_is_checked_as_the_batch_key(batch: Any, affinity: Any, words: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Worker("q", lambda job: None, connection="redis://127.0.0.1:1/0", batch=batch, group_affinity=affinity)
    assert words in str(caught.value)


@pytest.mark.parametrize("batch, max_bytes, words", [
    (10, None, "must be a mapping"),
    ({}, None, "needs a size"),
    ({"size": 0}, None, "size=0 must be an int >= 1"),
    ({"size": 2.5}, None, "size=2.5 must be an int"),
    ({"size": True}, None, "size=True must be an int"),
    ({"size": 5, "min_size": 6}, None, "min_size=6 must be an int from 1 to 5"),
    ({"size": 5, "min_size": 0}, None, "min_size=0 must be an int from 1 to 5"),
    ({"size": 5, "timeout": -1}, None, "timeout=-1 must be an int >= 0"),
    ({"size": 5, "max_bytes": 0}, None, "max_bytes=0 must be an int >= 1"),
    ({"size": 5, "group_affinity": "yes"}, None, "group_affinity='yes' must be True or False"),
    ({"size": 5, "sise": 3}, None, "unknown key 'sise'"),
    ({"size": 5, "min_size": 2, "minSize": 3}, None, "gives min_size twice"),
    ({"size": 5, "max_bytes": 10}, 20, "differ"),
    (None, 100, "needs batch="),
])
def test_bad_batch_options_are_refused_naming_the_value(batch: Any, max_bytes: Any, words: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Worker("q", lambda job: None, connection="redis://127.0.0.1:1/0", batch=batch, max_bytes=max_bytes)
    assert words in str(caught.value)


def test_sandboxed_processors_refuse_batches() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Worker("q", "tests.sandbox_processors:job_calls", connection="redis://127.0.0.1:1/0", use_processes=True,
               batch={"size": 5})
    assert "batch= is not supported with use_processes=True" in str(caught.value)


# -- groups (Redis) -------------------------------------------------------------------------------------
async def add_group_jobs(queue: Queue, groups: list[str], per_group: int) -> list[str]:
    ids = []
    for step in range(per_group):  # interleaved: A0 B0 A1 B1 ...
        for gid in groups:
            job = await queue.add("g", {"g": gid, "s": step}, group=gid)
            ids.append(str(job.id))
    return ids


async def test_without_affinity_a_batch_holds_one_job_per_group(redis_url: str, queue_name: str) -> None:
    conn = {"connection": redis_url}
    queue = Queue(queue_name, **conn)
    try:
        ids = await add_group_jobs(queue, ["A", "B", "C"], 4)
        batches: list[list[tuple[str, int]]] = []

        async def process(job: Any) -> None:
            batches.append([(b.data["g"], b.data["s"]) for b in job.get_batch()])

        async with running(batch_worker(queue.name, conn, process, batch={"size": 10})):
            await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
    finally:
        await queue.close()
    for batch in batches:  # only each group's released job is visible: one at a time per group
        groups = [g for g, _ in batch]
        assert len(groups) == len(set(groups))
    for gid in "ABC":
        assert [s for batch in batches for g, s in batch if g == gid] == [0, 1, 2, 3]


async def test_group_affinity_fills_a_batch_from_one_group_in_order_and_others_wait(
        redis_url: str, queue_name: str) -> None:
    conn = {"connection": redis_url}
    queue = Queue(queue_name, **conn)
    busy: dict[str, int] = {}
    overlaps: list[str] = []
    batches: list[list[tuple[str, int]]] = []
    singles: list[tuple[str, int]] = []

    async def batch_process(job: Any) -> None:
        batch = [(b.data["g"], b.data["s"]) for b in job.get_batch()]
        batches.append(batch)
        for gid in {g for g, _ in batch}:
            if busy.get(gid):
                overlaps.append(f"batch {batch} while {gid} busy")
        for gid, _ in batch:
            busy[gid] = busy.get(gid, 0) + 1
        await asyncio.sleep(0.05)
        for gid, _ in batch:
            busy[gid] -= 1

    async def single_process(job: Any) -> None:  # a plain worker on the same queue: "everyone else"
        gid = job.data["g"]
        singles.append((gid, job.data["s"]))
        if busy.get(gid):
            overlaps.append(f"single {gid}:{job.data['s']} while {gid} busy")
        busy[gid] = busy.get(gid, 0) + 1
        await asyncio.sleep(0.01)
        busy[gid] -= 1

    try:
        ids = await add_group_jobs(queue, ["A", "B", "C"], 6)
        batcher = batch_worker(queue.name, conn, batch_process, batch={"size": 4, "group_affinity": True})
        plain = batch_worker(queue.name, conn, single_process, concurrency=4)
        async with running(batcher), running(plain):
            await wait_until(lambda: all_in(queue, ids, "completed"), 60, "every job completed")
        groups = await queue.get_groups()
    finally:
        await queue.close()
    assert overlaps == []  # never two jobs of a group at once, batch or not
    for batch in batches:
        assert len({g for g, _ in batch}) == 1  # one group per batch
        steps = [s for _, s in batch]
        assert steps == sorted(steps) and steps == list(range(steps[0], steps[0] + len(steps)))
    for gid in "ABC":  # each group's jobs ran in add order, whoever ran them
        assert sorted(s for g, s in singles + [x for b in batches for x in b] if g == gid) == list(range(6))
    assert max(len(b) for b in batches) > 1  # the batch worker took held jobs of a group
    assert all(g["waiting"] == 0 and g["running"] == 0 for g in groups)


async def test_batches_through_redis_py_without_the_fast_channel(redis_url: str, queue_name: str) -> None:
    conn = {"connection": redis_url}
    queue = Queue(queue_name, **conn)
    try:
        ids = await add_jobs(queue, 7)

        async def process(job: Any) -> list[int]:
            batch = job.get_batch()
            for b in batch:
                if b.data["i"] == 2:
                    b.set_as_failed(RuntimeError("two"))
            return [b.data["i"] * 10 for b in batch]

        async with running(batch_worker(queue.name, conn, process, batch={"size": 3}, fast_path=False)):
            await wait_until(lambda: all_in(queue, ids, "completed", "failed"), 60, "every job finished")
        for i, job_id in enumerate(ids):
            job = await queue.get_job(job_id)
            assert job is not None
            if i == 2:
                assert job.failed_reason == "two"
            else:
                assert job.returnvalue == i * 10
    finally:
        await queue.close()
