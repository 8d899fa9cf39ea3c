"""Issue #30: faults between our Relay and Node BullMQ 6.7's Relay, on Redis and on PostgreSQL.

Proved, with real Node relays (interop/relay.js on Redis, interop/pg_relay.js on PostgreSQL):

- pause recovery, both ways and on both backends: a relay process SIGSTOPped until the other
  side's sweep removed it (its lease expired) re-registers, restores its subscriptions and emits
  'recovered' once resumed; a publish made while it was gone is routed nowhere, and every publish
  after its recovery is routed to it and delivered; the other side lists it again. On Redis also
  ``CLIENT PAUSE`` of the server for longer than the lease: both relays recover and hear each other;
- lag with a Node publisher, on both backends: a slow Python listener makes the inbox pass
  ``lag_threshold`` ('lag'), only the newest ``inbox_max_length`` messages are kept (Redis caps
  the inbox at each publish, PostgreSQL at the subscriber's next trim) and Node sees the rest
  counted as dropped; a message over ``max_message_size`` is refused (code -4), by either side,
  and never reaches a subscriber nor is retained;
- restarts with a Node relay on each side of a publishing loop: after a Redis restart (no
  persistence) every publish routed on the new server is delivered, once and in order; a
  PostgreSQL restart shorter than the leases loses nothing: every publish routed, before or after
  it, is delivered once and in order, and no node had to re-register.

Waits are on conditions with generous bounds; assertions are on the delivered sequences.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import psycopg
import pytest
import redis.asyncio as aioredis

from bullmq_compat import Relay, RelayError, RelayMessage, migrate_postgres
from tests._postgres_server import PostgresServer
from tests._redis_server import RedisServer
from tests.helpers import wait_until
from tests.relay_helpers import RelayProc, SlowListener

#: ms: far above a loaded machine's stalls, short enough for a pause to outlast it
LEASE = 3000


def uid(tag: str) -> str:
    """A node id no other test (nor another xdist worker: PostgreSQL is shared) uses."""
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def is_event(name: str) -> Any:
    return lambda event: event.get("event") == name


@dataclass
class Store:
    """One backend: Node and Python relays (in a process of their own, or in this one) on it."""

    kind: str
    url: str
    schema: str = ""

    def _extra(self) -> dict[str, Any]:
        return {"schema": self.schema} if self.kind == "postgres" else {}

    def node(self, namespace: str, **options: Any) -> RelayProc:
        if self.kind == "redis":
            return RelayProc.node(self.url, namespace, **options)
        return RelayProc.node_pg(self.url, self.schema, namespace, **options)

    def python(self, namespace: str, **options: Any) -> RelayProc:
        return RelayProc.python(self.url, namespace, **self._extra(), **options)

    def relay(self, namespace: str, **options: Any) -> Relay:
        return Relay(self.url, namespace=namespace, **self._extra(), **options)

    async def inbox_length(self, namespace: str, node_id: str) -> int:
        """Entries (read or not) in a node's inbox, as stored."""
        if self.kind == "redis":
            client = aioredis.Redis.from_url(self.url, decode_responses=True)
            try:
                return int(await client.xlen(f"bull::relay:{{{namespace}}}:{node_id}:inbox"))
            finally:
                await client.aclose()
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cursor = await conn.execute(
                f'SELECT count(*) FROM "{self.schema}".relay_inbox WHERE ns = %s AND node_id = %s',
                (namespace, node_id))
            row = await cursor.fetchone()
            assert row is not None
            return int(row[0])


@pytest.fixture(params=["redis", "postgres"])
async def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "redis":
        return Store("redis", request.getfixturevalue("redis_url"))
    url = request.getfixturevalue("postgres_url")
    schema = request.getfixturevalue("pg_schema")
    await migrate_postgres(url, schema)
    return Store("postgres", url, schema)


async def node_ids(proc: RelayProc) -> list[str]:
    return [n["id"] for n in await proc.call("getNodes")]


# -- pause recovery ------------------------------------------------------------------------------
async def test_paused_python_relay_recovers_and_hears_node_again(store: Store, queue_name: str) -> None:
    ns = queue_name
    async with store.node(ns, nodeId=uid("node-watch"), leaseDuration=LEASE, sweepInterval=300,
                          blockTimeout=1000) as node, \
            store.python(ns, node_id=uid("py-paused"), lease_duration=LEASE, block_timeout=1000) as py:
        await py.call("subscribe", pattern="cfg.>")
        assert (await node.call("publish", topic="cfg.before", data=0))["endpoints"] == 1
        await py.wait_messages(1, "cfg.>")
        py.signal(signal.SIGSTOP)
        try:
            await node.wait_event(lambda e: e.get("event") == "swept" and py.node_id in e["ids"], 60,
                                  "Node's sweep of the paused Python relay")
            assert py.node_id not in await node_ids(node)
            assert (await node.call("publish", topic="cfg.during", data=1))["endpoints"] == 0
        finally:
            py.signal(signal.SIGCONT)
        await py.wait_event(is_event("recovered"), 60, "the Python relay's 'recovered'")
        # its subscription is back: Node's next publishes are routed to it and delivered
        for n in (2, 3, 4):
            assert (await node.call("publish", topic="cfg.after", data=n))["endpoints"] == 1
        messages = await py.wait_messages(4, "cfg.>", timeout=60)
        assert [(m["topic"], m["data"]) for m in messages] == [
            ("cfg.before", 0), ("cfg.after", 2), ("cfg.after", 3), ("cfg.after", 4)]
        [listed] = [n for n in await node.call("getNodes") if n["id"] == py.node_id]
        assert listed["subscriptions"] == 1


async def test_paused_node_relay_recovers_and_hears_python_again(store: Store, queue_name: str) -> None:
    ns = queue_name
    watcher = store.relay(ns, node_id=uid("py-watch"), lease_duration=LEASE, sweep_interval=300, block_timeout=1000)
    swept: list[str] = []
    watcher.on("swept", swept.extend)
    try:
        await watcher.wait_until_ready()
        async with store.node(ns, nodeId=uid("node-paused"), leaseDuration=LEASE, blockTimeout=1000) as node:
            await node.call("subscribe", pattern="cfg.>")
            assert (await watcher.publish("cfg.before", 0))["endpoints"] == 1
            await node.wait_messages(1, "cfg.>")
            node.signal(signal.SIGSTOP)
            try:
                await wait_until(lambda: node.node_id in swept, 60, "our sweep of the paused Node relay")
                assert node.node_id not in [n["id"] for n in await watcher.get_nodes()]
                assert (await watcher.publish("cfg.during", 1))["endpoints"] == 0
            finally:
                node.signal(signal.SIGCONT)
            await node.wait_event(is_event("recovered"), 60, "the Node relay's 'recovered'")
            for n in (2, 3, 4):
                assert (await watcher.publish("cfg.after", n))["endpoints"] == 1
            messages = await node.wait_messages(4, "cfg.>", timeout=60)
            assert [(m["topic"], m["data"]) for m in messages] == [
                ("cfg.before", 0), ("cfg.after", 2), ("cfg.after", 3), ("cfg.after", 4)]
            [listed] = [n for n in await watcher.get_nodes() if n["id"] == node.node_id]
            assert listed["subscriptions"] == 1
    finally:
        await watcher.close()


async def test_client_pause_past_the_lease_both_relays_recover_and_hear_each_other(queue_name: str) -> None:
    # a server of our own: CLIENT PAUSE stops every client of the server
    server = RedisServer().start()
    try:
        ns, url = queue_name, server.url
        py = Relay(url, namespace=ns, node_id=uid("py"), lease_duration=LEASE, block_timeout=1000)
        recovered: list[float] = []
        py.on("recovered", lambda: recovered.append(time.monotonic()))
        py.on("error", lambda err: None)  # the calls queued during the pause may time out: retried
        try:
            await py.wait_until_ready()
            got: list[RelayMessage] = []
            await py.subscribe("to.py", got.append)
            async with RelayProc.node(url, ns, nodeId=uid("node"), leaseDuration=LEASE, blockTimeout=1000) as node:
                await node.call("subscribe", pattern="to.node")
                assert (await node.call("publish", topic="to.py", data=0))["endpoints"] == 1
                assert (await py.publish("to.node", 0))["endpoints"] == 1
                await wait_until(lambda: len(got) == 1, 30, "Node's first message")
                await node.wait_messages(1, "to.node")
                admin = aioredis.Redis.from_url(url)
                try:
                    await admin.execute_command("CLIENT", "PAUSE", 2 * LEASE, "ALL")
                    paused_at = time.monotonic()
                finally:
                    await admin.aclose()
                await wait_until(lambda: recovered, 60, "our 'recovered'")
                await node.wait_event(is_event("recovered"), 60, "Node's 'recovered'")
                # recovered because the lease expired during the pause, so not before it ended
                assert recovered[0] - paused_at > LEASE / 1000
                for n in (1, 2, 3):
                    assert (await node.call("publish", topic="to.py", data=n))["endpoints"] == 1
                    assert (await py.publish("to.node", n))["endpoints"] == 1
                await wait_until(lambda: len(got) >= 4, 60, "Node's messages after the pause")
                theirs = await node.wait_messages(4, "to.node", timeout=60)
                assert [m.data for m in got] == [0, 1, 2, 3]
                assert [m["data"] for m in theirs] == [0, 1, 2, 3]
                assert {py.node_id, node.node_id} == set(await node_ids(node)) == \
                    {n["id"] for n in await py.get_nodes()}
        finally:
            await py.close()
    finally:
        server.stop()


# -- lag and sizes ---------------------------------------------------------------------------------
async def test_slow_listener_lags_under_a_node_publisher_and_keeps_the_newest(store: Store, queue_name: str) -> None:
    ns = queue_name
    py = store.relay(ns, node_id=uid("py-slow"), inbox_max_length=20, lag_threshold=5, block_timeout=1000)
    lags: list[int] = []
    py.on("lag", lags.append)
    slow = SlowListener()
    entered, release, got = slow.entered, slow.release, slow.got

    try:
        await py.subscribe("load.x", slow)
        async with store.node(ns, nodeId=uid("node-pub"), blockTimeout=1000) as node:
            assert (await node.call("publish", topic="load.x", data=0))["endpoints"] == 1
            await asyncio.wait_for(entered.wait(), 30)
            for i in range(1, 61):
                assert (await node.call("publish", topic="load.x", data=i))["endpoints"] == 1
            stored = await store.inbox_length(ns, py.node_id)
            if store.kind == "redis":
                assert stored <= 20  # each publish trims the inbox to the subscriber's cap
            else:
                # no publish trims on PostgreSQL, and no trim runs while a batch is held: message 0
                # (acknowledged by the next read) and the 60 behind it
                assert stored == 61
            release.set()
            await wait_until(lambda: lags, 30, "'lag'")
            assert 5 <= lags[0] <= 20
            await wait_until(lambda: got and got[-1] == 60, 30, "the newest message")
            # 0 (held), then the newest ones the cap kept, none missing among them
            assert got[0] == 0 and 40 <= got[1] and got[1:] == list(range(got[1], 61)) and len(got) <= 21
            [seen] = [n for n in await node.call("getNodes") if n["id"] == py.node_id]
            assert seen["dropped"] >= 40
    finally:
        await py.close()


async def test_messages_over_max_size_are_refused_both_ways(store: Store, queue_name: str) -> None:
    ns = queue_name
    py = store.relay(ns, node_id=uid("py"), max_message_size=100, block_timeout=1000)
    got: list[RelayMessage] = []
    try:
        await py.subscribe("big.to-py", got.append)
        async with store.node(ns, nodeId=uid("node"), maxMessageSize=100, blockTimeout=1000) as node:
            await node.call("subscribe", pattern="big.to-node")
            # 101 bytes of JSON: refused by either side's publish, retain or not
            with pytest.raises(AssertionError, match=r"Message data is too large: big\.to-py \(code -4\)"):
                await node.call("publish", topic="big.to-py", data="y" * 99, retain=60_000)
            with pytest.raises(RelayError) as refused:
                await py.publish("big.to-node", "y" * 99, retain=60_000)
            assert refused.value.code == -4 and str(refused.value) == "Message data is too large: big.to-node"
            # 100 bytes: the limit is inclusive; then a marker, after which nothing refused can come
            sent = [await node.call("publish", topic="big.to-py", data="y" * 98),
                    await node.call("publish", topic="big.to-py", data="end")]
            mine = [await py.publish("big.to-node", "y" * 98), await py.publish("big.to-node", "end")]
            assert [r["endpoints"] for r in sent + mine] == [1, 1, 1, 1]
            await wait_until(lambda: len(got) >= 2, 30, "Node's two messages")
            theirs = await node.wait_messages(2, "big.to-node")
            assert [(m.mid, m.data) for m in got] == [(sent[0]["mid"], "y" * 98), (sent[1]["mid"], "end")]
            assert [(m["mid"], m["data"]) for m in theirs] == [(mine[0]["mid"], "y" * 98), (mine[1]["mid"], "end")]
            assert await py.get_retained() == []
    finally:
        await py.close()


# -- restarts ------------------------------------------------------------------------------------
class PublishLoop:
    """Our relay publishing {"n": 1, 2, ...} on a topic every ``interval`` s, recording the
    numbers routed (endpoints >= 1) and the failed publishes."""

    def __init__(self, relay: Relay, topic: str, interval: float = 0.03) -> None:
        self.relay, self.topic, self.interval = relay, topic, interval
        self.n = 0
        self.routed: list[int] = []
        self.failed = 0
        self._stop = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            self.n += 1
            try:
                if (await self.relay.publish(self.topic, {"n": self.n}))["endpoints"] >= 1:
                    self.routed.append(self.n)
            except Exception:
                self.failed += 1
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


def numbers(messages: list[dict[str, Any]]) -> list[int]:
    return [m["data"]["n"] for m in messages]


async def both_routed_again(loop: PublishLoop, node: Any, py_at_halt: int, node_at_halt: dict[str, Any],
                            timeout: float) -> None:
    """After a datastore restart: until 10 more of our publishes and 11 more of Node's are routed
    (+ 1: the publish under way at the halt may be routed by the restarted server)."""
    async def node_routed_again() -> bool:
        return bool((await node.call("loopState"))["routed"] >= node_at_halt["routed"] + 11)

    await wait_until(lambda: len([n for n in loop.routed if n > py_at_halt]) >= 10, timeout,
                     "our publishes to be routed after the restart")
    await wait_until(node_routed_again, timeout, "Node's publishes to be routed after the restart")


async def test_redis_restart_under_node_and_python_publishing_loops(queue_name: str) -> None:
    server = RedisServer().start()
    try:
        ns, url = queue_name, server.url
        py = Relay(url, namespace=ns, node_id=uid("py"), lease_duration=LEASE, block_timeout=1000)
        recovered: list[float] = []
        py.on("recovered", lambda: recovered.append(time.monotonic()))
        py.on("error", lambda err: None)  # the outage: heartbeats and reads fail, and are retried
        try:
            await py.wait_until_ready()
            from_node: list[int] = []
            await py.subscribe("seq.node", lambda m: from_node.append(m.data["n"]))
            async with RelayProc.node(url, ns, nodeId=uid("node"), leaseDuration=LEASE, blockTimeout=1000) as node:
                await node.call("subscribe", pattern="seq.py")
                await node.call("publishLoop", topic="seq.node", intervalMs=30)
                loop = PublishLoop(py, "seq.py")
                loop.start()
                try:
                    await wait_until(lambda: len(from_node) >= 5 and len(node.messages("seq.py")) >= 5, 30,
                                     "both loops to deliver before the restart")
                    assert server.proc is not None
                    server.proc.terminate()
                    await asyncio.to_thread(server.proc.wait, 10)
                    # every publish numbered above these started once the old server was gone
                    py_at_halt = loop.n
                    node_at_halt = await node.call("loopState")
                    await asyncio.sleep(1.0)  # the outage
                    await asyncio.to_thread(RedisServer.start, server)  # same port, empty
                    await wait_until(lambda: recovered, 60, "our 'recovered'")
                    await node.wait_event(is_event("recovered"), 60, "Node's 'recovered'")

                    await both_routed_again(loop, node, py_at_halt, node_at_halt, 60)
                finally:
                    await loop.stop()
                node_loop = await node.call("stopLoop", detail=True)
                node_after = [n for n in node_loop["routed"] if n > node_at_halt["n"]]
                py_after = [n for n in loop.routed if n > py_at_halt]
                # every publish routed by the new server is delivered, once and in order
                await wait_until(lambda: set(node_after) <= set(from_node), 60, "Node's routed messages")
                await wait_until(lambda: set(py_after) <= set(numbers(node.messages("seq.py"))), 60,
                                 "our routed messages, at Node")
                for seen in (from_node, numbers(node.messages("seq.py"))):
                    assert seen == sorted(set(seen))
                assert loop.failed > 0  # our loop did run into the outage
        finally:
            await py.close()
    finally:
        server.stop()


async def test_postgres_restart_loses_nothing_routed(queue_name: str) -> None:
    server = PostgresServer().start()
    try:
        ns, url, schema = queue_name, server.url, "relay_faults"
        await migrate_postgres(url, schema)
        # leases far longer than the outage: no node expires, so nothing routed may be lost
        py = Relay(url, schema=schema, namespace=ns, node_id=uid("py"), lease_duration=60_000, block_timeout=1000)
        recovered: list[float] = []
        py.on("recovered", lambda: recovered.append(time.monotonic()))
        py.on("error", lambda err: None)
        try:
            await py.wait_until_ready()
            from_node: list[int] = []
            await py.subscribe("seq.node", lambda m: from_node.append(m.data["n"]))
            async with RelayProc.node_pg(url, schema, ns, nodeId=uid("node"), leaseDuration=60_000,
                                         blockTimeout=1000) as node:
                await node.call("subscribe", pattern="seq.py")
                await node.call("publishLoop", topic="seq.node", intervalMs=50)
                loop = PublishLoop(py, "seq.py", 0.05)
                loop.start()
                try:
                    await wait_until(lambda: len(from_node) >= 5 and len(node.messages("seq.py")) >= 5, 30,
                                     "both loops to deliver before the restart")
                    await asyncio.to_thread(server.halt, "fast")
                    py_at_halt = loop.n
                    node_at_halt = await node.call("loopState")
                    await asyncio.sleep(1.0)  # the outage
                    await asyncio.to_thread(server.boot)

                    await both_routed_again(loop, node, py_at_halt, node_at_halt, 90)
                finally:
                    await loop.stop()
                node_loop = await node.call("stopLoop", detail=True)
                # everything routed -- before the halt (committed, maybe unread then) and after it -- is
                # delivered, once and in order
                await wait_until(lambda: set(node_loop["routed"]) <= set(from_node), 60, "Node's routed messages")
                await wait_until(lambda: set(loop.routed) <= set(numbers(node.messages("seq.py"))), 60,
                                 "our routed messages, at Node")
                for seen in (from_node, numbers(node.messages("seq.py"))):
                    assert seen == sorted(set(seen))
                assert min(node_loop["routed"]) <= node_at_halt["n"] < max(node_loop["routed"])
                assert min(loop.routed) <= py_at_halt < max(loop.routed)
                # the leases outlived the outage: nobody re-registered (no routing gap)
                assert recovered == [] and [e for e in node.events if e.get("event") == "recovered"] == []
                assert py.backend.listen_sessions_opened >= 2  # type: ignore[attr-defined]
        finally:
            with contextlib.suppress(Exception):
                await py.close()
    finally:
        await asyncio.to_thread(server.stop)
