"""The sync API and the `bullmq-compat` command line on PostgreSQL (``--postgres URL --schema S``).

Each test works in a schema of its own (conftest's ``pg_schema``, dropped afterwards); the CLI runs
as a subprocess, as users run it. Waits poll for a condition with generous bounds.
"""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bullmq_compat import Worker, migrate_postgres, sync
from tests._postgres_server import free_port

ROOT = Path(__file__).resolve().parent.parent
BAD_URL = "postgresql://app:secret@127.0.0.1:1/x"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def ledger(url: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(f'SELECT version, name, min_client_version, applied_at FROM "{schema}".migration '
                            "ORDER BY version").fetchall()


def wait_for(check: Any, timeout: float = 30.0, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(0.1)


# -- the sync API ------------------------------------------------------------------------------------
def test_sync_queue_on_postgres_migrates_adds_and_reads(postgres_url: str, pg_schema: str) -> None:
    queue = sync.Queue("emails", connection=postgres_url, schema=pg_schema, migrate=True)
    try:
        job = queue.add("send", {"to": "a@b"}, attempts=3)
        assert job.id == "1" and job.name == "send" and job.opts["attempts"] == 3
        assert job.get_state() == "waiting"
        later = queue.add("later", {"n": 2}, delay=60_000)
        assert later.get_state() == "delayed"
        bulk = queue.add_bulk([{"name": "b", "data": {"i": i}} for i in range(3)])
        assert [j.id for j in bulk] == ["3", "4", "5"]
        got = queue.get_job(job.id)
        assert isinstance(got, sync.Job) and got.data == {"to": "a@b"} and got.opts["attempts"] == 3
        assert queue.get_job("nope") is None
        assert queue.get_job_counts("waiting", "delayed") == {"waiting": 4, "delayed": 1}
        assert queue.backend.kind == "postgres"
    finally:
        queue.close()
    # really in that schema (migrate=True made it: version 11), not in the default "bullmq"
    assert [row[0] for row in ledger(postgres_url, pg_schema)] == list(range(1, 12))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{pg_schema}".job WHERE queue = %s',
                            ["emails"]).fetchone() == (5,)


def test_sync_queue_events_see_a_job_finish_on_postgres(postgres_url: str, pg_schema: str) -> None:
    asyncio.run(migrate_postgres(postgres_url, pg_schema))
    queue = sync.Queue("q", connection=postgres_url, schema=pg_schema)
    events = sync.QueueEvents("q", connection=postgres_url, schema=pg_schema)

    async def double(job: Any) -> Any:
        return {"double": job.data["i"] * 2}

    async def make_worker() -> Worker:
        return Worker("q", double, postgres_url, schema=pg_schema, concurrency=2)

    worker = sync.run(make_worker())
    running = sync.run(_start(worker))
    try:
        job = queue.add("d", {"i": 21})
        assert job.wait_until_finished(events, 30_000) == {"double": 42}  # (ms, as Node's ttl)
        assert queue.get_job(job.id).returnvalue == {"double": 42}
        assert queue.get_job_counts("completed") == {"completed": 1}
    finally:
        sync.run(worker.close())
        sync.run(_await(running))
        events.close()
        queue.close()


async def _start(worker: Worker) -> "asyncio.Future[Any]":
    return asyncio.ensure_future(worker.run(handle_signals=False))


async def _await(future: "asyncio.Future[Any]") -> None:
    await asyncio.wait_for(future, 30)


def test_a_sync_queue_on_an_unmigrated_schema_says_to_migrate(postgres_url: str, pg_schema: str) -> None:
    from bullmq_compat import SchemaMigrationRequired

    queue = sync.Queue("q", connection=postgres_url, schema=pg_schema)
    try:
        with pytest.raises(SchemaMigrationRequired):
            queue.add("x", {})
    finally:
        queue.close()


# -- the CLI: migrate, add, info -----------------------------------------------------------------------
def test_cli_migrate_prints_the_version_and_is_a_no_op_the_second_time(postgres_url: str, pg_schema: str) -> None:
    first = cli("migrate", "--postgres", postgres_url, "--schema", pg_schema)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("version 11") and pg_schema in first.stdout, first.stdout
    before = ledger(postgres_url, pg_schema)
    assert [(v, n, m) for v, n, m, _ in before][-1] == (11, "0011_obliterate_producer_lock", 6)
    assert len(before) == 11
    second = cli("migrate", "--postgres", postgres_url, "--schema", pg_schema)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert ledger(postgres_url, pg_schema) == before  # nothing re-applied: same rows, same applied_at


def test_cli_migrate_groups_installs_the_gate_info_lists_groups_and_drop_groups_removes_it(
        postgres_url: str, pg_schema: str) -> None:
    pg = ["--postgres", postgres_url, "--schema", pg_schema]
    installed = cli("migrate", *pg, "--groups")
    assert installed.returncode == 0, installed.stderr
    assert "version 11 with bullmq-compat's group objects" in installed.stdout, installed.stdout
    node_ledger = ledger(postgres_url, pg_schema)
    assert len(node_ledger) == 11  # Node's ledger: ours is a table of its own
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        ours = conn.execute(f'SELECT version, name FROM "{pg_schema}".bullmq_compat_migration').fetchall()
    assert ours == [(1, "0001_group_gate"), (2, "0002_group_max_size"), (3, "0003_group_priority"),
        (4, "0004_group_rate_limit"), (5, "0005_group_start_clock"), (6, "0006_group_release_statement")]
    assert cli("migrate", *pg, "--groups").stdout == installed.stdout  # a no-op the second time
    for i in range(3):
        added = cli("add", *pg, "--queue", "mail", "--name", "n", "--opts", '{"group": {"id": "user:1"}}')
        assert added.returncode == 0, added.stderr
    info = cli("info", *pg, "--queue", "mail")
    assert info.returncode == 0, info.stderr
    rows = [line.split() for line in info.stdout.splitlines()]
    assert ["waiting-children", "2"] in rows and ["waiting", "1"] in rows, info.stdout
    assert ["user:1", "2", "1", "1"] in rows, info.stdout  # group, held, released, concurrency

    both = cli("migrate", *pg, "--groups", "--drop-groups")
    assert both.returncode == 2 and "give one" in both.stderr
    dropped = cli("migrate", *pg, "--drop-groups")
    assert dropped.returncode == 0, dropped.stderr
    assert "2 held group jobs released to wait" in dropped.stdout, dropped.stdout
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = %s AND c.relname LIKE 'bullmq_compat%%'", [pg_schema]).fetchone()
        functions = conn.execute("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                                 "WHERE n.nspname = %s AND p.proname LIKE 'bullmq_compat%%'", [pg_schema]).fetchone()
    assert left == (0,) and functions == (0,)
    assert ledger(postgres_url, pg_schema) == node_ledger
    after = cli("info", *pg, "--queue", "mail")
    assert ["waiting", "3"] in [line.split() for line in after.stdout.splitlines()], after.stdout


def test_cli_migrate_without_postgres_says_what_it_needs() -> None:
    result = cli("migrate", "--redis", "redis://127.0.0.1:1/0")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "migrate needs --postgres URL" in result.stderr


def test_cli_add_then_info_lists_the_schemas_queues_with_counts(postgres_url: str, pg_schema: str) -> None:
    assert cli("migrate", "--postgres", postgres_url, "--schema", pg_schema).returncode == 0
    pg = ["--postgres", postgres_url, "--schema", pg_schema]
    added = cli("add", *pg, "--queue", "mail", "--name", "n", "--data", '{"i": 1}')
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "1"
    bulk = cli("add", *pg, "--queue", "mail", "--name", "n", "--count", "1500")
    assert bulk.returncode == 0 and "added 1500 jobs to mail" in bulk.stdout, bulk.stderr
    later = cli("add", *pg, "--queue", "sms", "--name", "n", "--opts", '{"delay": 60000}')
    assert later.returncode == 0 and later.stdout.strip() == "1", later.stderr

    info = cli("info", *pg)
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert "queue mail" in lines and "queue sms" in lines
    mail = lines[lines.index("queue mail"):lines.index("queue sms")]
    sms = lines[lines.index("queue sms"):]
    assert ["waiting", "1501"] in [line.split() for line in mail]
    assert ["delayed", "1"] in [line.split() for line in sms] and ["waiting", "0"] in [line.split() for line in sms]

    one = cli("info", *pg, "--queue", "sms")
    assert one.returncode == 0 and "queue sms" in one.stdout and "queue mail" not in one.stdout

    # the schema is the namespace: another one shows none of these queues
    other = pg_schema + "_other"
    try:
        assert cli("migrate", "--postgres", postgres_url, "--schema", other).returncode == 0
        empty = cli("info", "--postgres", postgres_url, "--schema", other)
        assert empty.returncode == 0 and "no queues" in empty.stdout and "queue mail" not in empty.stdout
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')


# -- the CLI: worker ----------------------------------------------------------------------------------
def test_cli_worker_processes_jobs_and_stops_gracefully_on_sigterm(postgres_url: str, pg_schema: str) -> None:
    asyncio.run(migrate_postgres(postgres_url, pg_schema))
    queue = sync.Queue("work", connection=postgres_url, schema=pg_schema)
    try:
        ids = [queue.add("d", {"i": i}).id for i in range(5)]
        proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "worker", "tests.cli_jobs:double",
                                 "--queue", "work", "--postgres", postgres_url, "--schema", pg_schema,
                                 "--concurrency", "2", "--name", "cli-w"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def values() -> list[Any]:
                return [queue.get_job(i).returnvalue for i in ids]

            wait_for(lambda: None not in values(), 30, "the CLI worker to finish the jobs")
            assert values() == [{"double": 2 * i} for i in range(5)]
            # it is listed as Node lists its Postgres workers (the LISTEN session's name)
            wait_for(lambda: any(w.get("name") == "cli-w" or "cli-w" in w.get("rawname", "")
                                 for w in queue.get_workers()), 15, "the worker in getWorkers")
            late = queue.add("d", {"i": 50})  # idle now: LISTEN wakes it
            wait_for(lambda: queue.get_job(late.id).returnvalue == {"double": 100}, 15, "the late job")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out = proc.stdout.read() if proc.stdout else ""
        err = proc.stderr.read() if proc.stderr else ""
        assert "processing work with tests.cli_jobs:double" in out, (out, err)
        assert "Traceback" not in err, err
        assert queue.get_job_counts("completed", "active") == {"completed": 6, "active": 0}
    finally:
        queue.close()


# -- the CLI: board --------------------------------------------------------------------------------------
def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return lines


@pytest.mark.parametrize("read_only", [False, True])
def test_cli_board_serves_the_schemas_queues(postgres_url: str, pg_schema: str, read_only: bool) -> None:
    asyncio.run(migrate_postgres(postgres_url, pg_schema))
    queue = sync.Queue("shown", connection=postgres_url, schema=pg_schema)
    # the local server trusts: a password in the URL is ignored by it, and must show on no command line
    secret = "pg-s3cret-Qz8"
    url = postgres_url.replace("postgresql://postgres@", f"postgresql://postgres:{secret}@", 1)
    port = free_port()
    argv = [sys.executable, "-m", "bullmq_compat", "board", "--json", "--postgres", url, "--schema", pg_schema,
            "--queue", "shown", "--port", str(port)] + (["--read-only"] if read_only else [])
    try:
        queue.add("a", {"x": 1})
        queue.add("b", {"x": 2}, delay=3_600_000)
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"the board printed nothing: {proc.stderr.read() if proc.stderr else ''}"
            assert json.loads(line) == {"listening": f"http://127.0.0.1:{port}/", "readOnly": read_only}
            # the CLI's own argv has the URL (the user typed it); the node child's must not
            assert not any(secret in cmd for cmd in _command_lines() if "board.js" in cmd)
            api = f"http://127.0.0.1:{port}/api/queues"
            listed = _get_json(f"{api}?activeQueue=shown&status=waiting&page=1")
            [entry] = listed["queues"]
            assert entry["name"] == "shown"
            assert entry["counts"]["waiting"] == 1 and entry["counts"]["delayed"] == 1
            assert [j["name"] for j in entry["jobs"]] == ["a"]
            job = _get_json(f"{api}/shown/1")
            assert job["job"]["data"] == {"x": 1}
            promote = urllib.request.Request(f"{api}/shown/promote", method="PUT")
            if read_only:
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(promote, timeout=30)
                assert refused.value.code == 405
                assert queue.get_job_counts("delayed", "waiting") == {"delayed": 1, "waiting": 1}
            else:
                with urllib.request.urlopen(promote, timeout=30) as response:
                    assert response.status == 200
                assert queue.get_job_counts("delayed", "waiting") == {"delayed": 0, "waiting": 2}
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        assert secret not in err and "Traceback" not in err, err
    finally:
        queue.close()


# -- errors: one line, exit 2, no password -----------------------------------------------------------------
@pytest.mark.parametrize("command", [
    ["migrate"],
    ["info"],
    ["info", "--queue", "q"],
    ["add", "--queue", "q", "--name", "n", "--data", "{}"],
])
def test_cli_errors_on_postgres_mask_the_password(command: list[str]) -> None:
    result = cli(*command, "--postgres", BAD_URL, "--schema", "s")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "secret" not in result.stderr and "secret" not in result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "postgresql://app:***@127.0.0.1:1/x" in lines[0], lines[0]


def test_cli_worker_on_an_unreachable_postgres_retries_masked_and_stops_on_sigterm() -> None:
    """A worker outlives its server being away (it reconnects): it says so without the password."""
    proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "worker", "tests.cli_jobs:double", "--queue",
                             "q", "--postgres", BAD_URL, "--schema", "s"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = proc.stderr.readline()  # its first complaint
        assert "postgresql://app:***@127.0.0.1:1/x" in line and "secret" not in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        out, err = proc.communicate(timeout=10)
        assert "secret" not in out + err and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_board_error_on_postgres_masks_the_password() -> None:
    result = cli("board", "--postgres", BAD_URL, "--schema", "s", "--queue", "q", "--port", str(free_port()))
    assert result.returncode != 0
    assert "secret" not in result.stderr and "secret" not in result.stdout, result.stderr
