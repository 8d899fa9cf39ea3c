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

    async def _fetch_all(self, cursor: int) -> list[Entry]:
        entries: list[Entry] = []
        text = sql.command("read_events")
        while True:
            page = (await self._on_session(text, [self.queue, cursor, READ_BATCH])).rows
            for row in page:
                entries.append((str(row["id"]), entry_fields(row["event"], row["data"])))
            if len(page) < READ_BATCH:
                return entries
            cursor = int(page[-1]["id"])

    async def read(self, after_id: str, block_ms: int) -> list[Entry]:
        """Every event after ``after_id`` ("$": after the newest now); when there is none yet, wait
        up to ``block_ms`` (0: until one comes) for a NOTIFY of our queue and read again."""
        if self._closed:
            return []
        cursor = int(await self.last_id()) if after_id == "$" else cursor_of(after_id)
        entries = await self._fetch_all(cursor)  # LISTEN is on before this read: no event slips by
        deadline = time.monotonic() + block_ms / 1000 if block_ms and block_ms > 0 else None
        while not entries and not self._closed:
            # a NOTIFY names only the queue: a queue of that name in another schema wakes us too
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            await self._wait(left)
            if not self._closed:
                entries = await self._fetch_all(cursor)
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

