"""Issue #31 §5, a fleet in the middle of an upgrade: Node services on the latest BullMQ 5.x, on
6.0.x and on 6.7.0 (interop/package.json installs them side by side as bullmq5, bullmq60 and
bullmq; interop/fleet.js runs one operation with any of them) share a Redis queue with our
Python worker.

Jobs, retries, delayed jobs, flows and job schedulers added by each release are processed by the
Python worker and read back by every release, each release's report compared with Node 6.7.0's
(the oracle, not our output); a mixed fleet of all four workers and producers completes every job
exactly once. Where the releases do not mix (upstream's own changes between 5 and 6: the legacy
``paused`` list, legacy repeatable-job keys, ``debounce``), the tests below show what happens;
docs/compatibility.md ("A fleet mid-upgrade") names them.
"""
from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from typing import Any, Sequence

import pytest

from bullmq_compat import Queue, Worker
from tests.helpers import eventually, running
from tests.node import INTEROP, NodeError, NodeProcess, run_node
from tests.processors import behave
from tests.test_interop_schedulers import python_form

pytestmark = pytest.mark.node

FLEET = INTEROP / "fleet.js"
ORACLE = "bullmq"  # Node BullMQ 6.7.0, the pin
RELEASES = ("bullmq5", "bullmq60", ORACLE)
ALL_STATES = ["wait", "waiting", "paused", "active", "delayed", "prioritized", "completed", "failed",
              "waiting-children"]


def pinned_versions() -> dict[str, str]:
    """{package name: the version interop/package.json pins}, e.g. {"bullmq5": "5.81.5", ...}."""
    deps = json.loads((INTEROP / "package.json").read_text())["dependencies"]
    return {name: deps[name].rpartition("@")[2] for name in RELEASES}


async def fleet(*requests: dict[str, Any]) -> list[Any]:
    """Run ``node interop/fleet.js`` on these requests, in order, in one Node process."""
    return list(await run_node([str(FLEET), json.dumps(list(requests))], label="fleet.js", budget=90))


def on(pkg: str, url: str, queue: str, op: str, **args: Any) -> dict[str, Any]:
    """One fleet.js request for release ``pkg``."""
    return {"pkg": pkg, "op": op, "redis": url, "queue": queue, **args}


def fleet_worker(pkg: str, url: str, queue: str, **args: Any) -> NodeProcess:
    """A Node worker of release ``pkg`` (fleet.js work) in the background; entering waits until it consumes."""
    request = on(pkg, url, queue, "work", timeoutMs=90_000, **args)
    return NodeProcess(FLEET, json.dumps(request), result_timeout=120)


async def read_by_all(url: str, queue: str, ids: Sequence[str] = (), **args: Any) -> dict[str, dict[str, Any]]:
    """What each release reports of ``queue`` (fleet.js read), by package name."""
    reads = await fleet(*(on(pkg, url, queue, "read", ids=list(ids), countTypes=ALL_STATES, **args)
                          for pkg in RELEASES))
    versions = pinned_versions()
    assert [r["version"] for r in reads] == [versions[pkg] for pkg in RELEASES]
    return dict(zip(RELEASES, reads))


async def completed_count(queue: Queue) -> int:
    return (await queue.get_job_counts("completed"))["completed"]


async def fleet_processor(job: Any) -> Any:
    """The Python twin of fleet.js's processor: data.behave = {sleepMs, failTimes}."""
    todo = (job.data.get("behave") if isinstance(job.data, dict) else None) or {}
    if todo.get("sleepMs"):
        await asyncio.sleep(todo["sleepMs"] / 1000)
    if job.attempts_made < todo.get("failTimes", 0):
        raise RuntimeError(f"failing on purpose (attempt {job.attempts_made + 1})")
    return {"by": "python", "data": job.data}


def test_the_releases_are_pinned_to_exact_versions() -> None:
    versions = pinned_versions()
    assert versions[ORACLE] == "6.7.0"
    assert versions["bullmq5"].startswith("5.") and versions["bullmq60"].startswith("6.0.")
    for pkg, version in versions.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), (pkg, version)  # exact, not a range
        installed = json.loads((INTEROP / "node_modules" / pkg / "package.json").read_text())
        assert (installed["name"], installed["version"]) == ("bullmq", version)


# -- each release produces, Python works, every release reads ---------------------------------------
def producer_requests(pkg: str, url: str, queue: str) -> list[dict[str, Any]]:
    plain = [{"name": "plain", "data": {"n": i, "s": "é✓"}} for i in range(3)]
    retry = {"name": "retry", "data": {"behave": {"failTimes": 2}},
             "opts": {"attempts": 3, "backoff": {"type": "exponential", "delay": 100}}}
    later = {"name": "later", "data": {"d": 1}, "opts": {"delay": 700}}
    flow = {"name": "parent", "queueName": queue, "data": {"behave": {"children": True}},
            "children": [{"name": "child", "queueName": queue, "data": {"c": i}} for i in range(2)]}
    return [
        on(pkg, url, queue, "add", jobs=[*plain, retry, later]),
        on(pkg, url, queue, "flow", flow=flow),
        on(pkg, url, queue, "call", method="upsertJobScheduler",
           args=["beat", {"every": 300, "limit": 3}, {"name": "beat", "data": {"s": 1}}]),
    ]


@pytest.mark.parametrize("producer", RELEASES)
async def test_what_each_release_adds_runs_under_python_and_reads_alike_in_every_release(
        redis_url: str, queue_name: str, producer: str) -> None:
    added, tree, _ = await fleet(*producer_requests(producer, redis_url, queue_name))
    plain_ids, retry_id, later_id = added[:3], added[3], added[4]
    child_ids = [c["id"] for c in tree["children"]]
    total = 3 + 1 + 1 + 1 + 2 + 3  # plain, retry, delayed, parent, children, 3 scheduler iterations

    failures: list[str] = []
    async with Queue(queue_name, connection=redis_url) as queue:
        worker = Worker(queue_name, behave, connection=redis_url, drain_delay=0.5)
        worker.on("failed", lambda job: failures.append(str(job.id)))
        async with running(worker):
            await eventually(lambda: _done(queue, total), timeout=60, what=f"{total} jobs completed, none left")
        py_counts = await queue.get_job_counts(*ALL_STATES)
        py_default_counts = await queue.get_job_counts()
        py_schedulers = await queue.get_job_schedulers(0, -1, True)

    reads = await read_by_all(redis_url, queue_name, [*added, tree["id"], *child_ids],
                              flow={"id": tree["id"], "queueName": queue_name})
    oracle = reads[ORACLE]

    # -- what Node 6.7.0 reports: the jobs ran as their options say, under the Python worker ------
    jobs = oracle["jobs"]
    assert oracle["counts"] == {**dict.fromkeys(ALL_STATES, 0), "completed": total}
    assert failures == [retry_id, retry_id]
    for i, job_id in enumerate(plain_ids):
        assert (jobs[job_id]["state"], jobs[job_id]["returnvalue"]) == ("completed", {"py": {"n": i, "s": "é✓"}})
    retried = jobs[retry_id]
    assert (retried["state"], retried["attemptsMade"], retried["returnvalue"]) == ("completed", 3, {"ok": True})
    assert len(retried["stacktrace"]) == 2 and "failing on purpose" in retried["stacktrace"][0]
    later = jobs[later_id]
    assert later["state"] == "completed" and later["processedOn"] >= later["timestamp"] + 700
    parent_values = {f"bull:{queue_name}:{cid}": {"py": {"c": i}} for i, cid in enumerate(child_ids)}
    assert jobs[tree["id"]]["returnvalue"]["children"] == parent_values
    assert oracle["childrenValues"] == parent_values
    assert oracle["flow"]["state"] == "completed"
    assert sorted(c["id"] for c in oracle["flow"]["children"]) == sorted(child_ids)
    beats = [j for j in jobs.values() if j["repeatJobKey"] == "beat"]
    assert len(beats) == 3 and {b["state"] for b in beats} == {"completed"}
    assert all((b["name"], b["data"]) == ("beat", {"s": 1}) for b in beats)

    # -- every other release reports the same; 5.x's default counts still carry "paused" ----------
    for pkg in RELEASES:
        assert reads[pkg]["jobs"] == oracle["jobs"], pkg
        assert reads[pkg]["counts"] == oracle["counts"], pkg
        assert reads[pkg]["completed"] == oracle["completed"], pkg
        assert reads[pkg]["flow"] == oracle["flow"], pkg
        assert reads[pkg]["childrenValues"] == oracle["childrenValues"], pkg
        assert reads[pkg]["schedulers"] == oracle["schedulers"], pkg
    assert reads["bullmq60"]["defaultCounts"] == oracle["defaultCounts"]
    assert reads["bullmq5"]["defaultCounts"] == {**oracle["defaultCounts"], "paused": 0}
    # ... and so do we
    assert py_counts == oracle["counts"]
    assert py_default_counts == oracle["defaultCounts"]
    assert py_schedulers == [python_form(s) for s in oracle["schedulers"]]


async def _done(queue: Queue, total: int) -> bool:
    counts = await queue.get_job_counts("completed", "delayed", "wait", "active")
    return counts == {"completed": total, "delayed": 0, "wait": 0, "active": 0}


# -- a mixed fleet: four producers, four workers, one queue ---------------------------------------
def producer_batch(tag: str) -> list[dict[str, Any]]:
    """What each producer adds to the mixed queue: plain jobs, a retried job, a delayed job."""
    slow = {"behave": {"sleepMs": 30}}
    return [*({"name": "plain", "data": {"from": tag, "i": i, **slow}} for i in range(4)),
            {"name": "retry", "data": {"from": tag, "behave": {"failTimes": 1}},
             "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 100}}},
            {"name": "later", "data": {"from": tag}, "opts": {"delay": 300}}]


SCHEDULER_LIMIT = 2


def scheduler_of(tag: str) -> list[Any]:
    return [f"beat-{tag}", {"every": 250, "limit": SCHEDULER_LIMIT}, {"name": "beat", "data": {"from": tag}}]


async def test_a_mixed_fleet_completes_every_job_exactly_once(redis_url: str, queue_name: str, redis: Any) -> None:
    tags = [*RELEASES, "python"]
    total = len(tags) * (len(producer_batch("x")) + SCHEDULER_LIMIT)
    python_completed: list[str] = []
    async with Queue(queue_name, connection=redis_url) as queue:
        worker = Worker(queue_name, fleet_processor, connection=redis_url, drain_delay=0.5)
        worker.on("completed", lambda job: python_completed.append(str(job.id)))
        async with running(worker), \
                fleet_worker("bullmq5", redis_url, queue_name, untilCompleted=total, add=producer_batch("bullmq5"),
                             schedulers=[scheduler_of("bullmq5")]) as node5, \
                fleet_worker("bullmq60", redis_url, queue_name, untilCompleted=total, add=producer_batch("bullmq60"),
                             schedulers=[scheduler_of("bullmq60")]) as node60, \
                fleet_worker(ORACLE, redis_url, queue_name, untilCompleted=total, add=producer_batch(ORACLE),
                             schedulers=[scheduler_of(ORACLE)]) as node67:
            py_ids = [str((await queue.add(j["name"], j["data"], **j.get("opts", {}))).id)
                      for j in producer_batch("python")]
            sid, every, template = scheduler_of("python")
            await queue.upsert_job_scheduler(sid, every, template=template)
            results = dict(zip(RELEASES, await asyncio.gather(node5.result(), node60.result(), node67.result())))
            await eventually(lambda: _done(queue, total), timeout=60, what=f"{total} jobs completed, none left")
        counts = await queue.get_job_counts(*ALL_STATES)

    by_worker = {**{pkg: r["completed"] for pkg, r in results.items()}, "python": python_completed}
    for pkg, result in results.items():
        assert (result["timedOut"], result["errors"]) == (False, []), pkg
    ran = Counter(job_id for ids in by_worker.values() for job_id in ids)
    completed_set = set(await redis.zrange(f"bull:{queue_name}:completed", 0, -1))
    assert len(completed_set) == total
    assert ran == Counter({job_id: 1 for job_id in completed_set})  # each job completed once, by one worker
    completed_events = Counter(fields["jobId"] for _, fields in await redis.xrange(f"bull:{queue_name}:events")
                               if fields.get("event") == "completed")
    assert completed_events == ran
    added = {job_id for r in results.values() for job_id in r["added"]} | set(py_ids)
    assert len(added) == len(tags) * len(producer_batch("x")) and added <= completed_set
    assert counts == {**dict.fromkeys(ALL_STATES, 0), "completed": total}  # nothing stuck, nothing failed for good

    reads = await read_by_all(redis_url, queue_name)
    jobs = reads[ORACLE]["jobs"]
    for tag, ids in by_worker.items():  # the worker that reported a job is the one whose return value is stored
        assert all(jobs[job_id]["returnvalue"]["by"] == tag for job_id in ids), tag
    for tag in tags:  # each producer's jobs, its retried one and each scheduler's iterations: all there
        mine = [j for j in jobs.values() if j["data"]["from"] == tag]
        assert Counter(j["name"] for j in mine) == {"plain": 4, "retry": 1, "later": 1, "beat": SCHEDULER_LIMIT}, tag
        assert [j["attemptsMade"] for j in mine if j["name"] == "retry"] == [2], tag
    for pkg in RELEASES:
        assert reads[pkg]["counts"] == reads[ORACLE]["counts"] and reads[pkg]["jobs"] == jobs, pkg


# -- where the releases do not mix ------------------------------------------------------------------
# Pausing. BullMQ 5 pauses by moving the `wait` list to a `paused` list and adds to `paused` while
# the meta says paused; BullMQ 6 keeps paused jobs in `wait` (only the meta flag changes), still
# reads a `paused` list and moves it back on resume. 5's resume RENAMEs `paused` over `wait`.
async def lists(redis: Any, queue_name: str) -> tuple[list[str], list[str]]:
    return (await redis.lrange(f"bull:{queue_name}:wait", 0, -1),
            await redis.lrange(f"bull:{queue_name}:paused", 0, -1))


async def test_a_queue_paused_by_5x_holds_its_jobs_in_a_paused_list_that_6x_releases(
        redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        ids = [str((await queue.add("held", {"i": i})).id) for i in range(3)]
        await fleet(on("bullmq5", redis_url, queue_name, "call", method="pause"))
        assert await lists(redis, queue_name) == ([], list(reversed(ids)))  # LPUSHed: newest first

        reads = await read_by_all(redis_url, queue_name, ids)
        oracle = reads[ORACLE]
        assert oracle["counts"] == {**dict.fromkeys(ALL_STATES, 0), "paused": 3}
        assert {oracle["jobs"][i]["state"] for i in ids} == {"waiting"}
        # 6.x's default counts have no "paused": the three held jobs are in none of them
        assert oracle["defaultCounts"] == dict.fromkeys(
            ["active", "completed", "delayed", "failed", "prioritized", "waiting", "waiting-children"], 0)
        assert reads["bullmq60"]["defaultCounts"] == oracle["defaultCounts"]
        assert reads["bullmq5"]["defaultCounts"] == {**oracle["defaultCounts"], "paused": 3}
        for pkg in RELEASES:
            assert (reads[pkg]["counts"], reads[pkg]["jobs"]) == (oracle["counts"], oracle["jobs"]), pkg
        assert await queue.get_job_counts() == oracle["defaultCounts"]
        assert await queue.get_job_counts(*ALL_STATES) == oracle["counts"]
        assert [await queue.get_job_state(i) for i in ids] == ["waiting"] * 3
        assert await queue.is_paused()

        await queue.resume()  # 6.7's script: the paused list goes back to wait, in order
        assert await lists(redis, queue_name) == (list(reversed(ids)), [])
        async with running(Worker(queue_name, behave, connection=redis_url, drain_delay=0.5)):
            await eventually(lambda: _done(queue, 3), timeout=60, what="the three released jobs to complete")


@pytest.mark.parametrize("resumer", [*RELEASES, "python"])
async def test_5x_adds_to_a_queue_paused_by_6x_go_to_the_paused_list_and_a_5x_resume_drops_the_waiting_jobs(
        redis_url: str, queue_name: str, redis: Any, resumer: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        before = [str((await queue.add("before", {"i": i})).id) for i in range(2)]
        await queue.pause()  # 6.7's pause: the jobs stay in wait
        assert await lists(redis, queue_name) == (list(reversed(before)), [])
        [during] = (await fleet(on("bullmq5", redis_url, queue_name, "add", jobs=[{"name": "during"}])))[0]
        assert await lists(redis, queue_name) == (list(reversed(before)), [during])  # 5.x: into `paused`
        if resumer == "python":
            await queue.resume()
        else:
            await fleet(on(resumer, redis_url, queue_name, "call", method="resume"))
        if resumer == "bullmq5":  # 5.x RENAMEs its paused list over wait: what was waiting is in no list now
            lost, waiting = before, [during]
        else:  # 6.x (and so we) append the paused list to wait
            lost, waiting = [], [*reversed(before), during]
        assert await lists(redis, queue_name) == (waiting, [])

        order: list[str] = []
        worker = Worker(queue_name, behave, connection=redis_url, drain_delay=0.5)  # concurrency 1: one at a time
        worker.on("completed", lambda job: order.append(str(job.id)))
        async with running(worker):
            await eventually(lambda: _done(queue, len(waiting)), timeout=60, what=f"{len(waiting)} jobs to complete")
        assert order == list(reversed(waiting))  # workers take wait's tail: the job added while paused comes first
        oracle = (await read_by_all(redis_url, queue_name, [*before, during]))[ORACLE]
        assert {i: oracle["jobs"][i]["state"] for i in [*before, during]} == {
            **{i: "completed" for i in [*before, during]}, **{i: "unknown" for i in lost}}
        for job_id in lost:  # the hash is still there, in no list: no worker will ever take it
            assert oracle["jobs"][job_id]["name"] == "before"
            assert await queue.get_job_state(job_id) == "unknown"


# Repeatable jobs. 6.x removed them (Queue.add's `repeat`): a 6.x or Python worker advances a repeat
# only as a job scheduler. 5.81's repeatable jobs are keyed by a hash of their options, which 6.x
# takes for a scheduler id; an older 5.x key of the shape name:id:endDate:tz:every is refused.
@pytest.mark.parametrize("worker", ["bullmq60", ORACLE, "python"])
async def test_a_5x_repeatable_job_keeps_repeating_under_6x_and_python_workers(
        redis_url: str, queue_name: str, worker: str) -> None:
    [ids] = await fleet(on("bullmq5", redis_url, queue_name, "add",
                           jobs=[{"name": "tick", "data": {"t": 1}, "opts": {"repeat": {"every": 300}}}]))
    key = ids[0].split(":")[1]  # repeat:<md5 of the options>:<millis>
    async with Queue(queue_name, connection=redis_url) as queue:
        if worker == "python":
            async with running(Worker(queue_name, behave, connection=redis_url, drain_delay=0.5)):
                await eventually(lambda: _at_least(queue, 3), timeout=60, what="three iterations")
        else:
            async with fleet_worker(worker, redis_url, queue_name, untilCompleted=3) as node_worker:
                result = await node_worker.result()
            assert (result["timedOut"], result["errors"]) == (False, [])
        await eventually(lambda: _next_waits(queue), timeout=30, what="the next iteration to be scheduled")
        py_schedulers = await queue.get_job_schedulers()
    reads = await read_by_all(redis_url, queue_name)
    [scheduler] = reads[ORACLE]["schedulers"]
    assert scheduler["key"] == key and scheduler["every"] == 300
    # each iteration taken by a 6.x or Python worker upserted the 5.x repeatable job as a scheduler
    assert scheduler["iterationCount"] == reads[ORACLE]["counts"]["completed"] >= 3
    assert all(j["repeatJobKey"] == key for j in reads[ORACLE]["jobs"].values())
    for pkg in RELEASES:
        assert reads[pkg]["schedulers"] == reads[ORACLE]["schedulers"], pkg
    assert py_schedulers == [python_form(scheduler)]


LEGACY_KEY = "tick::::300"  # name:id:endDate:tz:every, the key BullMQ 5 used before hashing it
LEGACY_ERROR = (f'Failed to add repeatable job for next iteration: Legacy repeatable job metadata is not '
                f'supported in BullMQ v6 (key: "{LEGACY_KEY}")')


@pytest.mark.parametrize("worker", [*RELEASES, "python"])
async def test_a_legacy_keyed_repeatable_job_stops_at_the_first_6x_or_python_worker(
        redis_url: str, queue_name: str, redis: Any, worker: str) -> None:
    # the state an older BullMQ 5 left: its repeat set holds the unhashed key, which 5.81 keeps using
    await redis.zadd(f"bull:{queue_name}:repeat", {LEGACY_KEY: 1})
    [ids] = await fleet(on("bullmq5", redis_url, queue_name, "add",
                           jobs=[{"name": "tick", "data": {"t": 1}, "opts": {"repeat": {"every": 300}}}]))
    wanted = 2 if worker == "bullmq5" else 1
    async with Queue(queue_name, connection=redis_url) as queue:
        if worker == "python":
            errors: list[str] = []
            py_worker = Worker(queue_name, behave, connection=redis_url, drain_delay=0.5)
            py_worker.on("error", lambda err: errors.append(str(err)))
            async with running(py_worker):
                await eventually(lambda: _at_least(queue, 1), timeout=60, what="the first iteration")
        else:
            async with fleet_worker(worker, redis_url, queue_name, untilCompleted=wanted) as node_worker:
                result = await node_worker.result()
            errors = result["errors"]
            assert not result["timedOut"]
        counts = await queue.get_job_counts("completed", "delayed", "wait", "active")
        py_schedulers = await queue.get_job_schedulers()
    if worker == "bullmq5":  # 5.x goes on: each taken iteration makes the next
        assert errors == [] and counts["completed"] >= 2 and counts["delayed"] == 1
    else:  # the next iteration is made when a job is taken: none was, none ever will be
        assert counts == {"completed": 1, "delayed": 0, "wait": 0, "active": 0}
        assert [e.split(". Migrate")[0] for e in errors] == [LEGACY_ERROR]
    oracle = (await read_by_all(redis_url, queue_name))[ORACLE]
    [scheduler] = oracle["schedulers"]  # listed by every release, its "next" never moving again in 6.x
    assert scheduler["key"] == LEGACY_KEY
    assert py_schedulers == [python_form(scheduler)]
    if worker != "bullmq5":
        assert scheduler["next"] == int(ids[0].rsplit(":", 1)[1])  # the first iteration's time, for good


async def test_5x_debounce_is_read_as_deduplication_but_its_debounced_event_is_5x_only(
        redis_url: str, queue_name: str, redis: Any) -> None:
    [first, second] = await fleet(*(on("bullmq5", redis_url, queue_name, "add",
                                       jobs=[{"name": "d", "opts": {"debounce": {"id": "dd"}}}]) for _ in range(2)))
    assert first == second  # deduplicated by 5.x
    async with Queue(queue_name, connection=redis_url) as queue:
        assert str((await queue.add("d", {}, deduplication={"id": "dd"})).id) == first[0]  # and by us
        job = await queue.get_job(first[0])
        assert job is not None and job.opts["deduplication"] == {"id": "dd"} and job.deduplication_id == "dd"
    with pytest.raises(NodeError, match="Debounce option has been removed. Use deduplication option instead"):
        await fleet(on(ORACLE, redis_url, queue_name, "call", method="add", args=["d", {}, {"debounce": {"id": "dd"}}]))
    oracle = (await read_by_all(redis_url, queue_name, first))[ORACLE]
    assert oracle["jobs"][first[0]]["opts"] == {"attempts": 0, "deduplication": {"id": "dd"}}
    events = [fields["event"] for _, fields in await redis.xrange(f"bull:{queue_name}:events")]
    # 5.x's duplicate wrote "debounced" and "deduplicated"; ours (6.7's script) only "deduplicated"
    assert events == ["added", "waiting", "debounced", "deduplicated", "deduplicated"]


async def test_each_release_writes_its_own_version_in_meta_and_none_refuses_the_others(
        redis_url: str, queue_name: str, redis: Any) -> None:
    versions = pinned_versions()
    seen = []
    for pkg in RELEASES:
        await fleet(on(pkg, redis_url, queue_name, "add", jobs=[{"name": pkg}]))
        seen.append(await redis.hget(f"bull:{queue_name}:meta", "version"))
    assert seen == [f"bullmq:{versions[pkg]}" for pkg in RELEASES]
    async with Queue(queue_name, connection=redis_url) as queue:
        await queue.add("python", {})
        assert (await queue.get_version() or "").startswith("bullmq-compat:")
        async with running(Worker(queue_name, behave, connection=redis_url, drain_delay=0.5)):
            await eventually(lambda: _done(queue, 4), timeout=60, what="the four jobs to complete")
    reads = await read_by_all(redis_url, queue_name)
    assert {pkg: r["counts"]["completed"] for pkg, r in reads.items()} == dict.fromkeys(RELEASES, 4)


async def _at_least(queue: Queue, n: int) -> bool:
    return await completed_count(queue) >= n


async def _next_waits(queue: Queue) -> bool:
    counts = await queue.get_job_counts("delayed", "wait", "active")
    return counts["delayed"] + counts["wait"] == 1 and counts["active"] == 0
