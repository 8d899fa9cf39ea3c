"""The relay on PostgreSQL (Node's ``PostgresRelayBackend``): upstream's ``relay_*`` commands.

Every operation is one of upstream's ``relay_*`` SQL functions (migration ``0004_relay``), run
through its command file on the pool with Node's arguments; this module only passes them and decodes
rows. Refusals (``RAISE ... ERRCODE 'BM001', DETAIL '<code>'``) raise `RelayError` with the code,
detailed (as Node does) with the topic or pattern of a publish, subscribe or delete.

Inbox reads acknowledge by id: the cursor is the comma-joined ids of the batch last returned
(``''`` at first), deleted by the next read or trim, so a row whose transaction committed late is
never skipped. A read that finds nothing waits for a ``NOTIFY`` on ``bullmq_relay`` whose payload is
``<namespace>:<node id>`` (upstream's publish sends one per node it delivered to), or for
``block_ms``, then reads again: a missed notification only delays delivery.

The wait runs on a LISTEN session of the backend's own (our own connection when we own the pool, one
borrowed from a user's pool otherwise, so such a pool needs ``max_size >= 2``, as Node requires),
named ``bullmq:relay:<sha256 of [database, schema, namespace, node id]>``, cut to 63 bytes, exactly
as Node names it: ``get_node_connections`` finds a Node node's session and Node finds ours. A session
the server ends (a restart, ``pg_terminate_backend``) is noticed at the next read or wait, dropped,
and re-opened (LISTEN again) by the next read.

>>> backend = PostgresRelayBackend("postgresql://postgres@127.0.0.1/test", namespace="default",
...                                node_id="n1", schema="bullmq", inbox_max_length=10000)
>>> await backend.wait_until_ready()
>>> await backend.register_node("n1", 30000, {"name": None, "host": "h", "pid": 1, "version": "6.7.0"}, 10000)
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from bullmq_compat._backends.base import RelayBackend, RelayBatch, RelayEntry
from bullmq_compat._backends.postgres import migrator, sql
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._backends.postgres.driver import is_pool, load_psycopg
from bullmq_compat._backends.postgres.notify import NotifyWatch
from bullmq_compat._backends.postgres.worker import transient
from bullmq_compat._errors import InvalidArgument, PostgresUnavailable, RelayError

if TYPE_CHECKING:
    import psycopg

#: the NOTIFY channel of upstream's ``relay_publish`` (``listen_relay``)
RELAY_CHANNEL = "bullmq_relay"
#: PostgreSQL truncates ``application_name`` to 63 bytes
MAX_APPLICATION_NAME = 63
APPLICATION_NAME_PREFIX = "bullmq:relay:"


def inbox_connection_name(database: str, schema: str, namespace: str, node_id: str) -> str:
    """The ``application_name`` of a node's inbox (LISTEN) session, as Node computes it:
    ``bullmq:relay:`` + the first 50 hex digits of sha256(JSON.stringify([db, schema, ns, node]))."""
    text = json.dumps([database, schema, namespace, node_id], ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return APPLICATION_NAME_PREFIX + digest[:MAX_APPLICATION_NAME - len(APPLICATION_NAME_PREFIX)]


def _ack_ids(cursor: Any) -> list[int]:
    """The ids a cursor acknowledges (``''``/None: none)."""
    if not cursor:
        return []
    return [int(part) for part in str(cursor).split(",") if part]


def _bool(value: Any) -> bool:
    """A boolean column, typed (psycopg) or as text (a lane: ``t`` / ``f``)."""
    return value == "t" if isinstance(value, str) else bool(value)


def _endpoints(value: Any) -> list[str]:
    """A ``text[]`` column, typed (a list) or in PostgreSQL's array text form (``{a,"b c"}``)."""
    if value is None:
        return []
    if not isinstance(value, str):
        return [str(item) for item in value]
    inner = value[1:-1] if value.startswith("{") and value.endswith("}") else value
    if not inner:
        return []
    if '"' not in inner and "\\" not in inner:
        return inner.split(",")
    items: list[str] = []
    i, n = 0, len(inner)
    while i < n:
        if inner[i] == '"':  # quoted: backslash escapes, ends at the unescaped quote
            i += 1
            chars: list[str] = []
            while i < n and inner[i] != '"':
                if inner[i] == "\\":
                    i += 1
                chars.append(inner[i])
                i += 1
            items.append("".join(chars))
            i += 2  # the quote and the comma
        else:
            end = inner.find(",", i)
            end = n if end < 0 else end
            items.append(inner[i:end])
            i = end + 1
    return items


class PostgresRelayBackend(RelayBackend):
    """One relay node's PostgreSQL side (see the module docstring)."""

    kind = "postgres"
    label = "PostgreSQL"
    initial_inbox_cursor = ""

    def __init__(self, connection: Any, *, namespace: str, node_id: Optional[str] = None,
                 schema: Optional[str] = None, inbox_max_length: int = 10000) -> None:
        pg, pg_pool = load_psycopg()
        if is_pool(connection):
            max_size = getattr(connection, "max_size", None)
            if max_size is not None and max_size < 2:
                raise InvalidArgument("Relay requires a supplied PostgreSQL pool with max >= 2")
        self.namespace = namespace
        self.node_id = node_id
        self.inbox_max_length = inbox_max_length
        self.connection = PostgresConnection(connection, schema=schema or migrator.DEFAULT_SCHEMA)
        self.transient_errors = (PostgresUnavailable, pg.OperationalError, pg_pool.PoolTimeout)
        self._listen_conn: Optional["psycopg.AsyncConnection[Any]"] = None
        self._watch: Optional[NotifyWatch] = None
        self._payload = f"{namespace}:{node_id or ''}"
        #: LISTEN sessions opened so far (a test sees a rebuild as > 1)
        self.listen_sessions_opened = 0
        self._identity: Optional[tuple[str, str]] = None
        self._interrupted = False
        self._closing: Optional["asyncio.Future[None]"] = None
        self._reading: Optional["asyncio.Future[Any]"] = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def wait_until_ready(self) -> None:
        """Reach the server and check the schema is migrated (Node's read-only check)."""
        await self.connection.connect()

    async def close(self) -> None:
        if self._closing is None:
            self.interrupt_inbox()
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        reading = self._reading
        if reading is not None and not reading.done():  # interrupted: it ends at once
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(reading), 5)
        await self._drop_listener()
        await self.connection.close()

    def interrupt_inbox(self) -> None:
        """A blocked `read_inbox` returns at once; later reads return without waiting."""
        self._interrupted = True
        watch = self._watch
        if watch is None or watch.loop.is_closed():
            return
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is watch.loop:
            watch.poke()
        else:
            watch.loop.call_soon_threadsafe(watch.poke)

    # -- running commands ---------------------------------------------------------------------
    async def _run(self, command: str, params: Sequence[Any], detail: Optional[str] = None) -> sql.Result:
        """Upstream's command on the pool; its BM001 refusal as `RelayError` (detailed with
        ``detail``, as Node does), connection trouble as one of `transient_errors`."""
        try:
            return await self.connection.run(command, params)
        except Exception as err:
            raise self._refusal(err, detail) from err

    async def _rows(self, command: str, params: Sequence[Any], detail: Optional[str] = None) -> Sequence[Any]:
        """The rows of a command of the read and publish loops: on the connection's libpq lanes
        (no pool checkout, no cursor; values as text, which `_bool` / `_endpoints` read) when we
        own the pool, else as `_run` (values typed by psycopg)."""
        lanes = self.connection.add_lanes() if type(self.connection) is PostgresConnection else None
        if lanes is None:
            return (await self._run(command, params, detail)).rows
        try:
            return await lanes.run(command, params)
        except Exception as err:
            raise self._refusal(err, detail) from err

    @staticmethod
    def _refusal(err: Exception, detail: Optional[str]) -> BaseException:
        if getattr(err, "sqlstate", None) == sql.DOMAIN_ERROR_SQLSTATE:
            text = getattr(getattr(err, "diag", None), "message_detail", None) or ""
            try:
                code = int(text)
            except ValueError:
                code = 0
            return RelayError(code, detail)
        return transient(err)

    # -- nodes --------------------------------------------------------------------------------
    async def register_node(self, node_id: str, lease_ms: int, info: Mapping[str, Any],
                            inbox_max_length: int) -> None:
        await self._run("relay_register_node", [self.namespace, node_id, int(lease_ms),
                                                json.dumps(dict(info or {}), separators=(",", ":"))])

    async def heartbeat(self, node_id: str, lease_ms: int) -> bool:
        rows = await self._rows("relay_heartbeat", [self.namespace, node_id, int(lease_ms)])
        return _bool(rows[0]["alive"])

    async def unregister_node(self, node_id: str) -> bool:
        rows = (await self._run("relay_unregister_node", [self.namespace, node_id])).rows
        return bool(rows[0]["removed"])

    async def sweep(self, limit: int) -> list[str]:
        rows = (await self._run("relay_sweep", [self.namespace, int(limit)])).rows
        return [str(row["node_id"]) for row in rows]

    # -- subscriptions and messages -----------------------------------------------------------
    async def subscribe(self, node_id: str, endpoint_id: str, pattern: str) -> tuple[bool, Optional[dict[str, Any]]]:
        rows = (await self._run("relay_subscribe", [self.namespace, node_id, endpoint_id, pattern], pattern)).rows
        row = rows[0]
        retained = None
        if row["retained_mid"] is not None:
            retained = {"mid": str(row["retained_mid"]), "ts": int(row["retained_ts"]),
                        "data": row["retained_data"]}
        return bool(row["added"]), retained

    async def remove_endpoint(self, node_id: str, endpoint_id: str) -> int:
        rows = (await self._run("relay_remove_endpoint", [self.namespace, node_id, endpoint_id])).rows
        return int(rows[0]["removed"])

    async def publish(self, topic: str, data: str, *, ts: int, retain_ms: int, max_size: int) -> dict[str, Any]:
        rows = await self._rows("relay_publish", [self.namespace, topic, data, int(ts), int(retain_ms),
                                                  int(max_size)], topic)
        row = rows[0]
        return {"mid": str(row["message_id"]), "nodes": int(row["node_count"]),
                "endpoints": int(row["endpoint_count"])}

    async def delete_retained(self, topic: str) -> bool:
        rows = (await self._run("relay_delete_retained", [self.namespace, topic], topic)).rows
        return bool(rows[0]["deleted"])

    # -- the inbox ----------------------------------------------------------------------------
    async def read_inbox(self, node_id: str, cursor: Any, *, block_ms: int, count: int) -> RelayBatch:
        """Acknowledge ``cursor``'s ids and return the oldest entries left (up to ``count``); when
        there are none, wait up to ``block_ms`` for our NOTIFY (or `interrupt_inbox`) and read again."""
        task = asyncio.ensure_future(self._read_inbox(node_id, cursor, int(block_ms), int(count)))
        self._reading = task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # our caller was cancelled: so is the read (its session is then unknown)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                await self._drop_listener()
            raise
        finally:
            if self._reading is task:
                self._reading = None

    async def _read_inbox(self, node_id: str, cursor: Any, block_ms: int, count: int) -> RelayBatch:
        waiting = block_ms > 0
        self._payload = f"{self.namespace}:{node_id}"
        if self._watch is not None:
            self._watch.payload = self._payload.encode()
        if not self._interrupted:
            # LISTEN (and drop what was notified already) before reading: a row committed after
            # the read notifies the session, and the wait below sees it.
            await self._prepare_listener()
        rows = await self._read_rows(node_id, _ack_ids(cursor), count)
        if not rows and waiting and not self._interrupted and self._watch is not None:
            await self._wait_notify(block_ms / 1000)
            if not self._interrupted:
                rows = await self._read_rows(node_id, [], count)
        entries = [RelayEntry(kind=str(row["kind"]), topic=str(row["topic"]), mid=str(row["mid"]),
                              ts=int(row["ts"]), data=str(row["data"]), endpoints=_endpoints(row["endpoints"]))
                   for row in rows]
        return RelayBatch(entries=entries, cursor=",".join(str(row["id"]) for row in rows))

    async def _read_rows(self, node_id: str, ack: list[int], count: int) -> Sequence[Any]:
        return await self._rows("relay_read_inbox", [self.namespace, node_id, ack, count])

    async def trim_inbox(self, node_id: str, cursor: Any, max_length: int) -> int:
        rows = await self._rows("relay_trim_inbox", [self.namespace, node_id, _ack_ids(cursor), int(max_length)])
        return int(rows[0]["backlog"])

    # -- the LISTEN session -------------------------------------------------------------------
    @property
    def listening(self) -> bool:
        """Whether the inbox session LISTENs now (a read opened it and the server has not ended it)."""
        return self._watch is not None and self._watch.lost is None

    async def _listener(self) -> NotifyWatch:
        """The LISTENing session's watch, the session opened (named after the node, LISTEN sent)
        when there is none or it was lost."""
        watch = self._watch
        if watch is not None and watch.lost is None:
            return watch
        await self._drop_listener()
        name = None
        if self.node_id:
            database, schema = await self._connection_identity()
            name = inbox_connection_name(database, schema, self.namespace, self.node_id)
        try:
            conn = await self.connection.open_listen_session(name)
        except Exception as err:
            raise transient(err) from err
        self._listen_conn = conn
        self.listen_sessions_opened += 1
        try:
            await sql.execute(conn, sql.command("listen_relay"))
        except Exception as err:
            await self._drop_listener()
            raise transient(err) from err
        self._watch = NotifyWatch(conn, RELAY_CHANNEL, self._payload)
        if self._interrupted:
            self._watch.poke()
        return self._watch

    async def _prepare_listener(self) -> None:
        """LISTEN, and forget the notifications already received (their rows are committed, so the
        read that follows sees them). A session the server ended is re-opened once."""
        lost: BaseException = PostgresUnavailable("the relay's LISTEN session was lost")
        for _ in (1, 2):
            watch = await self._listener()
            watch.clear()
            if watch.lost is None:
                return
            lost = watch.lost
        raise transient(lost) from lost

    async def _wait_notify(self, timeout: float) -> bool:
        """True at a NOTIFY for our node; False at ``timeout``, an interrupt or a lost session
        (dropped: the next read LISTENs again on a new one)."""
        watch = self._watch
        if watch is None or self._interrupted:
            return False
        notified = await watch.wait(timeout)
        if watch.lost is not None:
            await self._drop_listener()
            return False
        return notified and not self._interrupted

    async def _drop_listener(self) -> None:
        conn, self._listen_conn = self._listen_conn, None
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.connection.close_listen_session(conn)

    async def _connection_identity(self) -> tuple[str, str]:
        """(current_database(), current_schema()) of our sessions, asked once."""
        if self._identity is None:
            try:
                row = (await self.connection.execute(
                    "SELECT current_database() AS database, current_schema() AS schema")).rows[0]
            except Exception as err:
                raise transient(err) from err
            self._identity = (str(row["database"]), str(row["schema"]))
        return self._identity

    # -- getters ------------------------------------------------------------------------------
    async def get_counts(self) -> dict[str, int]:
        row = (await self._run("relay_get_counts", [self.namespace])).rows[0]
        return {key: int(row[key]) for key in ("nodes", "subscriptions", "patterns", "retained")}

    async def get_nodes(self, start: int, end: int) -> list[dict[str, Any]]:
        rows = (await self._run("relay_get_nodes", [self.namespace, int(start), int(end)])).rows
        return [{
            "id": str(row["node_id"]),
            "info": row["info"] if row["info"] is not None else {},
            "registered_at": int(row["registered_at"]),
            "lease_until": int(row["lease_until"]),
            "last_heartbeat": None if row["last_heartbeat"] is None else int(row["last_heartbeat"]),
            "backlog": int(row["backlog"]),
            "dropped": int(row["dropped"]),
            "subscriptions": int(row["subscriptions"]),
        } for row in rows]

    async def get_subscriptions(self, node_id: Optional[str], pattern: Optional[str], start: int,
                                end: int) -> list[dict[str, str]]:
        rows = (await self._run("relay_get_subscriptions", [self.namespace, node_id, pattern, int(start),
                                                            int(end)])).rows
        return [{"node_id": str(row["node_id"]), "endpoint_id": str(row["endpoint_id"]),
                 "pattern": str(row["pattern"])} for row in rows]

    async def get_patterns(self, start: int, end: int) -> list[dict[str, Any]]:
        rows = (await self._run("relay_get_patterns", [self.namespace, int(start), int(end)])).rows
        return [{"pattern": str(row["pattern"]), "subscriptions": int(row["subscriptions"])} for row in rows]

    async def get_retained(self, start: int, end: int) -> list[dict[str, Any]]:
        rows = (await self._run("relay_get_retained", [self.namespace, int(start), int(end)])).rows
        return [{"topic": str(row["topic"]), "expires_at": int(row["expires_at"]), "mid": str(row["mid"]),
                 "ts": int(row["ts"]), "data": str(row["data"])} for row in rows]

    async def get_node_connections(self, node_id: str) -> list[dict[str, Any]]:
        await self.connection.connect()
        database, schema = await self._connection_identity()
        name = inbox_connection_name(database, schema, self.namespace, node_id)
        rows = (await self._run("relay_get_node_connections", [name, database])).rows
        return [{"address": str(row["address"]), "age": int(row["age"]), "idle": int(row["idle"])} for row in rows]

    async def get_namespaces(self) -> list[str]:
        rows = (await self._run("relay_get_namespaces", [])).rows
        return [str(row["ns"]) for row in rows]
