"""A small event emitter: `on`, `once`, `off`, `emit`, with sync or async listeners."""
from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable, Optional

logger = logging.getLogger("bullmq_compat")

Listener = Callable[..., Any]


def _arity(listener: Listener) -> Optional[int]:
    """How many positional arguments a listener takes (None: any number).

    Node passes extra trailing arguments (e.g. 'completed' gives job, result, prev); a Python
    listener written as ``lambda job, result: ...`` gets just the ones it asks for.
    """
    try:
        params = inspect.signature(listener).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for param in params:
        if param.kind == param.VAR_POSITIONAL:
            return None
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


class EventEmitter:
    """Node-style events. An async listener runs as a task; a listener's error is logged, never raised."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[tuple[Listener, bool, Optional[int]]]] = {}
        self._listener_tasks: set[asyncio.Task[Any]] = set()
        self._once_events: set[str] = set()  # the events that may have a `once` listener

    def on(self, event: str, listener: Listener) -> "EventEmitter":
        """Call ``listener`` each time ``event`` happens, e.g. ``worker.on("completed", cb)``."""
        self._listeners.setdefault(event, []).append((listener, False, _arity(listener)))
        return self

    def once(self, event: str, listener: Listener) -> "EventEmitter":
        """Call ``listener`` once, the next time ``event`` happens."""
        self._listeners.setdefault(event, []).append((listener, True, _arity(listener)))
        self._once_events.add(event)
        return self

    def off(self, event: str, listener: Listener) -> "EventEmitter":
        """Remove ``listener`` (added with `on` or `once`) from ``event``."""
        entries = self._listeners.get(event, [])
        self._listeners[event] = [entry for entry in entries if entry[0] is not listener]
        return self

    def listener_count(self, event: str) -> int:
        """How many listeners ``event`` has."""
        return len(self._listeners.get(event, ()))

    def emit(self, event: str, *args: Any) -> bool:
        """Call the listeners of ``event`` with ``args``; False when it has none."""
        entries = self._listeners.get(event)
        if not entries:
            if event == "error" and args:
                logger.error("unhandled 'error' event: %s", args[0])
            return False
        if event in self._once_events:  # a worker emits twice per job: no scan of the list when none was added
            self._once_events.discard(event)
            self._listeners[event] = [entry for entry in entries if not entry[1]]
        for listener, _, arity in entries:
            try:
                result = listener(*args) if arity is None else listener(*args[:arity])
                if result is not None and inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._listener_tasks.add(task)
                    task.add_done_callback(self._listener_done)
            except Exception:  # a listener must never break the worker
                logger.exception("listener for %r failed", event)
        return True

    def _listener_done(self, task: "asyncio.Task[Any]") -> None:
        self._listener_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("async listener failed: %r", task.exception())
