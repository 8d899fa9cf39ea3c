"""QueueEvents across languages (issue #5): Python's QueueEvents on a Node worker's events, Node's
QueueEvents (interop/events.js) on a Python worker's events, waitUntilFinished both ways, custom
events, and the metrics and per-priority counts as Node reads them."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

import pytest

from bullmq_compat import Job, JobFailed, Queue, QueueEvents, QueueEventsProducer, Worker
from tests.helpers import wait_until
from tests.node import INTEROP, NodeProcess, node

pytestmark = pytest.mark.node

EVENTS_JS = INTEROP / "events.js"
FAST = {"drain_delay": 0.5}


def node_events(op: str, **args: Any) -> NodeProcess:
    """interop/events.js in the background; entering waits until its QueueEvents listens."""
    return NodeProcess(EVENTS_JS, op, json.dumps(args), result_timeout=60)


async def python_processor(job: Job) -> Any:
    """Node cli.js's processJob twin: behaviour from job.data["behave"]."""
    behave = job.data.get("behave") or {}
    if "progress" in behave:
        await job.update_progress(behave["progress"])
    if "fail" in behave:
        raise RuntimeError(behave["fail"])
    if "return" in behave:
        return behave["return"]
    return {"py": job.data}


# -- Python QueueEvents, Node worker ---------------------------------------------------------------
async def test_python_queue_events_sees_node_worker(redis_url: str, queue_name: str) -> None:
    seen: list[tuple[str, Any]] = []
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            Queue(queue_name, connection=redis_url) as queue:
        for name in ("added", "waiting", "active", "completed", "failed", "retries-exhausted", "drained"):
            qe.on(name, lambda *args, name=name: seen.append((name, args[0])))
        ok = await queue.add("ok", {"v": 1})
        bad = await queue.add("bad", {"behave": {"fail": "node says no"}}, attempts=1)
        ret = await queue.add("ret", {"behave": {"return": [1, {"two": None}]}})
        # Node waits (waitUntilFinished) while Python's QueueEvents watches the same jobs
        waits = [asyncio.ensure_future(job.wait_until_finished(qe, timeout=20000)) for job in (ok, bad, ret)]
        result = await node("work", redis=redis_url, queue=queue_name, count=3, timeoutMs=15000)
        assert sorted(result["completed"]) == sorted([ok.id, ret.id]) and result["failed"] == [bad.id]
        assert await asyncio.wait_for(waits[0], 10) == {"echo": {"v": 1}}
        with pytest.raises(JobFailed, match="^node says no$"):
            await asyncio.wait_for(waits[1], 10)
        assert await asyncio.wait_for(waits[2], 10) == [1, {"two": None}]
        await wait_until(lambda: any(name == "drained" for name, _ in seen), what="drained")

    def fields(name: str, job_id: str) -> list[Any]:
        return [args for seen_name, args in seen if seen_name == name and args.get("jobId") == job_id]

    assert fields("completed", ok.id) == [{"jobId": ok.id, "returnvalue": {"echo": {"v": 1}}, "prev": "active"}]
    assert fields("completed", ret.id) == [{"jobId": ret.id, "returnvalue": [1, {"two": None}], "prev": "active"}]
    assert fields("failed", bad.id) == [{"jobId": bad.id, "failedReason": "node says no", "prev": "active"}]
    assert fields("retries-exhausted", bad.id) == [{"jobId": bad.id, "attemptsMade": "1"}]
    assert fields("active", ok.id) == [{"jobId": ok.id, "prev": "waiting"}]


async def test_python_waits_for_a_job_node_finishes_later(redis_url: str, queue_name: str) -> None:
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("late", {"behave": {"sleepMs": 300, "return": "done"}})
        waiting = asyncio.ensure_future(job.wait_until_finished(qe))
        async with NodeProcess.work(redis=redis_url, queue=queue_name, count=1, timeoutMs=15000) as worker:
            assert await asyncio.wait_for(waiting, 15) == "done"
            assert (await worker.result())["completed"] == [job.id]
        # finished before the wait: answered from the job's state (a second QueueEvents, no event)
        async with QueueEvents(queue_name, connection=redis_url) as other:
            assert await job.wait_until_finished(other, timeout=1000) == "done"


# -- Node QueueEvents, Python worker and producer ----------------------------------------------------
async def test_node_queue_events_sees_python_worker_and_custom_events(redis_url: str, queue_name: str) -> None:
    # Python's QueueEvents replays from the start too: both must report the same events
    python_qe = QueueEvents(queue_name, connection=redis_url, last_event_id="0")
    python_seen: list[tuple[str, dict[str, Any], str]] = []
    python_events = aiter(python_qe)  # registered before anything is read

    async def collect() -> None:
        async for event in python_events:
            python_seen.append(event)
            if event[0] == "stop":
                return
    collector = asyncio.ensure_future(collect())
    async with node_events("listen", redis=redis_url, queue=queue_name, lastEventId="0", until="stop",
                           timeoutMs=25000) as listener:
        async with Queue(queue_name, connection=redis_url) as queue:
            progress = await queue.add("p", {"behave": {"progress": {"pct": 40}, "return": {"r": [1, 2]}}})
            bad = await queue.add("bad", {"behave": {"fail": "python says no"}}, attempts=1)
            async with Worker(queue_name, python_processor, connection=redis_url, **FAST):
                await wait_until(lambda: _finished(queue, 2), what="2 jobs finished")
            delayed = await queue.add("later", {}, delay=50000)
            await queue.remove(str(delayed.id))
            await queue.pause()
            await queue.resume()
        async with QueueEventsProducer(queue_name, connection=redis_url) as producer:
            await producer.publish_event({"eventName": "stop", "foo": "bar", "n": 3})
        result = await listener.result()
    await asyncio.wait_for(collector, 10)
    await python_qe.close()

    assert not result["timedOut"]
    node_seen = [(e["name"], e["args"]) for e in result["events"]]

    def first(name: str, match: Callable[[dict[str, Any]], bool] = lambda a: True) -> Any:
        for seen_name, args in node_seen:
            if seen_name == name and (name == "drained" or match(args[0])):
                return args
        raise AssertionError(f"Node's QueueEvents saw no {name!r}: {node_seen}")

    job = lambda jid: (lambda a: a.get("jobId") == jid)  # noqa: E731
    assert first("completed", job(progress.id))[0] == {
        "jobId": progress.id, "returnvalue": {"r": [1, 2]}, "prev": "active"}
    assert first("progress", job(progress.id))[0] == {"jobId": progress.id, "data": {"pct": 40}}
    assert first("failed", job(bad.id))[0] == {"jobId": bad.id, "failedReason": "python says no", "prev": "active"}
    assert first("active", job(bad.id))[0] == {"jobId": bad.id, "prev": "waiting"}
    assert first("delayed", job(delayed.id))[0]["delay"] >= delayed.timestamp + 50000 - 5
    assert first("removed", job(delayed.id))[0] == {"jobId": delayed.id, "prev": "delayed"}
    assert first("added", job(bad.id))[0] == {"jobId": bad.id, "name": "bad"}
    assert first("paused")[0] == {} and first("resumed")[0] == {}
    drained = first("drained")
    assert len(drained) == 1 and isinstance(drained[0], str)  # drained: the id only
    assert first("stop")[0] == {"foo": "bar", "n": "3"}
    # the same events, fields and ids in Python's QueueEvents as in Node's
    as_node = [(name, [fields, event_id] if name != "drained" else [event_id])
               for name, fields, event_id in python_seen]
    assert as_node == [(name, args) for name, args in node_seen]


async def _finished(queue: Queue, n: int) -> bool:
    counts = await queue.get_job_counts("completed", "failed")
    return counts["completed"] + counts["failed"] >= n


async def test_node_waits_for_a_job_python_finishes(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        ok = await queue.add("ok", {"behave": {"return": {"answer": 42}}})
        bad = await queue.add("bad", {"behave": {"fail": "nope from python"}}, attempts=1)
        # lastEventId "0": Node's QueueEvents only starts its XREAD after waitUntilReady resolves
        common = dict(redis=redis_url, queue=queue_name, lastEventId="0", ttl=20000)
        async with node_events("wait", id=ok.id, **common) as wait_ok, \
                node_events("wait", id=bad.id, **common) as wait_bad:
            async with Worker(queue_name, python_processor, connection=redis_url, **FAST):
                assert await wait_ok.result() == {"returnvalue": {"answer": 42}}
                assert await wait_bad.result() == {"rejected": "nope from python"}


async def test_node_lists_python_queue_events_connection(redis_url: str, queue_name: str) -> None:
    async with QueueEvents(queue_name, connection=redis_url):
        listed = await node("queueCall", redis=redis_url, queue=queue_name, method="getQueueEvents")
    assert len(listed) == 1 and listed[0]["name"] == queue_name


# -- metrics and counts per priority, as Node reads them ---------------------------------------------
async def test_metrics_and_counts_per_priority_match_node(redis_url: str, queue_name: str) -> None:
    q = dict(redis=redis_url, queue=queue_name)
    async with Queue(queue_name, connection=redis_url) as queue:
        now = int(time.time() * 1000)
        await queue.client.hset(f"bull:{queue_name}:metrics:completed",
                                mapping={"count": 4, "prevTS": now - 180000, "prevCount": 1})
        await queue.add_bulk([{"name": "m", "data": {}} for _ in range(3)])
        async with Worker(queue_name, python_processor, connection=redis_url, metrics={"max_data_points": 60},
                          **FAST):
            await wait_until(lambda: _finished(queue, 3), what="3 jobs finished")
        ours = await queue.get_metrics("completed")
        assert ours == await node("queueCall", **q, method="getMetrics", args=["completed"])
        assert ours["meta"]["count"] == 7 and ours["data"][-3:] == [0, 0, 3]
        assert await queue.get_metrics("completed", 1, 2) == await node(
            "queueCall", **q, method="getMetrics", args=["completed", 1, 2])

        await queue.add_bulk([{"name": "a", "data": {}}, {"name": "b", "data": {}, "opts": {"priority": 2}},
                              {"name": "c", "data": {}, "opts": {"priority": 2}}])
        await node("add", **q, name="d", data={}, opts={"priority": 9})
        priorities = [0, 2, 9, 3, 2]
        ours_counts = await queue.get_counts_per_priority(priorities)
        assert ours_counts == {"0": 1, "2": 2, "9": 1, "3": 0}
        assert ours_counts == await node("queueCall", **q, method="getCountsPerPriority", args=[priorities])
