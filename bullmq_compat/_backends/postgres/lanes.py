"""The worker's query sessions, driven through libpq directly: the hot path with little client CPU.

A worker spends most of its client CPU per job in the driver, not in BullMQ: a pool checkout,
a cursor, psycopg's wait generators (an ``add_reader`` / ``remove_reader`` per wait), and a
``Column`` object per column of every result (``SELECT * FROM move_to_active`` has 32). A `Lane`
keeps psycopg for connecting (search_path, keepalive, errors) and then talks to its ``pgconn``
itself: one reader registered for the session's life, each of upstream's commands prepared once
per session (``PQsendPrepare``) and then sent with ``PQsendQueryPrepared`` in text format, the
reply read as text. Measured with scripts/bench_postgres.py: see docs of the worker channel.

Each lane runs one statement at a time, in autocommit: every command is its own transaction, as
with Node's ``pg`` pool. `Lanes` opens up to ``size`` of them, only when all open ones are busy.
A lane whose session is lost is dropped; the call in flight raises psycopg's `OperationalError`
(transient for the worker), and the next call opens a fresh session.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import TYPE_CHECKING, Any, Optional, Sequence

from bullmq_compat._backends.postgres import sql
from bullmq_compat._errors import PostgresUnavailable

if TYPE_CHECKING:
    import psycopg
    from psycopg import pq

    from bullmq_compat._backends.postgres.connection import PostgresConnection

TextRow = dict[str, Optional[str]]


def encode_param(value: Any) -> Optional[bytes]:
    """A parameter in PostgreSQL's text input format (the server types it from the function)."""
    if value is None:
        return None
    if value is True:
        return b"t"
    if value is False:
        return b"f"
    if isinstance(value, (list, tuple)):
        return ("{" + ",".join("NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
                               for v in value) + "}").encode()
    return str(value).encode()


class Lane:
    """One autocommit session; `run` sends one prepared statement and awaits its rows (as text)."""

    def __init__(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        self.conn = conn
        self.pg: "pq.abc.PGconn" = conn.pgconn
        self.pg.nonblocking = 1
        self.broken = False
        self._loop = asyncio.get_running_loop()
        self._fd = self.pg.socket
        self._reply: Optional[asyncio.Future[list["pq.abc.PGresult"]]] = None
        self._results: list["pq.abc.PGresult"] = []
        self._prepared: set[str] = set()
        self._names: dict[str, list[str]] = {}
        self._loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        import psycopg
        from psycopg import pq

        try:
            self.pg.consume_input()
        except psycopg.Error as err:
            self._lose(err)
            return
        reply = self._reply
        while reply is not None and not self.pg.is_busy():
            result = self.pg.get_result()
            if result is None:
                self._reply, results, self._results = None, self._results, []
                if not reply.done():
                    reply.set_result(results)
                return
            self._results.append(result)
        if reply is None and self.pg.status != pq.ConnStatus.OK:  # lost while idle (terminated, restart)
            self._lose(psycopg.OperationalError("the PostgreSQL session was closed by the server"))

    def _lose(self, err: BaseException) -> None:
        if not self.broken:
            self.broken = True
            self._loop.remove_reader(self._fd)
        reply, self._reply = self._reply, None
        if reply is not None and not reply.done():
            reply.set_exception(err)

    async def _roundtrip(self, send: Any, *args: Any) -> "pq.abc.PGresult":
        import psycopg
        from psycopg import errors, pq

        if self.broken:
            raise psycopg.OperationalError("the PostgreSQL session was lost")
        reply: asyncio.Future[list["pq.abc.PGresult"]] = self._loop.create_future()
        self._reply = reply
        try:
            send(*args)
            while self.pg.flush() == 1:  # the socket buffer is full: wait until it takes more
                writable: asyncio.Future[None] = self._loop.create_future()
                self._loop.add_writer(self._fd, writable.set_result, None)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._fd)
        except psycopg.Error as err:
            self._lose(err)
            raise
        results = await reply
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(result, encoding="utf-8")
        if not results:
            raise psycopg.OperationalError("PostgreSQL sent no result")
        return results[-1]

    async def run(self, name: str, params: Sequence[Any]) -> list[TextRow]:
        from psycopg import pq

        key = name.encode()
        if name not in self._prepared:
            await self._roundtrip(self.pg.send_prepare, key, sql.command(name).encode())
            self._prepared.add(name)
        result = await self._roundtrip(self.pg.send_query_prepared, key, [encode_param(p) for p in params])
        if result.status != pq.ExecStatus.TUPLES_OK:
            return []
        names = self._names.get(name)
        if names is None or len(names) != result.nfields:
            names = self._names[name] = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
        found: list[TextRow] = []
        for row in range(result.ntuples):
            values: TextRow = {}
            for col, column in enumerate(names):
                value = result.get_value(row, col)
                values[column] = None if value is None else value.decode()
            found.append(values)
        return found

    def detach(self) -> None:
        if not self.broken:
            self.broken = True
            self._loop.remove_reader(self._fd)


class Lanes:
    """Up to ``size`` `Lane` sessions of a `PostgresConnection`, one statement at a time each.

    Sessions come from ``open_listen_session`` (our own connections when we own the pool, with
    search_path and keepalive; borrowed from a user's pool otherwise) and are opened only when all
    open ones are busy; a call waits its turn (FIFO) when ``size`` are busy.
    """

    def __init__(self, connection: "PostgresConnection", size: int, *,
                 synchronous_commit: Optional[str] = None) -> None:
        self.connection = connection
        self.size = max(1, size)
        self.synchronous_commit = synchronous_commit
        self._idle: collections.deque[Lane] = collections.deque()
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @property
    def open(self) -> int:
        return self._open

    async def _take(self) -> Lane:
        while True:
            if self._closed:
                raise PostgresUnavailable("the worker's PostgreSQL channel is closed")
            while self._idle:
                lane = self._idle.pop()  # the most recently used: its caches are warm
                if not lane.broken:
                    return lane
                await self._discard(lane)
            if self._open < self.size:
                self._open += 1
                try:
                    return await self._open_lane()
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the turn on
                raise

    async def _open_lane(self) -> Lane:
        conn = await self.connection.open_listen_session(None)
        if self.synchronous_commit is not None:  # once per session, not per call
            try:
                await sql.execute(conn, "SELECT set_config('synchronous_commit', $1, false)",
                                  [self.synchronous_commit])
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.connection.close_listen_session(conn)
                raise
        return Lane(conn)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _discard(self, lane: Lane) -> None:
        self._open -= 1
        lane.detach()
        with contextlib.suppress(Exception):
            await self.connection.close_listen_session(lane.conn)

    async def run(self, name: str, params: Sequence[Any]) -> list[TextRow]:
        """Rows of upstream's command ``name``, values as text (None for NULL); psycopg's errors
        as psycopg raises them (a BM001 refusal, an OperationalError for a lost session)."""
        lane = await self._take()
        try:
            return await lane.run(name, params)
        except BaseException:
            if lane.broken or lane._reply is not None:  # lost, or cancelled with a reply pending
                lane.detach()
            raise
        finally:
            if lane.broken or self._closed:
                await self._discard(lane)
            else:
                self._idle.append(lane)
            self._wake()

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            await self._discard(self._idle.pop())
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
