from __future__ import annotations

import os
import threading
import uuid
from typing import Any, AsyncIterator, Iterator, Optional

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


#: A test that runs longer than this (seconds) is taken as hung: `_hung` writes what every asyncio task
#: and thread of the process is waiting on and cancels the test's coroutine (the test fails), so that a
#: wait without a bound fails the run with its stack instead of stopping it for good.
TEST_TIMEOUT = float(os.environ.get("BULLMQ_COMPAT_TEST_TIMEOUT")
                     or (2400 if os.environ.get("BULLMQ_COMPAT_CHAOS", "") not in ("", "0") else 600))


#: after a hung test's coroutine was cancelled, how long its teardown may take before the process ends
HUNG_GRACE_S = 120.0
_HUNG_TIMERS: list[threading.Timer] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    timer = threading.Timer(TEST_TIMEOUT, _hung, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        while _HUNG_TIMERS:  # the hung test ended after its cancel: the process goes on
            _HUNG_TIMERS.pop().cancel()


_SESSION_START = [0.0]


def pytest_sessionstart(session: pytest.Session) -> None:
    import time

    _SESSION_START[0] = time.time()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The controller shows what `_hung` wrote in this run (an xdist worker's stderr is not shown)."""
    from pathlib import Path

    artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
    for path in sorted(artifacts.glob("hung-*.txt")) if artifacts.is_dir() else []:
        if path.stat().st_mtime >= _SESSION_START[0]:
            terminalreporter.write_sep("=", f"hung test: {path.name}")
            terminalreporter.write(path.read_text(errors="replace")[-30000:] + "\n")


def _hung(nodeid: str) -> None:
    import asyncio
    import faulthandler
    import io
    import sys
    import time
    from pathlib import Path

    out = io.StringIO()
    out.write(f"\n{nodeid}: still running after {TEST_TIMEOUT:.0f} s, taken as hung ({time.strftime('%H:%M:%S')})"
              "; what each asyncio task awaits:\n")
    tasks = getattr(asyncio.tasks, "_all_tasks", None)
    for task in list(tasks) if tasks is not None else []:
        if not task.done():
            out.write(f"--- {task!r}\n")
            task.print_stack(file=out)
    text = out.getvalue()
    artifacts = Path(__file__).resolve().parent.parent / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    path = artifacts / f"hung-{os.getpid()}.txt"
    with open(path, "w") as f:
        f.write(text)
        f.write("threads:\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
    stderr = sys.__stderr__
    if stderr is not None:
        stderr.write(text[-20000:] + f"(threads too: {path})\n")
        stderr.flush()
    # fail the test: cancel its coroutine (pytest-asyncio runs it as a task), so that its teardown
    # runs and the xdist worker goes on (a worker that exits mid-test can leave xdist's controller
    # waiting for good); only if that does not end it within HUNG_GRACE_S is the process ended
    why = f"{nodeid}: hung for {TEST_TIMEOUT:.0f} s (what it awaited: {path.name})"
    for task in list(tasks) if tasks is not None else []:
        if not task.done() and getattr(task.get_coro(), "__name__", "").startswith("test_"):
            task.get_loop().call_soon_threadsafe(task.cancel, why)
    timer = threading.Timer(HUNG_GRACE_S, os._exit, args=(70,))
    timer.daemon = True
    timer.start()
    _HUNG_TIMERS.append(timer)


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
