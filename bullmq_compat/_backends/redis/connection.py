"""`connection=`: a URL, a dict of redis-py keyword arguments, or a ready redis-py asyncio client."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from bullmq_compat._errors import InvalidArgument, RedisUnavailable

DEFAULT_URL = "redis://127.0.0.1:6379/0"

Connection = Union[str, Mapping[str, Any], "aioredis.Redis", Any, None]


class RedisHandle:
    """A redis-py client plus whether we own it (and so close it) and how to name it in errors."""

    def __init__(self, connection: Connection) -> None:
        self.owned = False
        if connection is None:
            connection = DEFAULT_URL
        if isinstance(connection, str):
            if not connection.startswith(("redis://", "rediss://", "unix://")):
                raise InvalidArgument(
                    f"connection={connection!r} is not a Redis URL (redis://host:port/db, rediss:// or unix://)")
            self.client: Any = aioredis.Redis.from_url(
                connection, decode_responses=True, socket_connect_timeout=10)
            self.description = connection
            self.owned = True
        elif isinstance(connection, Mapping):
            kwargs = dict(connection)
            kwargs.setdefault("decode_responses", True)
            kwargs.setdefault("socket_connect_timeout", 10)
            self.client = aioredis.Redis(**kwargs)
            self.description = f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
            self.owned = True
        elif hasattr(connection, "execute_command") and hasattr(connection, "pipeline"):
            self.client = connection
            self.description = describe(connection)
        else:
            raise InvalidArgument(
                f"connection={connection!r} must be a Redis URL, a dict of redis-py options, "
                "or a redis.asyncio client (Redis, RedisCluster, or Sentinel master_for())")
        self.is_cluster = type(self.client).__name__ == "RedisCluster"

    async def check(self) -> None:
        """Fail early, naming the address, when Redis does not answer."""
        try:
            await self.client.ping()
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as err:
            # (a RedisCluster none of whose startup nodes answers raises RedisClusterException)
            raise RedisUnavailable(
                f"cannot reach Redis at {self.description}: {err}. "
                "Check the URL and that redis-server is running.") from None

    async def close(self) -> None:
        if self.owned:
            await self.client.aclose()


def describe(client: Any) -> str:
    if type(client).__name__ == "RedisCluster":
        nodes = getattr(client, "startup_nodes", None) or []
        return "Redis Cluster " + (",".join(getattr(n, "name", "?") for n in nodes) or "?")
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service is not None:  # a Sentinel master_for()/slave_for() client
        sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", None) or []
        addresses = []
        for sentinel in sentinels:
            kw = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", None) or {}
            addresses.append(f"{kw.get('host', '?')}:{kw.get('port', '?')}")
        return f"Sentinel service {service!r} via {','.join(addresses) or '?'}"
    kwargs: Optional[Mapping[str, Any]] = getattr(pool, "connection_kwargs", None)
    if kwargs:
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
    return type(client).__name__
