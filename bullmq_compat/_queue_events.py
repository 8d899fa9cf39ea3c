"""QueueEvents and QueueEventsProducer: a queue's events stream, read and written as Node BullMQ does.

Every upstream script records what it does in the stream ``<prefix>:<queue>:events`` (XADD
``event <name> jobId <id> ...``). `QueueEvents` reads that stream with XREAD BLOCK on a connection
of its own and re-emits each entry with Node's event names and argument shapes, so listeners see
the same events whichever language produced them:

>>> events = QueueEvents("emails", connection="redis://127.0.0.1:6379/0")
>>> events.on("completed", lambda args, id: print(args["jobId"], args["returnvalue"]))
>>> async for name, fields, event_id in events:   # or iterate
...     print(name, fields)

`QueueEventsProducer` publishes custom events to the same stream.
"""
from __future__ import annotations

import asyncio
import logging
import math
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Optional

from bullmq_compat._errors import (
    BullMQCompatError,
    InvalidArgument,
    JobFailed,
    JobNotFound,
    JobWaitTimeout,
)
from bullmq_compat._queue import Connection, QueueBase
from bullmq_compat._wire import codec

if TYPE_CHECKING:
    from bullmq_compat._job import Job

logger = logging.getLogger("bullmq_compat.queue_events")

QUEUE_EVENT_SUFFIX = ":qe"
"""Node's suffix for a QueueEvents connection name: ``<prefix>:<base64(queue)>:qe``."""

_FIRST_RETRY_S = 0.05
_MAX_RETRY_S = 2.0
# Beyond the server-side BLOCK time, how long a read may take before the connection is presumed
# dead (a half-open TCP connection never errors) and is dropped and reopened.
_WATCHDOG_SLACK_S = 5.0

_END = object()


def _parse_json(text: Any) -> Any:
    """JSON.parse as Node's QueueEvents does it, but a value that is not JSON is passed on as is."""
    if not isinstance(text, str):
        return text
    try:
        return codec.loads(text)
    except ValueError:
        return text


def _number(text: Any) -> Any:
    """JavaScript's Number(text) for the 'delayed' event's delay (an int where it is one)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return math.nan if text not in (None, "") else 0
    return int(value) if value.is_integer() else value


def _check_ms(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{name}={value!r} must be an int number of ms >= 0")
    return value


class _EventIterator:
    """One ``async for`` over a QueueEvents: every event from when it was created, in order."""

    def __init__(self, owner: "QueueEvents") -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._owner = owner
        if owner.closed:
            self._queue.put_nowait(_END)

    def _put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> "_EventIterator":
        return self

    async def __anext__(self) -> tuple[str, dict[str, Any], str]:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # stays finished
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        self._owner._iterators.discard(self)
        self._queue.put_nowait(_END)


class QueueEvents(QueueBase):
    """Listens to the events of one queue, from workers and producers of any language.

    Events and listener arguments are Node's: ``on("completed", lambda args, id: ...)`` gets
    ``args = {"jobId", "returnvalue" (parsed JSON), "prev"}`` and the stream entry id;
    "failed" gets ``{"jobId", "failedReason", "prev"}``, "progress" ``{"jobId", "data" (parsed)}``,
    "delayed" ``{"jobId", "delay" (number)}``, "drained" only the id; every other field is the
    string Redis holds. An event about a job is also emitted as ``"<event>:<jobId>"``. Listeners
    get only as many arguments as they take.

    It reads from ``last_event_id`` ("$": events from when it starts listening). With
    ``autorun=True`` (Node's default) it starts by itself — at once when created inside a running
    event loop, else on first ``wait_until_ready()``, ``async with`` or iteration; with
    ``autorun=False`` call ``await run()``, which returns after ``close()``.

    After a lost connection (a Redis restart) it reconnects and resumes after the last event it
    read, so events in between are not lost (logged once per outage, retried with back-off).
    """

    def __init__(self, name: str, connection: Connection = None, *, prefix: str = "bull",
                 last_event_id: str = "$", blocking_timeout: int = 10000, autorun: bool = True,
                 schema: Optional[str] = None, migrate: bool = False) -> None:
        """Listen to queue ``name``'s events on ``connection`` (a URL, a client, or a PostgreSQL
        pool), from ``last_event_id``; ``blocking_timeout`` (ms) bounds each blocking read;
        ``schema``/``migrate`` for PostgreSQL."""
        super().__init__(name, connection, prefix=prefix, schema=schema, migrate=migrate)
        if not isinstance(last_event_id, str) or not last_event_id:
            raise InvalidArgument(f"last_event_id={last_event_id!r} must be a stream id such as '$', '0' "
                                  "or '1700000000000-0'")
        self.blocking_timeout = _check_ms("blocking_timeout", blocking_timeout)
        #: the id of the last event read ("$" or what was passed, until the first event arrives)
        self.last_event_id = last_event_id
        self.autorun = autorun
        self.closed = False
        self._position: str = last_event_id
        self._reader: Any = None
        self._consumer: Optional[asyncio.Task[None]] = None
        self._autorun_task: Optional[asyncio.Task[None]] = None
        self._listening = asyncio.Event()
        self._iterators: "weakref.WeakSet[_EventIterator]" = weakref.WeakSet()
        self._connection_down = False
        if autorun:
            self._start()

    # -- running --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the events stream is being read now."""
        return self._consumer is not None and not self._consumer.done()

    def _start(self) -> None:
        """Autorun: start consuming in the background if there is a running loop to do it in."""
        if self._consumer is not None or self._autorun_task is not None or self.closing:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started later, from the first coroutine that needs it
        self._autorun_task = loop.create_task(self._autorun())

    async def _autorun(self) -> None:
        try:
            await self.run()
        except Exception as err:  # as Node's autorun: run()'s error goes to the 'error' event
            self.emit("error", err)

    async def run(self) -> None:
        """Consume the events stream until `close()`. Already running by ``autorun``: waits for that run."""
        autorun = self._autorun_task
        if autorun is not None and not autorun.done() and autorun is not asyncio.current_task():
            await asyncio.wait([autorun])  # ends when that run ends (close() may cancel it)
            return
        if self._consumer is not None:
            raise InvalidArgument("Queue Events is already running.")
        if self.closing:
            return
        self._consumer = asyncio.ensure_future(self._consume())
        try:
            await asyncio.wait([self._consumer])
        except asyncio.CancelledError:
            self._consumer.cancel()
            raise
        if not self._consumer.cancelled() and self._consumer.exception() is not None:
            raise self._consumer.exception()  # type: ignore[misc]

    async def wait_until_ready(self) -> None:
        """Redis answers and, once running, the start position in the stream is fixed: every event
        added from now on will be delivered."""
        if self.autorun:
            self._start()
        await super().wait_until_ready()
        if self._consumer is not None or self._autorun_task is not None:
            listening = asyncio.ensure_future(self._listening.wait())
            ended = [t for t in (self._consumer, self._autorun_task) if t is not None]
            try:
                await asyncio.wait([listening, *ended], return_when=asyncio.FIRST_COMPLETED)
            finally:
                listening.cancel()

    async def _consume(self) -> None:
        if self._reader is None:
            self._reader = await self.backend.open_events_reader(self.client_name(QUEUE_EVENT_SUFFIX))
        # errors after which the read is retried (the datastore restarted, the network is gone)
        transient: tuple[type[BaseException], ...] = (*self.backend.transient_errors, asyncio.TimeoutError)
        pause = _FIRST_RETRY_S
        while not self.closing:
            try:
                if self._position == "$":
                    # Fix "$" to a concrete id before reading: with "$" itself, events added
                    # between two reads (or before the first one) would be skipped.
                    self._position = await self._reader.last_id()
                self._listening.set()
                entries = await self._read(self._position)
            except transient as err:
                if self.closing:
                    break
                if not self._connection_down:
                    self._connection_down = True
                    logger.warning("QueueEvents %s lost %s (%s); reconnecting with back-off",
                                   self.name, self.backend.label, err or type(err).__name__)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY_S)
                continue
            except Exception as err:  # e.g. WRONGTYPE: report, wait, try again
                if self.closing:
                    break
                self.emit("error", err)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY_S)
                continue
            if self._connection_down:
                self._connection_down = False
                logger.info("QueueEvents %s reconnected; resuming after event %s", self.name, self._position)
            pause = _FIRST_RETRY_S
            for entry_id, fields in entries:
                self._position = entry_id
                self._dispatch(entry_id, fields)

    async def _read(self, position: str) -> list[tuple[str, dict[str, str]]]:
        read = self._reader.read(position, self.blocking_timeout)
        if self.blocking_timeout <= 0:  # BLOCK 0 is "forever": no deadline to enforce
            return list(await read)
        return list(await asyncio.wait_for(read, self.blocking_timeout / 1000 + _WATCHDOG_SLACK_S))

    def _dispatch(self, entry_id: str, fields: dict[str, Any]) -> None:
        args = dict(fields)
        event = args.pop("event", "")
        # the fields Node's QueueEvents parses; everything else stays a string
        if event == "progress" and "data" in args:
            args["data"] = _parse_json(args["data"])
        elif event == "completed" and "returnvalue" in args:
            args["returnvalue"] = _parse_json(args["returnvalue"])
        elif event == "delayed" and "delay" in args:
            args["delay"] = _number(args["delay"])
        self.last_event_id = entry_id
        for iterator in list(self._iterators):
            iterator._put((event, args, entry_id))
        if event == "drained":
            self.emit(event, entry_id)
        else:
            self.emit(event, args, entry_id)
            job_id = args.get("jobId")
            if job_id:
                self.emit(f"{event}:{job_id}", args, entry_id)

    def __aiter__(self) -> _EventIterator:
        """``async for name, fields, id in queue_events``: events from this moment on, until close.

        To replay past events (``last_event_id="0"``) by iteration, iterate the new QueueEvents
        before awaiting anything else (or attach ``on`` listeners first): events read while the
        caller awaits, e.g. in ``async with``, go only to the iterators and listeners already there.
        """
        if self.autorun:
            self._start()
        iterator = _EventIterator(self)
        self._iterators.add(iterator)
        return iterator

    # -- closing --------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop reading (interrupting a blocked read) and close the connections."""
        if self.closed:
            return
        self.closing = True
        for task in (self._consumer, self._autorun_task):
            if task is not None and not task.done():
                task.cancel()
        for task in (self._consumer, self._autorun_task):
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        if self._reader is not None:
            try:
                await self._reader.close()
            except Exception:  # already gone with the server
                pass
        await super().close()
        self.closed = True
        for iterator in list(self._iterators):
            iterator._put(_END)
        self.emit("closed")

    async def __aenter__(self) -> "QueueEvents":
        await self.wait_until_ready()
        return self

    def __repr__(self) -> str:
        return f"<QueueEvents {self.qualified_name} last_event_id={self.last_event_id!r}>"


def _js_string(value: Any) -> Any:
    """A field value as Node writes it to the stream (String(v); null and undefined as '')."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if isinstance(value, (str, bytes, int, float)):
        return value
    # Node would write '[object Object]' for an object; JSON text is what a reader can use.
    return codec.dumps(value, what="event field")


class QueueEventsProducer(QueueBase):
    """Publishes custom events on a queue's events stream, as Node's QueueEventsProducer.

    >>> producer = QueueEventsProducer("emails", connection="redis://127.0.0.1:6379/0")
    >>> await producer.publish_event({"eventName": "digest-sent", "count": 12})

    Every QueueEvents of the queue (Python or Node) then emits ``"digest-sent"`` with
    ``({"count": "12"}, id)`` — stream fields are strings, as in Node.
    """

    async def publish_event(self, args: Mapping[str, Any], max_events: int = 1000) -> str:
        """Add ``{"eventName": name, **fields}`` to the stream (trimmed to about ``max_events``);
        returns the new entry's id."""
        if not isinstance(args, Mapping) or "eventName" not in args:
            raise InvalidArgument(f"publish_event({args!r}) needs a dict with an 'eventName'")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 0:
            raise InvalidArgument(f"max_events={max_events!r} must be an int >= 0")
        fields: dict[str, Any] = {"event": _js_string(args["eventName"])}
        for field, value in args.items():
            if field != "eventName":
                fields[str(field)] = _js_string(value)
        await self.wait_until_ready()
        return await self.backend.publish_event(fields, max_events)


async def wait_until_finished(job: "Job", queue_events: QueueEvents, timeout: Optional[int] = None) -> Any:
    """See `Job.wait_until_finished`: the job's return value, or `JobFailed` with its reason."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise InvalidArgument(f"timeout={timeout!r} must be a number of ms >= 0 (or None: no limit)")
    if not isinstance(queue_events, QueueEvents) or queue_events.qualified_name != job.queue.qualified_name:
        raise InvalidArgument(f"queue_events={queue_events!r} must be a QueueEvents of the job's queue "
                              f"({job.queue.qualified_name})")
    job_id = str(job.id)
    if queue_events.closed or queue_events.closing:
        raise BullMQCompatError(f"cannot wait for job {job_id}: the QueueEvents is closed")
    await job.queue.wait_until_ready()
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any = None, error: Optional[BaseException] = None) -> None:
        if outcome.done():
            return
        if error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(value)

    def on_completed(args: Mapping[str, Any]) -> None:
        settle(args.get("returnvalue"))

    def on_failed(args: Mapping[str, Any]) -> None:
        settle(error=JobFailed(str(args.get("failedReason") or ""), job_id=job_id))

    def on_closed() -> None:
        settle(error=BullMQCompatError(
            f"the QueueEvents closed while waiting for job {job_id} to finish"))

    def on_queue_closing() -> None:
        settle(error=BullMQCompatError(f"the queue closed while waiting for job {job_id} to finish"))

    listeners: list[tuple[Any, str, Any]] = [
        (queue_events, f"completed:{job_id}", on_completed), (queue_events, f"failed:{job_id}", on_failed),
        (queue_events, "closed", on_closed), (job.queue, "closing", on_queue_closing)]
    for emitter, event, listener in listeners:
        emitter.on(event, listener)
    try:
        # Once the QueueEvents is listening, a finish is either already recorded (isFinished sees
        # it) or still to come (the listeners see it): none can fall in between.
        await queue_events.wait_until_ready()
        status, result = await job.queue.backend.is_finished(job_id)
        if status == 1:
            settle(_parse_json(result) if result is not None else None)
        elif status == 2:
            settle(error=JobFailed(str(result or ""), job_id=job_id))
        elif status == -1:
            settle(error=JobNotFound(str(result or f"Missing key for job {job.full_key}. isFinished"),
                                     job_id=job_id, command="isFinished"))
        if timeout:
            try:
                return await asyncio.wait_for(asyncio.shield(outcome), timeout / 1000)
            except asyncio.TimeoutError:
                if outcome.done():
                    return outcome.result()
                raise JobWaitTimeout(
                    f"Job wait {job.name} timed out before finishing, no finish notification arrived "
                    f"after {timeout}ms (id={job_id})") from None
        return await outcome
    finally:
        for emitter, event, listener in listeners:
            emitter.off(event, listener)
        if outcome.done() and not outcome.cancelled():
            outcome.exception()  # retrieved: no "exception never retrieved" warning
