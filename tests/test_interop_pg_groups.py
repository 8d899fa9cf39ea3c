"""Per-group FIFO on PostgreSQL under unmodified Node BullMQ 6.7 (createPostgresBackend).

Our gate is a set of triggers on upstream's `job` table (groups_sql/0001_group_gate.sql): a group
job with no free slot is held in `waiting-children`, and the next one is released in the very
transaction in which upstream's SQL finishes one, whoever calls it. So Node workers alone keep the
groups (no keeper, no Python worker), a plain Node producer's `{group: {id}}` is gated, Node's
job.retry() / queue.retryJobs() / Bull-Board's Retry into a busy group wait their turn, and Node's
getters, QueueEvents and Bull-Board read held jobs as `waiting-children`. Node's migrator and its
ledger are untouched by our install and our drop.

Node workers run interop/pg_groups.js (a recording handler); Python Workers record the same way
(tests/pg_group_interop_helpers.py), both with the database's clock, so one checker
(tests/group_helpers.check_groups) covers either kind and both at once.
"""
from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections import defaultdict
from typing import Any

import pytest

from bullmq_compat import Job, drop_postgres_groups, migrate_postgres
from tests._postgres_server import free_port
from tests.group_helpers import add_in_batches, check_groups, counts_by_group, group_jobs
from tests.node import NodeProcess, node
from tests.pg_group_interop_helpers import (
    create_recorder,
    finished_count,
    node_group_workers,
    pg_groups_js,
    python_workers,
    read_runs,
    runs,
    send_signal,
    sql,
)
from tests.pg_interop_helpers import events_js, eventually, node_job, node_work, pg_of, py_queue, py_worker
from tests.pg_node_helpers import drop_schema, new_schema_name

pytestmark = pytest.mark.node


async def setup_schema(url: str, schema: str) -> dict[str, Any]:
    """Node's tables (our migrator), our gate, the recorder's tables; the Node args for the schema
    (read-only check: Node must find it ready)."""
    assert await migrate_postgres(url, schema, groups=True) == 11
    await create_recorder(url, schema)
    return pg_of(url, schema, migrate=False)


async def wait_finished(url: str, schema: str, queue: str, count: int, timeout: float = 90) -> None:
    async def progress() -> bool:
        return await finished_count(url, schema, queue) >= count

    try:
        await eventually(progress, timeout=timeout, interval=0.1, what=f"{count} finished runs")
    except AssertionError as exc:
        done = await finished_count(url, schema, queue)
        states = await sql(url, schema, "SELECT state::text, count(*) FROM job WHERE queue = %(q)s GROUP BY 1",
                           {"q": queue})
        raise AssertionError(f"{exc}: {done} finished; job states {states}") from None


async def node_counts(pg: dict[str, Any], queue: str, *types: str) -> dict[str, int]:
    return await node("getJobCounts", **pg, queue=queue, types=list(types))


async def node_state(pg: dict[str, Any], queue: str, job_id: str) -> str:
    return await node("getState", **pg, queue=queue, id=job_id)


def no_overlap(runs_of_group: list[dict[str, Any]]) -> None:
    ordered = sorted((r["t0"], r["t1"]) for r in runs_of_group)
    assert all(b0 >= a1 for (_, a1), (b0, _) in zip(ordered, ordered[1:])), f"runs overlapped: {ordered}"
    assert all(r["n"] == 1 for r in runs_of_group), f"two of the group's jobs ran at once: {runs_of_group}"


COUNT_TYPES = ("completed", "failed", "waiting", "active", "delayed", "waiting-children")


# -- 1. Node workers alone keep the groups; and Node + Python workers at once ------------------------

async def test_node_workers_alone_run_each_group_one_at_a_time_in_add_order(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """256 jobs over 32 groups added from Python, run by two Node processes (one Worker of
    concurrency 4 each) and nothing else: no keeper, no Python worker. The database releases each
    group's next job as Node finishes one."""
    pg = await setup_schema(postgres_url, pg_schema)
    items = group_jobs(32, 8)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4, name="node-a"), \
                node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4, name="node-b"):
            await add_in_batches(queue, items)
            await wait_finished(postgres_url, pg_schema, queue_name, len(items))
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        check_groups(ends, starts, counts_by_group(items))
        assert {e["w"] for e in ends} == {"node"}
        assert {e["name"] for e in ends} == {"node-a", "node-b"}
        assert await node_counts(pg, queue_name, *COUNT_TYPES) == {
            "completed": 256, "failed": 0, "waiting": 0, "active": 0, "delayed": 0, "waiting-children": 0}
        assert await queue.get_groups() == []


async def test_node_and_python_workers_at_once_keep_groups_fifo(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """The same 256 jobs with two Node processes and two Python Workers (concurrency 4 each) taking
    jobs of the same groups: a job finished by one kind releases the next for either kind."""
    pg = await setup_schema(postgres_url, pg_schema)
    items = group_jobs(32, 8, seed=11)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4, name="node-a"), \
                node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4, name="node-b"), \
                python_workers(postgres_url, pg_schema, queue_name, 2, concurrency=4):
            await add_in_batches(queue, items)
            await wait_finished(postgres_url, pg_schema, queue_name, len(items))
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        check_groups(ends, starts, counts_by_group(items))
        by_kind = {w: sum(1 for e in ends if e["w"] == w) for w in ("py", "node")}
        mixed = sum(1 for g in counts_by_group(items) if {e["w"] for e in ends if e["g"] == g} == {"py", "node"})
        print(f"256 jobs / 32 groups, 2 Node + 2 Python workers x 4: runs {by_kind}; {mixed} groups ran on both")
        assert by_kind["py"] > 0 and by_kind["node"] > 0
        assert mixed > 0
        assert await node_counts(pg, queue_name, "completed", "waiting-children", "waiting", "active") == {
            "completed": 256, "waiting-children": 0, "waiting": 0, "active": 0}
        assert await queue.get_groups() == []


# -- 2. a plain Node producer's group jobs are gated ------------------------------------------------

async def test_a_plain_node_producers_group_jobs_are_gated(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """Node's queue.addBulk / queue.add with `{group: {id}}` (no bullmq-compat code in Node): each
    group's first job goes to wait, the rest are held; a Python Worker and a Node Worker then run
    every group in add order, one job at a time. `orderMs` in Node's group object orders the held
    jobs of group O by it, not by add time."""
    pg = await setup_schema(postgres_url, pg_schema)
    groups = [f"n{g}" for g in range(6)]
    items = [{"name": "n", "data": {"s": s, "sleepMs": 3}, "opts": {"group": {"id": g}}}
             for s in range(5) for g in groups]  # interleaved: n0 s0, n1 s0, ..., n5 s4
    bulk = await node("addBulk", **pg, queue=queue_name, jobs=items[:15])
    singles = [await node("add", **pg, queue=queue_name, **item) for item in items[15:]]
    states = [row["state"] for row in bulk["rows"]] + [one["row"]["state"] for one in singles]
    assert states == ["waiting"] * 6 + ["waiting-children"] * 24
    assert all(row["opts"]["group"] == {"id": g} for row, g in zip(bulk["rows"], groups))
    # group O: orderMs 100 first (released at once), then held 300, 200, 250: run order 100, 200, 250, 300
    o_jobs = [await node("add", **pg, queue=queue_name, name="o", data={"s": s},
                         opts={"group": {"id": "O", "orderMs": order}})
              for s, order in ((0, 100), (3, 300), (1, 200), (2, 250))]
    assert [j["row"]["state"] for j in o_jobs] == ["waiting"] + ["waiting-children"] * 3
    assert await node_counts(pg, queue_name, "waiting", "waiting-children") == {"waiting": 7, "waiting-children": 27}

    async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=3), \
            python_workers(postgres_url, pg_schema, queue_name, 1, concurrency=3):
        await wait_finished(postgres_url, pg_schema, queue_name, 34)
    ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
    check_groups(ends, starts, {**{g: 5 for g in groups}, "O": 4})
    assert await node_counts(pg, queue_name, "completed", "waiting-children") == {"completed": 34,
                                                                                  "waiting-children": 0}


# -- 3. a group paused from Python holds under Node workers ------------------------------------------

async def test_a_group_paused_from_python_holds_under_node_workers(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """Z is paused before its jobs are added: none of them starts. P is paused while its first job
    runs on a Node worker: when Node finishes it, nothing of P is released. Q runs meanwhile.
    resume_group releases each paused group, and Node runs it to the end in order."""
    pg = await setup_schema(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        await queue.pause_group("Z")
        # each group's jobs in one add_bulk: one add time, so their order is their seq (a tie the
        # release on resume must keep)
        z = await queue.add_bulk([{"name": "z", "data": {"s": s}, "opts": {"group": "Z"}} for s in range(3)])
        p = await queue.add_bulk([{"name": "p", "data": {"s": s, **({"holdUntil": "p0"} if s == 0 else {})},
                                   "opts": {"group": "P"}} for s in range(4)])
        q = [await queue.add("q", {"s": s, "sleepMs": 5}, group="Q") for s in range(3)]
        assert [await node_state(pg, queue_name, j.id) for j in z] == ["waiting-children"] * 3
        async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4):
            async def p0_runs() -> bool:
                return any(r["g"] == "P" for r in await runs(postgres_url, pg_schema, queue_name))

            await eventually(p0_runs, timeout=60, what="P's first job to start on Node")
            await queue.pause_group("P")
            await send_signal(postgres_url, pg_schema, queue_name, "p0")
            await wait_finished(postgres_url, pg_schema, queue_name, 4)  # P's s0 and Q's three

            async def finished_on_node() -> bool:  # (the handler records its end before Node's finish)
                return await node_counts(pg, queue_name, "completed") == {"completed": 4}

            await eventually(finished_on_node, timeout=60, what="Node to complete P's s0 and Q's jobs")
            await asyncio.sleep(1.5)  # Node workers are idle now: nothing of P or Z may start
            ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
            assert sorted((r["g"], r["s"]) for r in starts) == [("P", 0), ("Q", 0), ("Q", 1), ("Q", 2)]
            assert await node_counts(pg, queue_name, "waiting", "active", "waiting-children", "completed") == {
                "waiting": 0, "active": 0, "waiting-children": 6, "completed": 4}
            assert [await node_state(pg, queue_name, j.id) for j in p[1:]] == ["waiting-children"] * 3
            assert await queue.get_groups("paused") == [
                {"id": "P", "waiting": 3, "running": 0, "paused": True, "concurrency": 1},
                {"id": "Z", "waiting": 3, "running": 0, "paused": True, "concurrency": 1}]

            await queue.resume_group("P")
            await wait_finished(postgres_url, pg_schema, queue_name, 7)
            assert [await node_state(pg, queue_name, j.id) for j in z] == ["waiting-children"] * 3
            await queue.resume_group("Z")
            await wait_finished(postgres_url, pg_schema, queue_name, 10)
        ends, starts = await read_runs(postgres_url, pg_schema, queue_name)
        check_groups(ends, starts, {"P": 4, "Q": 3, "Z": 3})
        assert {e["w"] for e in ends} == {"node"}
        assert [await node_state(pg, queue_name, j.id) for j in (*z, *p, *q)] == ["completed"] * 10
        assert await queue.get_groups() == []


# -- 4. Node's job.retry() and queue.retryJobs() into a busy group -----------------------------------

async def test_node_retry_of_a_failed_group_job_waits_for_the_running_one(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """R0 and T0 fail for good on a Node worker; R1 and T1 then run (held open by the test). Node's
    job.retry() on R0 and queue.retryJobs({state: 'failed'}) on T0 move them back through upstream's
    reprocess_job / retry_jobs: our trigger holds them (waiting-children) beside the running job.
    Once R1 / T1 end, the retried job runs (before R2 / T2: its add order), never beside another."""
    pg = await setup_schema(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        jobs: dict[str, list[Job]] = {}
        for g in ("R", "T"):
            jobs[g] = [await queue.add(g, {"s": 0, "failUnless": "fixed"}, group=g),
                       await queue.add(g, {"s": 1, "holdUntil": f"{g}1"}, group=g),
                       await queue.add(g, {"s": 2}, group=g)]
        r, t = jobs["R"], jobs["T"]
        async with node_group_workers(postgres_url, pg_schema, queue_name, concurrency=4):
            async def second_ones_run() -> bool:
                started = {(x["g"], x["s"]) for x in await runs(postgres_url, pg_schema, queue_name)}
                return {("R", 1), ("T", 1)} <= started

            await eventually(second_ones_run, timeout=60, what="R1 and T1 to start")
            assert [await node_state(pg, queue_name, j.id) for j in (r[0], t[0])] == ["failed"] * 2
            await send_signal(postgres_url, pg_schema, queue_name, "fixed")  # the retried runs succeed

            retried = await pg_groups_js("retry", postgres_url, pg_schema, queue_name, id=r[0].id)
            assert retried == {"state": "waiting-children"}
            after = await pg_groups_js("retryJobs", postgres_url, pg_schema, queue_name, state="failed")
            assert after["counts"]["failed"] == 0 and after["counts"]["active"] == 2
            assert after["counts"]["waiting-children"] == 4 and after["counts"]["waiting"] == 0
            states = await pg_groups_js("jobStates", postgres_url, pg_schema, queue_name,
                                        ids=[r[0].id, r[1].id, r[2].id, t[0].id, t[1].id, t[2].id])
            assert states == {"states": ["waiting-children", "active", "waiting-children"] * 2}
            held = [j.id for j in await queue.get_group_jobs("R")]
            assert held == [r[0].id, r[2].id]  # the retried job goes first: its place by add order
            await asyncio.sleep(1.0)  # a retry that slipped past the gate would have started by now
            started = [(x["g"], x["s"]) for x in await runs(postgres_url, pg_schema, queue_name)]
            assert sorted(started) == [("R", 0), ("R", 1), ("T", 0), ("T", 1)]

            await send_signal(postgres_url, pg_schema, queue_name, "R1")
            await send_signal(postgres_url, pg_schema, queue_name, "T1")
            await wait_finished(postgres_url, pg_schema, queue_name, 8)
        every = await runs(postgres_url, pg_schema, queue_name)
        for g in ("R", "T"):
            mine = [x for x in every if x["g"] == g]
            assert [x["s"] for x in mine] == [0, 1, 0, 2], f"group {g} ran {[x['s'] for x in mine]}"
            no_overlap(mine)
        assert [await node_state(pg, queue_name, j.id) for j in (*r, *t)] == ["completed"] * 6
        retried_job = await node_job(pg, queue_name, r[0].id)
        assert retried_job["returnvalue"] == {"g": "R", "s": 0} and retried_job["attemptsStarted"] == 2
        assert await queue.get_groups() == []


# -- 5. Node's migrator beside our install and after our drop ----------------------------------------

OBJECTS_OF_OURS = """
SELECT 'rel ' || c.relname FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace AND c.relname LIKE 'bullmq\\_compat%%'
UNION ALL SELECT 'proc ' || p.proname FROM pg_proc p WHERE p.pronamespace = %(s)s::regnamespace
                                                       AND p.proname LIKE 'bullmq\\_compat%%'
UNION ALL SELECT 'type ' || t.typname FROM pg_type t WHERE t.typnamespace = %(s)s::regnamespace
                                                       AND t.typname LIKE 'bullmq\\_compat%%'
UNION ALL SELECT 'trigger ' || tg.tgname FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
           WHERE c.relnamespace = %(s)s::regnamespace AND tg.tgname LIKE 'bullmq\\_compat%%'
ORDER BY 1"""

LEDGER = "SELECT version, name, min_client_version, applied_at FROM migration ORDER BY version"


async def plain_node_run(pg: dict[str, Any], url: str, schema: str, queue: str) -> dict[str, Any]:
    """Ungrouped jobs added and processed by Node: what is stored and published, without the
    fields that depend on the clock."""
    volatile = {"added_at_ms", "process_at_ms", "processed_at_ms", "finished_at_ms", "locked_until_ms",
                "lock_token", "processed_by", "seq", "timestamp"}
    bulk = await node("addBulk", **pg, queue=queue, jobs=[
        {"name": "plain", "data": {"k": 1}},
        {"name": "prio", "data": {"k": 2}, "opts": {"priority": 3}},
        {"name": "custom", "data": {"k": 3}, "opts": {"jobId": "c-1"}},
        {"name": "later", "data": {"k": 4}, "opts": {"delay": 300}},
        {"name": "lifo", "data": {"k": 5}, "opts": {"lifo": True}},
    ])
    added = [{k: v for k, v in row.items() if k not in volatile} for row in bulk["rows"]]
    async with node_work(pg, queue, 5, timeout_ms=60000, concurrency=1) as worker:
        outcome = await worker.result()
    assert outcome["failed"] == [] and not outcome["timedOut"], outcome
    rows = await sql(url, schema, "SELECT event, data FROM event WHERE queue = %(q)s ORDER BY id", {"q": queue})
    events: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)  # per job: its own order is fixed
    for name, data in rows:
        if data.get("jobId") is not None:  # (not 'drained' and the like: how often depends on timing)
            events[str(data["jobId"])].append((name, {k: v for k, v in data.items() if k != "delay"}))
    states = await sql(url, schema, "SELECT id, state::text, attempts_made FROM job WHERE queue = %(q)s ORDER BY id",
                       {"q": queue})
    return {"added": added, "completed": sorted(outcome["completed"]), "events": dict(events), "states": states}


async def test_node_migrator_and_ledger_beside_our_install_and_after_our_drop(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """Node's runMigrations makes the schema; our install adds its objects and its own ledger, and
    Node's `migration` rows stay exactly as they were. Node's migrate: true is a no-op and its
    read-only check (migrate false) passes, both with our objects and after drop_postgres_groups;
    a Node queue without groups stores, publishes and runs exactly what it does in a twin schema
    that never had our objects. After the drop no bullmq_compat_* object is left, and a Node
    group job is no longer held."""
    twin = new_schema_name("twin")
    try:
        made = await node("migrate", postgres=postgres_url, schema=pg_schema)
        assert made["version"] == 11 and made["before"] == 0 and len(made["applied"]) == 11
        assert (await node("migrate", postgres=postgres_url, schema=twin))["version"] == 11
        ledger = await sql(postgres_url, pg_schema, LEDGER)
        assert [row[0] for row in ledger] == list(range(1, 12))

        assert await migrate_postgres(postgres_url, pg_schema, groups=True) == 11
        assert await sql(postgres_url, pg_schema, LEDGER) == ledger
        assert [row[:2] for row in await sql(postgres_url, pg_schema, "SELECT version, name FROM bullmq_compat_migration")
                ] == [(1, "0001_group_gate"), (2, "0002_group_max_size"), (3, "0003_group_priority"),
                    (4, "0004_group_rate_limit"), (5, "0005_group_start_clock"), (6, "0006_group_release_statement")]
        ours = await sql(postgres_url, pg_schema, OBJECTS_OF_OURS, {"s": pg_schema})
        assert ("trigger bullmq_compat_gate_insert",) in ours and ("rel bullmq_compat_group",) in ours

        async def node_is_happy() -> None:
            again = await node("migrate", postgres=postgres_url, schema=pg_schema)
            assert (again["version"], again["before"], again["applied"]) == (11, 11, [])
            for migrate in (True, False):
                ready = await pg_groups_js("ready", postgres_url, pg_schema, queue_name, migrate=migrate)
                assert ready["ready"] is True
            assert await sql(postgres_url, pg_schema, LEDGER) == ledger

        await node_is_happy()
        pg = pg_of(postgres_url, pg_schema, migrate=False)
        with_gate = await plain_node_run(pg, postgres_url, pg_schema, f"{queue_name}-plain")
        without = await plain_node_run(pg_of(postgres_url, twin, migrate=False), postgres_url, twin,
                                       f"{queue_name}-plain")
        for key in ("added", "completed", "states"):
            assert with_gate[key] == without[key], key
        for job_id, events in without["events"].items():
            assert with_gate["events"].get(job_id) == events, f"events of job {job_id}"
        assert set(with_gate["events"]) == set(without["events"])
        assert [s[1] for s in with_gate["states"]] == ["completed"] * 5

        # a held job at the drop is released to wait (the drop's count), then nothing holds
        first = await node("add", **pg, queue=queue_name, name="g", data={}, opts={"group": {"id": "G"}})
        second = await node("add", **pg, queue=queue_name, name="g", data={}, opts={"group": {"id": "G"}})
        assert (first["row"]["state"], second["row"]["state"]) == ("waiting", "waiting-children")
        assert await drop_postgres_groups(postgres_url, pg_schema) == 1
        assert await node_state(pg, queue_name, second["id"]) == "waiting"
        assert await sql(postgres_url, pg_schema, OBJECTS_OF_OURS, {"s": pg_schema}) == []
        await node_is_happy()
        third = await node("add", **pg, queue=queue_name, name="g", data={}, opts={"group": {"id": "G"}})
        assert third["row"]["state"] == "waiting"
        assert await node_counts(pg, queue_name, "waiting", "waiting-children") == {"waiting": 3, "waiting-children": 0}
    finally:
        await asyncio.to_thread(drop_schema, twin, url=postgres_url)


# -- 6. Bull-Board lists held jobs under "Waiting children"; its Retry waits its turn ----------------

def _http(method: str, url: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        return response.status, json.loads(body) if body else None


async def board_queue(board: NodeProcess, queue: str, status: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"activeQueue": queue, "status": status, "page": 1, "jobsPerPage": 50})
    code, body = await asyncio.to_thread(_http, "GET", f"{board.url}api/queues?{query}")
    assert code == 200
    [shown] = [q for q in body["queues"] if q["name"] == queue]
    return shown


async def test_board_shows_held_group_jobs_under_waiting_children_and_its_retry_waits(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """Bull-Board (Node's createPostgresBackend, read-only schema check) on a queue whose group
    jobs Python added: each group's released job under "Waiting", the held ones under "Waiting
    children" (with their group option). G0 failed and G1 runs: the board's Retry on G0 holds it;
    it runs once G1 ends, before G2."""
    await setup_schema(postgres_url, pg_schema)
    order: list[str] = []
    release = asyncio.Event()
    g1_started = asyncio.Event()

    async def processor(job: Job) -> Any:
        order.append(job.name)
        if job.name == "G0" and order.count("G0") == 1:
            raise RuntimeError("G0 fails the first time")
        if job.name == "G1":
            g1_started.set()
            await release.wait()
        return job.name

    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        g = [await queue.add(f"G{s}", {"s": s}, group="G") for s in range(3)]
        h = [await queue.add(f"H{s}", {"s": s}, group="H") for s in range(2)]
        async with NodeProcess.board(None, free_port(), [queue_name], postgres=postgres_url,
                                     schema=pg_schema, migrate=False) as board:
            before = {s: await board_queue(board, queue_name, s) for s in ("waiting", "waiting-children")}
            assert {j["id"] for j in before["waiting"]["jobs"]} == {g[0].id, h[0].id}
            assert [j["id"] for j in sorted(before["waiting-children"]["jobs"], key=lambda j: int(j["id"]))] == [
                g[1].id, g[2].id, h[1].id]
            assert all(j["opts"]["group"]["id"] in ("G", "H") for j in before["waiting-children"]["jobs"])
            assert before["waiting"]["counts"]["waiting"] == 2
            assert before["waiting"]["counts"]["waiting-children"] == 3
            code, one = await asyncio.to_thread(_http, "GET", f"{board.url}api/queues/{queue_name}/{g[2].id}")
            assert code == 200 and one["status"] == "waiting-children"

            async with py_worker(queue_name, postgres_url, pg_schema, processor, concurrency=2):
                await asyncio.wait_for(g1_started.wait(), 60)

                async def h_done() -> bool:
                    return all([await queue.get_job_state(j.id) == "completed" for j in h])

                await eventually(h_done, timeout=60, what="H's jobs completed")
                assert await queue.get_job_state(g[0].id) == "failed"
                code, _ = await asyncio.to_thread(_http, "PUT", f"{board.url}api/queues/{queue_name}/{g[0].id}/retry")
                assert code == 204
                held = await board_queue(board, queue_name, "waiting-children")
                assert {j["id"] for j in held["jobs"]} == {g[0].id, g[2].id}
                assert held["counts"]["active"] == 1 and held["counts"]["failed"] == 0
                await asyncio.sleep(1.0)  # a retry past the gate would run beside G1 by now
                assert order.count("G0") == 1
                release.set()

                async def all_done() -> bool:
                    return all([await queue.get_job_state(j.id) == "completed" for j in (*g, *h)])

                await eventually(all_done, timeout=60, what="every job completed")
    assert [n for n in order if n.startswith("G")] == ["G0", "G1", "G0", "G2"]


# -- 7. held jobs as Node reads them: counts, Job.getState(), QueueEvents -----------------------------

async def test_node_reads_held_jobs_as_waiting_children(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """Node's getJobCounts and Job.getState() read a held job as waiting-children; Node's
    QueueEvents sees its add as 'waiting-children' (not 'waiting'), and, once a Node worker
    finished the head, its release as 'waiting' (prev waiting-children)."""
    pg = await setup_schema(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        async with events_js("listen", **pg, queue=queue_name, until="waiting-children", timeoutMs=60000) as listener:
            head = await queue.add("e", {"s": 0}, group="E")
            held = await queue.add("e", {"s": 1}, group="E")
            seen = await listener.result()
        assert seen["timedOut"] is False
        by_job: dict[str, list[str]] = defaultdict(list)
        for event in seen["events"]:
            by_job[str(event["args"][0].get("jobId"))].append(event["name"])
        assert by_job[head.id] == ["added", "waiting"]
        assert by_job[held.id] == ["added", "waiting-children"]

        assert await node_counts(pg, queue_name, "waiting", "waiting-children") == {"waiting": 1, "waiting-children": 1}
        assert (await node_job(pg, queue_name, held.id))["state"] == "waiting-children"  # Job.getState()
        assert await pg_groups_js("jobStates", postgres_url, pg_schema, queue_name, ids=[head.id, held.id]) == {
            "states": ["waiting", "waiting-children"]}

        async with node_work(pg, queue_name, 2, timeout_ms=60000) as worker:
            outcome = await worker.result()
        assert outcome["completed"] == [head.id, held.id] and not outcome["timedOut"]
        rows = await sql(postgres_url, pg_schema, "SELECT event, data FROM event WHERE queue = %(q)s "
                                                  "AND data ->> 'jobId' = %(id)s ORDER BY id",
                         {"q": queue_name, "id": held.id})
        names = [name for name, _ in rows]
        assert names[:3] == ["added", "waiting-children", "waiting"] and names[-1] == "completed"
        assert "waiting" not in names[:2]
        assert rows[2][1].get("prev") == "waiting-children"
