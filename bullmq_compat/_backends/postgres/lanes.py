"""The worker's query sessions, driven through libpq directly: the hot path with little client CPU.

A worker spends most of its client CPU per job in the driver, not in BullMQ: a pool checkout,
a cursor, psycopg's wait generators (an ``add_reader`` / ``remove_reader`` per wait), and a
``Column`` object per column of every result (``SELECT * FROM move_to_active`` has 32). A `Lane`
keeps psycopg for connecting (search_path, keepalive, errors) and then talks to its ``pgconn``
itself: one reader registered for the session's life, each of upstream's commands prepared once
per session (``PQsendPrepare``) and then sent with ``PQsendQueryPrepared`` in text format, the
reply read as text (measured with scripts/bench_postgres.py).

Each lane runs one thing at a time, in autocommit: a statement (its own transaction, as with
Node's ``pg`` pool), or -- when calls had to queue because every lane was busy -- a batch of
several slots' claims and finishes, pipelined as BEGIN, the statements, COMMIT: one round trip
and one commit for all (each call is still one job's whole atomic step; a batch that fails is run
again call by call). `Lanes` opens up to ``size`` lanes, only when all open ones are busy. A lane
whose session is lost is dropped; the call in flight raises psycopg's `OperationalError`
(transient for the worker), and the next call opens a fresh session.

A Queue's adds use lanes too (`PostgresConnection.add_lanes`, with ``check_idle``: an idle lane's
socket is looked at before a call is sent on it, so a session the server ended while idle is
reopened rather than failing an add), and `Lanes.start` sends a call at once, without awaiting,
when a lane is idle: the Queue builds its Job while the server runs the add.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from bullmq_compat._backends.postgres import sql
from bullmq_compat._errors import PostgresUnavailable

if TYPE_CHECKING:
    import psycopg
    from psycopg import pq

    from bullmq_compat._backends.postgres.connection import PostgresConnection

TextRow = dict[str, Optional[str]]


def field_names(result: "pq.abc.PGresult") -> list[str]:
    """A result's column names."""
    return [(result.fname(i) or b"").decode() for i in range(result.nfields)]


def text_rows(result: "pq.abc.PGresult", names: Sequence[str]) -> list[TextRow]:
    """A text-format result's rows as dicts of text (None for NULL), as every command's reply is read."""
    found: list[TextRow] = []
    get = result.get_value
    if len(names) == 1:  # one column (an add's ids): no row of values to zip
        name = names[0]
        for row in range(result.ntuples):
            value = get(row, 0)
            found.append({name: None if value is None else value.decode()})
        return found
    for row in range(result.ntuples):
        values = [get(row, col) for col in range(len(names))]
        found.append(dict(zip(names, [None if v is None else v.decode() for v in values])))
    return found


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
        self._pipeline = False
        #: called (with the lane) when the session is found lost while no call is on it
        self.on_lost_idle: Optional[Callable[["Lane"], None]] = None
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
                if self._pipeline:
                    continue  # the end of one statement's results: a batch ends at its sync
                self._finish(reply)
                return
            self._results.append(result)
            if self._pipeline and result.status == pq.ExecStatus.PIPELINE_SYNC:
                self._finish(reply)
                return
        if reply is None and self.pg.status != pq.ConnStatus.OK:  # lost while idle (terminated, restart)
            self._lose(psycopg.OperationalError("the PostgreSQL session was closed by the server"))

    def _finish(self, reply: "asyncio.Future[list[pq.abc.PGresult]]") -> None:
        self._reply, results, self._results = None, self._results, []
        if not reply.done():
            reply.set_result(results)

    def _lose(self, err: BaseException) -> None:
        if not self.broken:
            self.broken = True
            self._loop.remove_reader(self._fd)
        reply, self._reply = self._reply, None
        if reply is not None and not reply.done():
            reply.set_exception(err)
        elif reply is None and self.on_lost_idle is not None:
            self.on_lost_idle(self)

    async def _exchange(self, send: Any) -> list["pq.abc.PGresult"]:
        """Call ``send()`` (which queues one statement, or a pipelined batch) and await its results."""
        import psycopg

        if self.broken:
            raise psycopg.OperationalError("the PostgreSQL session was lost")
        reply: asyncio.Future[list["pq.abc.PGresult"]] = self._loop.create_future()
        self._reply = reply
        try:
            send()
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
        return await reply

    async def _roundtrip(self, send: Any, *args: Any) -> "pq.abc.PGresult":
        import psycopg
        from psycopg import errors, pq

        results = await self._exchange(lambda: send(*args))
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(result, encoding="utf-8")
        if not results:
            raise psycopg.OperationalError("PostgreSQL sent no result")
        return results[-1]

    async def _prepare(self, name: str) -> bytes:
        key = name.encode()
        if name not in self._prepared:
            await self._roundtrip(self.pg.send_prepare, key, sql.command(name).encode())
            self._prepared.add(name)
        return key

    def _rows(self, name: str, result: "pq.abc.PGresult") -> list[TextRow]:
        from psycopg import pq

        if result.status != pq.ExecStatus.TUPLES_OK:
            return []
        names = self._names.get(name)
        if names is None or len(names) != result.nfields:
            names = self._names[name] = field_names(result)
        return text_rows(result, names)

    async def run_batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> Optional[list[list[TextRow]]]:
        """The ``calls`` in ONE transaction -- BEGIN, each statement, COMMIT, pipelined: one round trip,
        one commit -- and the rows of each; None when any of them failed: then nothing of the batch
        was committed, and the caller runs each on its own to learn which."""
        from psycopg import pq

        keys = [await self._prepare(name) for name, _ in calls]
        pg = self.pg

        def send() -> None:
            pg.enter_pipeline_mode()
            self._pipeline = True
            pg.send_query_params(b"BEGIN", None)
            for key, (_, params) in zip(keys, calls):
                pg.send_query_prepared(key, [encode_param(p) for p in params])
            pg.send_query_params(b"COMMIT", None)
            pg.pipeline_sync()

        try:
            results = await self._exchange(send)
        finally:
            self._pipeline = False
            if not self.broken and pg.pipeline_status != pq.PipelineStatus.OFF:
                pg.exit_pipeline_mode()
        if pg.transaction_status != pq.TransactionStatus.IDLE:  # failed inside BEGIN: end it
            await self._roundtrip(pg.send_query_params, b"ROLLBACK", None)
        # BEGIN, one result per call, COMMIT, the sync
        if len(results) != len(calls) + 3 or any(
                r.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_ABORTED) for r in results):
            return None
        return [self._rows(name, result) for (name, _), result in zip(calls, results[1:-2])]

    async def run(self, name: str, params: Sequence[Any]) -> list[TextRow]:
        key = await self._prepare(name)
        result = await self._roundtrip(self.pg.send_query_prepared, key, [encode_param(p) for p in params])
        return self._rows(name, result)

    def prepared(self, name: str) -> bool:
        return name in self._prepared

    def start(self, name: str, params: Sequence[Any]) -> "asyncio.Future[list[pq.abc.PGresult]]":
        """Send ``name`` (already prepared here) now, without awaiting anything: the future of its
        results (what the server is sent before the caller's next line runs). A reply too large
        for the socket buffer is flushed as the socket takes more."""
        import psycopg

        if self.broken:
            raise psycopg.OperationalError("the PostgreSQL session was lost")
        reply: asyncio.Future[list["pq.abc.PGresult"]] = self._loop.create_future()
        self._reply = reply
        try:
            self.pg.send_query_prepared(name.encode(), [encode_param(p) for p in params])
            self._flush_all()
        except psycopg.Error as err:
            self._lose(err)
            raise
        return reply

    def _flush_all(self) -> None:
        if self.pg.flush() == 1:
            self._loop.add_writer(self._fd, self._flush_more)

    def _flush_more(self) -> None:
        import psycopg

        try:
            done = self.pg.flush() == 0
        except psycopg.Error as err:
            done = True
            self._lose(err)
        if done:
            self._loop.remove_writer(self._fd)

    def results(self, name: str, results: list["pq.abc.PGresult"]) -> list[TextRow]:
        """The rows of a `start`'s results (psycopg's exception for an error)."""
        import psycopg
        from psycopg import errors, pq

        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(result, encoding="utf-8")
        if not results:
            raise psycopg.OperationalError("PostgreSQL sent no result")
        return self._rows(name, results[-1])

    def gone_while_idle(self) -> bool:
        """Whether an idle session has something unread (the server's goodbye, EOF), one select():
        read now, so that the lane is known broken before a call is sent on it."""
        import select

        if self.broken:
            return True
        try:
            readable, _, _ = select.select([self._fd], [], [], 0)
        except (OSError, ValueError):
            self._lose(OSError("the PostgreSQL session's socket is gone"))
            return True
        if readable:
            self._readable()
            if not self.broken:  # a notice, say: the session itself is still there
                from psycopg import pq

                return self.pg.status != pq.ConnStatus.OK
        return self.broken

    def detach(self) -> None:
        if not self.broken:
            self.broken = True
            self._loop.remove_reader(self._fd)


class _Call:
    __slots__ = ("name", "params", "batchable", "reply")

    def __init__(self, name: str, params: Sequence[Any], batchable: bool,
                 reply: "asyncio.Future[list[TextRow]]") -> None:
        self.name = name
        self.params = params
        self.batchable = batchable
        self.reply = reply


class Lanes:
    """Up to ``size`` `Lane` sessions of a `PostgresConnection`; calls queue when all are busy.

    Sessions come from ``open_listen_session`` (our own connections when we own the pool, with
    search_path and keepalive; borrowed from a user's pool otherwise) and are opened only when all
    open ones are busy. A call runs at once on an idle lane; when every lane is busy it queues, and a
    lane that frees up takes the head of the queue -- and, when the head is batchable (a claim or a
    finish: one job's atomic step, independent of the others'), the batchable calls behind it too,
    up to ``max_batch``, in one transaction (`Lane.run_batch`): one commit for them all.
    PostgreSQL processing is commit-bound, so that is where several slots gain. A batch that fails
    (a refused finish, a deadlock) commits nothing, and its calls are run again one by one.
    """

    def __init__(self, connection: "PostgresConnection", size: int, *,
                 synchronous_commit: Optional[str] = None, max_batch: int = 8, check_idle: bool = False) -> None:
        self.connection = connection
        self.size = max(1, size)
        #: look at an idle lane's socket before using it (`Lane.gone_while_idle`): a session the server
        #: ended while idle is opened again rather than failing the call (a Queue's adds)
        self.check_idle = check_idle
        self.synchronous_commit = synchronous_commit
        self.max_batch = max(1, max_batch)
        self.batches = 0  # batched transactions committed (for tests and benchmarks)
        self._idle: collections.deque[Lane] = collections.deque()
        self._open = 0
        self._queue: collections.deque[_Call] = collections.deque()
        self._tasks: set[asyncio.Future[None]] = set()
        self._closed = False

    @property
    def open(self) -> int:
        return self._open

    async def _lane(self) -> Optional[Lane]:
        """An idle lane, a newly opened one, or None when ``size`` are open and busy."""
        while self._idle:
            lane = self._idle.pop()  # the most recently used: its caches are warm
            if not (lane.gone_while_idle() if self.check_idle else lane.broken):
                return lane
            await self._discard(lane)
        if self._open < self.size:
            self._open += 1
            try:
                return await self._open_lane()
            except BaseException:
                self._open -= 1
                if self._queue and not self._closed:
                    # calls queued while this lane was opening wait for a lane to be released, and
                    # none will be (the server is away): let them try now, and fail if it still is
                    asyncio.ensure_future(self._drain())
                raise
        return None

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
        lane = Lane(conn)
        lane.on_lost_idle = self._lost_while_idle
        return lane

    def _lost_while_idle(self, lane: Lane) -> None:
        """A session the server ended while its lane sat idle (pg_terminate_backend, a restart) is
        closed at once: otherwise it would wait, counted as open, until every lane above it in the
        idle stack had been taken -- which a worker that needs fewer lanes than it opened never does."""
        if lane in self._idle and not self._closed:
            self._idle.remove(lane)
            self._keep(asyncio.ensure_future(self._discard(lane)))

    def _keep(self, task: "asyncio.Future[None]") -> None:
        """Hold a task of ours until it ends (the loop keeps only a weak reference to it)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _discard(self, lane: Lane) -> None:
        self._open -= 1
        lane.detach()
        with contextlib.suppress(Exception):
            await self.connection.close_listen_session(lane.conn)

    async def _release(self, lane: Lane) -> None:
        if lane.broken or self._closed:
            await self._discard(lane)
        else:
            self._idle.append(lane)
        if self._queue and not self._closed:
            await self._drain()

    async def run(self, name: str, params: Sequence[Any], *, batchable: bool = False) -> list[TextRow]:
        """Rows of upstream's command ``name``, values as text (None for NULL); psycopg's errors
        as psycopg raises them (a BM001 refusal, an OperationalError for a lost session)."""
        if self._closed:
            raise PostgresUnavailable("the worker's PostgreSQL channel is closed")
        lane = None if self._queue else await self._lane()
        if lane is None:  # every lane is busy: queue up; a freed lane takes us (maybe in a batch)
            reply: asyncio.Future[list[TextRow]] = asyncio.get_running_loop().create_future()
            self._queue.append(_Call(name, params, batchable, reply))
            return await reply
        try:
            return await self._run_one(lane, name, params)
        finally:
            await self._release(lane)

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self, name: str, params: Sequence[Any]) -> Optional["asyncio.Future[list[TextRow]]"]:
        """``name`` sent now on an idle lane where it is prepared, and the future of its rows (its
        exception as `run` raises it); None -- nothing sent -- when no such lane is idle or calls
        are queued (then `run`). Lets the caller work while the server runs the statement."""
        if self._closed or self._queue or not self._idle:
            return None
        lane = self._idle[-1]
        if not lane.prepared(name) or (lane.gone_while_idle() if self.check_idle else lane.broken):
            return None
        self._idle.pop()
        try:
            sent = lane.start(name, params)
        except BaseException:
            self._keep(asyncio.ensure_future(self._release(lane)))
            raise
        rows: asyncio.Future[list[TextRow]] = asyncio.get_running_loop().create_future()

        def answered(reply: "asyncio.Future[list[pq.abc.PGresult]]") -> None:
            # the lane is released here, when the server has answered, whatever became of `rows`: a
            # caller cancelled before a task of ours ran would have left the lane owned by nobody
            try:
                found: Any = lane.results(name, reply.result())
            except BaseException as err:  # (a refusal on a sound session: the lane stays)
                if lane.broken or lane._reply is not None:
                    lane.detach()
                found = err
            self._release_now(lane)  # before the caller goes on: its next call finds the lane idle
            if rows.done():
                return
            if isinstance(found, asyncio.CancelledError):
                rows.cancel()
            elif isinstance(found, BaseException):
                rows.set_exception(found)
            else:
                rows.set_result(found)

        sent.add_done_callback(answered)
        return rows

    def _release_now(self, lane: Lane) -> None:
        """`_release` from a callback: a sound lane goes idle at once; the discard of a lost one (then
        the hand-over of queued calls, as `_release` does) and the hand-over run as tasks."""
        if lane.broken or self._closed:
            self._keep(asyncio.ensure_future(self._release(lane)))
            return
        self._idle.append(lane)
        if self._queue:
            self._keep(asyncio.ensure_future(self._drain()))

    async def run_many(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Several calls (a worker's batch of claims or finishes) in ONE transaction on one lane, in
        order; per call its rows, or the exception that refused it. When one is refused, nothing of
        the transaction is committed and each is run again on its own (as a failed `_serve` batch).
        With every lane busy, the calls queue as batchable calls and share the lanes' batches."""
        if self._closed:
            raise PostgresUnavailable("the worker's PostgreSQL channel is closed")
        lane = None if self._queue else await self._lane()
        if lane is None:
            return list(await asyncio.gather(*(self.run(name, params, batchable=True) for name, params in calls),
                                             return_exceptions=True))
        try:
            if len(calls) > 1:
                answers = await lane.run_batch(calls)
                if answers is not None:
                    self.batches += 1
                    return list(answers)
            results: list[Any] = []
            for name, params in calls:
                if lane.broken:
                    results.append(PostgresUnavailable("the PostgreSQL session was lost"))
                    continue
                try:
                    results.append(await self._run_one(lane, name, params))
                except Exception as err:
                    results.append(err)
            return results
        finally:
            await self._release(lane)

    @staticmethod
    async def _run_one(lane: Lane, name: str, params: Sequence[Any]) -> list[TextRow]:
        try:
            return await lane.run(name, params)
        except BaseException:
            if lane.broken or lane._reply is not None:  # lost, or cancelled with a reply pending
                lane.detach()
            raise

    async def _drain(self) -> None:
        """Hand queued calls to free lanes until the queue is empty or every lane is busy."""
        while self._queue and not self._closed:
            try:
                lane = await self._lane()
            except Exception as err:
                if self._queue:
                    call = self._queue.popleft()
                    if not call.reply.done():
                        call.reply.set_exception(err)
                continue
            if lane is None:
                return
            if not self._queue:
                # while this lane was opening, a lane released meanwhile took the queued calls: this
                # one goes idle (taking a call from an empty queue would lose the lane for good)
                await self._release(lane)
                return
            calls = [self._queue.popleft()]
            if calls[0].batchable:
                while self._queue and self._queue[0].batchable and len(calls) < self.max_batch:
                    calls.append(self._queue.popleft())
            self._keep(asyncio.ensure_future(self._serve(lane, calls)))

    async def _serve(self, lane: Lane, calls: list[_Call]) -> None:
        try:
            if len(calls) > 1:
                try:
                    answers = await lane.run_batch([(c.name, c.params) for c in calls])
                except Exception as err:
                    if not lane.broken:
                        raise
                    for call in calls:
                        if not call.reply.done():
                            call.reply.set_exception(err)
                    return
                if answers is not None:
                    self.batches += 1
                    for call, found in zip(calls, answers):
                        if not call.reply.done():
                            call.reply.set_result(found)
                    return
            for call in calls:  # alone, or one by one after a failed batch: each gets its own answer
                if lane.broken:
                    if not call.reply.done():
                        call.reply.set_exception(PostgresUnavailable("the PostgreSQL session was lost"))
                    continue
                try:
                    found = await self._run_one(lane, call.name, call.params)
                except Exception as err:
                    if not call.reply.done():
                        call.reply.set_exception(err)
                else:
                    if not call.reply.done():
                        call.reply.set_result(found)
        finally:
            await self._release(lane)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            await self._discard(self._idle.pop())
        while self._queue:
            call = self._queue.popleft()
            if not call.reply.done():
                call.reply.set_exception(PostgresUnavailable("the worker's PostgreSQL channel is closed"))
