"""Flows shared by Python and Node on PostgreSQL: a Node flow (Node parent) whose children a Python
worker runs, a Python flow (Python parent) whose children Node runs, children values seen as
objects (never JSON text) on both sides, scalar data in flow nodes, and a flow holding U+0000
refused whole. Assertions are about what Node observes."""
from __future__ import annotations

from typing import Any

import pytest

from bullmq_compat import FlowProducer
from bullmq_compat._errors import InvalidJobData
from tests.node import node
from tests.pg_interop_helpers import apsql, eventually, flow_js, flow_work, node_job, node_states, pg_of, py_worker

pytestmark = pytest.mark.node

VALUES: list[Any] = ["42", {"a": [1, None]}, 7, "plain"]


async def test_node_flow_with_python_children_and_a_node_parent(postgres_url: str, pg_schema: str,
                                                               queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flow_js("add", **pg, flow={
        "name": "parent", "queueName": parents, "data": {"behave": {"children": True}},
        "children": [{"name": f"c{i}", "queueName": kids, "data": {"behave": {"return": v}}}
                     for i, v in enumerate(VALUES)]})
    root, children = tree["id"], [c["id"] for c in tree["children"]]
    assert await node("getState", **pg, queue=parents, id=root) == "waiting-children"
    async with flow_work(**pg, queue=parents, count=1, timeoutMs=90000) as node_parent:
        async with py_worker(kids, postgres_url, pg_schema):
            outcome = await node_parent.result()
    assert outcome["completed"] == [root]
    got = await flow_js("get", **pg, id=root, queueName=parents)
    assert got["state"] == "completed"
    expected = {f"{kids}:{c}": v for c, v in zip(children, VALUES)}
    values = got["returnvalue"]["children"]
    assert values == expected
    assert all(type(values[k]) is type(v) for k, v in expected.items())  # "42" stayed a string
    assert got["returnvalue"]["counts"]["processed"] == len(VALUES)
    for child, value in zip(children, VALUES):
        seen = await node_job(pg, kids, child)
        assert seen["state"] == "completed" and seen["returnvalue"] == value and seen["parentKey"] == f"{parents}:{root}"


async def test_python_flow_with_node_children_and_a_python_parent(postgres_url: str, pg_schema: str,
                                                                 queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    seen_by_parent: dict[str, Any] = {}

    async def parent_processor(job: Any) -> Any:
        values = await job.get_children_values()
        seen_by_parent.update(values)
        return {"children": values, "counts": await job.get_dependencies_count()}

    async with FlowProducer(connection=postgres_url, schema=pg_schema, migrate=True) as flows:
        tree = await flows.add({
            "name": "parent", "queue_name": parents, "data": {"p": 1},
            "children": [{"name": f"c{i}", "queue_name": kids, "data": {"behave": {"return": v}}}
                         for i, v in enumerate(VALUES)]})
    root, children = str(tree.job.id), [str(c.job.id) for c in tree.children]
    assert await node("getState", **pg, queue=parents, id=root) == "waiting-children"
    node_tree = await flow_js("get", **pg, id=root, queueName=parents)
    assert sorted(c["id"] for c in node_tree["children"]) == sorted(children)
    assert all(c["parentKey"] == f"{parents}:{root}" for c in node_tree["children"])

    async with py_worker(parents, postgres_url, pg_schema, parent_processor):
        async with flow_work(**pg, queue=kids, count=len(VALUES), timeoutMs=90000) as node_children:
            assert sorted((await node_children.result())["completed"]) == sorted(children)
        await eventually(lambda: node_states(pg, parents, [root], "completed"), what="the Python parent completed")
    expected = {f"{kids}:{c}": v for c, v in zip(children, VALUES)}
    # objects, numbers and strings as the children returned them -- not their JSON text
    assert seen_by_parent == expected
    assert all(type(seen_by_parent[k]) is type(v) for k, v in expected.items())
    assert isinstance(seen_by_parent[f"{kids}:{children[1]}"], dict)
    parent = await node_job(pg, parents, root)
    assert parent["returnvalue"]["children"] == expected
    assert parent["returnvalue"]["counts"]["processed"] == len(VALUES)
    assert await flow_js("jobCall", **pg, queue=parents, id=root, method="getChildrenValues") == expected


async def test_flows_with_scalar_data_both_ways(postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    async with FlowProducer(connection=postgres_url, schema=pg_schema, migrate=True) as flows:
        tree = await flows.add({"name": "parent", "queue_name": parents, "data": "plain", "children": [
            {"name": "seven", "queue_name": kids, "data": 7},
            {"name": "text", "queue_name": kids, "data": "text"},
            {"name": "list", "queue_name": kids, "data": [1, "x"]}]})
        [bulk] = await flows.add_bulk([{"name": "solo", "queue_name": kids, "data": "solo"}])
    root = str(tree.job.id)
    assert (await node_job(pg, parents, root))["data"] == "plain"
    assert sorted([(await node_job(pg, kids, str(c.job.id)))["data"] for c in tree.children], key=str) == \
        sorted([7, "text", [1, "x"]], key=str)
    assert (await node_job(pg, kids, str(bulk.job.id)))["data"] == "solo"

    # Node runs the whole Python flow: scalar data reaches its processors as such
    async with flow_work(**pg, queue=kids, count=4, timeoutMs=90000) as node_children:
        assert len((await node_children.result())["completed"]) == 4
    outcome = await flow_js("work", **pg, queue=parents, count=1, timeoutMs=60000)
    assert outcome["completed"] == [root]
    assert (await node_job(pg, parents, root))["returnvalue"] == {"echo": "plain"}
    assert (await node_job(pg, kids, str(tree.children[0].job.id)))["returnvalue"] == {"echo": 7}

    # and the reverse: a Node flow with scalar data, run by Python workers
    node_tree = await flow_js("add", **pg, flow={"name": "np", "queueName": parents, "data": 5, "children": [
        {"name": "nc", "queueName": kids, "data": "from-node"}]})
    async with py_worker(kids, postgres_url, pg_schema), py_worker(parents, postgres_url, pg_schema):
        await eventually(lambda: node_states(pg, parents, [node_tree["id"]], "completed"))
    assert (await node_job(pg, parents, node_tree["id"]))["returnvalue"] == {"py": 5}
    assert (await node_job(pg, kids, node_tree["children"][0]["id"]))["returnvalue"] == {"py": "from-node"}


async def test_a_flow_holding_nul_writes_nothing(postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    async with FlowProducer(connection=postgres_url, schema=pg_schema, migrate=True) as flows:
        with pytest.raises(InvalidJobData, match="U\\+0000"):
            await flows.add({"name": "parent", "queue_name": parents, "data": {"ok": 1}, "children": [
                {"name": "good", "queue_name": kids, "data": {"ok": 2}},
                {"name": "bad", "queue_name": kids, "data": {"s": "x\u0000"}}]})
    for queue in (parents, kids):
        assert sum((await node("getJobCounts", **pg, queue=queue)).values()) == 0
    assert await apsql(f"SELECT count(*) FROM {pg_schema}.job") == [["0"]]
