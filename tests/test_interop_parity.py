"""Parity calls whose answers cross languages, compared with Node BullMQ 6.7 on the same Redis:
the Prometheus text of one queue state, deduplication ``reschedule`` decisions, and the getters
a Node dashboard reads from state Python made (and the other way round)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bullmq_compat import FlowProducer, Job, Queue, Worker
from tests.helpers import finish_by_hand
from tests.node import node
from tests.node_scripts import run_script
from tests.test_interop_dedup import add, final_state, run_python, same_results

pytestmark = pytest.mark.node


def _by_id(item: dict) -> str:
    return str(item["id"])


async def _make_state(queue: Queue, redis_url: str) -> None:
    """Waiting, prioritized, delayed, completed and failed jobs, with metrics recorded."""
    for i in range(3):
        await queue.add("w", {"i": i})
    await queue.add("p", {}, priority=4)
    await queue.add("d", {}, delay=600_000)
    worker = Worker(queue.name, connection=redis_url, metrics={"max_data_points": 60})
    await finish_by_hand(worker, ("ok", "ok", "fail"))


async def test_prometheus_text_is_nodes(redis_url: str, queue_name: str) -> None:
    name = f'{queue_name}-we"ird\\name\nline'
    async with Queue(name, connection=redis_url) as queue:
        await _make_state(queue, redis_url)
        assert (await queue.get_metrics("completed"))["meta"]["count"] == 2
        for labels in (None, {}, {"env": 'pr"od\\1', "n": 3, "on": True, "multi": "a\nb"}):
            ours = await queue.export_prometheus_metrics(labels)
            theirs = await node("queueCall", redis=redis_url, queue=name, method="exportPrometheusMetrics",
                                args=[] if labels is None else [labels])
            assert ours == theirs
        assert 'state="completed"' in ours and "bullmq_job_completed_total" in ours


async def test_getters_read_the_same_from_both_sides(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _make_state(queue, redis_url)
        await queue.set_global_rate_limit(7, 2000)
        await queue.set_global_concurrency(3)

        async def call(method: str, *args: Any) -> Any:
            return await node("queueCall", redis=redis_url, queue=queue_name, method=method, args=list(args))

        assert await queue.get_global_rate_limit() == await call("getGlobalRateLimit")
        assert await queue.is_maxed() == await call("isMaxed")
        for getter, method in (("get_waiting_count", "getWaitingCount"), ("get_delayed_count", "getDelayedCount"),
                               ("get_prioritized_count", "getPrioritizedCount"),
                               ("get_completed_count", "getCompletedCount"), ("get_failed_count", "getFailedCount"),
                               ("get_active_count", "getActiveCount"),
                               ("get_waiting_children_count", "getWaitingChildrenCount")):
            assert await getattr(queue, getter)() == await call(method), getter
        node_meta = await call("getMeta")
        ours = await queue.get_meta()
        assert {k: v for k, v in ours.items() if k != "version"} == {k: v for k, v in node_meta.items()
                                                                     if k != "version"}
        # Node wrote its version when its Queue opened; both read the same field
        assert await queue.get_version() == await call("getVersion") == "bullmq:6.7.0"
        assert await queue.remove_global_concurrency() == 1
        assert await call("removeGlobalRateLimit") == 2
        assert await queue.remove_global_rate_limit() == 0


async def test_node_sees_python_rate_limit_and_removal(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await queue.rate_limit(30_000)
        ttl = await node("queueCall", redis=redis_url, queue=queue_name, method="getRateLimitTtl", args=[])
        assert 20_000 < ttl <= 30_000
        assert await node("queueCall", redis=redis_url, queue=queue_name, method="removeRateLimitKey",
                          args=[]) == 1
        assert await queue.remove_rate_limit_key() == 0


# deduplication reschedule (6.3+): a deduplicated add while the kept job is still delayed moves
# that job to the new add's delay; once it is no longer delayed nothing moves
RESCHEDULE = [
    add({"v": 1}, delay=2000, reschedule=True),
    {"sleep": 50}, add({"v": 2}, delay=4000, reschedule=True), {"probe": "k"},
    add({"v": 3}, delay=8000, reschedule=True, ttl=60_000), {"probe": "k"},
    add({"v": 4}, reschedule=True), {"sleep": 50},
    {"take": "t1"}, add({"v": 5}, delay=5000, reschedule=True), {"probe": "k"},
    {"complete": "t1"}, add({"v": 6}, delay=3000, reschedule=True), {"probe": "k"},
]


async def _delays(redis: Any, queue_name: str) -> dict[str, Any]:
    """Each job's stored delay, and how far its delayed score lies after its timestamp."""
    prefix = f"bull:{queue_name}:"
    out = {}
    async for key in redis.scan_iter(match=f"{prefix}*"):
        job_id = key[len(prefix):]
        if job_id.isdigit():
            raw = await redis.hgetall(key)
            score = await redis.zscore(prefix + "delayed", job_id)
            out[job_id] = {"delay": raw.get("delay"), "delayed": score is not None}
    return out


async def test_deduplication_reschedule_decides_as_node(redis_url: str, queue_name: str, redis: Any) -> None:
    py_queue, node_queue = f"{queue_name}-py", f"{queue_name}-node"
    py, nd = await asyncio.gather(
        run_python(redis_url, py_queue, redis, RESCHEDULE),
        run_script("dedup.js", {"redis": redis_url, "queue": node_queue, "steps": RESCHEDULE}))
    same_results(py, nd["results"])
    py_state, node_state = await final_state(redis, py_queue), await final_state(redis, node_queue)
    assert py_state == node_state
    assert await _delays(redis, py_queue) == await _delays(redis, node_queue)
    ids = [r["id"] for r, s in zip(py, RESCHEDULE) if "add" in s]
    # the first five adds keep job 1 (rescheduled while delayed, kept while active); the sixth,
    # after it completed, makes a new job
    assert ids[:5] == ["1"] * 5 and ids[5] != "1"
    delays = await _delays(redis, py_queue)
    assert delays["1"]["delay"] == "0"  # the fourth add rescheduled it to run now
    assert delays[ids[5]] == {"delay": "3000", "delayed": True}


# -- Job shapes: to_json / as_json / from_json against Node's toJSON / asJSON / fromJSON ----------
async def _node_job(redis_url: str, queue_name: str, **request: Any) -> Any:
    return await run_script("parity.js", {"redis": redis_url, "queue": queue_name, **request})


async def test_job_json_shapes_are_nodes(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        plain = await queue.add("plain", {"x": [1, "é"]})
        rich = await queue.add("rich", {"y": None}, attempts=3, backoff=1000, keep_logs=5, priority=2,
                               deduplication={"id": "dd", "ttl": 60_000}, remove_on_complete=True)
        failed = await queue.add("fails", {}, attempts=1)
        done = await queue.add("done", {})
        worker = Worker(queue_name, connection=redis_url)
        try:
            for _ in range(4):
                job = await worker.get_next_job("tok", block=False)
                assert job is not None
                if job.id == failed.id:
                    await job.move_to_failed(ValueError("nope"), "tok")
                elif job.id == done.id:
                    await job.update_progress({"p": 1})
                    await job.move_to_completed({"r": 1}, "tok")
                else:
                    await job.move_to_wait("tok")  # back to waiting, attempts as they are
        finally:
            await worker.close()
        for job_id in (plain.id, rich.id, failed.id, done.id):
            ours = await queue.get_job(str(job_id))
            assert ours is not None
            theirs = await _node_job(redis_url, queue_name, op="job", id=job_id)
            assert ours.to_json() == theirs["toJSON"], job_id
            assert ours.as_json() == theirs["asJSON"], job_id
            assert (ours.queue_name, ours.prefix, await ours.is_waiting_children()) == (
                theirs["queueName"], theirs["prefix"], theirs["isWaitingChildren"])
            # Node's JobJson read back by both sides gives the same job (asJSON has no delay or
            # priority: Node's fromJSON leaves them undefined, ours 0)
            restored = Job.from_json(queue, theirs["asJSON"]).to_json()
            node_restored = await _node_job(redis_url, queue_name, op="fromJSON", json=theirs["asJSON"])
            assert (restored.pop("delay"), restored.pop("priority")) == (0, 0)
            assert "delay" not in node_restored and "priority" not in node_restored
            assert restored == node_restored, job_id


#: odd job hashes, written by hand: Node reads each number with parseInt (rawToJobJson), then
#: Job.fromJSON sets processedOn/finishedOn only when truthy
ODD_HASHES = [
    {"timestamp": "1.5e3", "delay": "NaN", "priority": "", "ats": "2", "atm": "1", "processedOn": "7.9",
     "finishedOn": "x", "stc": "1e999"},
    {"timestamp": "5", "attemptsMade": "0", "atm": "4", "processedOn": "6"},
    {"timestamp": "  0x1A", "delay": "-3", "priority": "+7 days", "ats": "", "stc": "\u00a012", "processedOn": "0",
     "finishedOn": "9007199254740993"},
    {"timestamp": "1_000", "delay": "\u0661\u0662", "priority": "12345678901234567890", "attemptsMade": "",
     "atm": " 3", "finishedOn": "-0"},
]
NUMBERS = ("timestamp", "delay", "priority", "attemptsMade", "attemptsStarted", "stalledCounter", "processedOn",
           "finishedOn")


async def test_odd_job_hashes_read_numbers_as_node_does(redis_url: str, queue_name: str, redis: Any) -> None:
    """Node is the oracle: the same hand-written hashes read by Node's getJob and by ours. Where Node
    reads NaN (JSON null), an int cannot hold it: ours reads 0 (docs/compatibility.md)."""
    async with Queue(queue_name, connection=redis_url) as queue:
        for n, fields in enumerate(ODD_HASHES):
            job_id = f"odd{n}"
            await redis.hset(f"bull:{queue_name}:{job_id}", mapping={"name": "n", "data": "{}", "opts": "{}", **fields})
            theirs = (await _node_job(redis_url, queue_name, op="job", id=job_id))["toJSON"]
            ours = await queue.get_job(job_id)
            assert ours is not None
            mine = ours.to_json()
            for key in NUMBERS:
                expected = theirs.get(key)
                if expected is None and key in theirs:  # NaN
                    expected = 0
                assert mine.get(key) == expected, (job_id, key, fields, theirs)


async def test_dependencies_page_is_nodes(redis_url: str, queue_name: str) -> None:
    async with FlowProducer(connection=redis_url) as flows:
        tree = await flows.add({"name": "parent", "queue_name": queue_name, "children": [
            {"name": f"c{i}", "queue_name": queue_name, "data": {"i": i}} for i in range(3)]})
    async with Queue(queue_name, connection=redis_url) as queue:
        worker = Worker(queue_name, connection=redis_url)
        try:
            job = await worker.get_next_job("t", block=False)
            assert job is not None
            await job.move_to_completed({"from": job.name}, "t")
        finally:
            await worker.close()
        for kind in ("processed", "pending"):
            ours = await queue.get_dependencies(str(tree.job.id), kind, 0, -1)
            theirs = await _node_job(redis_url, queue_name, op="dependencies", id=tree.job.id, type=kind,
                                     start=0, end=-1)
            assert sorted(ours["items"], key=_by_id) == sorted(theirs["items"], key=_by_id)
            assert ours["total"] == theirs["total"]
            assert sorted(ours["jobs"], key=lambda j: j["name"]) == sorted(theirs["jobs"], key=lambda j: j["name"])


async def test_job_helpers_agree_with_node(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        first = await queue.add("j", {}, deduplication={"id": "k"})
        await queue.remove_deduplication_key("k")
        second = await queue.add("j", {}, deduplication={"id": "k"})
        # the key points at the second job: neither side's first job may remove it
        assert await first.remove_deduplication_key() is False
        assert await _node_job(redis_url, queue_name, op="removeDeduplicationKey", id=first.id) == {"removed": False}
        assert await _node_job(redis_url, queue_name, op="removeDeduplicationKey", id=second.id) == {"removed": True}
        assert await second.remove_deduplication_key() is False
        for row in "abcd":
            await second.log(row)
        assert await _node_job(redis_url, queue_name, op="clearLogs", id=second.id, keep=3) == {
            "logs": {"logs": ["b", "c", "d"], "count": 3}}
        await second.clear_logs(keep=1)
        assert await queue.get_job_logs(str(second.id)) == {"logs": ["d"], "count": 1}


async def test_workers_and_queue_events_listed_alike(redis_url: str, queue_name: str) -> None:
    from bullmq_compat import QueueEvents
    from tests.helpers import wait_until

    async with Queue(queue_name, connection=redis_url) as queue:
        events = QueueEvents(queue_name, connection=redis_url)
        try:
            async with Worker(queue_name, lambda job: None, connection=redis_url, name="py-w"):
                await events.wait_until_ready()
                await wait_until(lambda: queue.get_workers_count(), what="the worker listed")
                await wait_until(lambda: queue.get_queue_events(), what="QueueEvents listed")

                async def call(method: str) -> Any:
                    return await node("queueCall", redis=redis_url, queue=queue_name, method=method, args=[])

                assert await call("getWorkersCount") == await queue.get_workers_count() == 1
                theirs = await call("getQueueEvents")
                ours = await queue.get_queue_events()
                assert [(e["name"], e["rawname"]) for e in theirs] == [(e["name"], e["rawname"]) for e in ours]
        finally:
            await events.close()
