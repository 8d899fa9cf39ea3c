"""Priority within a group (issue #28 section 3; BullMQ Pro's ``group.priority``) on PostgreSQL:
our version-3 objects (groups_sql/0003_group_priority.sql) order a group's held jobs by (group
priority > 0, group priority, order, seq) in every reader of the gate's order, so the release
inside upstream's finish -- whoever calls it, a Python or a Node worker -- picks the group's next
job by it. Python workers here; Node workers and a plain Node producer at the end (marked node).

Runs are recorded in the test schema's tables with the database's clock
(tests/pg_group_interop_helpers.py); order is checked by the order of the recorded starts
(run_id), one job of a group at a time: never by wall-clock bounds.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from bullmq_compat import GroupsNotInstalled, InvalidArgument, InvalidJobOptions, Queue, migrate_postgres
from tests.node import node
from tests.pg_group_interop_helpers import (
    connect,
    create_recorder,
    finished_count,
    node_group_workers,
    python_workers,
    read_runs,
    sql,
)
from tests.pg_interop_helpers import eventually, pg_of, py_queue
from tests.test_group_priority import EXPECTED, MIX, group_opt


async def setup(url: str, schema: str) -> dict[str, Any]:
    await migrate_postgres(url, schema, groups=True)
    await create_recorder(url, schema)
    return pg_of(url, schema, migrate=False)


async def held(queue: Queue, gid: str) -> list[str]:
    return [str(job.id) for job in await queue.get_group_jobs(gid)]


async def add_mix(queue: Queue, gid: str) -> dict[str, str]:
    ids = {}
    for s, (label, priority) in enumerate(MIX):
        job = await queue.add("p", {"s": s, "label": label}, group=group_opt(gid, priority))
        ids[label] = str(job.id)
    return ids


async def wait_finished(url: str, schema: str, queue: str, count: int, timeout: float = 90) -> None:
    async def done() -> bool:
        return await finished_count(url, schema, queue) >= count

    await eventually(done, timeout=timeout, interval=0.1, what=f"{count} finished runs")


def order_of(starts: list[dict[str, Any]], gid: str) -> list[str]:
    return [str(r["id"]) for r in starts if r["g"] == gid]


def one_at_a_time(ends: list[dict[str, Any]], starts: list[dict[str, Any]], counts: dict[str, int]) -> None:
    assert len(starts) == len(ends) == sum(counts.values()), (starts, ends)
    for g, n in counts.items():
        runs = sorted((r["t0"], r["t1"]) for r in ends if r["g"] == g)
        assert len(runs) == n
        assert all(b0 >= a1 for (_, a1), (b0, _) in zip(runs, runs[1:])), (g, runs)
    assert all(r["n"] == 1 for r in ends), ends


async def test_held_jobs_run_in_group_priority_order_under_python_workers(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    await setup(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        await queue.pause_group("G")
        ids = await add_mix(queue, "G")
        bulk = await queue.add_bulk([{"name": "b", "data": {"s": s, "label": label},
                                      "opts": {"group": group_opt("B", priority)}}
                                     for s, (label, priority) in enumerate(MIX)])
        bulk_ids = {job.data["label"]: str(job.id) for job in bulk}
        plain = [str((await queue.add("h", {"s": s}, group="H")).id) for s in range(3)]
        assert await held(queue, "G") == [ids[label] for label in EXPECTED]
        # B was not paused: its first job (priority 5) went at once, the rest by priority
        assert await held(queue, "B") == [bulk_ids[label] for label in EXPECTED if label != "a"]
        assert await queue.get_counts_per_priority_for_group("G", [0, 1, 5, 3]) == {0: 3, 1: 2, 5: 2, 3: 0}
        stored = await queue.get_job(ids["a"])
        assert stored is not None and stored.opts["group"] == {"id": "G", "priority": 5}
        [(opts,)] = await sql(postgres_url, pg_schema, "SELECT opts FROM job WHERE queue = %(q)s AND id = %(id)s",
                              {"q": queue_name, "id": ids["a"]})
        assert opts["group"] == {"id": "G", "priority": 5}
        async with python_workers(postgres_url, pg_schema, queue_name, 2, concurrency=4, group_keeper=False):
            await queue.resume_group("G")
            await wait_finished(postgres_url, pg_schema, queue_name, 2 * len(MIX) + 3)
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        assert order_of(starts, "G") == [ids[label] for label in EXPECTED]
        assert order_of(starts, "B") == [bulk_ids["a"]] + [bulk_ids[label] for label in EXPECTED if label != "a"]
        assert order_of(starts, "H") == plain
        one_at_a_time(ends, starts, {"G": len(MIX), "B": len(MIX), "H": 3})
        assert await queue.get_groups() == []


async def test_validation_order_ms_and_the_jobs_own_priority(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    await setup(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        for bad in (True, 1.5, -1, 2097152):
            with pytest.raises(InvalidJobOptions, match=f"priority={bad!r} must be an int from 0 to 2097151"):
                await queue.add("p", {}, group={"id": "G", "priority": bad})
        with pytest.raises(InvalidJobOptions, match="order_ms orders a group's unprioritised jobs"):
            await queue.add("p", {}, group={"id": "G", "priority": 2}, order_ms=5)
        assert await sql(postgres_url, pg_schema, "SELECT count(*) FROM job") == [(0,)]
        await queue.pause_group("G")
        own = await queue.add("p", {}, group={"id": "G", "priority": 4}, priority=9)
        early = await queue.add("p", {}, group="G", order_ms=5)
        plain = await queue.add("p", {}, group="G")
        late = await queue.add("p", {}, group={"id": "G", "priority": 0}, order_ms=2 ** 42 - 1)
        assert await held(queue, "G") == [str(early.id), str(plain.id), str(late.id), str(own.id)]
        fetched = await queue.get_job(str(own.id))
        assert fetched is not None and fetched.priority == 9 and fetched.opts["group"]["priority"] == 4
        await queue.resume_group("G")  # the head goes; then each removal of the head releases the next
        for job in (early, plain, late):
            assert await queue.get_job_state(str(job.id)) == "waiting"
            await job.remove()
        # released, by its own priority (9) into upstream's prioritized order
        assert await queue.get_job_state(str(own.id)) == "prioritized"


async def test_change_priority_moves_a_held_job_and_a_released_one_changes_its_own(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    await setup(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        await queue.pause_group("G")
        ids = await add_mix(queue, "G")
        a = await queue.get_job(ids["a"])
        assert a is not None
        await a.change_priority(1)
        assert a.opts["group"]["priority"] == 1 and a.priority == 0
        order = ["b", "e", "h", "a", "c", "g", "f", "d", "i"]
        assert await held(queue, "G") == [ids[label] for label in order]
        i = await queue.get_job(ids["i"])
        assert i is not None
        await i.change_priority(0)
        order = ["b", "e", "h", "i", "a", "c", "g", "f", "d"]
        assert await held(queue, "G") == [ids[label] for label in order]
        assert await queue.get_counts_per_priority_for_group("G", [0, 1, 2097151]) == {0: 4, 1: 3, 2097151: 0}
        with pytest.raises(InvalidArgument, match="lifo"):
            await i.change_priority(3, lifo=True)
        timed = await queue.add("p", {"s": 99}, group="G", order_ms=10 ** 12)
        with pytest.raises(InvalidArgument, match="order_ms"):
            await timed.change_priority(2)
        await timed.remove()
        released = await queue.add("r", {"s": 0}, group="R")
        assert await queue.get_job_state(str(released.id)) == "waiting"
        await released.change_priority(4)
        assert await queue.get_job_state(str(released.id)) == "prioritized"
        again = await queue.get_job(str(released.id))
        assert again is not None and again.priority == 4 and again.opts["group"] == {"id": "R"}
        await released.remove()
        async with python_workers(postgres_url, pg_schema, queue_name, 1, concurrency=4, group_keeper=False):
            await queue.resume_group("G")
            await wait_finished(postgres_url, pg_schema, queue_name, len(MIX))
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        assert order_of(starts, "G") == [ids[label] for label in order]
        one_at_a_time(ends, starts, {"G": len(MIX)})


async def test_a_version_2_schema_asks_for_the_upgrade_and_the_upgrade_orders_held_jobs_by_priority(
        postgres_url: str, pg_schema: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 2 (before group priorities): a prioritised add asks for the upgrade and writes
    nothing; jobs a producer stored with opts.group.priority before the upgrade take their place by
    it once migrate_postgres(groups=True) has upgraded the schema (the held index is rebuilt)."""
    from bullmq_compat._backends.postgres import groups as pg_groups

    everything = pg_groups.group_migrations()
    with monkeypatch.context() as patch:
        patch.setattr(pg_groups, "group_migrations", lambda: [m for m in everything if m.version <= 2])
        await migrate_postgres(postgres_url, pg_schema, groups=True)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        await queue.pause_group("G")
        with pytest.raises(GroupsNotInstalled, match="a group priority needs a newer version"):
            await queue.add("p", {}, group={"id": "G", "priority": 2})
        with pytest.raises(GroupsNotInstalled, match="a group priority needs a newer version"):
            await queue.get_counts_per_priority_for_group("G", [0])
        first = await queue.add("p", {}, group="G")
        second = await queue.add("p", {}, group="G")
        # as a producer that knows nothing of versions (Node's queue.add) stores it
        await sql(postgres_url, pg_schema, "UPDATE job SET opts = jsonb_set(opts, '{group,priority}', '3') "
                                           "WHERE queue = %(q)s AND id = %(id)s", {"q": queue_name, "id": str(first.id)})
        assert await held(queue, "G") == [str(first.id), str(second.id)]  # version 2: by add time
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    [(version,)] = await sql(postgres_url, pg_schema, "SELECT max(version) FROM bullmq_compat_migration")
    assert version == pg_groups.latest_groups_version() >= 3
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        assert await held(queue, "G") == [str(second.id), str(first.id)]
        # the held index itself holds the new order (read through it alone: no scan of the table)
        conn = await connect(postgres_url, pg_schema)
        try:
            await conn.execute("SET enable_seqscan = off")
            await conn.execute("SET enable_bitmapscan = off")
            await conn.execute("SET enable_sort = off")
            query = ("SELECT id FROM job WHERE queue = %(q)s AND opts ? 'group' AND bullmq_compat_gid(opts) = 'G' "
                     "AND state = 'waiting-children' AND pending_deps = 0 "
                     "ORDER BY bullmq_compat_group_order(opts, added_at_ms), abs(seq)")
            plan = await (await conn.execute("EXPLAIN (FORMAT JSON) " + query, {"q": queue_name})).fetchall()
            assert "bullmq_compat_group_held_idx" in json.dumps(plan)
            rows = await (await conn.execute(query, {"q": queue_name})).fetchall()
            assert [row[0] for row in rows] == [str(second.id), str(first.id)]
        finally:
            await conn.close()
        assert await queue.get_counts_per_priority_for_group("G", [0, 3]) == {0: 1, 3: 1}


# -- Node workers and a plain Node producer ----------------------------------------------------------

@pytest.mark.node
async def test_node_workers_release_in_group_priority_order_and_a_plain_node_producer_gets_it(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """A plain Node producer (Node's queue.add, no bullmq-compat code) adds {group: {id, priority}};
    Python adds beside it; Node workers alone (no Python worker, no keeper) run every group in group
    priority order, one job at a time: our trigger releases inside Node's finish."""
    pg = await setup(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        for gid in ("G", "N"):
            await queue.pause_group(gid)
        py_ids = await add_mix(queue, "G")
        node_ids = {}
        for s, (label, priority) in enumerate(MIX):
            added = await node("add", **pg, queue=queue_name, name="n", data={"s": s, "label": label},
                               opts={"group": group_opt("N", priority)})
            assert added["row"]["state"] == "waiting-children"
            node_ids[label] = str(added["row"]["id"])
        assert await held(queue, "N") == [node_ids[label] for label in EXPECTED]
        assert await queue.get_counts_per_priority_for_group("N", [0, 1, 5]) == {0: 3, 1: 2, 5: 2}
        async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4, name="node-a"), \
                node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4, name="node-b"):
            for gid in ("G", "N"):
                await queue.resume_group(gid)
            await wait_finished(postgres_url, pg_schema, queue_name, 2 * len(MIX))
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        assert {e["w"] for e in ends} == {"node"}
        assert order_of(starts, "G") == [py_ids[label] for label in EXPECTED]
        assert order_of(starts, "N") == [node_ids[label] for label in EXPECTED]
        one_at_a_time(ends, starts, {"G": len(MIX), "N": len(MIX)})


@pytest.mark.node
async def test_node_and_python_workers_at_once_keep_group_priority_order(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    await setup(postgres_url, pg_schema)
    groups = [f"P{g}" for g in range(4)]
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        ids = {}
        for gid in groups:
            await queue.pause_group(gid)
            ids[gid] = await add_mix(queue, gid)
        async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4), \
                python_workers(postgres_url, pg_schema, queue_name, 1, concurrency=4, group_keeper=False):
            for gid in groups:
                await queue.resume_group(gid)
            await wait_finished(postgres_url, pg_schema, queue_name, len(groups) * len(MIX))
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        for gid in groups:
            assert order_of(starts, gid) == [ids[gid][label] for label in EXPECTED], gid
        one_at_a_time(ends, starts, {gid: len(MIX) for gid in groups})


async def test_a_retried_prioritised_job_goes_back_to_its_priority_place(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """upstream's reprocess_job (Python's job.retry(); Node's is the same SQL) into a paused group:
    our BEFORE UPDATE trigger holds the job, in its place by its group priority."""
    await setup(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        failing = await queue.add("p", {"s": 0, "fail": "on purpose"}, group={"id": "G", "priority": 3})
        async with python_workers(postgres_url, pg_schema, queue_name, 1, concurrency=2, group_keeper=False):
            await wait_finished(postgres_url, pg_schema, queue_name, 1)

            async def failed() -> bool:
                return await queue.get_job_state(str(failing.id)) == "failed"

            await eventually(failed, timeout=30, interval=0.05, what="the job to fail")
        await queue.pause_group("G")
        same = await queue.add("p", {"s": 1}, group={"id": "G", "priority": 3})
        zero = await queue.add("p", {"s": 2}, group="G")
        low = await queue.add("p", {"s": 3}, group={"id": "G", "priority": 8})
        job = await queue.get_job(str(failing.id))
        assert job is not None
        await job.retry()
        assert await queue.get_job_state(str(failing.id)) == "waiting-children"
        assert await held(queue, "G") == [str(zero.id), str(failing.id), str(same.id), str(low.id)]


async def test_under_an_ordering_delay_a_prioritised_job_is_due_at_once(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    await setup(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        await queue.set_group_options("V", ordering_delay_ms=60_000)
        first = await queue.add("p", {}, group={"id": "V", "priority": 2})
        assert await queue.get_job_state(str(first.id)) == "waiting"
        behind = await queue.add("p", {}, group={"id": "V", "priority": 1})
        assert await queue.get_job_state(str(behind.id)) == "waiting-children"
        await first.remove()  # its slot frees: the next is released, due at once too
        assert await queue.get_job_state(str(behind.id)) == "waiting"
