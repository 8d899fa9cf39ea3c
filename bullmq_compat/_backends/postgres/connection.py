"""A PostgreSQL connection as Node's ``PostgresConnection``: a pool for queries, LISTEN sessions apart.

Every connection we open starts with ``options=-c search_path="<schema>"`` (the LISTEN ones too:
upstream's relay functions resolve names through it) and autocommit, so each upstream command is
its own transaction. A pool passed in by the user is used as it is (its connections must already
reach the schema, e.g. ``kwargs={"options": '-c search_path="bullmq"'}``) and is never closed here.

Only a LISTEN session is named (``application_name``): ``<queue>`` or ``<queue>:w:<worker>`` for a
worker, ``<queue>:qe`` for QueueEvents -- what Node's getWorkers / getQueueEvents look for in
``get_client_list``. Producers stay unnamed.

>>> conn = PostgresConnection("postgresql://postgres@127.0.0.1/test", schema="bullmq", migrate=True)
>>> await conn.connect()
"""
from __future__ import annotations

import asyncio
import contextlib
import select
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Sequence, Union

from bullmq_compat._backends.postgres import migrator, sql
from bullmq_compat._backends.postgres.driver import load_psycopg, mask_password
from bullmq_compat._errors import InvalidArgument, PostgresUnavailable
from bullmq_compat._secrets import scrub, secrets_of

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

    from bullmq_compat._backends.postgres.lanes import Lanes

#: idle seconds before the first TCP keepalive probe on a LISTEN session (Node: 10 s)
LISTEN_KEEPALIVE_IDLE_S = 10
POOL_MAX_SIZE = 10  # node-postgres' Pool default


def _is_pool(value: Any) -> bool:
    try:
        import psycopg_pool
    except ImportError:
        return False
    return isinstance(value, psycopg_pool.AsyncConnectionPool)


def _is_connection(value: Any) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(value, psycopg.AsyncConnection)


#: libpq's words when a server certificate does not verify (sslmode=verify-ca / verify-full)
_TLS_VERIFY_FAILURES = ("certificate verify failed", "does not match host name", "root certificate file")


def _unavailable(where: str, err: BaseException, secrets: Sequence[str]) -> PostgresUnavailable:
    """The error for a failed connection: the address without its password, and libpq's reason
    with every secret of the connection scrubbed (libpq texts may repeat parts of the conninfo)."""
    reason = scrub(str(err).strip().replace("\n", " "), secrets)
    if any(words in reason for words in _TLS_VERIFY_FAILURES):
        reason += (". The server's TLS certificate did not verify: check that sslrootcert= names the CA "
                   "that signed it and that the host name is in the certificate")
    return PostgresUnavailable(f"could not connect to PostgreSQL at {where}: {reason}")


def _parse(url: str) -> tuple[dict[str, Any], list[str]]:
    """(psycopg's keyword arguments of ``url``, its secrets to scrub from messages); a string
    libpq cannot parse is an `InvalidArgument` whose text (libpq quotes the bad token, which may
    be the password) is scrubbed."""
    psycopg, _ = load_psycopg()
    secrets = secrets_of(url)
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as err:
        raise InvalidArgument(f"connection={mask_password(url)!r} is not a PostgreSQL connection string "
                              f"({scrub(str(err).strip(), secrets)})") from None
    password = params.get("password")
    return params, secrets + ([str(password)] if password else [])


def _connect_kwargs(url: str, schema: str) -> tuple[dict[str, Any], list[str]]:
    """(keyword arguments for psycopg's connect, the secrets to scrub from messages)."""
    params, secrets = _parse(url)
    search_path = f"-c search_path={migrator.quote_schema_name(schema)}"
    existing = params.get("options")
    params["options"] = f"{existing} {search_path}" if existing else search_path
    return params, secrets


@contextlib.asynccontextmanager
async def session(url_or_pool: Any) -> AsyncIterator["psycopg.AsyncConnection[Any]"]:
    """One idle session: a new autocommit connection for a URL (closed after), one borrowed from
    a pool, or the connection itself."""
    psycopg, _ = load_psycopg()
    if isinstance(url_or_pool, str):
        params, secrets = _parse(url_or_pool)
        try:
            conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
        except psycopg.OperationalError as err:
            raise _unavailable(mask_password(url_or_pool), err, secrets) from None
        try:
            yield conn
        finally:
            await conn.close()
    elif _is_pool(url_or_pool):
        async with url_or_pool.connection() as conn:
            yield conn
    elif _is_connection(url_or_pool):
        yield url_or_pool
    else:
        raise InvalidArgument(f"connection={url_or_pool!r} must be a postgresql:// URL, a "
                              "psycopg_pool.AsyncConnectionPool or a psycopg.AsyncConnection")


def _gone(conn: "psycopg.AsyncConnection[Any]") -> bool:
    """True when an idle session is closed or has something unread (one select(), no round trip):
    an idle query session gets nothing unasked but the server's goodbye."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class PostgresConnection:
    """The pool and LISTEN sessions of one Queue / Worker / QueueEvents (and its `for_queue` siblings).

    ``connection`` is a ``postgresql://`` URL (we own and close the pool) or a
    ``psycopg_pool.AsyncConnectionPool`` (the user's: used as is, never closed). With
    ``migrate=True`` `connect` runs the migrations; otherwise it makes Node's read-only check,
    which refuses a schema that is missing, too new or (beyond Node) older than the bundle.
    """

    def __init__(self, connection: Union[str, "psycopg_pool.AsyncConnectionPool[Any]"], *,
                 schema: str = migrator.DEFAULT_SCHEMA, migrate: bool = False,
                 max_size: int = POOL_MAX_SIZE) -> None:
        migrator.quote_schema_name(schema)  # a bad name fails here, before any connection
        self.schema = schema
        self.migrate = migrate
        self._ready: Optional[asyncio.Task[int]] = None
        self._closed = False
        self._listeners: list[tuple["psycopg.AsyncConnection[Any]", bool]] = []
        self._add_lanes: Optional["Lanes"] = None
        self.schema_version = 0
        #: our group objects' version in the schema, once checked (0: not yet known)
        self.groups_version = 0
        if isinstance(connection, str):
            self._params, self._secrets = _connect_kwargs(connection, schema)
            self.where = mask_password(connection)
            self._pool: Optional["psycopg_pool.AsyncConnectionPool[Any]"] = None
            self._owns_pool = True
            self._max_size = max_size
        elif _is_pool(connection):
            given = connection.kwargs  # a dict, or (newer psycopg-pool) a callable giving one
            self._params, self._secrets = {}, secrets_of([connection.conninfo,
                                                          dict(given) if isinstance(given, dict) else {}])
            self.where = f"{type(connection).__name__}({connection.name!r})"
            self._pool = connection
            self._owns_pool = False
        else:
            load_psycopg()  # without psycopg, say what to install rather than what was passed
            raise InvalidArgument(f"connection={connection!r} must be a postgresql:// URL or a "
                                  "psycopg_pool.AsyncConnectionPool")

    @property
    def description(self) -> str:
        """``<url without password> (schema <name>)``, for messages."""
        return f"{self.where} (schema {self.schema})"

    @property
    def closed(self) -> bool:
        return self._closed

    async def connect(self) -> int:
        """Reach the server and check (or migrate) the schema, once; returns the schema version."""
        if self._closed:
            raise PostgresUnavailable(f"the connection to {self.description} is closed")
        if self._ready is None or (self._ready.done() and self._ready.exception() is not None):
            self._ready = asyncio.ensure_future(self._bootstrap())
        ready = self._ready
        try:
            return await asyncio.shield(ready)
        except asyncio.CancelledError:
            if self._closed and ready.cancelled():  # close() stopped it, not a cancel of our caller
                raise PostgresUnavailable(f"the connection to {self.description} was closed while "
                                          "connecting") from None
            raise

    async def _bootstrap(self) -> int:
        psycopg, psycopg_pool = load_psycopg()
        if self._owns_pool:
            try:
                conn = await psycopg.AsyncConnection.connect(**self._params, autocommit=True)
            except psycopg.OperationalError as err:
                raise _unavailable(self.where, err, self._secrets) from None
            try:
                version = await self._check(conn)
            finally:
                await conn.close()
            if self._pool is None:
                pool = psycopg_pool.AsyncConnectionPool(
                    kwargs={**self._params, "autocommit": True}, min_size=1, max_size=self._max_size,
                    open=False, name=f"bullmq:{self.schema}")
                await pool.open(wait=False)
                self._pool = pool
        else:
            assert self._pool is not None
            try:
                async with self._pool.connection() as conn:
                    version = await self._check(conn)
            except psycopg_pool.PoolTimeout as err:
                raise _unavailable(self.where, err, self._secrets) from None
        self.schema_version = version
        return version

    async def _check(self, conn: "psycopg.AsyncConnection[Any]") -> int:
        if self.migrate:
            return await migrator.run_migrations(conn, self.schema)
        return await migrator.check_schema(conn, self.schema)

    @property
    def pool(self) -> "psycopg_pool.AsyncConnectionPool[Any]":
        if self._pool is None:
            raise RuntimeError("PostgresConnection.connect() has not been awaited yet")
        return self._pool

    async def run(self, name: str, params: Sequence[Any] = ()) -> sql.Result:
        """Run upstream's command ``name`` on a pooled connection."""
        return await self.execute(sql.command(name), params)

    async def execute(self, text: str, params: Sequence[Any] = ()) -> sql.Result:
        if self._pool is None:
            await self.connect()
        async with self._pooled() as conn:
            result = await sql.execute(conn, text, params)
            if not conn.autocommit:  # a user's pool without autocommit: the pool would roll it back
                await conn.commit()
            return result

    @contextlib.asynccontextmanager
    async def _pooled(self) -> AsyncIterator["psycopg.AsyncConnection[Any]"]:
        """A pooled session the server has not already ended (`borrow`), given back after."""
        conn = await self.borrow()
        try:
            yield conn
        finally:
            await self.pool.putconn(conn)

    async def borrow(self) -> "psycopg.AsyncConnection[Any]":
        """A pooled session the server has not already ended; give it back with ``pool.putconn``.
        After a server restart (or pg_terminate_backend) every idle session in the pool is dead;
        node-postgres drops such idle clients as their socket errors, psycopg's pool hands them
        out. So one that has anything unread while idle (the server's FATAL, or EOF) is given back
        to be discarded, not used."""
        pool = self.pool
        conn: "psycopg.AsyncConnection[Any]"
        for _ in range(self._max_size if self._owns_pool else POOL_MAX_SIZE):
            conn = await pool.getconn()
            if not _gone(conn):
                return conn
            await self.discard(conn)
        conn = await pool.getconn()
        return conn

    async def discard(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        """Close a borrowed session and give it back: the pool drops it and opens another."""
        with contextlib.suppress(Exception):
            await conn.close()
        await self.pool.putconn(conn)

    def add_lanes(self) -> Optional["Lanes"]:
        """The raw-libpq sessions of the adds (`lanes.Lanes`, up to the pool's size, opened as needed:
        no pool checkout and no cursor per add), when we own the pool; None for a user's pool,
        whose sessions a lane would hold for good (then the adds go through the pool)."""
        if not self._owns_pool or self._closed:
            return None
        if self._add_lanes is None:
            from bullmq_compat._backends.postgres.lanes import Lanes

            self._add_lanes = Lanes(self, self._max_size, check_idle=True)
        return self._add_lanes

    async def open_listen_session(self, application_name: Optional[str] = None
                                  ) -> "psycopg.AsyncConnection[Any]":
        """A dedicated autocommit session for LISTEN, with TCP keepalive, named ``application_name``.

        Our own connection when we own the pool (it never takes a pool slot); one borrowed from the
        user's pool otherwise (returned, closed, by `close_listen_session`).
        """
        pg, _ = load_psycopg()
        await self.connect()
        conn: "psycopg.AsyncConnection[Any]"
        if self._owns_pool:
            extra: dict[str, Any] = {"keepalives": 1, "keepalives_idle": LISTEN_KEEPALIVE_IDLE_S}
            if application_name:
                extra["application_name"] = application_name
            try:
                conn = await pg.AsyncConnection.connect(**{**self._params, **extra}, autocommit=True)
            except pg.OperationalError as err:
                raise _unavailable(self.where, err, self._secrets) from None
            self._listeners.append((conn, True))
        else:
            conn = await self.pool.getconn()
            self._listeners.append((conn, False))
            if not conn.autocommit:
                await conn.set_autocommit(True)
            if application_name:
                await sql.execute(conn, "SELECT set_config('application_name', $1, false)", [application_name])
        return conn

    async def close_listen_session(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        for index, (held, own) in enumerate(self._listeners):
            if held is conn:
                del self._listeners[index]
                await conn.close()
                if not own and self._pool is not None:
                    await self._pool.putconn(conn)  # closed: the pool discards it, no session state leaks
                return

    async def close(self) -> None:
        """Close the LISTEN sessions and, when we own it, the pool. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
            with contextlib.suppress(BaseException):
                await self._ready
        if self._add_lanes is not None:
            await self._add_lanes.close()
        for conn, _own in list(self._listeners):
            await self.close_listen_session(conn)
        if self._owns_pool and self._pool is not None:
            await self._pool.close()
