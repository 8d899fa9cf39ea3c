"""Blocking facade for Django, Flask, Celery tasks and scripts: the same methods, without await.

>>> from bullmq_compat.sync import Queue
>>> queue = Queue("emails", connection="redis://127.0.0.1:6379/0")
>>> job = queue.add("send", {"to": "a@b"}, attempts=3)
>>> job.get_state()
'waiting'

All objects of this module live on one event loop that runs in a daemon thread of its own,
started on first use: no event loop is created per call, any number of threads may call at
once, and code that already runs an event loop (in another thread) can call it too.
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import threading
from typing import Any, Callable, Optional

from bullmq_compat._errors import BullMQCompatError
from bullmq_compat._transactions import driver_connection_sync

__all__ = ["Queue", "Job", "QueueEvents", "FlowProducer", "Relay", "RelaySubscription", "run", "loop"]

_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None
_thread: Optional[threading.Thread] = None


def loop() -> asyncio.AbstractEventLoop:
    """The event loop every sync object runs on (started on first use)."""
    global _loop, _thread
    with _lock:
        if _loop is None or not _loop.is_running():
            ready = threading.Event()
            new_loop = asyncio.new_event_loop()

            def serve() -> None:
                asyncio.set_event_loop(new_loop)
                new_loop.call_soon(ready.set)
                new_loop.run_forever()

            _thread = threading.Thread(target=serve, name="bullmq-compat-sync", daemon=True)
            _thread.start()
            ready.wait()
            _loop = new_loop
        return _loop


def run(coro: Any, timeout: Optional[float] = None) -> Any:
    """Run a coroutine on the sync loop and wait for its result (from any thread but that loop's)."""
    target = loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise BullMQCompatError("bullmq_compat.sync called from its own event loop thread: await the async API there")
    return asyncio.run_coroutine_threadsafe(coro, target).result(timeout)


def _wrap(value: Any) -> Any:
    """Give results the blocking face too (a Job becomes a sync Job, lists are mapped)."""
    from bullmq_compat._flow import JobNode
    from bullmq_compat._job import Job as AsyncJob

    if isinstance(value, AsyncJob):
        return Job._from_async(value)
    if isinstance(value, JobNode):
        return JobNode(job=_wrap(value.job), children=[_wrap(child) for child in value.children])
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _unwrap(value: Any) -> Any:
    return value._async if isinstance(value, _Proxy) else value


class _Proxy:
    """Forwards attributes to an async object; coroutine methods become blocking calls."""

    _async: Any

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._async, name)
        if inspect.iscoroutinefunction(attr):
            @functools.wraps(attr)
            def blocking(*args: Any, **kwargs: Any) -> Any:
                args = tuple(_unwrap(a) for a in args)
                kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
                if kwargs.get("transaction") is not None:  # Django's connection is this thread's: here
                    kwargs["transaction"] = driver_connection_sync(kwargs["transaction"])
                return _wrap(run(attr(*args, **kwargs)))
            return blocking
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_async":
            object.__setattr__(self, name, value)
        else:
            setattr(self._async, name, value)

    def __repr__(self) -> str:
        return f"<sync {self._async!r}>"

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        close = getattr(self._async, "close", None)
        if close is not None:
            run(close())


def _build(factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Create the async object on the sync loop, so its connections belong to that loop."""
    async def make() -> Any:
        return factory(*args, **kwargs)
    return run(make())


class Queue(_Proxy):
    """`bullmq_compat.Queue` with blocking methods: ``Queue("emails", connection=url).add("send", {...})``."""

    def __init__(self, name: str, connection: Any = None, **kwargs: Any) -> None:
        """The same arguments as `bullmq_compat.Queue`; the queue lives on the sync API's background
        loop."""
        from bullmq_compat._queue import Queue as AsyncQueue

        self._async = _build(AsyncQueue, name, connection, **kwargs)


class Job(_Proxy):
    """A job with blocking methods (``get_state()``, ``wait_until_finished(queue_events, timeout)``...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Not for user code: sync jobs come from `Queue.add` and `Queue.get_job` (raises
        `BullMQCompatError`)."""
        raise BullMQCompatError("sync Jobs come from Queue.add / Queue.get_job, not from Job(...)")

    @classmethod
    def _from_async(cls, job: Any) -> "Job":
        self = object.__new__(cls)
        object.__setattr__(self, "_async", job)
        return self

    @classmethod
    def from_id(cls, queue: Queue, job_id: str) -> Optional["Job"]:
        """The job ``job_id`` of ``queue``, or None (as `bullmq_compat.Job.from_id`)."""
        job: Optional[Job] = queue.get_job(job_id)
        return job


class QueueEvents(_Proxy):
    """`bullmq_compat.QueueEvents` on the sync loop; pass it to ``job.wait_until_finished``."""

    def __init__(self, name: str, connection: Any = None, **kwargs: Any) -> None:
        """The same arguments as `bullmq_compat.QueueEvents`; it starts reading events on the
        background loop at once."""
        import bullmq_compat

        cls = getattr(bullmq_compat, "QueueEvents", None)
        if cls is None:
            raise BullMQCompatError("QueueEvents is not available in this version")
        self._async = _build(cls, name, connection, **kwargs)
        run_method = getattr(self._async, "run", None)
        if run_method is not None and not getattr(self._async, "running", False):
            # consume the stream in the background on the sync loop
            asyncio.run_coroutine_threadsafe(self._start(), loop()).result()

    async def _start(self) -> None:
        object.__setattr__(self, "_task", asyncio.ensure_future(self._async.run()))
        waiter = getattr(self._async, "wait_until_ready", None)
        if waiter is not None:
            await waiter()


class FlowProducer(_Proxy):
    """`bullmq_compat.FlowProducer` with blocking methods."""

    def __init__(self, connection: Any = None, **kwargs: Any) -> None:
        """The same arguments as `bullmq_compat.FlowProducer`, on the sync API's background loop."""
        import bullmq_compat

        cls = getattr(bullmq_compat, "FlowProducer", None)
        if cls is None:
            raise BullMQCompatError("FlowProducer is not available in this version")
        self._async = _build(cls, connection, **kwargs)


class Relay(_Proxy):
    """`bullmq_compat.Relay` with blocking methods: ``publish``, ``subscribe``, ``delete_retained``, the
    getters and ``close``.

    ``subscribe(pattern, callback)`` calls ``callback(message)`` on a thread of this relay's own
    (``bullmq-compat-relay``), one message at a time and in order, never on the caller's thread or
    the event loop's: the loop keeps the lease alive meanwhile, and a slow callback makes the inbox
    lag as a slow listener does. An exception in it goes to the relay's 'error' event. Event
    listeners (``relay.on("error", cb)``) run on the background loop's thread."""

    def __init__(self, connection: Any = None, **kwargs: Any) -> None:
        """The same arguments as `bullmq_compat.Relay`; it connects and registers before returning."""
        from concurrent.futures import ThreadPoolExecutor

        from bullmq_compat._relay import Relay as AsyncRelay

        object.__setattr__(self, "_callbacks", ThreadPoolExecutor(1, thread_name_prefix="bullmq-compat-relay"))
        self._async = _build(AsyncRelay, connection, **kwargs)
        try:
            run(self._async.wait_until_ready())
        except BaseException:
            run(self._aclose())
            self._callbacks.shutdown(wait=False)
            raise

    def subscribe(self, pattern: str, callback: Callable[[Any], Any]) -> "RelaySubscription":
        """Subscribe ``callback`` (called on the relay's callback thread) to ``pattern``."""
        executor = self._callbacks
        if not callable(callback):
            from bullmq_compat._errors import InvalidArgument

            raise InvalidArgument(f"Relay callback must be callable, not {type(callback).__name__}")

        async def listener(message: Any) -> None:
            await asyncio.get_running_loop().run_in_executor(executor, callback, message)

        return RelaySubscription(run(self._async.subscribe(pattern, listener)))

    def close(self) -> None:
        """Unregister and close (idempotent); waits for the callback running, if any."""
        run(self._aclose())
        on_callback_thread = threading.current_thread().name.startswith("bullmq-compat-relay")
        self._callbacks.shutdown(wait=not on_callback_thread)

    async def _aclose(self) -> None:
        await self._async.close()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RelaySubscription(_Proxy):
    """A sync `Relay.subscribe`'s subscription: ``pattern``, ``added``, ``retained``, ``unsubscribe()``."""

    def __init__(self, subscription: Any) -> None:
        """Not for user code: it comes from `Relay.subscribe`."""
        self._async = subscription


@atexit.register
def _stop_loop() -> None:
    if _loop is not None and _loop.is_running():
        _loop.call_soon_threadsafe(_loop.stop)
