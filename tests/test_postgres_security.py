"""PostgreSQL security: TLS with ``sslmode=verify-full`` and ``sslrootcert``, and secrets never
printed (the PostgreSQL half of tests/test_secrets.py).

The server is the test's own cluster (``ssl=on``, a CA and server certificate made at run time by
``tests._tls.make_pki``): the shared server trusts everyone, where a wrong password must really be
refused. ``pg_hba.conf`` lets the application role in over TLS only, with a scram-sha-256
password, so a job that is added and processed went over TLS.

The failures: connection refused, wrong password (in the URL and in its query), unknown host, TLS
verification failure (a CA that did not sign the server's certificate), a schema never migrated
(`SchemaMigrationRequired`), a URL libpq cannot parse (libpq quotes the bad token: here the
password) and a password holding an unencoded ``/``; each for Queue, Worker, QueueEvents and
FlowProducer, and for the CLI with ``--postgres``. The secret is in no message, chained
traceback, ``repr()``, log record or CLI output.
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import traceback
import uuid
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from bullmq_compat import (
    FlowProducer,
    PostgresUnavailable,
    Queue,
    QueueEvents,
    SchemaMigrationRequired,
    Worker,
    migrate_postgres,
)
from bullmq_compat._errors import BullMQCompatError, InvalidArgument
from bullmq_compat._secrets import redact_url
from tests._postgres_server import PostgresServer, free_port
from tests._tls import PKI, make_pki
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cretpw-Zq7"  # what must appear nowhere
RIGHT_PASSWORD = "the-right-one-Kx2"
ROLE = "app"
SCHEMA = "jobs"  # migrated once by the module fixture


class TLSPostgres:
    def __init__(self) -> None:
        self.pki_dir = Path(tempfile.mkdtemp(prefix="bullmq-compat-pgtls-"))
        self.pki: PKI = make_pki(self.pki_dir)
        self.server = PostgresServer(ssl_files=(str(self.pki.cert), str(self.pki.key)), hba=[
            "local all all trust",
            "host all postgres 127.0.0.1/32 trust",      # the test's own checks
            "hostnossl all all 127.0.0.1/32 reject",     # everyone else: TLS only ...
            "hostssl all all 127.0.0.1/32 scram-sha-256",  # ... and a password
        ])

    def url(self, password: str = RIGHT_PASSWORD, ca: Any = None, port: Any = None, host: str = "127.0.0.1",
            extra: str = "") -> str:
        ca = self.pki.ca if ca is None else ca
        return (f"postgresql://{ROLE}:{password}@{host}:{port or self.server.port}/postgres"
                f"?sslmode=verify-full&sslrootcert={ca}{extra}")

    def admin(self) -> "psycopg.Connection[Any]":
        return psycopg.connect(self.server.url, autocommit=True)


@pytest.fixture(scope="module")
def tls_pg() -> Iterator[TLSPostgres]:
    made = TLSPostgres()
    made.server.start()
    try:
        with made.admin() as admin:
            admin.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{RIGHT_PASSWORD}'")
            admin.execute(f"GRANT CREATE ON DATABASE postgres TO {ROLE}")
        asyncio.run(migrate_postgres(made.url(), SCHEMA))  # as the role, over TLS
        yield made
    finally:
        made.server.stop()
        import shutil

        shutil.rmtree(made.pki_dir, ignore_errors=True)


@pytest.fixture
def name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


# -- TLS ------------------------------------------------------------------------------------------

def app_sessions(tls_pg: TLSPostgres) -> list[tuple[bool, str]]:
    """(ssl, application_name) of every session the application role has open now."""
    with tls_pg.admin() as admin:
        return [(bool(ssl), str(app or "")) for ssl, app in admin.execute(
            "SELECT s.ssl, a.application_name FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.usename = %s", [ROLE]).fetchall()]


async def test_verify_full_with_the_right_ca_carries_a_job_from_queue_to_worker(tls_pg: TLSPostgres,
                                                                                 name: str) -> None:
    url = tls_pg.url()
    queue = Queue(name, url, schema=SCHEMA)
    events = QueueEvents(name, url, schema=SCHEMA)
    flows = FlowProducer(url, schema=SCHEMA)

    async def process(job: Any) -> Any:
        return {"echo": job.data["n"]}

    worker = Worker(name, process, url, schema=SCHEMA, autorun=False)
    errors: list[BaseException] = []
    worker.on("error", errors.append)
    run = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await events.wait_until_ready()
        job = await queue.add("n", {"n": 7})
        assert await job.wait_until_finished(events, 60000) == {"echo": 7}
        tree = await flows.add({"name": "p", "queue_name": name, "data": {"n": 1},
                                "children": [{"name": "c", "queue_name": name, "data": {"n": 2}}]})
        assert await tree.job.wait_until_finished(events, 60000) == {"echo": 1}
        sessions = await asyncio.to_thread(app_sessions, tls_pg)
        names = [app for _, app in sessions]
        assert name in names, sessions  # the worker's named session (Node's getWorkers finds it)
        assert f"{name}:qe" in names, sessions  # QueueEvents' session
        assert sessions and all(ssl for ssl, _ in sessions), sessions  # hba refuses plain anyway
        assert errors == []
    finally:
        await worker.close()
        await asyncio.wait_for(run, 60)
        for closing in (flows, events, queue):
            await closing.close()


async def test_a_wrong_ca_is_refused_with_a_clear_error(tls_pg: TLSPostgres, name: str) -> None:
    url = tls_pg.url(ca=tls_pg.pki.other_ca)
    queue = Queue(name, url, schema=SCHEMA)
    try:
        with pytest.raises(PostgresUnavailable) as caught:
            await asyncio.wait_for(queue.add("n", {}), 60)
    finally:
        await queue.close()
    message = str(caught.value)
    assert f"could not connect to PostgreSQL at {redact_url(url)}" in message, message
    assert "certificate verify failed" in message, message
    assert "TLS certificate did not verify: check that sslrootcert=" in message, message  # what to do
    with tls_pg.admin() as admin:  # nothing was written
        assert admin.execute(f'SELECT count(*) FROM "{SCHEMA}".job WHERE queue = %s', [name]).fetchone() == (0,)


@pytest.mark.parametrize("case, libpq_says", [
    ("host name not in the certificate", "does not match host name"),
    ("no such sslrootcert file", "root certificate file"),
])
async def test_other_verification_failures_say_what_to_check(tls_pg: TLSPostgres, name: str, case: str,
                                                              libpq_says: str) -> None:
    if case.startswith("host name"):  # the right server (hostaddr), named by a host its certificate lacks
        url = tls_pg.url(host="wrong-name.invalid", extra="&hostaddr=127.0.0.1")
    else:
        url = tls_pg.url(ca=tls_pg.pki_dir / "no-such-ca.pem")
    queue = Queue(name, url, schema=SCHEMA)
    try:
        with pytest.raises(PostgresUnavailable) as caught:
            await asyncio.wait_for(queue.add("n", {}), 60)
    finally:
        await queue.close()
    message = str(caught.value)
    assert libpq_says in message and "TLS certificate did not verify" in message, message
    assert RIGHT_PASSWORD not in message


def test_a_plain_connection_is_refused_by_the_server(tls_pg: TLSPostgres) -> None:
    """The hba this test relies on: without TLS the role is not let in at all."""
    plain = f"postgresql://{ROLE}:{RIGHT_PASSWORD}@127.0.0.1:{tls_pg.server.port}/postgres?sslmode=disable"
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain, connect_timeout=10)


# -- secrets never printed ------------------------------------------------------------------------

def failures(tls_pg: TLSPostgres) -> dict[str, tuple[str, str]]:
    """failure -> (connection, schema)."""
    port = tls_pg.server.port
    return {
        "refused": (tls_pg.url(SECRET, port=free_port(), extra="&connect_timeout=10"), SCHEMA),
        "wrong password": (tls_pg.url(SECRET), SCHEMA),
        "wrong password in the query": (
            f"postgresql://127.0.0.1:{port}/postgres?user={ROLE}&password={SECRET}&sslmode=verify-full"
            f"&sslrootcert={tls_pg.pki.ca}", SCHEMA),
        "unknown host": (tls_pg.url(SECRET, host="no-such-host.invalid", extra="&connect_timeout=10"), SCHEMA),
        "TLS verify failure": (tls_pg.url(SECRET, ca=tls_pg.pki.other_ca), SCHEMA),
        "missing schema": (tls_pg.url(RIGHT_PASSWORD), "never_migrated"),
        "unparsable URL": (tls_pg.url(SECRET + "%zz"), SCHEMA),
        "password with an unencoded /": (tls_pg.url(SECRET + "/x"), SCHEMA),
    }


FAILURE_NAMES = ["refused", "wrong password", "wrong password in the query", "unknown host", "TLS verify failure",
                 "missing schema", "unparsable URL", "password with an unencoded /"]
KINDS = ["Queue", "Worker", "QueueEvents", "FlowProducer"]


def secrets_for(failure: str) -> list[str]:
    # the missing-schema case logs in for real: there the right password must not show either
    return [RIGHT_PASSWORD] if failure == "missing schema" else [SECRET]


async def noop(job: Any) -> None:
    return None


async def provoke(kind: str, connection: str, schema: str, queue_name: str) -> tuple[BaseException, list[str]]:
    """Make ``kind`` fail on ``connection``: its exception and every text it showed."""
    shown: list[str] = []
    obj: Any = None
    try:
        if kind == "Queue":
            obj = Queue(queue_name, connection, schema=schema)
            shown.append(repr(obj))
            await obj.add("n", {})
        elif kind == "FlowProducer":
            obj = FlowProducer(connection, schema=schema)
            shown.append(repr(obj))
            await obj.add({"name": "n", "queue_name": queue_name, "data": {}})
        elif kind == "QueueEvents":
            obj = QueueEvents(queue_name, connection, schema=schema, autorun=False)
            shown.append(repr(obj))
            await obj.wait_until_ready()
        elif kind == "Worker":
            obj = Worker(queue_name, noop, connection, schema=schema, autorun=False)
            shown.append(repr(obj))
            errors: list[BaseException] = []
            obj.on("error", errors.append)
            task = asyncio.ensure_future(obj.run(handle_signals=False))
            try:
                await wait_until(lambda: errors or task.done(), 60, "the worker's error")
            finally:
                await obj.close()
                try:
                    await asyncio.wait_for(task, 60)
                except BaseException as err:  # noqa: BLE001 - a worker may stop on a fatal error
                    errors.append(err)
            assert errors, "the worker reported no error"
            raise errors[0]
    except BaseException as err:  # noqa: BLE001 - what we look at
        shown += [str(err), repr(err), "".join(traceback.format_exception(err))]
        return err, shown
    finally:
        if obj is not None:
            await obj.close()
    raise AssertionError(f"{kind} did not fail")


@pytest.mark.parametrize("failure", FAILURE_NAMES)
@pytest.mark.parametrize("kind", KINDS)
async def test_no_failure_shows_the_password(kind: str, failure: str, tls_pg: TLSPostgres, name: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    connection, schema = failures(tls_pg)[failure]
    caplog.set_level(logging.DEBUG)  # every logger: ours, psycopg's, psycopg_pool's, asyncio's
    err, shown = await asyncio.wait_for(provoke(kind, connection, schema, name), 120)
    assert isinstance(err, BullMQCompatError), repr(err)
    logs = [record.getMessage() for record in caplog.records]
    logs += [logging.Formatter().formatException(r.exc_info) for r in caplog.records if r.exc_info]
    for text in shown + logs:
        for secret in secrets_for(failure):
            assert secret not in text, text
    message = str(err)
    if failure == "missing schema":
        assert isinstance(err, SchemaMigrationRequired) and "'never_migrated'" in message, message
    elif failure == "unparsable URL":
        assert isinstance(err, InvalidArgument) and "is not a PostgreSQL connection string" in message, message
    elif failure == "password with an unencoded /":
        assert "postgresql://app:***@127.0.0.1:" in message or "***" in message, message
    else:
        assert isinstance(err, PostgresUnavailable), repr(err)
        assert f"could not connect to PostgreSQL at {redact_url(connection)}" in message, message
        if failure == "TLS verify failure":
            assert "certificate verify failed" in message, message
            assert "TLS certificate did not verify: check that sslrootcert=" in message, message
        elif failure.startswith("wrong password"):
            assert f'password authentication failed for user "{ROLE}"' in message, message
    if kind != "Worker" and kind != "QueueEvents":  # these two do not name their connection in repr()
        assert "***" in shown[0] or "password" not in connection, shown[0]


# -- the command line -----------------------------------------------------------------------------

def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=str(ROOT), capture_output=True,
                          text=True, timeout=timeout, env={**os.environ})


@pytest.mark.parametrize("failure", FAILURE_NAMES)
def test_the_cli_never_prints_the_password(failure: str, tls_pg: TLSPostgres) -> None:
    url, schema = failures(tls_pg)[failure]
    commands = [["add", "--queue", "q", "--name", "n", "--data", "{}"], ["info"], ["pause", "--queue", "q"]]
    if failure != "missing schema":  # (migrate would create it)
        commands.append(["migrate"])
    for argv in commands:
        result = cli(*argv, "--postgres", url, "--schema", schema)
        output = result.stdout + result.stderr
        assert result.returncode == 2, (argv, output)
        for secret in secrets_for(failure):
            assert secret not in output, output
        assert "Traceback" not in output, output
        assert output.startswith("bullmq-compat: "), output
        if failure == "TLS verify failure":
            assert "certificate verify failed" in output and "TLS certificate did not verify" in output, output
        if failure == "missing schema":
            assert "is not initialized" in output, output


def test_the_cli_works_over_verify_full(tls_pg: TLSPostgres, name: str) -> None:
    """The right CA: the CLI adds over TLS and `info` names the connection with its password masked."""
    url = tls_pg.url()
    result = cli("add", "--queue", name, "--name", "n", "--data", "{}", "--postgres", url, "--schema", SCHEMA)
    assert result.returncode == 0, result.stderr
    result = cli("info", "--queue", name, "--postgres", url, "--schema", SCHEMA)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert RIGHT_PASSWORD not in output, output
