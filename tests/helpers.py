"""Small helpers shared by the tests."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


async def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition",
                     interval: float = 0.01) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class EventRecorder:
    """Records an emitter's events (a Worker, a QueueEvents...) as (name, args)."""

    def __init__(self, emitter: Any, *names: str) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []
        for name in names:
            emitter.on(name, self._recorder(name))

    def _recorder(self, name: str) -> Callable[..., None]:
        def record(*args: Any) -> None:
            self.seen.append((name, args))
        return record

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for event, args in self.seen if event == name]
