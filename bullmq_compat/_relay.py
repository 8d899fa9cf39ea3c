"""`Relay`: BullMQ 6.7's fleet pub/sub (Node's ``Relay``), on Redis or PostgreSQL.

Any process publishes on a topic; every subscription whose pattern matches it gets the message,
in whichever process it runs. Topics are dot-separated keypaths (``queues.emails.jobs.42``);
patterns may use ``*`` (one segment) and ``>`` (one or more trailing segments).

As in Node, the routing (topic grammar, matching, subscriptions, leases, inboxes) is the
datastore's (upstream's ``relay*`` Lua scripts or ``relay_*`` SQL functions, behind
`bullmq_compat._backends.base.RelayBackend`); this class only runs the timers (heartbeat,
sweep), reads its node's inbox and calls listeners.

    async with Relay(connection="redis://127.0.0.1:6379/0") as relay:
        sub = await relay.subscribe("fleet.>", lambda message: print(message.topic, message.data))
        await relay.publish("fleet.eu.status", {"up": True}, retain=60_000)

Events: ``'error'`` (an exception), ``'recovered'`` (re-registered after the lease expired),
``'swept'`` (list of the node ids removed), ``'lag'`` (the unread backlog, once it reaches
``lag_threshold``).
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from bullmq_compat._backends import open_relay_backend
from bullmq_compat._backends.base import RelayBackend, RelayBatch, RelayEntry
from bullmq_compat._errors import BullMQCompatError, InvalidArgument, QueueClosed
from bullmq_compat._events import EventEmitter
from bullmq_compat._version import __version__
from bullmq_compat._wire import codec

__all__ = ["Relay", "RelayMessage", "Subscription"]

_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
MAX_NAME_LENGTH = 256
_MAX_INT = 2147483647
_MAX_SAFE = 2 ** 53 - 1

Listener = Callable[["RelayMessage"], Any]


@dataclass(frozen=True)
class RelayMessage:
    """What a listener gets: the ``topic`` it was published on, its ``data`` (parsed JSON), the
    message id ``mid`` (a decimal string, increasing per namespace), the publisher's ``ts`` (ms)
    and whether it is the topic's ``retained`` message (delivered on subscribing)."""

    topic: str
    data: Any
    mid: str
    ts: int
    retained: bool = False


@dataclass
class _Endpoint:
    pattern: str
    listener: Listener
    active: bool = True
    #: live messages that arrive while subscribing, delivered after the retained one
    pending: Optional[list[RelayMessage]] = field(default_factory=list)
    removing: Optional[asyncio.Future[Any]] = None


class Subscription:
    """One `Relay.subscribe`: its ``pattern``, whether the datastore ``added`` it (False: this
    endpoint had it already), the ``retained`` `RelayMessage` delivered first (or None), and
    `unsubscribe`."""

    def __init__(self, relay: "Relay", endpoint_id: str, endpoint: _Endpoint, added: bool,
                 retained: Optional[RelayMessage]) -> None:
        self.pattern = endpoint.pattern
        self.added = added
        self.retained = retained
        self.endpoint_id = endpoint_id
        self._relay = relay
        self._endpoint = endpoint

    async def unsubscribe(self) -> None:
        """Stop delivering to this listener and remove the subscription from the datastore."""
        self._endpoint.active = False
        await self._relay._remove_endpoint(self.endpoint_id, self._endpoint)

    def __repr__(self) -> str:
        return f"<Subscription {self.pattern!r} endpoint={self.endpoint_id}>"


def _check_id(what: str, value: Any) -> str:
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise InvalidArgument(f"Invalid relay {what}: {value!r} (1 to 64 of A-Z, a-z, 0-9, '_' and '-')")
    return value


def _check_int(what: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value > _MAX_INT:
        raise InvalidArgument(f"Invalid relay {what}: {value!r} (an integer from 1 to {_MAX_INT})")
    return value


def _check_range(start: Any, end: Any) -> tuple[int, int]:
    for value in (start, end):
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > _MAX_SAFE:
            raise InvalidArgument(f"Invalid relay range: {start!r}..{end!r} (integers)")
    if start < 0 or end < -1:
        raise InvalidArgument(f"Invalid relay range: {start}..{end} (start >= 0, end >= -1; -1: to the end)")
    return start, end


class Relay(EventEmitter):
    """A node of a relay namespace (Node's ``Relay``). ``connection``: a ``redis://``/``rediss://``
    URL (or dict of redis-py options, or a redis.asyncio client) for Redis, a ``postgresql://``
    URL for PostgreSQL. Times are in ms; see docs/relay.md."""

    def __init__(self, connection: Any = None, *, namespace: str = "default", node_id: Optional[str] = None,
                 name: Optional[str] = None, prefix: str = "bull", schema: str = "bullmq",
                 lease_duration: int = 30000, heartbeat_interval: Optional[int] = None,
                 sweep_interval: Optional[int] = None, max_message_size: int = 512 * 1024,
                 inbox_max_length: int = 10000, lag_threshold: Optional[int] = None, block_timeout: int = 5000,
                 skip_version_check: bool = False, backend: Optional[RelayBackend] = None) -> None:
        """Check the options (`InvalidArgument` naming the value and the rule) and open the backend;
        inside a running event loop it starts connecting and registering at once (else on first use).
        ``backend``: a ready `RelayBackend` instead of one opened from ``connection``."""
        super().__init__()
        if connection is None and backend is None:
            raise InvalidArgument("Relay requires a connection (a redis:// or postgresql:// URL, or a client)")
        self.namespace = _check_id("namespace", namespace)
        self.node_id = _check_id("node_id", uuid.uuid4().hex if node_id is None else node_id)
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_LENGTH):
            raise InvalidArgument(f"Invalid relay name: {name!r} (a str of at most {MAX_NAME_LENGTH} characters)")
        self.name = name
        for what, value in (("lease_duration", lease_duration), ("heartbeat_interval", heartbeat_interval),
                            ("sweep_interval", sweep_interval), ("block_timeout", block_timeout),
                            ("inbox_max_length", inbox_max_length), ("lag_threshold", lag_threshold),
                            ("max_message_size", max_message_size)):
            _check_int(what, value)
        self.lease_duration = lease_duration
        self.heartbeat_interval = heartbeat_interval if heartbeat_interval is not None else max(1, lease_duration // 3)
        self.sweep_interval = sweep_interval if sweep_interval is not None else lease_duration
        self.max_message_size = max_message_size
        self.block_timeout = block_timeout
        self.inbox_max_length = inbox_max_length
        self.lag_threshold = lag_threshold if lag_threshold is not None else max(1, inbox_max_length // 2)
        if self.lag_threshold > self.inbox_max_length:
            raise InvalidArgument(f"Relay lag_threshold must not exceed inbox_max_length "
                                  f"({self.lag_threshold} > {self.inbox_max_length})")
        self.backend: RelayBackend = backend if backend is not None else open_relay_backend(
            connection, namespace=self.namespace, node_id=self.node_id, prefix=prefix, schema=schema,
            inbox_max_length=inbox_max_length, skip_version_check=skip_version_check)
        self.backend.on_error = self._emit_error
        self.cursor: Any = self.backend.initial_inbox_cursor
        self._endpoints: dict[str, _Endpoint] = {}
        self._batch_in_flight = False
        self._recovery_pending = False
        #: incremented when a recovery replaces the node's registration
        self._registration = 0
        self._connected = False
        self._closing: Optional[asyncio.Future[None]] = None
        self._ready: Optional[asyncio.Future[None]] = None
        self._heartbeating: Optional[asyncio.Future[None]] = None
        self._sweeping: Optional[asyncio.Future[None]] = None
        self._backlog_checking: Optional[asyncio.Future[None]] = None
        self._timers: list[asyncio.Task[None]] = []
        self._loop_task: Optional[asyncio.Task[None]] = None
        with contextlib.suppress(RuntimeError):  # in a running loop: start now, as Node does
            asyncio.get_running_loop()
            self._start_once()

    def __repr__(self) -> str:
        return f"<Relay namespace={self.namespace!r} node_id={self.node_id!r} on {self.backend.label}>"

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closing is not None

    # -- life cycle --------------------------------------------------------------------------------
    def _start_once(self) -> "asyncio.Future[None]":
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._start())

            def started(ready: asyncio.Future[None]) -> None:
                if not ready.cancelled() and ready.exception() is not None:
                    self._emit_error(ready.exception())  # type: ignore[arg-type]

            self._ready.add_done_callback(started)
        return self._ready

    async def wait_until_ready(self) -> None:
        """Connected, registered, timers and inbox reader running."""
        ready = self._start_once()
        try:
            await asyncio.shield(ready)
        except asyncio.CancelledError:
            if ready.cancelled() and self._closing is not None:
                raise QueueClosed("Relay is closed") from None
            raise

    async def __aenter__(self) -> "Relay":
        await self.wait_until_ready()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _start(self) -> None:
        await self.backend.wait_until_ready()
        if self._closing is not None:
            return
        self._connected = True
        await self._register()
        if self._closing is not None:
            return
        self._timers = [asyncio.ensure_future(self._every(self.heartbeat_interval, lambda: self._heartbeat(True))),
                        asyncio.ensure_future(self._every(self.sweep_interval, self._sweep))]
        self._loop_task = asyncio.ensure_future(self._read_loop())

    async def _every(self, interval_ms: int, tick: Callable[[], Awaitable[None]]) -> None:
        while self._closing is None:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await asyncio.shield(tick())
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._emit_error(err)

    def close(self) -> "asyncio.Future[None]":
        """Stop this node and unregister it, removing its subscriptions (idempotent: awaitable)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._stop())
        return self._closing

    async def _stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        ready = self._ready
        if not self._connected:
            # still connecting (or never started): never registered, nothing to unregister
            if ready is not None and not ready.done():
                ready.cancel()
                with contextlib.suppress(BaseException):
                    await ready
            self._endpoints.clear()
            await self.backend.close()
            return
        if ready is not None:
            with contextlib.suppress(BaseException):
                await ready
        self._endpoints.clear()
        self.backend.interrupt_inbox()
        waits: list[Any] = [self._loop_task, self._heartbeating, self._sweeping, *self._timers]
        for task in waits:
            if task is not None and task is not asyncio.current_task():
                with contextlib.suppress(BaseException):
                    await task
        try:
            await self.backend.unregister_node(self.node_id)
        except Exception as err:
            self._emit_error(err)
        await self.backend.close()

    def _assert_open(self) -> None:
        if self._closing is not None:
            raise QueueClosed("Relay is closed")

    # -- the API -----------------------------------------------------------------------------------
    async def subscribe(self, pattern: str, listener: Listener) -> Subscription:
        """Deliver messages on topics matching ``pattern`` to ``listener`` (sync, or async: awaited
        before the next message). For an exact topic its retained message, if any, comes first
        (``retained=True``), then live messages newer than it."""
        if not callable(listener):
            raise InvalidArgument(f"Relay listener must be callable, not {type(listener).__name__}")
        await self.wait_until_ready()
        self._assert_open()
        endpoint_id = uuid.uuid4().hex
        endpoint = _Endpoint(pattern=pattern, listener=listener)
        # registered first, so live messages that arrive meanwhile are buffered
        self._endpoints[endpoint_id] = endpoint
        retained_message: Optional[RelayMessage] = None
        try:
            added, retained = await self.backend.subscribe(self.node_id, endpoint_id, pattern)
            self._assert_open()
            cutoff = 0
            if retained:
                retained_message = await self._deliver(endpoint, pattern, str(retained["mid"]), int(retained["ts"]),
                                                       retained["data"], retained=True)
                cutoff = int(retained["mid"])
            # Skips live copies of the retained message (or older ones); the buffered ones are not
            # compared with each other (publishes on different topics may commit out of id order).
            # Buffered until the last is delivered, so a later message never overtakes them.
            pending = endpoint.pending or []
            while pending:
                message = pending.pop(0)
                if int(message.mid) > cutoff:
                    await self._deliver_message(endpoint, message)
            endpoint.pending = None
        except BaseException:
            endpoint.pending = None
            endpoint.active = False
            try:
                await self._remove_endpoint(endpoint_id, endpoint)
            except Exception as cleanup_error:
                self._recovery_pending = True
                self._emit_error(cleanup_error)
            raise
        return Subscription(self, endpoint_id, endpoint, added, retained_message)

    async def publish(self, topic: str, data: Any = None, retain: int = 0) -> dict[str, Any]:
        """Publish ``data`` (JSON-serialisable; None is null) on the concrete ``topic``; ``retain``: ms
        during which new subscribers of the exact topic get it first (0: not retained). Returns
        ``{"mid", "nodes", "endpoints"}``: the message id, and how many nodes and endpoints it went to."""
        await self.wait_until_ready()
        self._assert_open()
        if isinstance(retain, bool) or not isinstance(retain, int) or retain < 0 or retain > _MAX_SAFE:
            raise InvalidArgument(f"Invalid relay retain: {retain!r} (an integer >= 0, in ms)")
        serialized = codec.dumps(data, what="relay message data")
        return await self.backend.publish(topic, serialized, ts=int(time.time() * 1000), retain_ms=retain,
                                          max_size=self.max_message_size)

    async def delete_retained(self, topic: str) -> bool:
        """Delete a topic's retained message (new subscribers no longer get it); False if it had none."""
        await self.wait_until_ready()
        self._assert_open()
        return await self.backend.delete_retained(topic)

    async def get_counts(self) -> dict[str, int]:
        """``{"nodes", "subscriptions", "patterns", "retained"}`` of this namespace."""
        await self.wait_until_ready()
        return await self.backend.get_counts()

    async def get_nodes(self, start: int = 0, end: int = -1) -> list[dict[str, Any]]:
        """Nodes in registration order (``start``/``end`` inclusive positions, -1: to the end)."""
        await self.wait_until_ready()
        return await self.backend.get_nodes(*_check_range(start, end))

    async def get_subscriptions(self, node_id: Optional[str] = None, pattern: Optional[str] = None,
                                start: int = 0, end: int = -1) -> list[dict[str, str]]:
        """Subscriptions (``{"node_id", "endpoint_id", "pattern"}``) of the namespace, or of one node or
        one pattern."""
        if node_id is not None and pattern is not None:
            raise InvalidArgument("get_subscriptions takes node_id or pattern, not both")
        await self.wait_until_ready()
        return await self.backend.get_subscriptions(node_id, pattern, *_check_range(start, end))

    async def get_patterns(self, start: int = 0, end: int = -1) -> list[dict[str, Any]]:
        """Subscribed patterns by pattern: ``{"pattern", "subscriptions"}``."""
        await self.wait_until_ready()
        return await self.backend.get_patterns(*_check_range(start, end))

    async def get_retained(self, start: int = 0, end: int = -1) -> list[dict[str, Any]]:
        """Retained messages by expiry: ``{"topic", "expires_at", "mid", "ts", "data"}`` (data as JSON text)."""
        await self.wait_until_ready()
        return await self.backend.get_retained(*_check_range(start, end))

    async def get_node_connections(self, node_id: Optional[str] = None) -> list[dict[str, Any]]:
        """A node's (this one's by default) inbox connection as the datastore lists it."""
        await self.wait_until_ready()
        return await self.backend.get_node_connections(_check_id("node_id", self.node_id if node_id is None
                                                                 else node_id))

    async def get_namespaces(self) -> list[str]:
        """Namespaces in use on the datastore (on Redis: under this prefix)."""
        await self.wait_until_ready()
        return await self.backend.get_namespaces()

    # -- timers ------------------------------------------------------------------------------------
    def _shared(self, attr: str, make: Callable[[], Awaitable[None]]) -> "asyncio.Future[None]":
        """The run of ``make()`` in progress under ``attr``, or a new one (never two at once)."""
        running: Optional[asyncio.Future[None]] = getattr(self, attr)
        if running is not None:
            return running
        future = asyncio.ensure_future(make())
        setattr(self, attr, future)

        def done(finished: asyncio.Future[None]) -> None:
            if getattr(self, attr) is finished:
                setattr(self, attr, None)
            if not finished.cancelled():
                finished.exception()  # retrieved: whoever awaits it reports it

        future.add_done_callback(done)
        return future

    def _heartbeat(self, trim_inbox: bool = False) -> "asyncio.Future[None]":
        # A slow datastore must not pile up heartbeats (or run two recoveries): one at a time.
        if self._closing is not None:
            return _done()

        async def beat() -> None:
            alive = await self.backend.heartbeat(self.node_id, self.lease_duration)
            if (not alive or self._recovery_pending) and self._closing is None:
                await self._recover()
            if trim_inbox and self._closing is None:
                await self._check_backlog()

        return self._shared("_heartbeating", beat)

    async def _check_backlog(self) -> None:
        """Drop consumed inbox entries, cap the inbox, and emit 'lag' once the backlog reaches
        ``lag_threshold``."""
        if self._closing is not None or self._batch_in_flight:
            return

        async def check() -> None:
            backlog = await self.backend.trim_inbox(self.node_id, self.cursor, self.inbox_max_length)
            if backlog >= self.lag_threshold:
                self.emit("lag", backlog)

        await self._shared("_backlog_checking", check)

    async def _recover(self) -> None:
        """The lease expired or the node was swept: register again and restore the subscriptions.
        Retained messages are not delivered again. A failure part way is retried by the next heartbeat."""
        self._recovery_pending = True
        self._registration += 1
        await self._register()
        renewal_error: list[BaseException] = []

        async def renew() -> None:
            while True:
                await asyncio.sleep(max(1, self.lease_duration // 3) / 1000)
                if self._closing is not None:
                    return
                try:
                    if not await self.backend.heartbeat(self.node_id, self.lease_duration):
                        raise BullMQCompatError("Relay node lease expired during recovery")
                except Exception as err:
                    renewal_error.append(err)
                    return

        renewal = asyncio.ensure_future(renew())
        try:
            for endpoint_id, endpoint in list(self._endpoints.items()):
                if renewal_error:
                    raise renewal_error[0]
                if not endpoint.active:
                    await self._remove_endpoint(endpoint_id, endpoint)
                    continue
                await self.backend.subscribe(self.node_id, endpoint_id, endpoint.pattern)
                if not endpoint.active:
                    await self._remove_endpoint(endpoint_id, endpoint)
            if renewal_error:
                raise renewal_error[0]
            self._recovery_pending = False
            self.emit("recovered")
        finally:
            renewal.cancel()
            with contextlib.suppress(BaseException):
                await renewal

    async def _register(self) -> None:
        info = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(), "version": __version__}
        await self.backend.register_node(self.node_id, self.lease_duration, info, self.inbox_max_length)

    async def _remove_endpoint(self, endpoint_id: str, endpoint: _Endpoint) -> None:
        if self._closing is not None:
            return

        async def remove() -> None:
            await self.backend.remove_endpoint(self.node_id, endpoint_id)
            if not endpoint.active:
                self._endpoints.pop(endpoint_id, None)

        if endpoint.removing is None:
            future = endpoint.removing = asyncio.ensure_future(remove())

            def done(finished: asyncio.Future[Any]) -> None:
                endpoint.removing = None
                if not finished.cancelled():
                    finished.exception()

            future.add_done_callback(done)
        await asyncio.shield(endpoint.removing)

    def _sweep(self) -> "asyncio.Future[None]":
        if self._closing is not None or self._sweeping is not None:
            return _done()

        async def sweep() -> None:
            removed = await self.backend.sweep(100)
            if removed:
                self.emit("swept", removed)

        return self._shared("_sweeping", sweep)

    # -- the inbox ---------------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        # A batch fetched but not dispatched yet: kept when the heartbeat before its dispatch fails
        # (the datastore counts its entries in flight, so trimming may drop them as delivered).
        fetched: Optional[tuple[RelayBatch, int]] = None
        while self._closing is None:
            try:
                if fetched is None:
                    if self._backlog_checking is not None:
                        with contextlib.suppress(Exception):
                            await self._backlog_checking
                    registration = self._registration
                    batch = await self.backend.read_inbox(self.node_id, self.cursor, block_ms=self.block_timeout,
                                                          count=100)
                    fetched = (batch, registration)
                batch, registration = fetched
                self._batch_in_flight = bool(batch.entries)
                if batch.entries and self._closing is None:
                    # A lease may have expired while reading: recover before listeners consume
                    # messages, so they can reset state after a routing gap.
                    await asyncio.shield(self._heartbeat())
                if self._closing is not None:
                    break
                fetched = None
                # A batch of a registration a recovery replaced is not acknowledged: read again.
                if registration == self._registration:
                    self.cursor = batch.cursor
                    for entry in batch.entries:
                        await self._dispatch(entry)
                self._batch_in_flight = False
                if batch.entries:
                    await self._check_backlog()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._batch_in_flight = False
                if self._closing is not None:
                    break
                self._emit_error(err)
                await asyncio.sleep(1)
            finally:
                self._batch_in_flight = False

    async def _dispatch(self, entry: RelayEntry) -> None:
        if entry.kind != "msg":  # kinds added by newer versions are not for this node
            return
        for endpoint_id in entry.endpoints:
            endpoint = self._endpoints.get(endpoint_id)
            if endpoint is not None and endpoint.active:
                message = RelayMessage(topic=entry.topic, data=entry.data, mid=entry.mid, ts=entry.ts)
                if endpoint.pending is not None:
                    endpoint.pending.append(message)
                else:
                    await self._deliver_message(endpoint, message)

    async def _deliver_message(self, endpoint: _Endpoint, message: RelayMessage) -> None:
        await self._deliver(endpoint, message.topic, message.mid, message.ts, message.data, retained=message.retained)

    async def _deliver(self, endpoint: _Endpoint, topic: str, mid: str, ts: int, text: str, *,
                       retained: bool) -> Optional[RelayMessage]:
        """Call the listener with the parsed message (its errors go to 'error'); the message."""
        if not endpoint.active:
            return None
        try:
            data = codec.loads(text)
        except ValueError as err:
            self._emit_error(err)
            return None
        message = RelayMessage(topic=topic, data=data, mid=mid, ts=ts, retained=retained)
        try:
            result = endpoint.listener(message)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._emit_error(err)
        return message

    def _emit_error(self, err: BaseException) -> None:
        self.emit("error", err)


def _done() -> "asyncio.Future[None]":
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
