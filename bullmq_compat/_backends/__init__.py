"""Datastores behind one contract (`base.QueueBackend`): Redis and PostgreSQL.

`open_backend` is the one place that decides which backend a ``connection=`` means.
"""
from __future__ import annotations

from typing import Any, Optional

from bullmq_compat._backends.base import QueueBackend

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(connection: Any) -> bool:
    """A ``postgresql://``/``postgres://`` URL, or a pool of the PostgreSQL driver's."""
    if isinstance(connection, str):
        return connection.startswith(POSTGRES_SCHEMES)
    from bullmq_compat._backends.postgres.driver import is_pool

    return is_pool(connection)


def open_backend(name: str, connection: Any, *, prefix: str = "bull", schema: Optional[str] = None,
                 migrate: bool = False) -> QueueBackend:
    """The backend for queue ``name`` on ``connection`` (Redis unless it names PostgreSQL)."""
    if is_postgres(connection):
        from bullmq_compat._backends.postgres.backend import open_postgres_backend

        return open_postgres_backend(connection, name, **({"schema": schema} if schema is not None else {}),
                                     migrate=migrate)
    if schema is not None or migrate:
        from bullmq_compat._errors import InvalidArgument

        raise InvalidArgument(f"schema={schema!r} / migrate={migrate!r} are PostgreSQL options: "
                              "pass a postgresql:// connection to use them")
    from bullmq_compat._backends.redis.backend import RedisBackend

    return RedisBackend(name, connection, prefix=prefix)


def open_relay_backend(connection: Any, *, namespace: str, node_id: str, prefix: str = "bull",
                       schema: str = "bullmq", inbox_max_length: int = 10000,
                       skip_version_check: bool = False) -> Any:
    """The `base.RelayBackend` of a relay node on ``connection``: PostgreSQL for a ``postgresql://``
    URL (or a pool of its driver's), else Redis (a ``redis://``/``rediss://`` URL or a redis client).
    ``prefix`` and ``skip_version_check`` are Redis's, ``schema`` PostgreSQL's."""
    if is_postgres(connection):
        from bullmq_compat._backends.postgres.relay import PostgresRelayBackend

        return PostgresRelayBackend(connection, namespace=namespace, node_id=node_id, schema=schema,
                                    inbox_max_length=inbox_max_length)
    from bullmq_compat._backends.redis.relay import RedisRelayBackend

    return RedisRelayBackend(connection, namespace=namespace, node_id=node_id, prefix=prefix,
                             inbox_max_length=inbox_max_length, skip_version_check=skip_version_check)
