"""TLS to Redis: ``rediss://`` with the server verified against a CA, on the fast (hiredis) path
and the redis-py path, for Queue, Worker, QueueEvents, FlowProducer and GroupKeeper.

The tests start their own ``redis-server --tls-port`` with a CA and certificates made at run time
(tests/_tls.py). The ways to say which CA to trust, as redis-py names them:

* ``"rediss://host:port/0?ssl_ca_certs=/path/ca.pem"`` (a URL alone),
* ``{"url": "rediss://...", "ssl_ca_certs": ca, "ssl_cert_reqs": "required"}``,
* ``{"host": ..., "port": ..., "ssl": True, "ssl_ca_certs": ca}`` (redis-py's own keywords),
* ``{"url": "rediss://...", "ssl_context": ssl.create_default_context(cafile=ca)}``,
* a ready ``redis.asyncio.Redis(..., ssl=True, ssl_ca_certs=ca)`` client.

A CA that did not sign the server's certificate is refused, with a clear error, on both paths.
Node BullMQ (ioredis with the same CA) shares a queue with Python over the same TLS server.
"""
from __future__ import annotations

import ssl
from typing import Any, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from bullmq_compat import FlowProducer, Queue, QueueEvents, RedisUnavailable, Worker
from bullmq_compat._backends.redis.channel import FastChannel, RedisPyChannel
from bullmq_compat._backends.redis.fastconn import FastConnection
from bullmq_compat._groups import GroupKeeper
from tests._tls import TLSRedisServer
from tests.group_helpers import finish_as_node
from tests.helpers import running, wait_until
from tests.node import NodeProcess, node


@pytest.fixture(scope="module")
def tls() -> Iterator[TLSRedisServer]:
    server = TLSRedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def plain(tls: TLSRedisServer) -> Any:
    """The same server's plain loopback port: for the test's own look at what the clients did."""
    client = aioredis.Redis(port=tls.port, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


def connections(tls: TLSRedisServer) -> dict[str, Callable[[], Any]]:
    ca = str(tls.pki.ca)
    return {
        "url": lambda: f"{tls.tls_url}?ssl_ca_certs={ca}",
        "url+kwargs": lambda: {"url": tls.tls_url, "ssl_ca_certs": ca, "ssl_cert_reqs": "required"},
        "redis-py kwargs": lambda: {"host": "localhost", "port": tls.tls_port, "ssl": True, "ssl_ca_certs": ca},
        "ssl_context": lambda: {"url": tls.tls_url, "ssl_context": ssl.create_default_context(cafile=ca)},
        "ssl_context, host": lambda: {"host": "127.0.0.1", "port": tls.tls_port,
                                      "ssl_context": ssl.create_default_context(cafile=ca)},
        "redis-py client": lambda: aioredis.Redis(host="127.0.0.1", port=tls.tls_port, ssl=True, ssl_ca_certs=ca,
                                                  ssl_cert_reqs="required", decode_responses=True),
    }


WAYS = ["url", "url+kwargs", "redis-py kwargs", "ssl_context", "ssl_context, host", "redis-py client"]


async def tls_clients(plain: Any, tls: TLSRedisServer) -> list[dict[str, str]]:
    """CLIENT LIST entries of connections that came in on the TLS port."""
    return [c for c in await plain.client_list() if c.get("laddr", "").endswith(f":{tls.tls_port}")]


async def double(job: Any) -> Any:
    return {"doubled": job.data["n"] * 2}


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "redis-py path"])
@pytest.mark.parametrize("way", WAYS)
async def test_every_class_works_over_tls(way: str, fast: bool, tls: TLSRedisServer, plain: Any,
                                          queue_name: str) -> None:
    make = connections(tls)[way]
    given = [make() for _ in range(5)]  # one each: a ready client passed in stays the caller's
    queue = Queue(queue_name, given[0])
    if not fast:
        queue.backend._fast = False  # type: ignore[attr-defined]  # adds through redis-py, as for a deployment the fast path does not serve
    events = QueueEvents(queue_name, given[1])
    worker = Worker(queue_name, double, given[2], name="tls-worker", concurrency=2, fast_path=fast)
    flows = FlowProducer(given[3])
    keeper = GroupKeeper(queue_name, given[4])
    closeables: list[Any] = [worker, events, flows, keeper, queue]
    try:
        await events.wait_until_ready()
        async with running(worker):
            jobs = [await queue.add("d", {"n": n}) for n in range(5)]
            results = [await job.wait_until_finished(events, timeout=30_000) for job in jobs]
            assert results == [{"doubled": 2 * n} for n in range(5)]
            tree = await flows.add({"name": "parent", "queue_name": queue_name, "data": {"n": 10},
                                    "children": [{"name": "child", "queue_name": queue_name, "data": {"n": 1}}]})
            assert await tree.job.wait_until_finished(events, timeout=30_000) == {"doubled": 20}
            channel = worker._channel.channel  # type: ignore[union-attr]
            assert isinstance(channel, FastChannel if fast else RedisPyChannel), channel
            if fast:
                assert await queue.backend.fast_channel() is not None  # type: ignore[attr-defined]
            # the worker's named connections came in on the TLS port (the fast path's too)
            names = {c.get("name", "") for c in await tls_clients(plain, tls)}
            assert any(n.endswith(":w:tls-worker") for n in names), names
        assert (await queue.get_job_counts("completed"))["completed"] == 7
        # the keeper's sweep, over TLS, releases a group whose job was finished as Node finishes it
        first = await queue.add("g", {"n": 0}, group="G")
        second = await queue.add("g", {"n": 1}, group="G")
        given.append(make())
        manual = Worker(queue_name, connection=given[-1], group_keeper=False)
        closeables.insert(0, manual)
        job = await manual.get_next_job("tok")
        assert job is not None and job.id == first.id
        await finish_as_node(queue, manual, job, "tok")
        assert await queue.get_job_state(second.id) != "waiting"  # held behind the finished job's slot
        assert await keeper.sweep() == 1
        assert await queue.get_job_state(second.id) == "waiting"
    finally:
        for closeable in closeables:
            await closeable.close()
        for client in given:
            if not isinstance(client, (str, dict)):
                await client.aclose()


@pytest.mark.parametrize("way", ["url", "url+kwargs", "ssl_context", "redis-py client"])
async def test_a_wrong_ca_is_refused_with_a_clear_error(way: str, tls: TLSRedisServer, queue_name: str) -> None:
    other = str(tls.pki.other_ca)
    connection: Any = {
        "url": f"{tls.tls_url}?ssl_ca_certs={other}",
        "url+kwargs": {"url": tls.tls_url, "ssl_ca_certs": other},
        "ssl_context": {"url": tls.tls_url, "ssl_context": ssl.create_default_context(cafile=other)},
        "redis-py client": aioredis.Redis(host="127.0.0.1", port=tls.tls_port, ssl=True, ssl_ca_certs=other),
    }[way]
    queue = Queue(queue_name, connection)
    try:
        with pytest.raises(RedisUnavailable) as caught:
            await queue.add("x", {})
        message = str(caught.value)
        assert f"cannot reach Redis at rediss://127.0.0.1:{tls.tls_port}/0" in message, message
        assert "CERTIFICATE_VERIFY_FAILED" in message and "did not verify" in message, message
        # the fast path verifies as redis-py does: it refuses the server too, never falls back to trusting it
        with pytest.raises(ssl.SSLCertVerificationError):
            await FastConnection.from_redis_py(queue.client)
    finally:
        await queue.close()
        if not isinstance(connection, (str, dict)):
            await connection.aclose()


async def test_no_ca_means_the_system_store_which_refuses_a_private_ca(tls: TLSRedisServer, queue_name: str) -> None:
    queue = Queue(queue_name, tls.tls_url)
    try:
        with pytest.raises(RedisUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await queue.add("x", {})
    finally:
        await queue.close()


async def test_plain_redis_url_on_the_tls_port_says_to_use_rediss(tls: TLSRedisServer, queue_name: str) -> None:
    queue = Queue(queue_name, f"redis://127.0.0.1:{tls.tls_port}/0")
    try:
        with pytest.raises(RedisUnavailable) as caught:
            await queue.add("x", {})
        assert "use rediss://" in str(caught.value), str(caught.value)
    finally:
        await queue.close()


async def test_the_fast_path_carries_the_tls_settings_over(tls: TLSRedisServer, plain: Any) -> None:
    """FastConnection.from_redis_py opens its own socket with redis-py's SSL context: verified
    against the CA, with the host name checked, on the TLS port."""
    ca = str(tls.pki.ca)
    for client in (aioredis.Redis(host="localhost", port=tls.tls_port, ssl=True, ssl_ca_certs=ca),
                   Queue("q", {"url": tls.tls_url, "ssl_context": ssl.create_default_context(cafile=ca)}).client):
        conn = await FastConnection.from_redis_py(client, "fast-tls-check")
        try:
            assert await conn.execute("PING") == b"PONG"
            names = {c.get("name") for c in await tls_clients(plain, tls)}
            assert "fast-tls-check" in names, names
        finally:
            await conn.close()
            await client.aclose()


@pytest.mark.node
async def test_node_bullmq_shares_the_tls_queue(tls: TLSRedisServer, queue_name: str) -> None:
    ca = str(tls.pki.ca)
    url = f"{tls.tls_url}?ssl_ca_certs={ca}"
    # Node adds over TLS, a Python worker (fast path) processes over TLS, Node reads the result
    added = await node("add", redis=tls.tls_url, caFile=ca, queue=queue_name, name="from-node", data={"n": 21})
    worker = Worker(queue_name, double, url)
    async with running(worker):
        async def done() -> Any:
            job = await node("getJob", redis=tls.tls_url, caFile=ca, queue=queue_name, id=added["id"])
            return job if job and job["state"] == "completed" else None
        job = await wait_until(done, timeout=60, what="the Node-added job completed by Python", interval=0.2)
        assert job["returnvalue"] == {"doubled": 42}
        assert isinstance(worker._channel.channel, FastChannel)  # type: ignore[union-attr]
    await worker.close()
    # Python adds over TLS, a Node worker processes over TLS, Python's QueueEvents (TLS) sees it
    queue = Queue(queue_name, url)
    events = QueueEvents(queue_name, url)
    try:
        await events.wait_until_ready()
        async with NodeProcess.work(redis=tls.tls_url, caFile=ca, queue=queue_name, count=1) as node_worker:
            job = await queue.add("from-python", {"x": 1})
            assert await job.wait_until_finished(events, timeout=30_000) == {"echo": {"x": 1}}
            outcome = await node_worker.result()
        assert outcome["completed"] == [job.id]
    finally:
        await events.close()
        await queue.close()
    # and Node without the CA refuses the server (it verifies too)
    with pytest.raises(Exception, match="(?i)certificate|self.signed|verify"):
        await node("getJobCounts", redis=tls.tls_url, queue=queue_name, connectTimeoutMs=5000)


def test_no_key_or_certificate_is_committed() -> None:
    """The keys are made at run time: no PEM key is committed."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listing = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    tracked = listing.stdout.split()
    assert "tests/test_tls.py" in tracked  # the listing is of this checkout, not empty
    for path in tracked:
        if path.endswith((".pem", ".key", ".crt")):
            raise AssertionError(f"{path} is committed")
