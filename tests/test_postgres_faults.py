"""PostgreSQL faults of the server's own making (issue #31 §4): low timeouts, and our sessions terminated.

- ``statement_timeout`` and ``idle_in_transaction_session_timeout`` set low on the server (ALTER SYSTEM):
  our normal work (migrations, an add_bulk of 1000, claims, finishes, stalled checks, the LISTEN
  sessions, QueueEvents) trips neither -- the server log says so --, a stuck statement is cut, and a
  transactional processor that sits in its transaction longer than the idle timeout loses its
  session: that attempt fails (its writes never commit), the next one completes, the broken pooled
  session is discarded, none leaks.
- ``pg_terminate_backend`` of each kind of our sessions in turn, under load: the Queue's pooled
  sessions, a worker's lane sessions, a worker's LISTEN session, QueueEvents' LISTEN session, a
  transactional worker's processor transactions. No job is lost or completed twice, QueueEvents sees
  every final event once, and after each kill the sessions on the server are again exactly the ones
  our pools, lanes and listeners hold (a leaked session, or a pool counting a dead one, breaks the
  equality); after closing everything there is no client session left.

Each test runs its own cluster (tests/_postgres_server.py): it reconfigures the server, and every
session of the cluster is ours (the checks count them all). Workers run in the test's process
(their sessions are reachable by pid); runs are recorded as tests/pg_chaos_worker_proc.py records
them and checked by `chaos_helpers.check_runs`. Figures go to test-artifacts/reliability.txt.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import psycopg
import pytest

from bullmq_compat import Queue, QueueEvents, Worker, migrate_postgres
from bullmq_compat._backends.postgres.connection import PostgresConnection
from tests._postgres_server import PostgresServer
from tests.chaos_helpers import (
    CHAOS,
    add_plan,
    add_plan_part,
    check_runs,
    judge_lock_lost,
    now_ms,
    plan_jobs,
    poll_until,
    report,
)
from tests.pg_chaos_worker_proc import make_handler, recorder
from tests.pg_group_helpers import final_states, finish_events, read_run_records

#: low enough to cut a stuck statement within a test, far above what our statements take (an
#: add_bulk of 1000 takes ~0.1 s here, a claim or finish a few ms)
STATEMENT_TIMEOUT = "1s"
#: low enough to end a processor's transaction that sits idle, above the handlers' 20-80 ms sleeps
IDLE_IN_TRANSACTION_TIMEOUT = "300ms"
SCHEMA = "faults"
EFFECTS = "effects"

STATEMENT_CANCELLED = "canceling statement due to statement timeout"
IDLE_TIMEOUT = "terminating connection due to idle-in-transaction timeout"


#: the kill test's statement timeout: it is about kills, and a busy machine can hold one of our
#: millisecond statements past 1 s (a fresh-clone CI run once saw three cut together there); a
#: statement stuck for this long is cut and fails the test
KILL_STATEMENT_TIMEOUT = "5s"


@contextlib.contextmanager
def strict_server(statement_timeout: str) -> Iterator[PostgresServer]:
    """A cluster of our own with low statement and idle-in-transaction timeouts for every session."""
    server = PostgresServer().start()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET statement_timeout = '{statement_timeout}'")
            conn.execute(f"ALTER SYSTEM SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'")
            # diagnostics for a failure: lock waits over 200 ms and statements over 300 ms are logged
            conn.execute("ALTER SYSTEM SET log_lock_waits = on")
            conn.execute("ALTER SYSTEM SET deadlock_timeout = '200ms'")
            conn.execute("ALTER SYSTEM SET log_min_duration_statement = '300ms'")
            conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(server.url, autocommit=True) as conn:  # a new session has them
            shown = [conn.execute(f"SHOW {name}").fetchone() for name in
                     ("statement_timeout", "idle_in_transaction_session_timeout")]
        assert shown == [(statement_timeout,), (IDLE_IN_TRANSACTION_TIMEOUT,)], shown
        yield server
    finally:
        server.stop()


@pytest.fixture
def strict_postgres() -> Iterator[PostgresServer]:
    with strict_server(STATEMENT_TIMEOUT) as server:
        yield server


@pytest.fixture
def kill_postgres() -> Iterator[PostgresServer]:
    with strict_server(KILL_STATEMENT_TIMEOUT) as server:
        yield server


def server_log(server: PostgresServer) -> str:
    with open(os.path.join(server.dir, "log"), errors="replace") as f:
        return f.read()


def cancelled_statements(log: str) -> list[str]:
    """Each statement-timeout cancel of the log with the STATEMENT line the server logged after it."""
    lines = log.splitlines()
    return [line + " | " + (lines[i + 1] if i + 1 < len(lines) else "")
            for i, line in enumerate(lines) if STATEMENT_CANCELLED in line]


def slow_lines(log: str, limit: int = 20) -> list[str]:
    """What the server logged of lock waits (over deadlock_timeout) and slow statements (over
    log_min_duration_statement): the diagnosis of a statement cut by the timeout."""
    return [line for line in log.splitlines() if "still waiting for" in line or "duration:" in line][:limit]


def log_pids(log: str, words: str) -> list[int]:
    """The backend pids of the log lines holding ``words`` (the default log_line_prefix has ``[%p]``)."""
    return [int(m.group(1)) for line in log.splitlines() if words in line
            for m in [re.search(r"\[(\d+)\]", line)] if m]


async def admin_query(url: str, text: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(text, list(params))
        return await cur.fetchall() if cur.description is not None else []


async def client_sessions(url: str) -> list[tuple[int, str, str]]:
    """(pid, application_name, state) of every client session of the cluster but the asking one."""
    return [tuple(r) for r in await admin_query(  # type: ignore[misc]
        url, "SELECT pid, application_name, coalesce(state, '') FROM pg_stat_activity "
             "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY pid")]


async def end_processor_transactions(url: str) -> set[int]:
    """Terminate the sessions idle in a processor's transaction (its INSERT done, its handler
    sleeping) in the statement that finds them: found first and ended later, one could have
    committed meanwhile, and its end would then cost no attempt."""
    return {r[0] for r in await admin_query(
        url, "WITH found AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' "
             f"AND query LIKE 'INSERT INTO {EFFECTS}%%') SELECT pid FROM found WHERE pg_terminate_backend(pid)")}


async def terminate_pids(url: str, pids: Iterable[int]) -> int:
    rows = await admin_query(url, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int "
                                  "FROM unnest(%s::int[]) AS pid", [sorted(pids)])
    return int(rows[0][0])


def connections_of(*clients: Any) -> list[PostgresConnection]:
    """The distinct PostgresConnections of Queues, Workers and QueueEvents."""
    seen: dict[int, PostgresConnection] = {}
    for client in clients:
        conn = client.backend.connection
        seen[id(conn)] = conn
    return list(seen.values())


def tracked(connections: Iterable[PostgresConnection]) -> dict[str, int]:
    """What our side holds: pooled sessions (and how many are lent out), LISTEN and lane sessions."""
    out = {"pooled": 0, "lent": 0, "own": 0}
    for conn in connections:
        if conn._pool is not None and not conn.closed:
            stats = conn._pool.get_stats()
            out["pooled"] += stats.get("pool_size", 0)
            out["lent"] += stats.get("pool_size", 0) - stats.get("pool_available", 0)
        out["own"] += len(conn._listeners)  # lanes and LISTEN sessions: our own connections
    return out


async def sessions_match(url: str, connections: list[PostgresConnection], *, idle: bool = False) -> bool:
    """The server's client sessions are exactly the ones our side holds (``idle``: none lent out)."""
    mine = tracked(connections)
    on_server = len(await client_sessions(url))
    return on_server == mine["pooled"] + mine["own"] and (not idle or mine["lent"] == 0)


async def borrow_each_pooled_session(queue: Queue) -> None:
    """Borrow every session of the Queue's pool at once (each call holds its session 20 ms)."""
    conn = queue.backend.connection  # type: ignore[attr-defined]
    size = int(conn._pool.get_stats().get("pool_size", 0))
    await asyncio.gather(*(conn.execute("SELECT pg_sleep(0.02)") for _ in range(max(1, size))))


def our_pids(connections: Iterable[PostgresConnection]) -> list[tuple[str, int, str]]:
    """(kind, backend pid, 'ok'/'closed') of each session our side holds: idle pooled ones, and
    our own (lanes, LISTEN sessions); a lent-out pooled session is not listed."""
    out: list[tuple[str, int, str]] = []
    for conn in connections:
        pool = conn._pool
        held = list(getattr(pool, "_pool", ())) if pool is not None and not conn.closed else []
        out += [("pool", c.pgconn.backend_pid, "closed" if c.closed else "ok") for c in held]
        out += [("own", c.pgconn.backend_pid, "closed" if c.closed else "ok") for c, _ in conn._listeners]
    return sorted(out, key=lambda t: t[1])


async def sessions_detail(url: str, connections: list[PostgresConnection]) -> str:
    server = await client_sessions(url)
    ours = our_pids(connections)
    on_server = {pid for pid, _, _ in server}
    return (f"server {server}; ours {tracked(connections)}; ours not on the server "
            f"{[t for t in ours if t[1] not in on_server]}; on the server not ours "
            f"{sorted(on_server - {t[1] for t in ours})}")


class Recorded:
    """A worker's handler (tests/pg_chaos_worker_proc.py's) and its 'fin' records, in this process."""

    def __init__(self, rec_dir: Path, effects: Optional[str] = None) -> None:
        self.runs: dict[tuple[str, str], tuple[int, int]] = {}
        self.process = make_handler(str(rec_dir), self.runs, effects)
        self._record = recorder(str(rec_dir))
        self.errors: list[str] = []
        self.failures: list[tuple[str, int, str]] = []  # (job id, attempt, error) of every failed attempt

    def attach(self, worker: Worker) -> Worker:
        def on_finish(job: Any, *_: Any) -> None:
            run = self.runs.pop((str(job.id), str(job.token)), None)
            if run is not None:
                self._record(k="fin", id=job.id, a=run[0], t0=run[1], pid=os.getpid(), t=now_ms())

        def on_failed(job: Any, err: Any, *_: Any) -> None:
            self.failures.append((str(job.id), int(job.attempts_made), f"{type(err).__name__}: {err}"))
            on_finish(job)

        worker.on("completed", on_finish)
        worker.on("failed", on_failed)
        worker.on("error", lambda err: self.errors.append(f"{type(err).__name__}: {err}"))
        return worker


def final_event_counter(events: QueueEvents) -> dict[str, Counter]:
    seen: dict[str, Counter] = {"completed": Counter(), "failed": Counter()}
    events.on("completed", lambda args: seen["completed"].update([args["jobId"]]))
    events.on("failed", lambda args: seen["failed"].update([args["jobId"]]))
    return seen


async def finished(queue: Queue) -> int:
    counts = await queue.get_job_counts("completed", "failed")
    return int(counts["completed"] + counts["failed"])


async def _ge(value: Any, n: int) -> bool:
    return bool(await value >= n)


async def _true(value: bool) -> bool:
    return value


async def effect_rows(url: str) -> list[tuple[str, int]]:
    return [(r[0], r[1]) for r in await admin_query(url, f'SELECT job_id, attempt FROM "{SCHEMA}".{EFFECTS} '
                                                         "ORDER BY job_id, attempt")]


async def start(worker: Worker) -> "asyncio.Future[Any]":
    ready = asyncio.Event()
    worker.on("ready", ready.set)
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    await asyncio.wait([running, asyncio.ensure_future(ready.wait())], timeout=30,
                       return_when=asyncio.FIRST_COMPLETED)
    assert ready.is_set(), f"the worker did not start: {running.exception() if running.done() else 'timeout'}"
    return running


async def stop(workers: Iterable[tuple[Worker, "asyncio.Future[Any]"]]) -> None:
    for worker, running in workers:
        await worker.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 30)


def plain_worker(url: str, queue: str, recorded: Recorded, name: str, concurrency: int = 6) -> Worker:
    return recorded.attach(Worker(queue, recorded.process, connection=url, schema=SCHEMA, concurrency=concurrency,
                                  lock_duration=5000, stalled_interval=1000, max_stalled_count=1000,
                                  drain_delay=5, name=name))


# -- 1. low timeouts ------------------------------------------------------------------------------------
LOW_TIMEOUT_JOBS = 4000 if CHAOS else 1000
STALLING = 3  # transactional jobs whose first attempt sits in its transaction past the idle timeout


async def test_low_server_timeouts_pass_normal_work_cut_a_stuck_statement_and_end_an_idle_transaction(
        strict_postgres: PostgresServer, queue_name: str, tmp_path: Path) -> None:
    """With statement_timeout 1 s and idle_in_transaction_session_timeout 300 ms on the server:

    - migrations (with groups), an add_bulk of 1000 jobs (a quarter in groups), two workers
      (concurrency 6) and a QueueEvents run the plan: every job ends as its handler decided, every
      final event is seen once, and the server log has no statement cancelled and no session ended
      by a timeout;
    - ``SELECT pg_sleep(5)`` on the Queue's pool is cut (QueryCanceled) and the pool carries on;
    - a transactional worker whose processor sleeps 1.5 s in its transaction on attempt 1: the
      server ends that session, the attempt fails with the lost connection, its row never commits,
      attempt 2 completes (one row per job, of the attempt that completed); the broken session is
      dropped from the pool and the server's sessions are exactly ours again."""
    url = strict_postgres.url
    await migrate_postgres(url, SCHEMA, groups=True)
    await admin_query(url, f'CREATE TABLE "{SCHEMA}".{EFFECTS} (job_id text, attempt int, pid int)')
    plan = plan_jobs(LOW_TIMEOUT_JOBS, seed=41, grouped=0.25, per_group=20, ms=(5, 30))
    # events kept for every job's final event (the default 10,000 is trimmed under CHAOS sizes)
    keep = (LOW_TIMEOUT_JOBS + 100) * 20
    queue = Queue(queue_name, connection=url, schema=SCHEMA, max_len_events=keep)
    events = QueueEvents(queue_name, url, schema=SCHEMA, blocking_timeout=60_000)
    seen = final_event_counter(events)
    recorded = Recorded(tmp_path)
    workers = [plain_worker(url, queue_name, recorded, f"lw{i}") for i in range(2)]
    tq_name = f"{queue_name}-tx"
    tqueue = Queue(tq_name, connection=url, schema=SCHEMA, max_len_events=keep)

    async def stalls_once(job: Any) -> Any:
        attempt = job.attempts_made + 1
        await job.transaction.execute(f"INSERT INTO {EFFECTS} (job_id, attempt, pid) VALUES (%s, %s, %s)",
                                      [job.id, attempt, os.getpid()])
        await asyncio.sleep(1.5 if job.data["stall"] and attempt == 1 else 0.02)
        return {"a": attempt}

    tx_failures: list[tuple[str, int, str]] = []
    tx_errors: list[str] = []
    tworker = Worker(tq_name, stalls_once, connection=url, schema=SCHEMA, transactional=True, concurrency=4,
                     lock_duration=10_000, drain_delay=5, name="tx")
    tworker.on("failed", lambda job, err, *_: tx_failures.append((str(job.id), job.attempts_made, str(err))))
    tworker.on("error", lambda err: tx_errors.append(f"{type(err).__name__}: {err}"))
    running: list[tuple[Worker, asyncio.Future[Any]]] = []
    try:
        await events.wait_until_ready()
        t0 = time.monotonic()
        await add_plan(queue, plan)
        add_s = time.monotonic() - t0
        for worker in workers:
            running.append((worker, await start(worker)))
        await poll_until(lambda: _ge(finished(queue), LOW_TIMEOUT_JOBS), 120, f"all {LOW_TIMEOUT_JOBS} jobs",
                         lambda: _counts(queue))
        work_s = time.monotonic() - t0

        # a stuck statement is cut at statement_timeout, and the pool goes on
        t1 = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            await queue.backend.connection.execute("SELECT pg_sleep(5)")
        cut_s = time.monotonic() - t1
        assert (await queue.get_job_counts("completed"))["completed"] == sum(
            1 for i in range(len(plan.ids)) if plan.spec(i)["plan"] in ("ok", "retry"))

        # a processor's transaction idle past idle_in_transaction_session_timeout
        tjobs = await tqueue.add_bulk([{"name": "t", "data": {"stall": i < STALLING},
                                        "opts": {"attempts": 2}} for i in range(12)])
        tids = [str(j.id) for j in tjobs]
        running.append((tworker, await start(tworker)))
        await poll_until(lambda: _ge(finished(tqueue), len(tids)), 60, "the transactional jobs",
                         lambda: _counts(tqueue))
        tstates = await final_states(url, SCHEMA, tq_name, tids)
        rows = await effect_rows(url)
        everyone = connections_of(queue, events, tqueue, *workers, tworker)
        await poll_until(lambda: sessions_match(url, everyone, idle=True), 30,
                         "the server's sessions to be exactly ours", lambda: sessions_detail(url, everyone))
        tx_pool = tworker.backend.connection.pool.get_stats()
    finally:
        await stop(running)
        await events.close()
        await queue.close()
        await tqueue.close()
    # after closing everything: no client session left
    await poll_until(lambda: _no_sessions(url), 30, "no client session", lambda: _text(str(_sessions_now)))

    log = server_log(strict_postgres)
    records = read_run_records(tmp_path)
    states = await final_states(url, SCHEMA, queue_name, plan.ids)
    table_events = await finish_events(url, SCHEMA, queue_name)
    figures = check_runs(plan, states, records["start"], records["end"], {}, table_events, fins=records["fin"],
                         lags=records["lag"])
    cancelled = cancelled_statements(log)
    idle_ended = log_pids(log, IDLE_TIMEOUT)
    report(f"\npostgres low timeouts (statement {STATEMENT_TIMEOUT}, idle in transaction "
           f"{IDLE_IN_TRANSACTION_TIMEOUT}): {figures.short()} add_bulk_s={add_s:.2f} work_s={work_s:.1f} "
           f"stuck_statement_cut_s={cut_s:.2f} cancelled={len(cancelled)} idle_ended={len(idle_ended)} "
           f"tx_pool={tx_pool}")
    judge_lock_lost(figures, "postgres low timeouts")
    assert figures.losses == 0 and figures.unexplained == 0
    want = {"completed": Counter(), "failed": Counter()}
    for i, job_id in enumerate(plan.ids):
        want["completed" if plan.spec(i)["plan"] in ("ok", "retry") else "failed"][job_id] += 1
    assert seen == want, "QueueEvents missed or repeated final events"
    assert not [e for e in recorded.errors if "timeout" in e], recorded.errors[:5]
    # our normal statements passed; only the deliberate one was cut
    assert len(cancelled) == 1 and "pg_sleep(5)" in log[log.index(STATEMENT_CANCELLED):][:400], \
        (cancelled, slow_lines(log))
    assert 0.9 < cut_s < 4, cut_s
    # the transactional jobs: attempt 1 of each stalling one lost its session (the server ended it);
    # another job needs a second attempt only if the server ended one more (a machine too busy to
    # run a 20 ms handler within 300 ms)
    stalling = tids[:STALLING]
    again = sorted(j for j in tids if tstates[j]["atm"] == 2)
    assert STALLING <= len(idle_ended) and set(stalling) <= set(again), (idle_ended, again)
    assert len(again) - STALLING <= len(idle_ended) - STALLING, (idle_ended, again)
    assert {j: tstates[j]["state"] for j in tids} == {j: "completed" for j in tids}, tstates
    assert {j: tstates[j]["atm"] for j in tids} == {j: 2 if j in again else 1 for j in tids}
    assert {j: tstates[j]["returnvalue"] for j in tids} == {j: {"a": tstates[j]["atm"]} for j in tids}
    assert rows == sorted((j, tstates[j]["atm"]) for j in tids), \
        f"the processors' rows committed (job, attempt): {rows}"
    assert sorted(f[0] for f in tx_failures) == again, tx_failures
    assert all(f[1] == 1 and "closed" in f[2] for f in tx_failures), tx_failures
    assert not tx_errors, tx_errors
    assert tx_pool["returns_bad"] + tx_pool.get("connections_lost", 0) >= STALLING, tx_pool


_sessions_now: list[Any] = []


async def _no_sessions(url: str) -> bool:
    _sessions_now[:] = await client_sessions(url)
    return not _sessions_now


async def _text(value: str) -> str:
    return value


async def _counts(queue: Queue) -> str:
    return f"counts {await queue.get_job_counts()}"


# -- 2. each kind of our sessions terminated in turn, under load -------------------------------------------
KINDS = ("queue pool", "worker lanes", "worker LISTEN", "QueueEvents LISTEN", "processor transactions")
KILL_ROUNDS = 5 if CHAOS else 2
KILL_JOBS = 3000 if CHAOS else 600
KILL_TX_JOBS = 600 if CHAOS else 150


async def test_terminating_each_kind_of_our_sessions_under_load_loses_no_job_and_leaks_no_session(
        kill_postgres: PostgresServer, queue_name: str, tmp_path: Path) -> None:
    """Two workers (concurrency 6) and a QueueEvents on one queue, a transactional worker
    (concurrency 4, each run writing a row in its transaction) on another, jobs added in parts; the
    server's low timeouts stay on (statement_timeout `KILL_STATEMENT_TIMEOUT` here). In turn,
    ``pg_terminate_backend`` of: the Queue's pooled sessions (then at once an add_bulk, which must
    not fail), worker fw0's lane sessions, its LISTEN session
    ``<queue>:w:fw0``, QueueEvents' ``<queue>:qe``, and the transactional worker's sessions idle in
    a processor's transaction; each kind twice (five times in ``make chaos``).

    After each kill, jobs keep finishing and the server's sessions become exactly the ones our
    pools, lanes and listeners hold again. At the end: every job ended as its handler decided and
    once in the events (repeats only of runs in flight at a kill), QueueEvents saw every final
    event once, each transactional job committed one row, of the attempt that completed, and only
    jobs whose transaction was ended (by us or the idle timeout) needed another attempt; nothing is
    lent out of a pool; after closing everything, no client session is left."""
    url = kill_postgres.url
    await migrate_postgres(url, SCHEMA)
    await admin_query(url, f'CREATE TABLE "{SCHEMA}".{EFFECTS} (job_id text, attempt int, pid int)')
    parts = KILL_ROUNDS * len(KINDS) + 1
    plan = plan_jobs(KILL_JOBS, seed=43, grouped=0, ms=(20, 80))
    tq_name = f"{queue_name}-tx"
    tplan = plan_jobs(KILL_TX_JOBS, seed=44, grouped=0, retry=0, always=0, fatal=0, ms=(20, 80))
    # events kept for every job's final event (the default 10,000 is trimmed under CHAOS sizes; upstream
    # trims a queue's events by the schema-wide event id, so each queue keeps room for both queues' events)
    keep = (KILL_JOBS + KILL_TX_JOBS) * 20
    queue = Queue(queue_name, connection=url, schema=SCHEMA, max_len_events=keep)
    tqueue = Queue(tq_name, connection=url, schema=SCHEMA, max_len_events=keep)
    events = QueueEvents(queue_name, url, schema=SCHEMA, blocking_timeout=60_000)
    seen = final_event_counter(events)
    recorded = Recorded(tmp_path)
    (tmp_path / "tx").mkdir()
    trecorded = Recorded(tmp_path / "tx", effects=EFFECTS)
    workers = [plain_worker(url, queue_name, recorded, f"fw{i}") for i in range(2)]
    tworker = trecorded.attach(Worker(tq_name, trecorded.process, connection=url, schema=SCHEMA, transactional=True,
                                      concurrency=4, lock_duration=5000, stalled_interval=1000,
                                      max_stalled_count=1000, drain_delay=5, name="ftx"))
    running: list[tuple[Worker, asyncio.Future[Any]]] = []
    windows: list[tuple[int, int]] = []
    killed: dict[str, list[int]] = {kind: [] for kind in KINDS}
    settle_s: dict[str, list[float]] = {kind: [] for kind in KINDS}
    everyone: list[PostgresConnection] = []
    part = 0
    tparts, tpart = KILL_ROUNDS + 1, 0

    async def add_next_part() -> None:
        nonlocal part
        if part < parts:
            await add_plan_part(queue, plan, part, parts)
            part += 1

    async def add_next_tx_part() -> None:  # one before each kill of the processors' sessions: they have work then
        nonlocal tpart
        if tpart < tparts:
            await add_plan_part(tqueue, tplan, tpart, tparts)
            tpart += 1

    async def victims(kind: str) -> set[int]:
        if kind == "queue pool":  # several pooled sessions at once: the pool keeps them, idle
            found = await asyncio.gather(*(queue.backend.connection.execute(
                "SELECT pg_backend_pid() AS pid, pg_sleep(0.05)") for _ in range(3)))
            return {r.rows[0]["pid"] for r in found}
        if kind == "worker lanes":
            channel = workers[0]._channel
            listener = channel.listener.conn  # type: ignore[union-attr]
            return {c.info.backend_pid for c, _ in workers[0].backend.connection._listeners
                    if c is not listener and not c.closed}
        if kind in ("worker LISTEN", "QueueEvents LISTEN"):
            name = f"{queue_name}:w:fw0" if kind == "worker LISTEN" else f"{queue_name}:qe"
            return {pid for pid, app, _ in await client_sessions(url) if app == name}
        raise AssertionError(f"{kind}: found and ended at once (end_processor_transactions)")

    async def rebuilt(kind: str, old: set[int]) -> bool:
        """The named LISTEN session is back: a new pid under the name."""
        fresh = await victims(kind)
        return bool(fresh) and not fresh & old

    try:
        await events.wait_until_ready()
        await add_next_part()
        await add_next_tx_part()
        for worker in [*workers, tworker]:
            running.append((worker, await start(worker)))
        everyone = connections_of(queue, tqueue, events, *workers, tworker)
        started = time.monotonic()
        for round_ in range(KILL_ROUNDS):
            for kind in KINDS:
                pids: set[int] = set()
                if kind == "processor transactions":
                    await add_next_tx_part()
                before, tbefore = await finished(queue), await finished(tqueue)
                t_kill = 0  # (the time of the statement that found the sessions, set by found())

                async def found() -> bool:
                    nonlocal t_kill
                    t_kill = now_ms()
                    if kind == "processor transactions":  # found and ended in one statement: still in it
                        pids.update(await end_processor_transactions(url))
                    else:
                        pids.update(await victims(kind))
                    return bool(pids)
                await poll_until(found, 30, f"sessions of kind {kind!r} to terminate")
                if kind != "processor transactions":
                    t_kill = now_ms()
                    assert await terminate_pids(url, pids) >= 1, f"{kind}: none of {pids} terminated"
                windows.append((t_kill, t_kill + 1000))
                killed[kind] += sorted(pids)
                if kind == "queue pool":
                    await asyncio.sleep(0.2)  # their FATAL has reached the sockets
                await add_next_part()  # right after a kill of the Queue's sessions: must not fail
                t0 = time.monotonic()
                # jobs keep flowing on both queues ...
                await poll_until(lambda: _ge(finished(queue), min(before + 20, len(plan.ids))), 60,
                                 f"jobs to finish after the kill of {kind!r} (round {round_})", lambda: _counts(queue))
                await poll_until(lambda: _ge(finished(tqueue), min(tbefore + 5, len(tplan.ids))), 60,
                                 f"transactional jobs to finish after the kill of {kind!r}", lambda: _counts(tqueue))
                # ... the LISTEN sessions came back under their names, and no session leaked
                if kind in ("worker LISTEN", "QueueEvents LISTEN"):
                    await poll_until(lambda: rebuilt(kind, pids), 30, f"the rebuilt {kind} session")
                if kind == "queue pool":
                    # a dead idle session stays in psycopg's pool until it is borrowed (then
                    # `PostgresConnection.borrow` discards it); the adds no longer go through the
                    # pool, so borrow each pooled session once, as the Queue's next calls would
                    await borrow_each_pooled_session(queue)
                await poll_until(lambda: sessions_match(url, everyone), 30,
                                 f"the server's sessions to be exactly ours after the kill of {kind!r}",
                                 lambda: sessions_detail(url, everyone))
                settle_s[kind].append(round(time.monotonic() - t0, 2))
        while part < parts:
            await add_next_part()
        while tpart < tparts:
            await add_next_tx_part()
        await poll_until(lambda: _ge(finished(queue), len(plan.ids)), 120, f"all {len(plan.ids)} jobs",
                         lambda: _counts(queue))
        await poll_until(lambda: _ge(finished(tqueue), len(tplan.ids)), 120, f"all {len(tplan.ids)} transactional "
                         "jobs", lambda: _counts(tqueue))
        seconds = time.monotonic() - started
        want = {"completed": Counter(), "failed": Counter()}
        for i, job_id in enumerate(plan.ids):
            want["completed" if plan.spec(i)["plan"] in ("ok", "retry") else "failed"][job_id] += 1
        await poll_until(lambda: _true(seen == want), 30, "QueueEvents to see every final event",
                         lambda: _text(f"seen {sum(map(len, seen.values()))} of {len(plan.ids)}"))
        await poll_until(lambda: sessions_match(url, everyone, idle=True), 30,
                         "the server's sessions to be exactly ours, none lent out", lambda: sessions_detail(url, everyone))
        lanes_open = workers[0]._channel.lanes.open  # type: ignore[union-attr]
    finally:
        await stop(running)
        await events.close()
        await queue.close()
        await tqueue.close()
    await poll_until(lambda: _no_sessions(url), 30, "no client session after closing everything",
                     lambda: _text(str(_sessions_now)))

    log = server_log(kill_postgres)
    records = read_run_records(tmp_path)
    states = await final_states(url, SCHEMA, queue_name, plan.ids)
    table_events = await finish_events(url, SCHEMA, queue_name)
    figures = check_runs(plan, states, records["start"], records["end"], {}, table_events, windows=windows,
                         fins=records["fin"], lags=records["lag"])
    figures.seconds = seconds
    tstates = await final_states(url, SCHEMA, tq_name, tplan.ids)
    tevents = await finish_events(url, SCHEMA, tq_name)
    rows = await effect_rows(url)
    idle_ended = log_pids(log, IDLE_TIMEOUT)
    cancelled = cancelled_statements(log)
    retried = sorted(j for j, st in tstates.items() if st["atm"] > 1)
    report(f"\npostgres sessions terminated ({KILL_ROUNDS} rounds of {', '.join(KINDS)}): {figures.short()} "
           f"killed={ {k: len(v) for k, v in killed.items()} } settle_s={settle_s} tx_retried={len(retried)} "
           f"idle_ended={len(idle_ended)} cancelled={len(cancelled)} seconds={seconds:.1f} "
           f"worker_errors={recorded.errors[:5]} tx_worker_errors={trecorded.errors[:5]} "
           f"tx_failures={trecorded.failures[:8]}")
    judge_lock_lost(figures, "postgres sessions terminated")
    assert figures.losses == 0 and figures.unexplained == 0
    assert seen == want, "QueueEvents missed or repeated final events"
    assert lanes_open >= 1
    # the transactional jobs: all completed once, one committed row each, of the attempt that completed
    assert {j: st["state"] for j, st in tstates.items()} == {j: "completed" for j in tplan.ids}
    odd = [(j, tevents["completed"][j], tevents["failed"][j]) for j in tplan.ids
           if tevents["completed"][j] != 1 or tevents["failed"][j] != 0]
    assert not odd, f"transactional jobs whose (completed, failed) events are not (1, 0): {odd[:10]}"
    assert rows == sorted((j, tstates[j]["atm"]) for j in tplan.ids), \
        f"rows committed other than one per job of its completing attempt: {sorted(set(rows))[:10]}"
    # another attempt only where a transaction was ended: by our kills, or the idle timeout
    ended_tx = len(killed["processor transactions"]) + len(idle_ended)
    assert KILL_ROUNDS <= len(retried) <= ended_tx, (retried, killed["processor transactions"], idle_ended)
    assert not cancelled, (cancelled[:5], slow_lines(log))
