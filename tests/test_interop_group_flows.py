"""Group jobs as flow children with Node BullMQ (docs/groups.md, "Groups in flows"): unmodified Node
workers (on Redis with our keeper, on PostgreSQL with nothing of ours but the triggers), and Node
producers (on Redis interop/groups.js's GroupFlowProducer, Node's FlowProducer whose group nodes go
through our addGroupJob script; on PostgreSQL Node's own FlowProducer). Python workers and the
refusals: tests/test_group_flows.py.

Node runs the children with interop/group_worker.js's recording handler (Redis) and the parents
with the same handler under another record key, so a parent's start can be compared with its
children's ends.
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
import redis.asyncio as aioredis

from bullmq_compat import FlowProducer, Queue
from tests.group_helpers import check_groups, keeper_proc, node_workers, read_records, rec_key, wait_until
from tests.node import NodeError, node
from tests.test_group_flows import GROUPS, backend, flow_workers, parents_key  # noqa: F401 (fixture)

FLOWS = 6


def recorded_flow(parents: str, children: str, i: int, *, pro_shape: bool = False) -> dict[str, Any]:
    """Node's spelling (queueName): parent ``p<i>`` (recorded as group "P<i>") with one child in
    each group (s = i) and one plain child. ``pro_shape``: every group option as ``{"id": g}`` (what
    a Node producer must give on PostgreSQL, where our trigger reads the stored option)."""
    kids: list[dict[str, Any]] = [
        {"name": "kid", "queueName": children, "data": {"g": f"g{g}", "s": i, "sleepMs": 5},
         "opts": {"group": {"id": f"g{g}"}} if g % 2 or pro_shape else {"group": f"g{g}"}}
        for g in range(GROUPS)]
    kids.append({"name": "plain", "queueName": children, "data": {"g": f"plain-{i}", "s": 0}})
    return {"name": "parent", "queueName": parents, "data": {"g": f"P{i}", "s": 0},
            "opts": {"jobId": f"p{i}"}, "children": kids}


def check_parents_after_children(ends: list[dict[str, Any]], parent_ends: list[dict[str, Any]]) -> None:
    assert sorted(e["id"] for e in parent_ends) == sorted(f"p{i}" for i in range(FLOWS))
    for run in parent_ends:
        i = int(run["id"][1:])
        kid_ends = [e["t1"] for e in ends if (e["g"].startswith("g") and e["s"] == i) or e["g"] == f"plain-{i}"]
        assert len(kid_ends) == GROUPS + 1
        assert run["t0"] >= max(kid_ends), f"parent {run['id']} started before its children ended"


def expected_children() -> dict[str, int]:
    expected = {f"g{g}": FLOWS for g in range(GROUPS)}
    expected.update({f"plain-{i}": 1 for i in range(FLOWS)})
    return expected


async def _completed(queue: Queue, n: int) -> bool:
    return (await queue.get_job_counts("completed"))["completed"] >= n


async def test_node_workers_and_a_keeper_run_group_children_in_order_and_parents_after(
        redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """A Python FlowProducer's trees on Redis, run by Node BullMQ workers only (children at
    concurrency 10, parents at 4), one `bullmq-compat keeper`: Node's own finish of each child moves
    its parent as upstream does; the keeper releases each group's next child."""
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(connection=redis_url) as flows, Queue(children, connection=redis_url) as kids, \
            Queue(parents, connection=redis_url) as tops:
        await flows.add_bulk([recorded_flow(parents, children, i) for i in range(FLOWS)])
        async with keeper_proc(redis_url, children, 0.5), \
                node_workers(redis_url, children, concurrency=10), \
                node_workers(redis_url, parents, concurrency=4, rec=f"rec:{parents}"):
            await wait_until(lambda: _completed(tops, FLOWS), 60, f"{FLOWS} parents completed by Node")
        ends, starts = await read_records(redis, rec_key(children))
        check_groups(ends, starts, expected_children())
        assert {e["w"] for e in ends} == {"node"}
        parent_ends, _ = await read_records(redis, f"rec:{parents}")
        check_parents_after_children(ends, parent_ends)
        assert await kids.get_groups() == []


async def test_node_group_flow_producer_trees_run_in_group_order(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """Trees added from Node (Redis: GroupFlowProducer; PostgreSQL: Node's FlowProducer), run by
    Python workers: held children are their parents' pending dependencies, each group runs in add
    order, each parent after its children. A group parent is refused by Node's side with nothing
    written (on Redis; on PostgreSQL Node's FlowProducer knows nothing of groups)."""
    children, parents = queue_name, f"{queue_name}-parents"
    where = ({"redis": redis_url} if "schema" not in backend
             else {"postgres": backend["connection"], "schema": backend["schema"]})
    async with Queue(children, **backend) as kids, Queue(parents, **backend) as tops:
        pro = "schema" in backend
        first = await node("groupFlow", **where, queue=children,
                           flows=[recorded_flow(parents, children, 0, pro_shape=pro)])
        assert first["trees"][0]["id"] == "p0" and len(first["trees"][0]["children"]) == GROUPS + 1
        await node("groupFlow", **where, queue=children, bulk=True,
                   flows=[recorded_flow(parents, children, i, pro_shape=pro) for i in range(1, FLOWS)])
        counts = await kids.get_job_counts("waiting", "waiting-children")
        assert counts == {"waiting": GROUPS + FLOWS, "waiting-children": GROUPS * (FLOWS - 1)}
        held = (await kids.get_group_jobs("g1"))[-1]
        assert held.opts["group"] == {"id": "g1"} and held.parent_key.endswith(f"{parents}:p{FLOWS - 1}")
        assert (await (await tops.get_job(f"p{FLOWS - 1}")).get_dependencies_count())["unprocessed"] == GROUPS + 1
        if "schema" not in backend:
            with pytest.raises(NodeError, match="cannot be a flow parent"):
                await node("groupFlow", **where, queue=children, flows=[
                    {"name": "bad", "queueName": parents, "opts": {"group": "g0"},
                     "children": [{"name": "kid", "queueName": children}]}])
            assert await tops.get_job_counts("waiting-children") == {"waiting-children": FLOWS}
        async with flow_workers(backend, redis_url, children, parents):
            await wait_until(lambda: _completed(tops, FLOWS), 60, f"{FLOWS} parents completed")
        ends, starts = await read_records(redis, rec_key(children))
        check_groups(ends, starts, expected_children())
        runs = [json.loads(x) for x in await redis.lrange(parents_key(children), 0, -1)]
        check_parents_after_children(ends, runs)
        assert await kids.get_groups() == []


async def test_node_group_producer_adds_a_child_under_an_existing_parent(
        redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """interop/groups.js's GroupProducer.add with opts.parent (as Node's Queue.add takes it)."""
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(connection=redis_url) as flows, Queue(children, connection=redis_url) as kids, \
            Queue(parents, connection=redis_url) as tops:
        await flows.add({"name": "parent", "queue_name": parents, "opts": {"jobId": "p"}, "children": [
            {"name": "kid", "queue_name": children, "data": {"g": "N", "s": 0}, "opts": {"group": "N"}}]})
        link = {"id": "p", "queue": tops.qualified_name}
        added = await node("groupAdd", redis=redis_url, queue=children, jobs=[
            {"name": "kid", "data": {"g": "N", "s": 1}, "opts": {"group": "N", "parent": link,
                                                                 "failParentOnFailure": True}}])
        late = await kids.get_job(added["ids"][0])
        assert await late.get_state() == "waiting-children" and late.parent_key == f"{tops.qualified_name}:p"
        assert late.opts.get("fail_parent_on_failure") is True
        with pytest.raises(NodeError, match="parent"):
            await node("groupAdd", redis=redis_url, queue=children, jobs=[
                {"name": "kid", "data": {}, "opts": {"group": "N", "parent": {"id": "gone", "queue": link["queue"]}}}])
        assert (await (await tops.get_job("p")).get_dependencies_count())["unprocessed"] == 2
        async with flow_workers({"connection": redis_url}, redis_url, children, parents):
            await wait_until(lambda: _completed(tops, 1), 60, "the parent completed")
        ends, starts = await read_records(redis, rec_key(children))
        check_groups(ends, starts, {"N": 2})


async def test_node_workers_on_postgresql_run_group_children_in_order_and_parents_after(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """A Python FlowProducer's trees on PostgreSQL run by Node BullMQ workers only (children at
    concurrency 6, parents at 3), no keeper: our trigger releases each group's next child in the
    transaction of Node's finish, and upstream's SQL moves each parent once its last child is done."""
    from bullmq_compat import migrate_postgres
    from tests.pg_group_interop_helpers import create_recorder, node_group_workers, read_runs

    await migrate_postgres(postgres_url, pg_schema, groups=True)
    await create_recorder(postgres_url, pg_schema)
    conn = {"connection": postgres_url, "schema": pg_schema}
    children, parents = queue_name, f"{queue_name}-parents"
    async with FlowProducer(**conn) as flows, Queue(children, **conn) as kids, Queue(parents, **conn) as tops:
        trees = []
        for i in range(FLOWS):
            tree = recorded_flow(parents, children, i)
            tree["children"][-1]["data"]["s"] = i  # the plain child: recorded with no group, s = its flow
            trees.append(tree)
        await flows.add_bulk(trees)
        assert (await kids.get_job_counts("waiting-children"))["waiting-children"] == GROUPS * (FLOWS - 1)
        async with node_group_workers(postgres_url, pg_schema, children, concurrency=6, drainDelay=1), \
                node_group_workers(postgres_url, pg_schema, parents, concurrency=3, drainDelay=1):
            await wait_until(lambda: _completed(tops, FLOWS), 90, f"{FLOWS} parents completed by Node")
        ends, starts = await read_runs(postgres_url, pg_schema, children)
        check_groups([e for e in ends if e["g"]], [s for s in starts if s["g"]],
                     {f"g{g}": FLOWS for g in range(GROUPS)})
        assert {e["w"] for e in ends} == {"node"} and len(ends) == (GROUPS + 1) * FLOWS
        parent_ends, _ = await read_runs(postgres_url, pg_schema, parents)
        assert sorted(r["id"] for r in parent_ends) == sorted(f"p{i}" for i in range(FLOWS))
        for run in parent_ends:
            i = int(run["id"][1:])
            kid_ends = [e["t1"] for e in ends if e["s"] == i]
            assert len(kid_ends) == GROUPS + 1 and run["t0"] >= max(kid_ends)
        assert await kids.get_groups() == []


def policy_flows(parents: str, children: str, grouped: bool) -> list[dict[str, Any]]:
    """One tree per failure policy: a child that fails for good with the policy, beside one that
    completes. ``grouped``: the children are jobs of group "F" (else plain)."""
    opts: dict[str, Any] = {"group": {"id": "F"}} if grouped else {}
    trees = []
    for i, policy in enumerate(("failParentOnFailure", "ignoreDependencyOnFailure", "removeDependencyOnFailure",
                                "continueParentOnFailure")):
        trees.append({"name": "parent", "queueName": parents, "data": {"g": f"P{i}", "s": 0},
                      "opts": {"jobId": policy}, "children": [
                          {"name": "bad", "queueName": children, "data": {"g": "F", "s": 2 * i, "fail": "no"},
                           "opts": {**opts, policy: True}},
                          {"name": "ok", "queueName": children, "data": {"g": "F", "s": 2 * i + 1, "sleepMs": 20},
                           "opts": dict(opts)}]})
    return trees


async def test_failure_policies_of_group_children_under_node_workers_are_nodes(
        redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """Node is the oracle: the same trees, once with group children (our gate, a keeper) and once
    with plain ones, run by Node workers; every parent ends the same way (state, failed reason,
    what Node's getDependenciesCount says), and the group children ran one at a time in order."""
    outcome: dict[bool, dict[str, Any]] = {}
    for grouped in (True, False):
        children, parents = f"{queue_name}-{int(grouped)}", f"{queue_name}-{int(grouped)}-p"
        async with FlowProducer(connection=redis_url) as flows, Queue(parents, connection=redis_url) as tops, \
                Queue(children, connection=redis_url) as kids:
            await flows.add_bulk(policy_flows(parents, children, grouped))

            async def settled() -> bool:
                counts = await tops.get_job_counts("completed", "failed")
                done = await kids.get_job_counts("completed", "failed")
                return counts["completed"] + counts["failed"] == 4 and done["completed"] + done["failed"] == 8

            async with keeper_proc(redis_url, children, 0.5), \
                    node_workers(redis_url, children, concurrency=4, rec=f"rec:{children}"), \
                    node_workers(redis_url, parents, concurrency=4, rec=f"rec:{parents}"):
                await wait_until(settled, 60, "every parent and child finished")
            states = {}
            for policy in ("failParentOnFailure", "ignoreDependencyOnFailure", "removeDependencyOnFailure",
                           "continueParentOnFailure"):
                job = await tops.get_job(policy)
                reason = re.sub(r"child \S+ failed", "child <key> failed", job.failed_reason or "")  # (ids differ)
                states[policy] = (await job.get_state(), reason, await job.get_dependencies_count())
            outcome[grouped] = states
            if grouped:
                ends, starts = await read_records(redis, f"rec:{children}")
                check_groups(ends, starts, {"F": 8})
                assert await kids.get_groups() == []
    assert outcome[True] == outcome[False]
    assert outcome[True]["failParentOnFailure"][0] == "failed"
    assert outcome[True]["ignoreDependencyOnFailure"][0] == "completed"
