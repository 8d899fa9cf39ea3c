"""Busy-polling for a reply that is due: the event loop looks at its sockets for a short while
before it goes to sleep, but only while a fast Redis connection waits for a reply.

Where each job waits for the one before (one add at a time, a worker at concurrency 1) the
client would otherwise sleep in ``epoll_wait`` while Redis runs the call, and the reply would have
to wake it. On a virtual machine that wake-up costs more than the call: a PING round trip over
loopback took 105 µs through a sleeping asyncio loop and 55 µs through a polling one, and Redis
spent 35 µs of its own CPU on each PING against 17 µs (2 vCPUs, KVM, Redis 7.0; see docs/worker.md,
"Busy-polling"). Redis's reply lands in a socket nobody sleeps on, so its write wakes nobody.

The cost is the client's CPU while it polls: at most ``budget`` per sleep of the loop, and only
while a reply is due. A poll that ends without a reply makes the next ones rarer (1 in 2, 4, ...,
256 of the loop's sleeps), so a Redis far away (a round trip longer than the budget) costs next
to nothing; the first reply caught in time restores it. Polling yields the CPU (``sched_yield``) on
every turn, so a process that needs the core gets it.

`set_busy_poll` sets the budget (200 µs unless the environment's ``BULLMQ_COMPAT_BUSY_POLL_US``
says otherwise; 0 turns it off). The loop must be asyncio's selector loop; on any other loop
(uvloop, the proactor) nothing changes.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from typing import Any, Optional

__all__ = ["set_busy_poll", "busy_poll_budget", "attach", "detach"]

_ENV = "BULLMQ_COMPAT_BUSY_POLL_US"
_DEFAULT_US = 200
_MAX_US = 1_000_000
_MAX_SKIP_EXPONENT = 8  # after misses, poll before 1 sleep in 2, 4, ..., 256

_perf_counter = time.perf_counter
_yield = getattr(os, "sched_yield", lambda: None)


def _check_budget(value: Any, origin: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_US:
        raise ValueError(f"{origin} must be a whole number of microseconds from 0 to {_MAX_US:,} "
                         f"(0 turns busy-polling off), not {value!r}")
    return value


def _budget_from_environment() -> int:
    text = os.environ.get(_ENV)
    if text is None or not text.strip():
        return _DEFAULT_US
    try:
        value: Any = int(text)
    except ValueError:
        value = text
    return _check_budget(value, _ENV)


_budget_s = _budget_from_environment() / 1e6


def set_busy_poll(microseconds: int) -> None:
    """How long the event loop polls for a due Redis reply before it sleeps, in µs (0: never).

    >>> import bullmq_compat
    >>> bullmq_compat.set_busy_poll(0)      # sleep at once: least CPU, slower round trips
    >>> bullmq_compat.set_busy_poll(200)    # the default

    It takes effect at the loop's next sleep, for every connection of the process.
    """
    global _budget_s
    _budget_s = _check_budget(microseconds, "the busy-poll budget") / 1e6


def busy_poll_budget() -> int:
    """The budget `set_busy_poll` set (or the environment's, or the default), in µs."""
    return round(_budget_s * 1e6)


class BusyPollSelector:
    """Wraps an event loop's selector: `select` with a timeout first polls its sockets, for up to
    the budget, while one of its ``due`` queues (the pending replies of a fast connection) is not
    empty. Everything else is the wrapped selector's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        raw = getattr(inner, "_selector", None)  # epoll / poll objects: a poll without Python work
        self._poll = raw.poll if raw is not None and hasattr(raw, "poll") else inner.select
        self.due: list[deque[Any]] = []
        self.caught = 0  # polls that saw a reply arrive (the loop did not sleep for it)
        self.missed = 0  # polls that ended without one (the loop slept for the rest)
        self._misses = 0
        self._skip = 0
        # the calls the event loop makes on every add/remove of a reader or writer: no __getattr__
        self.register = inner.register
        self.unregister = inner.unregister
        self.modify = inner.modify
        self.get_key = inner.get_key
        self.get_map = inner.get_map
        self.close = inner.close

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def select(self, timeout: Optional[float] = None) -> list[tuple[Any, int]]:
        if timeout != 0 and _budget_s and any(self.due):
            if self._skip:
                self._skip -= 1
            else:
                start = _perf_counter()
                end = start + (_budget_s if timeout is None else min(_budget_s, timeout))
                poll = self._poll
                while True:
                    if poll(0):
                        self._misses = 0
                        self.caught += 1
                        return self._inner.select(0)  # type: ignore[no-any-return]
                    now = _perf_counter()
                    if now >= end:
                        break
                    _yield()
                self.missed += 1
                self._misses = misses = min(self._misses + 1, _MAX_SKIP_EXPONENT)
                self._skip = (1 << misses) - 1
                if timeout is not None:
                    timeout = max(0.0, timeout - (now - start))
        return self._inner.select(timeout)  # type: ignore[no-any-return]


def attach(loop: asyncio.AbstractEventLoop, due: deque[Any]) -> Optional[BusyPollSelector]:
    """Poll ``loop``'s sockets while ``due`` (a queue of pending replies) is not empty; the
    wrapper that does it, or None where the loop has no selector of asyncio's to wrap."""
    selector = getattr(loop, "_selector", None)
    if selector is None or not isinstance(loop, asyncio.BaseEventLoop):
        return None
    if not isinstance(selector, BusyPollSelector):
        if not hasattr(selector, "select") or not hasattr(selector, "get_map"):
            return None
        selector = BusyPollSelector(selector)
        loop._selector = selector  # type: ignore[attr-defined]
    selector.due.append(due)
    return selector


def detach(selector: Optional[BusyPollSelector], due: deque[Any]) -> None:
    """Undo `attach` for ``due`` (the wrapper stays on its loop, idle without queues)."""
    if selector is not None:
        selector.due[:] = [queue for queue in selector.due if queue is not due]
