"""Issue #29 §1: transactional enqueue on PostgreSQL (``add`` / ``add_bulk`` / ``FlowProducer.add``
with ``transaction=``): the job commits or rolls back with the caller's own work.

Every test writes a business row (a table of its own in the test's schema) in the same transaction
as the job, so "together or not at all" is checked on both. Workers that take part (Python, and
Node's createPostgresBackend worker) idle with a 60 s drain delay: a job they start within
seconds of the commit was announced by the NOTIFY that rode the caller's transaction, not found
by a poll.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import psycopg
import pytest

from bullmq_compat import FlowProducer, InvalidArgument, Job, Queue, Worker
from tests.helpers import wait_until
from tests.pg_interop_helpers import node_work, pg_of


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
async def orders(postgres_url: str, pg_migrated: str) -> str:
    """A business table of the test's schema: ``<schema>.orders``."""
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(f'CREATE TABLE "{pg_migrated}".orders (id int PRIMARY KEY, note text)')
    return f'"{pg_migrated}".orders'


@pytest.fixture
async def caller(postgres_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The application's own connection: psycopg 3, its default search_path (not our schema)."""
    conn = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        yield conn
    finally:
        await conn.close()


async def count(postgres_url: str, sql: str, params: list[Any]) -> int:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        row = await (await conn.execute(sql, params)).fetchone()
    return int(row[0]) if row else 0


async def jobs_and_events(postgres_url: str, schema: str, queue: str) -> tuple[int, int]:
    return (await count(postgres_url, f'SELECT count(*) FROM "{schema}".job WHERE queue = %s', [queue]),
            await count(postgres_url, f'SELECT count(*) FROM "{schema}".event WHERE queue = %s', [queue]))


async def test_a_rolled_back_add_leaves_no_job_no_event_and_no_id_a_later_add_trips_over(
        postgres_url: str, pg_migrated: str, orders: str, caller: Any, queue_name: str) -> None:
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        async with caller.transaction(force_rollback=True):
            await caller.execute(f"INSERT INTO {orders} VALUES (1, 'rolled back')")
            job = await queue.add("ship", {"order": 1}, job_id="order-1", transaction=caller)
            plain = await queue.add("ship", {"order": 1}, transaction=caller)
            assert job.id == "order-1" and plain.id
            cur = await caller.execute("SHOW search_path")  # the caller's own, between our statements too
            assert (await cur.fetchone())[0] == '"$user", public'
            # inside the transaction the caller sees its job; nobody else does
            cur = await caller.execute(f'SELECT count(*) FROM "{pg_migrated}".job WHERE queue = %s', [queue_name])
            assert (await cur.fetchone())[0] == 2
            assert await queue.get_job("order-1") is None
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 0
        # the same custom id is free again: a new job, not "the existing one"
        again = await queue.add("ship", {"order": 1, "again": True}, job_id="order-1")
        assert again.id == "order-1"
        stored = await queue.get_job("order-1")
        assert stored is not None and stored.data == {"order": 1, "again": True}
        # and the caller's search_path is its own again, in and after the transaction
        cur = await caller.execute("SHOW search_path")
        assert (await cur.fetchone())[0] == '"$user", public'
    finally:
        await queue.close()


async def test_a_committed_add_runs_once_started_by_a_listening_python_worker_at_the_commit(
        postgres_url: str, pg_migrated: str, orders: str, caller: Any, queue_name: str) -> None:
    started: list[tuple[str, int]] = []

    async def process(job: Job) -> Any:
        started.append((str(job.id), now_ms()))
        return job.data["order"]

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    worker = Worker(queue_name, process, connection=postgres_url, schema=pg_migrated, drain_delay=60)
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await worker.wait_until_ready()
        await asyncio.sleep(0.5)  # idle: blocked on LISTEN with a 60 s drain delay
        async with caller.transaction():
            await caller.execute(f"INSERT INTO {orders} VALUES (7, 'committed')")
            job = await queue.add("ship", {"order": 7}, transaction=caller)
            await asyncio.sleep(0.5)
            assert started == [], "a worker started a job its transaction had not committed"
        committed = now_ms()
        await wait_until(lambda: bool(started), 30, "the worker to start the committed job")
        assert started[0][0] == job.id
        waited = started[0][1] - committed
        print(f"python worker started the job {waited} ms after the commit")
        assert waited < 10_000, f"started {waited} ms after the commit: by a poll, not by the NOTIFY"
        await wait_until(lambda: _state_is(queue, job.id, "completed"), 30, "the job to complete")
        await asyncio.sleep(0.3)
        assert [s[0] for s in started] == [job.id]  # once
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 1
    finally:
        await worker.close()
        await asyncio.wait_for(running, 30)
        await queue.close()


async def _state_is(queue: Queue, job_id: Any, state: str) -> bool:
    return bool(await queue.get_job_state(str(job_id)) == state)


async def test_a_committed_add_is_started_by_a_listening_node_worker_at_the_commit(
        postgres_url: str, pg_migrated: str, orders: str, caller: Any, queue_name: str) -> None:
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        async with node_work(pg_of(postgres_url, pg_migrated, migrate=False), queue_name, 1,
                             workerOpts={"drainDelay": 60}) as node_worker:
            await asyncio.sleep(0.5)
            async with caller.transaction():
                await caller.execute(f"INSERT INTO {orders} VALUES (8, 'for node')")
                job = await queue.add("ship", {"order": 8}, transaction=caller)
            committed = now_ms()
            outcome = await node_worker.result()
        assert outcome["completed"] == [job.id] and not outcome["timedOut"], outcome
        done = await queue.get_job(str(job.id))
        assert done is not None and done.processed_on is not None
        waited = done.processed_on - committed
        print(f"node worker started the job {waited} ms after the commit")
        assert waited < 10_000, f"Node started it {waited} ms after the commit: by a poll, not by the NOTIFY"
    finally:
        await queue.close()


async def probe_order_7(postgres_url: str, orders: str) -> str:
    """Insert order 7 in a transaction rolled back at once: "locked" while another open transaction
    has written that key, "free" when nobody holds it (the probe leaves nothing)."""
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        try:
            async with conn.transaction(force_rollback=True):
                await conn.execute("SET LOCAL lock_timeout = '300ms'")
                await conn.execute(f"INSERT INTO {orders} VALUES (7, 'probe')")
        except psycopg.errors.LockNotAvailable:
            return "locked"
    return "free"


async def _is(value: Any, want: Any) -> bool:
    return await value == want


PRODUCER_INSIDE_ITS_TRANSACTION = """
import asyncio, sys, psycopg
from bullmq_compat import Queue

async def main(url, schema, queue_name, orders):
    queue = Queue(queue_name, connection=url, schema=schema)
    conn = await psycopg.AsyncConnection.connect(url)
    async with conn.transaction():
        await conn.execute(f"INSERT INTO {orders} VALUES (7, 'never committed')")
        await queue.add("ship", {"order": 7}, job_id="order-7", transaction=conn)
        await queue.add_bulk([{"name": "ship", "data": {"order": 7, "part": n}} for n in range(3)],
                             transaction=conn)
        print("inside", flush=True)
        await asyncio.sleep(600)  # SIGKILLed here, the transaction open

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_producer_killed_inside_its_transaction_leaves_neither_row_nor_job(
        postgres_url: str, pg_migrated: str, orders: str, queue_name: str) -> None:
    """The crash between the business write and the commit: the producer process is SIGKILLed with
    its order row and four jobs written in one open transaction. The server rolls it back: no row,
    no job, no event, and the ids are free; a listening worker starts nothing."""
    import sys

    started: list[str] = []
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    worker = Worker(queue_name, lambda job: started.append(str(job.id)), connection=postgres_url,
                    schema=pg_migrated, drain_delay=60)
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER_INSIDE_ITS_TRANSACTION, postgres_url, pg_migrated, queue_name, orders,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await worker.wait_until_ready()
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if line != b"inside\n":
            _, err = await proc.communicate()
            raise AssertionError(f"the producer did not reach its transaction: {line!r} {err.decode()[-2000:]}")
        # the producer's row is written, uncommitted: the same key waits on its transaction
        assert await probe_order_7(postgres_url, orders) == "locked"
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
        proc.kill()
        assert await proc.wait() == -9
        # the server sees the dead client and rolls its transaction back: the key is free
        await wait_until(lambda: _is(probe_order_7(postgres_url, orders), "free"), 30, "the rollback")
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 0
        again = await queue.add("ship", {"order": 7, "again": True}, job_id="order-7")
        assert again.id == "order-7"
        await wait_until(lambda: started, 30, "the worker to start order-7")
        await wait_until(lambda: _is(queue.get_job_counts("completed"), {"completed": 1}), 30, "its completion")
        assert started == ["order-7"]
        assert await queue.get_job_counts("completed", "waiting", "active") == \
            {"completed": 1, "waiting": 0, "active": 0}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await worker.close()
        await running
        await queue.close()


async def test_add_bulk_and_a_flow_commit_and_roll_back_with_the_caller(
        postgres_url: str, pg_migrated: str, orders: str, caller: Any, queue_name: str) -> None:
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    flows = FlowProducer(connection=postgres_url, schema=pg_migrated)
    tree = {"name": "parent", "queue_name": queue_name, "data": {},
            "children": [{"name": "child", "queue_name": queue_name, "data": {"n": n}} for n in range(3)]}
    bulk = [{"name": "b", "data": {"n": n}, "opts": {"priority": n + 1}} for n in range(5)]
    try:
        async with caller.transaction(force_rollback=True):
            await queue.add_bulk(bulk, transaction=caller)
            await flows.add(tree, transaction=caller)
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
        async with caller.transaction():
            await caller.execute(f"INSERT INTO {orders} VALUES (9, 'bulk and flow')")
            jobs = await queue.add_bulk(bulk, transaction=caller)
            node = await flows.add(tree, transaction=caller)
        assert len({j.id for j in jobs}) == 5
        counts = await queue.get_job_counts("prioritized", "waiting", "waiting-children")
        assert counts == {"prioritized": 5, "waiting": 3, "waiting-children": 1}, counts
        assert await queue.get_job_state(str(node.job.id)) == "waiting-children"
    finally:
        await flows.close()
        await queue.close()


async def test_a_refused_add_raises_inside_the_callers_transaction_and_writes_nothing(
        postgres_url: str, pg_migrated: str, orders: str, caller: Any, queue_name: str) -> None:
    from psycopg import pq

    from bullmq_compat import ParentJobNotFound

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        async with caller.transaction(force_rollback=True):
            await caller.execute(f"INSERT INTO {orders} VALUES (10, 'refused')")
            with pytest.raises(ParentJobNotFound):
                await queue.add("child", {}, parent={"id": "missing", "queue": queue_name}, transaction=caller)
            # the caller's transaction is aborted: the caller decides (here: roll back)
            assert caller.info.transaction_status == pq.TransactionStatus.INERROR
            with pytest.raises(InvalidArgument, match="already failed"):
                await queue.add("next", {}, transaction=caller)
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 0
    finally:
        await queue.close()


async def test_what_transaction_refuses(postgres_url: str, pg_migrated: str, redis_url: str, queue_name: str) -> None:
    import asyncpg

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    on_redis = Queue(queue_name, connection=redis_url)
    try:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as autocommit:
            with pytest.raises(InvalidArgument, match="autocommit connection outside a transaction block"):
                await queue.add("x", {}, transaction=autocommit)
            with pytest.raises(InvalidArgument, match="is on Redis"):
                await on_redis.add("x", {}, transaction=autocommit)
        other = await asyncpg.connect(postgres_url)
        try:
            with pytest.raises(InvalidArgument, match="an asyncpg connection cannot run our SQL.*psycopg 3"):
                await queue.add("x", {}, transaction=other)
        finally:
            await other.close()
        with pytest.raises(InvalidArgument, match="transaction=builtins.str: not a database connection"):
            await queue.add("x", {}, transaction="postgresql://")
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
    finally:
        await queue.close()
        await on_redis.close()


# -- the same from the sync API, SQLAlchemy and Django -------------------------------------------------
def sync_counts(postgres_url: str, schema: str, queue: str, orders: str) -> tuple[int, int]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        jobs = conn.execute(f'SELECT count(*) FROM "{schema}".job WHERE queue = %s', [queue]).fetchone()
        rows = conn.execute(f"SELECT count(*) FROM {orders}").fetchone()
    return int(jobs[0]) if jobs else 0, int(rows[0]) if rows else 0


def test_the_sync_api_adds_in_a_psycopg_connections_transaction(
        postgres_url: str, pg_migrated: str, orders: str, queue_name: str) -> None:
    from bullmq_compat import sync

    queue = sync.Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        with psycopg.connect(postgres_url) as conn:
            with conn.transaction(force_rollback=True):
                conn.execute(f"INSERT INTO {orders} VALUES (1, 'rolled back')")
                queue.add("ship", {"order": 1}, transaction=conn)
            assert sync_counts(postgres_url, pg_migrated, queue_name, orders) == (0, 0)
            with conn.transaction():
                conn.execute(f"INSERT INTO {orders} VALUES (2, 'committed')")
                job = queue.add("ship", {"order": 2}, transaction=conn)
                queue.add_bulk([{"name": "more", "data": {}}], transaction=conn)
                assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert sync_counts(postgres_url, pg_migrated, queue_name, orders) == (2, 1)
        assert queue.get_job(job.id).data == {"order": 2}
    finally:
        queue.close()


async def test_sqlalchemy_async_session_and_connection(
        postgres_url: str, pg_migrated: str, orders: str, queue_name: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        async with AsyncSession(engine) as session:
            await session.execute(text(f"INSERT INTO {orders} VALUES (1, 'rolled back')"))
            await queue.add("ship", {"order": 1}, transaction=session)
            await session.rollback()
        assert await jobs_and_events(postgres_url, pg_migrated, queue_name) == (0, 0)
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(text(f"INSERT INTO {orders} VALUES (2, 'committed')"))
            job = await queue.add("ship", {"order": 2}, transaction=session)
        async with engine.begin() as conn:  # an AsyncConnection, committed by the block
            await conn.execute(text(f"INSERT INTO {orders} VALUES (3, 'connection')"))
            await queue.add("ship", {"order": 3}, transaction=conn)
        assert (await jobs_and_events(postgres_url, pg_migrated, queue_name))[0] == 2
        assert await count(postgres_url, f"SELECT count(*) FROM {orders}", []) == 2
        assert await queue.get_job_state(str(job.id)) == "waiting"
        asyncpg_engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+asyncpg://", 1))
        try:
            async with AsyncSession(asyncpg_engine) as session:
                with pytest.raises(InvalidArgument, match="an asyncpg connection cannot run our SQL"):
                    await queue.add("ship", {}, transaction=session)
        finally:
            await asyncpg_engine.dispose()
    finally:
        await queue.close()
        await engine.dispose()


def test_sqlalchemy_sync_session_and_connection(postgres_url: str, pg_migrated: str, orders: str,
                                                queue_name: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    from bullmq_compat import sync

    engine = create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    queue = sync.Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    try:
        with Session(engine) as session:
            session.execute(text(f"INSERT INTO {orders} VALUES (1, 'rolled back')"))
            queue.add("ship", {"order": 1}, transaction=session)
            session.rollback()
        assert sync_counts(postgres_url, pg_migrated, queue_name, orders) == (0, 0)
        with Session(engine) as session, session.begin():
            session.execute(text(f"INSERT INTO {orders} VALUES (2, 'committed')"))
            queue.add("ship", {"order": 2}, transaction=session)
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {orders} VALUES (3, 'connection')"))
            queue.add("ship", {"order": 3}, transaction=conn)
        assert sync_counts(postgres_url, pg_migrated, queue_name, orders) == (2, 2)
    finally:
        queue.close()
        engine.dispose()


DJANGO_CHILD = r'''
import json, sys
import django
from django.conf import settings
from urllib.parse import urlsplit

url, schema, queue_name, orders = sys.argv[1:5]
parts = urlsplit(url)
settings.configure(DATABASES={"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"), "USER": parts.username or "",
    "PASSWORD": parts.password or "", "HOST": parts.hostname or "", "PORT": str(parts.port or "")}})
django.setup()
from django.db import connection, transaction
from bullmq_compat import InvalidArgument, sync

queue = sync.Queue(queue_name, connection=url, schema=schema)
out = {}
try:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"INSERT INTO {orders} VALUES (1, 'rolled back')")
        queue.add("ship", {"order": 1}, transaction=connection)
        transaction.set_rollback(True)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"INSERT INTO {orders} VALUES (2, 'committed')")
        out["id"] = queue.add("ship", {"order": 2}, transaction=connection).id
    try:
        queue.add("ship", {"order": 3}, transaction=connection)  # autocommit: outside atomic()
    except InvalidArgument as err:
        out["outside"] = str(err)
finally:
    queue.close()
print(json.dumps(out))
'''


def test_django_connection_inside_atomic(postgres_url: str, pg_migrated: str, orders: str, queue_name: str,
                                          tmp_path: Any) -> None:
    """Django in a process of its own (settings are per process): psycopg 3 backend, atomic()."""
    import json
    import subprocess
    import sys

    script = tmp_path / "django_child.py"
    script.write_text(DJANGO_CHILD)
    done = subprocess.run([sys.executable, str(script), postgres_url, pg_migrated, queue_name, orders],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "not inside transaction.atomic()" in out["outside"]
    assert sync_counts(postgres_url, pg_migrated, queue_name, orders) == (1, 1)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute(f'SELECT data FROM "{pg_migrated}".job WHERE queue = %s AND id = %s',
                           [queue_name, out["id"]]).fetchone()
    assert row is not None and row[0] == {"order": 2}


# -- docs/postgres.md's "Transactions" examples, run as they are there -----------------------------------
def transaction_examples() -> list[str]:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "postgres.md").read_text()
    section = text.split("\n## Transactions\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_docs_have_the_four_examples() -> None:
    examples = transaction_examples()
    assert len(examples) == 4
    assert ["psycopg" in examples[0], "sqlalchemy" in examples[1], "django" in examples[2],
            "transactional=True" in examples[3]] == [True] * 4


@pytest.mark.parametrize("index", [0, 1, 2], ids=["psycopg", "sqlalchemy", "django"])
def test_a_transactions_example_of_the_docs_runs_as_pasted(postgres_url: str, pg_migrated: str, index: int,
                                                          tmp_path: Any) -> None:
    """Only the connection is substituted: the URL (and Django's settings from it) and the schema."""
    import subprocess
    import sys
    from urllib.parse import urlsplit

    code = transaction_examples()[index]
    parts = urlsplit(postgres_url)
    code = code.replace("postgresql://postgres@127.0.0.1:5432/test", postgres_url)
    code = code.replace('"NAME": "test", "USER": "postgres", "HOST": "127.0.0.1"',
                        f'"NAME": {parts.path.lstrip("/")!r}, "USER": {parts.username or ""!r}, '
                        f'"HOST": {parts.hostname or ""!r}, "PORT": {str(parts.port or "")!r}, '
                        f'"PASSWORD": {parts.password or ""!r}')
    code = code.replace('schema="bullmq"', f"schema={pg_migrated!r}")
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    order = index + 1
    assert done.stdout.startswith("added ") and done.stdout.strip().endswith(f"with order {order}"), done.stdout
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute(f'SELECT data FROM "{pg_migrated}".job WHERE queue = %s', ["emails"]).fetchone()
    assert row == ({"order": order},)


# -- §2: Worker(transactional=True): the processor's writes commit with the job's completion --------------
@pytest.fixture
async def effects(postgres_url: str, pg_migrated: str) -> str:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(f'CREATE TABLE "{pg_migrated}".effects (job_id text, attempt int, pid int)')
    return f'"{pg_migrated}".effects'


async def effect_rows(postgres_url: str, table: str) -> list[tuple[str, int]]:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT job_id, attempt FROM {table} ORDER BY job_id, attempt")
        return [(str(r[0]), int(r[1])) for r in await cur.fetchall()]


async def test_a_transactional_processor_commits_its_writes_with_the_completion_and_not_on_failure(
        postgres_url: str, pg_migrated: str, effects: str, queue_name: str) -> None:
    """Attempt 1 of job "retried" writes its row, then raises: rolled back; attempt 2 commits. Job
    "fatal" never commits. Jobs added by Node are processed the same way."""
    from tests.node import node

    async def process(job: Job) -> Any:
        await job.transaction.execute(f"INSERT INTO {effects} VALUES (%s, %s, 0)", [job.id, job.attempts_made + 1])
        if job.name == "retried" and job.attempts_made == 0:
            raise RuntimeError("first attempt fails")
        if job.name == "fatal":
            from bullmq_compat import UnrecoverableError
            raise UnrecoverableError("never")
        return "done"

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    worker = Worker(queue_name, process, connection=postgres_url, schema=pg_migrated, transactional=True,
                    concurrency=3, drain_delay=1)
    try:
        await queue.add("plain", {}, job_id="plain")
        await queue.add("retried", {}, job_id="retried", attempts=2)
        await queue.add("fatal", {}, job_id="fatal", attempts=3)
        await node("add", **pg_of(postgres_url, pg_migrated, migrate=False), queue=queue_name, name="from-node",
                   data={"n": 1}, opts={"jobId": "from-node"})
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        await wait_until(lambda: _finished(queue, 4), 60, "the four jobs to finish")
        assert await effect_rows(postgres_url, effects) == [("from-node", 1), ("plain", 1), ("retried", 2)]
        assert await queue.get_job_state("fatal") == "failed"
        assert await queue.get_job_state("retried") == "completed"
        assert await count(postgres_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND state LIKE 'idle in transaction%%' AND query LIKE %s",
                           [f"%{pg_migrated}%"]) == 0
    finally:
        await worker.close()
        await queue.close()
    await asyncio.wait_for(running, 30)


async def test_a_pooled_session_the_server_ended_is_not_charged_to_the_next_job(
        postgres_url: str, pg_migrated: str, effects: str, queue_name: str) -> None:
    """The worker's idle pooled sessions are terminated between two jobs (a restart, an
    idle_session_timeout, pg_terminate_backend): the next transactional job takes a live session
    and completes at its first attempt (attempts=1: an attempt charged for the dead session would
    have failed it)."""
    pids: list[int] = []

    async def process(job: Job) -> Any:
        pids.append(job.transaction.info.backend_pid)
        await job.transaction.execute(f"INSERT INTO {effects} VALUES (%s, %s, 0)", [job.id, job.attempts_made + 1])
        return "done"

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    worker = Worker(queue_name, process, connection=postgres_url, schema=pg_migrated, transactional=True,
                    drain_delay=1)
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await queue.add("first", {}, job_id="first")
        await wait_until(lambda: _finished(queue, 1), 30, "the first job")
        # every session the worker's pool holds idle (psycopg_pool's own deque: a test may look), once the
        # first job's session is back in it (the job is completed at its commit, a little before the
        # worker gives the session back)
        def idle_pids() -> list[int]:
            return [conn.info.backend_pid for conn in worker.backend.connection.pool._pool]

        async def first_back() -> bool:
            return pids[0] in idle_pids()

        await wait_until(first_back, 30, f"the first job's session {pids[0]} to be back in the pool")
        idle = idle_pids()
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            for pid in idle:
                await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        await wait_until(lambda: _none_alive(postgres_url, idle), 30, "the terminated sessions to end")
        await queue.add("second", {}, job_id="second")
        await wait_until(lambda: _finished(queue, 2), 30, "the second job")
        assert await queue.get_job_state("second") == "completed"
        second = await queue.get_job("second")
        assert second is not None and second.attempts_made == 1 and second.attempts_started == 1
        assert pids[1] not in idle
        assert await effect_rows(postgres_url, effects) == [("first", 1), ("second", 1)]
    finally:
        await worker.close()
        await queue.close()
    await asyncio.wait_for(running, 30)


async def _none_alive(postgres_url: str, pids: list[int]) -> bool:
    return await count(postgres_url, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]) == 0


async def _finished(queue: Queue, n: int) -> bool:
    counts = await queue.get_job_counts("completed", "failed")
    return counts["completed"] + counts["failed"] >= n


async def test_a_lost_lock_refuses_the_late_completion_and_rolls_its_writes_back(
        postgres_url: str, pg_migrated: str, effects: str, queue_name: str) -> None:
    """Worker A (no lock renewal, 1 s lock) runs the job until worker B's stalled check has taken it
    back and B runs it; A then completes while B holds the lock under its own token: upstream's token
    check refuses it (`JobLockMismatch`, code -6) and A's row is gone; B completes after that."""
    from bullmq_compat import JobLockMismatch

    released = asyncio.Event()
    refused = asyncio.Event()
    errors: list[BaseException] = []

    async def slow(job: Job) -> Any:
        await job.transaction.execute(f"INSERT INTO {effects} VALUES (%s, 1, 1)", [job.id])
        await asyncio.wait_for(released.wait(), 60)
        return "late"

    async def quick(job: Job) -> Any:
        await job.transaction.execute(f"INSERT INTO {effects} VALUES (%s, 1, 2)", [job.id])
        released.set()
        # A completes while this run holds the lock (had B completed first, A's refusal would be -3,
        # the job no longer active)
        await asyncio.wait_for(refused.wait(), 60)
        return "on time"

    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    a = Worker(queue_name, slow, connection=postgres_url, schema=pg_migrated, transactional=True,
               lock_duration=1000, skip_lock_renewal=True, skip_stalled_check=True, drain_delay=1)
    a.on("error", lambda err: (errors.append(err), refused.set()))
    b = Worker(queue_name, quick, connection=postgres_url, schema=pg_migrated, transactional=True,
               stalled_interval=300, drain_delay=1)
    job = await queue.add("j", {}, job_id="lost")
    run_a = asyncio.ensure_future(a.run(handle_signals=False))
    run_b = None
    try:
        await wait_until(lambda: _state_is(queue, "lost", "active"), 30, "worker A to take the job")
        run_b = asyncio.ensure_future(b.run(handle_signals=False))
        await wait_until(lambda: _state_is(queue, "lost", "completed"), 60, "worker B to complete the job")
        await wait_until(lambda: bool(errors), 30, "worker A's refused completion")
        stored = await queue.get_job(str(job.id))
        assert stored is not None and stored.returnvalue == "on time"
        assert await count(postgres_url, f"SELECT count(*) FROM {effects} WHERE pid = 1", []) == 0
        assert await count(postgres_url, f"SELECT count(*) FROM {effects} WHERE pid = 2", []) == 1
        print(f"worker A's refused completion: {errors[0]!r}")
        assert len(errors) == 1 and isinstance(errors[0], JobLockMismatch), errors
        assert errors[0].code == -6 and errors[0].job_id == "lost", errors[0]
        assert str(errors[0]).startswith("Lock mismatch for job lost."), errors[0]
    finally:
        released.set()
        refused.set()
        await a.close()
        await b.close()
        await queue.close()
    await asyncio.wait_for(run_a, 30)
    if run_b is not None:
        await asyncio.wait_for(run_b, 30)


def test_transactional_is_refused_where_it_cannot_hold(redis_url: str, postgres_url: str, pg_migrated: str) -> None:
    async def process(job: Job) -> None:
        return None

    with pytest.raises(InvalidArgument, match="transactional=True needs a PostgreSQL queue"):
        Worker("q", process, connection=redis_url, transactional=True)
    with pytest.raises(InvalidArgument, match="not supported with use_processes=True or batch="):
        Worker("q", process, connection=postgres_url, schema=pg_migrated, transactional=True, batch={"size": 2})


SOAK_JOBS = 2000
SOAK_WORKERS = 3
SOAK_PARTS = 5


async def test_a_kill_soak_commits_each_completed_jobs_effects_exactly_once(
        postgres_url: str, pg_migrated: str, effects: str, queue_name: str, tmp_path: Any) -> None:
    """2,000 jobs (retries, failures as the crash soaks plan them) on three transactional worker
    processes (tests/pg_chaos_worker_proc.py --effects: every run writes a row in its transaction),
    one SIGKILLed every 0.4-1 s and restarted. Every job ends as its handler decided (`check_runs`,
    every repeat explained by a kill); every completed job has exactly one row, written by its last
    attempt, and no failed job has any: a killed run's writes, a failed attempt's, are gone."""
    import random
    import sys

    from tests.chaos_helpers import CHAOS, add_plan_part, check_runs, judge_lock_lost, plan_jobs, report
    from tests.group_helpers import Proc
    from tests.pg_group_helpers import final_states, finish_events, read_run_records

    def worker_proc(name: str) -> Proc:
        return Proc(sys.executable, "-m", "tests.pg_chaos_worker_proc", postgres_url, pg_migrated, queue_name,
                    "--rec", str(tmp_path), "--concurrency", "4", "--lock-duration", "1000",
                    "--stalled-interval", "500", "--max-stalled-count", "1000", "--drain-delay", "5",
                    "--name", name, "--effects", effects)

    rng = random.Random(20261203)
    plan = plan_jobs(SOAK_JOBS, seed=31, grouped=0, ms=(5, 40))
    queue = Queue(queue_name, connection=postgres_url, schema=pg_migrated)
    procs: list[Proc] = []
    retired: list[Proc] = []
    kills: dict[int, int] = {}
    try:
        await add_plan_part(queue, plan, 0, SOAK_PARTS)
        parts = 1
        for i in range(SOAK_WORKERS):
            procs.append(await worker_proc(f"tx{i}").__aenter__())
        while len(kills) < (60 if CHAOS else 15) and (parts < SOAK_PARTS or not await _finished(queue, SOAK_JOBS)):
            await asyncio.sleep(rng.uniform(0.4, 1.0))
            k = rng.randrange(SOAK_WORKERS)
            kills[procs[k].pid] = await procs[k].kill()
            retired.append(procs[k])
            procs[k] = await worker_proc(f"tx{k}").__aenter__()
            if parts < SOAK_PARTS:
                await add_plan_part(queue, plan, parts, SOAK_PARTS)
                parts += 1
        while parts < SOAK_PARTS:
            await add_plan_part(queue, plan, parts, SOAK_PARTS)
            parts += 1
        await wait_until(lambda: _finished(queue, SOAK_JOBS), 240, f"all {SOAK_JOBS} jobs to finish")
    finally:
        for proc in procs + retired:
            await proc.__aexit__(None, None, None)
        await queue.close()
    records = read_run_records(tmp_path)
    states = await final_states(postgres_url, pg_migrated, queue_name, plan.ids)
    events = await finish_events(postgres_url, pg_migrated, queue_name)
    figures = check_runs(plan, states, records["start"], records["end"], kills, events, fins=records["fin"],
                         lags=records["lag"])
    rows = await effect_rows(postgres_url, effects)
    per_job: dict[str, list[int]] = {}
    for job_id, attempt in rows:
        per_job.setdefault(job_id, []).append(attempt)
    want = {job_id: [st["atm"]] for job_id, st in states.items() if st["state"] == "completed"}
    report(f"\npostgres transactional kill soak: {figures.line()}; effect rows {len(rows)} for "
           f"{figures.completed} completed jobs")
    judge_lock_lost(figures, "postgres transactional kill soak")
    assert figures.kills >= SOAK_PARTS - 1 and figures.killed_runs > 0, "the kills hit no running job"
    assert figures.duplicates > 0, "no job ran twice: the soak proved nothing about effects"
    wrong = [(j, per_job.get(j), want.get(j)) for j in set(per_job) | set(want) if per_job.get(j) != want.get(j)]
    assert per_job == want, f"{len(rows)} effect rows for {len(want)} completed jobs; wrong: {wrong[:10]}"


def test_the_transactional_worker_example_of_the_docs_runs_as_pasted(postgres_url: str, pg_migrated: str,
                                                                      tmp_path: Any) -> None:
    import subprocess
    import sys

    code = transaction_examples()[3]
    code = code.replace("postgresql://postgres@127.0.0.1:5432/test", postgres_url)
    code = code.replace('SCHEMA = "bullmq"', f"SCHEMA = {pg_migrated!r}")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg_migrated}".sent (job_id text PRIMARY KEY)')
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "welcome-1 completed", done.stdout
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute(f'SELECT job_id FROM "{pg_migrated}".sent').fetchall() == [("welcome-1",)]
