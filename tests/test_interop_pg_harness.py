"""The interop harness on PostgreSQL: each interop/ script driving Node BullMQ's own Postgres
backend (createPostgresBackend) through tests/node.py, Node talking to Node only. Each test has
a fresh schema (tests/pg_node_helpers.py), dropped at its end; queue names are unique too, since
Node's getWorkers reads the application_name of every session of the database, whatever its schema.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from tests._redis_server import free_port
from tests.helpers import eventually
from tests.node import INTEROP, NodeError, NodeProcess, node, run_node
from tests.node_scripts import run_script
from tests.pg_node_helpers import apsql, pg_args, pg_schema, postgres_url, schema_exists  # noqa: F401 (fixtures)

pytestmark = pytest.mark.node

MIGRATIONS = [
    "0001_schema", "0002_functions", "0003_dedup_stale_key", "0004_relay",
]  # the first four names; all 11 are checked by count and version


async def flow_js(op: str, **args: Any) -> Any:
    budget = float(args.get("timeoutMs", 30000)) / 1000 + 30
    return await run_node([str(INTEROP / "flow.js"), op, json.dumps(args)], label=f"flow.js {op}", budget=budget)


def events_js(op: str, **args: Any) -> NodeProcess:
    """interop/events.js in the background; entering waits until its QueueEvents listens."""
    return NodeProcess(INTEROP / "events.js", op, json.dumps(args), result_timeout=90)


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=20) as response:
        return response.status, response.read()


# -- migrations ------------------------------------------------------------------------------------
async def test_migrate_reaches_version_11_and_a_second_run_is_a_no_op(pg_schema: str) -> None:
    first = await node("migrate", **pg_args(pg_schema))
    assert first["version"] == 11 and first["before"] == 0
    applied = first["applied"]
    assert [row["version"] for row in applied] == list(range(1, 12))
    assert [row["name"] for row in applied[:4]] == MIGRATIONS
    assert all(not row["name"].endswith(".sql") and row["min_client_version"] == 6 for row in applied)

    ledger = await apsql(f"SELECT count(*), max(version), min(min_client_version) FROM {pg_schema}.migration")
    assert ledger == [["11", "11", "6"]]

    second = await node("migrate", **pg_args(pg_schema))
    assert second == {"version": 11, "before": 11, "applied": []}
    assert await apsql(f"SELECT count(*) FROM {pg_schema}.migration") == [["11"]]


async def test_without_migrate_a_fresh_schema_is_refused(pg_schema: str, queue_name: str) -> None:
    with pytest.raises(NodeError) as info:
        await node("getJobCounts", **pg_args(pg_schema, migrate=None), queue=queue_name)
    assert info.value.name == "SchemaMigrationRequiredError"
    assert not await asyncio.to_thread(schema_exists, pg_schema)  # Node only read, created nothing

    # with migrate: true the first Queue creates the schema, and then no flag is needed
    assert (await node("getJobCounts", **pg_args(pg_schema), queue=queue_name))["waiting"] == 0
    counts = await node("getJobCounts", **pg_args(pg_schema, migrate=None), queue=queue_name)
    assert set(counts) >= {"waiting", "active", "completed", "failed", "delayed", "prioritized"}


# -- cli.js ---------------------------------------------------------------------------------------
async def test_add_then_work_completes_with_the_return_value(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    before = int(time.time() * 1000)
    added = await node("add", **pg, queue=queue_name, name="email",
                       data={"behave": {"return": {"answer": 42}}, "to": "a@example.org"},
                       opts={"attempts": 3})
    job_id, row = added["id"], added["row"]
    assert job_id == "1"  # the per-queue sequence, as Redis's id counter
    assert "hash" not in added
    assert row["queue"] == queue_name and row["id"] == job_id and row["name"] == "email"
    assert row["state"] == "waiting" and row["data"]["to"] == "a@example.org"
    assert row["opts"] == {"attempts": 3}  # Node's long option names, as given
    assert before - 1000 <= row["added_at_ms"] <= int(time.time() * 1000) + 1000

    assert await node("getState", **pg, queue=queue_name, id=job_id) == "waiting"
    assert await node("getJobs", **pg, queue=queue_name, types=["waiting"]) == [job_id]
    assert (await node("getJobCounts", **pg, queue=queue_name, types=["waiting", "completed"])) == \
        {"waiting": 1, "completed": 0}
    assert await node("getJob", **pg, queue=queue_name, id="404") is None

    outcome = await node("work", **pg, queue=queue_name, count=1, timeoutMs=30000)
    assert outcome == {"completed": [job_id], "failed": [], "timedOut": False}

    job = await node("getJob", **pg, queue=queue_name, id=job_id)
    assert (job["state"], job["returnvalue"], job["attemptsMade"]) == ("completed", {"answer": 42}, 1)
    assert job["finishedOn"] >= job["processedOn"] >= job["timestamp"]
    assert await node("getJobs", **pg, queue=queue_name, types=["completed"]) == [job_id]
    stored = await apsql(f"SELECT state, return_value::text FROM {pg_schema}.job "
                         f"WHERE queue = '{queue_name}' AND id = '{job_id}'")
    assert stored == [["completed", '{"answer": 42}']]


async def test_failures_attempts_backoff_and_retention(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    bulk = await node("addBulk", **pg, queue=queue_name, jobs=[
        {"name": "doomed", "data": {"behave": {"fail": "boom"}},
         "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 200}}},
        {"name": "flaky", "data": {"behave": {"failTimes": 1, "message": "first try fails"}},
         "opts": {"attempts": 2}},
        {"name": "hopeless", "data": {"behave": {"unrecoverable": "give up"}}, "opts": {"attempts": 5}},
        {"name": "gone", "data": {"behave": {"return": "plain"}}, "opts": {"removeOnComplete": True}},
    ])
    doomed, flaky, hopeless, gone = bulk["ids"]
    assert bulk["ids"] == ["1", "2", "3", "4"]
    assert [r["name"] for r in bulk["rows"]] == ["doomed", "flaky", "hopeless", "gone"]
    assert bulk["rows"][0]["opts"]["backoff"] == {"type": "fixed", "delay": 200}

    outcome = await node("work", **pg, queue=queue_name, count=4, timeoutMs=40000)
    assert outcome["timedOut"] is False
    assert sorted(outcome["completed"]) == sorted([flaky, gone])
    assert sorted(outcome["failed"]) == sorted([doomed, hopeless])

    job = await node("getJob", **pg, queue=queue_name, id=doomed)
    assert (job["state"], job["attemptsMade"], job["failedReason"]) == ("failed", 2, "boom")
    assert len(job["stacktrace"]) == 2 and job["stacktrace"][0].startswith("Error: boom")
    job = await node("getJob", **pg, queue=queue_name, id=flaky)
    assert (job["state"], job["returnvalue"], job["attemptsMade"]) == ("completed", {"ok": True}, 2)
    job = await node("getJob", **pg, queue=queue_name, id=hopeless)
    assert (job["state"], job["attemptsMade"], job["failedReason"]) == ("failed", 1, "give up")
    assert job["stacktrace"][0].startswith("UnrecoverableError: give up")
    assert await node("getJob", **pg, queue=queue_name, id=gone) is None  # removeOnComplete
    counts = await node("getJobCounts", **pg, queue=queue_name, types=["completed", "failed"])
    assert counts == {"completed": 1, "failed": 2}


async def test_queue_call_pause_resume_and_listings(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    await node("addBulk", **pg, queue=queue_name,
               jobs=[{"name": "a", "data": {"i": 0}}, {"name": "b", "data": {"i": 1}}])
    assert await node("queueCall", **pg, queue=queue_name, method="isPaused") is False
    await node("queueCall", **pg, queue=queue_name, method="pause")
    assert await node("queueCall", **pg, queue=queue_name, method="isPaused") is True
    waiting = await node("queueCall", **pg, queue=queue_name, method="getWaiting")
    assert sorted((j["id"], j["name"]) for j in waiting) == [("1", "a"), ("2", "b")]
    await node("queueCall", **pg, queue=queue_name, method="resume")
    assert await node("queueCall", **pg, queue=queue_name, method="isPaused") is False
    with pytest.raises(NodeError) as info:
        await node("queueCall", **pg, queue=queue_name, method="noSuchMethod")
    assert info.value.name == "TypeError"
    with pytest.raises(NodeError, match="needs Redis"):
        await node("groupAdd", **pg, queue=queue_name, jobs=[])


async def test_bad_connections_fail_with_a_node_error(pg_schema: str, queue_name: str) -> None:
    with pytest.raises(NodeError, match="ECONNREFUSED|timeout"):
        await node("getJobCounts", postgres="postgresql://postgres@127.0.0.1:1/test", schema=pg_schema,
                   queue=queue_name, connectTimeoutMs=5000)
    with pytest.raises(NodeError, match="invalid PostgreSQL schema name"):
        await node("getJobCounts", **{**pg_args(pg_schema), "schema": "bad-name"}, queue=queue_name)
    with pytest.raises(NodeError, match="not both"):
        await node("getJobCounts", **pg_args(pg_schema), redis="redis://127.0.0.1:1", queue=queue_name)
    assert not await asyncio.to_thread(schema_exists, pg_schema)


async def test_get_jobs_many_reads_jobs_of_many_queues(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    added = await node("add", **pg, queue=queue_name, name="n", data={"s": "\u2028"})
    out = await node("getJobsMany", **pg, queue=queue_name,
                     items=[{"queue": queue_name, "id": added["id"]}, {"queue": f"{queue_name}-2", "id": "1"}])
    jobs = json.loads(out["json"])
    assert jobs[0]["id"] == added["id"] and jobs[0]["data"] == {"s": "\u2028"} and jobs[1] is None


async def test_get_workers_lists_running_node_workers(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    await node("migrate", **pg)

    async def workers(queue: str = queue_name) -> list[dict[str, Any]]:
        return await node("queueCall", **pg, queue=queue, method="getWorkers")

    async def listed(n: int) -> list[dict[str, Any]] | None:
        got = await workers()
        return got if len(got) == n else None

    assert await workers() == []
    # count never reached: both just wait for jobs until the block ends (SIGTERM)
    async with NodeProcess.work(**pg, queue=queue_name, count=100, timeoutMs=90000,
                                workerOpts={"name": "billing-1"}), \
            NodeProcess.work(**pg, queue=queue_name, count=100, timeoutMs=90000):
        both = await eventually(lambda: listed(2))
        assert sorted(w["rawname"] for w in both) == sorted([queue_name, f"{queue_name}:w:billing-1"])
        assert all(w["name"] == queue_name for w in both)
        assert all(set(w) == {"name", "rawname"} for w in both)  # no addr, id, age... as on Redis
        # another queue of the same schema does not see them
        assert await workers(f"{queue_name}-other") == []
        names = await apsql("SELECT application_name FROM pg_stat_activity "
                            f"WHERE application_name LIKE '{queue_name}%' ORDER BY 1")
        assert names == [[queue_name], [f"{queue_name}:w:billing-1"]]
    # once they have closed their connections they are no longer listed

    async def gone() -> bool:
        return await workers() == []
    await eventually(gone)


# -- job schedulers (queueCall + work) ------------------------------------------------------------
async def test_every_and_cron_schedulers_run_under_a_node_worker(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)

    async def call(method: str, *args: Any) -> Any:
        return await node("queueCall", **pg, queue=queue_name, method=method, args=list(args))

    async with NodeProcess.work(**pg, queue=queue_name, count=5, timeoutMs=60000) as worker:
        every = await call("upsertJobScheduler", "beat", {"every": 500},
                           {"name": "tick", "data": {"from": "node"}, "opts": {"attempts": 2}})
        assert every["id"].startswith("repeat:beat:") and every["name"] == "tick"
        cron = await call("upsertJobScheduler", "cron-beat", {"pattern": "*/1 * * * * *"},
                          {"name": "tock"})
        assert cron["id"].startswith("repeat:cron-beat:")
        outcome = await worker.result()
    # (a worker stops after 5 completions, but jobs finishing together may complete one or two more)
    assert outcome["timedOut"] is False and len(outcome["completed"]) >= 5
    assert all(i.startswith(("repeat:beat:", "repeat:cron-beat:")) for i in outcome["completed"])

    schedulers = {s["key"]: s for s in await call("getJobSchedulers")}
    assert set(schedulers) == {"beat", "cron-beat"}
    assert schedulers["beat"]["every"] == 500 and schedulers["beat"]["name"] == "tick"
    assert schedulers["cron-beat"]["pattern"] == "*/1 * * * * *"
    assert schedulers["beat"]["iterationCount"] >= 1 and schedulers["beat"]["next"] > 0
    one = await call("getJobScheduler", "beat")
    assert one["template"]["data"] == {"from": "node"}

    done = [j for j in await call("getCompleted") if j["id"].startswith("repeat:beat:")]
    assert done, "no completed iteration of beat"
    job = done[0]
    millis = int(job["id"].rsplit(":", 1)[1])
    assert job["name"] == "tick" and job["data"] == {"from": "node"} and job["opts"]["attempts"] == 2
    assert job["returnvalue"] == {"echo": {"from": "node"}}
    assert job["timestamp"] <= millis + 1000  # the iteration's id carries its due time
    rows = await apsql(f"SELECT scheduler_id, every_ms, pattern FROM {pg_schema}.scheduler "
                       f"WHERE queue = '{queue_name}' ORDER BY scheduler_id")
    assert rows == [["beat", "500", ""], ["cron-beat", "", "*/1 * * * * *"]]

    assert await call("removeJobScheduler", "beat") is True
    assert [s["key"] for s in await call("getJobSchedulers")] == ["cron-beat"]


# -- flow.js --------------------------------------------------------------------------------------
async def test_flow_parent_completes_after_its_children_and_sees_their_values(
        pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    parent_q, child_q = f"{queue_name}-parent", f"{queue_name}-child"
    flow = {"name": "parent", "queueName": parent_q, "data": {"behave": {"children": True}}, "children": [
        {"name": "c1", "queueName": child_q, "data": {"behave": {"return": 1}}},
        {"name": "c2", "queueName": child_q, "data": {"behave": {"return": "two"}}},
    ]}
    tree = await flow_js("add", **pg, flow=flow)
    root = tree["id"]
    kids = [c["id"] for c in tree["children"]]
    assert all(c["parentKey"] == f"{parent_q}:{root}" for c in tree["children"])
    assert await node("getState", **pg, queue=parent_q, id=root) == "waiting-children"

    # the children first: the parent stays waiting for them until both are done
    async with NodeProcess(INTEROP / "flow.js", "work",
                           json.dumps({**pg, "queue": child_q, "count": 2, "timeoutMs": 60000, "ready": True}),
                           result_timeout=90) as children:
        assert sorted((await children.result())["completed"]) == sorted(kids)
    assert await node("getState", **pg, queue=parent_q, id=root) == "waiting"
    outcome = await flow_js("work", **pg, queue=parent_q, count=1, timeoutMs=60000)
    assert outcome["completed"] == [root]

    got = await flow_js("get", **pg, id=root, queueName=parent_q)
    assert got["state"] == "completed"
    values = got["returnvalue"]["children"]
    assert values == {f"{child_q}:{kids[0]}": 1, f"{child_q}:{kids[1]}": "two"}
    assert got["returnvalue"]["counts"]["processed"] == 2
    parent = await node("getJob", **pg, queue=parent_q, id=root)
    child = await node("getJob", **pg, queue=child_q, id=kids[0])
    assert parent["finishedOn"] >= child["finishedOn"]
    assert await flow_js("jobCall", **pg, queue=parent_q, id=root, method="getChildrenValues") == values

    # flow.js run: add and run a whole flow in one go
    ran = await flow_js("run", **pg, flow={**flow, "name": "again"}, queues=[parent_q, child_q], timeoutMs=60000)
    assert ran["state"] == "completed"


# -- events.js ------------------------------------------------------------------------------------
async def test_queue_events_sees_a_job_through_to_completed(pg_schema: str, queue_name: str) -> None:
    pg = pg_args(pg_schema)
    await node("migrate", **pg)
    # lastEventId "0": every event of this (fresh) queue, so none can fall before the listener's cursor
    async with events_js("listen", **pg, queue=queue_name, until="completed", lastEventId="0",
                         timeoutMs=60000) as listener:
        assert listener.first_line == {"ready": True}
        added = await node("add", **pg, queue=queue_name, name="n", data={"behave": {"return": "42"}})
        await node("work", **pg, queue=queue_name, count=1, timeoutMs=30000)
        heard = await listener.result()
    assert heard["timedOut"] is False
    events = heard["events"]
    names = [e["name"] for e in events]
    assert names[:1] == ["added"] and "completed" in names
    assert names.index("added") < names.index("active") < names.index("completed")
    completed = events[names.index("completed")]["args"]
    assert completed[0] == {"jobId": added["id"], "prev": "active", "returnvalue": "42"}
    ids = [int(e["args"][-1]) for e in events]  # event ids: the schema's numbers, as strings
    assert ids == sorted(ids) and all(isinstance(e["args"][-1], str) for e in events)

    # waitUntilFinished through Node's QueueEvents on Postgres
    second = await node("add", **pg, queue=queue_name, name="w", data={"behave": {"return": {"x": [1]}}})
    async with events_js("wait", **pg, queue=queue_name, id=second["id"], ttl=60000) as waiter:
        await node("work", **pg, queue=queue_name, count=1, timeoutMs=30000)
        assert await waiter.result() == {"returnvalue": {"x": [1]}}


# -- dedup.js -------------------------------------------------------------------------------------
async def test_dedup_decisions(pg_schema: str, queue_name: str) -> None:
    def add(v: int, **dedup: Any) -> dict[str, Any]:
        return {"add": {"name": "job", "data": {"v": v}, "opts": {"deduplication": {"id": "k", **dedup}}}}

    steps = [add(1), add(2), {"probe": "k"}, {"take": "t1"}, add(3), {"complete": "t1"}, {"probe": "k"},
             add(4), {"probe": "k"}, {"probe": "other"}]
    out = await run_script("dedup.js", {**pg_args(pg_schema), "queue": queue_name, "steps": steps}, timeout=90)
    r = out["results"]
    assert r[0]["id"] == r[1]["id"] == "1"  # the second add is deduplicated: the first job's id
    assert r[2] == {"value": "1", "pttl": -1, "next": 0, "row": {"job_id": "1", "expire_at_ms": None}}
    assert r[3] == {"id": "1"} and r[4]["id"] == "1"  # still deduplicated while active
    assert r[5] == {"id": "1"}
    assert r[6]["value"] is None and r[6]["pttl"] == -2  # finished: the key is released
    assert r[7]["id"] != "1"
    assert r[8]["value"] == r[7]["id"]
    assert r[9] == {"value": None, "pttl": -2, "next": 0, "row": None}

    # with a ttl: the key lives for ttl ms whatever happens to the job
    throttle = [add(1, ttl=60000), add(2, ttl=60000), {"probe": "k"}]
    out = await run_script("dedup.js", {**pg_args(pg_schema), "queue": f"{queue_name}-ttl", "steps": throttle},
                           timeout=90)
    a, b, probe = out["results"]
    assert a["id"] == b["id"]
    assert probe["value"] == a["id"] and 0 < probe["pttl"] <= 60000


# -- board.js -------------------------------------------------------------------------------------
async def test_board_serves_a_postgres_backed_queue(pg_schema: str, queue_name: str, postgres_url: str) -> None:
    pg = pg_args(pg_schema)
    added = await node("add", **pg, queue=queue_name, name="shown", data={"k": "v"})
    other = f"{queue_name}-other"
    async with NodeProcess.board(None, free_port(), [queue_name, other],
                                 postgres=postgres_url, schema=pg_schema) as board:
        status, _ = await asyncio.to_thread(_get, board.url)
        query = urllib.parse.urlencode({"activeQueue": queue_name, "status": "waiting", "page": 1, "jobsPerPage": 10})
        api_status, body = await asyncio.to_thread(_get, f"{board.url}api/queues?{query}")
        job_status, one = await asyncio.to_thread(_get, f"{board.url}api/queues/{queue_name}/{added['id']}")
    assert status == 200 and api_status == 200 and job_status == 200
    queues = {q["name"]: q for q in json.loads(body)["queues"]}
    assert set(queues) == {queue_name, other}
    shown = queues[queue_name]
    assert shown["counts"]["waiting"] == 1
    assert [(j["id"], j["name"], j["data"]) for j in shown["jobs"]] == [(added["id"], "shown", {"k": "v"})]
    assert queues[other]["jobs"] == []
    assert json.loads(one)["job"]["id"] == added["id"]
    assert board.proc is not None and board.proc.returncode == 0


async def test_board_refuses_an_unmigrated_schema(pg_schema: str, queue_name: str, postgres_url: str) -> None:
    with pytest.raises(NodeError, match="SchemaMigrationRequiredError|not initialized"):
        async with NodeProcess.board(None, free_port(), [queue_name], postgres=postgres_url, schema=pg_schema):
            pass
