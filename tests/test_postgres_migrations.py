"""The PostgreSQL migrator and the read-only check on connect, against a real PostgreSQL.

Each test works in a schema of its own (the ``pg_schema`` fixture), dropped afterwards.
"""
from __future__ import annotations

import asyncio
import shutil
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bullmq_compat import (
    InvalidSchemaName,
    SchemaMigrationRequired,
    SchemaVersionMismatch,
    UnsupportedPostgresVersion,
    UpstreamScriptsMissing,
    migrate_postgres,
)
from bullmq_compat._backends.postgres import migrator, sql
from bullmq_compat._wire import upstream


async def _query(url: str, text: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return (await sql.execute(conn, text, params or [])).rows


async def _ledger(url: str, schema: str) -> list[tuple[int, str, int]]:
    rows = await _query(url, f'SELECT version, name, min_client_version FROM "{schema}".migration ORDER BY version')
    return [(r["version"], r["name"], r["min_client_version"]) for r in rows]


async def _schema_exists(url: str, schema: str) -> bool:
    return bool(await _query(url, "SELECT 1 FROM pg_namespace WHERE nspname = $1", [schema]))


async def _check(url: str, schema: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await migrator.check_schema(conn, schema)


async def _build_schema_up_to(url: str, schema: str, version: int) -> None:
    """A schema as an older release left it: migrations 1..version and their ledger rows."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.transaction():
            await sql.execute(conn, f'CREATE SCHEMA "{schema}"')
            await sql.execute(conn, f'SET LOCAL search_path TO "{schema}"')
            await migrator._ensure_ledger(conn)
            for m in migrator.bundled_migrations()[:version]:
                await sql.execute(conn, m.text)
                await sql.execute(conn, "INSERT INTO migration (version, name, min_client_version) "
                                        "VALUES ($1, $2, 6)", [m.version, m.name])


EXPECTED_LEDGER = [(int(name[:4]), name[:-4], 6) for name in sorted(upstream.POSTGRES_MIGRATION_SHA256)]


async def test_migrating_a_fresh_schema_applies_all_eleven_migrations(postgres_url: str, pg_schema: str) -> None:
    assert await migrate_postgres(postgres_url, pg_schema) == 11
    assert await _ledger(postgres_url, pg_schema) == EXPECTED_LEDGER
    tables = {r["tablename"] for r in await _query(
        postgres_url, "SELECT tablename FROM pg_tables WHERE schemaname = $1", [pg_schema])}
    assert {"job", "meta", "event", "job_log", "migration"} <= tables


async def test_ledger_names_carry_no_sql_suffix_and_min_client_version_6(postgres_url: str, pg_migrated: str) -> None:
    ledger = await _ledger(postgres_url, pg_migrated)
    assert ledger[0] == (1, "0001_schema", 6)
    assert ledger[-1] == (11, "0011_obliterate_producer_lock", 6)
    assert not any(name.endswith(".sql") for _, name, _ in ledger)


async def test_migrating_again_is_a_no_op(postgres_url: str, pg_migrated: str) -> None:
    before = await _query(postgres_url, f'SELECT version, applied_at FROM "{pg_migrated}".migration ORDER BY 1')
    assert await migrate_postgres(postgres_url, pg_migrated) == 11
    assert await _query(postgres_url, f'SELECT version, applied_at FROM "{pg_migrated}".migration ORDER BY 1') == before


async def test_concurrent_migrators_apply_each_migration_once(postgres_url: str, pg_schema: str) -> None:
    results = await asyncio.gather(*(migrate_postgres(postgres_url, pg_schema) for _ in range(3)))
    assert results == [11, 11, 11]
    assert await _ledger(postgres_url, pg_schema) == EXPECTED_LEDGER


async def test_a_schema_at_version_4_is_brought_to_11(postgres_url: str, pg_schema: str) -> None:
    await _build_schema_up_to(postgres_url, pg_schema, 4)
    assert await migrate_postgres(postgres_url, pg_schema) == 11
    assert await _ledger(postgres_url, pg_schema) == EXPECTED_LEDGER


async def test_an_older_ledger_without_min_client_version_is_upgraded(postgres_url: str, pg_migrated: str) -> None:
    await _query(postgres_url, f'ALTER TABLE "{pg_migrated}".migration DROP COLUMN min_client_version')
    assert await migrate_postgres(postgres_url, pg_migrated) == 11
    assert await _ledger(postgres_url, pg_migrated) == EXPECTED_LEDGER
    column = await _query(postgres_url, "SELECT is_nullable FROM information_schema.columns WHERE table_schema = $1 "
                                        "AND table_name = 'migration' AND column_name = 'min_client_version'",
                          [pg_migrated])
    assert column == [{"is_nullable": "NO"}]


async def test_a_ledger_asking_for_a_newer_client_is_refused_by_the_migrator(postgres_url: str,
                                                                             pg_migrated: str) -> None:
    await _query(postgres_url, f"INSERT INTO \"{pg_migrated}\".migration VALUES (12, '0012_future', 7, now())")
    with pytest.raises(SchemaVersionMismatch, match="major version 7 or newer") as info:
        await migrate_postgres(postgres_url, pg_migrated)
    assert (info.value.database_version, info.value.supported_version) == (7, 6)


async def test_a_failing_migration_leaves_nothing_behind(postgres_url: str, pg_schema: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real = migrator.bundled_migrations()
    broken = [*real[:3], migrator.Migration(4, "0004_relay", "CREATE TABLE job (broken int);")]
    monkeypatch.setattr(migrator, "bundled_migrations", lambda: broken)
    with pytest.raises(psycopg.errors.DuplicateTable):
        await migrate_postgres(postgres_url, pg_schema)
    assert not await _schema_exists(postgres_url, pg_schema)


async def test_a_migration_text_that_differs_from_its_pin_is_not_applied(
        postgres_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    copy = tmp_path / "_upstream"
    shutil.copytree(upstream.UPSTREAM_DIR, copy)
    (copy / "postgres" / "migrations" / "0002_functions.sql").write_text("-- changed\n")
    monkeypatch.setattr(upstream, "UPSTREAM_DIR", copy)
    with pytest.raises(UpstreamScriptsMissing, match="0002_functions.sql has sha256"):
        await migrate_postgres(postgres_url, pg_schema)
    assert not await _schema_exists(postgres_url, pg_schema)


# -- the read-only check on connect ---------------------------------------------------------------

async def test_the_check_passes_a_current_schema_and_returns_its_version(postgres_url: str, pg_migrated: str) -> None:
    assert await _check(postgres_url, pg_migrated) == 11


async def test_the_check_refuses_a_schema_without_ledger(postgres_url: str, pg_schema: str) -> None:
    with pytest.raises(SchemaMigrationRequired, match=f"{pg_schema}.*migrate_postgres") as info:
        await _check(postgres_url, pg_schema)
    assert info.value.schema == pg_schema
    assert not await _schema_exists(postgres_url, pg_schema)  # read-only: nothing was created


async def test_the_check_refuses_a_ledger_asking_for_client_major_7(postgres_url: str, pg_migrated: str) -> None:
    await _query(postgres_url, f'UPDATE "{pg_migrated}".migration SET min_client_version = 7 WHERE version = 11')
    with pytest.raises(SchemaVersionMismatch, match="major version 7 or newer"):
        await _check(postgres_url, pg_migrated)


async def test_the_check_refuses_a_schema_older_than_the_bundle_naming_both_versions(
        postgres_url: str, pg_schema: str) -> None:
    await _build_schema_up_to(postgres_url, pg_schema, 4)
    with pytest.raises(SchemaVersionMismatch) as info:
        await _check(postgres_url, pg_schema)
    message = str(info.value)
    assert "version 4" in message and "version 11" in message
    assert "0005" in message and "0011" in message and "migrate_postgres" in message
    assert (info.value.database_version, info.value.supported_version) == (4, 11)


async def test_a_newer_schema_that_current_clients_may_use_is_accepted(postgres_url: str, pg_migrated: str) -> None:
    await _query(postgres_url, f"INSERT INTO \"{pg_migrated}\".migration VALUES (12, '0012_additive', 6, now())")
    assert await _check(postgres_url, pg_migrated) == 12
    assert await migrate_postgres(postgres_url, pg_migrated) == 12


@pytest.mark.parametrize("num, reported", [("120005", "12.5"), ("90624", "9.6.24"), (None, None)])
def test_a_server_older_than_13_is_refused(num: str | None, reported: str | None) -> None:
    with pytest.raises(UnsupportedPostgresVersion, match="13 or newer"):
        migrator.check_server_version(num, reported)


def test_a_13_server_is_accepted_with_a_warning_and_14_and_newer_without() -> None:
    with pytest.warns(RuntimeWarning, match="14 or newer is recommended"):
        migrator.check_server_version("130000", "13.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        migrator.check_server_version("140000", "14.0")
        migrator.check_server_version("150020", "15.20")


@pytest.mark.parametrize("name", ["", "1jobs", "jobs-q", 'a"b', "a b", "é", "x" * 64, "public;drop", 7, None])
async def test_bad_schema_names_are_refused_before_anything_is_written(postgres_url: str, name: Any) -> None:
    with pytest.raises(InvalidSchemaName, match="schema=") as info:
        await migrate_postgres(postgres_url, name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", ["_x", "Jobs$1", "a" * 63])
def test_simple_identifiers_up_to_63_characters_are_valid_schema_names(name: str) -> None:
    assert migrator.quote_schema_name(name) == f'"{name}"'
