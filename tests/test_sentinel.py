"""Redis Sentinel (issue #7): a worker on a Sentinel-managed connection carries on after a failover.

One master, one replica and three sentinels (quorum 2) on loopback ports (tests/_cluster.py),
started once for this module. The connection is redis-py's
``Sentinel([...]).master_for("mymaster", decode_responses=True)``; ``SENTINEL FAILOVER``
promotes the replica while a worker is processing.

The servers run with ``min-replicas-to-write 1``. Without it no client can avoid losing writes
in a forced failover: the old master goes on taking writes (redis-py's connections stay on it)
for the ~10 s until the sentinels turn it into a replica, and then throws them away. With it,
the old master refuses them (NOREPLICAS): adds fail (and are retried by the caller), and the
worker treats NOREPLICAS/READONLY as connection trouble and sends its calls again.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Iterator

import pytest
import redis.exceptions as redis_exc
from redis.asyncio.sentinel import Sentinel

from bullmq_compat import Queue, RedisUnavailable, Worker
from bullmq_compat._backends.redis.connection import describe
from bullmq_compat._errors import JobLockNotFound
from tests._cluster import LocalSentinel, _command, local_sentinel
from tests.helpers import wait_until


@pytest.fixture(scope="module")
def sentinel_setup() -> Iterator[LocalSentinel]:
    with local_sentinel(sentinels=3, min_replicas_to_write=1) as setup:
        yield setup


@pytest.fixture
async def master(sentinel_setup: LocalSentinel) -> AsyncIterator[Any]:
    sentinel = Sentinel(sentinel_setup.sentinels, socket_timeout=2)
    client = sentinel.master_for(sentinel_setup.service, decode_responses=True, socket_timeout=5)
    try:
        yield client
    finally:
        await client.aclose()
        for s in sentinel.sentinels:
            await s.aclose()


async def add_retrying(queue: Queue, name: str, data: Any, timeout: float = 20.0) -> Any:
    """An add, retried while the client finds the (new) master."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await queue.add(name, data)
        except (redis_exc.ConnectionError, redis_exc.TimeoutError, redis_exc.ResponseError, OSError) as err:
            transient = not isinstance(err, redis_exc.ResponseError) or str(err).startswith(
                ("NOREPLICAS", "READONLY"))
            if not transient or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_description_names_the_service(sentinel_setup: LocalSentinel) -> None:
    client = Sentinel(sentinel_setup.sentinels).master_for(sentinel_setup.service)
    text = describe(client)
    assert "'mymaster'" in text and f"127.0.0.1:{sentinel_setup.sentinel_ports[0]}" in text


async def test_unknown_service_is_redis_unavailable(sentinel_setup: LocalSentinel) -> None:
    client = Sentinel(sentinel_setup.sentinels, socket_timeout=1).master_for("nosuch", decode_responses=True)
    queue = Queue("q", connection=client)
    try:
        with pytest.raises(RedisUnavailable, match="'nosuch'"):
            await queue.add("n", {})
    finally:
        await queue.close()
        await client.aclose()


async def test_worker_survives_failover(sentinel_setup: LocalSentinel, master: Any) -> None:
    name = f"s-{uuid.uuid4().hex[:10]}"
    done: dict[str, int] = {}
    errors: list[BaseException] = []

    async def process(job: Any) -> Any:
        await asyncio.sleep(0.03)
        return {"i": job.data["i"]}

    queue = Queue(name, connection=master)
    # a lock outlasting the ~10 s the old master refuses writes: the jobs active then keep their
    # locks, and their finishing calls (sent again until the new master answers) find them
    worker = Worker(name, process, connection=master, concurrency=2, drain_delay=1,
                    lock_duration=20000, stalled_interval=2000)
    worker.on("completed", lambda job, *_: done.__setitem__(str(job.id), done.get(str(job.id), 0) + 1))
    worker.on("error", lambda err, *_: errors.append(err))
    try:
        async with worker:
            before = [await queue.add("before", {"i": i}) for i in range(10)]
            await wait_until(lambda: len(done) == 10, 15, "10 jobs before the failover")

            # jobs still waiting (and two active) while the failover happens; replicated first
            during = [await queue.add("during", {"i": i}) for i in range(10, 30)]
            await master.execute_command("WAIT", 1, 2000)
            old_port = sentinel_setup.master_port()
            new_port = await asyncio.to_thread(sentinel_setup.failover)
            assert new_port != old_port

            started = time.monotonic()
            after = [await add_retrying(queue, "after", {"i": i}) for i in range(30, 45)]
            ids = [job.id for job in before + during + after]
            assert len(set(ids)) == 45
            async with Queue(name, connection=f"redis://127.0.0.1:{new_port}/0",
                             skip_meta_update=True) as direct:
                async def all_completed() -> bool:
                    return (await direct.get_job_counts("completed"))["completed"] == len(ids)
                await wait_until(all_completed, 120, "every job completed on the new master")
                assert time.monotonic() - started < 120
                counts = await direct.get_job_counts("completed", "failed", "waiting", "active", "delayed")
                assert counts == {"completed": 45, "failed": 0, "waiting": 0, "active": 0, "delayed": 0}
                for job in before + during + after:
                    stored = await direct.get_job(job.id)
                    assert stored is not None and stored.returnvalue == {"i": job.data["i"]}, job.id
        assert "role:master" in _command(new_port, "INFO", "replication")
        assert set(done) >= set(ids)
        # a job fetched after the replica last caught up (its move to active and lock never reached
        # the new master) runs again there; its first run's finish then finds no lock
        # (docs/guarantees.md): at most one per slot, and only of jobs that did complete
        lost_locks = [e for e in errors if isinstance(e, JobLockNotFound)]
        assert len(lost_locks) <= 2 and all(str(e.job_id) in done for e in lost_locks), lost_locks
        unexpected = [e for e in errors if not str(e).startswith(("NOREPLICAS", "READONLY"))
                      and not isinstance(e, (redis_exc.ConnectionError, OSError, JobLockNotFound))]
        assert not unexpected, unexpected
    finally:
        await queue.close()


async def test_worker_rides_out_a_master_refusing_writes() -> None:
    """NOREPLICAS (a master that lost its replicas, as the old master in a failover): the worker's
    finishing call is sent again until it is taken, and its marker waiter survives the refusals."""
    from tests._redis_server import RedisServer

    server = RedisServer().start()
    admin = None
    try:
        import redis.asyncio as aioredis
        admin = aioredis.Redis.from_url(server.url, decode_responses=True)
        ran: list[str] = []
        started = asyncio.Event()

        async def process(job: Any) -> str:
            ran.append(str(job.id))
            started.set()
            await asyncio.sleep(0.3)
            return "done"

        name = f"s-{uuid.uuid4().hex[:10]}"
        async with Queue(name, connection=server.url) as queue, \
                Worker(name, process, connection=server.url, concurrency=2, drain_delay=0.2) as worker:
            errors: list[BaseException] = []
            worker.on("error", lambda err, *_: errors.append(err))
            first = await queue.add("first", {})
            await asyncio.wait_for(started.wait(), 5)
            await admin.config_set("min-replicas-to-write", 1)   # the job's finish is refused now
            await asyncio.sleep(1.0)                              # ...and the idle slot's BZPOPMIN too
            assert await queue.get_job_state(first.id) == "active"
            await admin.config_set("min-replicas-to-write", 0)
            await wait_until(lambda: queue.get_job_state(first.id), 5, "the first job")
            await wait_until(lambda: _is(queue.get_job_state(first.id), "completed"), 5, "completion")
            second = await queue.add("second", {})
            await wait_until(lambda: _is(queue.get_job_state(second.id), "completed"), 5, "the next job")
            assert ran == [first.id, second.id]
            assert worker.running
    finally:
        if admin is not None:
            await admin.aclose()
        server.stop()


async def _is(state: Any, expected: str) -> bool:
    return await state == expected
