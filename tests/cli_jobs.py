"""Processors for the CLI tests (imported by `bullmq-compat worker tests.cli_jobs:...`)."""
import time


async def double(job):
    return {"double": job.data["i"] * 2}


def slow(job):
    time.sleep(1.0)
    return "slow-done"


async def fail_when_asked(job):
    """Fails the jobs whose data has ``fail`` (for the Prometheus tests' failed counters)."""
    if (job.data or {}).get("fail"):
        raise ValueError("asked to fail")
    return "ok"


async def batch_sizes(job):
    """A batch processor: each job of the batch gets the batch's size."""
    return len(job.get_batch())
