"""Processors for the CLI tests (imported by `bullmq-compat worker tests.cli_jobs:...`)."""
import time


async def double(job):
    return {"double": job.data["i"] * 2}


def slow(job):
    time.sleep(1.0)
    return "slow-done"


async def batch_sizes(job):
    """A batch processor: each job of the batch gets the batch's size."""
    return len(job.get_batch())
