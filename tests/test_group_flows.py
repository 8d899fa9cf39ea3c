"""Group jobs as flow children, and group parents refused (docs/groups.md, "Groups in flows"), on
Redis and on PostgreSQL, with Python workers. Node workers, the keeper and Node producers:
tests/test_interop_group_flows.py.

Children run in the recording processor of tests/group_helpers.py (their runs recorded in Redis,
whatever the queue's backend), so `check_groups` asserts the group invariants on them; parents
run in a queue of their own whose processor records when it ran and what its children returned.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import pytest
import redis.asyncio as aioredis

from bullmq_compat import FlowProducer, InvalidJobOptions, Queue, Worker, migrate_postgres
from bullmq_compat._groups import GroupJobRefused
from tests.group_helpers import check_groups, now_ms, read_records, rec_key, recording_processor, wait_until

GROUPS = 3
FLOWS = 8


@pytest.fixture(params=["redis", "postgres"])
async def backend(request: pytest.FixtureRequest, redis_url: str) -> dict[str, Any]:
    """Connection keywords of the queues: Redis, or a schema of this test's own with our groups."""
    if request.param == "redis":
        return {"connection": redis_url}
    postgres_url = request.getfixturevalue("postgres_url")
    schema = request.getfixturevalue("pg_schema")
    await migrate_postgres(postgres_url, schema, groups=True)
    return {"connection": postgres_url, "schema": schema}


def parents_key(queue_name: str) -> str:
    return f"rec:{queue_name}:parents"


@contextlib.asynccontextmanager
async def flow_workers(conn: dict[str, Any], redis_url: str, children: str, parents: str, *,
                       concurrency: int = 10) -> AsyncIterator[None]:
    """Python workers for the children's queue (recording) and the parents' queue (recording when
    each parent ran and what its children returned)."""
    process, client = recording_processor(redis_url, rec_key(children))

    async def parent(job: Any) -> Any:
        values = await job.get_children_values()
        counts = await job.get_dependencies_count()
        await client.rpush(parents_key(children), json.dumps({
            "id": job.id, "t0": now_ms(),
            "children": sorted(f"{v['g']}:{v['s']}" for v in values.values() if isinstance(v, dict) and "g" in v),
            "values": len(values), "unprocessed": counts.get("unprocessed")}))
        return len(values)

    extra = {"drain_delay": 1} if "schema" in conn else {}
    made = [Worker(children, process, **conn, concurrency=concurrency, name="kids", group_sweep_interval=0.5,
                   **extra),
            Worker(parents, parent, **conn, concurrency=4, name="parents", **extra)]
    tasks = [asyncio.ensure_future(w.run(handle_signals=False)) for w in made]
    try:
        yield
    finally:
        for worker in made:
            await worker.close()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        await client.aclose()


def grouped_flow(parents: str, children: str, i: int, *, plain: int = 1) -> dict[str, Any]:
    """Parent ``p<i>`` with one child in each group (s = i: flows are added in order) and ``plain``
    ungrouped children (recorded as group "plain-<i>-<j>", each its own)."""
    kids: list[dict[str, Any]] = [
        {"name": "kid", "queue_name": children, "data": {"g": f"g{g}", "s": i, "sleepMs": 5},
         "opts": {"group": {"id": f"g{g}"}} if g % 2 else {"group": f"g{g}"}}
        for g in range(GROUPS)]
    kids += [{"name": "plain", "queue_name": children, "data": {"g": f"plain-{i}-{j}", "s": 0}}
             for j in range(plain)]
    return {"name": "parent", "queue_name": parents, "data": {}, "opts": {"jobId": f"p{i}"}, "children": kids}


async def test_group_children_run_in_group_order_and_parents_after_them(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(**backend) as flows, Queue(children, **backend) as kids, \
            Queue(parents, **backend) as tops:
        # the first flows by add(), the rest by add_bulk (one transaction)
        for i in range(3):
            await flows.add(grouped_flow(parents, children, i))
        await flows.add_bulk([grouped_flow(parents, children, i) for i in range(3, FLOWS)])
        # nothing runs yet: each group's first child is released, the rest held; a held child is
        # still its parent's pending dependency
        counts = await kids.get_job_counts("waiting", "waiting-children")
        assert counts == {"waiting": GROUPS + FLOWS, "waiting-children": GROUPS * (FLOWS - 1)}
        assert await tops.get_job_counts("waiting-children") == {"waiting-children": FLOWS}
        assert [g["waiting"] for g in sorted(await kids.get_groups(), key=lambda g: g["id"])] == [FLOWS - 1] * GROUPS
        last = await tops.get_job(f"p{FLOWS - 1}")
        assert (await last.get_dependencies_count())["unprocessed"] == GROUPS + 1
        held = (await kids.get_group_jobs("g1"))[-1]
        assert await held.get_state() == "waiting-children" and held.parent_key.endswith(f"{parents}:p{FLOWS - 1}")

        async with flow_workers(backend, redis_url, children, parents):
            await wait_until(lambda: _completed(tops, FLOWS), 60, f"{FLOWS} parents completed")
        ends, starts = await read_records(redis, rec_key(children))
        expected = {f"g{g}": FLOWS for g in range(GROUPS)}
        expected.update({f"plain-{i}-0": 1 for i in range(FLOWS)})
        check_groups(ends, starts, expected)
        runs = [json.loads(x) for x in await redis.lrange(parents_key(children), 0, -1)]
        assert len(runs) == FLOWS
        for run in runs:
            i = int(run["id"][1:])
            assert run["values"] == GROUPS + 1 and run["unprocessed"] == 0
            assert run["children"] == sorted([f"g{g}:{i}" for g in range(GROUPS)] + [f"plain-{i}-0:0"])
            # the parent started after every one of its children ended
            kid_ends = [e["t1"] for e in ends if e["s"] == i and e["g"].startswith("g")]
            assert run["t0"] >= max(kid_ends)
        assert await kids.get_groups() == []


async def _completed(queue: Queue, n: int) -> bool:
    return (await queue.get_job_counts("completed"))["completed"] >= n


async def test_failing_group_child_fails_its_parent_and_frees_its_group(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """failParentOnFailure on a group child, as upstream: the parent fails; the group goes on (its
    next job, a child of another flow, runs and its parent completes)."""
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(**backend) as flows, Queue(children, **backend) as kids, \
            Queue(parents, **backend) as tops:
        await flows.add({"name": "parent", "queue_name": parents, "opts": {"jobId": "bad"}, "children": [
            {"name": "kid", "queue_name": children, "data": {"g": "F", "s": 0, "fail": "no", "sleepMs": 20},
             "opts": {"group": "F", "failParentOnFailure": True}},
            {"name": "kid", "queue_name": children, "data": {"g": "F", "s": 1},
             "opts": {"group": "F"}}]})
        await flows.add({"name": "parent", "queue_name": parents, "opts": {"jobId": "good"}, "children": [
            {"name": "kid", "queue_name": children, "data": {"g": "F", "s": 2}, "opts": {"group": "F"}}]})
        assert await kids.get_group_job_count("F") == 2
        async with flow_workers(backend, redis_url, children, parents):
            await wait_until(lambda: _completed(tops, 1), 60, "the good parent completed")
            await wait_until(lambda: _completed(kids, 2), 60, "the two other children completed")
        assert await (await tops.get_job("bad")).get_state() == "failed"
        assert await (await tops.get_job("good")).get_state() == "completed"
        ends, starts = await read_records(redis, rec_key(children))
        check_groups(ends, starts, {"F": 3})
        assert await kids.get_groups() == []


async def test_removing_a_held_child_removes_only_it(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """A held child removed (as Bull-Board removes one): upstream unlinks it from its parent, the
    group forgets it, and nothing else goes."""
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(**backend) as flows, Queue(children, **backend) as kids, \
            Queue(parents, **backend) as tops:
        await kids.add("kid", {"g": "R", "s": 0}, group="R")
        node = await flows.add({"name": "parent", "queue_name": parents, "opts": {"jobId": "p"}, "children": [
            {"name": "kid", "queue_name": children, "data": {"g": "R", "s": 9}, "opts": {"group": "R"}},
            {"name": "kid", "queue_name": children, "data": {"g": "plain", "s": 0}}]})
        held = node.children[0].job
        assert await (await kids.get_job(held.id)).get_state() == "waiting-children"
        await (await kids.get_job(held.id)).remove()
        assert await kids.get_group_jobs("R") == []
        assert (await (await tops.get_job("p")).get_dependencies_count())["unprocessed"] == 1
        async with flow_workers(backend, redis_url, children, parents):
            await wait_until(lambda: _completed(tops, 1), 60, "the parent completed")
        ends, starts = await read_records(redis, rec_key(children))
        check_groups(ends, starts, {"R": 1, "plain": 1})


async def test_group_parents_are_refused_and_nothing_is_written(
        backend: dict[str, Any], queue_name: str) -> None:
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(**backend) as flows, Queue(children, **backend) as kids, \
            Queue(parents, **backend) as tops:
        for opts in ({"group": "G"}, {"group": {"id": "G"}}, {"order_ms": 5}):
            with pytest.raises(GroupJobRefused) as info:
                await flows.add_bulk([
                    {"name": "fine", "queue_name": children, "opts": {"group": "G"}},
                    {"name": "parent", "queue_name": parents, "opts": opts, "children": [
                        {"name": "kid", "queue_name": children, "opts": {"group": "G"}}]}])
            text = str(info.value)
            assert "flow[1]" in text and "cannot be a flow parent" in text and next(iter(opts)) in text
        assert issubclass(GroupJobRefused, InvalidJobOptions)
        with pytest.raises(InvalidJobOptions, match="order_ms"):  # order_ms still needs a group
            await flows.add({"name": "kid", "queue_name": children, "opts": {"order_ms": 5}})
        with pytest.raises(InvalidJobOptions, match="group"):
            await flows.add({"name": "parent", "queue_name": parents, "children": [
                {"name": "kid", "queue_name": children, "opts": {"group": {"id": ""}}}]})
        assert sum((await kids.get_job_counts()).values()) == 0
        assert sum((await tops.get_job_counts()).values()) == 0


async def test_queue_add_with_a_parent_and_a_group(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """Queue.add(parent=..., group=...) links a group child to an existing parent, held or not."""
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(**backend) as flows, Queue(children, **backend) as kids, \
            Queue(parents, **backend) as tops:
        await flows.add({"name": "parent", "queue_name": parents, "opts": {"jobId": "p"}, "children": [
            {"name": "kid", "queue_name": children, "data": {"g": "Q", "s": 0}, "opts": {"group": "Q"}}]})
        link = {"id": "p", "queue": tops.qualified_name}
        late = await kids.add("kid", {"g": "Q", "s": 1}, group="Q", parent=link)
        assert await late.get_state() == "waiting-children"
        assert (await (await tops.get_job("p")).get_dependencies_count())["unprocessed"] == 2
        async with flow_workers(backend, redis_url, children, parents):
            await wait_until(lambda: _completed(tops, 1), 60, "the parent completed")
        ends, starts = await read_records(redis, rec_key(children))
        check_groups(ends, starts, {"Q": 2})
        runs = [json.loads(x) for x in await redis.lrange(parents_key(children), 0, -1)]
        assert runs[0]["children"] == ["Q:0", "Q:1"]
