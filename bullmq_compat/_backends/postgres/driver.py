"""Loading psycopg (an optional extra) and naming a connection without its password."""
from __future__ import annotations

from types import ModuleType
from typing import Any

from bullmq_compat._errors import PostgresDriverMissing
from bullmq_compat._secrets import redact_url

INSTALL_HINT = "pip install 'bullmq-compat[postgres]'"


def is_pool(connection: Any) -> bool:
    """Whether ``connection`` is a psycopg_pool pool (told by its class's module: nothing imported)."""
    return type(connection).__module__.startswith("psycopg_pool")


def server_errors() -> tuple[type[BaseException], ...]:
    """The driver's base error (a refusal by the server: a missing grant...), when it is installed."""
    try:
        import psycopg
    except ImportError:
        return ()
    return (psycopg.Error,)


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


def mask_password(conninfo: str) -> str:
    """The connection string with any password replaced by ``***`` (URL and key=value forms):
    `bullmq_compat._secrets.redact_url`, which also masks a password holding an unencoded ``/``,
    ``#`` or ``@`` (``urlsplit`` would read it as part of the host or path, and show it)."""
    return redact_url(conninfo)
