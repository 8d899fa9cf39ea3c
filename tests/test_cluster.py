"""Redis Cluster (issue #7): every feature on a 3-master cluster, with a redis-py RedisCluster as
``connection=`` and the hash-tagged prefix ``{bull}`` (every key of a queue in one slot).

The cluster is started from local redis-server binaries on free loopback ports (tests/_cluster.py)
once for this module. Node's side uses ioredis' Cluster (interop/cluster.js).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

from bullmq_compat import FlowProducer, Queue, Worker
from bullmq_compat._backends.redis.channel import RedisPyChannel
from tests._cluster import LocalCluster, local_cluster
from tests.helpers import wait_until
from tests.node import ROOT, NodeProcess
from tests.node_scripts import run_script

PREFIX = "{bull}"
FAST = {"drain_delay": 0.5, "prefix": PREFIX}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with local_cluster() as c:
        yield c


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    rc = RedisCluster(host=cluster.host, port=cluster.port, decode_responses=True)
    try:
        yield rc
    finally:
        await rc.aclose()


@pytest.fixture
def name() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


class Recorder:
    """A worker's events, and every error it reports (there must be none: no CROSSSLOT, no MOVED)."""

    def __init__(self, worker: Worker) -> None:
        self.completed: list[tuple[str, Any]] = []
        self.failed: list[tuple[str, str]] = []
        self.errors: list[BaseException] = []
        worker.on("completed", lambda job, result, *_: self.completed.append((str(job.id), result)))
        worker.on("failed", lambda job, err, *_: self.failed.append((str(job.id), str(err))))
        worker.on("error", lambda err, *_: self.errors.append(err))


def test_keys_of_a_queue_share_one_slot(cluster: LocalCluster) -> None:
    from redis.crc import key_slot

    from bullmq_compat._backends.redis.keys import QUEUE_KEY_TYPES, QueueKeys
    keys = QueueKeys(PREFIX, "anything")
    slots = {key_slot(keys[t].encode()) for t in QUEUE_KEY_TYPES} | {key_slot(keys.job("1").encode())}
    assert len(slots) == 1


async def test_queue_core(client: RedisCluster, name: str) -> None:
    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        first = await queue.add("a", {"i": 1}, attempts=2)
        assert first.id == "1"
        bulk = await queue.add_bulk([{"name": "b", "data": {"i": i}, "opts": {"priority": i % 3}}
                                     for i in range(5)])
        assert [j.id for j in bulk] == ["2", "3", "4", "5", "6"]
        delayed = await queue.add("d", {}, delay=60_000)
        job = await queue.get_job(first.id)
        assert job is not None and job.data == {"i": 1} and job.opts["attempts"] == 2
        await job.log("hello")
        assert await queue.get_job_logs(job.id) == {"logs": ["hello"], "count": 1}
        counts = await queue.get_job_counts()
        assert counts["waiting"] + counts["prioritized"] == 6 and counts["delayed"] == 1
        assert {j.id for j in await queue.get_jobs(["waiting", "prioritized"])} == {"1", "2", "3", "4", "5", "6"}

        await queue.pause()
        assert await queue.is_paused()
        await queue.resume()
        assert not await queue.is_paused()

        assert await queue.remove(delayed.id) == 1
        assert await queue.get_job(delayed.id) is None

        # finish two jobs by hand (manual processing), then retry, clean and drain
        worker = Worker(name, None, connection=client, **FAST)
        try:
            for outcome in ("completed", "failed"):
                token = f"tok-{outcome}"
                got = await worker.get_next_job(token, block=False)
                assert got is not None
                if outcome == "completed":
                    await got.move_to_completed({"ok": 1}, token)
                else:  # job 2: no attempts option, so it fails for good
                    await got.move_to_failed(RuntimeError("boom"), token)
        finally:
            await worker.close()
        counts = await queue.get_job_counts("completed", "failed")
        assert counts == {"completed": 1, "failed": 1}
        failed = (await queue.get_failed())[0]
        assert failed.failed_reason == "boom"
        await failed.retry()
        assert await queue.get_job_state(failed.id) == "waiting"
        await queue.retry_jobs(state="completed")
        assert (await queue.get_job_counts("completed", "failed")) == {"completed": 0, "failed": 0}
        done = await worker_finish(client, name)
        cleaned = await queue.clean(0, 0, "completed")
        assert sorted(cleaned) == sorted(done)
        await queue.drain()
        assert await queue.count() == 0
        await queue.obliterate(force=True)


async def worker_finish(client: RedisCluster, name: str) -> list[str]:
    """Complete every waiting or prioritized job by hand; their ids."""
    worker = Worker(name, None, connection=client, **FAST)
    done = []
    try:
        while (job := await worker.get_next_job("tok", block=False)) is not None:
            await job.move_to_completed(None, "tok")
            done.append(str(job.id))
    finally:
        await worker.close()
    return done


async def test_worker_retries_with_backoff(client: RedisCluster, name: str) -> None:
    attempts: dict[str, list[float]] = {}

    async def process(job: Any) -> Any:
        attempts.setdefault(str(job.id), []).append(time.monotonic())
        if job.data.get("fail_times", 0) > job.attempts_made:
            raise RuntimeError("not yet")
        return {"double": job.data["i"] * 2}

    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        worker = Worker(name, process, connection=client, concurrency=5, **FAST)
        rec = Recorder(worker)
        async with worker:
            await queue.add_bulk([{"name": "ok", "data": {"i": i}} for i in range(20)])
            retried = await queue.add("retry", {"i": 100, "fail_times": 2}, attempts=3,
                                      backoff={"type": "fixed", "delay": 200})
            await wait_until(lambda: len(rec.completed) == 21, 20, "21 completed jobs")
        assert not rec.errors, rec.errors
        assert isinstance(worker._channel.channel, RedisPyChannel)  # type: ignore[union-attr]
        runs = attempts[retried.id]
        assert len(runs) == 3 and all(b - a >= 0.19 for a, b in zip(runs, runs[1:]))
        job = await queue.get_job(retried.id)
        assert job is not None and job.returnvalue == {"double": 200} and job.attempts_made == 3
        assert sorted(int(i) for i, _ in rec.completed) == list(range(1, 22))


async def test_lock_renewal_and_stalled_check(client: RedisCluster, name: str) -> None:
    """A job running 4 lock durations keeps its lock; the stalled checker runs every 300 ms."""
    async def slow(job: Any) -> str:
        await asyncio.sleep(2.0)
        return "done"

    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        worker = Worker(name, slow, connection=client, lock_duration=500, stalled_interval=300, **FAST)
        rec = Recorder(worker)
        stalled: list[str] = []
        worker.on("stalled", lambda job_id, *_: stalled.append(job_id))
        async with worker:
            job = await queue.add("slow", {})
            await wait_until(lambda: rec.completed, 10, "the slow job to complete")
            assert await worker.start_stalled_check() == []
        assert not rec.errors and not stalled and not rec.failed
        assert (await queue.get_job(job.id)).returnvalue == "done"  # type: ignore[union-attr]


@pytest.mark.node
async def test_workers_are_listed(client: RedisCluster, name: str, cluster: LocalCluster) -> None:
    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        worker = Worker(name, lambda job: None, connection=client, name="w1", **FAST)
        async with worker:
            await queue.add("x", {})
            await wait_until(lambda: queue.get_workers(), 5, "the worker in CLIENT LIST")
            workers = await queue.get_workers()
            assert [w["rawname"] for w in workers] == [worker.client_name(":w:w1")]
            node_view = await run_script("cluster.js", {"op": "getWorkers", "nodes": cluster.nodes,
                                                        "queue": name, "prefix": PREFIX})
            assert node_view == [worker.client_name(":w:w1")]


async def test_flow_on_cluster(client: RedisCluster, name: str) -> None:
    parent_q, child_q = f"{name}-parent", f"{name}-child"
    async with FlowProducer(connection=client, prefix=PREFIX) as flows:
        tree = await flows.add({
            "name": "parent", "queue_name": parent_q, "data": {},
            "children": [{"name": "child", "queue_name": child_q, "data": {"n": n}} for n in range(3)],
        })
        assert await tree.job.get_state() == "waiting-children"

    async def child(job: Any) -> int:
        return job.data["n"] * 10

    async def parent(job: Any) -> Any:
        return sorted((await job.get_children_values()).values())

    children = Worker(child_q, child, connection=client, **FAST)
    parents = Worker(parent_q, parent, connection=client, **FAST)
    rec = Recorder(parents)
    async with children, parents:
        await wait_until(lambda: rec.completed, 15, "the parent to complete")
    assert rec.completed[0][1] == [0, 10, 20]
    async with Queue(parent_q, connection=client, prefix=PREFIX) as queue:
        assert await queue.get_job_state(tree.job.id) == "completed"


async def test_job_scheduler_on_cluster(client: RedisCluster, name: str) -> None:
    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        first = await queue.upsert_job_scheduler("tick", {"every": 300}, {"name": "tick", "data": {"v": 1}})
        assert first is not None
        worker = Worker(name, lambda job: job.data["v"], connection=client, **FAST)
        rec = Recorder(worker)
        async with worker:
            await wait_until(lambda: len(rec.completed) >= 3, 10, "3 scheduled runs")
        assert not rec.errors, rec.errors
        assert [s["key"] for s in await queue.get_job_schedulers()] == ["tick"]
        assert await queue.remove_job_scheduler("tick")


async def test_groups_on_cluster_keep_order_with_two_workers(client: RedisCluster, name: str) -> None:
    runs: list[tuple[str, int, str]] = []
    running: dict[str, int] = {}
    overlaps: list[str] = []

    def make(tag: str) -> Any:
        async def process(job: Any) -> None:
            gid = job.data["g"]
            running[gid] = running.get(gid, 0) + 1
            if running[gid] > 1:
                overlaps.append(gid)
            runs.append((gid, job.data["seq"], tag))
            await asyncio.sleep(0.005)
            running[gid] -= 1
        return process

    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        items = [{"name": "g", "data": {"g": f"g{g}", "seq": s}, "opts": {"group": f"g{g}"}}
                 for s in range(10) for g in range(4)]
        await queue.add_bulk(items)
        w1 = Worker(name, make("w1"), connection=client, concurrency=4, **FAST)
        w2 = Worker(name, make("w2"), connection=client, concurrency=4, **FAST)
        r1, r2 = Recorder(w1), Recorder(w2)
        async with w1, w2:
            await wait_until(lambda: len(runs) == 40, 20, "40 group jobs")
        assert not r1.errors and not r2.errors, (r1.errors, r2.errors)
        assert not overlaps
        for g in range(4):
            assert [seq for gid, seq, _ in runs if gid == f"g{g}"] == list(range(10))
        assert {tag for *_, tag in runs} == {"w1", "w2"}
        assert await queue.get_groups() == []


async def test_group_ordering_delay_and_group_dedup_on_cluster(client: RedisCluster, name: str) -> None:
    """Jobs added out of order within the ordering window (and a deduplicated, replaced one) run in
    order_ms order on the cluster: the delay setting and the dedup keys live under the prefix."""
    runs: list[tuple[str, int]] = []

    async def process(job: Any) -> None:
        runs.append((job.data["g"], job.data["s"]))

    base = int(time.time() * 1000)
    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        await queue.set_group_ordering_delay(1500)
        await queue.set_group_options("g1", ordering_delay_ms=1000)
        for s in (3, 1, 0, 2):
            for g in ("g0", "g1"):
                await queue.add("o", {"g": g, "s": s}, group=g, order_ms=base + s)
        dd = {"id": "dd", "replace": True}
        gone = await queue.add("o", {"g": "g0", "s": 99}, group="g0", order_ms=base + 50, deduplication=dd)
        kept = await queue.add("o", {"g": "g0", "s": 4}, group="g0", order_ms=base + 60, deduplication=dd)
        assert await queue.get_job(gone.id) is None and kept.id != gone.id
        assert (await queue.add("o", {"g": "g0", "s": 5}, group="g0", deduplication={"id": "dd"})).id == kept.id
        worker = Worker(name, process, connection=client, concurrency=4, **FAST)
        rec = Recorder(worker)
        async with worker:
            await wait_until(lambda: len(runs) == 9, 20, "9 group jobs")
        assert not rec.errors, rec.errors
        assert [s for g, s in runs if g == "g0"] == [0, 1, 2, 3, 4]
        assert [s for g, s in runs if g == "g1"] == [0, 1, 2, 3]
        assert await queue.get_groups() == []


@pytest.mark.node
async def test_node_worker_on_cluster_processes_python_jobs(client: RedisCluster, name: str,
                                                           cluster: LocalCluster) -> None:
    async with Queue(name, connection=client, prefix=PREFIX) as queue:
        request = {"op": "work", "nodes": cluster.nodes, "queue": name, "prefix": PREFIX, "count": 12,
                   "concurrency": 4, "timeoutMs": 30000, "ready": True}
        async with NodeProcess(ROOT / "interop" / "cluster.js", json.dumps(request)) as node:
            jobs = await queue.add_bulk([{"name": "n", "data": {"i": i}} for i in range(10)])
            jobs.append(await queue.add("d", {"i": 10}, delay=200))
            jobs.append(await queue.add("p", {"i": 11}, priority=3))
            result = await node.result(60)
        assert not result["timedOut"], result
        assert sorted(result["completed"], key=int) == [j.id for j in jobs]
        for job in jobs:
            stored = await queue.get_job(job.id)
            assert stored is not None and stored.returnvalue == {"by": "node", "echo": job.data}
        seen = await run_script("cluster.js", {"op": "getJobs", "nodes": cluster.nodes, "queue": name,
                                               "prefix": PREFIX, "ids": [jobs[0].id]})
        assert seen[0]["state"] == "completed" and seen[0]["data"] == {"i": 0}


async def test_idle_worker_outlasting_the_socket_timeout(cluster: LocalCluster, name: str) -> None:
    """Blocking reads (the worker's BZPOPMIN, the group keeper's XREAD) use a twin cluster client
    without socket timeout: blocking longer than the shared client's timeout is no error, and does
    not make redis-py reset the cluster's topology."""
    client = RedisCluster(host=cluster.host, port=cluster.port, decode_responses=True, socket_timeout=0.3)
    try:
        async with Queue(name, connection=client, prefix=PREFIX) as queue:
            worker = Worker(name, lambda job: job.data["i"], connection=client, drain_delay=3.0, prefix=PREFIX,
                            group_sweep_interval=1.0)
            rec = Recorder(worker)
            async with worker:
                await queue.add("first", {"i": 1})
                await wait_until(lambda: rec.completed, 5, "the first job")
                await asyncio.sleep(3.5)  # idle: BZPOPMIN blocks 3 s, XREAD up to 1 s, at a 0.3 s timeout
                t0 = time.monotonic()
                await queue.add("second", {"i": 2})
                await wait_until(lambda: len(rec.completed) == 2, 15, "the second job")
                assert time.monotonic() - t0 < 2.0  # woken by the add, not by the end of a 3 s block
                blocking = worker._channel.channel._blocking  # type: ignore[union-attr]
                assert blocking is not client and blocking.connection_kwargs["socket_timeout"] is None
            assert not rec.errors, rec.errors
    finally:
        await client.aclose()


async def test_queue_events_on_cluster(client: RedisCluster, name: str) -> None:
    from bullmq_compat import QueueEvents

    async with QueueEvents(name, connection=client, prefix=PREFIX) as events, \
            Queue(name, connection=client, prefix=PREFIX) as queue:
        job = await queue.add("e", {"i": 3})
        waiting = asyncio.ensure_future(job.wait_until_finished(events, timeout=10000))
        await asyncio.sleep(0.1)
        async with Worker(name, lambda job: {"r": job.data["i"]}, connection=client, **FAST):
            assert await asyncio.wait_for(waiting, 10) == {"r": 3}


async def test_cluster_connection_is_described(cluster: LocalCluster) -> None:
    from bullmq_compat import RedisUnavailable
    from bullmq_compat._backends.redis.connection import describe

    client = RedisCluster(host=cluster.host, port=cluster.port)
    try:
        assert describe(client) == f"Redis Cluster 127.0.0.1:{cluster.port}"
    finally:
        await client.aclose()
    dead = RedisCluster(host="127.0.0.1", port=1, socket_connect_timeout=1)
    queue = Queue("q", connection=dead, prefix=PREFIX)
    try:
        with pytest.raises(RedisUnavailable, match=r"Redis Cluster 127\.0\.0\.1:1"):
            await queue.add("n", {})
    finally:
        await queue.close()
        await dead.aclose()
