"""Issue #2, wire-compatible core: what Python writes, Node BullMQ 6.7.0 reads, and the reverse.

For each kind of add, the same job is added from Python (queue A) and from Node (queue B), both
fresh queues so both jobs get id "1"; the two job hashes must be the same field by field except
the creation time. Then each side reads the other's job; counts agree on a mix of states; and
Bull-Board lists the Python-added jobs under the right status.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from bullmq_compat import Job, Queue, Worker
from tests._redis_server import free_port
from tests.node import NodeProcess, node

pytestmark = pytest.mark.node

TIME_FIELDS = {"timestamp"}  # set from the clock at add time; everything else must match


@dataclass
class Case:
    py: dict[str, Any]              # options as a Python caller passes them
    node: dict[str, Any]            # the same options in Node's camelCase
    state: str = "waiting"
    # Node's `job.opts` when read back, when it is not just {"attempts": 0, **node}
    node_form: Optional[dict[str, Any]] = None
    data: Any = field(default_factory=lambda: {"to": "a@example.org", "n": [1, 2.5, None], "s": "é✓"})

    def expected_node_opts(self) -> dict[str, Any]:
        return self.node_form if self.node_form is not None else {"attempts": 0, **self.node}


CASES: dict[str, Case] = {
    "standard": Case({}, {}),
    "delayed": Case({"delay": 60000}, {"delay": 60000}, state="delayed"),
    "prioritized": Case({"priority": 5}, {"priority": 5}, state="prioritized"),
    "lifo": Case({"lifo": True}, {"lifo": True}),
    "attempts-exponential-backoff": Case(
        {"attempts": 3, "backoff": {"type": "exponential", "delay": 1000}},
        {"attempts": 3, "backoff": {"type": "exponential", "delay": 1000}}),
    "retention-true-and-count": Case(
        {"remove_on_complete": True, "remove_on_fail": 1000},
        {"removeOnComplete": True, "removeOnFail": 1000}),
    "retention-age-and-count": Case(
        {"remove_on_complete": {"age": 3600, "count": 10}, "remove_on_fail": {"age": 3600, "count": 10}},
        {"removeOnComplete": {"age": 3600, "count": 10}, "removeOnFail": {"age": 3600, "count": 10}}),
    "deduplicated": Case(  # a TTL that outlives the Node start-ups on a loaded machine
        {"deduplication": {"id": "dedup-key", "ttl": 120_000}},
        {"deduplication": {"id": "dedup-key", "ttl": 120_000}}),
    # a few more options whose stored form differs from their name
    "backoff-as-number": Case(
        {"attempts": 2, "backoff": 500}, {"attempts": 2, "backoff": 500},
        node_form={"attempts": 2, "backoff": {"type": "fixed", "delay": 500}}),
    "custom-id-logs-limits": Case(
        {"job_id": "custom-7", "keep_logs": 5, "stack_trace_limit": 3, "size_limit": 1000},
        {"jobId": "custom-7", "keepLogs": 5, "stackTraceLimit": 3, "sizeLimit": 1000}),
    "delayed-prioritized": Case(
        {"delay": 30000, "priority": 2}, {"delay": 30000, "priority": 2}, state="delayed"),
}


def without(mapping: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k not in keys}


async def events_of(redis: Any, queue: str) -> list[dict[str, str]]:
    """The queue's event stream without the stream ids (which are times)."""
    return [fields for _, fields in await redis.xrange(f"bull:{queue}:events")]


@pytest.mark.parametrize("case_name", list(CASES))
async def test_same_job_from_python_and_node(redis_url: str, queue_name: str, redis: Any,
                                              case_name: str) -> None:
    case = CASES[case_name]
    qa, qb = f"{queue_name}-py", f"{queue_name}-node"
    async with Queue(qa, connection=redis_url) as queue, Queue(qb, connection=redis_url) as other:
        py_job = await queue.add("send", case.data, **case.py)
        node_added, node_reads_py = await asyncio.gather(
            node("add", redis=redis_url, queue=qb, name="send", data=case.data, opts=case.node),
            node("getJob", redis=redis_url, queue=qa, id=py_job.id))
        py_reads_node = await other.get_job(node_added["id"])
        py_reads_py = await queue.get_job(py_job.id)
        node_reads_node = await node("getJob", redis=redis_url, queue=qb, id=node_added["id"])
        py_state_of_node_job = await other.get_job_state(node_added["id"])

    # -- the stored hashes ------------------------------------------------------------------
    assert py_job.id == node_added["id"]
    py_hash = await redis.hgetall(f"bull:{qa}:{py_job.id}")
    node_hash = await redis.hgetall(f"bull:{qb}:{node_added['id']}")
    assert node_hash == node_added["hash"]
    assert set(py_hash) == set(node_hash), (py_hash, node_hash)
    assert json.loads(py_hash["opts"]) == json.loads(node_hash["opts"])
    assert py_hash["data"] == node_hash["data"]  # byte-identical JSON text
    assert without(py_hash, "opts", *TIME_FIELDS) == without(node_hash, "opts", *TIME_FIELDS)
    assert py_hash["name"] == "send"
    assert py_hash["delay"] == str(case.node.get("delay", 0))
    assert py_hash["priority"] == str(case.node.get("priority", 0))
    if "deduplication" in case.node:
        assert py_hash["deid"] == node_hash["deid"] == case.node["deduplication"]["id"]
        for q, job_id in ((qa, py_job.id), (qb, node_added["id"])):
            assert await redis.get(f"bull:{q}:de:dedup-key") == job_id
            assert 0 < await redis.pttl(f"bull:{q}:de:dedup-key") <= 120_000

    # -- where the job was put ---------------------------------------------------------------
    if case.state == "delayed":
        for q, h in ((qa, py_hash), (qb, node_hash)):
            score = int(await redis.zscore(f"bull:{q}:delayed", "1"))
            assert score >> 12 == int(h["timestamp"]) + int(h["delay"])
    else:
        assert (await redis.exists(f"bull:{qa}:wait"), await redis.exists(f"bull:{qa}:prioritized")) == (
            await redis.exists(f"bull:{qb}:wait"), await redis.exists(f"bull:{qb}:prioritized"))
        if case.state == "prioritized":
            assert await redis.zscore(f"bull:{qa}:prioritized", "1") == \
                await redis.zscore(f"bull:{qb}:prioritized", "1")
    py_events = await events_of(redis, qa)
    node_events = await events_of(redis, qb)
    if case.state == "delayed":  # the "delayed" event carries the due time
        py_events = [without(e, "delay") for e in py_events]
        node_events = [without(e, "delay") for e in node_events]
    assert py_events == node_events and py_events

    # -- Node reads the Python job -------------------------------------------------------------
    assert node_reads_py is not None
    assert node_reads_py["id"] == py_job.id
    assert node_reads_py["name"] == "send"
    assert node_reads_py["data"] == case.data
    assert node_reads_py["opts"] == case.expected_node_opts()
    assert node_reads_py["delay"] == case.node.get("delay", 0)
    assert node_reads_py["priority"] == case.node.get("priority", 0)
    assert node_reads_py["opts"]["attempts"] == case.node.get("attempts", 0)
    assert node_reads_py["state"] == case.state
    assert node_reads_py["timestamp"] == py_job.timestamp
    assert without(node_reads_py, "timestamp") == without(node_reads_node, "timestamp")

    # -- Python reads the Node job --------------------------------------------------------------
    assert py_reads_node is not None
    assert py_reads_node.id == node_added["id"]
    assert py_reads_node.name == "send"
    assert py_reads_node.data == case.data
    assert py_reads_node.opts == py_job.opts
    assert py_reads_node.delay == case.node.get("delay", 0)
    assert py_reads_node.priority == case.node.get("priority", 0)
    assert py_reads_node.attempts == case.node.get("attempts", 0)
    assert py_reads_node.timestamp == int(node_hash["timestamp"])
    assert py_reads_node.parse_error is None
    assert py_state_of_node_job == case.state
    assert py_reads_py is not None
    assert without(py_reads_node.to_dict(), "timestamp") == without(py_reads_py.to_dict(), "timestamp")


async def test_python_opts_names_map_to_node_names(redis_url: str, queue_name: str) -> None:
    """Python's Job.opts uses Python names for exactly the options Node names in camelCase."""
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {}, remove_on_complete=True, remove_on_fail={"age": 1, "count": 2},
                              deduplication={"id": "d", "ttl": 10, "extend": True}, keep_logs=3)
        read = await queue.get_job(job.id)
    node_job = await node("getJob", redis=redis_url, queue=queue_name, id=job.id)
    assert read is not None and read.opts == job.opts == {
        "attempts": 0, "remove_on_complete": True, "remove_on_fail": {"age": 1, "count": 2},
        "deduplication": {"id": "d", "ttl": 10, "extend": True}, "keep_logs": 3}
    assert node_job["opts"] == {
        "attempts": 0, "removeOnComplete": True, "removeOnFail": {"age": 1, "count": 2},
        "deduplication": {"id": "d", "ttl": 10, "extend": True}, "keepLogs": 3}


async def test_child_of_a_parent_matches_node(redis_url: str, queue_name: str, redis: Any) -> None:
    parents = f"{queue_name}-parents"
    qa, qb = f"{queue_name}-py", f"{queue_name}-node"
    async with Queue(parents, connection=redis_url) as parent_queue, Queue(qa, connection=redis_url) as queue:
        parent_a = await parent_queue.add("parent-a", {})
        parent_b = await parent_queue.add("parent-b", {})
        parent_ref = {"queue": parent_queue.qualified_name}
        py_job = await queue.add("child", {"c": 1}, parent={**parent_ref, "id": parent_a.id},
                                 fail_parent_on_failure=True)
    node_added = await node("add", redis=redis_url, queue=qb, name="child", data={"c": 1},
                            opts={"parent": {**parent_ref, "id": parent_b.id}, "failParentOnFailure": True})
    py_hash = await redis.hgetall(f"bull:{qa}:{py_job.id}")
    node_hash = node_added["hash"]
    assert set(py_hash) == set(node_hash)
    assert py_hash["parentKey"] == f"bull:{parents}:{parent_a.id}"
    assert node_hash["parentKey"] == f"bull:{parents}:{parent_b.id}"
    assert json.loads(py_hash["parent"]) == {"id": parent_a.id, "queueKey": f"bull:{parents}", "fpof": True}
    assert {k: v for k, v in json.loads(node_hash["parent"]).items() if k != "id"} == {
        k: v for k, v in json.loads(py_hash["parent"]).items() if k != "id"}
    assert without(json.loads(py_hash["opts"]), "parent") == without(json.loads(node_hash["opts"]), "parent")
    assert await redis.smembers(f"bull:{parents}:{parent_a.id}:dependencies") == {f"bull:{qa}:{py_job.id}"}
    assert await redis.smembers(f"bull:{parents}:{parent_b.id}:dependencies") == {f"bull:{qb}:{node_added['id']}"}
    node_reads_py = await node("getJob", redis=redis_url, queue=qa, id=py_job.id)
    assert node_reads_py["parentKey"] == f"bull:{parents}:{parent_a.id}"


async def test_get_jobs_order_matches_node(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await queue.add("a", {})
        await queue.add("b", {}, lifo=True)
        await queue.add("c", {})
        await queue.add("d", {}, delay=60000)
        await queue.add("e", {}, delay=30000)
        await queue.add("f", {}, priority=3)
        await queue.add("g", {}, priority=1)
        for types, asc in ((["waiting"], True), (["waiting"], False), (["delayed"], True),
                           (["delayed", "waiting", "prioritized"], False), (["prioritized"], True)):
            ours = [j.id for j in await queue.get_jobs(types, asc=asc)]
            theirs = await node("getJobs", redis=redis_url, queue=queue_name, types=types, asc=asc)
            assert ours == theirs, (types, asc)
        ours = [j.id for j in await queue.get_jobs(["waiting"], 1, 1, asc=True)]
        assert ours == await node("getJobs", redis=redis_url, queue=queue_name, types=["waiting"],
                                  start=1, end=1, asc=True)


async def _wait_for_counts(queue: Queue, want: dict[str, int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while await queue.get_job_counts(*want) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"counts never reached {want}: {await queue.get_job_counts(*want)}")
        await asyncio.sleep(0.02)


async def test_job_counts_match_node_for_a_mix_of_states(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        # completed and failed, through a Python worker
        async def processor(job: Job) -> Any:
            if job.data.get("fail"):
                raise RuntimeError("failing on purpose")
            return {"ok": True}

        await queue.add_bulk([{"name": "ok", "data": {}}, {"name": "ok", "data": {}},
                              {"name": "bad", "data": {"fail": True}}])
        worker = Worker(queue_name, processor, connection=redis_url)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await _wait_for_counts(queue, {"completed": 2, "failed": 1})
        finally:
            await worker.close()
            await task

        # one active job, taken by hand
        await queue.add("held", {})
        taker = Worker(queue_name, connection=redis_url)
        try:
            held = await taker.get_next_job("token-1", block=False)
            assert held is not None and held.name == "held"
        finally:
            await taker.close()

        # waiting, delayed, prioritized, from both languages
        await queue.add("w", {})
        await queue.add("w", {}, lifo=True)
        await queue.add("d", {}, delay=60000)
        await queue.add("p", {}, priority=9)
        await node("addBulk", redis=redis_url, queue=queue_name, jobs=[
            {"name": "nw", "data": {}}, {"name": "nd", "data": {}, "opts": {"delay": 60000}},
            {"name": "np", "data": {}, "opts": {"priority": 1}}])

        expected = {"active": 1, "completed": 2, "delayed": 2, "failed": 1, "prioritized": 2,
                    "waiting": 3, "waiting-children": 0}
        assert await queue.get_job_counts() == expected
        assert await node("getJobCounts", redis=redis_url, queue=queue_name) == expected
        some = ["waiting", "delayed", "failed"]
        assert await queue.get_job_counts(*some) == await node(
            "getJobCounts", redis=redis_url, queue=queue_name, types=some)

        await queue.pause()
        paused_types = ["waiting", "paused", "active"]
        ours = await queue.get_job_counts(*paused_types)
        assert ours == await node("getJobCounts", redis=redis_url, queue=queue_name, types=paused_types)
        assert ours["waiting"] == 3 and ours["active"] == 1
        assert await node("queueCall", redis=redis_url, queue=queue_name, method="isPaused") is True


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return json.load(response)


async def _board_queue(board: NodeProcess, queue: str, status: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"activeQueue": queue, "status": status, "page": 1, "jobsPerPage": 50})
    body = await asyncio.to_thread(_get_json, f"{board.url}api/queues?{query}")
    [shown] = [q for q in body["queues"] if q["name"] == queue]
    return shown


async def test_bull_board_lists_python_jobs_by_status(redis_url: str, queue_name: str) -> None:
    busy, paused = f"{queue_name}-busy", f"{queue_name}-paused"
    async with Queue(busy, connection=redis_url) as queue, Queue(paused, connection=redis_url) as pq:
        w1 = await queue.add("w1", {"k": 1})
        w2 = await queue.add("w2", {"k": 2}, attempts=4, backoff={"type": "exponential", "delay": 50})
        d1 = await queue.add("d1", {"k": 3}, delay=60000)
        p1 = await queue.add("p1", {"k": 4}, priority=6)
        before = await pq.add("before-pause", {"k": 5})
        await pq.pause()
        after = await pq.add("after-pause", {"k": 6})

        async with NodeProcess.board(redis_url, free_port(), [busy, paused]) as board:
            waiting = await _board_queue(board, busy, "waiting")
            delayed = await _board_queue(board, busy, "delayed")
            prioritized = await _board_queue(board, busy, "prioritized")
            paused_waiting = await _board_queue(board, paused, "waiting")

    def listed(shown: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
        return {j["id"]: (j["name"], j["data"], j["opts"]) for j in shown["jobs"]}

    assert waiting["counts"] == {"active": 0, "completed": 0, "delayed": 1, "failed": 0, "prioritized": 1,
                                 "waiting": 2, "waiting-children": 0}
    assert waiting["isPaused"] is False
    assert listed(waiting) == {
        w1.id: ("w1", {"k": 1}, {"attempts": 0}),
        w2.id: ("w2", {"k": 2}, {"attempts": 4, "backoff": {"type": "exponential", "delay": 50}}),
    }
    assert listed(delayed) == {d1.id: ("d1", {"k": 3}, {"attempts": 0, "delay": 60000})}
    assert [j["delay"] for j in delayed["jobs"]] == [60000]
    assert listed(prioritized) == {p1.id: ("p1", {"k": 4}, {"attempts": 0, "priority": 6})}
    assert [j["priority"] for j in prioritized["jobs"]] == [6]
    assert paused_waiting["isPaused"] is True
    assert paused_waiting["counts"]["waiting"] == 2
    assert listed(paused_waiting) == {
        before.id: ("before-pause", {"k": 5}, {"attempts": 0}),
        after.id: ("after-pause", {"k": 6}, {"attempts": 0}),
    }
