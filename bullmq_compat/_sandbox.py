"""Process isolation: run a processor given as 'pkg.module:function' in a child process.

The child gets a plain snapshot of the job (a `SandboxedJob`); a handler that crashes its
process fails only that job (the worker raises `ChildCrashed` and builds a new pool).
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
from typing import Any, Callable, Optional

from bullmq_compat._errors import BullMQCompatError

_loaded: dict[str, Callable[..., Any]] = {}


class ChildCrashed(BullMQCompatError):
    """The child process running a job died before answering."""


class SandboxedJob:
    """What a processor running in a child process sees of its job (read-only fields)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.id: Optional[str] = payload.get("id")
        self.name: str = payload.get("name", "")
        self.data: Any = payload.get("data")
        self.opts: dict[str, Any] = payload.get("opts") or {}
        self.attempts_made: int = payload.get("attempts_made", 0)
        self.attempts_started: int = payload.get("attempts_started", 0)
        self.timestamp: int = payload.get("timestamp", 0)
        self.queue_name: str = payload.get("queue_name", "")

    def __repr__(self) -> str:
        return f"<SandboxedJob {self.queue_name}:{self.id} name={self.name!r}>"


def run_in_child(path: str, payload: dict[str, Any]) -> Any:
    """Entry point executed inside the child process."""
    fn = _loaded.get(path)
    if fn is None:
        module_name, _, attr = path.partition(":")
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        fn = _loaded[path] = target
    result = fn(SandboxedJob(payload))
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable
