"""Retry delays: Node BullMQ's fixed and exponential strategies (with jitter) and custom ones."""
from __future__ import annotations

import inspect
import math
import random
from typing import Any, Callable, Optional

BackoffStrategy = Callable[..., Any]


def builtin_delay(backoff: dict[str, Any], attempts_made: int) -> Optional[int]:
    """The delay for attempt ``attempts_made`` (1-based) of a fixed/exponential backoff, or None."""
    kind = backoff.get("type")
    delay = float(backoff.get("delay") or 0)
    jitter = float(backoff.get("jitter") or 0)
    if kind == "fixed":
        if jitter > 0:
            return int(random.random() * delay * jitter + delay * (1 - jitter))
        return int(delay)
    if kind == "exponential":
        max_delay = math.floor(2 ** (attempts_made - 1) * delay + 0.5)  # Math.round: halves go up
        if jitter > 0:
            return int(random.random() * max_delay * jitter + max_delay * (1 - jitter))
        return int(max_delay)
    return None


async def retry_delay(backoff: Any, attempts_made: int, err: BaseException, job: Any,
                      custom: Optional[BackoffStrategy]) -> int:
    """Milliseconds to wait before the next attempt; -1 means do not retry (as in Node)."""
    if not backoff:
        return 0
    if isinstance(backoff, (int, float)):
        backoff = {"type": "fixed", "delay": backoff}
    delay = builtin_delay(backoff, attempts_made)
    if delay is not None:
        return delay
    if custom is None:
        raise ValueError(
            f"Unknown backoff strategy {backoff.get('type')!r}: give the worker "
            "backoff_strategy=callable(attempts_made, type, err, job) for custom types")
    value = custom(attempts_made, backoff.get("type"), err, job)
    if inspect.isawaitable(value):
        value = await value
    return int(value or 0)
