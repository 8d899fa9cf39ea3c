"""A LISTEN session read whenever its socket is readable, as node-postgres reads every session.

psycopg reads a session only while a command or ``notifies()`` runs on it, so a session that LISTENs
between waits piles notifications up, and each wait first drains them through ``notifies()``'s
generator machinery (about 120 µs a read with ten relay nodes in one process, where every session
receives every node's NOTIFY). `NotifyWatch` takes the session's socket instead: ``add_reader``,
``consume_input`` and libpq's own notification list, keeping only whether one with our channel and
payload arrived since `clear`. The session must not be used by psycopg while watched (LISTEN first,
then watch; `close` before anything else runs on it).

>>> watch = NotifyWatch(conn, "bullmq_relay", "default:n1")
>>> watch.clear(); rows = await read(); await watch.wait(5.0)   # True at our NOTIFY, False at 5 s
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import psycopg


class NotifyWatch:
    """Whether a NOTIFY on ``channel`` with ``payload`` arrived on ``conn`` since `clear` (see the module)."""

    def __init__(self, conn: "psycopg.AsyncConnection[Any]", channel: str, payload: str) -> None:
        self.pg = conn.pgconn
        self.channel = channel.encode()
        self.payload = payload.encode()
        #: the error that ended the session (the server closed it, the socket broke); None while alive
        self.lost: Optional[BaseException] = None
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._fd = self.pg.socket
        self._watching = True
        self._loop.add_reader(self._fd, self._readable)
        self._readable()  # what libpq had read already (during LISTEN)

    def _readable(self) -> None:
        import psycopg
        from psycopg import pq

        try:
            self.pg.consume_input()
        except psycopg.Error as err:
            self._lose(err)
            return
        notifies, channel, payload = self.pg.notifies, self.channel, self.payload
        while True:
            notify = notifies()
            if notify is None:
                break
            if notify.relname == channel and notify.extra == payload:
                self._event.set()
        if self.pg.status != pq.ConnStatus.OK:
            self._lose(psycopg.OperationalError("the PostgreSQL session was closed by the server"))

    def _lose(self, err: BaseException) -> None:
        if self.lost is None:
            self.lost = err
        self.close()
        self._event.set()  # a waiter returns at once, and sees `lost`

    def clear(self) -> None:
        """Forget what arrived so far (a read follows, which sees the rows those notified)."""
        if self.lost is None:
            self._readable()  # anything the loop has not handed us yet counts as before the read
            if self.lost is None:
                self._event.clear()

    async def wait(self, timeout: float) -> bool:
        """True when our notification arrived since `clear` (at once if it already had), False at
        ``timeout`` or when the session is lost (`lost` says so)."""
        if not self._event.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set() and self.lost is None

    def poke(self) -> None:
        """Wake a waiter as if notified (an interrupt: the waiter's caller knows why)."""
        self._event.set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def close(self) -> None:
        """Stop reading the socket (before the session is closed or used by psycopg again)."""
        if self._watching:
            self._watching = False
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
