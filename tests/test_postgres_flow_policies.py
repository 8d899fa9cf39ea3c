"""The four child-failure policies of a flow on PostgreSQL, run by Python workers: what the parent
ends as, and what it reads of its children (keys are ``<queue>:<id>`` there, no prefix)."""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import AsyncIterator

import pytest

from bullmq_compat import FlowProducer, Job, Worker
from tests.flow_helpers import policy_flow, process


@contextlib.asynccontextmanager
async def pg_workers(url: str, schema: str, queues: list[str]) -> AsyncIterator[None]:
    running = [Worker(name, process, connection=url, schema=schema, drain_delay=0.5) for name in queues]
    tasks = [asyncio.ensure_future(w.run(handle_signals=False)) for w in running]
    try:
        yield
    finally:
        for worker in running:
            await worker.close()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
async def flows(postgres_url: str, pg_migrated: str) -> AsyncIterator[FlowProducer]:
    async with FlowProducer(connection=postgres_url, schema=pg_migrated) as producer:
        yield producer


async def run_policy(flows: FlowProducer, url: str, schema: str, policy: str | None) -> tuple[Job, str, str]:
    """The policy flow run to the parent's end (or, with no policy, to the bad child's failure);
    returns the parent as stored then, and the bad and the good child's keys."""
    base = f"fp{uuid.uuid4().hex[:8]}"
    parents, kids = f"{base}-p", f"{base}-c"
    tree = await flows.add(policy_flow(parents, kids, policy))
    watched = tree.job if policy else tree.children[1].job
    async with pg_workers(url, schema, [parents, kids]):
        deadline = time.monotonic() + 30
        while await watched.get_state() not in ("completed", "failed"):
            assert time.monotonic() < deadline, f"{policy}: {watched.id} did not finish"
            await asyncio.sleep(0.05)
        if policy is None:
            await asyncio.sleep(0.5)  # a parent that would (wrongly) be released has time to run
    parent = await tree.job.queue.get_job("parent")
    assert parent is not None
    return parent, f"{kids}:bad", f"{kids}:ok"


async def test_fail_parent_on_failure_fails_the_parent(flows: FlowProducer, postgres_url: str,
                                                       pg_migrated: str) -> None:
    parent, bad, ok = await run_policy(flows, postgres_url, pg_migrated, "failParentOnFailure")
    assert await parent.get_state() == "failed"
    assert bad in (parent.failed_reason or "")
    deps = await parent.get_dependencies()
    assert deps["failed"] == [bad] and deps["processed"] == {ok: {"v": 1}}


async def test_ignore_dependency_on_failure_runs_the_parent_and_keeps_the_failure(
        flows: FlowProducer, postgres_url: str, pg_migrated: str) -> None:
    parent, bad, ok = await run_policy(flows, postgres_url, pg_migrated, "ignore_dependency_on_failure")
    assert await parent.get_state() == "completed"
    assert parent.returnvalue["children"] == {ok: {"v": 1}}
    assert parent.returnvalue["ignored"] == {bad: "boom"}
    assert await parent.get_ignored_children_failures() == {bad: "boom"}


async def test_remove_dependency_on_failure_runs_the_parent_without_it(flows: FlowProducer, postgres_url: str,
                                                                       pg_migrated: str) -> None:
    parent, _bad, ok = await run_policy(flows, postgres_url, pg_migrated, "removeDependencyOnFailure")
    assert await parent.get_state() == "completed"
    assert parent.returnvalue["children"] == {ok: {"v": 1}}
    assert parent.returnvalue["ignored"] == {}


async def test_continue_parent_on_failure_runs_the_parent_with_the_failure(
        flows: FlowProducer, postgres_url: str, pg_migrated: str) -> None:
    parent, bad, _ok = await run_policy(flows, postgres_url, pg_migrated, "continue_parent_on_failure")
    assert await parent.get_state() == "completed"
    assert await parent.get_failed_children_values() == {bad: "boom"}


async def test_without_a_policy_the_parent_keeps_waiting(flows: FlowProducer, postgres_url: str,
                                                         pg_migrated: str) -> None:
    parent, _bad, _ok = await run_policy(flows, postgres_url, pg_migrated, None)
    assert await parent.get_state() == "waiting-children"
