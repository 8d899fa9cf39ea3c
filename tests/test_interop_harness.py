"""The interop harness itself (tests/node.py + interop/), against real Node BullMQ and a real Redis."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from tests._redis_server import free_port
from tests.node import NodeError, NodeProcess, node

pytestmark = pytest.mark.node


async def test_add_writes_the_job_hash(redis_url: str, queue_name: str, redis: Any) -> None:
    before = int(time.time() * 1000)
    added = await node("add", redis=redis_url, queue=queue_name, name="email",
                       data={"to": "a@example.org", "n": 1}, opts={"attempts": 3})
    after = int(time.time() * 1000)

    job_id, fields = added["id"], added["hash"]
    assert job_id == "1"
    assert fields == await redis.hgetall(f"bull:{queue_name}:{job_id}")
    assert fields["name"] == "email"
    assert json.loads(fields["data"]) == {"to": "a@example.org", "n": 1}
    assert json.loads(fields["opts"])["attempts"] == 3
    assert before - 1000 <= int(fields["timestamp"]) <= after + 1000
    assert fields["delay"] == "0"
    assert fields["priority"] == "0"


async def test_add_with_delay_priority_and_prefix(redis_url: str, queue_name: str, redis: Any) -> None:
    delayed = await node("add", redis=redis_url, prefix="other", queue=queue_name, name="later",
                         data={}, opts={"delay": 60000})
    assert delayed["hash"]["delay"] == "60000"
    assert await redis.exists(f"other:{queue_name}:{delayed['id']}") == 1
    assert await redis.exists(f"bull:{queue_name}:{delayed['id']}") == 0

    prioritized = await node("add", redis=redis_url, prefix="other", queue=queue_name, name="urgent",
                             data={}, opts={"priority": 5})
    assert prioritized["hash"]["priority"] == "5"
    counts = await node("getJobCounts", redis=redis_url, prefix="other", queue=queue_name,
                        types=["delayed", "prioritized", "waiting"])
    assert counts == {"delayed": 1, "prioritized": 1, "waiting": 0}


async def test_counts_state_and_listing_show_a_waiting_job(redis_url: str, queue_name: str) -> None:
    added = await node("add", redis=redis_url, queue=queue_name, name="n", data={"x": 1})
    job_id = added["id"]

    counts = await node("getJobCounts", redis=redis_url, queue=queue_name)
    assert counts["waiting"] == 1
    assert all(v == 0 for k, v in counts.items() if k != "waiting"), counts
    assert await node("getState", redis=redis_url, queue=queue_name, id=job_id) == "waiting"
    assert await node("getJobs", redis=redis_url, queue=queue_name, types=["waiting"]) == [job_id]

    job = await node("getJob", redis=redis_url, queue=queue_name, id=job_id)
    assert job["id"] == job_id and job["name"] == "n" and job["data"] == {"x": 1}
    assert job["state"] == "waiting" and job["attemptsMade"] == 0
    assert await node("getJob", redis=redis_url, queue=queue_name, id="404") is None


async def test_bulk_add_and_queue_call(redis_url: str, queue_name: str) -> None:
    bulk = await node("addBulk", redis=redis_url, queue=queue_name,
                      jobs=[{"name": "a", "data": {"i": 0}}, {"name": "b", "data": {"i": 1}}])
    assert bulk["ids"] == ["1", "2"]
    assert [h["name"] for h in bulk["hashes"]] == ["a", "b"]

    assert await node("queueCall", redis=redis_url, queue=queue_name, method="isPaused") is False
    await node("queueCall", redis=redis_url, queue=queue_name, method="pause")
    assert await node("queueCall", redis=redis_url, queue=queue_name, method="isPaused") is True
    waiting = await node("queueCall", redis=redis_url, queue=queue_name, method="getWaiting")
    assert sorted(job["id"] for job in waiting) == ["1", "2"]
    assert {job["name"] for job in waiting} == {"a", "b"}
    assert await node("queueCall", redis=redis_url, queue=queue_name, method="resume") is None
    assert await node("queueCall", redis=redis_url, queue=queue_name, method="isPaused") is False


async def test_node_errors_raise_node_error(redis_url: str, queue_name: str) -> None:
    with pytest.raises(NodeError) as info:
        await node("queueCall", redis=redis_url, queue=queue_name, method="noSuchMethod")
    assert info.value.name == "TypeError"
    assert "noSuchMethod" in info.value.message

    with pytest.raises(NodeError, match="unknown op"):
        await node("noSuchOp", redis=redis_url, queue=queue_name)


async def test_work_reports_final_outcomes(redis_url: str, queue_name: str) -> None:
    bulk = await node("addBulk", redis=redis_url, queue=queue_name, jobs=[
        {"name": "returns", "data": {"behave": {"return": {"answer": 42}}}},
        {"name": "flaky", "data": {"behave": {"failTimes": 1, "message": "first try fails"}},
         "opts": {"attempts": 2}},
        {"name": "doomed", "data": {"behave": {"unrecoverable": "give up"}}, "opts": {"attempts": 5}},
    ])
    returns, flaky, doomed = bulk["ids"]

    outcome = await node("work", redis=redis_url, queue=queue_name, count=3, timeoutMs=15000)
    assert outcome["timedOut"] is False
    assert sorted(outcome["completed"]) == sorted([returns, flaky])
    assert outcome["failed"] == [doomed]

    job = await node("getJob", redis=redis_url, queue=queue_name, id=returns)
    assert (job["state"], job["returnvalue"], job["attemptsMade"]) == ("completed", {"answer": 42}, 1)

    job = await node("getJob", redis=redis_url, queue=queue_name, id=flaky)
    assert (job["state"], job["returnvalue"], job["attemptsMade"]) == ("completed", {"ok": True}, 2)
    assert job["failedReason"] == "first try fails"

    job = await node("getJob", redis=redis_url, queue=queue_name, id=doomed)
    assert (job["state"], job["failedReason"], job["attemptsMade"]) == ("failed", "give up", 1)
    assert job["stacktrace"] and job["stacktrace"][0].startswith("UnrecoverableError: give up")


async def test_work_times_out_when_jobs_never_come(redis_url: str, queue_name: str) -> None:
    outcome = await node("work", redis=redis_url, queue=queue_name, count=1, timeoutMs=300)
    assert outcome == {"completed": [], "failed": [], "timedOut": True}


async def test_background_worker_consumes_jobs_added_later(redis_url: str, queue_name: str) -> None:
    async with NodeProcess.work(redis=redis_url, queue=queue_name, count=2, concurrency=2,
                                timeoutMs=15000) as worker:
        assert worker.first_line == {"ready": True}
        first = await node("add", redis=redis_url, queue=queue_name, name="a", data={"behave": {"sleepMs": 50}})
        second = await node("add", redis=redis_url, queue=queue_name, name="b", data={"v": 2})
        outcome = await worker.result()
    assert outcome["timedOut"] is False
    assert sorted(outcome["completed"]) == sorted([first["id"], second["id"]])
    job = await node("getJob", redis=redis_url, queue=queue_name, id=second["id"])
    assert job["returnvalue"] == {"echo": {"v": 2}}


async def test_background_worker_stops_on_exit(redis_url: str, queue_name: str) -> None:
    async with NodeProcess.work(redis=redis_url, queue=queue_name, count=5) as worker:
        pass
    assert worker.proc is not None and worker.proc.returncode == 0


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return json.load(response)


async def test_board_lists_a_waiting_job(redis_url: str, queue_name: str) -> None:
    added = await node("add", redis=redis_url, queue=queue_name, name="shown", data={"k": "v"})
    other = f"{queue_name}-other"

    async with NodeProcess.board(redis_url, free_port(), [queue_name, other]) as board:
        assert board.url.startswith("http://127.0.0.1:")
        query = urllib.parse.urlencode(
            {"activeQueue": queue_name, "status": "waiting", "page": 1, "jobsPerPage": 10})
        body = await asyncio.to_thread(_get_json, f"{board.url}api/queues?{query}")
        home = await asyncio.to_thread(lambda: urllib.request.urlopen(board.url, timeout=10).status)

    assert home == 200
    queues = {q["name"]: q for q in body["queues"]}
    assert set(queues) == {queue_name, other}
    shown = queues[queue_name]
    assert shown["counts"]["waiting"] == 1
    assert [(j["id"], j["name"], j["data"]) for j in shown["jobs"]] == [(added["id"], "shown", {"k": "v"})]
    assert queues[other]["jobs"] == []
    assert board.proc is not None and board.proc.returncode == 0
