"""Upstream's SQL commands, run as they are: one statement each, native ``$1..$N`` placeholders.

Each command text is loaded once from the fetched copy (``_upstream/postgres/commands``) and sent
through psycopg's raw cursor, which passes ``$N`` to the server untouched: nothing rewrites the
placeholders or strips comments. Names in the text are unqualified; the connection's
``search_path`` picks the schema.

Binding rules (the official Python port breaks each): ids and queue names go as ``str`` (a Python
int is typed int2/4/8 and ``md5($1)`` then fails); JSON goes as JSON text.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Optional, Sequence

from bullmq_compat._errors import BullMQCompatError, GroupMaxSizeExceeded, script_error
from bullmq_compat._wire import upstream

if TYPE_CHECKING:
    import psycopg

#: the SQLSTATE upstream's functions raise for a domain refusal; DETAIL holds the Lua-style code
DOMAIN_ERROR_SQLSTATE = "BM001"
#: the SQLSTATE our group gate (groups_sql/0002) raises for a full group; DETAIL: {"queue", "group", "maxSize"}
GROUP_MAX_SIZE_SQLSTATE = "BQG01"


@functools.cache
def command_texts() -> dict[str, str]:
    """Every command, by name without ``.sql`` (read once; `UpstreamScriptsMissing` when not fetched)."""
    directory = upstream.postgres_commands_dir()
    return {path.stem: path.read_bytes().decode("utf-8") for path in sorted(directory.glob("*.sql"))}


#: commands of ours (calls of our own functions, groups_sql/), run the way upstream's are
OWN_COMMANDS = {
    "bullmq_compat_take_group_jobs": "SELECT * FROM bullmq_compat_take_group_jobs($1, $2, $3, $4, $5, $6);",
}


def command(name: str) -> str:
    """The text of one command, e.g. ``command("add_job")``."""
    own = OWN_COMMANDS.get(name)
    if own is not None:
        return own
    try:
        return command_texts()[name]
    except KeyError:
        raise KeyError(f"upstream has no PostgreSQL command {name!r}") from None


class Result:
    """The rows (dicts by column name) and row count of one command."""

    __slots__ = ("rows", "rowcount")

    def __init__(self, rows: list[dict[str, Any]], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def first(self) -> Optional[dict[str, Any]]:
        return self.rows[0] if self.rows else None


async def execute(conn: "psycopg.AsyncConnection[Any]", text: str, params: Sequence[Any] = ()) -> Result:
    """Run one statement with ``$N`` placeholders on ``conn`` through a raw cursor."""
    import psycopg
    from psycopg.rows import dict_row

    async with psycopg.AsyncRawCursor(conn, row_factory=dict_row) as cur:
        await cur.execute(text, list(params))
        rows = await cur.fetchall() if cur.description is not None else []
        return Result(rows, cur.rowcount)


def domain_error(err: BaseException, *, job_id: Optional[str] = None, command: str = "", state: str = "",
                 parent_key: Optional[str] = None) -> Optional[BullMQCompatError]:
    """The `ScriptError` for upstream's ``RAISE ... ERRCODE 'BM001', DETAIL '<code>'``, our gate's
    `GroupMaxSizeExceeded` for its ``BQG01``, else None."""
    sqlstate = getattr(err, "sqlstate", None)
    detail = getattr(getattr(err, "diag", None), "message_detail", None) or ""
    if sqlstate == GROUP_MAX_SIZE_SQLSTATE:
        import json

        try:
            info = json.loads(detail)
            return GroupMaxSizeExceeded(str(info["group"]), int(info["maxSize"]), info.get("queue"))
        except (ValueError, KeyError, TypeError):
            return GroupMaxSizeExceeded("?", 0)
    if sqlstate != DOMAIN_ERROR_SQLSTATE:
        return None
    try:
        code = int(detail)
    except ValueError:
        code = 0
    return script_error(code, job_id=job_id, command=command, state=state, parent_key=parent_key)
