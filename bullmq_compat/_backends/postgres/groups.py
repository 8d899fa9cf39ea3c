"""Per-group FIFO on PostgreSQL: the gate inside the database (docs/groups.md, "On PostgreSQL").

Our objects (``groups_sql/0001_group_gate.sql``: two settings tables, two partial indexes on
upstream's ``job``, functions and triggers, all named ``bullmq_compat_*``) hold a group job back
in upstream's ``waiting-children`` state until its group has a free slot, and release the next one
inside the very transaction in which upstream's SQL function finishes, fails or removes a job,
whoever called it: no keeper. They are installed by our own migration, with a ledger of our own
(``bullmq_compat_migration``), beside Node's: upstream's tables, functions and ``migration`` ledger
are untouched, so Node's ``runMigrations`` and its read-only check pass as before.

>>> await migrate_postgres("postgresql://postgres@127.0.0.1/test", schema="bullmq", groups=True)
>>> await drop_postgres_groups("postgresql://postgres@127.0.0.1/test", schema="bullmq")
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from bullmq_compat._backends.base import GroupGate
from bullmq_compat._backends.postgres import migrator, sql
from bullmq_compat._errors import GroupsNotInstalled, InvalidArgument, SchemaMigrationRequired
from bullmq_compat._groups import held_priority_refusal

if TYPE_CHECKING:
    import psycopg

    from bullmq_compat._backends.postgres.backend import PostgresBackend

SQL_DIR = Path(__file__).resolve().parent / "groups_sql"
#: our migrations' advisory lock ("BQCG"), per schema; Node's is 0x42554c4c ("BULL")
GROUPS_ADVISORY_LOCK_KEY = 0x42514347
#: the triggers version 1 installs: a schema missing one (say, Node rebuilt ``job``, or an early
#: build's triggers stand in for these) is repaired
TRIGGERS = ("bullmq_compat_gate_insert", "bullmq_compat_gate_update", "bullmq_compat_release_delete",
            "bullmq_compat_gated_events")
#: the version of our objects that has group rate limits (groups_sql/0004_group_rate_limit.sql)
RATE_LIMIT_VERSION = 4
#: bullmq_compat_rate_limit_job's refusal (BM001, DETAIL) for a job that is not a group job
NOT_A_GROUP_JOB = -9
_MIGRATION_FILE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql\Z")


@dataclass(frozen=True)
class GroupMigration:
    version: int
    name: str
    text: str


def group_migrations() -> list[GroupMigration]:
    """Our group migrations, in order."""
    found = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        match = _MIGRATION_FILE.match(path.name)
        if match:
            found.append(GroupMigration(int(match.group(1)), path.stem, path.read_text("utf-8")))
    return found


def latest_groups_version() -> int:
    return group_migrations()[-1].version


async def _installed_state(conn: "psycopg.AsyncConnection[Any]", schema: str) -> tuple[int, int]:
    """(our ledger's version, 0 when none; how many of our triggers the schema has)."""
    quoted = migrator.quote_schema_name(schema)
    row = (await sql.execute(conn, """SELECT to_regclass($1) IS NOT NULL AS ledger,
             (SELECT count(*)::int FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = $2 AND t.tgname = ANY($3)) AS triggers""",
                             [f"{quoted}.bullmq_compat_migration", schema, list(TRIGGERS)])).rows[0]
    if not row["ledger"]:
        return 0, int(row["triggers"])
    version = (await sql.execute(conn, f"SELECT COALESCE(MAX(version), 0)::int AS v FROM {quoted}.bullmq_compat_migration"
                                 )).rows[0]["v"]
    return int(version), int(row["triggers"])


async def install_groups(conn: "psycopg.AsyncConnection[Any]", schema: str) -> int:
    """Install (or bring up to date) our group objects in ``schema`` on the idle session ``conn``;
    returns our version. The schema must carry Node's migrations already."""
    quoted = migrator.quote_schema_name(schema)
    try:
        upstream_version = await migrator.check_schema(conn, schema)
    except SchemaMigrationRequired:
        raise SchemaMigrationRequired(schema, (
            f"PostgreSQL schema {schema!r} has no BullMQ migrations yet (no migration ledger), so bullmq-compat's "
            f"group objects cannot be installed: migrate it first (Node's runMigrations, or "
            f"bullmq_compat.migrate_postgres(url, schema={schema!r}, groups=True), which does both)")) from None
    del upstream_version
    migrations = group_migrations()
    async with conn.transaction():
        await sql.execute(conn, "SELECT pg_advisory_xact_lock($1, hashtext($2))", [GROUPS_ADVISORY_LOCK_KEY, schema])
        await sql.execute(conn, f"SET LOCAL search_path TO {quoted}")
        current, triggers = await _installed_state(conn, schema)
        if current and triggers < len(TRIGGERS):
            # our ledger says installed but objects are gone (a rebuilt table): start over
            await sql.execute(conn, (SQL_DIR / "drop.sql").read_text("utf-8"))
            current = 0
        await sql.execute(conn, """CREATE TABLE IF NOT EXISTS bullmq_compat_migration (
               version    integer PRIMARY KEY,
               name       text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now()
             )""")
        for migration in migrations:
            if migration.version > current:
                await sql.execute(conn, migration.text)
                await sql.execute(conn, "INSERT INTO bullmq_compat_migration (version, name) VALUES ($1, $2)",
                                  [migration.version, migration.name])
    return max(current, migrations[-1].version)


async def drop_groups(conn: "psycopg.AsyncConnection[Any]", schema: str) -> int:
    """Remove our group objects from ``schema`` (held jobs are released to wait first); returns how
    many held jobs were released. Upstream's objects are left as Node's migrations made them."""
    quoted = migrator.quote_schema_name(schema)
    async with conn.transaction():
        await sql.execute(conn, "SELECT pg_advisory_xact_lock($1, hashtext($2))", [GROUPS_ADVISORY_LOCK_KEY, schema])
        await sql.execute(conn, f"SET LOCAL search_path TO {quoted}")
        held = 0
        if (await sql.execute(conn, "SELECT to_regclass('job') IS NOT NULL AS ok")).rows[0]["ok"]:
            held = int((await sql.execute(
                conn, "SELECT count(*)::int AS n FROM job WHERE opts ? 'group' AND jsonb_typeof(opts -> 'group') = "
                      "'object' AND state = 'waiting-children' AND pending_deps = 0")).rows[0]["n"])
        await sql.execute(conn, (SQL_DIR / "drop.sql").read_text("utf-8"))
    return held if held else 0


async def groups_version(conn: "psycopg.AsyncConnection[Any]", schema: str) -> int:
    """Our installed version in ``schema`` (0: not installed, or objects missing)."""
    version, triggers = await _installed_state(conn, schema)
    return version if triggers == len(TRIGGERS) else 0


def _now() -> int:
    return int(time.time() * 1000)


class PostgresGroups(GroupGate):
    """The group API of one PostgreSQL queue: calls of our ``bullmq_compat_*`` functions."""

    def __init__(self, backend: "PostgresBackend") -> None:
        self.backend = backend

    async def ready(self) -> None:
        await self.backend.ensure_groups()

    async def _call(self, text: str, params: list[Any]) -> sql.Result:
        await self.ready()
        return await self.backend.connection.execute(text, params)

    async def _set(self, gid: Optional[str], field: str, value: Optional[int]) -> int:
        result = await self._call("SELECT bullmq_compat_set_group($1, $2, $3, $4, $5) AS n",
                                  [self.backend.name, gid, field, value, _now()])
        return int(result.rows[0]["n"])

    async def set_concurrency(self, gid: Optional[str], concurrency: int) -> None:
        await self._set(gid, "concurrency", concurrency)

    async def set_ordering_delay(self, gid: Optional[str], ms: Optional[int]) -> None:
        await self._set(gid, "ordering_delay_ms", ms)

    async def set_paused(self, gid: str, paused: bool) -> None:
        await self._set(gid, "paused", 1 if paused else 0)

    async def _rate_call(self, text: str, params: list[Any], *, job_id: Optional[str] = None) -> sql.Result:
        """A call of our version-3 functions (group rate limits)."""
        await self.backend.ensure_groups(RATE_LIMIT_VERSION)
        try:
            return await self.backend.connection.execute(text, params)
        except Exception as err:
            mapped = sql.domain_error(err, job_id=job_id, command="rateLimitGroup", state="active")
            if mapped is not None:
                if getattr(mapped, "code", None) == NOT_A_GROUP_JOB:
                    raise InvalidArgument(
                        f"job {job_id}: rate_limit_group needs a group job (this one has no group)") from None
                raise mapped from None
            raise

    async def set_rate_limit(self, gid: Optional[str], limit: Optional[tuple[int, int]]) -> None:
        max_jobs, duration = limit if limit is not None else (None, None)
        await self._rate_call("SELECT bullmq_compat_set_group_rate_limit($1, $2, $3, $4, $5) AS n",
                              [self.backend.name, gid, max_jobs, duration, _now()])

    async def get_rate_limit(self, gid: Optional[str]) -> Optional[tuple[int, int]]:
        if gid is None:
            result = await self._rate_call(
                "SELECT rate_max AS max, rate_duration_ms AS duration_ms FROM bullmq_compat_group_queue "
                "WHERE queue = $1", [self.backend.name])
        else:
            result = await self._rate_call("SELECT max, duration_ms FROM bullmq_compat_rate_limit($1, $2)",
                                           [self.backend.name, gid])
        row = result.rows[0] if result.rows else None
        if row is None or row["max"] is None:
            return None
        return int(row["max"]), int(row["duration_ms"])

    async def rate_limit_ttl(self, gid: str) -> int:
        result = await self._rate_call("SELECT bullmq_compat_group_rate_ttl($1, $2, $3) AS ttl",
                                       [self.backend.name, gid, _now()])
        return max(0, int(result.rows[0]["ttl"] or 0))

    async def rate_limit_job(self, job_id: str, token: str, ms: int) -> int:
        result = await self._rate_call("SELECT bullmq_compat_rate_limit_job($1, $2, $3, $4, $5) AS ms",
                                       [self.backend.name, job_id, token, ms, _now()], job_id=job_id)
        return int(result.rows[0]["ms"])

    async def _settings(self, gid: str) -> dict[str, Any]:
        result = await self._call("SELECT * FROM bullmq_compat_group_settings($1, $2)", [self.backend.name, gid])
        return result.rows[0]

    async def get_concurrency(self, gid: str) -> int:
        return int((await self._settings(gid))["concurrency"])

    async def get_ordering_delay(self, gid: Optional[str]) -> int:
        if gid is None:
            rows = (await self._call("SELECT ordering_delay_ms FROM bullmq_compat_group_queue WHERE queue = $1",
                                     [self.backend.name])).rows
            return int(rows[0]["ordering_delay_ms"] or 0) if rows else 0
        return int((await self._settings(gid))["ordering_delay_ms"])

    async def is_paused(self, gid: str) -> bool:
        return bool((await self._settings(gid))["paused"])

    _HELD = ("FROM job WHERE queue = $1 AND opts ? 'group' AND bullmq_compat_gid(opts) = $2 "
             "AND state = 'waiting-children' AND pending_deps = 0")

    async def held_count(self, gid: str) -> int:
        result = await self._call(f"SELECT count(*)::int AS n {self._HELD}", [self.backend.name, gid])
        return int(result.rows[0]["n"])

    async def held_ids(self, gid: str, start: int, end: int) -> list[str]:
        limit = "ALL" if end < 0 else str(max(0, end - start + 1))
        result = await self._call(
            f"SELECT id {self._HELD} ORDER BY bullmq_compat_group_order(opts, added_at_ms), abs(seq) "
            f"LIMIT {limit} OFFSET $3", [self.backend.name, gid, max(0, start)])
        return [str(row["id"]) for row in result.rows]

    async def counts_per_priority(self, gid: str, priorities: Sequence[int]) -> list[int]:
        await self.backend.ensure_groups(3)
        result = await self._call(
            f"SELECT bullmq_compat_group_priority(opts) AS p, count(*)::int AS n {self._HELD} "
            "AND bullmq_compat_group_priority(opts) = ANY($3::bigint[]) GROUP BY 1",
            [self.backend.name, gid, [int(p) for p in priorities]])
        counts = {int(row["p"]): int(row["n"]) for row in result.rows}
        return [counts.get(int(p), 0) for p in priorities]

    async def change_held_priority(self, job_id: str, priority: int, lifo: bool) -> bool:
        await self.backend.ensure_groups(3)
        result = await self._call("SELECT bullmq_compat_change_group_priority($1, $2, $3, $4) AS code",
                                  [self.backend.name, job_id, int(priority), bool(lifo)])
        code = int(result.rows[0]["code"])
        refused = held_priority_refusal(code, job_id, priority)
        if refused is not None:
            raise refused
        return code == 1

    async def held_total(self, batch: int) -> int:
        result = await self._call("SELECT count(*)::int AS n FROM job WHERE queue = $1 AND opts ? 'group' "
                                  "AND state = 'waiting-children' AND pending_deps = 0", [self.backend.name])
        return int(result.rows[0]["n"])

    async def active_count(self, gid: str) -> int:
        result = await self._call("SELECT count(*)::int AS n FROM job WHERE queue = $1 AND opts ? 'group' "
                                  "AND bullmq_compat_gid(opts) = $2 AND state = 'active'", [self.backend.name, gid])
        return int(result.rows[0]["n"])

    async def list(self) -> list[dict[str, Any]]:
        result = await self._call("SELECT * FROM bullmq_compat_list_groups($1)", [self.backend.name])
        groups = [{"id": row["gid"], "waiting": int(row["waiting"]), "running": int(row["running"]),
                   "paused": bool(row["paused"]), "concurrency": int(row["concurrency"])} for row in result.rows]
        max_sizes = await self._max_sizes() if groups else {}
        for group in groups:  # (only where a job carries one: the other fields' shape is unchanged)
            if group["id"] in max_sizes:
                group["max_size"] = max_sizes[group["id"]]
        if groups and getattr(self.backend.connection, "groups_version", 0) >= RATE_LIMIT_VERSION:
            rates = await self.backend.connection.execute("SELECT * FROM bullmq_compat_list_group_rates($1, $2)",
                                                          [self.backend.name, _now()])
            by_gid = {row["gid"]: row for row in rates.rows}
            for group in groups:
                row = by_gid.get(group["id"])
                if row is not None:
                    group["rate_limit"] = (None if row["rate_max"] is None else
                                           {"max": int(row["rate_max"]), "duration": int(row["rate_duration_ms"])})
                    group["rate_limit_ttl"] = max(0, int(row["ttl"] or 0))
        return groups

    #: per group, the maxSize of its most recently added job not finished yet (held, or released:
    #: as bullmq_compat_list_groups counts them) that carries one (as bullmq_compat_max_size reads it,
    #: written out: a schema of version 1 has no such function). Derived from the jobs, in a query of
    #: ours rather than a migration; ties in add time go by sequence (a released job's is renewed).
    _MAX_SIZES = """
        SELECT DISTINCT ON (bullmq_compat_gid(opts)) bullmq_compat_gid(opts) AS gid,
               LEAST(floor((opts -> 'group' ->> 'maxSize')::numeric), 9007199254740991)::bigint AS max_size
          FROM job
         WHERE queue = $1 AND opts ? 'group'
           AND (state IN ('waiting', 'active', 'delayed') OR (state = 'waiting-children' AND pending_deps = 0))
           AND CASE WHEN jsonb_typeof(opts -> 'group' -> 'maxSize') = 'number'
                    THEN (opts -> 'group' ->> 'maxSize')::numeric >= 1 ELSE false END
         ORDER BY bullmq_compat_gid(opts), added_at_ms DESC, abs(seq) DESC"""

    async def _max_sizes(self) -> dict[str, int]:
        result = await self.backend.connection.execute(self._MAX_SIZES, [self.backend.name])
        return {row["gid"]: int(row["max_size"]) for row in result.rows if row["gid"] is not None}

    async def delete_held(self, gid: str) -> int:
        result = await self._call("SELECT bullmq_compat_delete_group_jobs($1, $2) AS n", [self.backend.name, gid])
        return int(result.rows[0]["n"])

    async def sweep(self) -> int:
        result = await self._call("SELECT bullmq_compat_sweep_groups($1, $2) AS n", [self.backend.name, _now()])
        return int(result.rows[0]["n"])


__all__ = ["GroupsNotInstalled", "PostgresGroups", "drop_groups", "groups_version", "install_groups"]
