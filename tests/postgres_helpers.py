"""Helpers of the PostgresBackend tests (the backend itself is conftest's ``pg_backend``): jobs to
add, and jobs finished with upstream's own worker commands (move_to_active, move_to_completed,
move_to_failed) run directly, as a Node worker runs them."""
from __future__ import annotations

import time
import uuid
from typing import Any

from bullmq_compat._backends.base import NewJob
from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._wire.options import merge_defaults, normalize_job_options


def now() -> int:
    return int(time.time() * 1000)


def new(name: str = "n", data: Any = None, job_id: str = "", queue_name: str = "", **opts: Any) -> NewJob:
    return NewJob(name, {} if data is None else data, merge_defaults(None, normalize_job_options(opts)), now(),
                  job_id, queue_name)


async def add(backend: PostgresBackend, *jobs: NewJob) -> list[Any]:
    return await backend.add_jobs(list(jobs))


async def add_one(backend: PostgresBackend, job: NewJob) -> str:
    [job_id] = await backend.add_jobs([job])
    assert isinstance(job_id, str), job_id
    return job_id


async def take(backend: PostgresBackend, token: str = "tok") -> str:
    """Claim the next job as a Node worker does; returns its id."""
    rows = (await backend.connection.run("move_to_active", [backend.name, token, 30000, now(), None, None, None])).rows
    assert rows, "nothing to claim"
    return str(rows[0]["id"])


async def complete(backend: PostgresBackend, value_json: str = '"ok"') -> str:
    job_id = await take(backend)
    await backend.connection.run("move_to_completed", [backend.name, job_id, "tok", value_json, now(), False,
                                                       None, None])
    return job_id


async def fail(backend: PostgresBackend, reason: str = "boom") -> str:
    job_id = await take(backend)
    await backend.connection.run("move_to_failed", [backend.name, job_id, "tok", reason, '["at x"]', now(), False,
                                                    None, None])
    return job_id


async def stored(backend: PostgresBackend, column: str, job_id: str) -> Any:
    rows = (await backend.connection.execute(f"SELECT {column} AS v FROM job WHERE queue = $1 AND id = $2",
                                             [backend.name, job_id])).rows
    return rows[0]["v"] if rows else None


async def count_jobs(backend: PostgresBackend) -> int:
    rows = (await backend.connection.execute("SELECT count(*)::int AS n FROM job WHERE queue = $1",
                                             [backend.name])).rows
    return int(rows[0]["n"])


async def flow(backend: PostgresBackend) -> tuple[str, list[str]]:
    parent_id = str(uuid.uuid4())
    children = [new("child", {"i": i}, job_id=f"c{i}", parent={"id": parent_id, "queue": "q"}) for i in range(2)]
    nodes: list[tuple[NewJob, dict[str, Any] | None]] = [(c, {"parentKey": f"q:{parent_id}"}) for c in children]
    nodes.append((new("parent", job_id=parent_id), {"addToWaitingChildren": True}))
    ids = await backend.add_flow(nodes)  # children first: sent parents first
    return ids[-1], ids[:-1]
