"""Issue #29 §1, options with ``transaction=``: "options, deduplication, job ids, delays and
priorities behave exactly as without transaction=; a dedup or id conflict raises inside the
caller's transaction so the caller decides" (the rule is in docs/postgres.md, "Transactions").

Upstream's SQL runs unchanged on the caller's connection, so an id or a deduplication key that
already exists gets the plain add's answer (Node's: the existing job's id, no error). What is new
is another transaction's uncommitted work: the add waits for that transaction to end and then
answers as if it had come after it; where the wait cannot end so (the caller's lock_timeout, a
REPEATABLE READ snapshot, a deadlock), the error surfaces inside the caller's transaction. Also
here: FlowProducer.add_bulk and the sync FlowProducer with ``transaction=``, psycopg2 refused,
``transactional=True`` refused with ``use_processes=True``.

Waits are on conditions (``pg_blocking_pids``: the second add is waiting on the first
transaction), never on a sleep.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import psycopg
import pytest
from psycopg import pq

from bullmq_compat import FlowProducer, InvalidArgument, Job, ParentJobCannotBeReplaced, Queue, Worker
from tests.helpers import wait_until
from tests.node import node
from tests.pg_interop_helpers import pg_of
from tests.test_postgres_transactions import orders  # noqa: F401  (a fixture: the business table)


async def noop(job: Job) -> None:  # a processor path for use_processes=True
    return None


@pytest.fixture
async def two(postgres_url: str) -> AsyncIterator[tuple[psycopg.AsyncConnection[Any], psycopg.AsyncConnection[Any]]]:
    """Two application connections (psycopg 3, not autocommit): two transactions at once."""
    a = await psycopg.AsyncConnection.connect(postgres_url)
    b = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def count(postgres_url: str, sql: str, params: list[Any]) -> int:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        row = await (await conn.execute(sql, params)).fetchone()
    return int(row[0]) if row else 0


async def jobs(postgres_url: str, schema: str, queue: str) -> int:
    return await count(postgres_url, f'SELECT count(*) FROM "{schema}".job WHERE queue = %s', [queue])


async def events(postgres_url: str, schema: str, queue: str, event: str) -> int:
    return await count(postgres_url, f'SELECT count(*) FROM "{schema}".event WHERE queue = %s AND event = %s',
                       [queue, event])


async def stored_data(queue: Queue, job_id: str) -> Any:
    job = await queue.get_job(job_id)
    return None if job is None else job.data


async def blocked_by(postgres_url: str, pid: int) -> bool:
    """Whether some session is waiting on a lock held by backend ``pid``'s transaction."""
    return await count(postgres_url, "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                       [pid]) > 0


# -- what already exists: the plain add's answer ----------------------------------------------------
async def test_deduplication_commits_and_rolls_back_with_the_transaction(
        postgres_url: str, pg_migrated: str, orders: str, two: Any, queue_name: str) -> None:
    caller, _ = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    dedup_keys = f'SELECT count(*) FROM "{pg_migrated}".dedup WHERE queue = %s'
    try:
        async with caller.transaction(force_rollback=True):
            rolled = await queue.add("ship", {"n": 1}, deduplication={"id": "order-5"}, transaction=caller)
            again = await queue.add("ship", {"n": 2}, deduplication={"id": "order-5"}, transaction=caller)
            assert again.id == rolled.id  # the transaction sees its own key: deduplicated, as a plain add
        # rolled back: no job, no key; a later add of that deduplication id is not deduplicated
        assert await jobs(postgres_url, pg_migrated, queue_name) == 0
        assert await count(postgres_url, dedup_keys, [queue_name]) == 0
        assert await queue.get_deduplication_job_id("order-5") is None
        later = await queue.add("ship", {"n": 3}, deduplication={"id": "order-5"})
        # (its automatic id may be the rolled-back one's again: the queue's first add created the id
        # sequence, and that rolled back too; no job ever had it)
        assert await stored_data(queue, str(later.id)) == {"n": 3}
        assert await queue.get_deduplication_job_id("order-5") == later.id

        async with caller.transaction():
            await caller.execute(f"INSERT INTO {orders} VALUES (6, 'deduplicated')")
            winner = await queue.add("ship", {"n": 4}, deduplication={"id": "order-6"}, transaction=caller)
        assert await queue.get_deduplication_job_id("order-6") == winner.id
        # once committed, the key deduplicates every add: plain, transactional and Node's alike
        plain = await queue.add("ship", {"n": 5}, deduplication={"id": "order-6"})
        async with caller.transaction():
            in_tx = await queue.add("ship", {"n": 6}, deduplication={"id": "order-6"}, transaction=caller)
            assert caller.info.transaction_status == pq.TransactionStatus.INTRANS  # no error: it goes on
        by_node = await node("add", **pg_of(postgres_url, pg_migrated, migrate=False), queue=queue_name,
                             name="ship", data={"n": 7}, opts={"deduplication": {"id": "order-6"}})
        assert plain.id == in_tx.id == by_node["id"] == winner.id
        assert await stored_data(queue, str(winner.id)) == {"n": 4}
        assert await jobs(postgres_url, pg_migrated, queue_name) == 2  # later, winner
        assert await events(postgres_url, pg_migrated, queue_name, "deduplicated") == 3
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 1
    finally:
        await queue.close()


async def test_a_duplicate_job_id_gets_the_plain_adds_answer_in_a_transaction(
        postgres_url: str, pg_migrated: str, orders: str, two: Any, queue_name: str) -> None:
    caller, _ = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    flows = FlowProducer(connection=postgres_url, schema=pg_migrated)
    try:
        await queue.add("ship", {"v": 1}, job_id="dup")
        plain = await queue.add("ship", {"v": 2}, job_id="dup")
        by_node = await node("add", **pg_of(postgres_url, pg_migrated, migrate=False), queue=queue_name,
                             name="ship", data={"v": 3}, opts={"jobId": "dup"})
        async with caller.transaction():
            await caller.execute(f"INSERT INTO {orders} VALUES (1, 'duplicate id')")
            in_tx = await queue.add("ship", {"v": 4}, job_id="dup", transaction=caller)
            bulk = await queue.add_bulk([{"name": "ship", "data": {"v": 5}, "opts": {"job_id": "dup"}},
                                         {"name": "ship", "data": {"v": 6}}], transaction=caller)
            assert caller.info.transaction_status == pq.TransactionStatus.INTRANS  # no error: it goes on
        assert plain.id == by_node["id"] == in_tx.id == bulk[0].id == "dup"
        assert await stored_data(queue, "dup") == {"v": 1}  # the existing job, unchanged
        assert await jobs(postgres_url, pg_migrated, queue_name) == 2
        # the plain add's, Node's and the transaction's add (add_jobs_bulk announces none)
        assert await events(postgres_url, pg_migrated, queue_name, "duplicated") == 3
        async with caller.transaction(force_rollback=True):
            await queue.add("ship", {"v": 7}, job_id="dup", transaction=caller)
        assert await events(postgres_url, pg_migrated, queue_name, "duplicated") == 3  # rolled back with it

        # an id whose job has another parent: the plain add's refusal, raised inside the transaction
        await flows.add({"name": "p1", "queue_name": queue_name, "data": {}, "opts": {"job_id": "p1"},
                         "children": [{"name": "kid", "queue_name": queue_name, "data": {}, "opts": {"job_id": "kid"}}]})
        await queue.add("p2", {}, job_id="p2")
        other_parent = {"id": "p2", "queue": queue_name}
        with pytest.raises(ParentJobCannotBeReplaced):
            await queue.add("kid", {}, job_id="kid", parent=other_parent)
        async with caller.transaction(force_rollback=True):
            await caller.execute(f"INSERT INTO {orders} VALUES (2, 'refused')")
            with pytest.raises(ParentJobCannotBeReplaced):
                await queue.add("kid", {}, job_id="kid", parent=other_parent, transaction=caller)
            assert caller.info.transaction_status == pq.TransactionStatus.INERROR  # the caller decides
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 1
    finally:
        await flows.close()
        await queue.close()


async def test_delay_and_priority_in_a_transaction_act_after_the_commit(
        postgres_url: str, pg_migrated: str, orders: str, two: Any, queue_name: str) -> None:
    """A delayed job added in a transaction is delayed from its own timestamp, and a listening
    worker (60 s drain delay: no poll) starts it when it comes due, not before; the prioritized one
    is started after the commit too."""
    caller, _ = two
    started: dict[str, int] = {}

    async def process(job: Job) -> Any:
        started[str(job.id)] = int(time.time() * 1000)
        return None

    delay = 2000
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    worker = Worker(queue_name, process, connection=postgres_url, schema=pg_migrated, drain_delay=60)
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await worker.wait_until_ready()
        async with caller.transaction():
            await caller.execute(f"INSERT INTO {orders} VALUES (3, 'delayed')")
            later = await queue.add("later", {}, job_id="later", delay=delay, transaction=caller)
            first = await queue.add("first", {}, job_id="first", priority=3, transaction=caller)
            assert await queue.get_job("later") is None  # nobody else sees it yet
        due = int(later.timestamp) + delay
        if int(time.time() * 1000) < due - 500:  # (only while surely not due yet: no timing bet)
            assert await queue.get_job_state("later") == "delayed"
        assert await count(postgres_url, f'SELECT count(*) FROM "{pg_migrated}".event WHERE queue = %s AND '
                           "event = 'delayed' AND data->>'jobId' = 'later' AND (data->>'delay')::bigint = %s",
                           [queue_name, due]) == 1
        await wait_until(lambda: "first" in started, 30, "the prioritized job to start")
        await wait_until(lambda: "later" in started, 60, "the delayed job to start")
        stored = await queue.get_job("later")
        assert stored is not None and stored.processed_on is not None
        assert stored.processed_on >= due, f"started {due - stored.processed_on} ms before it was due"
        late = stored.processed_on - due
        print(f"the delayed job started {late} ms after it came due")
        assert late < 20_000, f"started {late} ms after it came due: not by its due time"
        assert first.id == "first"
        prioritized = await queue.get_job("first")
        assert prioritized is not None and prioritized.priority == 3
    finally:
        await worker.close()
        await asyncio.wait_for(running, 30)
        await queue.close()


# -- another transaction's uncommitted id or key: wait, then the answer as if after it -------------
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_a_second_transaction_adding_an_uncommitted_id_waits_for_the_first(
        postgres_url: str, pg_migrated: str, two: Any, queue_name: str, outcome: str) -> None:
    a, b = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)

    async def second() -> Job:
        async with b.transaction():
            return await queue.add("ship", {"by": "b"}, job_id="same", transaction=b)

    task: Any = None
    try:
        async with a.transaction(force_rollback=outcome == "rollback"):
            await queue.add("ship", {"by": "a"}, job_id="same", transaction=a)
            task = asyncio.ensure_future(second())
            await wait_until(lambda: blocked_by(postgres_url, a.info.backend_pid), 30, "b's add to wait on a")
            assert not task.done()
        job = await asyncio.wait_for(task, 30)
        assert job.id == "same"
        # a committed: b got the existing job (a duplicate); a rolled back: b's own job
        assert await stored_data(queue, "same") == ({"by": "a"} if outcome == "commit" else {"by": "b"})
        assert await jobs(postgres_url, pg_migrated, queue_name) == 1
        assert await events(postgres_url, pg_migrated, queue_name, "duplicated") == (1 if outcome == "commit" else 0)
    finally:
        if task is not None and not task.done():
            task.cancel()
        await queue.close()


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_an_uncommitted_deduplication_id_holds_back_other_adds_of_it(
        postgres_url: str, pg_migrated: str, two: Any, queue_name: str, outcome: str) -> None:
    """A plain add (our pool) of the deduplication id an open transaction added waits for that
    transaction (upstream's per-key advisory lock), then is deduplicated or not as it ended."""
    a, _ = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    task: Any = None
    try:
        await queue.wait_until_ready()
        async with a.transaction(force_rollback=outcome == "rollback"):
            held = await queue.add("ship", {"by": "a"}, deduplication={"id": "d"}, transaction=a)
            task = asyncio.ensure_future(queue.add("ship", {"by": "plain"}, deduplication={"id": "d"}))
            await wait_until(lambda: blocked_by(postgres_url, a.info.backend_pid), 30, "the plain add to wait on a")
            assert not task.done()
        plain = await asyncio.wait_for(task, 30)
        if outcome == "commit":
            assert plain.id == held.id and await stored_data(queue, str(held.id)) == {"by": "a"}
        else:
            assert await stored_data(queue, str(plain.id)) == {"by": "plain"}  # its own job, not deduplicated
        assert await queue.get_deduplication_job_id("d") == (held.id if outcome == "commit" else plain.id)
        assert await jobs(postgres_url, pg_migrated, queue_name) == 1
    finally:
        if task is not None and not task.done():
            task.cancel()
        await queue.close()


@pytest.mark.parametrize("how", ["repeatable-read", "lock-timeout"])
async def test_a_conflict_that_cannot_wait_raises_inside_the_second_transaction(
        postgres_url: str, pg_migrated: str, orders: str, two: Any, queue_name: str, how: str) -> None:
    """b's snapshot predates a's commit of the id (REPEATABLE READ): a serialization failure; b's
    lock_timeout is shorter than a's transaction: LockNotAvailable. Either raises in b's
    transaction, which is aborted: b decides (here: roll back); a's job stands."""
    a, b = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    task: Any = None
    try:
        await queue.add("ship", {"by": "a"}, job_id="same", transaction=a)  # opens a's transaction
        async with b.transaction(force_rollback=True):
            if how == "repeatable-read":
                await b.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                await b.execute(f"INSERT INTO {orders} VALUES (1, 'b')")  # b's snapshot: a not committed
                task = asyncio.ensure_future(queue.add("ship", {"by": "b"}, job_id="same", transaction=b))
                await wait_until(lambda: blocked_by(postgres_url, a.info.backend_pid), 30, "b's add to wait on a")
                await a.commit()
                with pytest.raises(psycopg.errors.SerializationFailure):
                    await asyncio.wait_for(task, 30)
            else:
                await b.execute("SET LOCAL lock_timeout = '300ms'")
                await b.execute(f"INSERT INTO {orders} VALUES (1, 'b')")
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    await asyncio.wait_for(queue.add("ship", {"by": "b"}, job_id="same", transaction=b), 30)
                await a.commit()
            assert b.info.transaction_status == pq.TransactionStatus.INERROR
            with pytest.raises(InvalidArgument, match="already failed"):
                await queue.add("ship", {"by": "b"}, transaction=b)
        assert await stored_data(queue, "same") == {"by": "a"}
        assert await jobs(postgres_url, pg_migrated, queue_name) == 1
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 0
    finally:
        if task is not None and not task.done():
            task.cancel()
        await queue.close()


async def test_two_transactions_waiting_for_each_others_ids_one_gets_a_deadlock_error(
        postgres_url: str, pg_migrated: str, two: Any, queue_name: str) -> None:
    """a adds x, b adds y, then a adds y and b adds x: PostgreSQL's deadlock check aborts one of
    them (DeadlockDetected, raised in that one's transaction); the other goes on and commits."""
    a, b = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        await queue.add("ship", {"by": "a"}, job_id="x", transaction=a)
        await queue.add("ship", {"by": "b"}, job_id="y", transaction=b)
        a_waits = asyncio.ensure_future(queue.add("ship", {"by": "a"}, job_id="y", transaction=a))
        await wait_until(lambda: blocked_by(postgres_url, b.info.backend_pid), 30, "a's add to wait on b")
        b_waits = asyncio.ensure_future(queue.add("ship", {"by": "b"}, job_id="x", transaction=b))
        outcomes = await asyncio.wait_for(asyncio.gather(a_waits, b_waits, return_exceptions=True), 60)
        failed = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        assert len(failed) == 1 and isinstance(outcomes[failed[0]], psycopg.errors.DeadlockDetected), outcomes
        loser, winner = (a, b) if failed == [0] else (b, a)
        assert loser.info.transaction_status == pq.TransactionStatus.INERROR
        await loser.rollback()
        await winner.commit()
        who = "a" if winner is a else "b"
        assert await stored_data(queue, "x") == {"by": who} and await stored_data(queue, "y") == {"by": who}
        assert await jobs(postgres_url, pg_migrated, queue_name) == 2
    finally:
        await queue.close()


# -- flows: FlowProducer.add_bulk and the sync FlowProducer ---------------------------------------
def tree(queue_name: str, root: str) -> dict[str, Any]:
    return {"name": root, "queue_name": queue_name, "data": {}, "opts": {"job_id": root},
            "children": [{"name": "child", "queue_name": queue_name, "data": {"n": n},
                          "opts": {"job_id": f"{root}-{n}"}} for n in range(2)]}


async def test_flow_producer_add_bulk_commits_and_rolls_back_with_the_caller(
        postgres_url: str, pg_migrated: str, orders: str, two: Any, queue_name: str) -> None:
    caller, _ = two
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    flows = FlowProducer(connection=postgres_url, schema=pg_migrated)
    try:
        async with caller.transaction(force_rollback=True):
            await caller.execute(f"INSERT INTO {orders} VALUES (1, 'rolled back')")
            nodes = await flows.add_bulk([tree(queue_name, "r1"), tree(queue_name, "r2")], transaction=caller)
            assert [n.job.id for n in nodes] == ["r1", "r2"]
        assert await jobs(postgres_url, pg_migrated, queue_name) == 0
        assert await events(postgres_url, pg_migrated, queue_name, "added") == 0
        async with caller.transaction():
            await caller.execute(f"INSERT INTO {orders} VALUES (2, 'committed')")
            nodes = await flows.add_bulk([tree(queue_name, "r1"), tree(queue_name, "r2")], transaction=caller)
        assert [n.job.id for n in nodes] == ["r1", "r2"]
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 4, "waiting-children": 2}
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 1
    finally:
        await flows.close()
        await queue.close()


def sync_count(postgres_url: str, sql: str) -> int:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def test_the_sync_flow_producer_commits_and_rolls_back_with_a_psycopg_connection(
        postgres_url: str, pg_migrated: str, orders: str, queue_name: str) -> None:
    from bullmq_compat import sync

    flows = sync.FlowProducer(connection=postgres_url, schema=pg_migrated)
    queue = sync.Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    job_count = f"SELECT count(*) FROM \"{pg_migrated}\".job WHERE queue = '{queue_name}'"
    try:
        with psycopg.connect(postgres_url) as conn:
            with conn.transaction(force_rollback=True):
                conn.execute(f"INSERT INTO {orders} VALUES (1, 'rolled back')")
                node_ = flows.add(tree(queue_name, "s1"), transaction=conn)
                flows.add_bulk([tree(queue_name, "s2")], transaction=conn)
                assert node_.job.id == "s1" and [c.job.id for c in node_.children] == ["s1-0", "s1-1"]
            assert sync_count(postgres_url, job_count) == 0
            with conn.transaction():
                conn.execute(f"INSERT INTO {orders} VALUES (2, 'committed')")
                flows.add(tree(queue_name, "s1"), transaction=conn)
                flows.add_bulk([tree(queue_name, "s2")], transaction=conn)
                assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert sync_count(postgres_url, job_count) == 6
        assert queue.get_job_state("s1") == "waiting-children" and queue.get_job_state("s2-1") == "waiting"
        assert sync_count(postgres_url, f"SELECT count(*) FROM {orders}") == 1
    finally:
        queue.close()
        flows.close()


# -- what is refused ----------------------------------------------------------------------------------
async def test_a_psycopg2_connection_is_refused_with_what_is_accepted(
        postgres_url: str, pg_migrated: str, orders: str, queue_name: str) -> None:
    import psycopg2

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    flows = FlowProducer(connection=postgres_url, schema=pg_migrated)
    refused = ("transaction=psycopg2.extensions.connection: a psycopg2 connection cannot run our SQL; "
               "transaction= takes a psycopg 3 AsyncConnection or Connection in an open transaction, a SQLAlchemy")
    conn = psycopg2.connect(postgres_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {orders} VALUES (1, 'psycopg2')")
        for add in (lambda: queue.add("x", {}, transaction=conn),
                    lambda: queue.add_bulk([{"name": "x", "data": {}}], transaction=conn),
                    lambda: flows.add(tree(queue_name, "f"), transaction=conn)):
            with pytest.raises(InvalidArgument) as refusal:
                await add()
            assert str(refusal.value).startswith(refused), refusal.value
        conn.commit()  # the caller's own transaction was left alone: its row commits, no job
    finally:
        conn.close()
        await flows.close()
        await queue.close()
    assert await jobs(postgres_url, pg_migrated, queue_name) == 0
    assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 1


def test_a_sqlalchemy_session_over_psycopg2_is_refused(postgres_url: str, pg_migrated: str, queue_name: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from bullmq_compat import sync

    engine = create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    queue = sync.Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        with Session(engine) as session:
            with pytest.raises(InvalidArgument, match=r"a psycopg2 connection cannot run our SQL.*psycopg 3"):
                queue.add("x", {}, transaction=session)
        assert sync_count(postgres_url, f"SELECT count(*) FROM \"{pg_migrated}\".job WHERE queue = '{queue_name}'") == 0
    finally:
        queue.close()
        engine.dispose()


def test_transactional_is_refused_with_use_processes(postgres_url: str, pg_migrated: str) -> None:
    with pytest.raises(InvalidArgument, match=r"transactional=True is not supported with use_processes=True .*"
                                              r"the transaction is one job's, in the worker's process"):
        Worker("q", "tests.test_postgres_transactions_options:noop", connection=postgres_url, schema=pg_migrated,
               transactional=True, use_processes=True)
