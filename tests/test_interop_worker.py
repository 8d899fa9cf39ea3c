"""Python and Node workers on shared queues (issue #3): Node-added jobs processed by the Python
Worker and read back by Node; Python-added jobs processed by Node's Worker and read back by
Python; and both workers consuming one queue at once."""
from __future__ import annotations

import asyncio
import signal
import time
from typing import Any, Callable

import pytest

from bullmq_compat import Job, Queue, WaitingChildrenError, Worker
from tests.helpers import wait_until
from tests.node import NodeProcess, node
from tests.processors import behave

pytestmark = pytest.mark.node


class Behave:
    """The Python twin of cli.js's processJob: behaviour from job.data["behave"]; records job ids."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.starts: dict[str, list[float]] = {}

    async def __call__(self, job: Job) -> Any:
        self.order.append(str(job.id))
        self.starts.setdefault(str(job.id), []).append(time.time())
        result = await behave(job)
        todo = job.data.get("behave") if isinstance(job.data, dict) else None
        if todo and "failTimes" in todo:  # which attempt got through, for the retry tests
            result = {**result, "attempt": job.attempts_made + 1}
        return result


async def python_worker_until(redis_url: str, queue_name: str, processor: Any, done: Callable[[], Any],
                              timeout: float = 15.0, **kwargs: Any) -> Worker:
    worker = Worker(queue_name, processor, connection=redis_url, drain_delay=0.5, **kwargs)
    async with worker:
        await wait_until(done, timeout, "the Python worker to finish the jobs")
    return worker


async def node_counts(redis_url: str, queue_name: str) -> dict[str, int]:
    return await node("getJobCounts", redis=redis_url, queue=queue_name,
                      types=["completed", "failed", "active", "waiting", "delayed", "prioritized"])


# -- Node adds, Python processes, Node reads ------------------------------------------------------
async def test_node_added_jobs_processed_by_python(redis_url: str, queue_name: str) -> None:
    q = dict(redis=redis_url, queue=queue_name)
    plain = (await node("add", **q, name="plain", data={"v": 1}))["id"]
    returns = (await node("add", **q, name="returns", data={"behave": {"return": [1, "two", None]}}))["id"]
    delayed = (await node("add", **q, name="delayed", data={"v": 2}, opts={"delay": 400}))["id"]
    flaky = (await node("add", **q, name="flaky", data={"behave": {"failTimes": 2, "message": "py says no"}},
                        opts={"attempts": 3, "backoff": {"type": "fixed", "delay": 150}}))["id"]
    exhausted = (await node("add", **q, name="exhausted", data={"behave": {"fail": "always"}},
                            opts={"attempts": 2, "backoff": {"type": "exponential", "delay": 50}}))["id"]
    doomed = (await node("add", **q, name="doomed", data={"behave": {"unrecoverable": "never again"}},
                         opts={"attempts": 5}))["id"]
    everything = [plain, returns, delayed, flaky, exhausted, doomed]

    behave = Behave()

    async def all_finished() -> bool:
        counts = await node_counts(redis_url, queue_name)
        return counts["completed"] + counts["failed"] == len(everything)

    started = time.time()
    await python_worker_until(redis_url, queue_name, behave, all_finished, name="py-interop")

    job = await node("getJob", **q, id=plain)
    assert (job["state"], job["returnvalue"], job["attemptsMade"]) == ("completed", {"py": {"v": 1}}, 1)
    assert job["attemptsStarted"] == 1 and job["failedReason"] is None
    assert job["processedOn"] <= job["finishedOn"]

    job = await node("getJob", **q, id=returns)
    assert (job["state"], job["returnvalue"]) == ("completed", [1, "two", None])

    job = await node("getJob", **q, id=delayed)
    assert (job["state"], job["returnvalue"]) == ("completed", {"py": {"v": 2}})
    assert job["processedOn"] - job["timestamp"] >= 400
    assert behave.starts[delayed][0] >= started  # not before its delay

    job = await node("getJob", **q, id=flaky)
    assert (job["state"], job["returnvalue"]) == ("completed", {"ok": True, "attempt": 3})
    assert (job["attemptsMade"], job["attemptsStarted"]) == (3, 3)
    assert job["failedReason"] == "py says no"
    assert len(job["stacktrace"]) == 2 and "RuntimeError: py says no" in job["stacktrace"][-1]
    gaps = [b - a for a, b in zip(behave.starts[flaky], behave.starts[flaky][1:])]
    assert all(gap >= 0.15 - 0.005 for gap in gaps), gaps  # whole-ms delays

    job = await node("getJob", **q, id=exhausted)
    assert (job["state"], job["failedReason"], job["attemptsMade"]) == ("failed", "always", 2)
    assert job["returnvalue"] is None
    assert len(job["stacktrace"]) == 2
    assert job["stacktrace"][-1].startswith("Traceback (most recent call last):")
    assert job["stacktrace"][-1].endswith("RuntimeError: always")

    job = await node("getJob", **q, id=doomed)
    assert (job["state"], job["failedReason"], job["attemptsMade"]) == ("failed", "never again", 1)
    assert "UnrecoverableError: never again" in job["stacktrace"][-1]
    assert behave.order.count(doomed) == 1

    counts = await node_counts(redis_url, queue_name)
    assert counts == {"completed": 4, "failed": 2, "active": 0, "waiting": 0, "delayed": 0, "prioritized": 0}
    assert sorted(await node("getJobs", **q, types=["failed"])) == sorted([exhausted, doomed])
    # the worker name Python wrote ("pb") is what Node reads back as processedBy
    py_queue = Queue(queue_name, connection=redis_url)
    try:
        assert (await py_queue.get_job(plain)).processed_by == "py-interop"
    finally:
        await py_queue.close()


async def test_node_priorities_and_lifo_order_for_python(redis_url: str, queue_name: str) -> None:
    q = dict(redis=redis_url, queue=queue_name)
    added = await node("addBulk", **q, jobs=[
        {"name": "fifo-1", "data": {}},
        {"name": "fifo-2", "data": {}},
        {"name": "lifo", "data": {}, "opts": {"lifo": True}},
        {"name": "p5", "data": {}, "opts": {"priority": 5}},
        {"name": "p1", "data": {}, "opts": {"priority": 1}},
        {"name": "p3", "data": {}, "opts": {"priority": 3}},
    ])
    fifo1, fifo2, lifo, p5, p1, p3 = added["ids"]
    counts = await node("getJobCounts", **q, types=["waiting", "prioritized"])
    assert counts == {"waiting": 3, "prioritized": 3}

    behave = Behave()
    await python_worker_until(redis_url, queue_name, behave, lambda: len(behave.order) == 6)
    # as Node's worker: the wait list first (LIFO at its head), then prioritized by priority
    assert behave.order == [lifo, fifo1, fifo2, p1, p3, p5]
    for job_id in added["ids"]:
        job = await node("getJob", **q, id=job_id)
        assert job["state"] == "completed" and job["returnvalue"] == {"py": {}}


# -- Python adds, Node processes, Python reads ----------------------------------------------------
async def test_python_added_jobs_processed_by_node(redis_url: str, queue_name: str) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        plain = await queue.add("plain", {"v": 1})
        returns = await queue.add("returns", {"behave": {"return": {"nested": [1, 2]}}})
        delayed = await queue.add("delayed", {"v": 2}, delay=400)
        flaky = await queue.add("flaky", {"behave": {"failTimes": 2, "message": "node says no"}},
                                attempts=3, backoff={"type": "fixed", "delay": 150})
        exhausted = await queue.add("exhausted", {"behave": {"fail": "always"}}, attempts=2,
                                    backoff={"type": "exponential", "delay": 50})
        doomed = await queue.add("doomed", {"behave": {"unrecoverable": "never again"}}, attempts=5)

        outcome = await node("work", redis=redis_url, queue=queue_name, count=6, timeoutMs=20000)
        assert outcome["timedOut"] is False
        assert sorted(outcome["completed"]) == sorted([plain.id, returns.id, delayed.id, flaky.id])
        assert sorted(outcome["failed"]) == sorted([exhausted.id, doomed.id])

        job = await queue.get_job(plain.id)
        assert await job.get_state() == "completed"
        assert (job.returnvalue, job.attempts_made, job.attempts_started) == ({"echo": {"v": 1}}, 1, 1)
        assert job.failed_reason is None and job.processed_on <= job.finished_on

        job = await queue.get_job(returns.id)
        assert job.returnvalue == {"nested": [1, 2]}

        job = await queue.get_job(delayed.id)
        assert job.returnvalue == {"echo": {"v": 2}}
        assert job.processed_on - job.timestamp >= 400

        job = await queue.get_job(flaky.id)
        assert await job.get_state() == "completed"
        assert (job.returnvalue, job.attempts_made, job.attempts_started) == ({"ok": True}, 3, 3)
        assert job.failed_reason == "node says no"
        assert len(job.stacktrace) == 2 and job.stacktrace[-1].startswith("Error: node says no")

        job = await queue.get_job(exhausted.id)
        assert await job.get_state() == "failed"
        assert (job.failed_reason, job.attempts_made) == ("always", 2)
        assert len(job.stacktrace) == 2 and job.stacktrace[-1].startswith("Error: always")

        job = await queue.get_job(doomed.id)
        assert await job.get_state() == "failed"
        assert (job.failed_reason, job.attempts_made) == ("never again", 1)
        assert job.stacktrace[-1].startswith("UnrecoverableError: never again")
    finally:
        await queue.close()


async def test_python_priorities_and_lifo_order_for_node(redis_url: str, queue_name: str) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        fifo1 = await queue.add("fifo-1", {})
        fifo2 = await queue.add("fifo-2", {})
        lifo = await queue.add("lifo", {}, lifo=True)
        p5 = await queue.add("p5", {}, priority=5)
        p1 = await queue.add("p1", {}, priority=1)
        p3 = await queue.add("p3", {}, priority=3)
        outcome = await node("work", redis=redis_url, queue=queue_name, count=6, timeoutMs=15000)
        assert outcome["completed"] == [lifo.id, fifo1.id, fifo2.id, p1.id, p3.id, p5.id]
        for job in (fifo1, fifo2, lifo, p5, p1, p3):
            assert (await queue.get_job(job.id)).returnvalue == {"echo": {}}
    finally:
        await queue.close()


# -- both at once ---------------------------------------------------------------------------------
async def test_node_and_python_workers_share_a_queue(redis_url: str, queue_name: str) -> None:
    total = 300
    python_ids: list[str] = []

    async def process(job: Job) -> Any:
        python_ids.append(str(job.id))
        await asyncio.sleep(0.005)
        return {"by": "python"}

    queue = Queue(queue_name, connection=redis_url)
    worker = Worker(queue_name, process, connection=redis_url, name="py-shared", concurrency=5,
                    drain_delay=0.5)
    try:
        async with NodeProcess.work(redis=redis_url, queue=queue_name, count=total, concurrency=5,
                                    timeoutMs=60000) as node_worker:
            async with worker:
                added = await queue.add_bulk(
                    [{"name": "shared", "data": {"i": i, "behave": {"sleepMs": 5}}} for i in range(total)])
                all_ids = {job.id for job in added}

                async def all_completed() -> bool:
                    return (await queue.get_job_counts("completed"))["completed"] >= total
                await wait_until(all_completed, 60, "every job completed")
            assert node_worker.proc is not None
            node_worker.proc.send_signal(signal.SIGTERM)  # its count is never reached alone
            outcome = await node_worker.result()

        node_ids = [str(i) for i in outcome["completed"]]
        assert outcome["failed"] == []
        assert len(python_ids) == len(set(python_ids)), "a job ran twice in Python"
        assert len(node_ids) == len(set(node_ids)), "a job ran twice in Node"
        assert not set(python_ids) & set(node_ids), "a job ran in both"
        assert set(python_ids) | set(node_ids) == all_ids
        assert python_ids and node_ids, (len(python_ids), len(node_ids))
        counts = await queue.get_job_counts("completed", "failed", "active", "waiting", "delayed")
        assert counts == {"completed": total, "failed": 0, "active": 0, "waiting": 0, "delayed": 0}

        # each job says who ran it: Python's return value and worker name, or Node's echo
        for job in await queue.get_jobs(["completed"]):
            if job.id in set(python_ids):
                assert job.returnvalue == {"by": "python"} and job.processed_by == "py-shared"
            else:
                assert job.returnvalue == {"echo": job.data} and job.processed_by is None
            assert job.attempts_made == 1
    finally:
        await queue.close()


# -- a parent waiting for a Node-added child -----------------------------------------------------
async def test_waiting_children_with_a_node_child(redis_url: str, queue_name: str) -> None:
    """The Python processor of a parent adds a child through Node (opts.parent), moves the parent
    to waiting-children and raises WaitingChildrenError; Node's worker completes the child, which
    moves the parent back to wait; the Python worker then finishes it."""
    child_queue = f"{queue_name}-children"
    moved: list[bool] = []
    child_ids: list[str] = []

    async def process(job: Job, token: str) -> Any:
        if not child_ids:
            child = await node("add", redis=redis_url, queue=child_queue, name="child", data={"c": 1},
                               opts={"parent": {"id": job.id, "queue": f"bull:{queue_name}"}})
            child_ids.append(child["id"])
        was_moved = await job.move_to_waiting_children(token)
        moved.append(was_moved)
        if was_moved:
            raise WaitingChildrenError()
        return {"children_done": True}

    parent_id = (await node("add", redis=redis_url, queue=queue_name, name="parent", data={}))["id"]
    worker = Worker(queue_name, process, connection=redis_url, drain_delay=0.5)
    failures: list[Any] = []
    worker.on("failed", lambda job, err, prev: failures.append(err))
    async with worker:
        await wait_until(lambda: _state(redis_url, queue_name, parent_id, "waiting-children"),
                         what="parent waiting for its child")
        outcome = await node("work", redis=redis_url, queue=child_queue, count=1, timeoutMs=15000)
        assert outcome["completed"] == child_ids
        await wait_until(lambda: _state(redis_url, queue_name, parent_id, "completed"), what="parent done")
    assert moved == [True, False]
    assert failures == []
    parent = await node("getJob", redis=redis_url, queue=queue_name, id=parent_id)
    assert parent["returnvalue"] == {"children_done": True}
    assert parent["attemptsMade"] == 1
    assert parent["state"] == "completed"


async def _state(redis_url: str, queue_name: str, job_id: str, wanted: str) -> bool:
    return await node("getState", redis=redis_url, queue=queue_name, id=job_id) == wanted
