"""Least privilege on PostgreSQL: a schema migrated by an owner role, and a producer and a worker
(with QueueEvents) that run as roles holding exactly the grants docs/security.md gives (its
```sql block is read from the page and run), and what a missing grant looks like.

The cluster is the test's own, hardened beyond PostgreSQL's defaults so that every documented
grant is needed: PUBLIC has no right on the database (no CONNECT, no TEMPORARY) and the owner's
functions are not executable by PUBLIC. Roles log in with scram-sha-256 passwords; their names are
made per test and the roles dropped after.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from bullmq_compat import FlowProducer, Queue, QueueEvents, Worker, migrate_postgres
from tests._postgres_server import PostgresServer
from tests.helpers import wait_until

DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"
DOC_ROLES = ("bullmq_app", "bullmq_producer", "bullmq_worker")
DATABASE = "postgres"


def documented_grants() -> list[str]:
    """The statements of the ```sql block under the PostgreSQL grants heading, comments removed."""
    text = DOC.read_text()
    section = text.split("## Least privilege: PostgreSQL grants", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sql\n(.*?)```", section, re.S)
    assert block, "docs/security.md lost its ```sql block of PostgreSQL grants"
    code = "\n".join(line.split("--", 1)[0] for line in block.group(1).splitlines())
    return [" ".join(s.split()) for s in code.split(";") if s.strip()]


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    server = PostgresServer(hba=["local all all trust", "host all postgres 127.0.0.1/32 trust",
                                 "host all all 127.0.0.1/32 scram-sha-256"]).start()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(f"REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC")  # no CONNECT, no TEMPORARY
        yield server
    finally:
        server.stop()


class Roles:
    """The owner and the documented roles of one test, under names of its own, and its schema."""

    def __init__(self, server: PostgresServer) -> None:
        tag = uuid.uuid4().hex[:8]
        self.server = server
        self.schema = f"jobs_{tag}"
        self.owner = f"owner_{tag}"
        self.names = {role: f"{role.split('_', 1)[1]}_{tag}" for role in DOC_ROLES}  # app_x, producer_x...
        self.passwords = {self.owner: f"pw-{self.owner}"} | {n: f"pw-{n}" for n in self.names.values()}

    def url(self, role: str) -> str:
        name = self.names.get(role, role)
        return f"postgresql://{name}:{self.passwords[name]}@127.0.0.1:{self.server.port}/{DATABASE}"

    def statements(self, drop: str = "") -> list[str]:
        """The documented statements for our names (``drop``: leave out those containing it)."""
        out = []
        for statement in documented_grants():
            if drop and drop in statement:
                continue
            for doc_name, name in self.names.items():
                statement = re.sub(rf"\b{doc_name}\b", name, statement)
            statement = re.sub(r"\bbullmq\b", self.schema, statement)
            statement = re.sub(r"\bDATABASE app\b", f"DATABASE {DATABASE}", statement)
            statement = re.sub(r"PASSWORD '[^']*'",
                               lambda m: f"PASSWORD '{self.passwords[statement.split()[2]]}'", statement)
            out.append(statement)
        return out

    async def set_up(self, drop: str = "") -> None:
        """The owner migrates the schema; the documented grants are given (``drop`` left out)."""
        with psycopg.connect(self.server.url, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {self.owner} LOGIN PASSWORD '{self.passwords[self.owner]}'")
            admin.execute(f"GRANT CONNECT, CREATE ON DATABASE {DATABASE} TO {self.owner}")
            # PostgreSQL lets PUBLIC execute new functions: not the owner's, here
            admin.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {self.owner} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
        await migrate_postgres(self.url(self.owner), self.schema)
        with psycopg.connect(self.server.url, autocommit=True) as admin, \
                psycopg.connect(self.url(self.owner), autocommit=True) as owner:
            for statement in self.statements(drop):
                # roles and database rights need CREATEROLE / the database's owner; the rest the schema's owner
                by_admin = statement.startswith(("CREATE ROLE", "ALTER DEFAULT")) or " ON DATABASE " in statement
                (admin if by_admin else owner).execute(statement)

    def tear_down(self) -> None:
        roles = [*self.names.values(), self.owner]
        with psycopg.connect(self.server.url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            existing = [r for (r,) in admin.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                                                    [roles]).fetchall()]
            if existing:
                admin.execute(f"DROP OWNED BY {', '.join(existing)} CASCADE")
                for role in roles:
                    admin.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.fixture
def roles(server: PostgresServer) -> Iterator[Roles]:
    made = Roles(server)
    try:
        yield made
    finally:
        made.tear_down()


def test_the_documented_block_has_every_role_and_right() -> None:
    text = " ".join(documented_grants())
    for role in DOC_ROLES:
        assert f"CREATE ROLE {role}" in text
    for right in ("USAGE ON SCHEMA", "ON bullmq.migration", "EXECUTE ON ALL FUNCTIONS", "CONNECT",
                  "TEMPORARY"):
        assert right in text, right
    assert "SUPERUSER" not in text and "OWNER" not in text and "ALL PRIVILEGES" not in text


async def test_a_producer_and_a_worker_run_with_exactly_the_documented_grants(roles: Roles) -> None:
    await roles.set_up()
    name = f"q-{uuid.uuid4().hex[:8]}"
    producer = Queue(name, roles.url("bullmq_producer"), schema=roles.schema)
    flows = FlowProducer(roles.url("bullmq_producer"), schema=roles.schema)
    events = QueueEvents(name, roles.url("bullmq_worker"), schema=roles.schema)
    attempts: dict[str, int] = {}

    async def process(job: Any) -> Any:
        attempts[job.id] = attempts.get(job.id, 0) + 1
        await job.update_progress(50)
        await job.log(f"attempt {attempts[job.id]}")
        if job.data.get("fail_once") and attempts[job.id] == 1:
            raise RuntimeError("once")
        return {"doubled": job.data.get("n", 0) * 2}

    worker = Worker(name, process, roles.url("bullmq_worker"), schema=roles.schema, concurrency=2,
                    autorun=False)
    errors: list[BaseException] = []
    worker.on("error", errors.append)
    run = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await events.wait_until_ready()
        first = await producer.add("one", {"n": 21})
        bulk = await producer.add_bulk([{"name": "b", "data": {"n": i}} for i in range(5)])
        retried = await producer.add("retry", {"n": 1, "fail_once": True}, attempts=2, backoff=10)
        delayed = await producer.add("later", {"n": 2}, delay=200)
        tree = await flows.add({"name": "parent", "queue_name": name, "data": {"n": 3},
                                "children": [{"name": "child", "queue_name": name, "data": {"n": 4}}]})
        assert await first.wait_until_finished(events, 60000) == {"doubled": 42}
        assert await retried.wait_until_finished(events, 60000) == {"doubled": 2}
        assert await delayed.wait_until_finished(events, 60000) == {"doubled": 4}
        assert await tree.job.wait_until_finished(events, 60000) == {"doubled": 6}
        for job in bulk:
            assert await job.wait_until_finished(events, 60000) == {"doubled": job.data["n"] * 2}
        # another role adds to the queue the producer made (its id sequence is the producer's)
        async with Queue(name, roles.url("bullmq_worker"), schema=roles.schema) as other:
            more = await other.add("more", {"n": 5})
            assert await more.wait_until_finished(events, 60000) == {"doubled": 10}
        counts = await producer.get_job_counts("completed", "failed", "waiting", "active", "delayed")
        assert counts == {"completed": 11, "failed": 0, "waiting": 0, "active": 0, "delayed": 0}, counts
        stored = await producer.get_job(retried.id)
        assert stored is not None and stored.attempts_made == 2
        assert errors == [], errors
    finally:
        await worker.close()
        await asyncio.wait_for(run, 60)
        for closing in (events, flows, producer):
            await closing.close()


async def first_refusal(roles: Roles) -> BaseException:
    """A producer adds (one job, a bulk) and a worker with QueueEvents runs: the first error any of
    them raised or emitted."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    producer = Queue(name, roles.url("bullmq_producer"), schema=roles.schema)
    events = QueueEvents(name, roles.url("bullmq_worker"), schema=roles.schema, autorun=False)

    async def process(job: Any) -> int:
        return 1

    worker = Worker(name, process, roles.url("bullmq_worker"), schema=roles.schema, autorun=False)
    errors: list[BaseException] = []
    worker.on("error", errors.append)
    run = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        for step in (lambda: producer.add("n", {}), lambda: producer.add_bulk([{"name": "b", "data": {}}] * 3),
                     events.wait_until_ready):
            try:
                await asyncio.wait_for(step(), 60)
            except Exception as err:  # noqa: BLE001 - what we look at
                errors.append(err)
        await wait_until(lambda: errors or run.done(), 60, "an error")
        if run.done() and run.exception() is not None:
            errors.append(run.exception())  # type: ignore[arg-type]
        return errors[0]
    finally:
        await worker.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, 60)
        await events.close()
        await producer.close()


# every documented grant but the roles themselves, and what its absence says
MISSING = [
    ("USAGE ON SCHEMA", "permission denied for schema"),
    ("SELECT ON bullmq.migration", "permission denied for table migration"),
    ("SELECT, INSERT, UPDATE, DELETE ON", "permission denied for table"),
    ("ON SEQUENCE", "permission denied for sequence job_seq"),
    ("EXECUTE ON ALL FUNCTIONS", "permission denied for function"),
    ("CREATE ON SCHEMA", "permission denied for schema"),
    ("CONNECT ON DATABASE", "permission denied for database"),
    ("TEMPORARY ON DATABASE", "permission denied to create temporary tables"),
]


def test_every_documented_grant_is_tried_without() -> None:
    grants = [s for s in documented_grants() if s.startswith("GRANT")]
    for statement in grants:
        assert sum(missing in statement for missing, _ in MISSING) == 1, statement
    assert len(grants) == len(MISSING)


@pytest.mark.parametrize("missing, message", MISSING, ids=[m for m, _ in MISSING])
async def test_each_documented_grant_is_needed_and_its_absence_named(roles: Roles, missing: str,
                                                                      message: str) -> None:
    await roles.set_up(drop=missing)
    err = await first_refusal(roles)
    assert message in str(err), repr(err)
    for secret in roles.passwords.values():
        assert secret not in str(err) + repr(err)


async def test_without_the_default_privileges_a_second_role_cannot_add_to_the_queue(roles: Roles) -> None:
    await roles.set_up(drop="ALTER DEFAULT PRIVILEGES")
    name = f"q-{uuid.uuid4().hex[:8]}"
    async with Queue(name, roles.url("bullmq_producer"), schema=roles.schema) as producer:
        await producer.add("n", {})  # creates the queue's id sequence, owned by the producer role
    async with Queue(name, roles.url("bullmq_worker"), schema=roles.schema) as other:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for sequence bullmq_jid_"):
            await other.add("n", {})


def test_the_cli_says_which_permission_is_missing(roles: Roles) -> None:
    asyncio.run(roles.set_up(drop="EXECUTE ON ALL FUNCTIONS"))
    result = subprocess.run([sys.executable, "-m", "bullmq_compat", "add", "--queue", "q", "--name", "n",
                             "--postgres", roles.url("bullmq_producer"), "--schema", roles.schema],
                            cwd=str(DOC.parent.parent), capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and "permission denied for function" in output, output
    assert output.startswith("bullmq-compat: ") and roles.passwords[roles.names["bullmq_producer"]] not in output


async def test_a_worker_without_write_rights_on_job_says_which_table(roles: Roles) -> None:
    """A worker role granted only SELECT on the tables: the claim fails naming ``job``, as an
    ``error`` event, and the worker keeps running (it retries)."""
    await roles.set_up()
    name = f"q-{uuid.uuid4().hex[:8]}"
    producer = Queue(name, roles.url("bullmq_producer"), schema=roles.schema)
    await producer.add("n", {})
    with psycopg.connect(roles.url(roles.owner), autocommit=True) as owner:
        owner.execute(f'REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{roles.schema}" '
                      f"FROM {roles.names['bullmq_app']}")
    done: list[Any] = []

    async def process(job: Any) -> None:
        done.append(job.id)

    worker = Worker(name, process, roles.url("bullmq_worker"), schema=roles.schema, autorun=False)
    errors: list[BaseException] = []
    worker.on("error", errors.append)
    run = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await wait_until(lambda: errors or run.done(), 60, "the worker's error")
        assert not run.done() or run.exception() is None
        assert "permission denied for table" in str(errors[0]), repr(errors[0])
        assert done == []
    finally:
        await worker.close()
        await asyncio.wait_for(run, 60)
        await producer.close()
