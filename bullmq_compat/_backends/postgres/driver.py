"""Loading psycopg (an optional extra) and naming a connection without its password."""
from __future__ import annotations

import re
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bullmq_compat._errors import PostgresDriverMissing

INSTALL_HINT = "pip install 'bullmq-compat[postgres]'"


def is_pool(connection: Any) -> bool:
    """Whether ``connection`` is a psycopg_pool pool (told by its class's module: nothing imported)."""
    return type(connection).__module__.startswith("psycopg_pool")


def load_psycopg() -> tuple[ModuleType, ModuleType]:
    """``(psycopg, psycopg_pool)``, or `PostgresDriverMissing` naming the extra to install."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError as err:
        raise PostgresDriverMissing(
            f"a PostgreSQL connection needs psycopg 3 and psycopg-pool, which are not installed ({err}): "
            f"{INSTALL_HINT}") from None
    return psycopg, psycopg_pool


_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def mask_password(conninfo: str) -> str:
    """The connection string with any password replaced by ``***`` (URL and key=value forms)."""
    if "://" not in conninfo:
        return _KV_PASSWORD.sub(r"\1***", conninfo)
    try:
        parts = urlsplit(conninfo)
    except ValueError:
        return "<unparsable connection string>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}:***@{hosts}" if sep else f"{user}@{hosts}"
    query = "&".join("password=***" if item.lower().startswith("password=") else item
                     for item in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
