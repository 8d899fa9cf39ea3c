"""QueueEvents on PostgreSQL: a cursor over upstream's ``event`` table, woken by ``LISTEN bullmq_events``.

``publish_event`` inserts each event (ids from one sequence shared by every queue of the schema)
and NOTIFYs ``bullmq_events`` (payload = the queue name) only when it wins a per-queue try-lock, so
NOTIFYs are coalesced: a reader always reads *everything* past its cursor (``read_events`` pages
of 100 until a short page) and treats a NOTIFY only as "look again". Entries come back shaped as
the Redis stream's (``event``, ``jobId``, ``returnvalue`` as JSON text, ``data`` of ``progress`` as
JSON text, ``delay`` as a number's text ...), with the table's bigint ids as text.

The reader has one session of its own, named ``client_name`` (Node: ``<queue>:qe``, what
getQueueEvents looks for), that reads and LISTENs; when it is lost it is rebuilt on the next read,
which resumes from the cursor the caller passes.

>>> reader = await backend.open_events_reader(backend.client_name(":qe"))
>>> cursor = await reader.last_id()
>>> for event_id, fields in await reader.read(cursor, 5000): ...
"""
from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Optional

from bullmq_compat._backends.base import EventsReader
from bullmq_compat._backends.postgres import rows, sql
from bullmq_compat._backends.postgres.rows import now_ms as rows_now_ms
from bullmq_compat._backends.postgres.worker import is_connection_error, transient
from bullmq_compat._errors import InvalidArgument

if TYPE_CHECKING:
    import psycopg

    from bullmq_compat._backends.postgres.backend import PostgresBackend

#: the NOTIFY channel of ``publish_event`` (upstream's ``listen_events``)
EVENTS_CHANNEL = "bullmq_events"
#: events per ``read_events`` call, as Node's EVENT_READ_BATCH
READ_BATCH = 100

Entry = tuple[str, dict[str, str]]

#: a page of events past a cursor (upstream's ``read_events``) with the snapshot it was read in
READ_WITH_SNAPSHOT = (
    "SELECT pg_snapshot_xmin(s.snap)::text AS xmin, pg_snapshot_xmax(s.snap)::text AS xmax, e.id, e.event, e.data "
    "FROM (SELECT pg_current_snapshot() AS snap) s LEFT JOIN LATERAL ("
    "SELECT id, event, data FROM event WHERE queue = $1 AND id > $2 ORDER BY id ASC LIMIT $3) e ON true")
#: an event id still not committed after this long is not waited for any more (ms)
SETTLE_CAP_MS = 5000
#: a transaction that took an event id has its xid this soon after (ms)
XID_GRACE_MS = 200
#: while a read may still be overtaken by a late commit, look again this soon (s)
UNSETTLED_POLL_S = 0.05


def cursor_of(event_id: str) -> int:
    """An event id as the table's bigint: ``"42"``; a Redis-style ``"0-0"`` / ``"42-0"`` reads as 0 / 42."""
    text = str(event_id).split("-", 1)[0] if "-" in str(event_id)[1:] else str(event_id)
    try:
        return max(int(text), 0)
    except ValueError:
        raise InvalidArgument(f"event id {event_id!r} is not an id of this PostgreSQL queue's events "
                              "(a number, or '$')") from None


def entry_fields(event: str, data: Any) -> dict[str, str]:
    """One row as a Redis stream entry: ``event``, then each data field as text (Node's String(v))."""
    fields = {"event": str(event)}
    for key, value in (data or {}).items():
        if isinstance(value, str):
            fields[key] = value
        elif isinstance(value, (dict, list)):
            fields[key] = rows.dump_out(value)
        else:
            fields[key] = rows.js_string(value)
    return fields


class PostgresEventsReader(EventsReader):
    """Events of one queue, read through a session of its own (see the module docstring)."""

    def __init__(self, backend: "PostgresBackend", client_name: str) -> None:
        self.backend = backend
        self.queue = backend.name
        self.client_name = client_name
        self.conn: Optional["psycopg.AsyncConnection[Any]"] = None
        self.opened = 0  # sessions opened so far
        self._closed = False
        # what `_fetch_new` keeps: ids <= _floor are settled; _returned the ids above it handed out;
        # _marks (highest id read, when, the xmax to wait for) not settled yet; _last the caller's position
        self._floor = 0
        self._last: Optional[int] = None
        self._returned: set[int] = set()
        self._marks: list[tuple[int, int, Optional[int]]] = []

    async def _session(self) -> "psycopg.AsyncConnection[Any]":
        if self.conn is None or self.conn.closed:
            await self._drop()
            conn = await self.backend.connection.open_listen_session(self.client_name or None)
            try:
                await sql.execute(conn, sql.command("listen_events"))
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.backend.connection.close_listen_session(conn)
                raise
            self.conn = conn
            self.opened += 1
        return self.conn

    async def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.backend.connection.close_listen_session(conn)

    async def _on_session(self, text: str, params: list[Any]) -> sql.Result:
        """Run on the reader's session; a lost session is dropped (rebuilt on the next call)."""
        try:
            return await sql.execute(await self._session(), text, params)
        except Exception as err:
            if is_connection_error(err):
                await self._drop()
                raise transient(err) from err
            raise

    async def last_id(self) -> str:
        """The newest event's id of this queue ("0" when there is none): where "$" starts."""
        result = await self._on_session(sql.command("read_events_max"), [self.queue])
        return str(result.rows[0]["max"])

    async def _fetch_all(self, cursor: int) -> tuple[list[Entry], int, int]:
        """Every committed event past ``cursor``, with the oldest xmin and newest xmax of the
        snapshots the pages were read in."""
        entries: list[Entry] = []
        xmin: Optional[int] = None
        xmax = 0
        while True:
            page = (await self._on_session(READ_WITH_SNAPSHOT, [self.queue, cursor, READ_BATCH])).rows
            xmin = int(page[0]["xmin"]) if xmin is None else xmin
            xmax = max(xmax, int(page[0]["xmax"]))
            page = [row for row in page if row["id"] is not None]
            for row in page:
                entries.append((str(row["id"]), entry_fields(row["event"], row["data"])))
            if len(page) < READ_BATCH:
                return entries, xmin, xmax
            cursor = int(page[-1]["id"])

    async def _fetch_new(self) -> list[Entry]:
        """The events not returned yet, lowest id first -- those committed late included.

        Event ids come from a sequence when the row is inserted, so transactions commit out of id
        order: a read that sees id N may not see N-1 yet, and a cursor past N never would
        (Node's reader has that gap). So ids above ``_floor`` are read again until every
        transaction that could hold a lower id has ended: one takes its xid only at its first
        write, maybe just after its id, so the xmax of a snapshot XID_GRACE_MS after the read is
        waited for (a later snapshot's xmin reaches it; at most SETTLE_CAP_MS). The ids returned
        meanwhile are skipped.
        """
        rows, xmin, xmax = await self._fetch_all(self._floor)
        now = rows_now_ms()
        fresh = [(i, f) for i, f in rows if int(i) not in self._returned]
        highest = max((int(i) for i, _ in rows), default=self._floor)
        if highest > self._floor:
            self._marks.append((highest, now, None))
        settled, pending = self._floor, []
        for top, at, confirm in self._marks:
            if confirm is None and now - at >= XID_GRACE_MS:
                confirm = xmax  # every transaction holding an id <= top has its xid by now: below this
            if (confirm is not None and xmin >= confirm) or now - at >= SETTLE_CAP_MS:
                settled = max(settled, top)
            else:
                pending.append((top, at, confirm))
        self._marks = [m for m in pending if m[0] > settled]
        self._returned.update(int(i) for i, _ in fresh)
        self._floor = settled
        self._returned = {i for i in self._returned if i > settled}
        if fresh:
            self._last = int(fresh[-1][0])
        return fresh

    async def read(self, after_id: str, block_ms: int) -> list[Entry]:
        """Every event after ``after_id`` ("$": after the newest now); when there is none yet, wait
        up to ``block_ms`` (0: until one comes) for a NOTIFY of our queue and read again. Events
        committed after later ones come late (out of id order), never lost, never twice."""
        if self._closed:
            return []
        cursor = int(await self.last_id()) if after_id == "$" else cursor_of(after_id)
        if cursor != self._last:  # a position we did not hand out: start from it, all settled
            self._floor, self._last, self._returned, self._marks = cursor, cursor, set(), []
        entries = await self._fetch_new()  # LISTEN is on before this read: no event slips by
        deadline = time.monotonic() + block_ms / 1000 if block_ms and block_ms > 0 else None
        while not entries and not self._closed:
            # a NOTIFY names only the queue: a queue of that name in another schema wakes us too
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if self._marks:  # a late commit may still come, and need not NOTIFY (coalesced): look again soon
                left = UNSETTLED_POLL_S if left is None else min(left, UNSETTLED_POLL_S)
            await self._wait(left)
            if not self._closed:
                entries = await self._fetch_new()
        return [] if self._closed else entries

    async def _wait(self, timeout: Optional[float]) -> None:
        conn = await self._session()
        try:
            async for notify in conn.notifies(timeout=timeout):
                if notify.channel == EVENTS_CHANNEL and notify.payload == self.queue:
                    return
        except Exception as err:
            await self._drop()
            if is_connection_error(err) and not self._closed:
                raise transient(err) from err
            if not self._closed:
                raise

    async def close(self) -> None:
        self._closed = True
        await self._drop()

