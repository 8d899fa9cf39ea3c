"""Processors given to workers by path ("tests.processors:<name>"): for use_processes=True
(child processes must be able to import them) and for worker subprocesses."""
from __future__ import annotations

import asyncio
import os
from typing import Any


def cpu_task(job: Any) -> dict[str, int]:
    """Some CPU work; returns the pid of the process that ran it."""
    n = int((job.data or {}).get("n", 10000))
    return {"pid": os.getpid(), "sum": sum(i * i for i in range(n))}


def crash_task(job: Any) -> dict[str, int]:
    """Kills its own process (no clean-up, no exception) when the job asks for it."""
    if (job.data or {}).get("crash"):
        os._exit(1)
    return {"pid": os.getpid()}


async def behave(job: Any) -> Any:
    """The Python twin of interop's processJob (cli.js, flow.js): what it does comes from
    ``job.data["behave"]`` (sleepMs, unrecoverable, fail, failTimes, children, return)."""
    from bullmq_compat import UnrecoverableError

    todo = (job.data.get("behave") if isinstance(job.data, dict) else None) or None
    if not todo:
        return {"py": job.data}
    if todo.get("sleepMs"):
        await asyncio.sleep(todo["sleepMs"] / 1000)
    if "unrecoverable" in todo:
        raise UnrecoverableError(todo["unrecoverable"])
    if "fail" in todo:
        raise RuntimeError(todo["fail"])
    if "failTimes" in todo:
        if job.attempts_made < todo["failTimes"]:
            raise RuntimeError(todo.get("message", "failing on purpose"))
        return {"ok": True}
    if todo.get("children"):
        return {
            "children": await job.get_children_values(),
            "ignored": await job.get_ignored_children_failures(),
            "counts": await job.get_dependencies_count(),
        }
    if "return" in todo:
        return todo["return"]
    return {"py": job.data}
