"""Shared by the cross-language PostgreSQL interop tests (tests/test_interop_pg_*.py): Python and
Node BullMQ (interop/*.js on Node's createPostgresBackend) on one schema of one database.

The schema is conftest's ``pg_schema`` (fresh, dropped after the test); queue names come from
conftest's ``queue_name`` (unique: Node's getWorkers reads the application_name of every session
of the database). Every wait polls a condition with a generous bound (the machine is shared).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional

from bullmq_compat import Job, Queue, Worker
from tests.helpers import eventually  # noqa: F401 (re-exported)
from tests.node import INTEROP, NodeProcess, node
from tests.pg_node_helpers import apsql  # noqa: F401 (re-exported)
from tests.processors import behave as process

FLOW_JS = INTEROP / "flow.js"
EVENTS_JS = INTEROP / "events.js"


def pg_of(postgres_url: str, schema: str, *, migrate: Optional[bool] = True) -> dict[str, Any]:
    """The interop scripts' JSON fields for Node's Postgres backend on ``schema``."""
    args: dict[str, Any] = {"postgres": postgres_url, "schema": schema}
    if migrate is not None:
        args["migrate"] = migrate
    return args


@contextlib.asynccontextmanager
async def py_worker(queue: str, postgres_url: str, schema: str, processor: Callable[[Job], Awaitable[Any]] = process,
                    **opts: Any) -> AsyncIterator[Worker]:
    """A Python Worker on the schema, running in the background for the block (closed after)."""
    opts.setdefault("drain_delay", 1)
    worker = Worker(queue, processor, connection=postgres_url, schema=schema, **opts)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await asyncio.sleep(0.05)
        assert not task.done(), f"worker.run() ended at once: {task.exception() if task.done() else ''}"
        yield worker
    finally:
        await worker.close()
        await asyncio.wait_for(task, 60)


@contextlib.asynccontextmanager
async def py_queue(name: str, postgres_url: str, schema: str, **opts: Any) -> AsyncIterator[Queue]:
    queue = Queue(name, connection=postgres_url, schema=schema, **opts)
    try:
        yield queue
    finally:
        await queue.close()


def node_work(pg: Mapping[str, Any], queue: str, count: int, timeout_ms: int = 90000, **extra: Any) -> NodeProcess:
    """A Node Worker (cli.js work) in the background; entering waits until it is connected."""
    return NodeProcess.work(**pg, queue=queue, count=count, timeoutMs=timeout_ms, **extra)


async def node_job(pg: Mapping[str, Any], queue: str, job_id: str) -> Any:
    """What Node's Queue.getJob reads of the job (cli.js jobJSON), or None."""
    return await node("getJob", **pg, queue=queue, id=job_id)


async def node_call(pg: Mapping[str, Any], queue: str, method: str, *args: Any) -> Any:
    return await node("queueCall", **pg, queue=queue, method=method, args=list(args))


async def node_states(pg: Mapping[str, Any], queue: str, ids: list[str], want: str) -> bool:
    """True when Node sees every one of ``ids`` in state ``want``."""
    for job_id in ids:
        if await node("getState", **pg, queue=queue, id=job_id) != want:
            return False
    return True


async def flow_js(op: str, **args: Any) -> Any:
    """``node interop/flow.js <op> <json(args)>``: its JSON result."""
    async with NodeProcess(FLOW_JS, op, json.dumps(args), wait_for_line=False,
                           result_timeout=float(args.get("timeoutMs", 30000)) / 1000 + 30) as proc:
        return await proc.result()


def flow_work(**args: Any) -> NodeProcess:
    """A Node flow.js worker in the background; entering waits until it consumes."""
    return NodeProcess(FLOW_JS, "work", json.dumps({**args, "ready": True}),
                       result_timeout=float(args.get("timeoutMs", 60000)) / 1000 + 30)


def events_js(op: str, **args: Any) -> NodeProcess:
    """interop/events.js in the background; entering waits until its QueueEvents listens."""
    return NodeProcess(EVENTS_JS, op, json.dumps(args), result_timeout=float(args.get("timeoutMs", 60000)) / 1000 + 30)
