"""Job schedulers (every and cron) shared by Python and Node on PostgreSQL: created in one language
and run by the other's worker, read alike by both, removed across languages. Assertions are about
what Node observes (its getJobScheduler(s), the iterations it lists and reads)."""
from __future__ import annotations

from typing import Any

import pytest

from tests.node import node
from tests.pg_interop_helpers import eventually, node_call, node_job, node_work, pg_of, py_queue, py_worker
from tests.test_interop_schedulers import python_form

pytestmark = pytest.mark.node


def millis_of(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


async def node_completed(pg: dict[str, Any], queue: str, scheduler_id: str) -> list[dict[str, Any]]:
    """The scheduler's completed iterations as Node lists them, oldest due time first."""
    jobs = await node_call(pg, queue, "getCompleted")
    mine = [j for j in jobs if j["id"].startswith(f"repeat:{scheduler_id}:")]
    return sorted(mine, key=lambda j: millis_of(j["id"]))


def check_every(runs: list[dict[str, Any]], every: int) -> None:
    """Iterations due on the every-grid, each slot at most once, each not run before it was due."""
    slots = [millis_of(j["id"]) for j in runs]
    assert len(set(slots)) == len(slots), slots
    assert all((b - a) % every == 0 and b > a for a, b in zip(slots, slots[1:])), slots
    assert all(j["processedOn"] >= millis_of(j["id"]) - 50 for j in runs), runs


async def test_node_schedulers_run_under_a_python_worker(postgres_url: str, pg_schema: str,
                                                         queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    every = await node_call(pg, queue_name, "upsertJobScheduler", "node-every", {"every": 400},
                            {"name": "tick", "data": {"from": "node"}, "opts": {"attempts": 2}})
    assert every["id"].startswith("repeat:node-every:")
    await node_call(pg, queue_name, "upsertJobScheduler", "node-cron", {"pattern": "*/1 * * * * *"},
                    {"name": "tock", "data": "cron-data"})

    async def enough() -> bool:
        return len(await node_completed(pg, queue_name, "node-every")) >= 4 and \
            len(await node_completed(pg, queue_name, "node-cron")) >= 2

    async with py_worker(queue_name, postgres_url, pg_schema, concurrency=2):
        await eventually(enough, timeout=90, what="iterations of both schedulers run by Python")
    runs = await node_completed(pg, queue_name, "node-every")
    check_every(runs, 400)
    for job in runs:
        assert job["name"] == "tick" and job["data"] == {"from": "node"} and job["opts"]["attempts"] == 2
        assert job["returnvalue"] == {"py": {"from": "node"}} and job["attemptsMade"] == 1
    cron = await node_completed(pg, queue_name, "node-cron")
    check_every(cron, 1000)
    assert all(j["name"] == "tock" and j["returnvalue"] == {"py": "cron-data"} for j in cron)

    # what the Python worker left is what Node's scheduler bookkeeping says
    schedulers = {s["key"]: s for s in await node_call(pg, queue_name, "getJobSchedulers")}
    assert set(schedulers) == {"node-every", "node-cron"}
    assert schedulers["node-every"]["every"] == 400 and schedulers["node-cron"]["pattern"] == "*/1 * * * * *"
    assert schedulers["node-every"]["iterationCount"] >= len(runs)
    assert schedulers["node-every"]["next"] > millis_of(runs[-1]["id"])
    # the next iteration, made by the Python worker, is waiting (or delayed) as Node expects
    next_id = f"repeat:node-every:{schedulers['node-every']['next']}"
    nxt = await node_job(pg, queue_name, next_id)
    assert nxt is not None and nxt["state"] in ("delayed", "waiting") and nxt["name"] == "tick"
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        assert await queue.get_job_scheduler("node-every") == python_form(
            await node_call(pg, queue_name, "getJobScheduler", "node-every"))


async def test_python_schedulers_run_under_a_node_worker(postgres_url: str, pg_schema: str,
                                                         queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        first = await queue.upsert_job_scheduler("py-every", {"every": 400},
                                                 template={"name": "beat", "data": {"n": 1},
                                                           "opts": {"attempts": 3}})
        assert first is not None and first.id.startswith("repeat:py-every:")
        await queue.upsert_job_scheduler("py-cron", {"pattern": "*/1 * * * * *"}, template={"name": "cron"})
        seen = await node_call(pg, queue_name, "getJobScheduler", "py-every")
        assert seen["every"] == 400 and seen["name"] == "beat"
        assert seen["template"]["data"] == {"n": 1} and seen["template"]["opts"]["attempts"] == 3
        assert python_form(seen) == await queue.get_job_scheduler("py-every")
        cron = await node_call(pg, queue_name, "getJobScheduler", "py-cron")
        assert cron["pattern"] == "*/1 * * * * *" and cron["next"] % 1000 == 0

        async with node_work(pg, queue_name, count=6, concurrency=2) as worker:
            outcome = await worker.result()
        # (at concurrency 2, the job in flight when the 6th completes may complete too)
        assert outcome["timedOut"] is False and len(outcome["completed"]) in (6, 7)
        assert all(i.startswith(("repeat:py-every:", "repeat:py-cron:")) for i in outcome["completed"])
        runs = await node_completed(pg, queue_name, "py-every")
        assert runs, outcome
        check_every(runs, 400)
        assert all(j["returnvalue"] == {"echo": {"n": 1}} and j["opts"]["attempts"] == 3 for j in runs)
        check_every(await node_completed(pg, queue_name, "py-cron"), 1000)

        # a second run, half Python half Node: each slot still runs once
        async with node_work(pg, queue_name, count=3):
            async with py_worker(queue_name, postgres_url, pg_schema):
                async def more() -> bool:
                    return len(await node_completed(pg, queue_name, "py-every")) >= len(runs) + 4
                await eventually(more, timeout=90)
        check_every(await node_completed(pg, queue_name, "py-every"), 400)

        # removed from Node, gone for Python; removed from Python, gone for Node
        assert await node_call(pg, queue_name, "removeJobScheduler", "py-every") is True
        assert await queue.get_job_scheduler("py-every") is None
        assert await queue.remove_job_scheduler("py-cron") is True
        assert await node_call(pg, queue_name, "getJobSchedulers") == []
        assert await node("getJobCounts", **pg, queue=queue_name, types=["delayed"]) == {"delayed": 0}
