"""A PostgreSQL schema of its own for each test that drives Node BullMQ's Postgres backend.

``pg_schema`` (a fixture) yields a fresh schema name and drops that schema (``DROP SCHEMA ...
CASCADE``) when the test ends, passed or not; nothing else in the database is touched.
``pg_args`` gives the JSON fields the interop scripts take for Postgres in place of ``redis``:
``{"postgres": url, "schema": name, "migrate": True}`` (see interop/backend.js).

Only ``psql`` is needed (no Python driver): the database is POSTGRES_URL, by default
postgresql://postgres@127.0.0.1:5432/test. The schema is not created here: Node's runMigrations
(``migrate: True``, or the ``migrate`` op of interop/cli.js) creates it.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import uuid
from typing import Any, Iterator

import pytest

POSTGRES_URL = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PsqlError(RuntimeError):
    """psql failed (its stderr is the message)."""


def new_schema_name(tag: str = "t") -> str:
    """A schema name no other test uses: ``s_<tag>_<12 hex>`` (lower case, so unquoted SQL and
    Node's quoted "<name>" mean the same schema)."""
    name = f"s_{tag}_{uuid.uuid4().hex[:12]}"
    assert _SCHEMA_NAME.match(name), name
    return name


def psql(sql: str, *, url: str = POSTGRES_URL, timeout: float = 60.0) -> list[list[str]]:
    """Run ``sql`` through ``psql`` (stopping at the first error) and return the rows it printed,
    each a list of column texts (unaligned, tab-separated, no header)."""
    binary = shutil.which("psql")
    if binary is None:
        raise PsqlError("psql is not on PATH (Debian: apt-get install postgresql-client)")
    proc = subprocess.run(
        [binary, url, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
    )
    if proc.returncode != 0:
        raise PsqlError(proc.stderr.strip() or f"psql exited with status {proc.returncode}")
    return [line.split("\t") for line in proc.stdout.splitlines() if line]


async def apsql(sql: str, **kwargs: Any) -> list[list[str]]:
    """:func:`psql` without blocking the event loop."""
    return await asyncio.to_thread(psql, sql, **kwargs)


def drop_schema(name: str, *, url: str = POSTGRES_URL) -> None:
    assert _SCHEMA_NAME.match(name), name
    psql(f"DROP SCHEMA IF EXISTS {name} CASCADE", url=url)


def schema_exists(name: str, *, url: str = POSTGRES_URL) -> bool:
    assert _SCHEMA_NAME.match(name), name
    return bool(psql(f"SELECT 1 FROM pg_namespace WHERE nspname = '{name}'", url=url))


def pg_args(schema: str, *, migrate: bool | None = True, url: str = POSTGRES_URL) -> dict[str, Any]:
    """The interop scripts' JSON fields for Node's Postgres backend on ``schema``."""
    args: dict[str, Any] = {"postgres": url, "schema": schema}
    if migrate is not None:
        args["migrate"] = migrate
    return args


@pytest.fixture
def postgres_url() -> str:
    return POSTGRES_URL


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name (not yet created); the schema is dropped after the test."""
    name = new_schema_name()
    try:
        yield name
    finally:
        drop_schema(name)
