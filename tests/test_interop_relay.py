"""Issue #30: our Relay and Node BullMQ 6.7's Relay in one namespace on Redis.

Node's relay runs in interop/relay.js (one process per test, driven over stdin). Proved: each
side receives the other's publications on exact, ``*`` and ``>`` patterns; publish reports the
same nodes/endpoints counts whichever side publishes; retained messages both ways (first, with
retained=True, then gone after delete_retained or their retain time); Node's getters read what
ours read; a SIGKILLed Python relay is swept by Node's (its 'swept' names it) and the reverse.

The getters are compared after renaming Node's camelCase keys (``registeredAt``, ``nodeId``...)
to ours (``registered_at``, ``node_id``): the same values under each language's naming. Node's
``lastHeartbeat`` is ``undefined`` where ours is None; both are present here.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import Relay, RelayMessage
from tests.helpers import wait_until
from tests.relay_helpers import RelayProc, no_retained

FAST = {"lease_duration": 1000, "block_timeout": 1000}
NODE_FAST = {"leaseDuration": 1000, "blockTimeout": 1000}


def snake(value: Any) -> Any:
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake(v) for v in value]
    return value


@pytest.fixture
async def ours(redis_url: str, queue_name: str) -> AsyncIterator[Relay]:
    relay = Relay(redis_url, namespace=queue_name, name="python", **FAST)
    await relay.wait_until_ready()
    try:
        yield relay
    finally:
        await relay.close()


async def test_cross_delivery_on_exact_star_and_tail(redis_url: str, queue_name: str, ours: Relay) -> None:
    got: dict[str, list[RelayMessage]] = {"a.b.c": [], "a.*.c": [], "a.>": []}
    for pattern, bucket in got.items():
        await ours.subscribe(pattern, bucket.append)
    async with RelayProc.node(redis_url, queue_name, **NODE_FAST) as node:
        for pattern in got:
            await node.call("subscribe", pattern=pattern)
        # the same subscriptions on both sides: both report 2 nodes, 6 / 4 / 2 endpoints
        from_node = [await node.call("publish", topic=t, data={"from": "node", "t": t})
                     for t in ("a.b.c", "a.x.c", "a.x.y.z")]
        from_us = [await ours.publish(t, {"from": "python", "t": t}) for t in ("a.b.c", "a.x.c", "a.x.y.z")]
        assert [(r["nodes"], r["endpoints"]) for r in from_node] == [(2, 6), (2, 4), (2, 2)]
        assert [(r["nodes"], r["endpoints"]) for r in from_us] == [(2, 6), (2, 4), (2, 2)]
        assert all(isinstance(r["mid"], str) for r in from_node + from_us)
        await wait_until(lambda: len(got["a.>"]) == 6, 15, "our deliveries")
        expected = {"a.b.c": ["a.b.c"], "a.*.c": ["a.b.c", "a.x.c"], "a.>": ["a.b.c", "a.x.c", "a.x.y.z"]}
        for pattern, topics in expected.items():
            await node.wait_messages(2 * len(topics), pattern)
            node_seen = node.messages(pattern)
            assert [(m["topic"], m["data"]["from"]) for m in node_seen] == \
                [(t, "node") for t in topics] + [(t, "python") for t in topics]
            assert [(m.topic, m.data["from"]) for m in got[pattern]] == \
                [(t, "node") for t in topics] + [(t, "python") for t in topics]
            assert [m.mid for m in got[pattern]] == [m["mid"] for m in node_seen]
            assert [m.ts for m in got[pattern]] == [m["ts"] for m in node_seen]
            assert all(m["retained"] is False for m in node_seen)


async def test_retained_both_ways(redis_url: str, queue_name: str, ours: Relay) -> None:
    async with RelayProc.node(redis_url, queue_name, **NODE_FAST) as node:
        # Node retains, we subscribe later
        kept = await node.call("publish", topic="cfg.node", data={"v": 1}, retain=60_000)
        got: list[RelayMessage] = []
        sub = await ours.subscribe("cfg.node", got.append)
        assert sub.retained is not None and got == [sub.retained]
        assert (sub.retained.data, sub.retained.mid, sub.retained.retained) == ({"v": 1}, kept["mid"], True)
        assert await ours.delete_retained("cfg.node") is True
        # we retain, Node subscribes later; Node deletes
        mine = await ours.publish("cfg.py", [1, "two"], retain=60_000)
        await node.call("subscribe", pattern="cfg.py")
        (first,) = await node.wait_messages(1, "cfg.py")
        assert first == {"topic": "cfg.py", "data": [1, "two"], "mid": mine["mid"], "ts": first["ts"], "retained": True}
        assert await node.call("deleteRetained", topic="cfg.py") is True
        assert await ours.get_retained() == []
        # expiry: retained for 1.5 s by Node, gone for a later subscriber of ours
        await node.call("publish", topic="cfg.short", data="s", retain=1500)
        assert [r["topic"] for r in await ours.get_retained()] == ["cfg.short"]
        await wait_until(lambda: no_retained(ours), 15, "Node's retained message to expire")
        late: list[RelayMessage] = []
        assert (await ours.subscribe("cfg.short", late.append)).retained is None
        # and ours, expired, for a later Node subscriber: only the live message after it
        await ours.publish("cfg.py2", "old", retain=1500)
        await wait_until(lambda: no_retained(ours), 15, "our retained message to expire")
        await node.call("subscribe", pattern="cfg.py2")
        live = await ours.publish("cfg.py2", "live")
        (only,) = await node.wait_messages(1, "cfg.py2")
        assert (only["data"], only["mid"], only["retained"]) == ("live", live["mid"], False)
        assert late == []


async def test_getters_read_the_same(redis_url: str, queue_name: str, ours: Relay) -> None:
    async with RelayProc.node(redis_url, queue_name, name="node", **NODE_FAST) as node:
        await ours.subscribe("g.*", lambda m: None)
        await node.call("subscribe", pattern="g.*")
        await node.call("subscribe", pattern="g.one")
        await ours.publish("g.one", {"k": 1}, retain=60_000)
        await node.call("publish", topic="g.two", data=[2], retain=120_000)
        theirs = await node.call("getters")
        mine = {"counts": await ours.get_counts(), "nodes": await ours.get_nodes(),
                "subscriptions": await ours.get_subscriptions(), "patterns": await ours.get_patterns(),
                "retained": await ours.get_retained()}
        assert mine["counts"] == {"nodes": 2, "subscriptions": 3, "patterns": 2, "retained": 2}
        theirs = snake(theirs)
        # heartbeats (which renew leases and record backlogs) may land between the two reads:
        # compare the nodes without those
        for side in (mine, theirs):
            for n in side["nodes"]:
                assert n["registered_at"] <= n["last_heartbeat"] < n["lease_until"]
                assert 0 <= n["backlog"] <= 1
                del n["lease_until"], n["last_heartbeat"], n["backlog"]
        assert mine == theirs
        assert [n["info"]["name"] for n in mine["nodes"]] == ["python", "node"]
        assert mine["nodes"][1]["info"]["version"] == "6.7.0"
        assert [r["topic"] for r in mine["retained"]] == ["g.one", "g.two"]


async def test_python_relay_killed_is_swept_by_node(redis_url: str, queue_name: str) -> None:
    async with RelayProc.python(redis_url, queue_name, node_id="py-victim", **FAST) as victim:
        await victim.call("subscribe", pattern="v.>")
        async with RelayProc.node(redis_url, queue_name, nodeId="node-sweeper", **NODE_FAST) as node:
            await victim.kill()
            killed = time.monotonic()
            event = await node.wait_event(lambda e: e.get("event") == "swept", 20, "Node's 'swept'")
            assert event["ids"] == ["py-victim"]
            assert time.monotonic() - killed > 0.5
            getters = await node.call("getters")
            assert [n["id"] for n in getters["nodes"]] == ["node-sweeper"]
            assert getters["subscriptions"] == []


async def test_node_relay_killed_is_swept_by_python(redis_url: str, queue_name: str, ours: Relay) -> None:
    swept: list[list[str]] = []
    ours.on("swept", swept.append)
    async with RelayProc.node(redis_url, queue_name, nodeId="node-victim", **NODE_FAST) as node:
        await node.call("subscribe", pattern="v.x")
        assert (await ours.publish("v.x", 1))["endpoints"] == 1
        await node.kill()
        killed = time.monotonic()
        await wait_until(lambda: swept, 20, "our 'swept'")
        assert swept[0] == ["node-victim"] and time.monotonic() - killed > 0.5
        assert [n["id"] for n in await ours.get_nodes()] == [ours.node_id]
        assert (await ours.publish("v.x", 2))["endpoints"] == 0
        await asyncio.sleep(0)
