"""QueueEvents, QueueEventsProducer, Job.wait_until_finished and the queue's metrics and
events-stream helpers, Python only (issue #5). Node interop: tests/test_interop_events.py."""
from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from typing import Any, Callable

import pytest
import redis.asyncio as aioredis

from bullmq_compat import (
    InvalidArgument,
    Job,
    JobFailed,
    JobNotFound,
    JobWaitTimeout,
    Queue,
    QueueEvents,
    QueueEventsProducer,
    UnrecoverableError,
    Worker,
)
from tests._redis_server import RedisServer
from tests.helpers import EventRecorder, wait_until

FAST = {"drain_delay": 0.5}
STREAM_ID = re.compile(r"^\d+-\d+$")


class Recorder(EventRecorder):
    """Every event of a QueueEvents as (name, listener args)."""

    def fields(self, name: str) -> list[dict[str, Any]]:
        return [args[0] for args in self.of(name)]

    async def wait_for(self, name: str, match: Callable[[dict[str, Any]], bool] = lambda f: True,
                       timeout: float = 10.0) -> dict[str, Any]:
        def found() -> Any:
            for args in self.of(name):
                if name == "drained" or match(args[0]):
                    return [args[0] if name != "drained" else {"id": args[0]}]  # truthy even for {}
            return None
        return (await wait_until(found, timeout, f"event {name!r}"))[0]


async def process(job: Job) -> Any:
    kind = job.data.get("kind")
    if kind == "progress":
        await job.update_progress({"pct": 50})
        return {"r": 1}
    if kind == "fail":
        raise RuntimeError("boom")
    if kind == "unrecoverable":
        raise UnrecoverableError("never")
    if kind == "slow":
        await asyncio.sleep(job.data.get("seconds", 0.3))
    return job.data.get("return", "ok")


# -- the events and their fields -------------------------------------------------------------------
async def test_every_event_with_nodes_fields(redis_url: str, queue_name: str) -> None:
    names = ("added", "waiting", "active", "progress", "completed", "failed", "delayed", "stalled",
             "removed", "duplicated", "deduplicated", "retries-exhausted", "drained", "paused",
             "resumed", "cleaned")
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            Queue(queue_name, connection=redis_url) as queue:
        rec = Recorder(qe, *names)
        # producer-side events
        plain = await queue.add("plain", {"kind": "progress"})
        await queue.add("dup", {}, job_id="dup-1")
        await queue.add("dup", {}, job_id="dup-1")
        first = await queue.add("dedup", {}, deduplication={"id": "d1"})
        await queue.add("dedup", {}, deduplication={"id": "d1"})
        delayed = await queue.add("later", {}, delay=60000)
        await queue.remove(str(delayed.id))
        await queue.pause()
        await queue.resume()
        failing = await queue.add("fails", {"kind": "fail"}, attempts=1)

        assert await rec.wait_for("added", lambda f: f["jobId"] == plain.id) == {"jobId": plain.id, "name": "plain"}
        assert await rec.wait_for("waiting", lambda f: f["jobId"] == plain.id) == {"jobId": plain.id}
        assert await rec.wait_for("duplicated") == {"jobId": "dup-1"}
        dedup = await rec.wait_for("deduplicated")
        assert dedup["jobId"] == first.id and dedup["deduplicationId"] == "d1"
        assert set(dedup) == {"jobId", "deduplicationId", "deduplicatedJobId"}
        got = await rec.wait_for("delayed", lambda f: f["jobId"] == delayed.id)
        assert isinstance(got["delay"], int) and got["delay"] >= delayed.timestamp + 60000 - 5  # due time, a number
        assert await rec.wait_for("removed", lambda f: f["jobId"] == delayed.id) == {
            "jobId": delayed.id, "prev": "delayed"}
        assert await rec.wait_for("paused") == {}
        assert await rec.wait_for("resumed") == {}

        # worker-side events
        async with Worker(queue_name, process, connection=redis_url, **FAST):
            done = await rec.wait_for("completed", lambda f: f["jobId"] == plain.id)
            assert done == {"jobId": plain.id, "returnvalue": {"r": 1}, "prev": "active"}  # parsed JSON
            assert await rec.wait_for("active", lambda f: f["jobId"] == plain.id) == {
                "jobId": plain.id, "prev": "waiting"}
            assert await rec.wait_for("progress", lambda f: f["jobId"] == plain.id) == {
                "jobId": plain.id, "data": {"pct": 50}}
            assert await rec.wait_for("failed", lambda f: f["jobId"] == failing.id) == {
                "jobId": failing.id, "failedReason": "boom", "prev": "active"}
            assert await rec.wait_for("retries-exhausted", lambda f: f["jobId"] == failing.id) == {
                "jobId": failing.id, "attemptsMade": "1"}
            await rec.wait_for("drained")
        removed_ids = await queue.clean(0, 0, "completed")
        assert await rec.wait_for("cleaned") == {"count": str(len(removed_ids))}  # a string, as in Node

        # stalled: a job taken by hand whose lock runs out
        stalled = await queue.add("stalls", {})
        taker = Worker(queue_name, None, connection=redis_url, lock_duration=200, stalled_interval=50,
                       skip_stalled_check=True, skip_lock_renewal=True)
        try:
            assert (await taker.get_next_job("tok", block=False)).id == stalled.id
            check = f"bull:{queue_name}:stalled-check"  # the worker above checked moments ago
            await queue.client.delete(check)
            await taker.start_stalled_check()
            await asyncio.sleep(0.35)
            await queue.client.delete(check)
            assert await taker.start_stalled_check() == [stalled.id]
        finally:
            await taker.close()
        assert await rec.wait_for("stalled", lambda f: f["jobId"] == stalled.id) == {"jobId": stalled.id}

    # listener arguments: (fields, id), except drained: (id,); ids are the stream's, in order
    for name, args in rec.seen:
        if name == "drained":
            assert len(args) == 1 and STREAM_ID.match(args[0])
        else:
            assert len(args) == 2 and isinstance(args[0], dict) and STREAM_ID.match(args[1]), (name, args)
    ids = [tuple(map(int, (args[-1]).split("-"))) for _, args in rec.seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert qe.last_event_id == rec.seen[-1][1][-1]


async def test_per_job_events_and_listener_arity(redis_url: str, queue_name: str) -> None:
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            Queue(queue_name, connection=redis_url) as queue:
        only_fields: list[Any] = []
        per_job: list[Any] = []
        qe.on("completed", lambda args: only_fields.append(args))  # takes one: gets the fields only
        job = await queue.add("x", {"return": [1, "two", None]})
        qe.on(f"completed:{job.id}", lambda args, event_id: per_job.append((args, event_id)))
        async with Worker(queue_name, process, connection=redis_url, **FAST):
            await wait_until(lambda: per_job, what="completed:<id>")
        assert per_job[0][0] == {"jobId": job.id, "returnvalue": [1, "two", None], "prev": "active"}
        assert only_fields == [per_job[0][0]]


async def test_async_iteration_and_close(redis_url: str, queue_name: str) -> None:
    qe = QueueEvents(queue_name, connection=redis_url)
    got: list[tuple[str, dict[str, Any], str]] = []

    async def consume() -> None:
        async for event in qe:
            got.append(event)

    async with Queue(queue_name, connection=redis_url) as queue:
        consumer = asyncio.ensure_future(consume())
        await qe.wait_until_ready()
        job = await queue.add("it", {"a": 1})
        await wait_until(lambda: len(got) >= 2, what="two events")
        assert got[0][:2] == ("added", {"jobId": job.id, "name": "it"})
        assert got[1][:2] == ("waiting", {"jobId": job.id})
        assert STREAM_ID.match(got[0][2])
        await qe.close()
        await asyncio.wait_for(consumer, 5)  # iteration ends when the QueueEvents closes
        assert not qe.running
        # a QueueEvents replaying the stream from its start sees the same events with the same ids
        # (iterated at once: nothing is read before the iteration is registered)
        replay = QueueEvents(queue_name, connection=redis_url, last_event_id="0")
        again: list[Any] = []
        try:
            async for event in replay:
                again.append(event)
                if len(again) == 2:
                    break
        finally:
            await replay.close()
        assert again == got[:2]


async def test_autorun_off_run_and_connection_name(redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    qe = QueueEvents(queue_name, connection=redis_url, autorun=False, blocking_timeout=200)
    seen: list[Any] = []
    qe.on("added", lambda args: seen.append(args))
    runner = asyncio.ensure_future(qe.run())
    await qe.wait_until_ready()
    with pytest.raises(InvalidArgument, match="already running"):
        await qe.run()
    await asyncio.sleep(0.5)  # a few empty 200 ms reads go by
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {})
        await wait_until(lambda: seen, what="added")
        assert seen == [{"jobId": job.id, "name": "n"}]
    # named as Node names a QueueEvents connection: <prefix>:<base64(queue)>:qe
    name = f"bull:{base64.b64encode(queue_name.encode()).decode()}:qe"
    clients = await redis.client_list()
    assert [c["name"] for c in clients if c["name"] == name] == [name]
    await qe.close()
    await asyncio.wait_for(runner, 5)  # run() returns after close()

    async def gone() -> bool:  # Redis sees the closed socket when it next reads it: soon, not at once
        return name not in [c["name"] for c in await redis.client_list()]
    await wait_until(gone, 15, "Redis to drop the closed QueueEvents connection")


# -- producer of custom events ---------------------------------------------------------------------
async def test_queue_events_producer(redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            QueueEventsProducer(queue_name, connection=redis_url) as producer:
        rec = Recorder(qe, "digest-sent")
        entry_id = await producer.publish_event(
            {"eventName": "digest-sent", "count": 12, "ok": True, "who": "bob", "none": None})
        got = await rec.wait_for("digest-sent")
        assert got == {"count": "12", "ok": "true", "who": "bob", "none": ""}  # stream fields: strings
        assert rec.of("digest-sent")[0][1] == entry_id
        with pytest.raises(InvalidArgument, match="eventName"):
            await producer.publish_event({"count": 1})
        for _ in range(300):
            await producer.publish_event({"eventName": "many"}, max_events=10)
        assert await redis.xlen(f"bull:{queue_name}:events") < 250  # trimmed (approximately)


# -- wait_until_finished --------------------------------------------------------------------------
async def test_wait_until_finished(redis_url: str, queue_name: str) -> None:
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            Queue(queue_name, connection=redis_url) as queue:
        ok = await queue.add("ok", {"kind": "slow", "seconds": 0.2, "return": {"v": [1, 2]}})
        bad = await queue.add("bad", {"kind": "fail"}, attempts=1)
        never = await queue.add("never", {}, delay=60000)
        waits = [asyncio.ensure_future(ok.wait_until_finished(qe)),
                 asyncio.ensure_future(bad.wait_until_finished(qe, timeout=20000))]
        await asyncio.sleep(0.1)
        async with Worker(queue_name, process, connection=redis_url, **FAST):
            assert await asyncio.wait_for(waits[0], 10) == {"v": [1, 2]}
            with pytest.raises(JobFailed, match="^boom$") as failed:
                await asyncio.wait_for(waits[1], 10)
            assert failed.value.failed_reason == "boom" and failed.value.job_id == bad.id

        # already finished: answered at once from the job's state, without any event
        fresh = QueueEvents(queue_name, connection=redis_url)
        try:
            start = time.monotonic()
            assert await ok.wait_until_finished(fresh) == {"v": [1, 2]}
            with pytest.raises(JobFailed, match="boom"):
                await bad.wait_until_finished(fresh)
            assert time.monotonic() - start < 10  # at once: no event is coming
        finally:
            await fresh.close()

        # timeout (ms), as Node's ttl
        start = time.monotonic()
        with pytest.raises(JobWaitTimeout, match="timed out") as timed_out:
            await never.wait_until_finished(qe, timeout=300)
        assert isinstance(timed_out.value, TimeoutError)
        assert 0.25 < time.monotonic() - start < 10
        assert qe.listener_count(f"completed:{never.id}") == 0  # listeners removed

        async with QueueEvents(f"{queue_name}-other", connection=redis_url) as elsewhere:
            with pytest.raises(InvalidArgument, match="QueueEvents of the job's queue"):
                await never.wait_until_finished(elsewhere)

        # a job that does not exist (any more)
        ghost = Job(queue, "ghost", {}, id="no-such-job")
        with pytest.raises(JobNotFound, match="Missing key"):
            await ghost.wait_until_finished(qe, timeout=1000)


async def test_wait_until_finished_does_not_miss_a_fast_finish(redis_url: str, queue_name: str) -> None:
    """Jobs finishing while the waits subscribe: each wait returns (from the event or the state)."""
    async with QueueEvents(queue_name, connection=redis_url) as qe, \
            Queue(queue_name, connection=redis_url) as queue:
        jobs = await queue.add_bulk([{"name": "n", "data": {"return": i}} for i in range(30)])
        async with Worker(queue_name, process, connection=redis_url, concurrency=10, **FAST):
            results = []
            for job in jobs:
                results.append(await asyncio.wait_for(job.wait_until_finished(qe, timeout=10000), 10))
                await asyncio.sleep(0.003)
        assert results == list(range(30))


async def test_wait_until_finished_ends_when_queue_events_closes(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        qe = QueueEvents(queue_name, connection=redis_url)
        job = await queue.add("w", {})
        waiting = asyncio.ensure_future(job.wait_until_finished(qe))
        await asyncio.sleep(0.2)
        await qe.close()
        with pytest.raises(Exception, match="QueueEvents closed"):
            await asyncio.wait_for(waiting, 5)


# -- Redis restart --------------------------------------------------------------------------------
async def test_resumes_after_redis_restart(queue_name: str, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(extra_args=("--appendonly", "yes")).start()
    try:
        qe = QueueEvents(queue_name, connection=server.url, blocking_timeout=1000)
        rec = Recorder(qe, "added")
        await qe.wait_until_ready()
        async with Queue(queue_name, connection=server.url) as queue:
            before = await queue.add("before", {})
            await rec.wait_for("added", lambda f: f["jobId"] == before.id)

        caplog.set_level(logging.INFO, logger="bullmq_compat.queue_events")
        assert server.proc is not None
        server.proc.terminate()  # same data dir and port: the AOF brings the stream back
        server.proc.wait(10)
        await asyncio.sleep(1.0)  # down for a while: several reconnect attempts
        server.start()

        async with Queue(queue_name, connection=server.url) as queue:
            after = await queue.add("after", {})
            await rec.wait_for("added", lambda f: f["jobId"] == after.id, timeout=10)
            assert await queue.get_job_counts("waiting") == {"waiting": 2}  # data survived
        assert [f["jobId"] for f in rec.fields("added")] == [before.id, after.id]  # no replays
        lost = [r for r in caplog.records if r.levelno == logging.WARNING and "lost Redis" in r.getMessage()]
        assert len(lost) == 1  # logged once per outage, not per attempt
        assert any("reconnected" in r.getMessage() for r in caplog.records)
        await qe.close()
    finally:
        server.stop()


# -- queue helpers ----------------------------------------------------------------------------------
async def test_get_metrics(redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        empty = await queue.get_metrics("completed")
        assert empty == {"meta": {"count": 0, "prevTS": 0, "prevCount": 0}, "data": [], "count": 0}
        # as if 5 jobs had completed, 2 of them before the last minute boundary
        now = int(time.time() * 1000)
        await redis.hset(f"bull:{queue_name}:metrics:completed",
                         mapping={"count": 5, "prevTS": now - 60000, "prevCount": 2})
        await queue.add_bulk([{"name": "m", "data": {}} for _ in range(3)])
        await queue.add("f", {"kind": "fail"}, attempts=1)
        async with Worker(queue_name, process, connection=redis_url, metrics={"max_data_points": 10}, **FAST):
            await wait_until(lambda: _finished(queue, 4), what="4 jobs finished")
        metrics = await queue.get_metrics("completed")
        assert metrics["meta"]["count"] == 8
        assert metrics["meta"]["prevTS"] >= now and metrics["meta"]["prevCount"] >= 5
        assert metrics["data"][-1] == 3 and metrics["count"] == len(metrics["data"])
        failed = await queue.get_metrics("failed")
        assert failed["meta"]["count"] == 1 and failed["data"] == [] and failed["count"] == 0
        assert (await queue.get_metrics("completed", 0, 0))["data"] == metrics["data"][:1]
        with pytest.raises(InvalidArgument):
            await queue.get_metrics("waiting")


async def _finished(queue: Queue, n: int) -> bool:
    counts = await queue.get_job_counts("completed", "failed")
    return counts["completed"] + counts["failed"] >= n


async def test_get_counts_per_priority_and_trim_events(redis_url: str, queue_name: str,
                                                       redis: aioredis.Redis) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await queue.add_bulk([{"name": "p0", "data": {}}, {"name": "p0", "data": {}},
                              {"name": "p1", "data": {}, "opts": {"priority": 1}},
                              {"name": "p1", "data": {}, "opts": {"priority": 1}},
                              {"name": "p5", "data": {}, "opts": {"priority": 5}}])
        assert await queue.get_counts_per_priority([0, 1, 5, 7, 1]) == {"0": 2, "1": 2, "5": 1, "7": 0}
        with pytest.raises(InvalidArgument):
            await queue.get_counts_per_priority([-1])

        for i in range(400):
            await redis.xadd(f"bull:{queue_name}:events", {"event": "filler", "i": i})
        before = await redis.xlen(f"bull:{queue_name}:events")
        removed = await queue.trim_events(10)
        after = await redis.xlen(f"bull:{queue_name}:events")
        assert removed == before - after and removed > 0 and after < before
