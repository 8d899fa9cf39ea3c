"""Groups round 2 (issue #28): the gaps an audit found, on Redis and on PostgreSQL.

- ``get_groups()`` reports each group's ``max_size``: the ``max_size`` of its most recently added job
  not finished yet that carried one (None when none does), Python's and Node's adds alike.
- A Node producer's jobs (interop/groups.js ``GroupProducer.add`` with ``{group: {id, maxSize}}``) are
  refused at max size on Redis, writing nothing, and count toward Python's limit and back.
- PostgreSQL: ``Worker(group={"limit": ...})`` sets the queue's default group rate limit; and the
  sliding-window limit together with group concurrency 2 under Node workers (no keeper), checked
  from the start times each job's processor recorded.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest

from bullmq_compat import GroupMaxSizeExceeded, Queue, Worker
from tests.group_helpers import check_groups
from tests.helpers import wait_until
from tests.node import NodeError, node
from tests.pg_group_helpers import wait_for
from tests.pg_group_interop_helpers import (
    node_group_workers,
    python_workers,
    read_runs,
    runs,
    send_signal,
)
from tests.test_group_max_size import footprint, setup  # noqa: F401  (setup: a fixture, both backends)
from tests.test_group_rate_limit import items
from tests.test_postgres_group_rate_limit import check_rates, gschema, wait_finished  # noqa: F401  (gschema: a fixture)


def max_sizes(groups: list[dict[str, Any]]) -> dict[str, Optional[int]]:
    return {group["id"]: group.get("max_size") for group in groups}


async def node_add(setup: dict[str, Any], queue: str, group: dict[str, Any]) -> str:
    """One group job added by a Node producer: on Redis interop/groups.js's GroupProducer, on
    PostgreSQL Node's own Queue.add with opts.group (our trigger gates it)."""
    if setup["backend"] == "redis":
        added = await node("groupAdd", redis=setup["url"], queue=queue,
                           jobs=[{"name": "n", "data": {}, "opts": {"group": group}}])
        return str(added["ids"][0])
    added = await node("add", **setup["node"], queue=queue, name="n", data={}, opts={"group": group})
    return str(added["row"]["id"])


# -- get_groups: max_size ---------------------------------------------------------------------------

async def test_get_groups_reports_the_max_size_of_the_newest_job_that_carried_one(
        setup: dict[str, Any], queue_name: str) -> None:
    queue = Queue(queue_name, **setup["kw"])
    worker: Any = None
    try:
        await queue.add("x", {}, group="a")  # a's released head: no max_size
        await queue.add("x", {}, group={"id": "a", "max_size": 5})
        await queue.add("x", {}, group={"id": "a", "maxSize": 7})
        await queue.add("x", {}, group="a")  # a's newest job carries none: the one before it counts
        await queue.add("x", {}, group="b")
        await queue.add("x", {}, group={"id": "c", "max_size": 3})
        newest_c = await queue.add("x", {}, group={"id": "c", "max_size": 9})  # held behind c's head
        await queue.add("x", {}, group={"id": "d", "max_size": 4})  # d's released head carries it
        await queue.add("x", {}, group="d")
        await queue.pause_group("e")  # listed, without jobs
        groups = await queue.get_groups()
        assert max_sizes(groups) == {"a": 7, "b": None, "c": 9, "d": 4, "e": None}
        # a group none of whose jobs carries a max_size has no such key: its fields are as before
        assert {g["id"]: g for g in groups}["b"] == {"id": "b", "waiting": 0, "running": 1, "paused": False,
                                                     "concurrency": 1}
        assert {g["id"]: (g["waiting"], g["running"]) for g in groups} == {
            "a": (3, 1), "b": (0, 1), "c": (1, 1), "d": (1, 1), "e": (0, 0)}
        assert max_sizes(await queue.get_groups("paused")) == {"e": None}
        # a removed job no longer counts: c's head (max_size 3) is its newest job with one
        removed = await queue.get_job(newest_c.id)
        assert removed is not None
        await removed.remove()
        assert max_sizes(await queue.get_groups())["c"] == 3

        async def process(job: Any) -> None:
            return None

        worker = Worker(queue_name, process, concurrency=5, drain_delay=1, **setup["kw"])
        running = asyncio.ensure_future(worker.run(handle_signals=False))

        async def all_completed() -> bool:
            return (await queue.get_job_counts("completed"))["completed"] == 8

        async def only_e_left() -> bool:
            return {g["id"] for g in await queue.get_groups()} == {"e"}

        await wait_until(all_completed, timeout=60, what="the 8 jobs completed")
        await wait_until(only_e_left, timeout=30, what="the finished groups gone from get_groups")
        await worker.close()
        await running
        worker = None
        # finished jobs do not count: d's job with max_size 4 has completed
        await queue.add("x", {}, group="d")
        assert max_sizes(await queue.get_groups()) == {"d": None, "e": None}
        await queue.add("x", {}, group={"id": "d", "max_size": 2})
        assert max_sizes(await queue.get_groups()) == {"d": 2, "e": None}
    finally:
        if worker is not None:
            await worker.close()
        await queue.close()


async def test_get_groups_reports_a_node_producers_max_size(setup: dict[str, Any], queue_name: str) -> None:
    async with Queue(queue_name, **setup["kw"]) as queue:
        await node_add(setup, queue_name, {"id": "n", "maxSize": 4})
        newest = await node_add(setup, queue_name, {"id": "n", "maxSize": 6})
        stored = await queue.get_job(newest)
        assert stored is not None and stored.opts["group"] == {"id": "n", "maxSize": 6}
        assert await queue.get_job_state(newest) == "waiting-children"
        assert max_sizes(await queue.get_groups()) == {"n": 6}
        await queue.add("x", {}, group="n")  # Python's add without max_size: Node's stays the newest one
        assert max_sizes(await queue.get_groups()) == {"n": 6}
        await queue.add("x", {}, group={"id": "n", "max_size": 10})
        assert max_sizes(await queue.get_groups()) == {"n": 10}
        await node_add(setup, queue_name, {"id": "n", "maxSize": 8})
        await node_add(setup, queue_name, {"id": "m"})
        assert max_sizes(await queue.get_groups()) == {"m": None, "n": 8}


# -- a Node GroupProducer refused at max size (Redis) -------------------------------------------------

async def test_a_node_group_producer_is_refused_at_max_size_on_redis(redis_url: str, queue_name: str) -> None:
    """interop/groups.js's GroupProducer.add with {group: {id, maxSize}}: our addGroupJob script
    refuses the add once the group holds maxSize jobs not started yet, writing nothing; the error is
    named GroupMaxSizeExceededError. Python's and Node's adds count toward each other's limit."""
    setup = {"backend": "redis", "url": redis_url}

    def job(gid: str, max_size: int) -> dict[str, Any]:
        return {"name": "n", "data": {}, "opts": {"group": {"id": gid, "maxSize": max_size}}}

    added = await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[job("g", 2), job("g", 2)])
    assert len(set(added["ids"])) == 2
    before = await footprint(setup, queue_name)
    assert before["held"] == 1
    with pytest.raises(NodeError) as refused:
        await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[job("g", 2)])
    assert refused.value.name == "GroupMaxSizeExceededError"
    assert "already holds maxSize=2 jobs not started yet" in refused.value.message
    assert await footprint(setup, queue_name) == before  # no job, no event, no id
    async with Queue(queue_name, connection=redis_url) as queue:
        with pytest.raises(GroupMaxSizeExceeded) as py_refused:  # Python's limit counts Node's jobs
            await queue.add("x", {}, group={"id": "g", "max_size": 2})
        assert (py_refused.value.group_id, py_refused.value.max_size) == ("g", 2)
        stored = await queue.get_job(added["ids"][0])
        assert stored is not None and stored.opts["group"] == {"id": "g", "maxSize": 2}
        # Node's limit counts Python's jobs
        await queue.add("x", {}, group="p")
        await queue.add("x", {}, group="p")
        with pytest.raises(NodeError, match="GroupMaxSizeExceededError"):
            await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[job("p", 2)])
        assert len((await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[job("p", 3)]))["ids"]) == 1
        with pytest.raises(NodeError, match="GroupMaxSizeExceededError"):
            await node("groupAdd", redis=redis_url, queue=queue_name, jobs=[job("p", 3)])
        assert await queue.get_group_job_count("p") == 2
        assert max_sizes(await queue.get_groups()) == {"g": 2, "p": 3}


# -- group rate limits on PostgreSQL ----------------------------------------------------------------

async def test_the_worker_group_limit_option_sets_the_default_on_postgres(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    groups = {"A": 5, "B": 5, "C": 5}
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_rate_limit("C", max=5, duration=50)  # its own: the default does not apply
        assert await queue.get_group_rate_limit() is None
        async with python_workers(postgres_url, gschema, queue_name, 1, concurrency=6, group_keeper=False,
                                  group={"limit": {"max": 2, "duration": 600}}) as workers:
            assert workers[0].group_options == {"limit": (2, 600)}

            async def applied() -> bool:
                return await queue.get_group_rate_limit() == {"max": 2, "duration": 600}

            await wait_for(applied, 30, "the worker's group limit stored as the queue's default")
            await queue.add_bulk(items(groups))
            await wait_finished(postgres_url, gschema, queue_name, sum(groups.values()))
        assert await queue.get_group_rate_limit("A") == {"max": 2, "duration": 600}
        assert await queue.get_group_rate_limit("C") == {"max": 5, "duration": 50}
        ends, starts = await read_runs(postgres_url, gschema, queue_name)
        check_groups(ends, starts, groups)
        by_p = await check_rates(postgres_url, gschema, queue_name, starts,
                                 {"A": (2, 600), "B": (2, 600), "C": (5, 50)})
        assert by_p["C"][-1] < by_p["A"][-1]  # 5 per 50 ms: C is not held to the default


async def test_node_workers_keep_the_rate_limit_with_group_concurrency_2_on_postgres(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    """Default group concurrency 2 and a default limit of 3 starts per 800 ms; unmodified Node
    workers, no keeper. A's first two jobs hold until a signal, so two of A are seen active at once
    (k = 2 in force); then per group no window of 800 ms holds more than 3 starts, never more than
    2 of a group run at once, and the unlimited group ran meanwhile."""
    groups = {"A": 8, "B": 8, "free": 10}
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_default_group_concurrency(2)
        await queue.set_default_group_rate_limit(max=3, duration=800)
        await queue.set_group_rate_limit("free", max=1000, duration=1)
        bulk = items(groups, sleep_ms=2)
        for item in bulk:
            if item["data"]["g"] == "A" and item["data"]["s"] < 2:
                item["data"]["holdUntil"] = "A-go"
        await queue.add_bulk(bulk)
        async with node_group_workers(postgres_url, gschema, queue_name, workers=2, concurrency=4, drainDelay=1):
            async def two_of_a_running() -> bool:
                # both processors have recorded their start (active in the database alone is not
                # enough: a run recorded after the signal could start after the other one ended)
                held = [r for r in await runs(postgres_url, gschema, queue_name) if r["g"] == "A" and r["t1"] is None]
                return await queue.get_group_active_count("A") == 2 and len(held) == 2

            await wait_for(two_of_a_running, 60, "A's first two jobs running at once under Node workers")
            await send_signal(postgres_url, gschema, queue_name, "A-go")
            await wait_finished(postgres_url, gschema, queue_name, sum(groups.values()))
        ends, starts = await read_runs(postgres_url, gschema, queue_name)
        assert {s["w"] for s in starts} == {"node"}
        overlap = check_groups(ends, starts, groups, k=2)
        assert overlap["A"] == 2
        by_p = await check_rates(postgres_url, gschema, queue_name, starts, {"A": (3, 800), "B": (3, 800)})
        assert by_p["free"][-1] < by_p["A"][-1]
