"""Shared by tests/test_interop_pg_groups.py: per-group FIFO on PostgreSQL (our gate's triggers)
under unmodified Node BullMQ on its createPostgresBackend (interop/pg_groups.js) and Python Workers.

Every handler -- Node's in interop/pg_groups.js and the Python one here -- records its run in
tables of the test's schema, with the database's clock (one clock for every process):

    interop_group_count (queue, g, n)   n: how many of g's jobs run now (++ at start, -- at end)
    interop_group_run   one row a run: run_id (serial, the order of starts), queue, g (the job's
                        opts.group.id), s (data.s: its place in its group's add order), job_id,
                        w ('node' | 'py'), name, pid, attempt, t0, t1 (ms), n (the count at start)
    interop_group_signal (queue, key)   what a test lets through: data.holdUntil waits for its key,
                        data.failUnless fails for good until its key is there

`read_runs` turns the runs into tests/group_helpers.check_groups's (ends, starts).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import psycopg

from bullmq_compat import Job, UnrecoverableError, Worker
from tests.node import INTEROP, NodeProcess, run_node

PG_GROUPS_JS = INTEROP / "pg_groups.js"

RECORDER_SQL = """
CREATE TABLE interop_group_count (queue text, g text, n integer NOT NULL, PRIMARY KEY (queue, g));
CREATE TABLE interop_group_run (
  run_id bigserial PRIMARY KEY, queue text NOT NULL, g text, s integer, job_id text NOT NULL,
  w text NOT NULL, name text, pid integer, attempt integer, t0 bigint NOT NULL, t1 bigint, n integer NOT NULL);
CREATE TABLE interop_group_signal (queue text, key text, PRIMARY KEY (queue, key));
"""

NOW_MS = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

START_SQL = f"""
  WITH c AS (
    INSERT INTO interop_group_count AS c (queue, g, n) VALUES (%(queue)s, %(g)s, 1)
    ON CONFLICT (queue, g) DO UPDATE SET n = c.n + 1
    RETURNING n
  )
  INSERT INTO interop_group_run (queue, g, s, job_id, w, name, pid, attempt, t0, n)
  SELECT %(queue)s, %(g)s, %(s)s, %(id)s, 'py', %(name)s, %(pid)s, %(attempt)s, {NOW_MS}, c.n FROM c
  RETURNING run_id"""

END_SQL = f"""
  WITH d AS (UPDATE interop_group_count SET n = n - 1 WHERE queue = %(queue)s AND g = %(g)s RETURNING n)
  UPDATE interop_group_run SET t1 = {NOW_MS} WHERE run_id = %(run_id)s"""

SIGNAL_SQL = "SELECT 1 FROM interop_group_signal WHERE queue = %(queue)s AND key = %(key)s"


async def connect(url: str, schema: str) -> psycopg.AsyncConnection[Any]:
    """An autocommit session whose search_path is ``schema``."""
    return await psycopg.AsyncConnection.connect(url, autocommit=True, options=f"-c search_path={schema}")


async def sql(url: str, schema: str, text: str, params: Optional[dict[str, Any]] = None) -> list[tuple[Any, ...]]:
    """Run ``text`` in ``schema`` (one session of its own); the rows it returned ([] for none)."""
    async with await connect(url, schema) as conn:
        cur = await conn.execute(text, params)
        return list(await cur.fetchall()) if cur.description else []


async def create_recorder(url: str, schema: str) -> None:
    """The recorder's tables, in ``schema`` (which must exist)."""
    await sql(url, schema, RECORDER_SQL)


async def send_signal(url: str, schema: str, queue: str, key: str) -> None:
    await sql(url, schema, "INSERT INTO interop_group_signal VALUES (%(queue)s, %(key)s) ON CONFLICT DO NOTHING",
              {"queue": queue, "key": key})


async def runs(url: str, schema: str, queue: str) -> list[dict[str, Any]]:
    """Every recorded run of ``queue``, in the order they started."""
    rows = await sql(url, schema, "SELECT g, s, job_id, w, name, pid, attempt, t0, t1, n FROM interop_group_run "
                                  "WHERE queue = %(queue)s ORDER BY run_id", {"queue": queue})
    keys = ("g", "s", "id", "w", "name", "pid", "attempt", "t0", "t1", "n")
    return [dict(zip(keys, row)) for row in rows]


async def read_runs(url: str, schema: str, queue: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(finished runs, starts) as tests/group_helpers.check_groups takes them."""
    every = await runs(url, schema, queue)
    return [r for r in every if r["t1"] is not None], every


async def finished_count(url: str, schema: str, queue: str) -> int:
    [(n,)] = await sql(url, schema, "SELECT count(*) FROM interop_group_run WHERE queue = %(queue)s "
                                    "AND t1 IS NOT NULL", {"queue": queue})
    return int(n)


def recording_processor(url: str, schema: str, queue: str, name: str = "py"
                        ) -> tuple[Callable[[Job], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    """The Python handler, recording as interop/pg_groups.js's does; returns it and its closer."""
    pid = os.getpid()
    conns: list[psycopg.AsyncConnection[Any]] = []
    lock = asyncio.Lock()

    async def conn() -> psycopg.AsyncConnection[Any]:
        async with lock:
            if not conns:
                conns.append(await connect(url, schema))
            return conns[0]

    async def run(text: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        c = await conn()
        cur = await c.execute(text, params)
        return list(await cur.fetchall()) if cur.description else []

    async def process(job: Job) -> Any:
        data = job.data if isinstance(job.data, dict) else {}
        group = job.opts.get("group") if isinstance(job.opts, dict) else None
        g = group.get("id") if isinstance(group, dict) else None
        params = {"queue": queue, "g": g, "s": data.get("s"), "id": job.id, "name": name, "pid": pid,
                  "attempt": job.attempts_started}
        [(run_id,)] = await run(START_SQL, params)
        if data.get("holdUntil"):
            await wait_signal(run, queue, data["holdUntil"])
        if data.get("sleepMs"):
            await asyncio.sleep(data["sleepMs"] / 1000)
        await run(END_SQL, {"queue": queue, "g": g, "run_id": run_id})
        if data.get("fail"):
            raise UnrecoverableError(str(data["fail"]))
        if data.get("failUnless") and not await run(SIGNAL_SQL, {"queue": queue, "key": data["failUnless"]}):
            raise UnrecoverableError(f"no {data['failUnless']} yet")
        return {"g": g, "s": data.get("s")}

    async def close() -> None:
        for c in conns:
            await c.close()

    return process, close


async def wait_signal(run: Callable[[str, dict[str, Any]], Awaitable[list[Any]]], queue: str, key: str,
                      timeout: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await run(SIGNAL_SQL, {"queue": queue, "key": key}):
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"signal {key} never came")
        await asyncio.sleep(0.025)


@contextlib.asynccontextmanager
async def python_workers(url: str, schema: str, queue: str, count: int, *, concurrency: int = 4,
                         **opts: Any) -> AsyncIterator[list[Worker]]:
    """``count`` in-process Python Workers with the recording processor, closed on the way out."""
    process, close = recording_processor(url, schema, queue)
    opts.setdefault("drain_delay", 1)
    workers = [Worker(queue, process, connection=url, schema=schema, concurrency=concurrency,
                      name=f"py{i}", **opts) for i in range(count)]
    tasks = [asyncio.ensure_future(w.run(handle_signals=False)) for w in workers]
    try:
        await asyncio.sleep(0.05)
        for task in tasks:
            assert not task.done(), f"worker.run() ended at once: {task.exception() if task.done() else ''}"
        yield workers
    finally:
        for worker in workers:
            await worker.close()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        await close()


def node_group_workers(url: str, schema: str, queue: str, **args: Any) -> NodeProcess:
    """interop/pg_groups.js work: Node Workers on createPostgresBackend with the recording handler
    (fields: workers, concurrency, name, drainDelay, lockDuration, migrate). Entering waits until
    they are connected."""
    payload = {"postgres": url, "schema": schema, "queue": queue, "migrate": False, **args}
    return NodeProcess(PG_GROUPS_JS, "work", json.dumps(payload), start_timeout=60)


async def pg_groups_js(op: str, url: str, schema: str, queue: str, **args: Any) -> Any:
    """A one-shot interop/pg_groups.js op (retry, retryJobs, ready, jobStates): its JSON result."""
    payload = {"postgres": url, "schema": schema, "queue": queue, **args}
    return await run_node([str(PG_GROUPS_JS), op, json.dumps(payload)], label=f"pg_groups.js {op}", budget=90)
