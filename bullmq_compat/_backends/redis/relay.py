"""The relay on Redis: upstream's ``relay*-1`` Lua scripts, called as Node's ``RedisRelayBackend`` calls them.

Keys of a namespace live under ``{prefix}::relay:{<namespace>}`` (the namespace is a hash tag);
every script takes that namespace's ``:nodes`` key as its one key and the base key as its first
argument. ``{prefix}::relay:namespaces`` lists the namespaces in use (``relayTouchNamespace``).
This module only passes arguments and decodes replies: routing, matching, leases, inbox trimming
and message ids are the scripts' business.

Each node's inbox is a stream. `read_inbox` runs ``relayReadInbox`` (which reads a batch and marks
it in flight atomically); when that finds nothing, a blocking ``XREAD ... COUNT 1`` on a dedicated
connection (named ``base64(base key):<node id>``, as Node names it, so `get_node_connections` finds
it) only wakes the reader, which then runs the script again.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any, Mapping, Optional

from bullmq_compat._backends.base import RelayBackend, RelayBatch, RelayEntry
from bullmq_compat._backends.redis.backend import CONNECTION_ERRORS
from bullmq_compat._backends.redis.channel import Channel, blocking_client, open_channel
from bullmq_compat._backends.redis.connection import Connection, RedisHandle
from bullmq_compat._backends.redis.fastconn import ConnectionLost, FastConnection, FastPathUnavailable
from bullmq_compat._backends.redis.runner import ScriptRunner
from bullmq_compat._errors import BullMQCompatError, check_relay_result
from bullmq_compat._wire import codec

__all__ = ["RedisRelayBackend", "RELAY_LAYOUT_VERSION", "RELAY_MINIMUM_REDIS_VERSION"]

#: upstream's ``RELAY_LAYOUT_VERSION``: nodes of different layouts refuse to share a namespace
RELAY_LAYOUT_VERSION = "1"
#: upstream's ``RELAY_MINIMUM_REDIS_VERSION`` (queues still run on 5.0)
RELAY_MINIMUM_REDIS_VERSION = "6.2.0"


def _s(value: Any) -> str:
    """A reply element as text (clients with decode_responses=False answer bytes)."""
    text = codec.to_str(value)
    return "" if text is None else str(text)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


class RedisRelayBackend(RelayBackend):
    """One relay node's Redis side (Node's ``RedisRelayBackend``)."""

    kind = "redis"
    label = "Redis"
    initial_inbox_cursor = "0-0"
    transient_errors = CONNECTION_ERRORS

    def __init__(self, connection: Connection, *, namespace: str, node_id: Optional[str] = None,
                 prefix: str = "bull", inbox_max_length: int = 10000, skip_version_check: bool = False) -> None:
        self.namespace = namespace
        self.prefix = prefix
        self.node_id = node_id
        self.base_key = self.namespace_key(namespace)
        self.nodes_key = f"{self.base_key}:nodes"
        self.registry_key = f"{prefix}::relay:namespaces"
        self.inbox_max_length = inbox_max_length
        self.skip_version_check = skip_version_check
        self._handle = RedisHandle(connection)
        self.client: Any = self._handle.client
        self.runner = ScriptRunner(self.client)
        #: the script calls' channel once ready: a pipelining FastConnection where it serves this
        #: client (a fraction of redis-py's CPU per call), else redis-py (Cluster, Sentinel)
        self._channel: Optional[Channel] = None
        self._scripts: dict[str, Any] = {}
        self._blocking: Any = None
        self._fast_blocking: Optional[FastConnection] = None
        self._fast_blocking_usable = True
        self._blocking_read: Optional[asyncio.Future[Any]] = None
        self._interrupted = False
        self._closing = False
        self._namespace_expires_at = 0.0
        self._namespace_touch: Optional[asyncio.Task[None]] = None

    @property
    def description(self) -> str:
        return self._handle.description

    def namespace_key(self, namespace: str) -> str:
        """Base key of a namespace of this prefix."""
        return f"{self.prefix}::relay:{{{namespace}}}"

    def inbox_connection_name(self, node_id: str) -> str:
        """Redis client name of a node's inbox connection (Node's ``inboxConnectionName``)."""
        return f"{base64.b64encode(self.base_key.encode()).decode()}:{node_id}"

    # -- life cycle ------------------------------------------------------------------------------
    async def wait_until_ready(self) -> None:
        await self._handle.check()
        if self.skip_version_check:
            await self._open_channel()
            return
        info = await self.client.info("server")
        version = _s(info.get("redis_version", "0") if isinstance(info, Mapping) else "0")
        if _version_tuple(version) < _version_tuple(RELAY_MINIMUM_REDIS_VERSION):
            raise BullMQCompatError(
                f"The relay requires Redis {RELAY_MINIMUM_REDIS_VERSION} or newer. Current: {version}")
        await self._open_channel()

    async def _open_channel(self) -> None:
        if self._channel is None and not self._closing:
            channel = await open_channel(self.client, None)
            if self._closing or self._channel is not None:
                await channel.close()
            else:
                self._channel = channel

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.interrupt_inbox()
        touch = self._namespace_touch
        if touch is not None and not touch.done():
            touch.cancel()
            with contextlib.suppress(BaseException):
                await touch
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()
        fast, self._fast_blocking = self._fast_blocking, None
        if fast is not None:
            with contextlib.suppress(Exception):
                await fast.close()
        blocking, self._blocking = self._blocking, None
        if blocking is not None and blocking is not self.client:
            with contextlib.suppress(Exception):
                await blocking.aclose()
        await self._handle.close()

    def interrupt_inbox(self) -> None:
        self._interrupted = True
        read = self._blocking_read
        if read is not None and not read.done():
            read.cancel()

    # -- calls -----------------------------------------------------------------------------------
    async def _exec(self, command: str, *args: Any) -> Any:
        return await self._call(command, [self.nodes_key], [self.base_key, *args])

    async def _call(self, command: str, keys: list[Any], args: list[Any]) -> Any:
        channel = self._channel
        if channel is None:  # not ready yet (or closed): redis-py
            return await self.runner.call(command, keys, args)
        script = self._scripts.get(command)
        if script is None:
            script = self._scripts[command] = self.runner.script(command)
        return await channel.call((script, keys, args))

    async def register_node(self, node_id: str, lease_ms: int, info: Mapping[str, Any],
                            inbox_max_length: int) -> None:
        # Reusing an expired or removed id first finishes pruning its old indexes (0: call again;
        # each call yields Redis after a bounded batch).
        text = json.dumps({k: v for k, v in info.items() if v is not None}, separators=(",", ":"))
        while True:
            result = check_relay_result(await self._exec(
                "relayRegisterNode", node_id, lease_ms, text, RELAY_LAYOUT_VERSION, inbox_max_length), node_id)
            if result != 0:
                break
        self.touch_namespace(lease_ms)

    async def heartbeat(self, node_id: str, lease_ms: int) -> bool:
        alive = bool(await self._exec("relayHeartbeat", node_id, lease_ms) == 1)
        if alive:
            self.touch_namespace(lease_ms)
        return alive

    async def unregister_node(self, node_id: str) -> bool:
        return bool(await self._exec("relayUnregisterNode", node_id) == 1)

    async def sweep(self, limit: int) -> list[str]:
        return [_s(node) for node in await self._exec("relaySweep", limit) or []]

    async def subscribe(self, node_id: str, endpoint_id: str,
                        pattern: str) -> tuple[bool, Optional[dict[str, Any]]]:
        added, mid, ts, data = check_relay_result(
            await self._exec("relaySubscribe", node_id, endpoint_id, pattern), pattern)
        mid = _s(mid)
        retained = {"mid": mid, "ts": int(_s(ts) or 0), "data": _s(data)} if mid else None
        return added == 1, retained

    async def remove_endpoint(self, node_id: str, endpoint_id: str) -> Any:
        return await self._exec("relayRemoveEndpoint", node_id, endpoint_id)

    async def publish(self, topic: str, data: str, *, ts: int, retain_ms: int, max_size: int) -> dict[str, Any]:
        mid, nodes, endpoints = check_relay_result(await self._exec(
            "relayPublish", topic, data, ts, retain_ms, max_size, self.inbox_max_length), topic)
        if retain_ms > 0:
            self.touch_namespace(retain_ms)
        return {"mid": _s(mid), "nodes": int(nodes), "endpoints": int(endpoints)}

    async def delete_retained(self, topic: str) -> bool:
        return bool(check_relay_result(await self._exec("relayDeleteRetained", topic), topic) == 1)

    async def read_inbox(self, node_id: str, cursor: Any, *, block_ms: int, count: int) -> RelayBatch:
        if self._interrupted:
            return RelayBatch([], cursor)
        result = await self._exec("relayReadInbox", node_id, cursor, count)
        if not result and block_ms > 0 and not self._interrupted:
            # Only a wake-up: fetching and marking the batch must be atomic with the trimming
            # publishes do, so the script reads it.
            await self._wait_inbox(node_id, cursor, block_ms)
            if self._interrupted:
                return RelayBatch([], cursor)
            result = await self._exec("relayReadInbox", node_id, cursor, count)
        if not result:
            return RelayBatch([], cursor)
        entries = []
        following = cursor
        for entry_id, flat in result[0][1]:
            following = _s(entry_id)
            fields = codec.flat_to_dict(flat) if isinstance(flat, list) else codec.str_dict(flat or {})
            endpoints = fields.get("e", "")
            entries.append(RelayEntry(kind=fields.get("k", ""), topic=fields.get("t", ""), mid=fields.get("m", ""),
                                      ts=int(fields.get("ts") or 0), data=fields.get("d", ""),
                                      endpoints=endpoints.split(",") if endpoints else []))
        return RelayBatch(entries, following)

    async def _wait_inbox(self, node_id: str, cursor: Any, block_ms: int) -> None:
        """XREAD BLOCK ... COUNT 1 on the node's inbox connection: returns when an entry after
        ``cursor`` arrives, at ``block_ms`` or at `interrupt_inbox`."""
        key = f"{self.base_key}:{node_id}:inbox"
        if self._fast_blocking is None and self._fast_blocking_usable:
            # a FastConnection where it serves this client: its wake-up costs a fraction of redis-py's
            try:
                conn = await FastConnection.from_redis_py(self.client, self.inbox_connection_name(node_id),
                                                          decode=True, busy_poll=False)
            except FastPathUnavailable:
                self._fast_blocking_usable = False
            else:
                if self._interrupted:
                    await conn.close()
                    return
                self._fast_blocking = conn
        fast = self._fast_blocking
        if fast is not None:
            read = self._blocking_read = fast.execute(b"XREAD", b"COUNT", 1, b"BLOCK", block_ms, b"STREAMS", key,
                                                      cursor)
        else:
            if self._blocking is None:
                self._blocking = blocking_client(self.client, self.inbox_connection_name(node_id))
            read = self._blocking_read = asyncio.ensure_future(
                self._blocking.xread({key: cursor}, count=1, block=block_ms))
        try:
            await read
        except asyncio.CancelledError:
            if not self._interrupted:
                raise
            # the connection was left mid-command: drop it, the next read opens another
            with contextlib.suppress(Exception):
                if fast is not None:
                    self._fast_blocking = None
                    await fast.close()
                else:
                    await self._blocking.connection_pool.disconnect()
        except ConnectionLost:
            self._fast_blocking = None  # the next read opens another
            raise
        finally:
            self._blocking_read = None

    async def trim_inbox(self, node_id: str, cursor: Any, max_length: int) -> int:
        return int(await self._exec("relayTrimInbox", node_id, cursor, max_length))

    # -- getters ---------------------------------------------------------------------------------
    async def _get(self, view: str, start: int = 0, end: int = -1, kind: str = "", value: str = "") -> Any:
        return await self._exec("relayGet", view, start, end, kind, value)

    async def get_counts(self) -> dict[str, int]:
        nodes, subscriptions, patterns, retained = await self._get("counts")
        return {"nodes": int(nodes), "subscriptions": int(subscriptions), "patterns": int(patterns),
                "retained": int(retained)}

    async def get_nodes(self, start: int, end: int) -> list[dict[str, Any]]:
        nodes = []
        for node_id, registered_at, lease_until, info, hb, backlog, dropped, subs in await self._get(
                "nodes", start, end):
            info_text = _s(info)
            nodes.append({
                "id": _s(node_id),
                "info": json.loads(info_text) if info_text else {},
                "registered_at": int(float(_s(registered_at))),
                "lease_until": int(float(_s(lease_until))),
                "last_heartbeat": int(float(_s(hb))) if _s(hb) else None,
                "backlog": int(_s(backlog) or 0),
                "dropped": int(_s(dropped) or 0),
                "subscriptions": int(_s(subs) or 0),
            })
        return nodes

    async def get_subscriptions(self, node_id: Optional[str], pattern: Optional[str], start: int,
                                end: int) -> list[dict[str, str]]:
        kind, value = ("node", node_id) if node_id is not None else (
            ("pattern", pattern) if pattern is not None else ("", ""))
        rows = await self._get("subscriptions", start, end, kind, value or "")
        return [{"node_id": _s(n), "endpoint_id": _s(e), "pattern": _s(p)} for n, e, p in rows]

    async def get_patterns(self, start: int, end: int) -> list[dict[str, Any]]:
        return [{"pattern": _s(p), "subscriptions": int(n)} for p, n in await self._get("patterns", start, end)]

    async def get_retained(self, start: int, end: int) -> list[dict[str, Any]]:
        return [{"topic": _s(topic), "expires_at": int(float(_s(expires))), "mid": _s(mid), "ts": int(_s(ts) or 0),
                 "data": _s(data)} for topic, expires, mid, ts, data in await self._get("retained", start, end)]

    async def get_namespaces(self) -> list[str]:
        candidates = [_s(n) for n in await self.runner.call("relayGetNamespaces", [self.registry_key], [])]
        used = []
        # The registry only says until when a namespace may be in use: each is checked on its keys.
        for namespace in candidates:
            base = self.namespace_key(namespace)
            if await self.runner.call("relayGet", [f"{base}:nodes"], [base, "used", 0, -1, "", ""]) == 1:
                used.append(namespace)
        return used

    async def get_node_connections(self, node_id: str) -> list[dict[str, Any]]:
        info = await self.client.client_info()
        db = _s(info.get("db", "0")) if isinstance(info, Mapping) else "0"
        name = self.inbox_connection_name(node_id)
        connections = []
        for client in await self.client.client_list():
            if _s(client.get("name", "")) == name and _s(client.get("db", "")) == db:
                connections.append({"address": _s(client.get("addr", "")), "age": int(_s(client.get("age", 0))),
                                    "idle": int(_s(client.get("idle", 0)))})
        return connections

    # -- the registry of namespaces ----------------------------------------------------------------
    def touch_namespace(self, for_ms: int) -> None:
        """Record in the prefix's registry that the namespace is in use (in the background, one
        call at a time; a call of its own as the registry is outside the namespace's hash tag)."""
        self._namespace_expires_at = max(self._namespace_expires_at, time.time() * 1000 + for_ms)
        self._start_namespace_touch()

    def _start_namespace_touch(self) -> None:
        if self._namespace_touch is not None or self._closing:
            return
        requested = self._namespace_expires_at
        task = self._namespace_touch = asyncio.ensure_future(self._refresh_namespace())

        def done(finished: asyncio.Task[None]) -> None:
            if self._namespace_touch is finished:
                self._namespace_touch = None
                if not self._closing and self._namespace_expires_at > requested:
                    self._start_namespace_touch()

        task.add_done_callback(done)

    async def _refresh_namespace(self) -> None:
        for attempt in range(3):
            if self._closing:
                return
            expires_at = self._namespace_expires_at
            try:
                await self._call("relayTouchNamespace", [self.registry_key],
                                 [self.namespace, max(1, int(expires_at - time.time() * 1000))])
                return
            except Exception as err:
                if attempt == 2:
                    if not self._closing and self.on_error is not None:
                        self.on_error(err)
                else:
                    await asyncio.sleep(0.1 * 2 ** attempt)
