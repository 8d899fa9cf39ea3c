"""PostgresConnection: search_path on every connection, named LISTEN sessions, checks on connect,
and errors that name the address without its password."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import psycopg_pool
import pytest

from bullmq_compat import (
    InvalidSchemaName,
    PostgresUnavailable,
    SchemaMigrationRequired,
    migrate_postgres,
)
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._backends.postgres.driver import mask_password
from tests._postgres_server import free_port

ROOT = Path(__file__).resolve().parent.parent


async def test_connect_with_migrate_true_migrates_the_schema(postgres_url: str, pg_schema: str) -> None:
    conn = PostgresConnection(postgres_url, schema=pg_schema, migrate=True)
    try:
        assert await conn.connect() == 11
        assert (await conn.execute("SELECT count(*)::int AS n FROM migration")).rows == [{"n": 11}]
    finally:
        await conn.close()


async def test_connect_without_migrate_refuses_an_uninitialized_schema(postgres_url: str, pg_schema: str) -> None:
    conn = PostgresConnection(postgres_url, schema=pg_schema)
    try:
        with pytest.raises(SchemaMigrationRequired):
            await conn.connect()
    finally:
        await conn.close()


async def test_every_pooled_connection_resolves_names_in_the_schema(postgres_url: str, pg_migrated: str) -> None:
    conn = PostgresConnection(postgres_url, schema=pg_migrated)
    try:
        await conn.connect()
        rows = (await conn.execute("SELECT current_setting('search_path') AS sp, current_schema() AS cs")).rows
        assert rows == [{"sp": f'"{pg_migrated}"', "cs": pg_migrated}]
    finally:
        await conn.close()


async def test_options_given_in_the_url_are_kept_beside_the_search_path(postgres_url: str, pg_migrated: str) -> None:
    sep = "&" if "?" in postgres_url else "?"
    conn = PostgresConnection(f"{postgres_url}{sep}options=-c%20statement_timeout%3D4321", schema=pg_migrated)
    try:
        await conn.connect()
        rows = (await conn.execute("SELECT current_setting('statement_timeout') AS t, current_schema() AS s")).rows
        assert rows == [{"t": "4321ms", "s": pg_migrated}]
    finally:
        await conn.close()


async def test_a_listen_session_carries_its_application_name_and_the_search_path(
        postgres_url: str, pg_migrated: str) -> None:
    conn = PostgresConnection(postgres_url, schema=pg_migrated)
    try:
        listen = await conn.open_listen_session("emails:w:w1")
        cur = await listen.execute("SELECT current_setting('application_name'), current_schema()")
        assert await cur.fetchone() == ("emails:w:w1", pg_migrated)
        names = [r["application_name"] for r in (await conn.run("get_client_list")).rows]
        assert "emails:w:w1" in names
        await conn.close_listen_session(listen)
        assert listen.closed
    finally:
        await conn.close()


async def test_pooled_query_connections_stay_unnamed(postgres_url: str, pg_migrated: str) -> None:
    conn = PostgresConnection(postgres_url, schema=pg_migrated)
    try:
        await conn.connect()
        rows = (await conn.execute("SELECT current_setting('application_name') AS name")).rows
        assert rows == [{"name": ""}]
    finally:
        await conn.close()


async def test_a_pool_passed_in_is_used_and_left_open(postgres_url: str, pg_migrated: str) -> None:
    pool = psycopg_pool.AsyncConnectionPool(postgres_url, min_size=1, max_size=2, open=False,
                                            kwargs={"options": f'-c search_path="{pg_migrated}"'})
    await pool.open()
    try:
        conn = PostgresConnection(pool, schema=pg_migrated)
        assert await conn.connect() == 11
        assert (await conn.run("get_counts", ["q"])).rows[0]["waiting"] == 0
        listen = await conn.open_listen_session("q:qe")
        await conn.close()
        assert listen.closed
        assert not pool.closed
        async with pool.connection() as c:
            await c.execute("SELECT 1")
    finally:
        await pool.close()


async def test_adds_through_a_users_pool_without_autocommit_are_committed(postgres_url: str, pg_migrated: str,
                                                                          queue_name: str) -> None:
    """A pool configured as docs/postgres.md shows it (options only: psycopg's default autocommit
    off): each command is committed, not rolled back when the session goes back to the pool."""
    from bullmq_compat import Queue

    pool = psycopg_pool.AsyncConnectionPool(postgres_url, min_size=1, max_size=2, open=False,
                                            kwargs={"options": f'-c search_path="{pg_migrated}"'})
    await pool.open()
    queue = Queue(queue_name, connection=pool, schema=pg_migrated)
    try:
        job = await queue.add("kept", {"n": 1})
        await queue.add_bulk([{"name": "kept", "data": {"n": 2}}])
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as other:
            cur = await other.execute(f'SELECT count(*) FROM "{pg_migrated}".job WHERE queue = %s', [queue_name])
            assert (await cur.fetchone())[0] == 2
        assert (await queue.get_job(str(job.id))) is not None
    finally:
        await queue.close()
        await pool.close()


def test_a_bad_schema_name_is_refused_before_connecting() -> None:
    with pytest.raises(InvalidSchemaName, match="'a-b'"):
        PostgresConnection("postgresql://postgres@127.0.0.1:1/test", schema="a-b")


async def test_the_password_never_appears_in_a_connection_error() -> None:
    url = f"postgresql://postgres:s3cret-Pa55@127.0.0.1:{free_port()}/test?connect_timeout=2"
    conn = PostgresConnection(url, schema="bullmq")
    try:
        with pytest.raises(PostgresUnavailable) as info:
            await conn.connect()
    finally:
        await conn.close()
    message = str(info.value)
    assert "s3cret-Pa55" not in message
    assert "postgresql://postgres:***@127.0.0.1:" in message
    with pytest.raises(PostgresUnavailable) as info:
        await migrate_postgres(url, "bullmq")
    assert "s3cret-Pa55" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize("given, shown", [
    ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("postgresql://h/db?password=pw&sslmode=off", "postgresql://h/db?password=***&sslmode=off"),
    ("host=h password=pw dbname=d", "host=h password=*** dbname=d"),
    ("host=h password='p w' dbname=d", "host=h password=*** dbname=d"),
])
def test_connection_strings_are_shown_with_the_password_masked(given: str, shown: str) -> None:
    assert mask_password(given) == shown


def test_without_psycopg_the_package_imports_and_a_postgres_connection_names_the_extra() -> None:
    script = (
        "import sys\n"
        "sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import bullmq_compat\n"
        "from bullmq_compat._backends.postgres.connection import PostgresConnection\n"
        "try:\n"
        "    PostgresConnection('postgresql://postgres@127.0.0.1/test')\n"
        "except bullmq_compat.PostgresDriverMissing as err:\n"
        "    print(err)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert "pip install 'bullmq-compat[postgres]'" in proc.stdout


async def test_a_mixed_case_schema_name_with_dollar_keeps_its_case(postgres_url: str) -> None:
    import psycopg

    schema = f"Mixed_{os.getpid()}$Case"
    conn = PostgresConnection(postgres_url, schema=schema, migrate=True)
    try:
        assert await conn.connect() == 11
        assert (await conn.execute("SELECT current_schema() AS s")).rows == [{"s": schema}]
    finally:
        await conn.close()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_cluster_of_our_own_starts_answers_and_is_removed() -> None:
    """The fallback when neither POSTGRES_URL nor 127.0.0.1:5432 answers (initdb as 'postgres' when root)."""
    from tests._postgres_server import PostgresServer, _answers

    server = PostgresServer().start()
    try:
        assert _answers(server.url)
    finally:
        server.stop()
    assert not os.path.exists(server.dir)


async def test_statements_go_to_the_server_as_written_with_native_placeholders(postgres_url: str) -> None:
    """No client-side rewriting: '%s' stays text, a '$2' in a comment is no parameter."""
    import psycopg

    from bullmq_compat._backends.postgres import sql

    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        result = await sql.execute(conn, "SELECT '%s %(x)s' AS p, $1::text AS a -- $2 is not a parameter\n", ["v"])
    assert result.rows == [{"p": "%s %(x)s", "a": "v"}]


async def test_a_domain_refusal_of_upstream_sql_maps_to_its_script_error(postgres_url: str, pg_migrated: str) -> None:
    """RAISE ... ERRCODE 'BM001', DETAIL '-5' from add_job becomes ParentJobNotFound naming the parent."""
    import psycopg

    from bullmq_compat import ParentJobNotFound
    from bullmq_compat._backends.postgres import sql

    conn = PostgresConnection(postgres_url, schema=pg_migrated)
    try:
        with pytest.raises(psycopg.Error) as info:
            await conn.run("add_job", ["q", "", "n", "{}", "{}", 0, 0, 1, 1, "q", "gone", "q:gone", None, None, False])
        mapped = sql.domain_error(info.value, job_id="x", command="addJob", parent_key="q:gone")
        assert isinstance(mapped, ParentJobNotFound) and "q:gone" in str(mapped)
    finally:
        await conn.close()


async def test_close_during_connect_gives_the_caller_postgres_unavailable_not_a_cancel(postgres_url: str) -> None:
    """A worker closed while it (re)connects must see a connection error it handles, not a
    CancelledError it was never sent (Worker.run() raised it out of close())."""
    import asyncio

    conn = PostgresConnection(postgres_url, schema="never_connected_here")
    connecting = asyncio.ensure_future(conn.connect())
    await asyncio.sleep(0)
    await conn.close()
    with pytest.raises(PostgresUnavailable, match="closed while connecting"):
        await connecting
    with pytest.raises(PostgresUnavailable, match="is closed"):
        await conn.connect()
