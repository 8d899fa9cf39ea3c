"""Processors for use_processes=True workers in tests/test_worker_cancellation.py and
tests/test_worker_parity.py (the child processes import them by path)."""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from bullmq_compat import DelayedError, UnrecoverableError, WaitingChildrenError


def cancellable(job: Any, token: str, signal: Any) -> Any:
    """A plain def: polls signal.aborted (as Node's fixture_processor_cancel.js does)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        if signal.aborted:
            if (job.data or {}).get("unrecoverable"):
                raise UnrecoverableError(str(signal.reason))
            raise RuntimeError(str(signal.reason))
        time.sleep(0.02)
    return "never cancelled"


async def cancellable_async(job: Any, token: str, signal: Any) -> Any:
    """An async def: awaits signal.wait(); returns the pid when the job is a retry."""
    if job.attempts_made > 0:
        return {"pid": os.getpid(), "attempt": job.attempts_made + 1}
    reason = await asyncio.wait_for(signal.wait(), 30)
    signal.throw_if_aborted()
    return f"not raised: {reason}"


async def job_calls(job: Any) -> Any:
    await job.update_progress(42)
    await job.log("first row")
    await job.update_data({**(job.data or {}), "seen": True})
    return {"data": job.data, "progress": job.progress, "token": bool(job.token)}


def job_calls_sync(job: Any) -> Any:
    job.update_progress({"step": 1})
    count = job.log("from a thread")
    job.update_data({"sync": True})
    return {"log_count": count, "data": job.data}


async def parent_calls(job: Any, token: str) -> Any:
    values = await job.get_children_values()
    ignored = await job.get_ignored_children_failures()
    deps = await job.get_dependencies()
    count = await job.get_dependencies_count()
    return {"values": values, "ignored": ignored, "deps": deps, "count": count}


async def waits_for_children(job: Any, token: str) -> Any:
    if await job.move_to_waiting_children(token):
        raise WaitingChildrenError()
    return {"children": await job.get_children_values()}


async def delays_once(job: Any, token: str) -> Any:
    if not (job.data or {}).get("delayed"):
        await job.update_data({"delayed": True})
        await job.move_to_delayed(int(time.time() * 1000) + 300, token)
        raise DelayedError()
    return "after the delay"


async def bad_call(job: Any) -> Any:
    await job.move_to_delayed(int(time.time() * 1000) + 1000, "not-the-token")
    return "unreachable"


async def cancel_twin(job: Any, token: str, signal: Any) -> Any:
    """interop/cancel_processor.js in Python, with add_listener as Node's addEventListener."""
    if job.attempts_made > 0:
        return "done"
    await job.update_progress(1)
    if (job.data or {}).get("ignore"):
        for _ in range(1000):
            if signal.aborted:
                break
            await asyncio.sleep(0.02)
        return "ignored"
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[Any] = loop.create_future()

    def on_abort() -> None:
        if not outcome.done():
            cls = UnrecoverableError if job.data.get("unrecoverable") else RuntimeError
            outcome.set_exception(cls(str(signal.reason)))

    if signal.aborted:  # the cancel can come while update_progress is awaited
        on_abort()
    else:
        signal.add_listener(on_abort, once=True)
    return await asyncio.wait_for(outcome, 20)


async def adds_a_child_then_waits(job: Any, token: str) -> Any:
    """Adds a child (from the child process, with its own Queue), then waits for it."""
    from bullmq_compat import Queue

    if not (job.data or {}).get("step"):
        async with Queue(job.data["kids"], connection=job.data["redis"]) as kids:
            await kids.add("kid", {"v": 5}, parent={"id": str(job.id), "queue": f"bull:{job.queue_name}"})
        await job.update_data({**job.data, "step": "after"})
        if await job.move_to_waiting_children(token):
            raise WaitingChildrenError()
        return "no pending children?"
    return await job.get_children_values()
