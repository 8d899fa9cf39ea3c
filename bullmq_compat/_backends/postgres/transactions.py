"""Upstream's SQL on the caller's own connection, inside the caller's transaction (``transaction=``).

`CallerConnection` stands where a `PostgresConnection` stands for `PostgresBackend`'s adding
methods: each command runs on the caller's psycopg 3 connection (``AsyncConnection``, or a sync
``Connection`` driven from a thread), so the job is visible when the caller commits and gone if it
rolls back; upstream's ``pg_notify`` rides the same transaction, so listening workers wake at the
commit. The caller's ``search_path`` need not name our schema: each command runs with it set for
the transaction (``set_config(..., true)``) and put back after, in one pipelined round trip:

    set aside the caller's search_path (a transaction-local setting of ours), set the schema's
    the command
    put the caller's back

An error (a refused add, a conflict) is raised in the caller's transaction, which is then
aborted, as any failed statement leaves it: the caller decides. Reads that are not part of the
caller's work (the schema check, whether our group objects are installed) stay on our pool.
"""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

from bullmq_compat._backends.postgres import migrator, sql
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._errors import InvalidArgument

#: the caller's search_path, set aside (transaction-local) while a command runs with ours
_SET_PATH = ("WITH aside AS MATERIALIZED (SELECT set_config('bullmq_compat.caller_search_path', "
             "current_setting('search_path'), true)) SELECT set_config('search_path', $1, true) FROM aside")
_RESTORE_PATH = "SELECT set_config('search_path', current_setting('bullmq_compat.caller_search_path'), true)"

ACCEPTED = ("a psycopg 3 AsyncConnection or Connection in an open transaction, a SQLAlchemy Session, "
            "AsyncSession, Connection or AsyncConnection over psycopg, or Django's connection inside "
            "transaction.atomic()")


def _refuse(connection: Any, why: str) -> InvalidArgument:
    kind = f"{type(connection).__module__}.{type(connection).__qualname__}"
    return InvalidArgument(f"transaction={kind}: {why}; transaction= takes {ACCEPTED}")


def check_caller(connection: Any) -> bool:
    """True for a psycopg AsyncConnection, False for a sync one; `InvalidArgument` for anything else
    (another driver's connection) or a connection whose transaction cannot take our writes."""
    import psycopg
    from psycopg import pq

    if isinstance(connection, psycopg.AsyncConnection):
        is_async = True
    elif isinstance(connection, psycopg.Connection):
        is_async = False
    else:
        module = type(connection).__module__.split(".")[0]
        driver = {"asyncpg": "an asyncpg connection", "psycopg2": "a psycopg2 connection"}.get(module)
        raise _refuse(connection, f"{driver} cannot run our SQL" if driver else "not a database connection we can use")
    if connection.closed:
        raise _refuse(connection, "the connection is closed")
    status = connection.info.transaction_status
    if status == pq.TransactionStatus.INERROR:
        raise _refuse(connection, "its transaction has already failed (roll it back first)")
    if status == pq.TransactionStatus.IDLE and connection.autocommit:
        raise _refuse(connection, "an autocommit connection outside a transaction block would commit the job at "
                                  "once (use `async with conn.transaction():` / `with conn.transaction():`)")
    return is_async


class CallerConnection:
    """The caller's connection in our connection's place, for the adding commands (`PostgresBackend.in_transaction`)."""

    def __init__(self, ours: PostgresConnection, connection: Any) -> None:
        self._ours = ours
        self._caller = connection
        self._is_async = check_caller(connection)
        self._path = migrator.quote_schema_name(ours.schema)

    def __getattr__(self, name: str) -> Any:  # schema, groups_version, _pooled, connect: ours
        return getattr(self._ours, name)

    @property
    def groups_version(self) -> int:
        return int(getattr(self._ours, "groups_version", 0) or 0)

    @groups_version.setter
    def groups_version(self, value: int) -> None:
        self._ours.groups_version = value

    async def run(self, name: str, params: Sequence[Any] = ()) -> sql.Result:
        return await self.execute(sql.command(name), params)

    async def execute(self, text: str, params: Sequence[Any] = ()) -> sql.Result:
        if self._is_async:
            return await self._execute_async(text, params)
        return await asyncio.to_thread(self._execute_sync, text, params)

    async def _execute_async(self, text: str, params: Sequence[Any]) -> sql.Result:
        import psycopg
        from psycopg.rows import dict_row

        conn = self._caller
        async with psycopg.AsyncRawCursor(conn) as aside, psycopg.AsyncRawCursor(conn, row_factory=dict_row) as cur, \
                psycopg.AsyncRawCursor(conn) as back:
            async with conn.pipeline():  # the three in one round trip; an error raises at its end
                await aside.execute(_SET_PATH, [self._path])
                await cur.execute(text, list(params))
                await back.execute(_RESTORE_PATH)
            rows = await cur.fetchall() if cur.description is not None else []
            return sql.Result(rows, cur.rowcount)

    def _execute_sync(self, text: str, params: Sequence[Any]) -> sql.Result:
        import psycopg
        from psycopg.rows import dict_row

        conn = self._caller
        with psycopg.RawCursor(conn) as aside, psycopg.RawCursor(conn, row_factory=dict_row) as cur, \
                psycopg.RawCursor(conn) as back:
            with conn.pipeline():
                aside.execute(_SET_PATH, [self._path])
                cur.execute(text, list(params))
                back.execute(_RESTORE_PATH)
            rows = cur.fetchall() if cur.description is not None else []
            return sql.Result(rows, cur.rowcount)
