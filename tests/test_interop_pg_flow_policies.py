"""The child-failure policies of a flow on PostgreSQL, with Node as the oracle (issue #31): the flow
of `tests.flow_helpers.policy_flow` runs once under Python workers (`run_policy` of
tests/test_postgres_flow_policies.py) and once under Node's createPostgresBackend workers
(interop/flow.js "run"), on one schema with different queue names; what the parent ends as and
reads of its children must be what Node gives. Both runs are read by Python (`_policy_outcome`
of tests/test_interop_flows.py plus the PostgreSQL-only readers) and by Node (flow.js get/jobCall).
Keys there are ``<queue>:<id>`` (no prefix); they are compared with the queue names replaced."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import FlowProducer
from tests.flow_helpers import FINISHED, flow_js, policy_flow
from tests.helpers import wait_until
from tests.pg_interop_helpers import flow_work, pg_of, py_worker
from tests.test_interop_flows import _policy_outcome
from tests.test_postgres_flow_policies import run_policy

pytestmark = pytest.mark.node

POLICIES = ["failParentOnFailure", "ignoreDependencyOnFailure", "removeDependencyOnFailure",
            "continueParentOnFailure"]
NODE_READERS = ["getDependencies", "getDependenciesCount", "getChildrenValues", "getIgnoredChildrenFailures",
                "getFailedChildrenValues"]


@pytest.fixture
async def producer(postgres_url: str, pg_migrated: str) -> AsyncIterator[FlowProducer]:
    async with FlowProducer(connection=postgres_url, schema=pg_migrated) as flows:
        yield flows


def _renamed(value: Any, parents: str, kids: str) -> Any:
    """``value`` with the queue names (in keys, reasons, queueName...) replaced by P and C."""
    text = json.dumps(value, sort_keys=True).replace(kids, "C").replace(parents, "P")
    return json.loads(text)


async def _python_reads(flows: FlowProducer, parents: str, kids: str) -> Any:
    """What Python reads of the parent: `_policy_outcome` and the readers it leaves out."""
    outcome = await _policy_outcome(flows, parents, kids)
    parent = await flows.queue(parents).get_job("parent")
    assert parent is not None
    outcome["children_values"] = await parent.get_children_values()
    outcome["ignored_failures"] = await parent.get_ignored_children_failures()
    outcome["failed_children_values"] = await parent.get_failed_children_values()
    return _renamed(outcome, parents, kids)


async def _node_reads(pg: dict[str, Any], parents: str, kids: str) -> Any:
    """What Node reads of the parent: its flow tree (states, values, reasons) and each reader."""
    tree = await flow_js("get", **pg, id="parent", queueName=parents)
    assert tree is not None
    tree["children"] = sorted(tree.get("children") or [], key=lambda c: c["id"])
    out = {"tree": tree}
    for method in NODE_READERS:
        value = await flow_js("jobCall", **pg, queue=parents, id="parent", method=method)
        if method == "getDependencies":
            value = {k: sorted(v) if isinstance(v, list) else v for k, v in value.items()}
        out[method] = value
    return _renamed(out, parents, kids)


def _sides(py_p: str, py_c: str) -> tuple[str, str]:
    return f"{py_p}-js-p", f"{py_c}-js-c"


@pytest.mark.parametrize("policy", POLICIES)
async def test_failure_policy_ends_as_in_node(producer: FlowProducer, postgres_url: str, pg_migrated: str,
                                              policy: str) -> None:
    pg = pg_of(postgres_url, pg_migrated)
    parent, bad, _ok = await run_policy(producer, postgres_url, pg_migrated, policy)
    py_p, py_c = str(parent.queue_name), bad.rsplit(":", 1)[0]
    js_p, js_c = _sides(py_p, py_c)
    node_run = await flow_js("run", **pg, flow=policy_flow(js_p, js_c, policy), queues=[js_p, js_c],
                             timeoutMs=90000)
    assert node_run["state"] in FINISHED, node_run

    in_node = await _python_reads(producer, js_p, js_c)
    in_python = await _python_reads(producer, py_p, py_c)
    assert in_python == in_node
    # and as Node reads them, the two runs are alike too
    assert await _node_reads(pg, py_p, py_c) == await _node_reads(pg, js_p, js_c)
    assert in_node["state"] == ("failed" if policy == "failParentOnFailure" else "completed")


async def test_without_a_policy_the_parent_keeps_waiting_as_in_node(producer: FlowProducer, postgres_url: str,
                                                                    pg_migrated: str, queue_name: str) -> None:
    """No policy: once both children finished (only the children's queues are worked, so a parent
    wrongly released would be seen waiting, not run), the parent is still waiting for children."""
    pg = pg_of(postgres_url, pg_migrated)
    py_p, py_c = f"{queue_name}-py-p", f"{queue_name}-py-c"
    js_p, js_c = _sides(py_p, py_c)
    tree = await producer.add(policy_flow(py_p, py_c, None))

    async def children_finished() -> bool:
        return all([await c.job.get_state() in FINISHED for c in tree.children])

    async with py_worker(py_c, postgres_url, pg_migrated):
        await wait_until(children_finished, 60, what="the Python children to finish")
    await flow_js("add", **pg, flow=policy_flow(js_p, js_c, None))
    async with flow_work(**pg, queue=js_c, count=2, timeoutMs=90000) as node_children:
        done = await node_children.result()
    assert not done["timedOut"] and done["completed"] == ["ok"] and done["failed"] == ["bad"], done

    in_node = await _python_reads(producer, js_p, js_c)
    in_python = await _python_reads(producer, py_p, py_c)
    assert in_python == in_node
    assert await _node_reads(pg, py_p, py_c) == await _node_reads(pg, js_p, js_c)
    assert in_node["state"] == "waiting-children"


def _tree_of(node: Any) -> Any:
    """Python's get_flow node as flow.js "get" writes Node's (without parentKey, children sorted)."""
    job = node.job
    return {"id": job.id, "name": job.name, "returnvalue": job.returnvalue, "failedReason": job.failed_reason,
            "children": sorted((_tree_of(c) for c in node.children), key=lambda c: c["id"])}


def _node_tree(tree: Any) -> Any:
    return {"id": tree["id"], "name": tree["name"], "returnvalue": tree["returnvalue"],
            "failedReason": tree["failedReason"],
            "children": sorted((_node_tree(c) for c in tree.get("children") or []), key=lambda c: c["id"])}


@pytest.mark.parametrize("policy", POLICIES)
async def test_python_reads_the_node_run_tree_as_node_does(producer: FlowProducer, postgres_url: str,
                                                           pg_migrated: str, queue_name: str, policy: str) -> None:
    pg = pg_of(postgres_url, pg_migrated)
    js_p, js_c = f"{queue_name}-js-p", f"{queue_name}-js-c"
    node_run = await flow_js("run", **pg, flow=policy_flow(js_p, js_c, policy), queues=[js_p, js_c],
                             timeoutMs=90000)
    assert node_run["state"] in FINISHED, node_run
    in_node = _node_tree(await flow_js("get", **pg, id="parent", queueName=js_p))
    assert in_node["children"], in_node  # Node sees at least the good child
    python_node = await producer.get_flow(id="parent", queue_name=js_p)
    assert python_node is not None
    assert _tree_of(python_node) == in_node
