"""Helpers shared by the flow tests: the Python twin of interop/flow.js's processor, running
workers until a condition holds, and driving interop/flow.js."""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator, Mapping

from bullmq_compat import Worker
from tests.node import INTEROP, NodeProcess
from tests.processors import behave as process

FLOW_JS = INTEROP / "flow.js"
FINISHED = ("completed", "failed")


@contextlib.asynccontextmanager
async def workers(redis_url: str, queues: Mapping[str, Any] | list[str]) -> AsyncIterator[list[Worker]]:
    """Python workers (concurrency 1) on ``queues`` (a list: all use `process`; or name -> processor)."""
    if not isinstance(queues, Mapping):
        queues = {name: process for name in queues}
    running = [Worker(name, fn, connection=redis_url, drain_delay=0.5) for name, fn in queues.items()]
    tasks = [asyncio.ensure_future(w.run(handle_signals=False)) for w in running]
    try:
        yield running
    finally:
        for worker in running:
            await worker.close()
        await asyncio.gather(*tasks, return_exceptions=True)


async def flow_js(op: str, **args: Any) -> Any:
    """Run ``node interop/flow.js <op> <json(args)>`` and return its JSON result."""
    async with NodeProcess(FLOW_JS, op, json.dumps(args), wait_for_line=False,
                           result_timeout=float(args.get("timeoutMs", 20000)) / 1000 + 30) as proc:
        return await proc.result()


def flow_work(**args: Any) -> NodeProcess:
    """A Node worker of flow.js in the background; entering the block waits until it consumes."""
    return NodeProcess(FLOW_JS, "work", json.dumps({**args, "ready": True}),
                       result_timeout=float(args.get("timeoutMs", 20000)) / 1000 + 30)


def policy_flow(parent_queue: str, child_queue: str, policy: str | None) -> dict[str, Any]:
    """A parent whose children are one that succeeds, then one that fails under ``policy`` (a Node
    option name, or None for no policy)."""
    return {
        "name": "parent", "queueName": parent_queue, "data": {"behave": {"children": True}},
        "opts": {"jobId": "parent"},
        "children": [
            {"name": "ok", "queueName": child_queue, "data": {"behave": {"return": {"v": 1}}},
             "opts": {"jobId": "ok"}},
            {"name": "bad", "queueName": child_queue, "data": {"behave": {"fail": "boom"}},
             "opts": {"jobId": "bad", **({policy: True} if policy else {})}},
        ],
    }
