"""Flows shared with Node BullMQ (issue #5): trees added by one language and processed (in part)
by the other, stored alike, read alike, and every child failure policy ending as in Node."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bullmq_compat import FlowProducer, Job
from tests.flow_helpers import FINISHED, flow_js, flow_work, policy_flow, workers
from tests.helpers import wait_until

pytestmark = pytest.mark.node


@pytest.fixture
async def flows(redis_url: str) -> Any:
    async with FlowProducer(connection=redis_url) as producer:
        yield producer


async def _finished(job: Job) -> bool:
    return await job.get_state() in FINISHED


def ids(tree: Any) -> Any:
    """A Node tree (from flow.js) as [id, [children...]], children sorted."""
    return [tree["id"], sorted((ids(c) for c in tree.get("children") or []), key=str)]


def py_ids(node: Any) -> Any:
    return [str(node.job.id), sorted((py_ids(c) for c in node.children), key=str)]


async def test_node_flow_with_python_children_and_node_parent(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flow_js("add", redis=redis_url, flow={
        "name": "parent", "queueName": parents, "data": {"behave": {"children": True}},
        "children": [{"name": f"c{i}", "queueName": kids, "data": {"n": i}} for i in range(3)]})
    async with flow_work(redis=redis_url, queue=parents, count=1) as node_parent:
        await asyncio.sleep(0.2)
        assert await flows.queue(parents).get_job_state(tree["id"]) == "waiting-children"
        async with workers(redis_url, [kids]):
            outcome = await node_parent.result()
    assert outcome["completed"] == [tree["id"]]
    parent = await flows.queue(parents).get_job(tree["id"])
    assert parent is not None
    assert parent.returnvalue["children"] == {
        f"bull:{kids}:{c['id']}": {"py": {"n": i}} for i, c in enumerate(tree["children"])}
    assert parent.returnvalue["counts"] == {"processed": 3, "unprocessed": 0, "ignored": 0, "failed": 0}


async def test_python_flow_with_node_children_and_python_parent(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flows.add({"name": "parent", "queue_name": parents, "data": {"behave": {"children": True}},
                            "children": [{"name": f"c{i}", "queue_name": kids, "data": {"n": i}} for i in range(3)]})
    async with workers(redis_url, [parents]):
        async with flow_work(redis=redis_url, queue=kids, count=3) as node_children:
            assert sorted((await node_children.result())["completed"]) == sorted(str(c.job.id) for c in tree.children)
        await wait_until(lambda: _finished(tree.job), what="the Python parent to finish")
    parent = await flows.queue(parents).get_job(str(tree.job.id))
    assert parent is not None and await parent.get_state() == "completed"
    assert parent.returnvalue["children"] == {
        f"bull:{kids}:{c.job.id}": {"echo": {"n": i}} for i, c in enumerate(tree.children)}


def _tree_spec(parents: str, kids: str) -> dict[str, Any]:
    return {
        "name": "root", "queueName": parents, "data": {"r": 1}, "opts": {"jobId": "root", "attempts": 2},
        "children": [
            {"name": "mid", "queueName": kids, "data": {"m": [1, 2]}, "opts": {"jobId": "mid", "priority": 3,
                                                                             "failParentOnFailure": True},
             "children": [{"name": "leaf", "queueName": kids, "opts": {"jobId": "leaf", "delay": 60000,
                                                                        "removeDependencyOnFailure": True}}]},
            {"name": "side", "queueName": f"{kids}-x", "data": "text",
             "opts": {"jobId": "side", "continueParentOnFailure": True, "removeOnComplete": {"count": 5}}},
        ],
    }


async def _stored(redis: Any, queues: list[str]) -> Any:
    """Every key of these queues (hashes, sets, zsets, lists, stream event names), with the queue
    names replaced by Q0, Q1... and times dropped, so that two copies of a flow can be compared."""
    out: dict[str, Any] = {}
    for key in sorted(await redis.keys("bull:" + queues[0] + "*")):
        kind = await redis.type(key)
        if kind == "hash":
            value: Any = {k: v for k, v in (await redis.hgetall(key)).items() if k != "timestamp"}
        elif kind == "set":
            value = sorted(await redis.smembers(key))
        elif kind == "zset":
            value = [m for m, _ in await redis.zrange(key, 0, -1, withscores=True)]
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        elif kind == "stream":
            value = [fields.get("event") + ":" + fields.get("jobId", "") for _, fields in await redis.xrange(key)]
        else:
            value = await redis.get(key)
        out[key] = value
    text = json.dumps(out, sort_keys=True)
    for i, name in sorted(enumerate(queues), key=lambda item: -len(item[1])):
        text = text.replace(f"bull:{name}", f"bull:Q{i}")
    return json.loads(text)


async def test_python_and_node_store_the_same_flow_alike(flows: FlowProducer, redis_url: str, queue_name: str,
                                                         redis: Any) -> None:
    py, js = f"{queue_name}-py", f"{queue_name}-js"
    await flows.add(_tree_spec(f"{py}-p", f"{py}-c"))
    await flow_js("add", redis=redis_url, flow=_tree_spec(f"{js}-p", f"{js}-c"))
    py_keys = await _stored(redis, [py, f"{py}-p", f"{py}-c-x", f"{py}-c"])
    js_keys = await _stored(redis, [js, f"{js}-p", f"{js}-c-x", f"{js}-c"])
    assert py_keys == js_keys
    assert json.loads(py_keys["bull:Q3:mid"]["opts"])["fpof"] is True


async def test_trees_and_dependencies_read_the_same_from_both_sides(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    kids = f"{queue_name}-c"
    tree = await flows.add({"name": "root", "queue_name": queue_name, "children": [
        {"name": "done", "queue_name": kids, "data": {"behave": {"return": {"x": 1}}}},
        {"name": "mid", "queue_name": f"{queue_name}-m", "children": [
            {"name": "leaf", "queue_name": f"{queue_name}-m"}]},
        {"name": "bad", "queue_name": kids, "data": {"behave": {"fail": "nope"}},
         "opts": {"ignore_dependency_on_failure": True}}]})
    async with workers(redis_url, [kids]):
        await wait_until(lambda: _finished(tree.children[2].job), what="the children of the root")
    node_tree = await flow_js("get", redis=redis_url, id=tree.job.id, queueName=queue_name)
    python_tree = await flows.get_flow(id=tree.job.id, queue_name=queue_name)
    assert python_tree is not None and ids(node_tree) == py_ids(python_tree)
    assert ids(await flow_js("get", redis=redis_url, id=tree.job.id, queueName=queue_name, depth=2)) == \
        py_ids(await flows.get_flow(id=tree.job.id, queue_name=queue_name, depth=2))
    call = dict(redis=redis_url, queue=queue_name, id=tree.job.id)
    node_deps = await flow_js("jobCall", **call, method="getDependencies")
    py_deps = await tree.job.get_dependencies()
    assert {**node_deps, "unprocessed": sorted(node_deps["unprocessed"])} == py_deps
    assert await flow_js("jobCall", **call, method="getDependenciesCount") == await tree.job.get_dependencies_count()
    assert await flow_js("jobCall", **call, method="getChildrenValues") == await tree.job.get_children_values()
    assert await flow_js("jobCall", **call, method="getIgnoredChildrenFailures") == \
        await tree.job.get_ignored_children_failures()
    page = {"cursor": 0, "count": 10}
    node_page = await flow_js("jobCall", **call, method="getDependencies",
                              args=[{"processed": page, "unprocessed": page, "ignored": page, "failed": page}])
    py_page = await tree.job.get_dependencies(processed=page, unprocessed=page, ignored=page, failed=page)
    renamed = {"nextProcessedCursor": "next_processed_cursor", "nextUnprocessedCursor": "next_unprocessed_cursor",
               "nextIgnoredCursor": "next_ignored_cursor", "nextFailedCursor": "next_failed_cursor"}
    assert {renamed.get(k, k): v for k, v in node_page.items()} == py_page


async def _policy_outcome(flows: FlowProducer, parents: str, kids: str) -> Any:
    node = await flows.get_flow(id="parent", queue_name=parents)
    assert node is not None
    parent = node.job
    children = []
    for child in node.children:
        children.append([child.job.id, await child.job.get_state(), child.job.returnvalue, child.job.failed_reason])
    text = json.dumps({
        "state": await parent.get_state(), "returnvalue": parent.returnvalue, "failed_reason": parent.failed_reason,
        "children": sorted(children, key=str), "deps": await parent.get_dependencies(),
        "counts": await parent.get_dependencies_count(), "attempts_made": parent.attempts_made,
    }, sort_keys=True)
    return json.loads(text.replace(f"bull:{kids}:", "bull:C:").replace(f"bull:{parents}", "bull:P"))


@pytest.mark.parametrize("policy", ["failParentOnFailure", "ignoreDependencyOnFailure",
                                    "removeDependencyOnFailure", "continueParentOnFailure"])
async def test_failure_policy_ends_as_in_node(flows: FlowProducer, redis_url: str, queue_name: str,
                                              policy: str) -> None:
    py_p, py_c, js_p, js_c = (f"{queue_name}-{s}" for s in ("py-p", "py-c", "js-p", "js-c"))
    tree = await flows.add(policy_flow(py_p, py_c, policy))
    async with workers(redis_url, [py_p, py_c]):
        await wait_until(lambda: _finished(tree.job), what="the Python run to finish")
    node_run = await flow_js("run", redis=redis_url, flow=policy_flow(js_p, js_c, policy), queues=[js_p, js_c])
    assert node_run["state"] in FINISHED
    in_python = await _policy_outcome(flows, py_p, py_c)
    in_node = await _policy_outcome(flows, js_p, js_c)
    assert in_python == in_node
    expected_state = "failed" if policy == "failParentOnFailure" else "completed"
    assert in_python["state"] == expected_state
