"""Batches across languages (issue #16): jobs added by Node's Queue, processed by a Python batch
worker, read back by Node -- its QueueEvents (interop/events.js) hearing each job's own events and
its getJob seeing each job's return value, failed reason and attempts -- on Redis and on PostgreSQL
(Node's own Postgres backend on the same schema)."""
from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from bullmq_compat import Queue, Worker
from tests.helpers import running, wait_until
from tests.node import node
from tests.pg_interop_helpers import events_js, pg_of

pytestmark = pytest.mark.node

COUNT = 10
BOOM = 1   # its first attempt raises in the processor: its whole batch fails once, then completes
BAD = 3    # set_as_failed on every attempt: fails for good after its 2 attempts


@pytest.fixture(params=["redis", "postgres"])
async def where(request: Any) -> AsyncIterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(Node's JSON fields, Python's connection keywords) for each backend."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield {"redis": url}, {"connection": url}
        return
    url = request.getfixturevalue("postgres_url")
    schema = request.getfixturevalue("pg_schema")
    pg = pg_of(url, schema)
    await node("migrate", **pg)
    yield pg, {"connection": url, "schema": schema}


async def process(job: Any) -> list[Any]:
    batch = job.get_batch()
    if any(b.data["k"] == BOOM and b.attempts_made == 0 for b in batch):
        raise RuntimeError("the batch broke")
    for b in batch:
        if b.data["k"] == BAD:
            b.set_as_failed(ValueError(f"bad item {b.data['k']}"))
    return [{"got": b.data["k"]} for b in batch]


async def test_node_produces_python_batches_and_node_reads_every_job(
        where: tuple[dict[str, Any], dict[str, Any]], queue_name: str) -> None:
    node_args, py_args = where
    async with events_js("listen", **node_args, queue=queue_name, until="delayed", timeoutMs=120000) as listener:
        assert listener.first_line == {"ready": True}
        added = await node("addBulk", **node_args, queue=queue_name, jobs=[
            {"name": "item", "data": {"k": k}, "opts": {"attempts": 2}} for k in range(COUNT)])
        ids: list[str] = added["ids"]
        worker = Worker(queue_name, process, drain_delay=0.5, batch={"size": 4}, **py_args)

        async def all_finished() -> bool:
            for job_id in ids:
                if await node("getState", **node_args, queue=queue_name, id=job_id) not in ("completed", "failed"):
                    return False
            return True

        async with running(worker):
            await wait_until(all_finished, 120, "Node seeing every job finished", interval=0.5)
        queue = Queue(queue_name, **py_args)
        try:
            await queue.add("end", {}, delay=60000)  # its 'delayed' event ends the listener
        finally:
            await queue.close()
        heard = await listener.result()

    jobs = {job_id: await node("getJob", **node_args, queue=queue_name, id=job_id) for job_id in ids}
    for k, job_id in enumerate(ids):
        job = jobs[job_id]
        if k == BAD:
            assert job["state"] == "failed" and job["failedReason"] == f"bad item {k}"
            assert job["attemptsMade"] == 2 and job["returnvalue"] is None
        else:
            assert job["state"] == "completed" and job["returnvalue"] == {"got": k}
            assert job["attemptsMade"] in (1, 2)  # 2 for the jobs that shared BOOM's first batch
            assert job["failedReason"] in (None, "the batch broke")  # a retried job keeps its last reason
    assert jobs[ids[BOOM]]["attemptsMade"] == 2 and jobs[ids[BOOM]]["failedReason"] == "the batch broke"

    assert heard["timedOut"] is False
    events = [(e["name"], e["args"][0]) for e in heard["events"] if e["args"] and isinstance(e["args"][0], dict)]
    completed = {a["jobId"]: a for name, a in events if name == "completed"}
    assert set(completed) == {job_id for k, job_id in enumerate(ids) if k != BAD}
    for k, job_id in enumerate(ids):
        if k != BAD:
            assert completed[job_id] == {"jobId": job_id, "returnvalue": {"got": k}, "prev": "active"}
    bad_failures = [a for name, a in events if name == "failed" and a["jobId"] == ids[BAD]]
    assert bad_failures and all(a["failedReason"] == f"bad item {BAD}" for a in bad_failures)
    actives = [a["jobId"] for name, a in events if name == "active"]
    assert set(actives) == set(ids)  # every batched job was claimed as a job of its own
    assert actives.count(ids[BOOM]) == 2
