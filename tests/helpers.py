"""Small helpers shared by the tests."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterator


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


async def eventually(check: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.1,
                     what: str = "condition") -> Any:
    """`wait_until`, keyword style: await ``check()`` until it returns something truthy (returned)."""
    return await wait_until(check, timeout, what, interval)


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


@contextlib.asynccontextmanager
async def running(worker: Any, *, force_close: bool = False) -> AsyncIterator[Any]:
    """Run ``worker`` in the background for the block; closed (and awaited) on the way out."""
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await asyncio.sleep(0.05)
        assert not task.done(), f"worker.run() ended at once: {task.exception() if task.done() else ''}"
        yield worker
    finally:
        await worker.close(force=force_close)
        await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def a_queue(name: str, url: str) -> AsyncIterator[Any]:
    """A Queue closed on the way out."""
    from bullmq_compat import Queue

    queue = Queue(name, connection=url)
    try:
        yield queue
    finally:
        await queue.close()


class Records(logging.Handler):
    """Keeps every log record it handles."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, since: float = 0.0) -> list[str]:
        """INFO and above since ``since`` (a time.time()), as "logger: message"."""
        return [f"{r.name}: {r.getMessage()}" for r in self.records
                if r.levelno >= logging.INFO and r.created >= since]


@contextlib.contextmanager
def captured_logs(name: str = "bullmq_compat") -> Iterator[Records]:
    """Every record of the ``name`` logger (at DEBUG) while the block runs."""
    records = Records()
    log = logging.getLogger(name)
    old = log.level
    log.addHandler(records)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(records)
        log.setLevel(old)


class KnownGap(AssertionError):
    """The one failure a strict xfail expects: its test raises it from the final check of the
    documented gap (``xfail(strict=True, raises=KnownGap)``), so any other error on the way (a
    timeout, a Node crash, an earlier assertion) fails the test instead of counting as expected."""


def known_gap(holds: bool, message: str) -> None:
    """The final check of an xfail test: raise `KnownGap` with ``message`` unless ``holds``."""
    if not holds:
        raise KnownGap(message)


async def finish_by_hand(worker: Any, outcomes: Any, token: str = "tok") -> None:
    """Take the queue's next jobs with ``worker.get_next_job(token)``, one per outcome, and move each
    to completed ("ok", return value "done") or failed (otherwise, RuntimeError("boom")); then close
    the worker. A job missing fails the test."""
    try:
        for outcome in outcomes:
            job = await worker.get_next_job(token, block=False)
            assert job is not None
            if outcome == "ok":
                await job.move_to_completed("done", token)
            else:
                await job.move_to_failed(RuntimeError("boom"), token)
    finally:
        await worker.close()

