from __future__ import annotations

import uuid
from typing import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from tests._redis_server import redis_for_tests


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis for the whole session: REDIS_URL, a testcontainers Redis, or our own redis-server."""
    with redis_for_tests() as url:
        yield url


@pytest.fixture
def queue_name() -> str:
    """A queue name no other test uses, so tests never need to flush Redis."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client, for asserting on what is stored."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


# -- PostgreSQL ---------------------------------------------------------------------------------
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from bullmq_compat._backends.postgres.backend import PostgresBackend


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL for the whole session: POSTGRES_URL, the local server on 5432, or our own cluster."""
    from tests._postgres_server import postgres_for_tests

    with postgres_for_tests() as url:
        yield url


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    """A schema name no other test uses; whatever the test made in it is dropped afterwards."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
async def pg_migrated(postgres_url: str, pg_schema: str) -> str:
    """`pg_schema`, migrated to the bundled version (as Node's runMigrations leaves it)."""
    from bullmq_compat import migrate_postgres

    await migrate_postgres(postgres_url, pg_schema)
    return pg_schema


@pytest.fixture
async def pg_backend(postgres_url: str, pg_migrated: str) -> AsyncIterator["PostgresBackend"]:
    """A PostgresBackend for queue "q" on a freshly migrated schema of its own (dropped after)."""
    from bullmq_compat._backends.postgres.backend import PostgresBackend
    from bullmq_compat._backends.postgres.connection import PostgresConnection

    backend = PostgresBackend(PostgresConnection(postgres_url, schema=pg_migrated), "q")
    await backend.connect()
    try:
        yield backend
    finally:
        await backend.close()
