"""Bringing a schema up to the bundled migrations, and the read-only check made on connect.

The same steps as Node's ``runMigrations`` (``postgres/migrator.js``), so Node and Python can
migrate the same database in any order: one session and one transaction, serialised per schema by
``pg_advisory_xact_lock(0x42554c4c, hashtext(schema))``; ``CREATE SCHEMA IF NOT EXISTS``;
``SET LOCAL search_path``; the ``migration`` ledger (upgraded when it lacks
``min_client_version``); each newer migration applied with its ledger row (name without ``.sql``,
``min_client_version`` 6); all or nothing.

>>> await migrate_postgres("postgresql://postgres@127.0.0.1/test", schema="bullmq")
11
"""
from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from bullmq_compat._backends.postgres import sql
from bullmq_compat._errors import (
    InvalidSchemaName,
    SchemaMigrationRequired,
    SchemaVersionMismatch,
    UnsupportedPostgresVersion,
    UpstreamScriptsMissing,
)
from bullmq_compat._wire import upstream

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

DEFAULT_SCHEMA = "bullmq"
#: "BULL" (0x42554c4c), Node's key for the migration lock (the decimal in its source comment is wrong)
MIGRATION_ADVISORY_LOCK_KEY = 0x42554C4C
MINIMUM_POSTGRES_VERSION = 13
RECOMMENDED_POSTGRES_VERSION = 14
#: the BullMQ major this client speaks for, as Node's BULLMQ_MAJOR_VERSION
BULLMQ_MAJOR_VERSION = int(upstream.UPSTREAM_VERSION.split(".")[0])

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\Z")
_MIGRATION_FILE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql\Z")


def quote_schema_name(schema: Any) -> str:
    """``schema`` double-quoted for DDL, after Node's rule (schema names cannot be bound)."""
    if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema) or len(schema) > 63:
        raise InvalidSchemaName(
            f"schema={schema!r} is not a valid PostgreSQL schema name: use a simple identifier "
            "(a letter or '_', then letters, digits, '_' or '$'; at most 63 characters)")
    return f'"{schema}"'


@dataclass(frozen=True)
class Migration:
    version: int
    name: str          # without .sql, as the ledger records it
    text: str
    min_client_version: int = BULLMQ_MAJOR_VERSION


def bundled_migrations() -> list[Migration]:
    """The pinned release's migrations in order, each checked against its sha256 pin."""
    directory = upstream.postgres_migrations_dir()
    migrations = []
    for file_name, pin in sorted(upstream.POSTGRES_MIGRATION_SHA256.items()):
        match = _MIGRATION_FILE.match(file_name)
        assert match is not None, file_name
        try:
            data = (directory / file_name).read_bytes()
        except OSError as err:
            raise UpstreamScriptsMissing(
                f"migration {file_name} is missing from {directory} ({err}): {upstream.FETCH_HINT}") from None
        got = hashlib.sha256(data).hexdigest()
        if got != pin:
            raise UpstreamScriptsMissing(
                f"migration {directory / file_name} has sha256 {got}, not the pinned {pin}: "
                f"refusing to apply it; {upstream.FETCH_HINT}")
        migrations.append(Migration(int(match.group(1)), file_name[:-len(".sql")], data.decode("utf-8")))
    return migrations


def upstream_versions() -> list[int]:
    """The versions of the bundled migrations, in order (1 .. 11)."""
    return sorted(int(name[:4]) for name in upstream.POSTGRES_MIGRATION_SHA256)


def latest_schema_version() -> int:
    """The schema version the bundled migrations produce (Node's LATEST_SCHEMA_VERSION)."""
    return upstream_versions()[-1]


def check_server_version(num: Optional[str], reported: Optional[str]) -> None:
    """Refuse a server below `MINIMUM_POSTGRES_VERSION` (``server_version_num // 10000``); warn
    below `RECOMMENDED_POSTGRES_VERSION`, as Node does."""
    try:
        major = int(num or "0") // 10000
    except ValueError:
        major = 0
    if major < MINIMUM_POSTGRES_VERSION:
        raise UnsupportedPostgresVersion(reported or "unknown", MINIMUM_POSTGRES_VERSION)
    if major < RECOMMENDED_POSTGRES_VERSION:  # as Node: run, but say so (once per place, by warnings)
        warnings.warn(f"PostgreSQL {RECOMMENDED_POSTGRES_VERSION} or newer is recommended for the PostgreSQL "
                      f"backend (the server reports {reported})", RuntimeWarning, stacklevel=2)


def _newer_client_needed(schema: str, minimum: int) -> SchemaVersionMismatch:
    return SchemaVersionMismatch(
        f"PostgreSQL schema {schema!r} requires a BullMQ client of major version {minimum} or newer, but this "
        f"client speaks for major {BULLMQ_MAJOR_VERSION} (BullMQ {upstream.UPSTREAM_VERSION}): upgrade "
        "bullmq-compat to use this schema (schema downgrades are not supported)",
        schema=schema, database_version=minimum, supported_version=BULLMQ_MAJOR_VERSION)


Connectable = Union[str, "psycopg_pool.AsyncConnectionPool[Any]", "psycopg.AsyncConnection[Any]"]


async def migrate_postgres(url_or_pool: Connectable, schema: str = DEFAULT_SCHEMA, *, groups: bool = False) -> int:
    """Apply the bundled migrations to ``schema`` (created if missing); returns its version (11).

    With ``groups=True``, then install (or bring up to date) bullmq-compat's per-group gate in the
    schema: our own tables, indexes, functions and triggers, with a ledger of our own
    (``bullmq_compat_migration``) beside Node's, which is not touched (docs/postgres.md, "Groups").
    Group jobs on a PostgreSQL queue need it; Node queues without groups behave as before.

    Takes a ``postgresql://`` URL, a ``psycopg_pool.AsyncConnectionPool`` or an idle
    ``psycopg.AsyncConnection``; a pool or connection passed in stays open. Safe to run from many
    processes at once (they queue on an advisory lock) and a no-op when the schema is current.

    >>> await migrate_postgres("postgresql://postgres@127.0.0.1/test", schema="jobs", groups=True)
    11
    """
    quote_schema_name(schema)
    from bullmq_compat._backends.postgres.connection import session

    async with session(url_or_pool) as conn:
        version = await run_migrations(conn, schema)
        if groups:
            from bullmq_compat._backends.postgres.groups import install_groups

            await install_groups(conn, schema)
        return version


async def drop_postgres_groups(url_or_pool: Connectable, schema: str = DEFAULT_SCHEMA) -> int:
    """Remove bullmq-compat's group objects from ``schema`` (what ``migrate_postgres(groups=True)``
    installed), leaving upstream's objects as Node's migrations made them. Jobs held for their
    group's turn are released to wait first (their group order no longer holds); returns how many.
    A schema without our objects is left as it is (0)."""
    quote_schema_name(schema)
    from bullmq_compat._backends.postgres.connection import session
    from bullmq_compat._backends.postgres.groups import drop_groups

    async with session(url_or_pool) as conn:
        return await drop_groups(conn, schema)


async def run_migrations(conn: "psycopg.AsyncConnection[Any]", schema: str = DEFAULT_SCHEMA) -> int:
    """Node's ``runMigrations`` on one idle session ``conn`` (see the module docstring)."""
    quoted = quote_schema_name(schema)
    migrations = bundled_migrations()
    row = (await sql.execute(conn, "SELECT current_setting('server_version_num') AS num, "
                                   "current_setting('server_version') AS ver")).rows[0]
    check_server_version(row["num"], row["ver"])
    async with conn.transaction():
        await sql.execute(conn, "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                          [MIGRATION_ADVISORY_LOCK_KEY, schema])
        await sql.execute(conn, f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        await sql.execute(conn, f"SET LOCAL search_path TO {quoted}")
        await _ensure_ledger(conn)
        state = (await sql.execute(
            conn, "SELECT COALESCE(MAX(version), 0)::int AS version, "
                  "COALESCE(MAX(min_client_version), $1)::int AS min_client_version FROM migration",
            [BULLMQ_MAJOR_VERSION])).rows[0]
        current, minimum = int(state["version"]), int(state["min_client_version"])
        if minimum > BULLMQ_MAJOR_VERSION:
            raise _newer_client_needed(schema, minimum)
        for migration in migrations:
            if migration.version > current:
                await sql.execute(conn, migration.text)
                await sql.execute(conn, "INSERT INTO migration (version, name, min_client_version) "
                                        "VALUES ($1, $2, $3)",
                                  [migration.version, migration.name, migration.min_client_version])
    return max(current, migrations[-1].version if migrations else 0)


async def _ensure_ledger(conn: "psycopg.AsyncConnection[Any]") -> None:
    await sql.execute(conn, """CREATE TABLE IF NOT EXISTS migration (
       version    integer PRIMARY KEY,
       name       text NOT NULL,
       min_client_version integer NOT NULL,
       applied_at timestamptz NOT NULL DEFAULT now()
     )""")
    # a ledger made by an older release has no min_client_version: add it, filled with our major
    await sql.execute(conn, "ALTER TABLE migration ADD COLUMN IF NOT EXISTS min_client_version integer")
    await sql.execute(conn, "UPDATE migration SET min_client_version = $1 WHERE min_client_version IS NULL",
                      [BULLMQ_MAJOR_VERSION])
    await sql.execute(conn, "ALTER TABLE migration ALTER COLUMN min_client_version SET NOT NULL")


async def check_schema(conn: "psycopg.AsyncConnection[Any]", schema: str = DEFAULT_SCHEMA) -> int:
    """The read-only check made on connect (one SELECT, no lock, no DDL); returns the schema version.

    Raises `SchemaMigrationRequired` (no ledger), `SchemaVersionMismatch` (a newer client needed,
    as Node; or -- beyond Node, which accepts it silently -- a schema older than the bundled
    migrations) and `UnsupportedPostgresVersion` (server below 13).
    """
    import psycopg

    quoted = quote_schema_name(schema)
    try:
        async with conn.transaction():
            state = (await sql.execute(conn, f"""SELECT COALESCE(MAX(version), 0)::int AS version,
                  COALESCE(MAX((to_jsonb(migration)->>'min_client_version')::int), $1)::int AS min_client_version,
                  current_setting('server_version_num') AS server_version_num,
                  current_setting('server_version') AS server_version
             FROM {quoted}.migration""", [BULLMQ_MAJOR_VERSION])).rows[0]
    except psycopg.errors.UndefinedTable:  # 42P01
        raise SchemaMigrationRequired(schema) from None
    check_server_version(state["server_version_num"], state["server_version"])
    version, minimum = int(state["version"]), int(state["min_client_version"])
    if minimum > BULLMQ_MAJOR_VERSION:
        raise _newer_client_needed(schema, minimum)
    latest = latest_schema_version()
    if version < latest:
        missing = ", ".join(f"{v:04d}" for v in upstream_versions() if v > version)
        raise SchemaVersionMismatch(
            f"PostgreSQL schema {schema!r} is at version {version}, older than version {latest} that "
            f"BullMQ {upstream.UPSTREAM_VERSION} expects (migrations {missing} are not applied): run "
            f"bullmq_compat.migrate_postgres(url, schema={schema!r}), or Node's runMigrations, or connect "
            "with migrate=True",
            schema=schema, database_version=version, supported_version=latest)
    return version
