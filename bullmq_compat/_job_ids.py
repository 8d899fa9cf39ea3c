"""Job id generators: ``Queue(..., job_id_generator=fn)`` / ``FlowProducer(..., job_id_generator=fn)``
and the ready one, `uuid7_ids` (time-ordered RFC 9562 UUIDv7 strings).

A generator is a plain (not async) callable returning a ``str``, taking either no arguments or
the job's ``(name, data)``; which one is read once from its signature, when the queue is made.
What it returns is checked as a custom ``job_id`` is (`check_job_id`).
"""
from __future__ import annotations

import inspect
import os
import sys
import threading
import time
import uuid
from typing import Any, Callable, Optional

from bullmq_compat._errors import InvalidArgument, InvalidJobId
from bullmq_compat._wire.options import job_id_problem

#: what ``job_id_generator=`` takes: ``() -> str`` or ``(name, data) -> str``
JobIdGenerator = Callable[..., str]


class _UUID7:
    """RFC 9562 UUIDv7 with a monotonic 42-bit counter (section 6.2, method 1).

    Layout: 48 bits of Unix time in ms, version 7, 12 bits of counter (``rand_a``), variant
    ``10``, then 30 more bits of counter and 32 random bits (``rand_b``). On a new millisecond
    the counter starts at a random value with its top bit clear (room to count); within the
    same millisecond, or when the clock goes back, it counts up, and on overflow the time is
    moved on by a millisecond. So in one process every value is greater than the one before,
    whatever the clock does and from any thread.
    """

    _COUNTER_BITS = 42
    _COUNTER_MAX = (1 << _COUNTER_BITS) - 1

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def __call__(self) -> str:
        random = int.from_bytes(os.urandom(10), "big")  # 32 bits for the tail, 41 for a new counter
        seed = random >> 39  # 41 bits: the counter's top bit clear
        with self._lock:
            now_ms = self._clock() // 1_000_000
            if now_ms > self._last_ms:
                self._last_ms, self._counter = now_ms, seed
            elif self._counter < self._COUNTER_MAX:
                self._counter += 1
            else:  # 2**41 or more ids in one millisecond: borrow the next one
                self._last_ms, self._counter = self._last_ms + 1, seed
            ms, counter = self._last_ms, self._counter
        value = ((ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (counter >> 30) << 64
                 | 0b10 << 62 | (counter & 0x3FFF_FFFF) << 32 | (random & 0xFFFF_FFFF))
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_own_uuid7 = _UUID7()

if sys.version_info >= (3, 14):
    def uuid7_ids() -> str:
        """A new time-ordered UUIDv7 string (``"0192f4a0-6c1e-7c3a-8e5b-3f2d9a1b4c7e"``), for
        ``Queue("q", job_id_generator=uuid7_ids)``: from the standard library's ``uuid.uuid7``
        (monotonic within a process)."""
        return str(uuid.uuid7())  # type: ignore[attr-defined,unused-ignore]
else:
    def uuid7_ids() -> str:
        """A new time-ordered UUIDv7 string (``"0192f4a0-6c1e-7c3a-8e5b-3f2d9a1b4c7e"``), for
        ``Queue("q", job_id_generator=uuid7_ids)``: RFC 9562 with a monotonic counter (Python
        3.14 and later use the standard library's ``uuid.uuid7``)."""
        return _own_uuid7()


def _takes_name_and_data(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` is to be called with ``(name, data)``, False with no arguments; anything
    else is refused now, with the rule."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: call them as they usually are, bare
        return False
    for args in ((None, None), ()):
        try:
            signature.bind(*args)
        except TypeError:
            continue
        return bool(args)
    raise InvalidArgument(f"job_id_generator={fn!r} must take no arguments or (name, data); "
                          f"its signature is {signature}")


class IdGenerator:
    """A checked ``job_id_generator``: ``generator(name, data)`` calls it as its signature wants
    and returns its id once checked as a custom job id."""

    __slots__ = ("fn", "_with_args")

    def __init__(self, fn: Any) -> None:
        if not callable(fn):
            raise InvalidArgument(f"job_id_generator={fn!r} must be a function returning a str job id, or None")
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise InvalidArgument(f"job_id_generator={fn!r} must be a plain function returning a str "
                                  "(not async, not a generator): it is called inside add")
        self.fn = fn
        self._with_args = _takes_name_and_data(fn)

    def __call__(self, name: Any, data: Any) -> str:
        value = self.fn(name, data) if self._with_args else self.fn()
        if inspect.isawaitable(value):
            close = getattr(value, "close", None)
            if close is not None:
                close()  # no "never awaited" warning for a coroutine we refuse
            raise InvalidJobId(f"job_id_generator returned an awaitable ({value!r}): it must be a plain "
                               "function returning a str")
        problem = job_id_problem(value)
        if problem is not None:
            hint = "" if isinstance(value, str) else f"; return str(...) of it, not a {type(value).__name__}"
            raise InvalidJobId(f"job_id_generator returned {value!r}: a custom job id {problem}{hint}")
        return value  # type: ignore[no-any-return]  # a str: job_id_problem checked it


def id_generator(fn: Any) -> Optional[IdGenerator]:
    """``job_id_generator=`` checked (None stays None)."""
    return None if fn is None else IdGenerator(fn)
