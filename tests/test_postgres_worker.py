"""PostgresWorkerChannel and PostgresEventsReader against a real PostgreSQL, each test in a schema
of its own: claiming and finishing as Node's Postgres worker does, retries, locks, stalled jobs,
the LISTEN wait (also across a killed session), the events cursor, and jobs shared with a Node worker.

Timing assertions are upper bounds with a wide margin (the machine may be busy); waits poll for a
condition instead of sleeping a fixed time.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

import psycopg
import pytest

from bullmq_compat._backends.base import NewJob, WorkerSettings
from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._backends.postgres.events import PostgresEventsReader
from bullmq_compat._backends.postgres.worker import PostgresWorkerChannel
from bullmq_compat._errors import JobLockMismatch
from bullmq_compat._wire.options import merge_defaults, normalize_job_options
from tests.helpers import eventually


def now() -> int:
    return int(time.time() * 1000)


def new(name: str = "n", data: Any = None, job_id: str = "", **opts: Any) -> NewJob:
    return NewJob(name, {} if data is None else data, merge_defaults(None, normalize_job_options(opts)), now(),
                  job_id)


# unique per run: NOTIFY payloads and application_name are the queue name, seen across schemas
# and processes (other test runs on the same server)
Q = f"q{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def backend(postgres_url: str, pg_migrated: str) -> AsyncIterator[PostgresBackend]:
    b = PostgresBackend(PostgresConnection(postgres_url, schema=pg_migrated), Q)
    await b.connect()
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def channel(backend: PostgresBackend) -> AsyncIterator[PostgresWorkerChannel]:
    ch = await backend.open_worker_channel(WorkerSettings(name="w1"), backend.client_name(":w:w1"))
    assert isinstance(ch, PostgresWorkerChannel)
    try:
        yield ch
    finally:
        await ch.close()


async def open_channel(backend: PostgresBackend, **settings: Any) -> PostgresWorkerChannel:
    ch = await backend.open_worker_channel(WorkerSettings(**settings), backend.client_name())
    assert isinstance(ch, PostgresWorkerChannel)
    return ch


async def add(backend: PostgresBackend, *jobs: NewJob) -> list[str]:
    ids = await backend.add_jobs(list(jobs))
    assert all(isinstance(i, str) for i in ids), ids
    return [str(i) for i in ids]


async def drain_ids(channel: PostgresWorkerChannel, token: str = "tok") -> list[str]:
    """Claim and complete (with fetch-next) until nothing is left; the ids in claim order."""
    order: list[str] = []
    raw, job_id, _, _ = await channel.move_to_active(token, now())
    while job_id is not None:
        assert raw is not None
        order.append(job_id)
        nxt = await channel.move_to_finished(job_id, {}, "completed", json.dumps(job_id), token, now(), True)
        assert nxt is not None
        raw, job_id, _, _ = nxt
    return order


async def column(backend: PostgresBackend, name: str, job_id: str) -> Any:
    rows = (await backend.connection.execute(f"SELECT {name} AS v FROM job WHERE queue = $1 AND id = $2",
                                             [backend.name, job_id])).rows
    return rows[0]["v"] if rows else None


# -- claiming and finishing ------------------------------------------------------------------------
async def test_claims_are_fifo_and_each_finish_hands_over_the_next_job(backend: PostgresBackend,
                                                                     channel: PostgresWorkerChannel) -> None:
    ids = await add(backend, *(new(data={"i": i}) for i in range(5)))
    assert await drain_ids(channel) == ids
    for job_id in ids:
        assert await backend.get_state(job_id) == "completed"
        fields = await backend.get_job(job_id)
        assert fields is not None and fields["returnvalue"] == json.dumps(job_id)
        assert fields["pb"] == "w1" and fields["atm"] == "1"


async def test_priority_comes_before_fifo_and_lifo_jumps_the_line(backend: PostgresBackend,
                                                                 channel: PostgresWorkerChannel) -> None:
    first, low, high, lifo = await add(backend, new(job_id="first"), new(job_id="low", priority=5),
                                       new(job_id="high", priority=1), new(job_id="lifo", lifo=True))
    assert await drain_ids(channel) == [lifo, first, high, low]


async def test_a_claim_promotes_a_due_delayed_job_and_reports_the_next_due_time(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    [soon] = await add(backend, new(job_id="soon", delay=300))
    [later] = await add(backend, new(job_id="later", delay=60_000))
    raw, job_id, limit_ms, due_ms = await channel.move_to_active("tok", now())
    assert (raw, job_id, limit_ms) == (None, None, 0)
    assert abs(due_ms - (await column(backend, "process_at_ms", soon))) == 0
    await asyncio.sleep(0.4)
    raw, job_id, _, _ = await channel.move_to_active("tok", now())
    assert job_id == soon and raw is not None
    nxt = await channel.move_to_finished(soon, {}, "completed", "null", "tok", now(), True)
    assert nxt is not None and nxt[1] is None and nxt[3] == await column(backend, "process_at_ms", later)


async def test_a_rate_limited_queue_reports_the_limiter_ttl(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, limiter={"max": 1, "duration": 60_000})
    try:
        await add(backend, new(), new())
        raw, job_id, _, _ = await ch.move_to_active("tok", now())
        assert job_id is not None
        nxt = await ch.move_to_finished(job_id, {}, "completed", "1", "tok", now(), True)
        assert nxt is not None and nxt[1] is None and 0 < nxt[2] <= 60_000
    finally:
        await ch.close()


async def test_a_failed_attempt_is_retried_with_backoff_then_at_once_then_failed_for_good(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    [job_id] = await add(backend, new(attempts=3))
    fields = {"failedReason": "first", "stacktrace": '["trace 1"]'}
    raw, claimed, _, _ = await channel.move_to_active("tok", now())
    assert claimed == job_id
    assert await channel.move_to_delayed(job_id, now(), 200, "tok", fields_to_update=fields) is None
    assert await backend.get_state(job_id) == "delayed"
    assert await column(backend, "failed_reason", job_id) == "first"

    await asyncio.sleep(0.3)
    raw, claimed, _, _ = await channel.move_to_active("tok", now())
    assert claimed == job_id and raw is not None and raw["atm"] == "1"
    await channel.retry_job(job_id, False, "tok", now(), {"failedReason": "second", "stacktrace": '["t1","t2"]'})
    assert await backend.get_state(job_id) == "waiting"

    raw, claimed, _, _ = await channel.move_to_active("tok", now())
    assert claimed == job_id and raw is not None and raw["atm"] == "2"
    nxt = await channel.move_to_finished(job_id, {}, "failed", "third", "tok", now(), True,
                                         {"failedReason": "third", "stacktrace": '["t1","t2","t3"]'})
    assert nxt is not None and nxt[1] is None
    stored = await backend.get_job(job_id)
    assert stored is not None and await backend.get_state(job_id) == "failed"
    assert stored["failedReason"] == "third" and json.loads(stored["stacktrace"]) == ["t1", "t2", "t3"]
    assert stored["atm"] == "3"


async def test_remove_on_fail_of_the_worker_applies_unless_the_job_says_otherwise(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, remove_on_fail=True)
    try:
        gone, kept = await add(backend, new(job_id="gone"), new(job_id="kept"))
        for expected, opts in ((gone, {}), (kept, {"remove_on_fail": False})):
            _, job_id, _, _ = await ch.move_to_active("tok", now())
            assert job_id == expected
            await ch.move_to_finished(job_id, opts, "failed", "boom", "tok", now(), False)
        assert await backend.get_state(gone) == "unknown"
        assert await backend.get_state(kept) == "failed"
    finally:
        await ch.close()


async def test_remove_on_complete_count_keeps_only_the_newest(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, remove_on_complete={"count": 2})
    try:
        ids = await add(backend, *(new() for _ in range(4)))
        assert await drain_ids(ch) == ids
        assert [await backend.get_state(i) for i in ids] == ["unknown", "unknown", "completed", "completed"]
    finally:
        await ch.close()


async def test_finishing_with_a_wrong_token_is_refused_and_changes_nothing(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    [job_id] = await add(backend, new())
    await channel.move_to_active("tok", now())
    with pytest.raises(JobLockMismatch):
        await channel.move_to_finished(job_id, {}, "completed", "1", "other", now(), True)
    assert await backend.get_state(job_id) == "active"


async def test_finishes_queued_behind_a_busy_session_share_one_commit(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, extra={"pool_size": 1})
    try:
        ids = await add(backend, *(new() for _ in range(3)))
        for i, job_id in enumerate(ids):
            assert (await ch.move_to_active(f"t{i}", now()))[1] == job_id
        replies = await asyncio.gather(*(ch.move_to_finished(job_id, {}, "completed", json.dumps(i), f"t{i}", now(),
                                                             True) for i, job_id in enumerate(ids)))
        assert ch.lanes.batches == 1  # the first took the session; the two behind it went together
        assert all(r is not None and r[1] is None for r in replies)
        for i, job_id in enumerate(ids):
            stored = await backend.get_job(job_id)
            assert stored is not None and stored["returnvalue"] == json.dumps(i)
    finally:
        await ch.close()


async def test_a_refused_call_in_a_batch_leaves_the_others_done_and_gets_its_own_error(
        backend: PostgresBackend) -> None:
    ch = await open_channel(backend, extra={"pool_size": 1})
    try:
        first, good, bad = await add(backend, new(), new(), new())
        for token in ("t0", "t1", "t2"):
            await ch.move_to_active(token, now())
        outcomes = await asyncio.gather(
            ch.move_to_finished(first, {}, "completed", "0", "t0", now(), False),
            ch.move_to_finished(good, {}, "completed", "1", "t1", now(), False),
            ch.move_to_finished(bad, {}, "completed", "2", "not-its-token", now(), False),
            return_exceptions=True)
        assert outcomes[0] is None and outcomes[1] is None and isinstance(outcomes[2], JobLockMismatch)
        assert ch.lanes.batches == 0  # the batch failed: nothing of it was committed ...
        assert [await backend.get_state(i) for i in (first, good, bad)] == ["completed", "completed", "active"]
        assert await column(backend, "return_value", good) == 1  # ... and the good one was run again alone
    finally:
        await ch.close()


async def test_metrics_are_collected_when_the_worker_asks(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, max_metrics_size=10)
    try:
        await add(backend, new(), new())
        assert len(await drain_ids(ch)) == 2
        meta, _points, _count = await backend.get_metrics("completed", 0, -1)
        assert meta[0] == "2"
    finally:
        await ch.close()


async def test_a_job_can_go_back_to_waiting_or_wait_for_children(backend: PostgresBackend,
                                                                channel: PostgresWorkerChannel) -> None:
    [job_id] = await add(backend, new())
    await channel.move_to_active("tok", now())
    assert await channel.move_job_from_active_to_wait(job_id, "tok") == 0
    assert await backend.get_state(job_id) == "waiting"
    await channel.move_to_active("tok", now())
    assert await channel.move_to_waiting_children(job_id, "tok", now()) is False  # no children: go on
    assert await backend.get_state(job_id) == "active"


# -- locks and stalled jobs --------------------------------------------------------------------------
async def test_extend_locks_renews_held_locks_and_reports_the_others(backend: PostgresBackend,
                                                                   channel: PostgresWorkerChannel) -> None:
    a, b = await add(backend, new(), new())
    await channel.move_to_active("ta", now())
    await channel.move_to_active("tb", now())
    before = await column(backend, "locked_until_ms", a)
    await asyncio.sleep(0.05)
    assert await channel.extend_locks([a, b, "nope"], ["ta", "wrong", "tx"], 90_000) == [b, "nope"]
    assert await column(backend, "locked_until_ms", a) > before
    assert await channel.extend_lock(a, "ta", 90_000) is True
    assert await channel.extend_lock(b, "wrong", 90_000) is False


async def test_a_job_whose_lock_expired_goes_back_to_waiting(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, lock_duration=100, stalled_interval=1, max_stalled_count=1)
    try:
        [job_id] = await add(backend, new())
        await ch.move_to_active("tok", now())
        assert await ch.move_stalled_jobs_to_wait(now()) == []  # first pass only marks
        await asyncio.sleep(0.2)
        assert await ch.move_stalled_jobs_to_wait(now()) == [job_id]
        assert await backend.get_state(job_id) == "waiting"
        raw, claimed, _, _ = await ch.move_to_active("tok2", now())
        assert claimed == job_id and raw is not None and raw["stc"] == "1" and "defa" not in raw
    finally:
        await ch.close()


async def test_a_job_stalled_too_often_comes_back_with_a_deferred_failure(backend: PostgresBackend) -> None:
    ch = await open_channel(backend, lock_duration=100, stalled_interval=1, max_stalled_count=0)
    try:
        [job_id] = await add(backend, new())
        await ch.move_to_active("tok", now())
        await ch.move_stalled_jobs_to_wait(now())
        await asyncio.sleep(0.2)
        assert await ch.move_stalled_jobs_to_wait(now()) == [job_id]
        raw, claimed, _, _ = await ch.move_to_active("tok2", now())
        assert claimed == job_id and raw is not None
        assert raw["defa"] == "job stalled more than allowable limit"  # the worker fails it, as Node
    finally:
        await ch.close()


# -- waiting for work ----------------------------------------------------------------------------------
async def test_an_idle_wait_wakes_soon_after_a_job_is_added_to_our_queue_only(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    other = PostgresBackend(backend.connection, "other", owns_connection=False)
    assert await channel.wait_for_job(0.2) is None  # subscribes; nothing waits

    async def add_later(target: PostgresBackend, delay: float) -> float:
        await asyncio.sleep(delay)
        await add(target, new())
        return time.monotonic()

    started = time.monotonic()
    foreign = asyncio.ensure_future(add_later(other, 0.2))
    assert await channel.wait_for_job(1.5) is None  # a job of another queue does not wake us
    await foreign
    assert time.monotonic() - started >= 1.4

    ours = asyncio.ensure_future(add_later(backend, 0.3))
    woken = await channel.wait_for_job(30)
    added_at = await ours
    assert woken == (Q, 0.0)
    assert time.monotonic() - added_at < 15  # soon: not after the 30 s wait
    assert not channel.listener.listening  # UNLISTENed between waits: nobody reads it while busy


async def test_a_wait_returns_at_once_when_a_job_already_waits(backend: PostgresBackend,
                                                             channel: PostgresWorkerChannel) -> None:
    await add(backend, new())
    started = time.monotonic()
    assert await channel.wait_for_job(30) == (Q, 0.0)
    assert time.monotonic() - started < 15  # at once: not after the 30 s wait


async def test_a_wait_ends_when_a_delayed_job_comes_due(backend: PostgresBackend,
                                                      channel: PostgresWorkerChannel) -> None:
    [job_id] = await add(backend, new(delay=500))
    due = await column(backend, "process_at_ms", job_id)
    woken = await channel.wait_for_job(30)
    assert woken is not None and woken[1] == due
    assert now() >= due and now() - due < 15_000  # by its due time: not after the 30 s wait
    _, claimed, _, _ = await channel.move_to_active("tok", now())
    assert claimed == job_id


async def test_a_wait_polls_instead_of_spinning_when_waiting_jobs_cannot_be_claimed(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    await backend.set_meta({"concurrency": 1})  # the queue's global concurrency: one active job
    first, second = await add(backend, new(), new())
    assert (await channel.move_to_active("tok", now()))[1] == first
    assert (await channel.move_to_active("tok", now()))[1] is None  # maxed
    assert await channel.wait_for_job(30) == (Q, 0.0)  # the probe sees a waiting job: look once
    assert (await channel.move_to_active("tok", now()))[1] is None  # still maxed
    started = time.monotonic()
    assert await channel.wait_for_job(30) is None  # the probe alone no longer wakes at once
    assert 0.5 < time.monotonic() - started < 15
    await channel.move_to_finished(first, {}, "completed", "1", "tok", now(), False)
    assert (await channel.move_to_active("tok", now()))[1] == second


async def test_wake_at_ends_a_blocked_wait_by_that_time(channel: PostgresWorkerChannel) -> None:
    assert await channel.wait_for_job(0.1) is None
    started = time.monotonic()
    waiting = asyncio.ensure_future(channel.wait_for_job(30))
    await asyncio.sleep(0.2)
    due = now() + 300
    await channel.wake_at(due)
    woken = await waiting
    assert woken is not None and woken[1] == due and now() >= due
    assert time.monotonic() - started < 10


async def test_a_killed_listen_session_is_rebuilt_and_a_job_added_meanwhile_is_seen(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    assert await channel.wait_for_job(0.1) is None
    waiting = asyncio.ensure_future(channel.wait_for_job(60))
    await asyncio.sleep(0.2)
    killed = (await backend.connection.execute(
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE application_name = $1",
        [backend.client_name(":w:w1")])).rows[0]["n"]
    assert killed == 1
    await add(backend, new())
    started = time.monotonic()
    try:
        woken = await asyncio.wait_for(waiting, 30)
    except Exception as err:  # the worker would retry after a transient error: so do we, once
        assert backend.is_transient(err), err
        woken = await channel.wait_for_job(30)
    assert woken == (Q, 0.0)
    assert time.monotonic() - started < 20  # soon: not after the 60 s wait
    assert channel.listener.opened == 2
    assert await eventually(lambda: names(backend, backend.client_name(":w:w1")))


async def test_lost_query_sessions_are_replaced_and_errors_meanwhile_are_transient(
        backend: PostgresBackend, channel: PostgresWorkerChannel) -> None:
    await add(backend, new(), new())
    _, first, _, _ = await channel.move_to_active("tok", now())
    # the channel's own sessions only: other tests (other xdist workers) share the database
    ours = [lane.conn.info.backend_pid for lane in channel.lanes._idle]
    pids = [r["pid"] for r in (await backend.connection.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND application_name = '' AND query LIKE '%move_to_active%' AND pid = ANY($1)", [ours])).rows]
    assert pids
    async with await psycopg.AsyncConnection.connect(backend.connection.where, autocommit=True) as admin:
        for pid in pids:
            await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    errors: list[BaseException] = []

    async def claim() -> Any:
        try:
            return (await channel.move_to_active("tok2", now()))[1]
        except Exception as err:  # the call that found its session gone: the worker retries it
            errors.append(err)
            return None

    second = await eventually(claim, timeout=30)
    assert second != first
    assert all(backend.is_transient(err) for err in errors), errors
    assert len(errors) <= 1


async def test_the_worker_sessions_can_opt_out_of_waiting_for_the_disk(backend: PostgresBackend) -> None:
    from bullmq_compat._backends.postgres.lanes import Lanes
    from bullmq_compat._backends.postgres.sql import execute
    from bullmq_compat._errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        await open_channel(backend, extra={"synchronous_commit": "sometimes"})
    for wanted, seen in ((None, "on"), ("off", "off")):
        lanes = Lanes(backend.connection, 1, synchronous_commit=wanted)
        lane = await lanes._open_lane()
        lane.detach()  # hand the session back to psycopg to look at it
        assert (await execute(lane.conn, "SHOW synchronous_commit")).rows[0]["synchronous_commit"] == seen
        await backend.connection.close_listen_session(lane.conn)
    ch = await open_channel(backend, extra={"synchronous_commit": "off"})
    try:
        await add(backend, new(), new())
        assert len(await drain_ids(ch)) == 2
    finally:
        await ch.close()


async def names(backend: PostgresBackend, name: str) -> list[str]:
    rows = (await backend.connection.execute(
        "SELECT application_name FROM pg_stat_activity WHERE application_name = $1", [name])).rows
    return [str(r["application_name"]) for r in rows]


async def test_the_listen_sessions_are_named_as_node_names_them_from_the_start(backend: PostgresBackend,
                                                               channel: PostgresWorkerChannel) -> None:
    assert backend.client_name(":w:w1") == f"{Q}:w:w1" and backend.client_name() == Q
    assert backend.client_name(":qe") == f"{Q}:qe"
    reader = await backend.open_events_reader(backend.client_name(":qe"))
    try:
        await reader.read("0", 10)
        assert await names(backend, f"{Q}:w:w1") == [f"{Q}:w:w1"]
        assert await names(backend, f"{Q}:qe") == [f"{Q}:qe"]
        assert f"{Q}:w:w1" in {c["name"] for c in await backend.get_client_list()}  # Node's getWorkers
        assert {c["name"] for c in await backend.get_queue_events_clients()} == {f"{Q}:qe"}  # its getQueueEvents
    finally:
        await reader.close()
    await channel.close()
    assert await eventually(lambda: _gone(backend, f"{Q}:w:w1"))


async def _gone(backend: PostgresBackend, name: str) -> bool:
    return not await names(backend, name)


# -- events ---------------------------------------------------------------------------------------------
@pytest.fixture
async def reader(backend: PostgresBackend) -> AsyncIterator[PostgresEventsReader]:
    r = await backend.open_events_reader(backend.client_name(":qe"))
    assert isinstance(r, PostgresEventsReader)
    try:
        yield r
    finally:
        await r.close()


async def test_events_come_in_order_shaped_as_the_redis_stream(backend: PostgresBackend,
                                                             channel: PostgresWorkerChannel,
                                                             reader: PostgresEventsReader) -> None:
    assert await reader.last_id() == "0"
    ok, bad = await add(backend, new(job_id="ok"), new(job_id="bad"))
    await channel.move_to_active("tok", now())
    await backend.update_progress(ok, json.dumps({"pct": 50}))
    nxt = await channel.move_to_finished(ok, {}, "completed", json.dumps({"sum": 3}), "tok", now(), True)
    assert nxt is not None and nxt[1] == bad
    await channel.move_to_finished(bad, {}, "failed", "boom", "tok", now(), False)
    [delayed] = await add(backend, new(job_id="later", delay=5000))

    entries = await reader.read("0", 1000)
    ids = [int(i) for i, _ in entries]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    by_event = [(f["event"], f.get("jobId")) for _, f in entries]
    assert by_event.index(("active", ok)) < by_event.index(("progress", ok)) < by_event.index(("completed", ok))
    assert by_event.index(("completed", ok)) < by_event.index(("failed", bad)) < by_event.index(("delayed", delayed))
    fields = {(f["event"], f.get("jobId")): f for _, f in entries}
    assert json.loads(fields[("completed", ok)]["returnvalue"]) == {"sum": 3}
    assert fields[("completed", ok)]["prev"] == "active"
    assert json.loads(fields[("progress", ok)]["data"]) == {"pct": 50}
    assert fields[("failed", bad)]["failedReason"] == "boom" and fields[("failed", bad)]["prev"] == "active"
    assert int(fields[("delayed", delayed)]["delay"]) > 0
    assert await reader.last_id() == entries[-1][0]


async def test_the_reader_resumes_from_a_cursor_and_reads_past_a_page(backend: PostgresBackend,
                                                                   reader: PostgresEventsReader) -> None:
    await add(backend, *(new() for _ in range(120)))  # 240 events: added and waiting each
    everything = await reader.read("0", 1000)
    assert len(everything) == 240
    middle = everything[149][0]
    assert await reader.read(middle, 1000) == everything[150:]
    assert await reader.read("$", 300) == []


async def test_a_blocked_read_wakes_when_an_event_is_published(backend: PostgresBackend,
                                                             reader: PostgresEventsReader) -> None:
    cursor = await reader.last_id()

    async def publish_later() -> float:
        await asyncio.sleep(0.3)
        await backend.publish_event({"event": "custom", "value": 7}, 100)
        return time.monotonic()

    publishing = asyncio.ensure_future(publish_later())
    entries = await reader.read(cursor, 30_000)
    published_at = await publishing
    assert [(f["event"], f["value"]) for _, f in entries] == [("custom", "7")]
    assert time.monotonic() - published_at < 15  # soon: not after the 30 s wait


async def test_a_killed_reader_session_resumes_from_the_last_id(backend: PostgresBackend,
                                                              reader: PostgresEventsReader) -> None:
    await add(backend, new())
    first = await reader.read("0", 100)
    await backend.connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                     f"WHERE application_name = '{Q}:qe'")
    await add(backend, new())
    cursor = first[-1][0]

    async def read_again() -> list[Any]:
        try:
            return await reader.read(cursor, 100)
        except Exception as err:
            assert backend.is_transient(err), err
            return []

    again = await eventually(read_again, timeout=30)
    assert [f["event"] for _, f in again] == ["added", "waiting"]
    assert int(again[0][0]) > int(cursor)


# -- with Node's worker ------------------------------------------------------------------------------
@pytest.mark.node
async def test_node_processes_jobs_we_added_and_we_process_jobs_node_added(
        backend: PostgresBackend, channel: PostgresWorkerChannel, postgres_url: str, pg_migrated: str) -> None:
    from tests.node import node

    pg = {"postgres": postgres_url, "schema": pg_migrated}
    ours = await add(backend, new(data={"from": "python"}), new(data={"behave": {"return": "42"}}),
                     new(data={"behave": {"fail": "nope"}}))
    outcome = await node("work", **pg, queue=backend.name, count=3, timeoutMs=60000)
    assert sorted(outcome["completed"]) == sorted(ours[:2]) and outcome["failed"] == [ours[2]]
    assert await backend.get_state(ours[0]) == "completed"
    first = await backend.get_job(ours[0])
    assert first is not None and json.loads(first["returnvalue"]) == {"echo": {"from": "python"}}
    second = await backend.get_job(ours[1])
    assert second is not None and json.loads(second["returnvalue"]) == "42"  # a string stays a string
    third = await backend.get_job(ours[2])
    assert third is not None and third["failedReason"] == "nope"

    added = await node("addBulk", **pg, queue=backend.name, jobs=[
        {"name": "from-node", "data": {"i": 1}}, {"name": "from-node", "data": {"i": 2}, "opts": {"attempts": 2}}])
    node_ids = added["ids"]
    raw, job_id, _, _ = await channel.move_to_active("tok", now())
    assert job_id == node_ids[0] and raw is not None and json.loads(raw["data"]) == {"i": 1}
    nxt = await channel.move_to_finished(job_id, {}, "completed", json.dumps("done"), "tok", now(), True)
    assert nxt is not None and nxt[1] == node_ids[1]
    await channel.move_to_finished(node_ids[1], {}, "failed", "gave up", "tok", now(), False,
                                   {"stacktrace": json.dumps(["at python"])})
    seen_done = await node("getJob", **pg, queue=backend.name, id=node_ids[0])
    seen_failed = await node("getJob", **pg, queue=backend.name, id=node_ids[1])
    assert seen_done["returnvalue"] == "done" and seen_done["finishedOn"]
    assert seen_failed["failedReason"] == "gave up" and seen_failed["stacktrace"] == ["at python"]
    counts = await node("getJobCounts", **pg, queue=backend.name)
    assert counts["completed"] == 3 and counts["failed"] == 2


# -- the Worker loop on the channel (until Worker is wired to PostgreSQL, through monkeypatch) -------
async def test_the_worker_loop_processes_retries_and_waits_through_the_channel(
        backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    import bullmq_compat._queue as queue_module
    from bullmq_compat._worker import Worker

    monkeypatch.setattr(queue_module, "open_backend", lambda name, connection, **_: PostgresBackend(
        backend.connection, name, owns_connection=False))
    ids = await add(backend, *(new(data={"i": i}) for i in range(10)), new(job_id="flaky", data={"flaky": 1},
                                                                          attempts=2),
                    new(job_id="broken", data={"broken": 1}))
    finished: dict[str, str] = {}

    async def process(job: Any) -> Any:
        if job.data.get("broken"):
            raise RuntimeError("always")
        if job.data.get("flaky") and job.attempts_made == 0:
            raise RuntimeError("once")
        return job.data

    worker = Worker(Q, process, connection="postgresql://unused", concurrency=4, drain_delay=1, name="loop")
    worker.on("completed", lambda job, *_: finished.__setitem__(str(job.id), "completed"))
    worker.on("failed", lambda job, *_: finished.__setitem__(str(job.id), "failed"))
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await eventually(lambda: _true(len([i for i in ids if finished.get(i)]) == len(ids)
                                       and finished["flaky"] == "completed"))
        assert [await backend.get_state(i) for i in ids] == ["completed"] * 11 + ["failed"]
        flaky = await backend.get_job("flaky")
        assert flaky is not None and flaky["atm"] == "2" and json.loads(flaky["returnvalue"]) == {"flaky": 1}
        assert await names(backend, f"{Q}:w:loop") == [f"{Q}:w:loop"]
        [late] = await add(backend, new(data={"late": 1}))  # the worker is idle now: LISTEN wakes it
        await eventually(lambda: _true(finished.get(late) == "completed"), timeout=10)
    finally:
        await worker.close()
        await running


async def _true(value: bool) -> bool:
    return value
