"""A lean, pipelining Redis connection for the hot path.

`FastConnection` is an `asyncio.Protocol` that speaks RESP2 with as little Python
work per command as we can manage:

* `execute(*args)` encodes the command into a write buffer and returns an
  `asyncio.Future` at once (it is not a coroutine), so a caller can issue many
  commands in one loop tick and await them later.
* Every command issued before the event loop's next turn leaves in ONE
  `transport.write` (the first command of a tick schedules a flush with
  `loop.call_soon`).
* Replies are framed by `hiredis.Reader` and resolve the futures strictly in the
  order the commands were issued (a deque).  Error replies resolve the matching
  future with a `ReplyError` (``.code`` is the first word: ``"NOSCRIPT"``,
  ``"WRONGTYPE"``, ``"ERR"``...); they are never raised from ``data_received``
  and do not disturb the replies that follow.  Error replies nested inside
  arrays (EVAL returning ``redis.error_reply``, EXEC) come back as
  `ReplyError` *instances* inside the list.
* Replies are bytes (no decoding): ``+OK`` -> ``b"OK"``, integers -> `int`,
  nil -> `None`, arrays -> `list`.

What it deliberately does not do:

* No reconnection.  When the connection is lost every pending and later future
  fails with `ConnectionLost`; the owner opens a new connection
  (`wait_closed()` tells it when).
* No RESP3, pub/sub or client-side caching.
* Blocking commands (BZPOPMIN, BLMOVE, XREAD BLOCK, ...) work, but they stall
  every command queued behind them on this connection until they return:
  give them a connection of their own.
* Cancelling a future does not un-send its command: the command still runs on
  the server and its reply is read and discarded, so ordering is never lost.
* Commands issued while the transport is paused (write buffer above its
  high-water mark) keep queueing in memory and go out when writing resumes;
  `drain()` lets a producer wait for that.
"""
from __future__ import annotations

import asyncio
import collections
import socket
import ssl as _ssl
from typing import Any, Iterable, Optional

import hiredis
import redis.exceptions as _redis_exc

from bullmq_compat import _busy_poll
from bullmq_compat._errors import BullMQCompatError

__all__ = [
    "FastConnection",
    "ReplyError",
    "HandshakeError",
    "AuthenticationFailed",
    "ConnectionLost",
    "FastPathUnavailable",
    "encode_command",
]


# --------------------------------------------------------------------------- errors

class ReplyError(_redis_exc.ResponseError):
    """An error reply from Redis.  ``code`` is its first word (``"NOSCRIPT"``, ``"ERR"``...).

    It subclasses redis-py's ``ResponseError`` so code written against redis-py's
    exceptions keeps working when it is handed a fast connection instead.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = message.split(" ", 1)[0]

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class HandshakeError(ReplyError):
    """Redis refused a command sent while opening the connection (SELECT, CLIENT SETNAME)."""


class AuthenticationFailed(HandshakeError, _redis_exc.AuthenticationError):
    """Redis refused the credentials (AUTH failed, or the server wants AUTH and got none)."""


class ConnectionLost(ConnectionError, _redis_exc.ConnectionError):
    """The connection is closed or broke; the command's outcome on the server is unknown.

    A builtin ``ConnectionError`` (and, for callers written against redis-py, a
    ``redis.exceptions.ConnectionError`` too).  Open a new `FastConnection` to retry.
    """

    status_code = None
    error_type = getattr(getattr(_redis_exc, "ExceptionType", None), "NETWORK", None)  # type: ignore[assignment]

    def __init__(self, message: str) -> None:
        ConnectionError.__init__(self, message)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "connection lost"

    def __repr__(self) -> str:
        return f"ConnectionLost({str(self)!r})"


class FastPathUnavailable(BullMQCompatError):
    """This Redis deployment (cluster, sentinel, custom connection class...) is not served
    by `FastConnection`; keep using the redis-py client."""


# --------------------------------------------------------------------------- encoding

_CLOSE_TIMEOUT = 5.0  # seconds close() waits for queued bytes to leave


def _coerce(arg: Any) -> bytes:
    """One argument's bytes, as hiredis's packer would give them (and a bytearray, which it refuses)."""
    if isinstance(arg, bool):
        raise TypeError("bool is not a Redis argument: pass 0/1 or a string")
    if isinstance(arg, float):
        return repr(float(arg)).encode()
    if isinstance(arg, int):
        return b"%d" % arg
    if isinstance(arg, str):
        return str(arg).encode()
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return bytes(arg)
    raise TypeError(f"{type(arg).__name__} is not a Redis argument: pass bytes, str, int or float")


def _encode_slowly(args: tuple[Any, ...]) -> bytes:
    """The RESP2 multibulk encoding of `args`, in Python: what hiredis's packer refuses comes here."""
    if not args:
        raise ValueError("empty command")
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        b = _coerce(arg)
        out += (b"$%d\r\n" % len(b), b, b"\r\n")
    return b"".join(out)


_pack_command = hiredis.pack_command


def _encode(args: tuple[Any, ...]) -> bytes:
    """One command's RESP2 bytes: hiredis's packer in C (a third of the time of ours), and ours
    for what it refuses: a bytearray it does not take, or a bad argument, which ours names."""
    if args:
        try:
            packed: bytes = _pack_command(args)
            return packed
        except TypeError:
            pass
    return _encode_slowly(args)


def encode_command(*args: Any) -> bytes:
    """The RESP2 encoding of one command (for tests and tools)."""
    return _encode(args)


# --------------------------------------------------------------------------- connection

class FastConnection(asyncio.Protocol):
    #: commands per write at most: small batches let Redis start on the first commands while the
    #: rest of the tick is still being prepared (the two share a 2-core machine's time)
    max_batch = 64
    #: while fewer commands than this are at Redis (written, not answered), write each at once
    eager_depth = 8
    """One Redis connection, pipelined; see the module docstring.

    Open with `FastConnection.open(...)` or `FastConnection.from_redis_py(client)`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str, decode: bool = False,
                 busy_poll: bool = True) -> None:
        self._loop = loop
        self._address = address
        # while a reply is due, the loop polls for it before sleeping (see bullmq_compat._busy_poll);
        # not for a connection whose replies take long (a blocking command's)
        self._busy_poll = busy_poll
        self._poller: Optional[_busy_poll.BusyPollSelector] = None
        self._transport: Optional[asyncio.Transport] = None
        # decode=True: bulk replies come back as str, decoded in C (the worker's hot path wants that)
        self._reader = (hiredis.Reader(replyError=ReplyError, notEnoughData=False, encoding="utf-8",
                                       errors="replace")
                        if decode else hiredis.Reader(replyError=ReplyError, notEnoughData=False))
        self._pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._wbuf: list[bytes] = []
        self._unflushed = 0
        self._flush_scheduled = False
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # Set once the connection can take no more commands; its text is what
        # every later future fails with.
        self._lost_reason: Optional[str] = None
        self._lost_cause: Optional[BaseException] = None
        self._closed_fut: asyncio.Future[None] = loop.create_future()

    # ------------------------------------------------------------------ opening

    @classmethod
    async def open(
        cls,
        host: str = "127.0.0.1",
        port: int = 6379,
        *,
        db: int = 0,
        username: Optional[str] = None,
        password: Optional[str] = None,
        ssl: Optional[_ssl.SSLContext] = None,
        client_name: Optional[str] = None,
        connect_timeout: Optional[float] = 10.0,
        unix_socket_path: Optional[str] = None,
        decode: bool = False,
        busy_poll: bool = True,
    ) -> "FastConnection":
        """Connect, then AUTH / SELECT / CLIENT SETNAME as asked (checking each reply).

        Raises `AuthenticationFailed` for refused credentials, `HandshakeError` for a
        refused SELECT / CLIENT SETNAME, `TimeoutError` when connecting and the
        handshake take longer than `connect_timeout`, and `OSError` (for instance
        `ConnectionRefusedError`) when the server cannot be reached. ``busy_poll=False`` for a
        connection whose replies are not quick (a blocking command's): the loop sleeps at once.
        """
        loop = asyncio.get_running_loop()
        if unix_socket_path is not None:
            if ssl is not None:
                raise ValueError("TLS over a unix socket is not supported")
            address = f"unix:{unix_socket_path}"
            connect = loop.create_unix_connection(lambda: cls(loop, address, decode, busy_poll), unix_socket_path)
        else:
            address = f"{host}:{port}"
            connect = loop.create_connection(
                lambda: cls(loop, address, decode, busy_poll), host, int(port),
                ssl=ssl, server_hostname=host if ssl is not None else None,
            )
        conn: Optional[FastConnection] = None

        async def connect_and_handshake() -> FastConnection:
            nonlocal conn
            _transport, conn = await connect
            await conn._handshake(db=db, username=username, password=password, client_name=client_name)
            return conn

        try:
            if connect_timeout is None:
                return await connect_and_handshake()
            try:
                return await asyncio.wait_for(connect_and_handshake(), connect_timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"could not connect to Redis at {address} within {connect_timeout} s") from None
        except BaseException:
            if conn is not None:
                conn._abort("connection setup failed")
            raise

    async def _handshake(self, *, db: int, username: Optional[str], password: Optional[str],
                         client_name: Optional[str]) -> None:
        steps: list[tuple[str, asyncio.Future[Any]]] = []
        if password is not None or username is not None:
            args: tuple[Any, ...] = ("AUTH", username, password or "") if username else ("AUTH", password)
            steps.append(("AUTH", self.execute(*args)))
        if db:
            steps.append((f"SELECT {int(db)}", self.execute("SELECT", int(db))))
        if client_name:
            steps.append(("CLIENT SETNAME", self.execute("CLIENT", "SETNAME", client_name)))
        # Always end with a PING: it proves a Redis answers and that it does not
        # want credentials we did not give (NOAUTH), before `open` returns.
        steps.append(("PING", self.execute("PING")))
        # gather() over plain futures: no tasks, and every outcome is retrieved.
        outcomes = await asyncio.gather(*(fut for _, fut in steps), return_exceptions=True)
        failure: Optional[ReplyError] = None
        failed_step = ""
        for (what, _), outcome in zip(steps, outcomes):
            if isinstance(outcome, ReplyError):
                if failure is None:
                    failure, failed_step = outcome, what
            elif isinstance(outcome, BaseException):
                raise outcome
        if failure is None:
            return
        code = failure.code
        if failed_step == "AUTH":
            raise AuthenticationFailed(
                f"{code} Redis at {self._address} refused authentication "
                f"(check the username/password): {failure.message}")
        if code in ("NOAUTH", "WRONGPASS"):
            raise AuthenticationFailed(
                f"{code} Redis at {self._address} requires authentication: pass password= "
                f"(and username= for an ACL user): {failure.message}")
        raise HandshakeError(f"{code} Redis at {self._address} refused {failed_step}: {failure.message}")

    @classmethod
    async def from_redis_py(cls, client: Any, client_name: Optional[str] = None,
                            decode: bool = False, busy_poll: bool = True) -> "FastConnection":
        """Open a fast twin connection to the server a redis-py client talks to.

        Reads host/port/db/username/password/credential provider/client name/TLS
        settings/unix path from ``client.connection_pool`` (its ``connection_class``
        and ``connection_kwargs``).  Raises `FastPathUnavailable` for what this class
        cannot serve the same way (RedisCluster, Sentinel-managed pools, connection
        classes it does not know); callers then keep using redis-py.
        """
        try:
            from redis.asyncio.cluster import RedisCluster as _AsyncCluster
        except ImportError:  # pragma: no cover
            _AsyncCluster = ()  # type: ignore[assignment,misc]
        try:
            from redis.cluster import RedisCluster as _SyncCluster
        except ImportError:  # pragma: no cover
            _SyncCluster = ()  # type: ignore[assignment,misc]
        if isinstance(client, (_AsyncCluster, _SyncCluster)):
            raise FastPathUnavailable("Redis Cluster clients are not served by the fast connection")
        pool = getattr(client, "connection_pool", None)
        conn_class = getattr(pool, "connection_class", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        if pool is None or conn_class is None or not isinstance(kwargs, dict):
            raise FastPathUnavailable(
                f"{type(client).__name__} has no connection pool the fast connection understands")

        import redis.asyncio.connection as _aconn
        import redis.connection as _sconn

        from bullmq_compat._backends.redis.connection import SSLContextConnection
        kind = {
            _aconn.Connection: "tcp",
            _aconn.SSLConnection: "ssl",
            SSLContextConnection: "ssl",  # the caller's ssl.SSLContext, as redis-py uses it
            _aconn.UnixDomainSocketConnection: "unix",
            _sconn.Connection: "tcp",
            _sconn.UnixDomainSocketConnection: "unix",
        }.get(conn_class)
        if kind is None:
            # Sentinel-managed connections resolve the master on connect, SSL for
            # the sync client builds its context elsewhere, and subclasses may
            # change how connecting works: all of those stay with redis-py.
            raise FastPathUnavailable(
                f"connection class {conn_class.__module__}.{conn_class.__qualname__} "
                "is not served by the fast connection")
        if "Sentinel" in type(pool).__name__:
            raise FastPathUnavailable("Sentinel-managed pools are not served by the fast connection")

        # Let redis-py apply its own defaults by building (not connecting) one of
        # its connection objects, then read the settings off it.
        try:
            template = conn_class(**kwargs)
        except Exception as exc:  # pragma: no cover - a pool redis-py itself could not use
            raise FastPathUnavailable(f"cannot read the connection settings: {exc}") from exc

        username = getattr(template, "username", None)
        password = getattr(template, "password", None)
        provider = getattr(template, "credential_provider", None)
        if provider is not None:
            get_async = getattr(provider, "get_credentials_async", None)
            creds = await get_async() if get_async is not None else provider.get_credentials()
            if len(creds) == 1:
                username, password = None, creds[0]
            else:
                username, password = creds[0], creds[1]
        name = client_name if client_name is not None else getattr(template, "client_name", None)
        timeout = getattr(template, "socket_connect_timeout", None) or 10.0
        db = int(getattr(template, "db", 0) or 0)

        if kind == "unix":
            return await cls.open(
                db=db, username=username, password=password, client_name=name,
                connect_timeout=timeout, unix_socket_path=template.path, decode=decode, busy_poll=busy_poll)
        # TLS: the very context redis-py would use (CA, verification, client certificate, or the
        # caller's own SSLContext), so the fast path verifies the server exactly as redis-py does
        ssl_context = template.ssl_context.get() if kind == "ssl" else None
        return await cls.open(
            template.host, int(template.port), db=db, username=username, password=password,
            ssl=ssl_context, client_name=name, connect_timeout=timeout, decode=decode, busy_poll=busy_poll)

    # ------------------------------------------------------------------ commands

    def execute(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command; return the future of its reply (bytes/int/None/list, or a
        `ReplyError` / `ConnectionLost` exception).  Never blocks, never raises for
        connection trouble (the future carries it); raises `TypeError` for an
        argument that is not bytes/str/int/float."""
        fut = self._loop.create_future()
        if self._lost_reason is not None:
            fut.set_exception(self._lost_error())
            return fut
        self._wbuf.append(_encode(args))
        pending = self._pending
        pending.append(fut)
        self._unflushed += 1
        if (len(pending) - self._unflushed < self.eager_depth or self._unflushed >= self.max_batch) \
                and not self._paused:
            # few commands at Redis (it may be idle), or a batch is full: write now, so Redis works on
            # it while we prepare the rest; with many at Redis already, batching saves syscalls
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def execute_many(self, commands: Iterable[tuple[Any, ...]]) -> list[asyncio.Future[Any]]:
        """`execute` for each command tuple, in order; all go out in the same write."""
        ex = self.execute
        return [ex(*cmd) for cmd in commands]

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._unflushed = 0
        if self._paused or not self._wbuf:
            return
        transport = self._transport
        if transport is None:
            return
        data = b"".join(self._wbuf)
        self._wbuf.clear()
        transport.write(data)

    # ------------------------------------------------------------------ state

    @property
    def closed(self) -> bool:
        """True once the connection takes no more commands (closed by us or lost)."""
        return self._lost_reason is not None

    @property
    def in_flight(self) -> int:
        """Commands issued whose replies have not arrived yet."""
        return len(self._pending)

    @property
    def writing_paused(self) -> bool:
        """True while the transport's write buffer is above its high-water mark."""
        return self._paused

    @property
    def address(self) -> str:
        return self._address

    async def drain(self) -> None:
        """Wait until the transport accepts writes again (returns at once if it does)."""
        if not self._paused or self._lost_reason is not None:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    async def close(self) -> None:
        """Send what is queued, then close.  Commands still waiting for a reply fail
        with `ConnectionLost` (await them first if their replies matter)."""
        if self._lost_reason is None:
            self._lost_reason = f"connection to Redis at {self._address} was closed by the client"
            transport = self._transport
            if transport is not None:
                if self._wbuf:
                    transport.write(b"".join(self._wbuf))
                    self._wbuf.clear()
                transport.close()  # flushes its buffer, then connection_lost()
                try:
                    await asyncio.wait_for(self.wait_closed(), _CLOSE_TIMEOUT)
                except asyncio.TimeoutError:  # the server is not reading: drop it
                    transport.abort()
            else:
                self._finish()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Return once the connection is closed or lost (never raises)."""
        await asyncio.shield(self._closed_fut)

    def _lost_error(self) -> ConnectionLost:
        err = ConnectionLost(self._lost_reason or f"connection to Redis at {self._address} lost")
        if self._lost_cause is not None:
            err.__cause__ = self._lost_cause
        return err

    def _abort(self, reason: str, cause: Optional[BaseException] = None) -> None:
        """Give up on the connection now: fail everything, drop the socket."""
        if self._lost_reason is None:
            self._lost_reason = reason
            self._lost_cause = cause
        transport = self._transport
        if transport is not None:
            transport.abort()  # connection_lost() follows and calls _finish()
        else:
            self._finish()

    def _finish(self) -> None:
        """Fail every future still waiting and mark the connection closed."""
        self._transport = None
        self._wbuf.clear()
        pending = self._pending
        _busy_poll.detach(self._poller, pending)
        self._poller = None
        while pending:
            fut = pending.popleft()
            if not fut.done():
                fut.set_exception(self._lost_error())
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if not self._closed_fut.done():
            self._closed_fut.set_result(None)

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if self._busy_poll:
            self._poller = _busy_poll.attach(self._loop, self._pending)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio already sets TCP_NODELAY; add keepalive so a vanished
            # server is noticed on an idle connection.
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for opt, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
                    if hasattr(socket, opt):
                        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        try:
            while True:
                reply = reader.gets()
                if reply is False:
                    return
                fut = pending.popleft()
                if fut.done():  # cancelled by its caller: reply read and dropped
                    continue
                if type(reply) is ReplyError:
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)
        except hiredis.ProtocolError as exc:
            self._abort(f"connection to Redis at {self._address} broke: protocol error ({exc})", exc)
        except IndexError as exc:  # a reply nobody asked for
            self._abort(f"connection to Redis at {self._address} broke: unexpected reply", exc)

    def eof_received(self) -> Optional[bool]:
        return False  # let the transport close; connection_lost() follows

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._lost_reason is None:
            if exc is None:
                self._lost_reason = f"connection to Redis at {self._address} was closed by the server"
            else:
                self._lost_reason = f"connection to Redis at {self._address} lost: {exc!r}"
                self._lost_cause = exc
        self._finish()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._flush()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"in_flight={len(self._pending)}"
        return f"<FastConnection {self._address} {state}>"
