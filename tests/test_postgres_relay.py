"""The relay on PostgreSQL: `PostgresRelayBackend` alone (upstream's relay_* commands, the inbox wait
on NOTIFY, a killed LISTEN session, refusals), then `bullmq_compat.Relay` on it end to end.

Each test works in a schema of its own (``pg_migrated``), with a namespace and node ids of its own:
NOTIFY payloads (``<namespace>:<node>``) and application_name are seen across schemas.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from bullmq_compat._backends.base import RelayBatch
from bullmq_compat._backends.postgres.relay import PostgresRelayBackend, inbox_connection_name
from bullmq_compat._errors import InvalidArgument, RelayError
from tests.helpers import eventually

INFO = {"name": "py", "host": "h", "pid": 1, "version": "6.7.0"}


def uid(tag: str) -> str:
    return f"{tag}{uuid.uuid4().hex[:12]}"


Factory = Callable[..., Awaitable[PostgresRelayBackend]]


@pytest.fixture
async def make(postgres_url: str, pg_migrated: str) -> AsyncIterator[Factory]:
    """``await make(node_id, namespace=...)``: a ready backend on the test's schema (closed after)."""
    made: list[PostgresRelayBackend] = []

    async def factory(node_id: str, *, namespace: str, connection: Any = None) -> PostgresRelayBackend:
        backend = PostgresRelayBackend(connection or postgres_url, namespace=namespace, node_id=node_id,
                                       schema=pg_migrated, inbox_max_length=10000)
        made.append(backend)
        await backend.wait_until_ready()
        return backend

    try:
        yield factory
    finally:
        for backend in made:
            await backend.close()


async def drain(backend: PostgresRelayBackend, node: str, cursor: str = "", *, want: int,
                timeout: float = 30) -> tuple[list[Any], str]:
    """Read until ``want`` entries came (or fail at ``timeout``); (entries, cursor after them)."""
    entries: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(entries) < want:
        assert time.monotonic() < deadline, f"only {len(entries)} of {want} entries after {timeout}s"
        batch = await backend.read_inbox(node, cursor, block_ms=1000, count=100)
        entries += batch.entries
        cursor = batch.cursor or cursor
    return entries, cursor


async def test_publish_routes_exact_and_wildcard_subscriptions(make: Factory) -> None:
    ns, a, b = uid("ns"), uid("a"), uid("b")
    pa, pb = await make(a, namespace=ns), await make(b, namespace=ns)
    await pa.register_node(a, 30000, INFO, 10000)
    await pb.register_node(b, 30000, INFO, 10000)
    assert await pa.subscribe(a, "e1", "orders.eu.created") == (True, None)
    assert await pa.subscribe(a, "e2", "orders.*.created") == (True, None)
    assert await pa.subscribe(a, "e2", "orders.*.created") == (False, None)  # already there
    assert await pb.subscribe(b, "e3", "orders.>") == (True, None)
    assert await pb.subscribe(b, "e4", "payments.>") == (True, None)

    sent = await pa.publish("orders.eu.created", json.dumps({"n": 1}), ts=123, retain_ms=0, max_size=1024)
    assert sent["nodes"] == 2 and sent["endpoints"] == 3 and sent["mid"].isdigit()
    assert (await pa.publish("orders.us.created", "2", ts=124, retain_ms=0, max_size=1024))[
        "endpoints"] == 2  # e2 and e3
    assert (await pa.publish("orders", "3", ts=125, retain_ms=0, max_size=1024))["nodes"] == 0  # '>' needs one more
    assert (await pa.publish("other.x", "4", ts=126, retain_ms=0, max_size=1024)) == {
        "mid": str(int(sent["mid"]) + 3), "nodes": 0, "endpoints": 0}

    got_a, cursor_a = await drain(pa, a, want=2)
    assert [(e.kind, e.topic, e.ts, e.data, e.endpoints) for e in got_a] == [
        ("msg", "orders.eu.created", 123, '{"n": 1}', ["e1", "e2"]),
        ("msg", "orders.us.created", 124, "2", ["e2"])]
    assert got_a[0].mid == sent["mid"]
    got_b, _ = await drain(pb, b, want=2)
    assert [(e.topic, e.endpoints) for e in got_b] == [("orders.eu.created", ["e3"]), ("orders.us.created", ["e3"])]

    # the cursor acknowledges by id: read with it, nothing is left; without it, they come again
    again = await pa.read_inbox(a, "", block_ms=0, count=100)
    assert [e.mid for e in again.entries] == [e.mid for e in got_a]
    assert again.cursor == cursor_a
    empty = await pa.read_inbox(a, cursor_a, block_ms=0, count=100)
    assert empty == RelayBatch(entries=[], cursor="")
    assert (await pa.get_nodes(0, -1))[0]["backlog"] == 0  # not trimmed yet: as of the last trim

    assert await pa.remove_endpoint(a, "e2") == 1
    assert (await pa.publish("orders.eu.created", "5", ts=1, retain_ms=0, max_size=1024))["endpoints"] == 2


async def test_a_blocked_read_wakes_at_the_publish_and_interrupt_returns_at_once(make: Factory) -> None:
    ns, a = uid("ns"), uid("a")
    backend = await make(a, namespace=ns)
    publisher = await make(uid("p"), namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    await backend.subscribe(a, "e", "t.x")
    assert (await backend.read_inbox(a, "", block_ms=0, count=10)).entries == []

    reading = asyncio.ensure_future(backend.read_inbox(a, "", block_ms=20000, count=10))
    await eventually(lambda: backend.listening, timeout=15, what="the read to LISTEN")
    await asyncio.sleep(0.2)
    assert not reading.done()
    started = time.monotonic()
    await publisher.publish("t.x", '"hi"', ts=1, retain_ms=0, max_size=100)
    batch = await asyncio.wait_for(reading, 30)
    assert time.monotonic() - started < 10  # woken by the NOTIFY, not by the end of a 20 s block
    assert [e.data for e in batch.entries] == ['"hi"']

    blocked = asyncio.ensure_future(backend.read_inbox(a, batch.cursor, block_ms=30000, count=10))
    await asyncio.sleep(0.5)
    assert not blocked.done()
    started = time.monotonic()
    backend.interrupt_inbox()
    assert (await asyncio.wait_for(blocked, 10)).entries == []
    assert time.monotonic() - started < 5
    # later reads do not wait either, but still read
    await publisher.publish("t.x", '"late"', ts=2, retain_ms=0, max_size=100)
    started = time.monotonic()
    assert [e.data for e in (await backend.read_inbox(a, "", block_ms=30000, count=10)).entries] == ['"late"']
    assert time.monotonic() - started < 5


async def test_a_missed_notification_only_delays_delivery(make: Factory, postgres_url: str) -> None:
    """An inbox row without its NOTIFY (inserted here by hand) is read when the wait times out."""
    ns, a = uid("ns"), uid("a")
    backend = await make(a, namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    await backend.connection.execute(
        "INSERT INTO relay_inbox (ns, node_id, kind, topic, mid, ts, data, endpoints) "
        "VALUES ($1, $2, 'msg', 't', 7, 8, '1', ARRAY['e'])", [ns, a])
    started = time.monotonic()
    batch = await backend.read_inbox(a, "", block_ms=0, count=10)  # no wait: found by the first read
    assert [e.mid for e in batch.entries] == ["7"]
    # acknowledged, then the next row has no NOTIFY: found after block_ms, by the read after the wait
    reading = asyncio.ensure_future(backend.read_inbox(a, batch.cursor, block_ms=1500, count=10))
    await eventually(lambda: backend.listening, timeout=15)
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await backend.connection.execute(
        "INSERT INTO relay_inbox (ns, node_id, kind, topic, mid, ts, data, endpoints) "
        "VALUES ($1, $2, 'msg', 't', 9, 8, '1', ARRAY['e'])", [ns, a])
    later = await asyncio.wait_for(reading, 30)
    assert [e.mid for e in later.entries] == ["9"]
    assert time.monotonic() - started > 0.5  # it was not woken: the block ran out


async def test_a_killed_listen_session_is_reopened(make: Factory) -> None:
    ns, a = uid("ns"), uid("a")
    backend = await make(a, namespace=ns)
    publisher = await make(uid("p"), namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    await backend.subscribe(a, "e", "t")
    reading = asyncio.ensure_future(backend.read_inbox(a, "", block_ms=20000, count=10))
    await eventually(lambda: backend.listening, timeout=15)
    await asyncio.sleep(0.2)
    conns = await backend.get_node_connections(a)
    assert len(conns) == 1 and set(conns[0]) == {"address", "age", "idle"}
    database, schema = await backend._connection_identity()
    killed = (await publisher.connection.execute(
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE application_name = $1",
        [inbox_connection_name(database, schema, ns, a)])).rows[0]["n"]
    assert killed == 1
    started = time.monotonic()
    first = await asyncio.wait_for(reading, 30)  # the wait ends with its session, not at 20 s
    assert time.monotonic() - started < 10
    assert first.entries == []
    await publisher.publish("t", "1", ts=1, retain_ms=0, max_size=10)
    got, _ = await drain(backend, a, want=1)
    assert [e.data for e in got] == ["1"]
    assert backend.listen_sessions_opened == 2
    # and the new session waits on NOTIFY again
    reading = asyncio.ensure_future(backend.read_inbox(a, _, block_ms=20000, count=10))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await publisher.publish("t", "2", ts=2, retain_ms=0, max_size=10)
    assert [e.data for e in (await asyncio.wait_for(reading, 30)).entries] == ["2"]
    assert time.monotonic() - started < 10
    assert len(await backend.get_node_connections(a)) == 1


async def test_retained_messages(make: Factory) -> None:
    ns, a = uid("ns"), uid("a")
    backend = await make(a, namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    sent = await backend.publish("cfg.flags", '{"on":true}', ts=42, retain_ms=60000, max_size=100)
    assert sent["nodes"] == 0
    added, retained = await backend.subscribe(a, "e", "cfg.flags")
    assert added and retained == {"mid": sent["mid"], "ts": 42, "data": '{"on":true}'}
    assert (await backend.subscribe(a, "w", "cfg.*"))[1] is None  # wildcards get no retained message
    [row] = await backend.get_retained(0, -1)
    assert {k: row[k] for k in ("topic", "mid", "ts", "data")} == {
        "topic": "cfg.flags", "mid": sent["mid"], "ts": 42, "data": '{"on":true}'}
    assert row["expires_at"] > time.time() * 1000 + 30000
    assert (await backend.get_counts())["retained"] == 1
    assert await backend.delete_retained("cfg.flags") is True
    assert await backend.delete_retained("cfg.flags") is False
    assert (await backend.subscribe(a, "e2", "cfg.flags"))[1] is None

    await backend.publish("cfg.short", "1", ts=1, retain_ms=300, max_size=100)

    async def gone() -> bool:
        return (await backend.subscribe(a, uid("e"), "cfg.short"))[1] is None and not await backend.get_retained(0, -1)
    await eventually(gone, timeout=30, what="the retained message to expire")
    assert await backend.delete_retained("cfg.short") is False


async def test_trim_caps_the_inbox_and_counts_dropped(make: Factory) -> None:
    ns, a = uid("ns"), uid("a")
    backend = await make(a, namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    await backend.subscribe(a, "e", "t")
    for i in range(5):
        await backend.publish("t", str(i), ts=i, retain_ms=0, max_size=10)
    assert await backend.trim_inbox(a, "", 3) == 3
    [node] = await backend.get_nodes(0, -1)
    assert node["backlog"] == 3 and node["dropped"] == 2
    batch = await backend.read_inbox(a, "", block_ms=0, count=2)
    assert [e.data for e in batch.entries] == ["2", "3"]
    assert await backend.trim_inbox(a, batch.cursor, 3) == 1  # the read batch is acknowledged
    [node] = await backend.get_nodes(0, -1)
    assert node["backlog"] == 1 and node["dropped"] == 2
    assert await backend.trim_inbox(uid("nobody"), "", 3) == 0


async def test_an_expired_node_is_swept_and_must_recover(make: Factory) -> None:
    ns, a, b = uid("ns"), uid("a"), uid("b")
    backend = await make(a, namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    await backend.register_node(b, 300, INFO, 10000)
    await backend.subscribe(b, "e", "t")
    await backend.publish("t", "1", ts=1, retain_ms=0, max_size=10)

    async def swept() -> list[str]:
        return await backend.sweep(100)
    assert await eventually(swept, timeout=30, what="b to be swept") == [b]
    assert await backend.heartbeat(b, 1000) is False
    assert await backend.heartbeat(a, 30000) is True
    assert [n["id"] for n in await backend.get_nodes(0, -1)] == [a]
    assert await backend.get_subscriptions(b, None, 0, -1) == []
    assert (await backend.publish("t", "2", ts=2, retain_ms=0, max_size=10))["nodes"] == 0
    with pytest.raises(RelayError) as raised:
        await backend.subscribe(b, "e", "t")
    assert raised.value.code == -3
    # recovery: register again, subscribe again; the old inbox went with the node
    await backend.register_node(b, 30000, INFO, 10000)
    assert await backend.subscribe(b, "e", "t") == (True, None)
    assert (await backend.read_inbox(b, "", block_ms=0, count=10)).entries == []
    assert await backend.unregister_node(b) is True
    assert await backend.unregister_node(b) is False


async def test_getters(make: Factory) -> None:
    ns, a, b = uid("ns"), uid("a"), uid("b")
    backend = await make(a, namespace=ns)
    other = await make(b, namespace=ns)
    before = int(time.time() * 1000)
    await backend.register_node(a, 30000, INFO, 10000)
    await other.register_node(b, 30000, {**INFO, "name": "second"}, 10000)
    await backend.subscribe(a, "e1", "x.y")
    await backend.subscribe(a, "e2", "x.*")
    await other.subscribe(b, "e1", "x.y")
    await backend.publish("r.t", "[1]", ts=5, retain_ms=60000, max_size=10)
    assert await backend.get_counts() == {"nodes": 2, "subscriptions": 3, "patterns": 2, "retained": 1}
    nodes = await backend.get_nodes(0, -1)
    assert [n["id"] for n in nodes] == [a, b]
    first = nodes[0]
    assert set(first) == {"id", "info", "registered_at", "lease_until", "last_heartbeat", "backlog", "dropped",
                          "subscriptions"}
    assert first["info"] == INFO and nodes[1]["info"]["name"] == "second"
    assert before - 5000 <= first["registered_at"] <= first["lease_until"] - 20000
    assert isinstance(first["last_heartbeat"], int) and first["subscriptions"] == 2
    assert [n["id"] for n in await backend.get_nodes(1, 1)] == [b]
    assert await backend.get_subscriptions(None, None, 0, -1) == [
        {"node_id": a, "endpoint_id": "e1", "pattern": "x.y"},
        {"node_id": a, "endpoint_id": "e2", "pattern": "x.*"},
        {"node_id": b, "endpoint_id": "e1", "pattern": "x.y"}]
    assert [s["endpoint_id"] for s in await backend.get_subscriptions(a, None, 0, -1)] == ["e1", "e2"]
    assert [s["node_id"] for s in await backend.get_subscriptions(None, "x.y", 0, 0)] == [a]
    assert await backend.get_patterns(0, -1) == [{"pattern": "x.*", "subscriptions": 1},
                                                 {"pattern": "x.y", "subscriptions": 2}]
    assert ns in await backend.get_namespaces()
    assert await backend.get_node_connections(a) == []  # no inbox read yet: no LISTEN session
    await backend.read_inbox(a, "", block_ms=0, count=1)
    [conn] = await other.get_node_connections(a)  # found by name, from another backend
    assert isinstance(conn["address"], str) and conn["age"] >= 0 and conn["idle"] >= 0


async def test_refusals_raise_relay_error_with_upstream_code(make: Factory) -> None:
    ns, a = uid("ns"), uid("a")
    backend = await make(a, namespace=ns)
    await backend.register_node(a, 30000, INFO, 10000)
    cases: list[tuple[Awaitable[Any], int, str]] = [
        (backend.publish("bad topic", "1", ts=1, retain_ms=0, max_size=10), -1, "Invalid topic: bad topic"),
        (backend.publish("a.*", "1", ts=1, retain_ms=0, max_size=10), -1, "Invalid topic: a.*"),
        (backend.delete_retained("a..b"), -1, "Invalid topic: a..b"),
        (backend.subscribe(a, "e", "a.>.b"), -2, "Invalid topic pattern: a.>.b"),
        (backend.subscribe(uid("ghost"), "e", "a.b"), -3, "Relay node is not registered: a.b"),
        (backend.publish("a.b", "12345", ts=1, retain_ms=0, max_size=4), -4, "Message data is too large: a.b"),
        (backend.register_node("bad id!", 1000, INFO, 10), -5, "Invalid relay node or endpoint id"),
        (backend.subscribe(a, "bad endpoint", "a.b"), -5, "Invalid relay node or endpoint id: a.b"),
    ]
    for call, code, message in cases:
        with pytest.raises(RelayError) as raised:
            await call
        assert (raised.value.code, str(raised.value)) == (code, message)


async def test_a_supplied_pool_needs_two_connections(postgres_url: str, pg_migrated: str) -> None:
    import psycopg_pool

    small = psycopg_pool.AsyncConnectionPool(postgres_url, min_size=1, max_size=1, open=False)
    with pytest.raises(InvalidArgument, match="max >= 2"):
        PostgresRelayBackend(small, namespace="n", node_id="a", schema=pg_migrated, inbox_max_length=10)


# -- end to end, through bullmq_compat.Relay ---------------------------------------------------------
class Inbox:
    """A listener that keeps what it got."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def __call__(self, message: Any) -> None:
        self.got.append(message)

    def data(self) -> list[Any]:
        return [m.data for m in self.got]


async def test_relay_end_to_end(postgres_url: str, pg_migrated: str) -> None:
    from bullmq_compat import Relay

    ns = uid("ns")
    opts: dict[str, Any] = dict(connection=postgres_url, schema=pg_migrated, namespace=ns, lease_duration=5000)
    async with Relay(node_id=uid("a"), name="first", **opts) as a, Relay(node_id=uid("b"), **opts) as b:
        assert a.backend.kind == "postgres" and a.cursor == ""
        exact, star, tail = Inbox(), Inbox(), Inbox()
        await a.subscribe("fleet.eu.status", exact)
        await b.subscribe("fleet.*.status", star)
        await b.subscribe("fleet.>", tail)
        sent = await a.publish("fleet.eu.status", {"up": True})
        assert (sent["nodes"], sent["endpoints"]) == (2, 3)
        assert (await b.publish("fleet.us.status", [1, 2]))["endpoints"] == 2
        await eventually(lambda: len(exact.got) == 1 and len(star.got) == 2 and len(tail.got) == 2, timeout=30)
        assert exact.got[0].data == {"up": True} and exact.got[0].mid == sent["mid"] and not exact.got[0].retained
        assert star.data() == [{"up": True}, [1, 2]] and [m.topic for m in tail.got] == [
            "fleet.eu.status", "fleet.us.status"]

        await a.publish("cfg.x", {"v": 1}, retain=60000)
        late = Inbox()
        sub = await b.subscribe("cfg.x", late)
        assert sub.retained is not None and sub.retained.data == {"v": 1}
        assert [(m.data, m.retained) for m in late.got] == [({"v": 1}, True)]
        assert await b.delete_retained("cfg.x") is True

        nodes = await a.get_nodes()
        assert [n["id"] for n in nodes] == [a.node_id, b.node_id]
        assert nodes[0]["info"]["name"] == "first" and nodes[0]["info"]["pid"] > 0
        await eventually(lambda: a.get_node_connections(b.node_id), timeout=30, what="b's inbox session")
        with pytest.raises(RelayError) as raised:
            await a.publish("bad topic!", 1)
        assert raised.value.code == -1
        await sub.unsubscribe()
        assert (await a.publish("cfg.x", 2))["endpoints"] == 0
        b_id = b.node_id
    # closed: both unregistered (and their sessions gone)
    backend = PostgresRelayBackend(postgres_url, namespace=ns, node_id=uid("c"), schema=pg_migrated)
    try:
        assert await backend.get_nodes(0, -1) == []
        assert await eventually(lambda: _no_connections(backend, b_id), timeout=30)
    finally:
        await backend.close()


async def _no_connections(backend: PostgresRelayBackend, node_id: str) -> bool:
    return await backend.get_node_connections(node_id) == []


async def test_relay_sweeps_an_expired_node_and_recovers_its_own(postgres_url: str, pg_migrated: str) -> None:
    from bullmq_compat import Relay

    ns, ghost = uid("ns"), uid("ghost")
    raw = PostgresRelayBackend(postgres_url, namespace=ns, node_id=ghost, schema=pg_migrated)
    try:
        await raw.register_node(ghost, 500, INFO, 100)
        async with Relay(connection=postgres_url, schema=pg_migrated, namespace=ns, node_id=uid("a"),
                         lease_duration=1000, sweep_interval=200) as relay:
            swept: list[list[str]] = []
            recovered: list[bool] = []
            relay.on("swept", swept.append)
            relay.on("recovered", lambda: recovered.append(True))
            inbox = Inbox()
            await relay.subscribe("t", inbox)
            await eventually(lambda: [ghost] in swept, timeout=30, what="the expired node to be swept")
            # our own registration vanishes (as after a sweep by a peer): the heartbeat recovers it
            recoveries = len(recovered)  # a late heartbeat on a busy machine may have recovered already
            assert await raw.unregister_node(relay.node_id) is True
            await eventually(lambda: len(recovered) > recoveries, timeout=30, what="the relay to recover")
            assert [s["pattern"] for s in await raw.get_subscriptions(relay.node_id, None, 0, -1)] == ["t"]
            await raw.publish("t", "1", ts=1, retain_ms=0, max_size=10)
            await eventually(lambda: inbox.data() == [1], timeout=30)
    finally:
        await raw.close()


async def test_a_supplied_pool_serves_queries_and_the_named_listen_session(make: Factory, postgres_url: str,
                                                                           pg_migrated: str) -> None:
    import psycopg_pool

    pool = psycopg_pool.AsyncConnectionPool(postgres_url, min_size=1, max_size=3, open=False,
                                            kwargs={"options": f'-c search_path="{pg_migrated}"'})
    await pool.open()
    try:
        ns, a = uid("ns"), uid("a")
        backend = await make(a, namespace=ns, connection=pool)
        peer = await make(uid("p"), namespace=ns)
        await backend.register_node(a, 30000, INFO, 100)
        await backend.subscribe(a, "e", "t")
        await backend.publish("r", "1", ts=1, retain_ms=60000, max_size=10)
        assert [r["topic"] for r in await peer.get_retained(0, -1)] == ["r"]  # committed, seen elsewhere
        reading = asyncio.ensure_future(backend.read_inbox(a, "", block_ms=20000, count=10))
        await eventually(lambda: backend.listening, timeout=15)
        await asyncio.sleep(0.3)
        assert len(await peer.get_node_connections(a)) == 1  # the borrowed session got Node's name
        started = time.monotonic()
        await peer.publish("t", "2", ts=2, retain_ms=0, max_size=10)
        assert [e.data for e in (await asyncio.wait_for(reading, 30)).entries] == ["2"]
        assert time.monotonic() - started < 10
        await backend.close()
        assert not pool.closed
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
    finally:
        await pool.close()


async def test_endpoint_arrays_read_from_a_lane_are_what_postgresql_means(postgres_url: str) -> None:
    """The lanes give ``text[]`` in PostgreSQL's text form; `_endpoints` must read back the very
    elements PostgreSQL (through psycopg's typed decoding) says the array holds."""
    import psycopg

    from bullmq_compat._backends.postgres.relay import _endpoints

    cases = [[], ["a"], ["a", "b"], ["b c", 'd"e', "f\\g", "{h}", "i,j", ""], ["NULLish", " lead", "trail "]]
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        for items in cases:
            cur = await conn.execute("SELECT %s::text[] AS typed, %s::text[]::text AS text", [items, items])
            typed, text = await cur.fetchone()  # type: ignore[misc]
            assert typed == items
            assert _endpoints(text) == items, (items, text)
            assert _endpoints(typed) == items
