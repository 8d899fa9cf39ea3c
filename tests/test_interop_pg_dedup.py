"""Deduplication decisions shared by Python and Node on PostgreSQL: on one queue, an add from one
language is deduplicated against the other's job (while it lives, or for its ttl), and the same
sequence of adds, takes and completions gives the same decisions from Python as from Node
(interop/dedup.js) on two fresh queues."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bullmq_compat import Worker
from tests.node import node
from tests.node_scripts import run_script
from tests.pg_interop_helpers import eventually, node_job, node_states, node_work, pg_of, py_queue, py_worker
from tests.test_interop_dedup import SCENARIOS, _python_opts

pytestmark = pytest.mark.node


def dedup(**extra: Any) -> dict[str, Any]:
    return {"deduplication": {"id": "k", **extra}}


async def test_python_and_node_adds_deduplicate_against_each_other(postgres_url: str, pg_schema: str,
                                                                  queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        first = await queue.add("job", {"v": 1}, deduplication={"id": "k"})
        again = await node("add", **pg, queue=queue_name, name="job", data={"v": 2}, opts=dedup())
        assert again["id"] == first.id  # Node's add is deduplicated against the Python job
        assert (await node_job(pg, queue_name, first.id))["data"] == {"v": 1}
        probe = (await run_script("dedup.js", {**pg, "queue": queue_name, "steps": [{"probe": "k"}]}))["results"][0]
        assert probe["value"] == first.id and probe["pttl"] == -1

        # a Python worker finishes it: the key is released for Node
        async with py_worker(queue_name, postgres_url, pg_schema):
            await eventually(lambda: node_states(pg, queue_name, [first.id], "completed"))
        fresh = await node("add", **pg, queue=queue_name, name="job", data={"v": 3}, opts=dedup())
        assert fresh["id"] != first.id
        assert (await queue.add("job", {"v": 4}, deduplication={"id": "k"})).id == fresh["id"]
        assert await queue.get_deduplication_job_id("k") == fresh["id"]
        assert (await node_job(pg, queue_name, fresh["id"]))["data"] == {"v": 3}

        # a Node worker finishes that one: the key is released for Python
        async with node_work(pg, queue_name, count=1) as worker:
            assert (await worker.result())["completed"] == [fresh["id"]]
        assert await queue.get_deduplication_job_id("k") is None
        last = await queue.add("job", {"v": 5}, deduplication={"id": "k"})
        assert last.id not in (first.id, fresh["id"])
        counts = await node("getJobCounts", **pg, queue=queue_name, types=["completed", "waiting"])
        assert counts == {"completed": 2, "waiting": 1}


async def test_a_ttl_throttles_adds_from_both_languages(postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    node_first = await node("add", **pg, queue=queue_name, name="job", data={"v": 1}, opts=dedup(ttl=60000))
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        throttled = await queue.add("job", {"v": 2}, deduplication={"id": "k", "ttl": 60000})
        assert throttled.id == node_first["id"]
        # finished, but the ttl still holds: both languages keep deduplicating
        async with py_worker(queue_name, postgres_url, pg_schema):
            await eventually(lambda: node_states(pg, queue_name, [node_first["id"]], "completed"))
        assert (await queue.add("job", {"v": 3}, deduplication={"id": "k", "ttl": 60000})).id == node_first["id"]
        assert (await node("add", **pg, queue=queue_name, name="job", data={"v": 4},
                           opts=dedup(ttl=60000)))["id"] == node_first["id"]
        probe = (await run_script("dedup.js", {**pg, "queue": queue_name, "steps": [{"probe": "k"}]}))["results"][0]
        assert probe["value"] == node_first["id"] and 0 < probe["pttl"] <= 60000
        assert await queue.get_deduplication_job_id("k") == node_first["id"]
        # Python removes the key: Node's next add is a new job
        assert await queue.remove_deduplication_key("k") == 1
        assert (await node("add", **pg, queue=queue_name, name="job", data={"v": 5},
                           opts=dedup(ttl=60000)))["id"] != node_first["id"]


async def run_python(postgres_url: str, schema: str, queue_name: str, steps: list[dict[str, Any]]) -> list[Any]:
    """The dedup.js steps from Python: added ids, taken/completed ids and the key's holder."""
    results: list[Any] = []
    held: dict[str, Any] = {}
    worker = Worker(queue_name, connection=postgres_url, schema=schema)
    async with py_queue(queue_name, postgres_url, schema) as queue:
        try:
            for step in steps:
                if "add" in step:
                    spec = step["add"]
                    results.append({"id": (await queue.add(spec["name"], spec["data"],
                                                           **_python_opts(spec["opts"]))).id})
                elif "sleep" in step:
                    await asyncio.sleep(step["sleep"] / 1000)
                    results.append({})
                elif "take" in step:
                    job = await worker.get_next_job(step["take"], block=False)
                    if job is not None:
                        held[step["take"]] = job
                    results.append({"id": job.id if job else None})
                elif "complete" in step:
                    job = held.pop(step["complete"])
                    await job.move_to_completed("done", step["complete"])
                    results.append({"id": job.id})
                elif "probe" in step:
                    results.append({"value": await queue.get_deduplication_job_id(step["probe"])})
        finally:
            await worker.close()
    return results


@pytest.mark.parametrize("scenario", ["simple", "replace", "keep_last_if_active"])
async def test_same_decisions_from_python_and_node(postgres_url: str, pg_schema: str, queue_name: str,
                                                   scenario: str) -> None:
    steps = SCENARIOS[scenario]
    pg = pg_of(postgres_url, pg_schema)
    node_out = await run_script("dedup.js", {**pg, "queue": f"{queue_name}-js", "steps": steps}, timeout=120)
    py_out = await run_python(postgres_url, pg_schema, f"{queue_name}-py", steps)
    as_python = [{"value": r["value"]} if "pttl" in r else r for r in node_out["results"]]
    assert py_out == as_python
    # and the jobs left behind read the same from Node
    for result in (r for r in py_out if r.get("id")):
        py_job = await node_job(pg, f"{queue_name}-py", result["id"])
        js_job = await node_job(pg, f"{queue_name}-js", result["id"])
        assert (py_job and (py_job["state"], py_job["data"])) == (js_job and (js_job["state"], js_job["data"]))
