"""The event emitter Queue, Worker and QueueEvents share: on, once, off, emit, listener arities."""
from __future__ import annotations

import asyncio
from typing import Any

from bullmq_compat._events import EventEmitter


def test_once_listeners_run_once_and_on_listeners_every_time() -> None:
    emitter = EventEmitter()
    seen: list[tuple[str, Any]] = []
    emitter.on("completed", lambda job: seen.append(("on", job)))
    emitter.once("completed", lambda job: seen.append(("once", job)))
    assert emitter.emit("completed", 1, "result", "active")
    assert emitter.emit("completed", 2, "result", "active")
    assert seen == [("on", 1), ("once", 1), ("on", 2)]
    assert emitter.listener_count("completed") == 1
    emitter.once("completed", lambda job, result: seen.append(("again", (job, result))))  # after the first emits
    emitter.emit("completed", 3, "r", "active")
    emitter.emit("completed", 4, "r", "active")
    assert seen[3:] == [("on", 3), ("again", (3, "r")), ("on", 4)]


def test_a_once_listener_of_another_event_is_kept_until_its_event() -> None:
    emitter = EventEmitter()
    seen: list[str] = []
    emitter.once("failed", lambda *_: seen.append("failed"))
    emitter.on("completed", lambda *_: seen.append("completed"))
    for _ in range(3):
        emitter.emit("completed", 1)
    assert emitter.listener_count("failed") == 1
    emitter.emit("failed", 1)
    emitter.emit("failed", 1)
    assert seen == ["completed"] * 3 + ["failed"]
    assert emitter.listener_count("failed") == 0 and not emitter.emit("failed", 1)


def test_off_removes_a_once_listener_before_it_ran() -> None:
    emitter = EventEmitter()
    seen: list[int] = []

    def listener(value: int) -> None:
        seen.append(value)
    emitter.once("progress", listener)
    emitter.off("progress", listener)
    assert not emitter.emit("progress", 1)
    emitter.on("progress", listener)
    emitter.emit("progress", 2)
    emitter.emit("progress", 3)
    assert seen == [2, 3]


async def test_an_async_once_listener_runs_as_a_task_once() -> None:
    emitter = EventEmitter()
    ran = asyncio.Event()
    calls: list[int] = []

    async def listener(value: int) -> None:
        calls.append(value)
        ran.set()
    emitter.once("waiting", listener)
    emitter.emit("waiting", 1)
    emitter.emit("waiting", 2)
    await asyncio.wait_for(ran.wait(), 10)
    await asyncio.sleep(0)
    assert calls == [1]
