"""Flows in Python (issue #5): FlowProducer trees across queues, the parent waiting for its
children, the child failure policies, reading a flow back, and the Job flow methods."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bullmq_compat import (
    FlowProducer,
    InvalidArgument,
    InvalidJobOptions,
    Job,
    JobNode,
    ParentJobNotFound,
    Queue,
    WaitingChildrenError,
    Worker,
)
from tests.flow_helpers import FINISHED, policy_flow, process, workers
from tests.helpers import wait_until


@pytest.fixture
async def flows(redis_url: str) -> Any:
    async with FlowProducer(connection=redis_url) as producer:
        yield producer


def leaf(queue: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "queue_name": queue, "data": {"n": name}, **extra}


async def state_of(job: Job) -> str:
    return await job.get_state()


# -- adding -----------------------------------------------------------------------------------------
async def test_add_returns_the_tree_with_links_and_states(flows: FlowProducer, queue_name: str, redis: Any) -> None:
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flows.add({"name": "parent", "queue_name": parents, "data": {"p": 1},
                            "children": [leaf(kids, "a"), leaf(kids, "b")]})
    assert isinstance(tree, JobNode) and tree["job"] is tree.job
    parent = tree.job
    assert (parent.name, parent.data, parent.queue.name) == ("parent", {"p": 1}, parents)
    assert [c.job.name for c in tree.children] == ["a", "b"]
    assert await state_of(parent) == "waiting-children"
    parent_key = f"bull:{parents}:{parent.id}"
    for child in tree.children:
        assert child.children == []
        assert child.job.parent_key == parent_key
        assert child.job.parent == {"id": parent.id, "queueKey": f"bull:{parents}"}
        assert await state_of(child.job) == "waiting"
        stored = await redis.hgetall(f"bull:{kids}:{child.job.id}")
        assert stored["parentKey"] == parent_key
        assert json.loads(stored["parent"]) == {"id": parent.id, "queueKey": f"bull:{parents}"}
        assert "jobId" not in json.loads(stored["opts"])  # generated ids are not options, as in Node
    assert await redis.smembers(f"{parent_key}:dependencies") == {
        f"bull:{kids}:{c.job.id}" for c in tree.children}


async def test_parent_waits_for_children_in_other_queues_then_sees_their_values(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flows.add({"name": "parent", "queue_name": parents, "data": {"behave": {"children": True}},
                            "children": [leaf(kids, "a"), leaf(kids, "b"), leaf(kids, "c")]})
    async with workers(redis_url, [parents]):
        await asyncio.sleep(0.3)  # the parent's worker finds nothing while the children wait
        assert await state_of(tree.job) == "waiting-children"
        async with workers(redis_url, [kids]):
            await wait_until(lambda: _finished(tree.job), what="the parent to complete")
    parent = await tree.job.queue.get_job(str(tree.job.id))
    assert parent is not None and await parent.get_state() == "completed"
    expected = {f"bull:{kids}:{c.job.id}": {"py": {"n": c.job.name}} for c in tree.children}
    assert parent.returnvalue["children"] == expected
    assert parent.returnvalue["counts"] == {"processed": 3, "unprocessed": 0, "ignored": 0, "failed": 0}
    assert await parent.get_children_values() == expected


async def _finished(job: Job) -> bool:
    return await job.get_state() in FINISHED


async def _in_state(job: Job, state: str) -> bool:
    return await job.get_state() == state


async def test_levels_finish_bottom_up(flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    order: list[str] = []

    async def record(job: Job) -> Any:
        order.append(job.name)
        return await process(job)

    tree = await flows.add({"name": "root", "queue_name": queue_name, "children": [
        {"name": "mid", "queue_name": f"{queue_name}-m", "children": [leaf(f"{queue_name}-l", "leaf")]}]})
    async with workers(redis_url, {queue_name: record, f"{queue_name}-m": record, f"{queue_name}-l": record}):
        await wait_until(lambda: _finished(tree.job), what="the root to finish")
    assert order == ["leaf", "mid", "root"]
    mid = tree.children[0]
    assert mid.job.parent_key == f"bull:{queue_name}:{tree.job.id}"
    assert mid.children[0].job.parent_key == f"bull:{queue_name}-m:{mid.job.id}"


async def test_node_spelling_custom_ids_and_queue_defaults(flows: FlowProducer, queue_name: str, redis: Any) -> None:
    tree = await flows.add(
        {"name": "p", "queueName": queue_name, "opts": {"jobId": "root-1", "removeOnComplete": True},
         "children": [{"name": "c", "queueName": f"{queue_name}-c", "opts": {"job_id": "kid-1"}}]},
        queues_options={f"{queue_name}-c": {"default_job_options": {"attempts": 4}}})
    assert tree.job.id == "root-1" and tree.children[0].job.id == "kid-1"
    assert tree.job.opts["remove_on_complete"] is True
    kid = json.loads(await redis.hget(f"bull:{queue_name}-c:kid-1", "opts"))
    assert kid["attempts"] == 4 and kid["jobId"] == "kid-1"
    assert kid["parent"] == {"id": "root-1", "queue": f"bull:{queue_name}"}


async def test_add_bulk_adds_every_flow(flows: FlowProducer, queue_name: str) -> None:
    trees = await flows.add_bulk([
        {"name": f"p{i}", "queue_name": queue_name, "children": [leaf(f"{queue_name}-c", f"c{i}")]}
        for i in range(3)])
    assert [t.job.name for t in trees] == ["p0", "p1", "p2"]
    assert await flows.add_bulk([]) == []
    for tree in trees:
        assert await state_of(tree.job) == "waiting-children"
        assert await state_of(tree.children[0].job) == "waiting"


async def test_add_bulk_with_one_bad_flow_writes_nothing(flows: FlowProducer, queue_name: str, redis: Any) -> None:
    good = {"name": "p", "queue_name": queue_name, "children": [leaf(f"{queue_name}-c", "c")]}
    bad = {"name": "p2", "queue_name": queue_name, "children": [
        leaf(f"{queue_name}-c", "c2", children=[leaf(f"{queue_name}-d", "deep", opts={"attempts": "three"})])]}
    with pytest.raises(InvalidJobOptions) as info:
        await flows.add_bulk([good, bad])
    assert "flow[1].children[0].children[0]" in str(info.value) and "attempts" in str(info.value)
    assert await redis.keys(f"bull:{queue_name}*") == []


@pytest.mark.parametrize("spec, words", [
    ({"queue_name": "q"}, ["flow[0]", "no 'name'"]),
    ({"name": "x", "queue_name": "q", "colour": 1}, ["unknown keys", "colour"]),
    ({"name": "x", "queue_name": "a:b"}, ["cannot contain ':'"]),
    ({"name": "x", "queue_name": "q", "children": {"name": "c"}}, ["must be a list"]),
    ({"name": "x", "queue_name": "q", "opts": {"group": "g"}, "children": [{"name": "c", "queue_name": "q"}]},
     ["flow[0]", "option 'group'", "cannot be a flow parent"]),
    ({"name": "x", "queue_name": "q", "opts": {"deduplication": {"id": "d"}}, "children": [{"name": "c", "queue_name": "q"}]},
     ["deduplication cannot be used on flow nodes with children"]),
    ({"name": "x", "queue_name": "q", "children": [
        {"name": "c", "queue_name": "q", "opts": {"fail_parent_on_failure": True, "ignore_dependency_on_failure": True}}]},
     ["flow[0].children[0]", "cannot be used together"]),
])
async def test_bad_nodes_are_refused_naming_where(flows: FlowProducer, spec: dict[str, Any], words: list[str],
                                                  redis: Any) -> None:
    before = await redis.dbsize()
    with pytest.raises(InvalidArgument) as info:
        await flows.add(spec)
    for word in words:
        assert word in str(info.value)
    assert await redis.dbsize() == before


async def test_root_can_join_an_existing_parent(flows: FlowProducer, queue_name: str) -> None:
    async with Queue(f"{queue_name}-p", connection=flows.client) as parents:
        outer = await parents.add("outer", {})
        await flows.add({"name": "inner", "queue_name": queue_name,
                         "opts": {"parent": {"id": outer.id, "queue": parents.qualified_name}},
                         "children": [leaf(queue_name, "c")]})
        counts = await outer.get_dependencies_count()
    assert counts["unprocessed"] == 1


async def test_missing_parent_of_the_root_is_refused(flows: FlowProducer, queue_name: str) -> None:
    with pytest.raises(ParentJobNotFound) as info:
        await flows.add({"name": "inner", "queue_name": queue_name,
                         "opts": {"parent": {"id": "nope", "queue": f"bull:{queue_name}-p"}}})
    assert str(info.value) == f"Missing key for parent job bull:{queue_name}-p:nope. addJob"


async def test_child_that_already_completed_releases_its_new_parent(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    kids = f"{queue_name}-c"
    async with Queue(kids, connection=redis_url) as queue:
        done = await queue.add("done", {"behave": {"return": 42}}, job_id="done-1")
        async with workers(redis_url, [kids]):
            await wait_until(lambda: _finished(done), what="the child to complete")
    # the parent is released by the transaction's closing releaseParentIfNoPendingDependencies
    tree = await flows.add({"name": "p", "queue_name": queue_name,
                            "children": [{"name": "done", "queue_name": kids, "opts": {"job_id": "done-1"}}]})
    assert await state_of(tree.job) == "waiting"
    assert await tree.job.get_children_values() == {f"bull:{kids}:done-1": 42}


# -- failure policies ----------------------------------------------------------------------------
async def _run_policy(flows: FlowProducer, redis_url: str, queue_name: str, policy: str) -> Job:
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flows.add(policy_flow(parents, kids, policy))
    async with workers(redis_url, [parents, kids]):
        await wait_until(lambda: _finished(tree.job), what="the parent to finish")
    parent = await tree.job.queue.get_job("parent")
    assert parent is not None
    return parent


async def test_fail_parent_on_failure_fails_the_parent(flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parent = await _run_policy(flows, redis_url, queue_name, "failParentOnFailure")
    assert await parent.get_state() == "failed"
    assert parent.failed_reason == f"child bull:{queue_name}-c:bad failed"
    deps = await parent.get_dependencies()
    assert deps["failed"] == [f"bull:{queue_name}-c:bad"]
    assert deps["processed"] == {f"bull:{queue_name}-c:ok": {"v": 1}}


async def test_ignore_dependency_on_failure_runs_the_parent_and_keeps_the_failure(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parent = await _run_policy(flows, redis_url, queue_name, "ignore_dependency_on_failure")
    bad = f"bull:{queue_name}-c:bad"
    assert await parent.get_state() == "completed"
    assert parent.returnvalue["ignored"] == {bad: "boom"}
    assert parent.returnvalue["children"] == {f"bull:{queue_name}-c:ok": {"v": 1}}
    assert await parent.get_ignored_children_failures() == {bad: "boom"}


async def test_remove_dependency_on_failure_runs_the_parent_without_it(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parent = await _run_policy(flows, redis_url, queue_name, "removeDependencyOnFailure")
    assert await parent.get_state() == "completed"
    assert parent.returnvalue["ignored"] == {}
    assert parent.returnvalue["counts"] == {"processed": 1, "unprocessed": 0, "ignored": 0, "failed": 0}


async def test_continue_parent_on_failure_runs_the_parent_with_the_failure(
        flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parent = await _run_policy(flows, redis_url, queue_name, "continue_parent_on_failure")
    assert await parent.get_state() == "completed"
    assert await parent.get_failed_children_values() == {f"bull:{queue_name}-c:bad": "boom"}


async def test_without_a_policy_the_parent_keeps_waiting(flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    parents, kids = f"{queue_name}-p", f"{queue_name}-c"
    tree = await flows.add(policy_flow(parents, kids, None))
    bad = tree.children[1].job
    async with workers(redis_url, [parents, kids]):
        await wait_until(lambda: _finished(bad), what="the child to fail")
        await asyncio.sleep(0.2)
    assert await state_of(tree.job) == "waiting-children"
    assert (await tree.job.get_dependencies_count())["unprocessed"] == 1


# -- reading a flow back -------------------------------------------------------------------------
def shape(node: JobNode | None) -> Any:
    assert node is not None
    return [node.job.name, sorted((shape(c) for c in node.children), key=str)]


async def test_get_flow_returns_the_tree(flows: FlowProducer, queue_name: str) -> None:
    tree = await flows.add({"name": "root", "queue_name": queue_name, "children": [
        {"name": "mid", "queue_name": f"{queue_name}-m", "children": [leaf(f"{queue_name}-l", "l1")]},
        leaf(f"{queue_name}-l", "l2")]})
    got = await flows.get_flow({"id": tree.job.id, "queue_name": queue_name})
    assert shape(got) == ["root", [["l2", []], ["mid", [["l1", []]]]]]
    assert got is not None and got.job.id == tree.job.id and got.job.data == {}
    shallow = await flows.get_flow(id=tree.job.id, queueName=queue_name, depth=2)
    assert shape(shallow) == ["root", [["l2", []], ["mid", []]]]
    assert shape(await flows.get_flow(id=tree.job.id, queue_name=queue_name, depth=1)) == ["root", []]
    assert await flows.get_flow(id="nope", queue_name=queue_name) is None
    with pytest.raises(InvalidArgument):
        await flows.get_flow(id=tree.job.id, queue_name=queue_name, max_children=0)


# -- Job flow methods ----------------------------------------------------------------------------
async def test_dependencies_and_their_counts(flows: FlowProducer, redis_url: str, queue_name: str) -> None:
    kids = f"{queue_name}-c"
    tree = await flows.add({"name": "p", "queue_name": queue_name, "children": [
        {"name": "ok", "queue_name": kids, "data": {"behave": {"return": "yes"}}, "opts": {"job_id": "ok"}},
        {"name": "idle", "queue_name": f"{queue_name}-idle", "opts": {"job_id": "idle"}},
        {"name": "bad", "queue_name": kids, "data": {"behave": {"fail": "no"}},
         "opts": {"job_id": "bad", "ignore_dependency_on_failure": True}}]})
    parent = tree.job
    async with workers(redis_url, [kids]):
        await wait_until(lambda: _finished(tree.children[2].job), what="the failing child")
    ok, idle, bad = f"bull:{kids}:ok", f"bull:{queue_name}-idle:idle", f"bull:{kids}:bad"
    assert await parent.get_dependencies() == {
        "processed": {ok: "yes"}, "unprocessed": [idle], "failed": [], "ignored": {bad: "no"}}
    assert await parent.get_dependencies_count() == {"processed": 1, "unprocessed": 1, "ignored": 1, "failed": 0}
    assert await parent.get_dependencies_count(unprocessed=True) == {"unprocessed": 1}
    assert await parent.get_dependencies(processed=True, unprocessed={"cursor": 0, "count": 5}) == {
        "processed": {ok: "yes"}, "next_processed_cursor": 0,
        "unprocessed": [idle], "next_unprocessed_cursor": 0}
    assert await parent.get_dependencies(failed={"count": 3}, ignored=True) == {
        "failed": [], "next_failed_cursor": 3, "ignored": {bad: "no"}, "next_ignored_cursor": 0}
    with pytest.raises(InvalidArgument):
        await parent.get_dependencies(processed={"count": 0})


async def test_pagination_walks_a_large_dependency_set(flows: FlowProducer, queue_name: str) -> None:
    tree = await flows.add({"name": "p", "queue_name": queue_name,
                            "children": [leaf(f"{queue_name}-c", f"c{i}") for i in range(300)]})
    seen: set[str] = set()
    cursor = None
    while cursor != 0:
        page = await tree.job.get_dependencies(unprocessed={"cursor": cursor or 0, "count": 50})
        seen.update(page["unprocessed"])
        cursor = page["next_unprocessed_cursor"]
    assert seen == {f"bull:{queue_name}-c:{c.job.id}" for c in tree.children}


async def test_remove_child_dependency_releases_a_parent_left_without_children(
        flows: FlowProducer, queue_name: str, redis: Any) -> None:
    tree = await flows.add({"name": "p", "queue_name": queue_name, "children": [leaf(f"{queue_name}-c", "c")]})
    child = tree.children[0].job
    assert await child.remove_child_dependency() is True
    assert child.parent_key is None and child.parent is None
    assert await state_of(tree.job) == "waiting"
    stored = await redis.hgetall(f"bull:{queue_name}-c:{child.id}")
    assert "parentKey" not in stored and "parent" not in stored
    again = await child.queue.get_job(str(child.id))
    assert again is not None
    with pytest.raises(ParentJobNotFound):
        await again.remove_child_dependency()


async def test_remove_child_dependency_of_a_detached_job_is_false(flows: FlowProducer, queue_name: str) -> None:
    tree = await flows.add({"name": "p", "queue_name": queue_name,
                            "children": [leaf(f"{queue_name}-c", "a"), leaf(f"{queue_name}-c", "b")]})
    a = tree.children[0].job
    stale = await a.queue.get_job(str(a.id))
    assert stale is not None
    assert await a.remove_child_dependency() is True
    assert await stale.remove_child_dependency() is False  # the link no longer exists
    assert await state_of(tree.job) == "waiting-children"


async def test_remove_unprocessed_children_keeps_finished_ones(
        flows: FlowProducer, redis_url: str, queue_name: str, redis: Any) -> None:
    kids = f"{queue_name}-c"
    tree = await flows.add({"name": "p", "queue_name": queue_name, "children": [
        {"name": "done", "queue_name": kids, "opts": {"job_id": "done"}},
        {"name": "later", "queue_name": f"{queue_name}-later", "opts": {"job_id": "later"},
         "children": [leaf(f"{queue_name}-later", "grandchild")]}]})
    async with workers(redis_url, [kids]):
        await wait_until(lambda: _finished(tree.children[0].job), what="the first child")
    await tree.job.remove_unprocessed_children()
    assert await redis.exists(f"bull:{kids}:done") == 1
    assert await redis.exists(f"bull:{queue_name}-later:later") == 0
    assert await redis.exists(f"bull:{queue_name}-later:{tree.children[1].children[0].job.id}") == 0
    assert await tree.job.get_children_values() == {f"bull:{kids}:done": {"py": {}}}


async def test_processor_can_wait_for_children_it_adds(redis_url: str, queue_name: str) -> None:
    kids = f"{queue_name}-c"
    runs: list[str] = []

    async with Queue(kids, connection=redis_url) as children:
        async def parent_step(job: Job, token: str) -> Any:
            runs.append(job.data.get("step", "start"))
            if not job.data.get("step"):
                await children.add("kid", {"behave": {"return": 5}},
                                   parent={"id": str(job.id), "queue": job.queue.qualified_name})
                await job.update_data({"step": "after"})
                assert await job.move_to_waiting_children(token) is True
                raise WaitingChildrenError()
            return await job.get_children_values()

        async with Queue(queue_name, connection=redis_url) as parents:
            job = await parents.add("parent", {})
            async with workers(redis_url, {queue_name: parent_step}):
                await wait_until(lambda: _in_state(job, "waiting-children"), what="the parent to wait")
                async with workers(redis_url, [kids]):
                    await wait_until(lambda: _finished(job), what="the parent to finish")
            done = await parents.get_job(str(job.id))
    assert runs == ["start", "after"]
    assert done is not None and list(done.returnvalue.values()) == [5]


async def test_waiting_for_one_named_child(redis_url: str, queue_name: str) -> None:
    kids = f"{queue_name}-c"
    async with Queue(kids, connection=redis_url) as children, Queue(queue_name, connection=redis_url) as parents:
        parent = await parents.add("parent", {})
        await children.add("kid", {}, job_id="kid", parent={"id": str(parent.id), "queue": parents.qualified_name})
        worker = Worker(queue_name, connection=redis_url)
        try:
            token = "manual-token"
            job = await worker.get_next_job(token, block=False)
            assert job is not None and job.id == parent.id
            # Node's form: the child's queue by its qualified name, as in parent=
            assert await job.move_to_waiting_children(token, {"id": "other", "queue": children.qualified_name}) is False
            assert await job.move_to_waiting_children(token, {"id": "kid", "queue": children.qualified_name}) is True
        finally:
            await worker.close()
        assert await parent.get_state() == "waiting-children"  # while its queue is open


async def test_children_under_another_prefix(flows: FlowProducer, queue_name: str, redis: Any) -> None:
    tree = await flows.add({"name": "p", "queue_name": queue_name, "children": [
        {"name": "c", "queue_name": queue_name, "prefix": "alt", "opts": {"job_id": "c"}}]})
    assert tree.children[0].job.queue.qualified_name == f"alt:{queue_name}"
    assert await redis.smembers(f"bull:{queue_name}:{tree.job.id}:dependencies") == {f"alt:{queue_name}:c"}
    got = await flows.get_flow(id=tree.job.id, queue_name=queue_name)
    assert got is not None and [c.job.queue.qualified_name for c in got.children] == [f"alt:{queue_name}"]


async def test_closed_producer_refuses_to_add(redis_url: str, queue_name: str) -> None:
    producer = FlowProducer(redis_url)
    await producer.close()
    with pytest.raises(Exception, match="closed"):
        await producer.add(leaf(queue_name, "x"))


async def test_add_loads_scripts_redis_has_forgotten(flows: FlowProducer, queue_name: str, redis: Any) -> None:
    await redis.script_flush()  # a NOSCRIPT inside the transaction would drop just that node
    tree = await flows.add({"name": "p", "queue_name": queue_name, "children": [leaf(f"{queue_name}-c", "c")]})
    assert await state_of(tree.job) == "waiting-children"
    assert await state_of(tree.children[0].job) == "waiting"
