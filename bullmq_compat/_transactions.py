"""What ``transaction=`` accepts, reduced to the driver connection under it.

``Queue.add(..., transaction=...)``, ``Queue.add_bulk`` and ``FlowProducer.add`` take the caller's
open transaction as the caller holds it: a psycopg 3 connection, a SQLAlchemy ``Session`` /
``AsyncSession`` / ``Connection`` / ``AsyncConnection`` (over psycopg), or Django's
``django.db.connection`` inside ``transaction.atomic()``. The backend (`QueueBackend.in_transaction`)
then checks what driver the connection is and writes on it. Frameworks are recognised by their
classes' modules, without importing them.
"""
from __future__ import annotations

from typing import Any

from bullmq_compat._errors import InvalidArgument


def _module(value: Any) -> str:
    return type(value).__module__ or ""


def _is_django(value: Any) -> bool:
    return _module(value).startswith("django.") and hasattr(value, "in_atomic_block")


def driver_connection_sync(value: Any) -> Any:
    """The driver connection of a sync framework object, resolved in the calling thread (Django's
    connection belongs to its thread); anything else is returned as it is."""
    module = _module(value)
    if _is_django(value):
        if getattr(value, "vendor", "") != "postgresql":
            raise InvalidArgument(f"transaction=django connection {value.alias!r} is {value.vendor}, "
                                  "not PostgreSQL: transaction= needs Django's psycopg 3 backend")
        if not value.in_atomic_block:
            raise InvalidArgument(f"transaction=django connection {value.alias!r} is not inside "
                                  "transaction.atomic(): the job would commit at once; add it inside the atomic block")
        value.ensure_connection()
        return value.connection
    if module.startswith("sqlalchemy.orm"):  # Session: its connection, in the session's transaction
        return value.connection().connection.driver_connection
    if module.startswith("sqlalchemy.engine"):  # Connection
        return value.connection.driver_connection
    return value


async def driver_connection(value: Any) -> Any:
    """The driver connection of what was passed as ``transaction=`` (see the module's doc)."""
    module = _module(value)
    if module.startswith("sqlalchemy.ext.asyncio"):
        if hasattr(value, "get_raw_connection"):  # AsyncConnection
            raw = await value.get_raw_connection()
        else:  # AsyncSession
            raw = await (await value.connection()).get_raw_connection()
        return raw.driver_connection
    return driver_connection_sync(value)
