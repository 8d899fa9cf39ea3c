"""Where a worker's hot script calls go: a pipelining FastConnection, or redis-py as fallback.

Both channels take the (script, keys, args) calls built by `WorkerCalls`. The fast one
sends every call made in one loop tick in one write and parses replies with hiredis; the
redis-py one serves what the fast path cannot (Redis Cluster, Sentinel-managed pools).
"""
from __future__ import annotations

import asyncio
from typing import Any, Iterable, Optional, Sequence

import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from bullmq_compat._backends.redis.fastconn import FastConnection, FastPathUnavailable, ReplyError
from bullmq_compat._backends.redis.runner import (
    FunctionLibraries,
    ScriptRunner,
    _argv,
    _function_missing,
    _refused,
    load_once,
)
from bullmq_compat._backends.redis.worker_calls import Call


def blocking_client(client: Any, name: Optional[str] = None) -> Any:
    """A redis-py client of one dedicated connection with no socket timeout, for blocking reads
    (BZPOPMIN, XREAD BLOCK) that must not tie up or time out the shared client. For a Redis
    Cluster client, a twin cluster client (routing per key) without socket timeout."""
    if type(client).__name__ == "RedisCluster":
        return _cluster_twin(client, name)
    pool = getattr(client, "connection_pool", None)
    kwargs = dict(getattr(pool, "connection_kwargs", {}) or {})
    if pool is None or not kwargs:
        return client
    # redis-py 8 has a default socket timeout: a blocking wait needs none.
    kwargs.update(socket_timeout=None, client_name=name)
    if getattr(pool, "service_name", None) is not None:  # Sentinel: a pool that follows the master too
        kwargs.pop("connection_pool", None)  # the new pool puts itself here
        return aioredis.Redis(connection_pool=pool.__class__(
            pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class,
            is_master=getattr(pool, "is_master", True), check_connection=getattr(pool, "check_connection", False),
            max_connections=1, **kwargs))
    return aioredis.Redis(connection_pool=pool.__class__(
        connection_class=pool.connection_class, max_connections=1, **kwargs))


_CLUSTER_TWIN_KWARGS = (
    "username", "password", "credential_provider", "driver_info", "encoding", "encoding_errors",
    "decode_responses", "health_check_interval", "socket_connect_timeout", "socket_keepalive",
    "socket_keepalive_options", "socket_read_size", "protocol", "legacy_responses", "ssl_ca_certs",
    "ssl_ca_data", "ssl_cert_reqs", "ssl_certfile", "ssl_check_hostname", "ssl_keyfile", "ssl_min_version",
    "ssl_ciphers")


def _cluster_twin(client: Any, name: Optional[str]) -> Any:
    """A RedisCluster like ``client`` (same nodes, credentials, TLS, decoding) but with no socket
    timeout: on the shared client a blocking read outlasting redis-py's default 5 s timeout
    would be retried and would reset the cluster's topology each time."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    given = dict(getattr(client, "connection_kwargs", None) or {})
    kwargs = {key: given[key] for key in _CLUSTER_TWIN_KWARGS if key in given}
    connection_class = given.get("connection_class")
    if connection_class is not None and "SSL" in connection_class.__name__:
        kwargs["ssl"] = True
    nodes = [ClusterNode(node.host, node.port) for node in (client.get_nodes() or client.startup_nodes)]
    try:
        twin = RedisCluster(startup_nodes=nodes, socket_timeout=None, max_connections=1, **kwargs)
    except TypeError:  # a redis-py without one of these settings: share the client, as before
        return client
    # Named are the connections of the nodes the twin discovers, not the one it used to discover
    # them (which stays open): one named connection per node in CLIENT LIST, as for a Node worker,
    # so get_workers (ours and Node's) counts the worker once.
    twin.connection_kwargs["client_name"] = name
    return twin


class Channel:
    """Script calls plus a blocking marker wait, over connections the channel owns."""

    async def call(self, call: Call) -> Any:
        raise NotImplementedError

    def submit_one(self, call: Call) -> Optional["asyncio.Future[Any]"]:
        """Write one call now and return its reply's future (a NOSCRIPT error in it: the call did
        not run, send it with `call`); None where this channel cannot (then use `call`)."""
        return None

    async def call_many(self, calls: list[Call], raise_errors: bool = True) -> list[Any]:
        """Several calls executed by Redis in this order (one write on the fast path); with
        ``raise_errors=False`` each failed call's exception is returned in its place."""
        raise NotImplementedError

    async def wait_marker(self, marker_key: str, timeout: float) -> Optional[tuple[str, float]]:
        """BZPOPMIN on the queue marker: (member, score), or None on timeout."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


def _evalsha(execute: Any, call: Call) -> "asyncio.Future[Any]":
    """Write one script call as EVALSHA (None arguments sent as empty strings); its reply's future."""
    script, keys, args = call
    return execute(b"EVALSHA", script.sha, len(keys), *_argv(keys, args))  # type: ignore[no-any-return]


class FastChannel(Channel):
    """One pipelined connection for calls and one for the blocking wait, reopened when lost."""

    def __init__(self, client: Any, blocking_name: Optional[str]) -> None:
        self._client = client
        self._blocking_name = blocking_name
        self._conn: Optional[FastConnection] = None
        self._blocking: Optional[FastConnection] = None
        self._opening: Optional[asyncio.Future[FastConnection]] = None
        self._functions = FunctionLibraries()
        self._script_loads: dict[str, asyncio.Future[Any]] = {}
        self._closed = False

    @classmethod
    async def open(cls, client: Any, blocking_name: Optional[str]) -> "FastChannel":
        channel = cls(client, blocking_name)
        channel._conn = await FastConnection.from_redis_py(client, decode=True)  # raises FastPathUnavailable
        if blocking_name:
            # the named connection opens with the worker, as Node's does: CLIENT LIST (getWorkers,
            # Bull-Board) shows a worker busy from its first job, before it ever waits for one
            try:
                channel._blocking = await FastConnection.from_redis_py(client, blocking_name, decode=True,
                                                                       busy_poll=False)
            except BaseException:
                await channel._conn.close()
                raise
        return channel

    async def _connection(self) -> FastConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise ConnectionError("the worker's connection is closed")
        if self._opening is None:
            self._opening = asyncio.ensure_future(FastConnection.from_redis_py(self._client, decode=True))
        try:
            self._conn = await asyncio.shield(self._opening)
        finally:
            self._opening = None
        return self._conn

    async def call(self, call: Call) -> Any:
        script, keys, args = call
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connection()
        argv = _argv(keys, args)
        if script.function is not None:
            if self._functions.usable is not False:
                # the usual case, without the general path's layers: it runs only when this fails
                try:
                    return await conn.execute(b"FCALL", script.function, len(keys), *argv)
                except ReplyError as err:
                    # library missing (not loaded, flushed) or refused: the call did not run, and
                    # the general path loads the library or falls back; any other error is the call's
                    if not (_refused(err) or _function_missing(err)):
                        raise
            return await self._functions.call(conn.execute, script, len(keys), argv,
                                              lambda: self._by_sha(conn, script, len(keys), argv))
        try:  # _by_sha's first step, here: one coroutine less on every worker call
            return await conn.execute(b"EVALSHA", script.sha, len(keys), *argv)
        except ReplyError as err:
            if err.code != "NOSCRIPT":
                raise
        return await self._load_and_call(conn, script, len(keys), argv)

    async def _by_sha(self, conn: FastConnection, script: Any, num_keys: int, argv: list[Any]) -> Any:
        try:
            return await conn.execute(b"EVALSHA", script.sha, num_keys, *argv)
        except ReplyError as err:
            if err.code != "NOSCRIPT":
                raise
        return await self._load_and_call(conn, script, num_keys, argv)

    async def _load_and_call(self, conn: FastConnection, script: Any, num_keys: int, argv: list[Any]) -> Any:
        # Redis lacks the script (a new or flushed Redis): load it once, however many calls found
        # it missing (a worker's slots all start at once), rather than send its text with each
        try:
            await load_once(self._script_loads, script.sha, lambda: conn.execute(b"SCRIPT", b"LOAD", script.lua))
            return await conn.execute(b"EVALSHA", script.sha, num_keys, *argv)
        except ReplyError as err:
            if err.code not in ("NOSCRIPT", "NOPERM"):
                raise
        return await conn.execute(b"EVAL", script.lua, num_keys, *argv)

    @property
    def is_open(self) -> bool:
        """A connection is open: `submit` writes at once."""
        return self._conn is not None and not self._conn.closed

    def submit(self, calls: Iterable[Call]) -> Optional[list["asyncio.Future[Any]"]]:
        """Write ``calls`` now (no await) and return their replies' futures, for `collect`; None
        while no connection is open (then `call_many` opens one). The caller can do other work
        while Redis runs them: the Job objects of an add are built in that time."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        execute = conn.execute
        return [_evalsha(execute, call) for call in calls]

    def submit_one(self, call: Call) -> Optional["asyncio.Future[Any]"]:
        """`submit` of one call, without its lists (one add at a time); read it with `reply_of`."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        return _evalsha(conn.execute, call)

    async def reply_of(self, call: Call, future: "asyncio.Future[Any]") -> Any:
        """`collect` of one `submit_one`: the reply, or the exception in its place."""
        try:
            return await future
        except Exception as err:
            return await self.reply_after(call, err)

    async def reply_after(self, call: Call, err: Exception) -> Any:
        """What a written call gives when its reply's future raised ``err``: the call again with
        its script's text where Redis lacked the script (it never ran), else ``err`` itself; the
        error of that second try in its place."""
        if not (isinstance(err, ReplyError) and err.code == "NOSCRIPT"):
            return err
        script, keys, args = call
        try:
            conn = await self._connection()
            return await conn.execute(b"EVAL", script.lua, len(keys), *_argv(keys, args))
        except Exception as again:
            return again

    async def collect(self, calls: Sequence[Call], futures: list["asyncio.Future[Any]"],
                      raise_errors: bool = True) -> list[Any]:
        """The replies of `submit`; with ``raise_errors=False`` each failed call's exception is
        returned in its place. A call Redis lacked the script of is run again with its text."""
        results: list[Any] = []
        first_error: Optional[BaseException] = None
        for call, future in zip(calls, futures):
            try:
                results.append(await future)
                continue
            except Exception as err:
                result = await self.reply_after(call, err)
            results.append(result)
            if isinstance(result, BaseException):
                first_error = first_error or result
        if first_error is not None and raise_errors:
            raise first_error
        return results

    async def call_many(self, calls: list[Call], raise_errors: bool = True) -> list[Any]:
        """With ``raise_errors=False`` each failed call's exception is returned in its place."""
        # all queued in this tick: one connection, one write, run by Redis in this order
        futures = self.submit(calls)
        if futures is None:
            await self._connection()
            futures = self.submit(calls)
            assert futures is not None
        return await self.collect(calls, futures, raise_errors)

    async def wait_marker(self, marker_key: str, timeout: float) -> Optional[tuple[str, float]]:
        conn = self._blocking
        if conn is None or conn.closed:
            if self._closed:
                return None
            conn = self._blocking = await FastConnection.from_redis_py(self._client, self._blocking_name, decode=True,
                                                                       busy_poll=False)
        reply = await conn.execute(b"BZPOPMIN", marker_key, timeout)
        if not reply:
            return None
        return reply[1].decode() if isinstance(reply[1], bytes) else reply[1], float(reply[2])

    async def close(self) -> None:
        self._closed = True
        for conn in (self._conn, self._blocking):
            if conn is not None:
                await conn.close()


class RedisPyChannel(Channel):
    """Calls through redis-py; the blocking wait uses its own client so it never stalls calls."""

    def __init__(self, client: Any, blocking_name: Optional[str]) -> None:
        self._runner = ScriptRunner(client)
        self._client = client
        self._blocking: Any = None
        self._blocking_name = blocking_name

    async def call(self, call: Call) -> Any:
        script, keys, args = call
        return await self._runner.call(script, keys, args)

    async def call_many(self, calls: list[Call], raise_errors: bool = True) -> list[Any]:
        """With ``raise_errors=False`` each failed call's exception is returned in its place."""
        results = await self._runner.call_many(calls)
        if raise_errors:
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        return results

    def _blocking_client(self) -> Any:
        if self._blocking is None:
            self._blocking = blocking_client(self._client, self._blocking_name)
        return self._blocking

    async def wait_marker(self, marker_key: str, timeout: float) -> Optional[tuple[str, float]]:
        try:
            reply = await self._blocking_client().bzpopmin(marker_key, timeout)
        except RedisTimeoutError:
            return None
        if not reply:
            return None
        member = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
        return member, float(reply[2])

    async def close(self) -> None:
        if self._blocking is not None and self._blocking is not self._client:
            await self._blocking.aclose()
            pool = getattr(self._blocking, "connection_pool", None)
            if pool is not None:  # a pool of ours (blocking_client), which aclose leaves connected
                await pool.disconnect()


async def open_channel(client: Any, blocking_name: Optional[str], *, fast: bool = True) -> Channel:
    """The fast channel where it can serve this client, else redis-py."""
    if fast:
        try:
            return await FastChannel.open(client, blocking_name)
        except FastPathUnavailable:
            pass
    channel = RedisPyChannel(client, blocking_name)
    if blocking_name:  # named from the start, as on the fast path
        await channel._blocking_client().ping()
    return channel
