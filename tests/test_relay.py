"""Issue #30: the Relay (BullMQ 6.7's fleet pub/sub) on Redis, Python side only.

Routing, retained messages, listener errors, lag and the inbox cap, the message size limit,
close, the getters, and liveness: a paused (SIGSTOPped) relay whose lease expired re-registers
and restores its subscriptions, a SIGKILLed one is swept, and a Redis restarted under a publishing
loop loses only what was in Redis when it went down. Interop with Node's Relay is in
tests/test_interop_relay.py.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from typing import Any, AsyncIterator

import pytest
import redis.asyncio as aioredis

from bullmq_compat import Relay, RelayError, RelayMessage
from bullmq_compat._errors import InvalidArgument, QueueClosed
from bullmq_compat._version import __version__
from tests._redis_server import RedisServer
from tests.helpers import wait_until
from tests.relay_helpers import RelayProc, SlowListener, no_retained

FAST = {"lease_duration": 1000, "block_timeout": 1000}


@pytest.fixture
async def relays(redis_url: str, queue_name: str) -> AsyncIterator[Any]:
    """``make(**options)``: relays in namespace ``queue_name``, all closed at the end."""
    made: list[Relay] = []

    async def make(**options: Any) -> Relay:
        relay = Relay(redis_url, namespace=queue_name, **{**FAST, **options})
        made.append(relay)
        await relay.wait_until_ready()
        return relay

    yield make
    for relay in made:
        await relay.close()


def recorder() -> tuple[list[RelayMessage], Any]:
    got: list[RelayMessage] = []
    return got, got.append


@pytest.mark.parametrize("options, text", [
    ({"namespace": "a.b"}, "namespace: 'a.b'"),
    ({"namespace": ""}, "namespace: ''"),
    ({"node_id": "x" * 65}, "node_id: 'xxx"),
    ({"name": "n" * 257}, "name: 'nnn"),
    ({"lease_duration": 0}, "lease_duration: 0"),
    ({"block_timeout": 2147483648}, "block_timeout: 2147483648"),
    ({"inbox_max_length": 1.5}, "inbox_max_length: 1.5"),
    ({"heartbeat_interval": True}, "heartbeat_interval: True"),
    ({"inbox_max_length": 10, "lag_threshold": 11}, "lag_threshold must not exceed inbox_max_length (11 > 10)"),
])
def test_option_checks_name_the_value_and_the_rule(redis_url: str, options: dict[str, Any], text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        Relay(redis_url, **options)
    assert text in str(info.value)


async def test_publish_reaches_exact_star_and_tail_patterns(relays: Any) -> None:
    a, b = await relays(), await relays()
    (exact, on_exact), (star, on_star), (tail, on_tail) = recorder(), recorder(), recorder()
    await a.subscribe("fleet.eu.status", on_exact)
    await a.subscribe("fleet.*.status", on_star)
    await b.subscribe("fleet.>", on_tail)
    first = await b.publish("fleet.eu.status", {"up": True})
    assert (first["nodes"], first["endpoints"]) == (2, 3)
    second = await b.publish("fleet.us.status", [1, 2])
    assert (second["nodes"], second["endpoints"]) == (2, 2)
    third = await b.publish("fleet.us.disk.free", None)
    assert (third["nodes"], third["endpoints"]) == (1, 1)
    none = await a.publish("other.topic", "x")
    assert (none["nodes"], none["endpoints"]) == (0, 0)
    assert int(first["mid"]) < int(second["mid"]) < int(third["mid"])
    await wait_until(lambda: len(tail) == 3 and len(star) == 2 and len(exact) == 1, 15, "deliveries")
    assert [(m.topic, m.data, m.mid, m.retained) for m in exact] == [
        ("fleet.eu.status", {"up": True}, first["mid"], False)]
    assert [(m.topic, m.data) for m in star] == [("fleet.eu.status", {"up": True}), ("fleet.us.status", [1, 2])]
    assert [(m.topic, m.data) for m in tail] == [
        ("fleet.eu.status", {"up": True}), ("fleet.us.status", [1, 2]), ("fleet.us.disk.free", None)]
    assert abs(exact[0].ts - time.time() * 1000) < 60_000
    with pytest.raises(RelayError) as info:
        await a.publish("fleet.*", 1)  # a pattern is not a topic
    assert info.value.code == -1 and str(info.value) == "Invalid topic: fleet.*"
    with pytest.raises(RelayError) as info:
        await a.subscribe("fleet.>.x", on_exact)
    assert info.value.code == -2
    with pytest.raises(InvalidArgument, match="retain: -1"):
        await a.publish("fleet.x", 1, retain=-1)


async def test_retained_first_then_live_then_expiry_and_delete(relays: Any) -> None:
    a, b = await relays(), await relays()
    kept = await a.publish("cfg.flags", {"v": 1}, retain=2000)
    got, on = recorder()
    sub = await b.subscribe("cfg.flags", on)
    assert sub.retained == RelayMessage("cfg.flags", {"v": 1}, kept["mid"], sub.retained.ts, True)
    assert got == [sub.retained]  # delivered before subscribe returned
    live = await a.publish("cfg.flags", {"v": 2})
    await wait_until(lambda: len(got) == 2, 15, "the live message")
    assert (got[1].data, got[1].mid, got[1].retained) == ({"v": 2}, live["mid"], False)
    # a pattern subscription gets no retained message
    pattern_got, on_pattern = recorder()
    assert (await b.subscribe("cfg.*", on_pattern)).retained is None
    # gone after its retain time
    await wait_until(lambda: no_retained(a), 15, "the retained message to expire")
    later, on_later = recorder()
    assert (await b.subscribe("cfg.flags", on_later)).retained is None
    # and after delete_retained
    await a.publish("cfg.other", "x", retain=60_000)
    assert [r["topic"] for r in await a.get_retained()] == ["cfg.other"]
    assert await a.delete_retained("cfg.other") is True
    assert await a.delete_retained("cfg.other") is False
    assert (await b.subscribe("cfg.other", on_later)).retained is None
    assert later == []
    await wait_until(lambda: pattern_got, 15, "cfg.other on cfg.*")
    assert [(m.topic, m.retained) for m in pattern_got] == [("cfg.other", False)]


async def test_listener_error_goes_to_error_event_and_delivery_continues(relays: Any) -> None:
    a = await relays()
    errors: list[BaseException] = []
    a.on("error", errors.append)
    got: list[Any] = []

    def listener(message: RelayMessage) -> None:
        if message.data == "boom":
            raise ValueError("listener failed on purpose")
        got.append(message.data)

    async def async_listener(message: RelayMessage) -> None:
        if message.data == "boom":
            raise KeyError("async listener failed on purpose")
        got.append(("async", message.data))

    await a.subscribe("t.x", listener)
    await a.subscribe("t.x", async_listener)
    for data in ("before", "boom", "after"):
        await a.publish("t.x", data)
    await wait_until(lambda: len(got) == 4, 15, "the messages around the failing one")
    assert sorted(map(str, got)) == sorted(map(str, ["before", ("async", "before"), "after", ("async", "after")]))
    assert sorted(type(e).__name__ for e in errors) == ["KeyError", "ValueError"]


async def test_unsubscribe_stops_delivery_and_removes_the_subscription(relays: Any) -> None:
    a, b = await relays(), await relays()
    got, on = recorder()
    sub = await a.subscribe("u.*", on)
    assert sub.pattern == "u.*" and sub.added is True
    await b.publish("u.one", 1)
    await wait_until(lambda: len(got) == 1, 15, "the first message")
    await sub.unsubscribe()
    assert await a.get_subscriptions(node_id=a.node_id) == []
    assert (await b.publish("u.two", 2))["endpoints"] == 0
    await b.publish("u.sync", 3)  # nothing routed: nothing more delivered
    await asyncio.sleep(0.3)
    assert [m.data for m in got] == [1]


async def test_slow_listener_lags_and_the_inbox_keeps_at_most_its_cap(relays: Any, redis_url: str) -> None:
    a = await relays(inbox_max_length=20, lag_threshold=5)
    b = await relays()
    lags: list[int] = []
    a.on("lag", lags.append)
    slow = SlowListener()
    entered, release, got = slow.entered, slow.release, slow.got

    await a.subscribe("load.x", slow)
    await b.publish("load.x", 0)
    await asyncio.wait_for(entered.wait(), 15)
    for i in range(1, 61):
        assert (await b.publish("load.x", i))["endpoints"] == 1
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        inbox = f"bull::relay:{{{a.namespace}}}:{a.node_id}:inbox"
        assert await client.xlen(inbox) <= 20  # the 40 oldest unread were dropped at publish time
    finally:
        await client.aclose()
    release.set()
    await wait_until(lambda: lags, 15, "'lag'")
    assert 5 <= lags[0] <= 20
    await wait_until(lambda: got and got[-1] == 60, 15, "the newest message")
    assert got[0] == 0 and got == sorted(got) and len(got) <= 21  # 0, then at most the 20 newest
    assert got[1] >= 40
    node = next(n for n in await b.get_nodes() if n["id"] == a.node_id)
    assert node["dropped"] >= 40


async def test_message_over_max_size_is_refused_and_never_delivered(relays: Any) -> None:
    a, b = await relays(), await relays(max_message_size=100)
    got, on = recorder()
    await a.subscribe("big.x", on)
    with pytest.raises(RelayError) as info:
        await b.publish("big.x", "y" * 99, retain=60_000)  # 101 bytes of JSON
    assert info.value.code == -4 and "Message data is too large: big.x" == str(info.value)
    ok = await b.publish("big.x", "y" * 98)  # 100 bytes: the limit is inclusive
    assert ok["endpoints"] == 1
    await wait_until(lambda: got, 15, "the small message")
    await asyncio.sleep(0.2)
    assert [m.mid for m in got] == [ok["mid"]]
    assert await b.get_retained() == []


async def test_close_unregisters_and_is_idempotent(relays: Any) -> None:
    a, b = await relays(name="closing"), await relays()
    await a.subscribe("c.x", lambda m: None)
    assert {n["id"] for n in await b.get_nodes()} == {a.node_id, b.node_id}
    await a.close()
    await a.close()
    assert [n["id"] for n in await b.get_nodes()] == [b.node_id]
    assert await b.get_subscriptions() == []
    assert (await b.publish("c.x", 1))["nodes"] == 0
    with pytest.raises(QueueClosed):
        await a.publish("c.x", 1)
    with pytest.raises(QueueClosed):
        await a.subscribe("c.x", lambda m: None)


async def test_getters_shapes(relays: Any, queue_name: str) -> None:
    a = await relays(name="getters", node_id="py-getters-" + queue_name[2:])
    b = await relays()
    await a.subscribe("g.*", lambda m: None)
    await a.subscribe("g.one", lambda m: None)
    await b.subscribe("g.*", lambda m: None)
    await b.publish("g.one", {"k": 1}, retain=60_000)
    assert await a.get_counts() == {"nodes": 2, "subscriptions": 3, "patterns": 2, "retained": 1}
    nodes = await a.get_nodes()
    assert [n["id"] for n in nodes] == [a.node_id, b.node_id]  # registration order
    first = nodes[0]
    assert set(first) == {"id", "info", "registered_at", "lease_until", "last_heartbeat", "backlog", "dropped",
                          "subscriptions"}
    assert first["info"] == {"name": "getters", "host": socket.gethostname(), "pid": os.getpid(),
                             "version": __version__}
    assert first["subscriptions"] == 2 and first["dropped"] == 0
    assert first["registered_at"] <= first["last_heartbeat"] < first["lease_until"]
    assert first["lease_until"] - first["last_heartbeat"] == 1000
    assert [n["id"] for n in await a.get_nodes(1, 1)] == [b.node_id]
    subs = await a.get_subscriptions(node_id=a.node_id)
    assert sorted(s["pattern"] for s in subs) == ["g.*", "g.one"] and {s["node_id"] for s in subs} == {a.node_id}
    by_pattern = await a.get_subscriptions(pattern="g.*")
    assert sorted(s["node_id"] for s in by_pattern) == sorted([a.node_id, b.node_id])
    assert await a.get_patterns() == [{"pattern": "g.*", "subscriptions": 2}, {"pattern": "g.one", "subscriptions": 1}]
    (retained,) = await a.get_retained()
    assert retained["topic"] == "g.one" and retained["data"] == '{"k":1}'
    assert set(retained) == {"topic", "expires_at", "mid", "ts", "data"}
    assert queue_name in await a.get_namespaces()
    (conn,) = await a.get_node_connections()
    assert set(conn) == {"address", "age", "idle"} and conn["address"].startswith("127.0.0.1:")
    assert await a.get_node_connections("no-such-node") == []
    for bad in ((-1, -1), (0, -2), (0.5, 1)):
        with pytest.raises(InvalidArgument, match="Invalid relay range"):
            await a.get_nodes(*bad)
    with pytest.raises(InvalidArgument, match="node_id"):
        await a.get_node_connections("bad id")


async def test_paused_relay_whose_lease_expired_recovers_its_subscriptions(redis_url: str, queue_name: str,
                                                                          relays: Any) -> None:
    watcher = await relays()  # sweeps every lease (1 s)
    swept: list[list[str]] = []
    watcher.on("swept", swept.append)
    async with RelayProc.python(redis_url, queue_name, node_id="paused", **FAST) as proc:
        await proc.call("subscribe", pattern="p.>")
        assert (await watcher.publish("p.before", 1))["endpoints"] == 1
        await proc.wait_messages(1)
        proc.signal(signal.SIGSTOP)
        try:
            await wait_until(lambda: any("paused" in ids for ids in swept), 20, "the paused node to be swept")
            assert (await watcher.publish("p.during", 2))["endpoints"] == 0
        finally:
            proc.signal(signal.SIGCONT)
        await proc.wait_event(lambda e: e.get("event") == "recovered", 20, "'recovered'")
        # its subscription is back: routed and delivered
        await wait_until(lambda: _routed(watcher, "p.after"), 20, "the subscription to be restored")
        messages = await proc.wait_messages(2)
        assert [m["data"] for m in messages[:2]] == [1, 3]
        assert [m["topic"] for m in messages] == ["p.before"] + ["p.after"] * (len(messages) - 1)


async def _routed(relay: Relay, topic: str) -> bool:
    return (await relay.publish(topic, 3))["endpoints"] == 1


async def test_sigkilled_relay_is_swept(redis_url: str, queue_name: str, relays: Any) -> None:
    async with RelayProc.python(redis_url, queue_name, node_id="doomed", **FAST) as proc:
        await proc.call("subscribe", pattern="k.x")
        watcher = await relays()
        swept: list[list[str]] = []
        watcher.on("swept", swept.append)
        assert "doomed" in {n["id"] for n in await watcher.get_nodes()}
        await proc.kill()
        killed_at = time.monotonic()
        await wait_until(lambda: swept, 20, "'swept'")
        assert swept[0] == ["doomed"]
        assert time.monotonic() - killed_at > 0.5  # not before its lease ran out
        assert [n["id"] for n in await watcher.get_nodes()] == [watcher.node_id]
        assert await watcher.get_subscriptions() == []


async def test_redis_restarted_under_a_publishing_loop(queue_name: str) -> None:
    server = RedisServer().start()
    try:
        url = server.url
        sub = Relay(url, namespace=queue_name, **FAST)
        pub = Relay(url, namespace=queue_name, **FAST)
        recovered: list[float] = []
        sub.on("recovered", lambda: recovered.append(time.monotonic()))
        sub.on("error", lambda err: None)
        pub.on("error", lambda err: None)
        await sub.wait_until_ready()
        await pub.wait_until_ready()
        got: list[int] = []
        await sub.subscribe("seq.x", lambda m: got.append(m.data))
        routed: list[tuple[int, float]] = []  # (seq, when its publish was acknowledged)
        failures = 0
        stop = asyncio.Event()

        async def publish_loop() -> None:
            nonlocal failures
            seq = 0
            while not stop.is_set():
                seq += 1
                try:
                    if (await pub.publish("seq.x", seq))["endpoints"] == 1:
                        routed.append((seq, time.monotonic()))
                except Exception:
                    failures += 1
                await asyncio.sleep(0.03)

        loop_task = asyncio.ensure_future(publish_loop())
        await wait_until(lambda: len(got) >= 5, 15, "messages before the restart")
        server.proc.terminate()  # type: ignore[union-attr]
        server.proc.wait(10)  # type: ignore[union-attr]
        await asyncio.sleep(1.5)
        restarted_at = time.monotonic()
        RedisServer.start(server)  # same port, empty (no persistence)
        await wait_until(lambda: recovered, 30, "the subscriber to recover")
        count = len(routed)
        await wait_until(lambda: len(routed) >= count + 10, 30, "publishes routed after the restart")
        stop.set()
        await loop_task
        last = routed[-1][0]
        await wait_until(lambda: last in got, 15, "the last routed message")
        assert failures > 0  # the loop did run into the outage
        after = [seq for seq, at in routed if at > restarted_at]
        assert set(after) <= set(got)  # nothing routed after the restart is lost
        assert got == sorted(set(got))  # no duplicates, in order
        await sub.close()
        await pub.close()
    finally:
        server.stop()


def test_sync_relay_calls_back_on_its_own_thread(redis_url: str, queue_name: str) -> None:
    import threading

    from bullmq_compat import sync

    got: list[tuple[Any, str]] = []
    done = threading.Event()

    def callback(message: RelayMessage) -> None:
        got.append((message.data, threading.current_thread().name))
        if message.data == 2:
            done.set()

    with sync.Relay(redis_url, namespace=queue_name, **FAST) as relay:
        sub = relay.subscribe("s.*", callback)
        assert sub.pattern == "s.*"
        assert relay.publish("s.a", 1)["endpoints"] == 1
        assert relay.publish("s.b", 2)["endpoints"] == 1
        assert done.wait(15)
        assert [d for d, _ in got] == [1, 2]
        assert all(name.startswith("bullmq-compat-relay") for _, name in got)
        assert relay.get_counts()["subscriptions"] == 1
        sub.unsubscribe()
        assert relay.get_subscriptions() == []
        node_id = relay.node_id
    with sync.Relay(redis_url, namespace=queue_name, **FAST) as other:
        assert node_id not in {n["id"] for n in other.get_nodes()}


async def test_cli_publish_subscribe_and_nodes(redis_url: str, queue_name: str) -> None:
    import json
    import sys

    base = [sys.executable, "-m", "bullmq_compat", "relay"]
    where = ["--redis", redis_url, "--namespace", queue_name]
    sub = await asyncio.create_subprocess_exec(*base, "subscribe", "cli.>", *where, stdout=asyncio.subprocess.PIPE,
                                               stderr=asyncio.subprocess.PIPE)
    try:
        async with Relay(redis_url, namespace=queue_name, **FAST) as relay:
            await wait_until(lambda: _subscribed(relay), 30, "the CLI subscriber")
            proc = await asyncio.create_subprocess_exec(*base, "publish", "cli.x", '{"a": 1}', "--retain", "60000",
                                                        *where, stdout=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            assert proc.returncode == 0
            result = json.loads(out)
            assert (result["nodes"], result["endpoints"]) == (1, 1)
            line = await asyncio.wait_for(sub.stdout.readline(), 15)  # type: ignore[union-attr]
            assert json.loads(line) == {"topic": "cli.x", "data": {"a": 1}, "mid": result["mid"],
                                        "ts": json.loads(line)["ts"], "retained": False}
            proc = await asyncio.create_subprocess_exec(*base, "nodes", "--json", *where,
                                                        stdout=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            assert proc.returncode == 0
            listed = json.loads(out)
            assert sorted(n["id"] for n in listed["nodes"]) == sorted(
                n["id"] for n in await relay.get_nodes() if n["info"].get("name") == "bullmq-compat cli"
                or n["id"] == relay.node_id)
            assert listed["counts"]["retained"] == 1
            proc = await asyncio.create_subprocess_exec(*base, "publish", "cli.x", "not json", *where,
                                                        stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            assert proc.returncode == 2 and b"not valid JSON" in err
    finally:
        sub.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(sub.wait(), 15) == 0


async def _subscribed(relay: Relay) -> bool:
    return any(s["pattern"] == "cli.>" for s in await relay.get_subscriptions())
