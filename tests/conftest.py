from __future__ import annotations

import uuid
from typing import AsyncIterator, Iterator, Optional

import pytest
import redis.asyncio as aioredis

from tests._redis_server import redis_for_tests


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a module-scoped fixture (a cluster, a TLS server, a PostgreSQL of its own...)
    runs on the same xdist worker as the rest of its module (``--dist loadgroup``), so the fixture is
    set up once, not once per worker. A test with an ``xdist_group`` mark of its own keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs):
            module = getattr(item, "module", None)
            item.add_marker(pytest.mark.xdist_group(f"module-{getattr(module, '__name__', item.nodeid)}"))
    for item in items:
        if item.get_closest_marker("xfail") is not None:
            item.repr_failure = _one_line_failure  # type: ignore[method-assign]
    _suffix_groups(config, items)


def _one_line_failure(excinfo: pytest.ExceptionInfo[BaseException], style: Optional[str] = None) -> str:
    """The report of an expected failure (an ``xfail`` test, whose reason says what it shows): its
    exception in one line. pytest's full report parses the test's source with ``ast.parse``, which on
    CPython 3.11 can raise "SystemError: AST constructor recursion depth mismatch" when another thread
    compiles at the same moment (CPython gh-106905), and that error ends the whole xdist session
    (seen once in a fresh-clone run, on a strict xfail of tests/test_interop_groups.py)."""
    return f"{excinfo.typename}: {excinfo.value}"


def _suffix_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """What ``--dist loadgroup`` does on each xdist worker: a grouped test's node id gets
    ``@<group>``, which the controller schedules by. xdist 3.8 sets ``item._nodeid``; pytest 9 keeps
    the id in ``item._id``, so there nothing happens and every group is spread over the workers:
    here it is done for the ids xdist left unchanged."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or item.nodeid.endswith("@" + "_".join(names)):
            continue
        if hasattr(item, "_id"):  # (before pytest 9, xdist's hook, which runs after this one, does it)
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


@pytest.fixture(scope="session", autouse=True)
async def _node_command_server() -> AsyncIterator[None]:
    """The Node command server of `tests.node.node` (started by the first command) ends with the session."""
    yield
    from tests.node import close_node_server

    await close_node_server()


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
