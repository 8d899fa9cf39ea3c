"""Processors given to workers by path ("tests.processors:<name>"): for use_processes=True
(child processes must be able to import them) and for worker subprocesses."""
from __future__ import annotations

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
