"""FastConnection: the pipelined hot-path Redis connection."""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from typing import AsyncIterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from bullmq_compat._backends.redis.fastconn import (
    AuthenticationFailed,
    ConnectionLost,
    FastConnection,
    FastPathUnavailable,
    HandshakeError,
    ReplyError,
    encode_command,
)
from tests._redis_server import RedisServer


def _host_port(url: str) -> tuple[str, int]:
    hostport = url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


def _key(prefix: str = "fc") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def conn(redis_url: str) -> AsyncIterator[FastConnection]:
    host, port = _host_port(redis_url)
    c = await FastConnection.open(host, port)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def own_server() -> "RedisServer":
    server = RedisServer().start()
    yield server
    server.stop()


# --------------------------------------------------------------------------- encoding

def test_encode_command() -> None:
    assert encode_command("SET", b"k\r\n", 12, 1.5, "é") == (
        b"*5\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$2\r\n12\r\n$3\r\n1.5\r\n$2\r\n\xc3\xa9\r\n")
    assert encode_command(*(["X"] * 70)).startswith(b"*70\r\n$1\r\nX\r\n")
    big = b"v" * 5000
    assert encode_command(big) == b"*1\r\n$5000\r\n" + big + b"\r\n"
    assert encode_command(bytearray(b"ab"), memoryview(b"cd"), -7) == (
        b"*3\r\n$2\r\nab\r\n$2\r\ncd\r\n$2\r\n-7\r\n")
    with pytest.raises(TypeError):
        encode_command("SET", "k", True)
    with pytest.raises(TypeError):
        encode_command("SET", "k", None)


async def test_bad_argument_does_not_corrupt_the_buffer(conn: FastConnection) -> None:
    key = _key()
    first = conn.execute("SET", key, "1")
    with pytest.raises(TypeError):
        conn.execute("SET", key, None)
    last = conn.execute("GET", key)
    assert await first == b"OK"
    assert await last == b"1"


# --------------------------------------------------------------------------- pipelining

async def test_ten_thousand_pipelined_incrs_in_order_in_one_write(conn: FastConnection) -> None:
    key = _key()
    writes: list[int] = []
    transport = conn._transport
    assert transport is not None
    real_write = transport.write

    def counting_write(data: bytes) -> None:
        writes.append(len(data))
        real_write(data)

    transport.write = counting_write  # type: ignore[method-assign]
    try:
        n = 10_000
        futures = [conn.execute("INCR", key) for _ in range(n)]
        assert conn.in_flight == n
        assert all(not f.done() for f in futures)
        results = await asyncio.gather(*futures)
    finally:
        transport.write = real_write  # type: ignore[method-assign]
    assert results == list(range(1, n + 1))
    # the first eager_depth commands go out at once (Redis had little to do); the rest of the tick
    # goes out in batches of max_batch commands
    expected = conn.eager_depth + -(-(n - conn.eager_depth) // conn.max_batch)
    assert len(writes) == expected, f"expected {expected} writes for one tick of commands, got {len(writes)}"
    assert conn.in_flight == 0


async def test_execute_many(conn: FastConnection) -> None:
    key = _key()
    futs = conn.execute_many([("RPUSH", key, "a", "b"), ("LLEN", key), ("LPOP", key)])
    assert [await f for f in futs] == [2, 2, b"a"]


async def test_mixed_reply_types(conn: FastConnection) -> None:
    key, lst, missing = _key(), _key(), _key()
    futs = [
        conn.execute("SET", key, "héllo"),
        conn.execute("GET", key),
        conn.execute("GET", missing),
        conn.execute("INCRBY", lst + ":n", 41),
        conn.execute("RPUSH", lst, b"x\x00y", 2, 2.5),
        conn.execute("LRANGE", lst, 0, -1),
        conn.execute("LRANGE", missing, 0, -1),
        conn.execute("EVAL", "return {1, {2, 'a', {3}}, 'b', {}}", 0),
        conn.execute("EVAL", "return redis.status_reply('FINE')", 0),
        conn.execute("EVAL", "return {1, redis.error_reply('MYERR nested')}", 0),
        conn.execute("EVAL", "return KEYS[1] .. ARGV[1]", 1, "k", "v"),
        conn.execute("PING"),
    ]
    res = await asyncio.gather(*futs)
    assert res[0] == b"OK"
    assert res[1] == "héllo".encode()
    assert res[2] is None
    assert res[3] == 41
    assert res[4] == 3
    assert res[5] == [b"x\x00y", b"2", b"2.5"]
    assert res[6] == []
    assert res[7] == [1, [2, b"a", [3]], b"b", []]
    assert res[8] == b"FINE"
    assert res[9][0] == 1
    assert isinstance(res[9][1], ReplyError) and res[9][1].code == "MYERR"
    assert res[10] == b"kv"
    assert res[11] == b"PONG"


async def test_float_arguments(conn: FastConnection) -> None:
    key = _key()
    futs = [
        conn.execute("ZADD", key, 0.1, "a", 1e20, "b", float("-inf"), "c", 3, "d"),
        conn.execute("ZRANGE", key, 0, -1, "WITHSCORES"),
        conn.execute("INCRBYFLOAT", key + ":f", 0.25),
    ]
    assert await futs[0] == 4
    flat = await futs[1]
    assert flat[0::2] == [b"c", b"a", b"d", b"b"]
    assert [float(x) for x in flat[1::2]] == [float("-inf"), 0.1, 3.0, 1e20]
    assert await futs[2] == b"0.25"


async def test_error_replies_map_to_reply_error_and_do_not_disturb_order(conn: FastConnection) -> None:
    key = _key()
    futs = [
        conn.execute("SET", key, "string"),
        conn.execute("EVALSHA", "0" * 40, 0),
        conn.execute("LPUSH", key, "x"),
        conn.execute("NOSUCHCOMMAND"),
        conn.execute("GET", key),
        conn.execute("PING"),
    ]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert results[0] == b"OK"
    assert isinstance(results[1], ReplyError) and results[1].code == "NOSCRIPT"
    assert isinstance(results[2], ReplyError) and results[2].code == "WRONGTYPE"
    assert isinstance(results[3], ReplyError) and results[3].code == "ERR"
    assert results[4] == b"string"
    assert results[5] == b"PONG"
    # code written against redis-py's exceptions still catches it
    assert isinstance(results[1], redis.exceptions.ResponseError)
    assert "NOSCRIPT" in str(results[1])
    with pytest.raises(ReplyError) as info:
        await conn.execute("LPUSH", key, "x")
    assert info.value.code == "WRONGTYPE"
    assert not conn.closed


async def test_large_value_round_trip(conn: FastConnection) -> None:
    key = _key()
    value = os.urandom(5 * 1024 * 1024)
    set_f = conn.execute("SET", key, value)
    get_f = conn.execute("GET", key)
    strlen_f = conn.execute("STRLEN", key)
    assert await set_f == b"OK"
    assert await get_f == value
    assert await strlen_f == len(value)
    await conn.execute("DEL", key)


# --------------------------------------------------------------------------- handshake

async def test_select_db(redis_url: str) -> None:
    host, port = _host_port(redis_url)
    key = _key()
    c = await FastConnection.open(host, port, db=3)
    try:
        info = await c.execute("CLIENT", "INFO")
        assert b" db=3 " in info
        assert await c.execute("SET", key, "in-3") == b"OK"
    finally:
        await c.close()
    r3 = aioredis.Redis(host=host, port=port, db=3)
    r0 = aioredis.Redis(host=host, port=port, db=0)
    try:
        assert await r3.get(key) == b"in-3"
        assert await r0.get(key) is None
        await r3.delete(key)
    finally:
        await r3.aclose()
        await r0.aclose()


async def test_select_out_of_range_db_is_a_handshake_error(redis_url: str) -> None:
    host, port = _host_port(redis_url)
    with pytest.raises(HandshakeError, match="SELECT"):
        await FastConnection.open(host, port, db=100_000)


async def test_client_setname_visible_in_client_list(redis_url: str) -> None:
    host, port = _host_port(redis_url)
    name = f"fastconn-{uuid.uuid4().hex[:8]}"
    c = await FastConnection.open(host, port, client_name=name)
    try:
        assert await c.execute("CLIENT", "GETNAME") == name.encode()
        listing = await c.execute("CLIENT", "LIST")
        assert f"name={name} ".encode() in listing
    finally:
        await c.close()


@pytest.fixture
def auth_server() -> "RedisServer":
    # RedisServer.start() waits for an unauthenticated PING to answer PONG, which a
    # server started with --requirepass never does: start it open, then set the password.
    server = RedisServer().start()
    try:
        import redis as sync_redis

        with sync_redis.Redis(host="127.0.0.1", port=server.port) as admin:
            admin.config_set("requirepass", "pw")
        yield server
    finally:
        server.stop()


async def test_auth_with_password(auth_server: RedisServer) -> None:
    c = await FastConnection.open("127.0.0.1", auth_server.port, password="pw", db=1, client_name="authed")
    try:
        assert await c.execute("PING") == b"PONG"
        assert await c.execute("CLIENT", "GETNAME") == b"authed"
    finally:
        await c.close()
    c = await FastConnection.open("127.0.0.1", auth_server.port, username="default", password="pw")
    try:
        assert await c.execute("PING") == b"PONG"
    finally:
        await c.close()


async def test_wrong_password_is_a_clear_error(auth_server: RedisServer) -> None:
    with pytest.raises(AuthenticationFailed, match="refused authentication") as info:
        await FastConnection.open("127.0.0.1", auth_server.port, password="wrong")
    assert info.value.code == "WRONGPASS"
    assert isinstance(info.value, redis.exceptions.AuthenticationError)


async def test_missing_password_is_a_clear_error(auth_server: RedisServer) -> None:
    with pytest.raises(AuthenticationFailed, match="requires authentication") as info:
        await FastConnection.open("127.0.0.1", auth_server.port, db=2)
    assert info.value.code == "NOAUTH"


async def test_connection_refused_raises_oserror() -> None:
    server = RedisServer()  # a free port nobody listens on
    try:
        with pytest.raises(OSError):
            await FastConnection.open("127.0.0.1", server.port, connect_timeout=2)
    finally:
        server.stop()


async def test_unix_socket() -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="fc-sock-"), "redis.sock")
    server = RedisServer(extra_args=("--unixsocket", path, "--unixsocketperm", "700")).start()
    try:
        c = await FastConnection.open(unix_socket_path=path, db=1)
        try:
            assert await c.execute("PING") == b"PONG"
            assert b" db=1 " in await c.execute("CLIENT", "INFO")
        finally:
            await c.close()
        client = aioredis.Redis.from_url(f"unix://{path}?db=2")
        try:
            twin = await FastConnection.from_redis_py(client)
            try:
                assert twin.address == f"unix:{path}"
                assert b" db=2 " in await twin.execute("CLIENT", "INFO")
            finally:
                await twin.close()
        finally:
            await client.aclose()
    finally:
        server.stop()


# --------------------------------------------------------------------------- failure & lifecycle

async def test_killed_server_fails_pending_futures_promptly(own_server: RedisServer) -> None:
    c = await FastConnection.open("127.0.0.1", own_server.port)
    assert await c.execute("PING") == b"PONG"
    blocked = c.execute("BLPOP", _key(), 0)  # never answers: keeps the pipeline busy
    behind = [c.execute("INCR", _key()) for _ in range(100)]
    await asyncio.sleep(0.05)
    assert not blocked.done()
    assert own_server.proc is not None
    own_server.proc.kill()
    with pytest.raises(ConnectionLost):  # promptly: not after a TCP timeout (minutes)
        await asyncio.wait_for(blocked, 10)
    for f in behind:
        assert isinstance(f.exception(), ConnectionLost)
    assert c.closed
    later = c.execute("PING")
    with pytest.raises(ConnectionLost):
        await later
    assert isinstance(later.exception(), ConnectionError)
    assert isinstance(later.exception(), redis.exceptions.ConnectionError)
    await asyncio.wait_for(c.wait_closed(), 10)
    await c.close()  # idempotent


async def test_cancelled_future_does_not_desync(conn: FastConnection, redis: aioredis.Redis) -> None:
    key = _key()
    futs = [conn.execute("INCR", key) for _ in range(5)]
    futs[1].cancel()
    futs[3].cancel()
    assert await futs[0] == 1
    assert await futs[2] == 3
    assert await futs[4] == 5
    # a timed-out wait cancels a future whose reply arrives later
    # (a BLPOP that only a later push answers, so a slow loop cannot see the reply before the timeout)
    blocked_key = _key()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(conn.execute("BLPOP", blocked_key, 0), 0.05)
    await redis.lpush(blocked_key, "wake")
    assert await conn.execute("GET", key) == b"5"
    assert await conn.execute("ECHO", "after") == b"after"
    assert conn.in_flight == 0


async def test_close(redis_url: str) -> None:
    host, port = _host_port(redis_url)
    c = await FastConnection.open(host, port)
    key = _key()
    f = c.execute("SET", key, "1")
    assert await f == b"OK"
    await c.close()
    assert c.closed
    with pytest.raises(ConnectionLost, match="closed by the client"):
        await c.execute("GET", key)
    await c.wait_closed()


async def test_paused_writing_queues_then_flushes(conn: FastConnection) -> None:
    key = _key()
    conn.pause_writing()
    assert conn.writing_paused
    futs = [conn.execute("INCR", key) for _ in range(3)]
    drained = asyncio.ensure_future(conn.drain())
    await asyncio.sleep(0.05)
    assert not any(f.done() for f in futs)
    assert not drained.done()
    conn.resume_writing()
    await asyncio.wait_for(drained, 10)
    assert await asyncio.gather(*futs) == [1, 2, 3]


_STALL = """
local t0 = redis.call('TIME')
repeat
    local t = redis.call('TIME')
until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) >= tonumber(ARGV[1])
return 1
"""


async def test_real_backpressure_with_big_writes(conn: FastConnection) -> None:
    # Far more than the kernel takes while Redis is not reading, then more while it drains.  Redis is
    # kept busy by a script sent first on this very connection (it cannot read the rest until the
    # script returns), and our send buffer is small: so whatever the machine's load, the transport
    # buffers past its high-water mark and pauses us.
    import socket

    key = _key()
    chunk = b"x" * (256 * 1024)
    pauses: list[bool] = []
    real_pause = conn.pause_writing

    def recording_pause() -> None:
        pauses.append(True)
        real_pause()

    conn.pause_writing = recording_pause  # type: ignore[method-assign]
    sock = conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    stall = conn.execute("EVAL", _STALL, 0, 500_000)  # Redis reads nothing of ours for 0.5 s
    first: list[asyncio.Future[object]] = []
    while not pauses and len(first) < 400:  # bounded: 100 MB; in practice the first chunks do it
        first.append(conn.execute("APPEND", key, chunk))
        if len(first) % 40 == 0:
            await asyncio.sleep(0)  # the flush runs (a write of its own when not eager)
    assert pauses, f"the transport never paused writing for {len(first) * len(chunk)} bytes"
    first += [conn.execute("APPEND", key, chunk) for _ in range(8)]  # queued while paused
    n = len(first)
    second = [conn.execute("STRLEN", key) for _ in range(3)]
    await asyncio.wait_for(conn.drain(), 30)
    results = await asyncio.wait_for(asyncio.gather(stall, *first, *second), 60)
    assert results[0] == 1
    assert results[1:n + 1] == [len(chunk) * (i + 1) for i in range(n)]
    assert results[n + 1:] == [len(chunk) * n] * 3
    await conn.execute("DEL", key)


# --------------------------------------------------------------------------- from_redis_py

async def test_from_redis_py_url_client(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    client = aioredis.Redis.from_url(f"{base}/4", client_name="twin-of-url")
    try:
        c = await FastConnection.from_redis_py(client)
        try:
            info = await c.execute("CLIENT", "INFO")
            assert b" db=4 " in info
            assert b" name=twin-of-url " in info
        finally:
            await c.close()
        c = await FastConnection.from_redis_py(client, client_name="override")
        try:
            assert await c.execute("CLIENT", "GETNAME") == b"override"
        finally:
            await c.close()
    finally:
        await client.aclose()


async def test_from_redis_py_with_password(auth_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(f"redis://:pw@127.0.0.1:{auth_server.port}/0")
    try:
        c = await FastConnection.from_redis_py(client)
        try:
            assert await c.execute("PING") == b"PONG"
        finally:
            await c.close()
    finally:
        await client.aclose()


async def test_from_redis_py_refuses_cluster() -> None:
    from redis.asyncio.cluster import RedisCluster

    cluster = RedisCluster(host="127.0.0.1", port=1)  # built lazily: never connects
    with pytest.raises(FastPathUnavailable, match="Cluster"):
        await FastConnection.from_redis_py(cluster)


async def test_from_redis_py_refuses_sentinel() -> None:
    from redis.asyncio.sentinel import Sentinel

    master = Sentinel([("127.0.0.1", 1)]).master_for("mymaster")  # lazy: never connects
    with pytest.raises(FastPathUnavailable):
        await FastConnection.from_redis_py(master)


async def test_from_redis_py_refuses_unknown_connection_class(redis_url: str) -> None:
    from redis.asyncio.connection import Connection

    class CustomConnection(Connection):
        pass

    host, port = _host_port(redis_url)
    pool = aioredis.ConnectionPool(connection_class=CustomConnection, host=host, port=port)
    client = aioredis.Redis(connection_pool=pool)
    try:
        with pytest.raises(FastPathUnavailable, match="CustomConnection"):
            await FastConnection.from_redis_py(client)
    finally:
        await client.aclose()
    with pytest.raises(FastPathUnavailable):
        await FastConnection.from_redis_py(object())


async def test_connect_timeout_when_nothing_answers() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # accept, never answer

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="within 0.2 s"):
            await FastConnection.open("127.0.0.1", port, connect_timeout=0.2)
        assert time.monotonic() - started < 2
    finally:
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()


async def test_from_redis_py_sync_client(redis_url: str) -> None:
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/5")
    try:
        c = await FastConnection.from_redis_py(client)
        try:
            assert b" db=5 " in await c.execute("CLIENT", "INFO")
        finally:
            await c.close()
    finally:
        client.close()
