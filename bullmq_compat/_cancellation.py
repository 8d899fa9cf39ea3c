"""Job cancellation: `AbortController`/`AbortSignal` (Node's pair, as BullMQ 5.64+/6 passes it to a
processor taking ``(job, token, signal)``), `AbortError`, and `WaitingError`.

``worker.cancel_job(job_id, reason)`` aborts the signal of that job. Cancellation is cooperative,
as in Node: the processor sees ``signal.aborted``, a listener or ``await signal.wait()`` and
raises; what then happens to the job is what happens to any job whose processor raised (failed,
retried while attempts remain, not retried after `UnrecoverableError`).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from typing import Any, Callable, Optional

from bullmq_compat._errors import BullMQCompatError

logger = logging.getLogger("bullmq_compat.worker")

ABORT_MESSAGE = "This operation was aborted"
WAITING_ERROR = "bullmq:movedToWait"


class AbortError(BullMQCompatError):
    """The operation was aborted: raised by `AbortSignal.throw_if_aborted()` and, when
    ``cancel_job`` was given no reason, the signal's ``reason`` (as Node's DOMException
    ``AbortError``, message ``"This operation was aborted"``)."""

    def __init__(self, reason: Any = None) -> None:
        """``reason`` is the abort's reason; the message is Node's default text when it is None."""
        super().__init__(ABORT_MESSAGE if reason is None else str(reason))
        self.reason = reason


class WaitingError(BullMQCompatError):
    """Raise from a processor after moving its job back to waiting (``await job.move_to_wait(token)``):
    the worker then leaves the job alone, as Node's ``WaitingError``."""

    def __init__(self, message: str = WAITING_ERROR) -> None:
        """The message defaults to Node's marker text, which workers recognise."""
        super().__init__(message)


class AbortSignal:
    """Node's ``AbortSignal`` under Python names: ``aborted``, ``reason``, ``add_listener(fn, once=False)``
    / ``remove_listener(fn)`` (Node: ``addEventListener('abort', fn)``), ``throw_if_aborted()``
    and ``await wait()`` (returns the reason once aborted). Safe to read from a processor's thread."""

    __slots__ = ("_aborted", "_reason", "_listeners", "_waiters", "_lock")

    def __init__(self) -> None:
        """A signal not yet aborted; made by `AbortController`."""
        self._aborted = False
        self._reason: Any = None
        self._listeners: list[tuple[Callable[..., Any], bool]] = []
        self._waiters: list[asyncio.Future[Any]] = []
        self._lock = threading.Lock()

    @property
    def aborted(self) -> bool:
        """True once the controller aborted (Node's ``signal.aborted``)."""
        return self._aborted

    @property
    def reason(self) -> Any:
        """``None`` until aborted; then the reason given, or an `AbortError` when none was."""
        return self._reason

    def add_listener(self, listener: Callable[..., Any], *, once: bool = False) -> None:
        """Call ``listener()`` when the signal aborts (an ``async def`` runs as a task). Added to an
        aborted signal it is not called, as in Node; check ``aborted`` first."""
        if not callable(listener):
            raise TypeError(f"listener={listener!r} must be callable")
        with self._lock:
            if all(fn is not listener for fn, _ in self._listeners):  # as addEventListener: once per function
                self._listeners.append((listener, once))

    def remove_listener(self, listener: Callable[..., Any]) -> None:
        """Remove ``listener`` (added by `add_listener`); unknown listeners are ignored."""
        with self._lock:
            self._listeners = [(fn, once) for fn, once in self._listeners if fn is not listener]

    # Node's spellings, for code ported as is
    def add_event_listener(self, event: str, listener: Callable[..., Any], *, once: bool = False) -> None:
        """Node's ``addEventListener('abort', listener, {once})``: only the ``"abort"`` event
        exists."""
        if event != "abort":
            raise ValueError(f"event={event!r}: an AbortSignal only emits 'abort'")
        self.add_listener(listener, once=once)

    def remove_event_listener(self, event: str, listener: Callable[..., Any]) -> None:
        """Node's ``removeEventListener('abort', listener)``."""
        if event == "abort":
            self.remove_listener(listener)

    def throw_if_aborted(self) -> None:
        """Raise the reason when it is an exception, else `AbortError(reason)`; nothing if not aborted."""
        if self._aborted:
            if isinstance(self._reason, BaseException):
                raise self._reason
            raise AbortError(self._reason)

    async def wait(self) -> Any:
        """Wait until the signal aborts; returns the reason."""
        if self._aborted:
            return self._reason
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._lock:
            if not self._aborted:
                self._waiters.append(fut)
        if self._aborted and not fut.done():
            fut.set_result(self._reason)
        try:
            return await fut
        finally:
            with self._lock:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def _abort(self, reason: Any) -> None:
        with self._lock:
            if self._aborted:
                return
            self._reason = AbortError() if reason is None else reason
            self._aborted = True
            listeners, self._listeners = self._listeners, [(fn, once) for fn, once in self._listeners if not once]
            waiters, self._waiters = self._waiters, []
        for fut in waiters:
            _resolve(fut, self._reason)
        for fn, _ in listeners:
            try:
                result = fn()
                if inspect.isawaitable(result):
                    asyncio.ensure_future(result)
            except Exception:  # as an event listener's exception in Node: reported, not raised into abort()
                logger.exception("an abort listener raised")

    def __repr__(self) -> str:
        return f"<AbortSignal aborted={self._aborted} reason={self._reason!r}>"


def _resolve(fut: asyncio.Future[Any], value: Any) -> None:
    loop = fut.get_loop()
    try:
        running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        if not fut.done():
            fut.set_result(value)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(_set_if_pending, fut, value)


def _set_if_pending(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


class AbortController:
    """Owns an `AbortSignal`; ``abort(reason=None)`` aborts it once (later calls do nothing)."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        """A controller with a fresh, not yet aborted `signal`."""
        self.signal = AbortSignal()

    def abort(self, reason: Any = None) -> None:
        """Abort `signal` with ``reason`` (Node's ``controller.abort(reason)``): its listeners run
        once."""
        self.signal._abort(reason)
