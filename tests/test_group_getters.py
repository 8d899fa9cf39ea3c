"""BullMQ Pro's group getters (issue #28 §4): ``get_groups_jobs_count`` (jobs waiting for their
turn, over every group) and ``get_group_active_count`` (a group's active jobs), on Redis and on
PostgreSQL, with Python workers and with Node workers (on Redis with a keeper, on PostgreSQL
with none).

Three groups: "a" (concurrency 2) with 5 jobs, "b" with 3, "c" with 1, plus 2 ungrouped jobs. The
jobs sleep long enough (3 s) to be seen active; while they run, "a" has 2 active and 3 held, "b" 1
and 2, "c" 1 and 0: 5 held in all.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import InvalidArgument, Queue, Worker, migrate_postgres
from tests.helpers import wait_until
from tests.node import NodeProcess
from tests.pg_interop_helpers import pg_of

SLEEP_MS = 3000
GROUPS = {"a": 5, "b": 3, "c": 1}
WANT_ACTIVE = {"a": 2, "b": 1, "c": 1, "none": 0}
WANT_HELD = 5


@pytest.fixture(params=["redis", "postgres"])
async def setup(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[dict[str, Any]]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield {"backend": "redis", "kw": {"connection": url}, "node": {"redis": url}}
    else:
        url = request.getfixturevalue("postgres_url")
        schema = request.getfixturevalue("pg_schema")
        await migrate_postgres(url, schema, groups=True)
        yield {"backend": "postgres", "kw": {"connection": url, "schema": schema},
               "node": pg_of(url, schema, migrate=False)}


async def add_jobs(queue: Queue) -> None:
    await queue.set_group_concurrency("a", 2)
    for gid, n in GROUPS.items():
        for i in range(n):
            await queue.add("g", {"behave": {"sleepMs": SLEEP_MS}, "g": gid, "i": i}, group=gid)
    for i in range(2):
        await queue.add("plain", {"behave": {"sleepMs": SLEEP_MS}, "i": i})


async def counts(queue: Queue) -> dict[str, Any]:
    active = {gid: await queue.get_group_active_count(gid) for gid in WANT_ACTIVE}
    return {"active": active, "held": await queue.get_groups_jobs_count()}


async def _is_running_as_wanted(queue: Queue) -> bool:
    got = await counts(queue)
    return got == {"active": WANT_ACTIVE, "held": WANT_HELD}


async def test_before_any_worker_nothing_is_active_and_every_job_but_the_heads_is_held(
        setup: dict[str, Any], queue_name: str) -> None:
    queue = Queue(queue_name, **setup["kw"])
    try:
        await add_jobs(queue)
        # released heads: 2 of "a", 1 of "b", 1 of "c" wait in the queue; the rest are held
        assert await counts(queue) == {"active": {g: 0 for g in WANT_ACTIVE}, "held": WANT_HELD}
        assert await queue.get_groups_jobs_count(1) == WANT_HELD  # one group per round trip: the same sum
        assert sum([await queue.get_group_job_count(g) for g in GROUPS]) == WANT_HELD
        with pytest.raises(InvalidArgument, match="max_jobs=0 must be an int >= 1"):
            await queue.get_groups_jobs_count(0)
    finally:
        await queue.close()


async def test_a_python_workers_running_group_jobs_are_counted_active(setup: dict[str, Any], queue_name: str) -> None:
    release = asyncio.Event()

    async def process(job: Any) -> None:
        await release.wait()

    queue = Queue(queue_name, **setup["kw"])
    worker = Worker(queue_name, process, concurrency=20, drain_delay=1, **setup["kw"])
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await add_jobs(queue)
        await wait_until(lambda: _is_running_as_wanted(queue), 30, "2 + 1 + 1 active group jobs and 5 held")
        release.set()
        await wait_until(lambda: _all_done(queue), 60, "every job to complete")
        assert await counts(queue) == {"active": {g: 0 for g in WANT_ACTIVE}, "held": 0}
    finally:
        release.set()
        await worker.close()
        await running
        await queue.close()


async def test_a_node_workers_running_group_jobs_are_counted_active(setup: dict[str, Any], queue_name: str) -> None:
    """Node's Worker (cli.js work) runs the jobs; on Redis a keeper (our Worker with no processor's
    work to do: it only follows the events stream) releases what Node finishes."""
    queue = Queue(queue_name, **setup["kw"])
    total = sum(GROUPS.values()) + 2
    keeper: Any = None
    if setup["backend"] == "redis":
        from bullmq_compat import GroupKeeper

        keeper = GroupKeeper(queue_name, connection=setup["kw"]["connection"])
    try:
        await add_jobs(queue)
        keeper_task = asyncio.ensure_future(keeper.run()) if keeper is not None else None
        async with NodeProcess.work(**setup["node"], queue=queue_name, count=total, concurrency=20,
                                    timeoutMs=90000) as node_worker:
            await wait_until(lambda: _is_running_as_wanted(queue), 30, "2 + 1 + 1 active group jobs and 5 held")
            result = await node_worker.result()
        assert sorted(result["completed"], key=int) == [str(i) for i in range(1, total + 1)]
        assert await counts(queue) == {"active": {g: 0 for g in WANT_ACTIVE}, "held": 0}
    finally:
        if keeper is not None:
            await keeper.close()
            if keeper_task is not None:
                await asyncio.wait_for(asyncio.gather(keeper_task, return_exceptions=True), 20)
        await queue.close()


async def _all_done(queue: Queue) -> bool:
    return (await queue.get_job_counts("completed"))["completed"] == sum(GROUPS.values()) + 2


async def test_clean_of_waiting_children_leaves_the_groups_bookkeeping_right(
        setup: dict[str, Any], queue_name: str) -> None:
    """Redis: upstream's clean("waiting-children") deletes held group jobs (it knows nothing of the
    gate); the groups then count and list only what is left, and release nothing that is gone.
    PostgreSQL: upstream's clean has no waiting-children case and removes nothing, for Node as for
    us (Node's answer is asked first); the groups keep their jobs and all of them run."""
    from tests.pg_interop_helpers import node_call

    queue = Queue(queue_name, **setup["kw"])
    worker: Any = None
    try:
        await add_jobs(queue)
        held = {gid: [str(j.id) for j in await queue.get_group_jobs(gid)] for gid in GROUPS}
        await asyncio.sleep(0.01)  # clean takes jobs older than now - grace: let a ms pass
        if setup["backend"] == "postgres":
            assert await node_call(setup["node"], queue_name, "clean", 0, 0, "waiting-children") == []
            assert await queue.clean(0, 0, "waiting-children") == []
            left = {gid: len(ids) for gid, ids in held.items()}
        else:
            cleaned = await queue.clean(0, 0, "waiting-children")
            assert sorted(cleaned, key=int) == sorted((i for ids in held.values() for i in ids), key=int)
            left = {gid: 0 for gid in GROUPS}
        assert await queue.get_groups_jobs_count() == sum(left.values())
        assert {gid: await queue.get_group_job_count(gid) for gid in GROUPS} == left
        assert {g["id"]: (g["waiting"], g["running"]) for g in await queue.get_groups()} == \
            {"a": (left["a"], 2), "b": (left["b"], 1), "c": (left["c"], 1)}

        async def process(job: Any) -> None:
            return None

        worker = Worker(queue_name, process, concurrency=10, drain_delay=1, **setup["kw"])
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        # the released heads (2 of a, 1 of b, 1 of c), the 2 ungrouped jobs and what clean left
        want = 6 + sum(left.values())
        await wait_until(lambda: _completed_is(queue, want), 30, f"the {want} jobs that were not cleaned")
        await wait_until(lambda: _no_groups(queue), 30, "the groups to be gone once their jobs finished")
        assert await queue.get_job_counts("completed", "waiting", "waiting-children") == \
            {"completed": want, "waiting": 0, "waiting-children": 0}
        await worker.close()
        await running
        worker = None
    finally:
        if worker is not None:
            await worker.close()
        await queue.close()


async def _completed_is(queue: Queue, n: int) -> bool:
    return (await queue.get_job_counts("completed"))["completed"] == n


async def _no_groups(queue: Queue) -> bool:
    return await queue.get_groups() == []
