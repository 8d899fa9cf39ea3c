"""Python and Node BullMQ 6.7.0 sharing queues on PostgreSQL (Node's createPostgresBackend), both
ways: a Node producer and a Python worker, a Python producer and a Node worker, for each kind of
job (standard, delayed, prioritized, LIFO, custom ids, attempts with backoff, retention); the wire
details the official Python port gets wrong; get_workers both ways; migrations in either order.
Every assertion is about what the Node peer observes (state, fields, order, return values).
"""
from __future__ import annotations

import time
from typing import Any

import pytest

from bullmq_compat import GroupsNotInstalled, Job, QueueEvents, migrate_postgres
from bullmq_compat._errors import InvalidJobData, InvalidJobId
from tests.node import NodeError, node
from tests.pg_interop_helpers import (
    apsql,
    eventually,
    node_call,
    node_job,
    node_states,
    node_work,
    pg_of,
    process,
    py_queue,
    py_worker,
)

pytestmark = pytest.mark.node


def now_ms() -> int:
    return int(time.time() * 1000)


# -- Node producer -> Python worker ----------------------------------------------------------------
async def test_node_jobs_of_every_kind_run_under_a_python_worker(postgres_url: str, pg_schema: str,
                                                                 queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    order: list[str] = []
    tries: dict[str, list[int]] = {}

    async def recording(job: Job) -> Any:
        order.append(str(job.id))
        tries.setdefault(str(job.id), []).append(now_ms())
        result = await process(job)
        return {"n": len(order), "result": result} if not isinstance(job.data, dict) or "behave" not in job.data \
            else result

    # added before any worker runs, so the order of claims is the queue's order alone
    bulk = await node("addBulk", **pg, queue=queue_name, jobs=[
        {"name": "std-1", "data": {"k": 1}},
        {"name": "std-2", "data": {"k": 2}},
        {"name": "prio-5", "data": {"k": 3}, "opts": {"priority": 5}},
        {"name": "prio-1", "data": {"k": 4}, "opts": {"priority": 1}},
        {"name": "lifo", "data": {"k": 5}, "opts": {"lifo": True}},
        {"name": "custom", "data": {"k": 6}, "opts": {"jobId": "order-7"}},
    ])
    std1, std2, prio5, prio1, lifo, custom = bulk["ids"]
    assert custom == "order-7"
    before = now_ms()
    delayed = await node("add", **pg, queue=queue_name, name="later", data={"k": 7}, opts={"delay": 1500})
    flaky = await node("add", **pg, queue=queue_name, name="flaky", data={"behave": {"failTimes": 1}},
                       opts={"attempts": 3, "backoff": {"type": "fixed", "delay": 700}})
    doomed = await node("add", **pg, queue=queue_name, name="doomed", data={"behave": {"fail": "boom"}},
                        opts={"attempts": 2, "backoff": {"type": "exponential", "delay": 300}})
    hopeless = await node("add", **pg, queue=queue_name, name="hopeless",
                          data={"behave": {"unrecoverable": "give up"}}, opts={"attempts": 5})
    gone = await node("add", **pg, queue=queue_name, name="gone", data={"k": 8}, opts={"removeOnComplete": True})
    gone_failed = await node("add", **pg, queue=queue_name, name="gone-failed", data={"behave": {"fail": "x"}},
                             opts={"removeOnFail": True})
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        assert await queue.get_job_state(delayed["id"]) == "delayed"
        assert await queue.get_job_state(prio5) == "prioritized"

    ids = [std1, std2, prio5, prio1, lifo, custom, delayed["id"], flaky["id"], doomed["id"], hopeless["id"],
           gone["id"], gone_failed["id"]]
    finished = [i for i in ids if i not in (gone["id"], gone_failed["id"])]

    async def all_finished() -> bool:
        return all([await node("getState", **pg, queue=queue_name, id=i) in ("completed", "failed")
                    for i in finished]) and await node_job(pg, queue_name, gone["id"]) is None \
            and await node_job(pg, queue_name, gone_failed["id"]) is None

    async with py_worker(queue_name, postgres_url, pg_schema, recording, concurrency=1):
        await eventually(all_finished, timeout=90, what="every job finished, as Node sees it")

    # the order of claims: LIFO first, then FIFO, then by priority (Node's ORDER BY priority, seq)
    first_six = [i for i in order if i in (std1, std2, prio5, prio1, lifo, custom)]
    assert first_six == [lifo, std1, std2, custom, prio1, prio5]
    seen = {i: await node_job(pg, queue_name, i) for i in finished}
    # Node reads the return value each claim gave: the claim number, in that order
    assert [seen[i]["returnvalue"]["n"] for i in first_six] == sorted(seen[i]["returnvalue"]["n"] for i in first_six)
    assert seen[std1]["returnvalue"]["result"] == {"py": {"k": 1}}
    assert all(seen[i]["state"] == "completed" and seen[i]["attemptsMade"] == 1 for i in first_six)
    assert seen[custom]["name"] == "custom" and seen[custom]["id"] == "order-7"

    later = seen[delayed["id"]]
    assert later["state"] == "completed" and later["opts"]["delay"] == 1500
    assert later["processedOn"] >= before + 1500  # not run before it was due

    job = seen[flaky["id"]]
    assert (job["state"], job["returnvalue"], job["attemptsMade"]) == ("completed", {"ok": True}, 2)
    first_try, second_try = tries[flaky["id"]]
    assert second_try - first_try >= 700 - 50  # the fixed backoff was honoured (client clocks)

    job = seen[doomed["id"]]
    assert (job["state"], job["attemptsMade"], job["failedReason"]) == ("failed", 2, "boom")
    assert len(job["stacktrace"]) == 2 and "boom" in job["stacktrace"][0]
    first_try, second_try = tries[doomed["id"]]
    assert second_try - first_try >= 300 - 50

    job = seen[hopeless["id"]]
    assert (job["state"], job["attemptsMade"], job["failedReason"]) == ("failed", 1, "give up")
    assert len(tries[hopeless["id"]]) == 1  # UnrecoverableError: no retry despite attempts 5

    counts = await node("getJobCounts", **pg, queue=queue_name, types=["completed", "failed", "waiting", "delayed"])
    assert counts == {"completed": 8, "failed": 2, "waiting": 0, "delayed": 0}


# -- Python producer -> Node worker ----------------------------------------------------------------
async def test_python_jobs_of_every_kind_run_under_a_node_worker(postgres_url: str, pg_schema: str,
                                                                 queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        std1 = await queue.add("std-1", {"k": 1})
        std2 = await queue.add("std-2", {"k": 2})
        prio5 = await queue.add("prio-5", {"k": 3}, priority=5)
        prio1 = await queue.add("prio-1", {"k": 4}, priority=1)
        lifo = await queue.add("lifo", {"k": 5}, lifo=True)
        custom = await queue.add("custom", {"k": 6}, job_id="py-custom-7")
        before = now_ms()
        later = await queue.add("later", {"k": 7}, delay=1500)
        flaky = await queue.add("flaky", {"behave": {"failTimes": 1}}, attempts=3,
                                backoff={"type": "fixed", "delay": 500})
        doomed = await queue.add("doomed", {"behave": {"fail": "boom"}}, attempts=2, backoff=200)
        hopeless = await queue.add("hopeless", {"behave": {"unrecoverable": "give up"}}, attempts=5)
        gone = await queue.add("gone", {"k": 8}, remove_on_complete=True)
        assert custom.id == "py-custom-7"

        # what Node reads before anything runs
        seen = await node_job(pg, queue_name, later.id)
        assert (seen["state"], seen["delay"], seen["opts"]["delay"]) == ("delayed", 1500, 1500)
        seen = await node_job(pg, queue_name, prio5.id)
        assert (seen["state"], seen["priority"]) == ("prioritized", 5)
        seen = await node_job(pg, queue_name, flaky.id)
        assert seen["opts"]["attempts"] == 3 and seen["opts"]["backoff"] == {"type": "fixed", "delay": 500}
        seen = await node_job(pg, queue_name, doomed.id)
        assert seen["opts"]["backoff"] == {"type": "fixed", "delay": 200}  # a number is Node's fixed backoff
        seen = await node_job(pg, queue_name, gone.id)
        assert seen["opts"]["removeOnComplete"] is True

        total = 11
        async with node_work(pg, queue_name, count=total, concurrency=1) as worker:
            outcome = await worker.result()
        assert outcome["timedOut"] is False
        order = [i for i in outcome["completed"] if i in (std1.id, std2.id, prio5.id, prio1.id, lifo.id, custom.id)]
        assert order == [lifo.id, std1.id, std2.id, custom.id, prio1.id, prio5.id]
        assert sorted(outcome["failed"]) == sorted([doomed.id, hopeless.id])

        seen = await node_job(pg, queue_name, std1.id)
        assert (seen["state"], seen["returnvalue"], seen["data"]) == ("completed", {"echo": {"k": 1}}, {"k": 1})
        seen = await node_job(pg, queue_name, later.id)
        assert seen["state"] == "completed" and seen["processedOn"] >= before + 1500
        seen = await node_job(pg, queue_name, flaky.id)
        assert (seen["state"], seen["returnvalue"], seen["attemptsMade"]) == ("completed", {"ok": True}, 2)
        seen = await node_job(pg, queue_name, doomed.id)
        assert (seen["state"], seen["attemptsMade"], seen["failedReason"]) == ("failed", 2, "boom")
        seen = await node_job(pg, queue_name, hopeless.id)
        assert (seen["state"], seen["attemptsMade"], seen["failedReason"]) == ("failed", 1, "give up")
        assert await node_job(pg, queue_name, gone.id) is None

        # and Python reads what Node's worker left
        done = await queue.get_job(flaky.id)
        assert done is not None and done.returnvalue == {"ok": True} and done.attempts_made == 2

        # removeOnComplete {count: 1}: Node's worker trims the queue's completed jobs to the newest one
        kept = [await queue.add(f"kept-{i}", {"k": i}, remove_on_complete={"count": 1}) for i in range(2)]
        async with node_work(pg, queue_name, count=2, concurrency=1) as worker:
            assert (await worker.result())["completed"] == [kept[0].id, kept[1].id]
        assert await node("getJobs", **pg, queue=queue_name, types=["completed"]) == [kept[1].id]
        assert await node_job(pg, queue_name, kept[0].id) is None


# -- wire details ------------------------------------------------------------------------------------
async def test_python_return_values_reach_node_with_their_json_types(postgres_url: str, pg_schema: str,
                                                                    queue_name: str) -> None:
    """A returned string "42" stays a string for Node (the official port re-parses it to 42)."""
    pg = pg_of(postgres_url, pg_schema)
    values: list[Any] = ["42", 42, "plain", "", "null", [1, "2"], {"a": {"b": None}}, 2.5, True, "é✓\u2028"]
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        jobs = await queue.add_bulk([{"name": "r", "data": {"behave": {"return": v}}} for v in values])
        async with py_worker(queue_name, postgres_url, pg_schema):
            await eventually(lambda: node_states(pg, queue_name, [j.id for j in jobs], "completed"), timeout=60)
    for job, value in zip(jobs, values):
        seen = await node_job(pg, queue_name, job.id)
        assert seen["returnvalue"] == value and type(seen["returnvalue"]) is type(value), (value, seen)
    rows = await apsql(f"SELECT return_value::text FROM {pg_schema}.job WHERE queue = '{queue_name}' "
                       f"AND id = '{jobs[0].id}'")
    assert rows == [['"42"']]  # jsonb holds a JSON string, as Node's worker stores it


async def test_scalar_data_through_add_bulk_reaches_node(postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    data: list[Any] = ["plain", 7, "", None, [1, "x"], "7", 0.5, False]
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        jobs = await queue.add_bulk([{"name": "s", "data": d} for d in data])
        single = await queue.add("one", "plain")
    for job, d in zip(jobs, data):
        seen = await node_job(pg, queue_name, job.id)
        expected = {} if d is None else d  # None data is the empty object, as Node's add(name) gives
        assert seen["data"] == expected and type(seen["data"]) is type(expected), (d, seen)
    assert (await node_job(pg, queue_name, single.id))["data"] == "plain"
    async with node_work(pg, queue_name, count=len(data) + 1) as worker:
        outcome = await worker.result()
    assert outcome["timedOut"] is False and len(outcome["completed"]) == len(data) + 1
    assert (await node_job(pg, queue_name, jobs[0].id))["returnvalue"] == {"echo": "plain"}
    assert (await node_job(pg, queue_name, jobs[1].id))["returnvalue"] == {"echo": 7}


async def test_ids_and_queue_names_that_look_like_numbers_stay_text(postgres_url: str, pg_schema: str,
                                                                   queue_name: str) -> None:
    """Ids and queue names are bound as text: a queue named "12345…" and ids "007", "1e3" work both ways
    (an integer id such as "42" is refused by both, as Node's client rule says)."""
    pg = pg_of(postgres_url, pg_schema)
    numeric_queue = str(int(queue_name.split("-")[-1], 16))[:15]
    async with py_queue(numeric_queue, postgres_url, pg_schema, migrate=True) as queue:
        a = await queue.add("a", {"i": 1}, job_id="1e3")
        b = await queue.add("b", {"i": 2}, job_id="007")
        c = await queue.add("c", {"i": 3})
        assert (a.id, b.id, c.id) == ("1e3", "007", "1")
        with pytest.raises(InvalidJobId):
            await queue.add("x", {}, job_id="42")
        with pytest.raises(NodeError, match="cannot be integers"):
            await node("add", **pg, queue=numeric_queue, name="x", data={}, opts={"jobId": "42"})
        node_added = await node("add", **pg, queue=numeric_queue, name="d", data={"i": 4}, opts={"jobId": "0042"})
        assert node_added["row"]["queue"] == numeric_queue and node_added["row"]["id"] == "0042"
        assert await node("getJobs", **pg, queue=numeric_queue, types=["waiting"], asc=True) == \
            ["1e3", "007", "1", "0042"]
        stored = await apsql(f"SELECT id, opts->>'jobId' FROM {pg_schema}.job WHERE queue = '{numeric_queue}' "
                             "ORDER BY seq")
        assert stored == [["1e3", "1e3"], ["007", "007"], ["1", ""], ["0042", "0042"]]
        read = await queue.get_job("0042")
        assert read is not None and read.data == {"i": 4} and await queue.get_job("1e3") is not None
        assert await queue.get_job("042") is None and await queue.get_job("1000") is None
        async with py_worker(numeric_queue, postgres_url, pg_schema):
            await eventually(lambda: node_states(pg, numeric_queue, ["1e3", "007", "1", "0042"], "completed"))
        seen = await node_job(pg, numeric_queue, "007")
        assert seen["id"] == "007" and seen["returnvalue"] == {"py": {"i": 2}}
        assert (await node_job(pg, numeric_queue, "0042"))["returnvalue"] == {"py": {"i": 4}}
        await queue.remove("1e3")
        assert await node_job(pg, numeric_queue, "1e3") is None
        assert await node_job(pg, numeric_queue, "1") is not None


async def test_data_holding_nul_is_refused_before_anything_is_written(postgres_url: str, pg_schema: str,
                                                                     queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        with pytest.raises(InvalidJobData, match="U\\+0000"):
            await queue.add("n", {"s": "a\u0000b"})
        with pytest.raises(InvalidJobData, match="U\\+0000"):
            await queue.add("n", "\u0000")
        with pytest.raises(InvalidJobData, match="U\\+0000"):  # one bad entry: none of the batch is written
            await queue.add_bulk([{"name": "ok", "data": {"i": 1}}, {"name": "bad", "data": ["\u0000"]}])
        with pytest.raises(InvalidJobData, match="U\\+0000"):  # in a key too
            await queue.add("n", {"k\u0000": 1})
        counts = await node("getJobCounts", **pg, queue=queue_name)
        assert sum(counts.values()) == 0, counts
        assert await apsql(f"SELECT count(*) FROM {pg_schema}.job") == [["0"]]
        assert await apsql(f"SELECT count(*) FROM {pg_schema}.event WHERE queue = '{queue_name}'") == [["0"]]
        # the sequence was not consumed either: the next job is "1", as if nothing had been tried
        assert (await queue.add("n", {"s": "fine"})).id == "1"


async def test_a_group_job_is_refused_where_the_group_objects_are_not_installed(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    # migrate=True runs Node's migrations only: without our gate a group job would go straight to
    # wait, so it is refused, naming the schema and what to run, and nothing is written
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        with pytest.raises(GroupsNotInstalled, match=f"schema '{pg_schema}'.*groups=True"):
            await queue.add("n", {"i": 1}, group={"id": "tenant-1"})
        with pytest.raises(GroupsNotInstalled, match="groups=True"):
            await queue.add_bulk([{"name": "n", "data": {}, "opts": {"group": {"id": "g"}}}])
        with pytest.raises(GroupsNotInstalled, match="groups=True"):
            await queue.add("n", {}, group="g", order_ms=5, deduplication={"id": "d"})
        with pytest.raises(GroupsNotInstalled, match="groups=True"):
            await queue.set_group_ordering_delay(1000)
        with pytest.raises(GroupsNotInstalled, match="groups=True"):
            await queue.set_group_options("g", ordering_delay_ms=10)
        with pytest.raises(GroupsNotInstalled, match="groups=True"):
            await queue.get_group_ordering_delay("g")
    assert sum((await node("getJobCounts", **pg, queue=queue_name)).values()) == 0


# -- get_workers both ways ---------------------------------------------------------------------------
async def test_python_workers_are_named_as_node_names_them_and_listed_both_ways(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    await node("migrate", **pg)

    async def node_lists(n: int) -> Any:
        got = await node_call(pg, queue_name, "getWorkers")
        return got if len(got) == n else None

    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        assert await queue.get_workers() == [] and await node_call(pg, queue_name, "getWorkers") == []
        events = QueueEvents(queue_name, connection=postgres_url, schema=pg_schema)
        try:
            async with py_worker(queue_name, postgres_url, pg_schema, name="billing-py"), \
                    py_worker(queue_name, postgres_url, pg_schema):
                await events.wait_until_ready()
                both = await eventually(lambda: node_lists(2), what="Node listing both Python workers")
                assert sorted(w["rawname"] for w in both) == sorted([queue_name, f"{queue_name}:w:billing-py"])
                assert all(w["name"] == queue_name for w in both)
                names = await apsql("SELECT application_name FROM pg_stat_activity "
                                    f"WHERE application_name LIKE '{queue_name}%' ORDER BY 1")
                # no schema prefix; one LISTEN session each is named, as Node names them
                assert sorted({n for [n] in names}) == sorted([queue_name, f"{queue_name}:qe",
                                                               f"{queue_name}:w:billing-py"])
                assert await node_call(pg, f"{queue_name}-other", "getWorkers") == []

                # and Node's workers, beside ours, in our listing
                async with node_work(pg, queue_name, count=1000, workerOpts={"name": "billing-js"}):
                    async def ours_lists(n: int) -> Any:
                        got = await queue.get_workers()
                        return got if len(got) == n else None
                    listed = await eventually(lambda: ours_lists(3), what="Python listing Node's worker")
                    assert sorted(w["rawname"] for w in listed) == sorted(
                        [queue_name, f"{queue_name}:w:billing-py", f"{queue_name}:w:billing-js"])
                    assert all(w["name"] == queue_name for w in listed)
                    assert await queue.get_workers_count() == 3
                    assert len(await node_call(pg, queue_name, "getWorkers")) == 3
        finally:
            await events.close()

        async def none_left() -> bool:
            return await node_call(pg, queue_name, "getWorkers") == [] and await queue.get_workers() == []
        await eventually(none_left, what="no workers listed once all closed")


# -- migrations in either order -----------------------------------------------------------------------
async def test_node_migrates_then_python_connects(postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    first = await node("migrate", **pg)
    assert first["version"] == 11 and len(first["applied"]) == 11
    ledger = await apsql(f"SELECT version, name, min_client_version, applied_at FROM {pg_schema}.migration "
                         "ORDER BY version")
    # Python connects without migrating, and with migrate=True changes nothing
    async with py_queue(queue_name, postgres_url, pg_schema) as queue:
        job = await queue.add("from-py", {"i": 1})
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        await queue.add("again", {"i": 2})
    assert await migrate_postgres(postgres_url, pg_schema) == 11
    assert await apsql(f"SELECT version, name, min_client_version, applied_at FROM {pg_schema}.migration "
                       "ORDER BY version") == ledger
    async with node_work(pg_of(postgres_url, pg_schema, migrate=None), queue_name, count=2) as worker:
        assert sorted((await worker.result())["completed"]) == sorted([job.id, "2"])


async def test_python_migrates_then_node_connects_and_its_migrations_are_a_no_op(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    # before any migration Python refuses to use the schema, as Node does
    with pytest.raises(Exception, match="(?i)migrat"):
        async with py_queue(queue_name, postgres_url, pg_schema) as queue:
            await queue.add("n", {})
    with pytest.raises(NodeError) as info:
        await node("getJobCounts", **pg_of(postgres_url, pg_schema, migrate=None), queue=queue_name)
    assert info.value.name == "SchemaMigrationRequiredError"

    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        job = await queue.add("from-py", {"i": 1})
    ledger = await apsql(f"SELECT version, name, min_client_version, applied_at FROM {pg_schema}.migration "
                         "ORDER BY version")
    assert len(ledger) == 11 and all(not n.endswith(".sql") and m == "6" for _, n, m, _ in ledger)

    # Node without migrate accepts the schema; Node's runMigrations (and migrate: true) is a no-op
    no_migrate = pg_of(postgres_url, pg_schema, migrate=None)
    assert (await node("getJobCounts", **no_migrate, queue=queue_name))["waiting"] == 1
    again = await node("migrate", **pg_of(postgres_url, pg_schema))
    assert again == {"version": 11, "before": 11, "applied": []}
    await node("add", **pg_of(postgres_url, pg_schema, migrate=True), queue=queue_name, name="from-js", data={})
    assert await apsql(f"SELECT version, name, min_client_version, applied_at FROM {pg_schema}.migration "
                       "ORDER BY version") == ledger
    async with node_work(no_migrate, queue_name, count=2) as worker:
        assert sorted((await worker.result())["completed"]) == sorted([job.id, "2"])
    seen = await node_job(no_migrate, queue_name, job.id)
    assert seen["returnvalue"] == {"echo": {"i": 1}}


# -- Python worker + Node queue listing: the states Node reports for Python-made jobs ---------------
async def test_node_counts_and_lists_the_states_of_python_jobs(postgres_url: str, pg_schema: str,
                                                               queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        done = await queue.add("done", {"i": 1})
        bad = await queue.add("bad", {"behave": {"fail": "nope"}})
        async with py_worker(queue_name, postgres_url, pg_schema):
            await eventually(lambda: node_states(pg, queue_name, [done.id], "completed"))
            await eventually(lambda: node_states(pg, queue_name, [bad.id], "failed"))
        waiting = await queue.add("waiting", {"i": 2})
        later = await queue.add("later", {"i": 3}, delay=600000)
        prio = await queue.add("prio", {"i": 4}, priority=3)
    counts = await node("getJobCounts", **pg, queue=queue_name)
    assert {k: v for k, v in counts.items() if v} == {"completed": 1, "failed": 1, "waiting": 1, "delayed": 1,
                                                      "prioritized": 1}
    for state, job in (("completed", done), ("failed", bad), ("waiting", waiting), ("delayed", later),
                       ("prioritized", prio)):
        assert await node("getJobs", **pg, queue=queue_name, types=[state]) == [job.id]
    failed = await node_job(pg, queue_name, bad.id)
    assert failed["failedReason"] == "nope" and failed["stacktrace"] and "nope" in failed["stacktrace"][0]
    assert failed["attemptsMade"] == 1 and failed["processedOn"] and failed["finishedOn"]


# -- progress and logs written by a Python worker, read by Node -------------------------------------
async def test_node_reads_the_progress_and_logs_a_python_worker_wrote(postgres_url: str, pg_schema: str,
                                                                      queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)

    async def reporting(job: Job) -> Any:
        await job.update_progress({"pct": 40, "s": "é"})
        await job.log("first line")
        await job.log("second \u2028 line")
        await job.update_progress(100 if job.name == "number" else "half")
        return "done"

    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        obj = await queue.add("object", {"i": 1})
        num = await queue.add("number", {"i": 2})
        async with py_worker(queue_name, postgres_url, pg_schema, reporting):
            await eventually(lambda: node_states(pg, queue_name, [obj.id, num.id], "completed"))
    assert (await node_job(pg, queue_name, obj.id))["progress"] == "half"
    assert (await node_job(pg, queue_name, num.id))["progress"] == 100
    logs = await node_call(pg, queue_name, "getJobLogs", obj.id)
    assert logs == {"logs": ["first line", "second \u2028 line"], "count": 2}
