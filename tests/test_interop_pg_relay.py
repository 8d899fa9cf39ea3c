"""The relay on PostgreSQL against Node BullMQ's: a Python `Relay` and Node's ``Relay`` on
``createPostgresRelayBackend`` (interop/pg_relay.js) in one namespace of one schema.

Each side gets the other's publications on exact topics and ``*`` / ``>`` patterns, publish counts
the same nodes and endpoints on both sides, retained messages go both ways (and expire / are
deleted), the getters agree (each finds the other's inbox session by Node's application_name), a
SIGKILLed node of either side is swept by the other, and both resume after a PostgreSQL restart.
Namespaces and node ids are unique per test (NOTIFY payloads and application_name cross schemas).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from typing import Any, AsyncIterator, Optional

import pytest

from bullmq_compat import Relay, migrate_postgres
from tests._postgres_server import PostgresServer
from tests.helpers import eventually
from tests.node import INTEROP, ROOT, _node_binary

PG_RELAY_JS = INTEROP / "pg_relay.js"


def uid(tag: str) -> str:
    return f"{tag}{uuid.uuid4().hex[:12]}"


class NodeRelayError(RuntimeError):
    def __init__(self, message: str, code: Any) -> None:
        super().__init__(message)
        self.code = code


class NodeRelay:
    """interop/pg_relay.js for the length of an ``async with``: `call` sends one command and returns
    its answer; `events` holds what the relay printed by itself (messages, swept, recovered, error)."""

    def __init__(self, **args: Any) -> None:
        self.args = args
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.events: list[dict[str, Any]] = []
        self.node_id = ""
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._ready: Optional[asyncio.Future[Any]] = None
        self._reader: Optional[asyncio.Task[None]] = None
        self._stderr = bytearray()
        self._stderr_task: Optional[asyncio.Task[None]] = None

    async def __aenter__(self) -> "NodeRelay":
        self.proc = await asyncio.create_subprocess_exec(
            _node_binary(), str(PG_RELAY_JS), json.dumps(self.args), cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read())
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        try:
            first = await asyncio.wait_for(asyncio.shield(self._ready), 60)
        except BaseException:
            await self.kill()
            raise
        self.node_id = first["nodeId"]
        return self

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._stderr += chunk

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None and self._ready is not None
        while line := await self.proc.stdout.readline():
            value = json.loads(line)
            if "ready" in value and not self._ready.done():
                self._ready.set_result(value)
            elif "error" in value and "id" not in value and not self._ready.done():
                self._ready.set_exception(NodeRelayError(value["error"], None))
            elif "id" in value:
                future = self._pending.pop(value["id"], None)
                if future is not None and not future.done():
                    if "error" in value:
                        future.set_exception(NodeRelayError(value["error"], value.get("code")))
                    else:
                        future.set_result(value["result"])
            else:
                self.events.append(value)
        ended = NodeRelayError(f"pg_relay.js ended: {self._stderr.decode(errors='replace')[-2000:]}", None)
        if not self._ready.done():
            self._ready.set_exception(ended)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ended)

    async def call(self, op: str, timeout: float = 30, **args: Any) -> Any:
        assert self.proc is not None and self.proc.stdin is not None
        self._next += 1
        future = asyncio.get_running_loop().create_future()
        self._pending[self._next] = future
        self.proc.stdin.write((json.dumps({"id": self._next, "op": op, **args}) + "\n").encode())
        await self.proc.stdin.drain()
        return await asyncio.wait_for(future, timeout)

    def messages(self, pattern: str) -> list[dict[str, Any]]:
        return [e["message"] for e in self.events if e.get("event") == "message" and e["pattern"] == pattern]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def __aexit__(self, *exc: Any) -> None:
        assert self.proc is not None
        try:
            if self.proc.returncode is None:
                with contextlib.suppress(Exception):
                    await self.call("close", timeout=20)
                try:
                    await asyncio.wait_for(self.proc.wait(), 20)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.kill()
            for task in (self._reader, self._stderr_task):
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(task, 5)


def node_relay(url: str, schema: str, namespace: str, **opts: Any) -> NodeRelay:
    return NodeRelay(postgres=url, schema=schema, namespace=namespace, nodeId=opts.pop("nodeId", uid("n")), **opts)


class Inbox:
    def __init__(self) -> None:
        self.got: list[Any] = []

    def __call__(self, message: Any) -> None:
        self.got.append(message)


def counts(result: dict[str, Any]) -> tuple[int, int]:
    return int(result["nodes"]), int(result["endpoints"])


async def test_messages_retained_and_getters_cross_both_ways(postgres_url: str, pg_migrated: str) -> None:
    ns = uid("ns")
    async with node_relay(postgres_url, pg_migrated, ns, name="node-side") as node, \
            Relay(connection=postgres_url, schema=pg_migrated, namespace=ns, node_id=uid("p"), name="py-side") as py:
        patterns = ["orders.eu.created", "orders.*.created", "orders.>"]
        inboxes = {p: Inbox() for p in patterns}
        for pattern in patterns:
            await py.subscribe(pattern, inboxes[pattern])
            await node.call("subscribe", pattern=pattern)

        # publish counts: the same topic from either side reaches the same nodes and endpoints
        py_sent = await py.publish("orders.eu.created", {"from": "py"})
        node_sent = await node.call("publish", topic="orders.eu.created", data={"from": "node"})
        assert counts(py_sent) == counts(node_sent) == (2, 6)
        py_us = await py.publish("orders.us.created", {"from": "py", "n": 2})
        node_us = await node.call("publish", topic="orders.us.created", data={"from": "node", "n": 2})
        assert counts(py_us) == counts(node_us) == (2, 4)
        py_deep = await py.publish("orders.eu.created.late", None)
        node_deep = await node.call("publish", topic="orders.eu.created.late", data=None)
        assert counts(py_deep) == counts(node_deep) == (2, 2)
        assert counts(await node.call("publish", topic="orders", data=1)) == counts(await py.publish("orders", 1)) == (0, 0)
        assert int(node_sent["mid"]) > int(py_sent["mid"])  # one sequence for both

        want = {"orders.eu.created": 2, "orders.*.created": 4, "orders.>": 6}
        await eventually(lambda: all(len(inboxes[p].got) == n for p, n in want.items()), timeout=30,
                         what="Python's listeners to get every message")
        await eventually(lambda: all(len(node.messages(p)) == n for p, n in want.items()), timeout=30,
                         what="Node's listeners to get every message")
        for pattern in patterns:  # same order, ids, topics and data on both sides
            ours = [(m.topic, m.mid, m.data, m.retained) for m in inboxes[pattern].got]
            theirs = [(m["topic"], m["mid"], m["data"], m["retained"]) for m in node.messages(pattern)]
            assert ours == theirs, pattern
        assert [m.data for m in inboxes["orders.eu.created"].got] == [{"from": "py"}, {"from": "node"}]
        assert inboxes["orders.>"].got[-1].data is None
        assert inboxes["orders.eu.created"].got[1].mid == node_sent["mid"]

        # retained, both ways
        kept = await py.publish("cfg.py", {"v": 1}, retain=60000)
        await node.call("subscribe", pattern="cfg.py")
        [retained] = node.messages("cfg.py")
        assert retained == {"topic": "cfg.py", "mid": kept["mid"], "ts": retained["ts"], "data": {"v": 1},
                            "retained": True}
        assert abs(retained["ts"] - time.time() * 1000) < 60000
        kept = await node.call("publish", topic="cfg.node", data=[1, "x"], retain=60000)
        late = Inbox()
        sub = await py.subscribe("cfg.node", late)
        assert sub.retained is not None and (sub.retained.mid, sub.retained.data) == (kept["mid"], [1, "x"])
        assert [m.retained for m in late.got] == [True]
        node_retained = await node.call("getRetained")
        assert [(r["topic"], r["data"]) for r in node_retained] == [("cfg.py", '{"v":1}'), ("cfg.node", '[1,"x"]')]
        assert [(r["topic"], r["expires_at"]) for r in await py.get_retained()] == [
            (r["topic"], r["expiresAt"]) for r in node_retained]
        assert await node.call("deleteRetained", topic="cfg.py") is True
        assert await py.delete_retained("cfg.py") is False
        assert await py.delete_retained("cfg.node") is True
        assert await node.call("deleteRetained", topic="cfg.node") is False
        fresh = Inbox()
        assert (await py.subscribe("cfg.node", fresh)).retained is None
        # a short retain: gone for both once it expired
        await node.call("publish", topic="cfg.short", data=1, retain=800)
        await py.publish("cfg.shortpy", 1, retain=800)

        async def expired() -> bool:
            return not await py.get_retained() and not await node.call("getRetained")
        await eventually(expired, timeout=30, what="the short retains to expire")
        assert (await py.subscribe("cfg.short", Inbox())).retained is None
        await node.call("subscribe", pattern="cfg.shortpy")
        await asyncio.sleep(0.5)
        assert node.messages("cfg.shortpy") == []

        # getters agree; each finds the other's inbox session (Node's application_name)
        node_nodes = await node.call("getNodes")
        py_nodes = await py.get_nodes()
        assert [n["id"] for n in py_nodes] == [n["id"] for n in node_nodes] == [node.node_id, py.node_id]
        assert node_nodes[1]["info"]["name"] == "py-side" and node_nodes[1]["info"]["pid"] == os.getpid()
        assert py_nodes[0]["info"]["name"] == "node-side"
        assert [n["subscriptions"] for n in py_nodes] == [n["subscriptions"] for n in node_nodes]
        assert await py.get_counts() == await node.call("getCounts")
        assert await py.get_subscriptions(node_id=node.node_id) == [
            {"node_id": s["nodeId"], "endpoint_id": s["endpointId"], "pattern": s["pattern"]}
            for s in await node.call("getSubscriptions", filter={"nodeId": node.node_id})]
        assert ns in await node.call("getNamespaces") and ns in await py.get_namespaces()
        [theirs] = await eventually(lambda: py.get_node_connections(node.node_id), timeout=30)
        [ours] = await eventually(lambda: node.call("getNodeConnections", nodeId=py.node_id), timeout=30)
        assert set(theirs) == {"address", "age", "idle"} and set(ours) == {"address", "age", "idle"}
        assert await node.call("getNodeConnections", nodeId=uid("nobody")) == []

        # refusals have Node's codes on both sides
        with pytest.raises(NodeRelayError) as node_refused:
            await node.call("publish", topic="bad topic", data=1)
        from bullmq_compat import RelayError
        with pytest.raises(RelayError) as py_refused:
            await py.publish("bad topic", 1)
        assert (node_refused.value.code, str(node_refused.value)) == (py_refused.value.code, str(py_refused.value))
        # Python's close unregisters it: Node then lists itself only, and its publish reaches no one else
        await py.close()
        assert [n["id"] for n in await node.call("getNodes")] == [node.node_id]
        assert counts(await node.call("publish", topic="orders.eu.created", data=3)) == (1, 3)


PY_RELAY = """
import asyncio, json, sys
from bullmq_compat import Relay

async def main():
    args = json.loads(sys.argv[1])
    relay = Relay(connection=args["url"], schema=args["schema"], namespace=args["ns"], node_id=args["id"],
                  lease_duration=1000)
    await relay.wait_until_ready()
    await relay.subscribe("x", lambda m: None)
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def python_relay_process(url: str, schema: str, ns: str, node_id: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PY_RELAY, json.dumps({"url": url, "schema": schema, "ns": ns, "id": node_id}),
        cwd=str(ROOT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line:
            assert proc.stderr is not None
            raise AssertionError(f"the Python relay ended: {(await proc.stderr.read()).decode()[-2000:]}")
        assert json.loads(line) == {"ready": True}
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_a_killed_python_node_is_swept_by_node(postgres_url: str, pg_migrated: str) -> None:
    ns, victim = uid("ns"), uid("p")
    async with python_relay_process(postgres_url, pg_migrated, ns, victim) as proc, \
            node_relay(postgres_url, pg_migrated, ns, leaseDuration=1000, sweepInterval=300) as node:
        assert victim in [n["id"] for n in await node.call("getNodes")]
        assert counts(await node.call("publish", topic="x", data=1)) == (1, 1)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await eventually(lambda: node.of("swept"), timeout=30, what="Node to sweep the killed node")
        assert [e["ids"] for e in node.of("swept")] == [[victim]]
        assert [n["id"] for n in await node.call("getNodes")] == [node.node_id]
        assert counts(await node.call("publish", topic="x", data=2)) == (0, 0)


async def test_a_killed_node_node_is_swept_by_python(postgres_url: str, pg_migrated: str) -> None:
    ns = uid("ns")
    async with Relay(connection=postgres_url, schema=pg_migrated, namespace=ns, node_id=uid("p"),
                     lease_duration=1000, sweep_interval=300) as py:
        swept: list[list[str]] = []
        py.on("swept", swept.append)
        async with node_relay(postgres_url, pg_migrated, ns, leaseDuration=1000) as node:
            await node.call("subscribe", pattern="x")
            assert counts(await py.publish("x", 1)) == (1, 1)
            victim = node.node_id
            await node.kill()
        await eventually(lambda: swept, timeout=30, what="Python to sweep the killed Node node")
        assert swept == [[victim]]
        assert [n["id"] for n in await py.get_nodes()] == [py.node_id]
        assert counts(await py.publish("x", 2)) == (0, 0)


@pytest.mark.xdist_group("pg_relay_restart")
async def test_both_sides_resume_after_a_postgres_restart() -> None:
    server = PostgresServer().start()
    try:
        url, schema, ns = server.url, "relay_restart", uid("ns")
        await migrate_postgres(url, schema)
        async with node_relay(url, schema, ns, leaseDuration=2000, blockTimeout=1000) as node, \
                Relay(connection=url, schema=schema, namespace=ns, node_id=uid("p"), lease_duration=2000,
                      block_timeout=1000) as py:
            errors: list[Any] = []
            py.on("error", errors.append)
            inbox = Inbox()
            await py.subscribe("loop.node", inbox)
            await node.call("subscribe", pattern="loop.py")
            await node.call("publishLoop", topic="loop.node", intervalMs=100)
            sent = {"n": 0, "failed": 0}

            async def publish_loop() -> None:
                while True:
                    sent["n"] += 1
                    try:
                        await py.publish("loop.py", {"n": sent["n"]})
                    except Exception:
                        sent["failed"] += 1
                    await asyncio.sleep(0.1)

            loop = asyncio.ensure_future(publish_loop())
            try:
                await eventually(lambda: len(inbox.got) >= 3 and len(node.messages("loop.py")) >= 3, timeout=30,
                                 what="both loops to deliver before the restart")
                await asyncio.to_thread(server.halt, "fast")
                halted_at = sent["n"]
                before_py = max(m.data["n"] for m in inbox.got)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(server.boot)
                # both subscribers get messages published after the restart, in the same processes
                try:
                    await eventually(lambda: any(m.data["n"] > before_py + 5 for m in inbox.got), timeout=60,
                                     what="Python to get Node's messages after the restart")
                    await eventually(lambda: any(m["data"]["n"] > halted_at + 5 for m in node.messages("loop.py")),
                                     timeout=60, what="Node to get Python's messages after the restart")
                except AssertionError as err:  # say which side stalled
                    raise AssertionError(
                        f"{err}; Python errors: {[repr(e) for e in errors][-5:]}; LISTEN sessions opened: "
                        f"{py.backend.listen_sessions_opened}; nodes: {await py.get_nodes()}; "  # type: ignore[attr-defined]
                        f"Node's events: {[e for e in node.events if e.get('event') != 'message'][-5:]}; "
                        f"last messages: {[m.data for m in inbox.got[-3:]]} / {node.messages('loop.py')[-3:]}"
                    ) from None
            finally:
                loop.cancel()
                with contextlib.suppress(BaseException):
                    await loop
            # the server really ended our LISTEN session, and a new one was opened in this process
            assert py.backend.listen_sessions_opened >= 2  # type: ignore[attr-defined]
            result = await node.call("stopLoop")
            assert result["sent"] > 0
    finally:
        await asyncio.to_thread(server.stop)

