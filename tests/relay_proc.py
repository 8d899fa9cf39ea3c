"""A Python relay in a process of its own, with interop/relay.js's protocol (see there):

    python -m tests.relay_proc node <redis-url> <namespace> [options-json]

Options are `bullmq_compat.Relay`'s keyword arguments (``{"node_id": "p1", "lease_duration": 1000}``).
Used where a relay must be SIGKILLed or SIGSTOPped (tests/test_relay.py, tests/test_interop_relay.py).
"""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from typing import Any

from bullmq_compat import Relay


def out(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def message_json(message: Any) -> dict[str, Any]:
    return {"topic": message.topic, "data": message.data, "mid": message.mid, "ts": message.ts,
            "retained": message.retained}


async def main(url: str, namespace: str, options: dict[str, Any]) -> None:
    relay = Relay(url, namespace=namespace, **options)
    relay.on("error", lambda err: out({"event": "error", "message": str(err)}))
    relay.on("swept", lambda ids: out({"event": "swept", "ids": ids}))
    relay.on("recovered", lambda: out({"event": "recovered"}))
    relay.on("lag", lambda backlog: out({"event": "lag", "backlog": backlog}))
    await relay.wait_until_ready()
    out({"ready": True, "nodeId": relay.node_id})
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[Any] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line)
        loop.call_soon_threadsafe(commands.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()
    loop.add_signal_handler(signal.SIGTERM, lambda: commands.put_nowait(None))
    subscriptions: dict[str, Any] = {}

    async def handle(command: dict[str, Any]) -> Any:
        op = command["op"]
        if op == "subscribe":
            pattern = command["pattern"]
            sub = await relay.subscribe(pattern, lambda m: out({"event": "message", "sub": pattern,
                                                                 "message": message_json(m)}))
            subscriptions[pattern] = sub
            return {"pattern": sub.pattern}
        if op == "unsubscribe":
            await subscriptions.pop(command["pattern"]).unsubscribe()
            return True
        if op == "publish":
            return await relay.publish(command["topic"], command.get("data"), retain=command.get("retain", 0))
        if op == "deleteRetained":
            return await relay.delete_retained(command["topic"])
        if op == "getters":
            return {"counts": await relay.get_counts(), "nodes": await relay.get_nodes(),
                    "subscriptions": await relay.get_subscriptions(), "patterns": await relay.get_patterns(),
                    "retained": await relay.get_retained()}
        raise ValueError(f"unknown op {op}")

    while True:
        line = await commands.get()
        if line is None:
            break
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("op") == "close":
            break
        try:
            out({"id": command.get("id"), "result": await handle(command)})
        except Exception as err:
            out({"id": command.get("id"), "error": str(err), "code": getattr(err, "code", None)})
    await relay.close()


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "node":
        sys.exit("usage: python -m tests.relay_proc node <redis-url> <namespace> [options-json]")
    asyncio.run(main(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}))
