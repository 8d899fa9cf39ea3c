"""Bull-Board (bullmq_compat/_board/board.js, Node's createPostgresBackend) serving a PostgreSQL queue whose jobs
Python added and a Python worker ran: each job listed under the right status, with Node's fields."""
from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from typing import Any

import pytest

from bullmq_compat import Job
from tests._redis_server import free_port
from tests.node import NodeProcess
from tests.pg_interop_helpers import eventually, node_states, pg_of, process, py_queue, py_worker

pytestmark = pytest.mark.node


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return json.load(response)


async def board_queue(board: NodeProcess, queue: str, status: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"activeQueue": queue, "status": status, "page": 1, "jobsPerPage": 50})
    body = await asyncio.to_thread(_get_json, f"{board.url}api/queues?{query}")
    [shown] = [q for q in body["queues"] if q["name"] == queue]
    return shown


def listed(shown: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {j["id"]: (j["name"], j["data"]) for j in shown["jobs"]}


async def test_board_shows_python_jobs_of_a_postgres_queue_in_their_states(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    busy, paused = f"{queue_name}-busy", f"{queue_name}-paused"
    release = asyncio.Event()
    started = asyncio.Event()

    async def processor(job: Job) -> Any:
        if job.name == "hold":
            started.set()
            await release.wait()
            return "released"
        return await process(job)

    async with py_queue(busy, postgres_url, pg_schema, migrate=True) as queue, \
            py_queue(paused, postgres_url, pg_schema) as pq:
        done = await queue.add("done", {"k": 1})
        bad = await queue.add("bad", {"behave": {"fail": "python says no"}})
        async with py_worker(busy, postgres_url, pg_schema, processor):
            await eventually(lambda: node_states(pg, busy, [done.id], "completed"))
            await eventually(lambda: node_states(pg, busy, [bad.id], "failed"))
            hold = await queue.add("hold", {"k": 2})
            await asyncio.wait_for(started.wait(), 60)
            w1 = await queue.add("w1", {"k": 3}, priority=0, delay=0, job_id="w-1")
            d1 = await queue.add("d1", {"k": 4}, delay=600000)
            p1 = await queue.add("p1", {"k": 5}, priority=6)
            before = await pq.add("before-pause", "plain")
            await pq.pause()
            after = await pq.add("after-pause", 7)
            try:
                # the Python worker holds "hold" and takes nothing else meanwhile (concurrency 1):
                # "w-1" and "p1" wait
                async with NodeProcess.board(None, free_port(), [busy, paused], postgres=postgres_url,
                                             schema=pg_schema) as board:
                    shown = {status: await board_queue(board, busy, status) for status in
                             ("active", "waiting", "delayed", "prioritized", "completed", "failed")}
                    paused_waiting = await board_queue(board, paused, "waiting")
                    one = await asyncio.to_thread(_get_json, f"{board.url}api/queues/{busy}/{bad.id}")
            finally:
                release.set()

    assert shown["waiting"]["counts"] == {"active": 1, "completed": 1, "delayed": 1, "failed": 1,
                                          "prioritized": 1, "waiting": 1, "waiting-children": 0}
    assert shown["waiting"]["isPaused"] is False
    assert listed(shown["active"]) == {hold.id: ("hold", {"k": 2})}
    assert listed(shown["waiting"]) == {w1.id: ("w1", {"k": 3})} and w1.id == "w-1"
    assert listed(shown["delayed"]) == {d1.id: ("d1", {"k": 4})}
    assert [j["delay"] for j in shown["delayed"]["jobs"]] == [600000]
    assert listed(shown["prioritized"]) == {p1.id: ("p1", {"k": 5})}
    assert [j["priority"] for j in shown["prioritized"]["jobs"]] == [6]
    [completed] = shown["completed"]["jobs"]
    assert (completed["id"], completed["returnValue"]) == (done.id, {"py": {"k": 1}})
    assert completed["finishedOn"] >= completed["processedOn"] >= completed["timestamp"]
    [failed] = shown["failed"]["jobs"]
    assert (failed["id"], failed["failedReason"]) == (bad.id, "python says no")
    assert failed["stacktrace"] and "python says no" in failed["stacktrace"][0]
    assert one["job"]["id"] == bad.id and one["status"] == "failed"
    assert paused_waiting["isPaused"] is True
    assert listed(paused_waiting) == {before.id: ("before-pause", "plain"), after.id: ("after-pause", 7)}
