"""`connection=`: a URL, a dict of redis-py keyword arguments, or a ready redis-py asyncio client.

A dict may also hold ``url`` (its other entries add to the URL's settings, e.g. ``ssl_ca_certs``)
and ``ssl_context`` (an `ssl.SSLContext` used as it is for TLS). Wherever a connection is named
(errors, logs, ``repr()``) it is named with its password masked (`bullmq_compat._secrets`).
"""
from __future__ import annotations

import ssl
from typing import Any, Mapping, Optional, Union

import redis.asyncio as aioredis
from redis.asyncio.connection import ConnectionPool, SSLConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from bullmq_compat._errors import InvalidArgument, RedisUnavailable
from bullmq_compat._secrets import redact_nodes, redact_url, scrub, secrets_of

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_SCHEMES = ("redis://", "rediss://", "unix://")

Connection = Union[str, Mapping[str, Any], "aioredis.Redis", Any, None]


class SSLContextConnection(SSLConnection):
    """redis-py's TLS connection, but with an `ssl.SSLContext` the caller built (CA, client
    certificate, verification) instead of one built from ``ssl_*`` options."""

    def __init__(self, *, ssl_context: ssl.SSLContext, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ssl_context.context = ssl_context  # RedisSSLContext.get() returns it as it is
        self.given_ssl_context = ssl_context


class RedisHandle:
    """A redis-py client plus whether we own it (and so close it) and how to name it in errors."""

    def __init__(self, connection: Connection) -> None:
        self.owned = False
        if connection is None:
            connection = DEFAULT_URL
        # what the settings hold that must never be shown (scrubbed from drivers' messages too)
        self.secrets = secrets_of(connection if isinstance(connection, (str, Mapping)) else None)
        if isinstance(connection, str):
            self.client: Any = _from_url(connection, {})
            self.description = redact_url(connection)
            self.owned = True
        elif isinstance(connection, Mapping):
            kwargs = dict(connection)
            url = kwargs.pop("url", None)
            kwargs.setdefault("decode_responses", True)
            kwargs.setdefault("socket_connect_timeout", 10)
            context = kwargs.pop("ssl_context", None)
            if context is not None:
                if not isinstance(context, ssl.SSLContext):
                    raise InvalidArgument(f"ssl_context must be an ssl.SSLContext, not {type(context).__name__}")
                params = {**kwargs, **(_parse_url(url) if url is not None else {})}
                params.pop("connection_class", None)
                params.pop("ssl", None)
                self.client = aioredis.Redis.from_pool(ConnectionPool(
                    connection_class=SSLContextConnection, ssl_context=context, **params))
            elif url is not None:
                self.client = _from_url(url, kwargs)
            else:
                self.client = aioredis.Redis(**kwargs)
            self.description = redact_url(url) if url is not None else describe(self.client)
            self.owned = True
        elif hasattr(connection, "execute_command") and hasattr(connection, "pipeline"):
            self.client = connection
            self.description = describe(connection)
            self.secrets = client_secrets(connection)
        else:
            raise InvalidArgument(
                f"connection={redact_url(repr(connection))} must be a Redis URL, a dict of redis-py options, "
                "or a redis.asyncio client (Redis, RedisCluster, or Sentinel master_for())")
        self.is_cluster = type(self.client).__name__ == "RedisCluster"

    async def check(self) -> None:
        """Fail early, naming the address, when Redis does not answer."""
        try:
            await self.client.ping()
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as err:
            # (a RedisCluster none of whose startup nodes answers raises RedisClusterException)
            # `from None`: the driver's exception (and its text) stays out of tracebacks
            raise RedisUnavailable(self.unavailable_message(err)) from None

    def unavailable_message(self, err: BaseException) -> str:
        text = scrub(str(err), self.secrets)
        hint = "Check the URL and that redis-server is running."
        if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(err, ssl.SSLCertVerificationError):
            hint = ("The server's TLS certificate did not verify: check ssl_ca_certs= (or the ssl_context's "
                    "CA) names the CA that signed it, and that the host name is in the certificate.")
        elif "WRONG_VERSION_NUMBER" in text or "record layer failure" in text or (
                self.description.startswith("rediss://") and "Timeout" in text):
            hint += " Use rediss:// only for a port redis-server serves TLS on (--tls-port)."
        elif self.description.startswith("redis://") and ("reset by peer" in text or "closed by server" in text):
            hint += " If that port serves TLS (redis-server --tls-port), use rediss://."
        return f"cannot reach Redis at {self.description}: {text.rstrip('.')}. {hint}"

    async def close(self) -> None:
        if self.owned:
            await self.client.aclose()


def _parse_url(url: Any) -> dict[str, Any]:
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        raise InvalidArgument(
            f"connection={redact_url(url)!r} is not a Redis URL (redis://host:port/db, rediss:// or unix://)")
    try:
        return dict(parse_url(url))
    except ValueError as err:  # a bad port or query value: redis-py's text never holds the URL
        raise InvalidArgument(f"connection={redact_url(url)!r} is not a valid Redis URL: {err}") from None


def _from_url(url: Any, kwargs: dict[str, Any]) -> Any:
    _parse_url(url)  # refuses what is not a Redis URL, naming it redacted
    options = {"decode_responses": True, "socket_connect_timeout": 10, **kwargs}
    try:
        return aioredis.Redis.from_url(url, **options)
    except (ValueError, TypeError) as err:
        raise InvalidArgument(f"connection={redact_url(url)!r}: {scrub(str(err), secrets_of(url))}") from None


def client_secrets(client: Any) -> list[str]:
    """The passwords a ready redis-py client was given (its pool's, its Sentinels', its nodes')."""
    found: list[Any] = []
    pool = getattr(client, "connection_pool", None)
    found.append(getattr(pool, "connection_kwargs", None) or {})
    found.append(getattr(client, "connection_kwargs", None) or {})  # RedisCluster
    for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", None) or []:
        found.append(getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", None) or {})
    return secrets_of([{k: v for k, v in kw.items() if isinstance(v, (str, Mapping, list, tuple))}
                       for kw in found if isinstance(kw, Mapping)])


def describe(client: Any) -> str:
    """How errors name a redis-py client's server: scheme, host, port and db, never a password."""
    if type(client).__name__ == "RedisCluster":
        nodes = getattr(client, "startup_nodes", None) or []
        return "Redis Cluster " + (redact_nodes(nodes) or "?")
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service is not None:  # a Sentinel master_for()/slave_for() client
        sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", None) or []
        addresses = []
        for sentinel in sentinels:
            kw = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", None) or {}
            addresses.append((kw.get("host", "?"), kw.get("port", "?")))
        return f"Sentinel service {service!r} via {redact_nodes(addresses) or '?'}"
    kwargs: Optional[Mapping[str, Any]] = getattr(pool, "connection_kwargs", None)
    if kwargs:
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        connection_class = getattr(pool, "connection_class", None)
        scheme = "rediss" if isinstance(connection_class, type) and issubclass(connection_class, SSLConnection) \
            else "redis"
        return f"{scheme}://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
    return type(client).__name__
