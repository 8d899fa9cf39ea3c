"""Worker: the consuming side, compatible with Node BullMQ's Worker and faster than it.

Design (see ../shared/design/performance.md):
- ``concurrency`` long-lived slot tasks; each takes a job, runs the processor, and finishes
  it with moveToFinished(fetchNext) — one script call per job in steady state, no task per job.
- Hot calls go through a pipelining channel: every call made in one loop tick leaves in one
  write. Idle slots park; one waiter blocks on the queue marker (BZPOPMIN) and wakes a slot,
  and every slot that finds a job wakes two more, so a burst is picked up in a few round trips.
- Locks of all active jobs are renewed in one extendLocks call; the stalled checker runs on
  its interval; everything else (job.update_progress, logs...) uses the redis-py client.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import importlib
import inspect
import logging
import signal
import time
import uuid
from typing import Any, Awaitable, Callable, Mapping, Optional, Union

from opentelemetry.trace import SpanKind, Status, StatusCode

from bullmq_compat import _telemetry as telemetry_attrs
from bullmq_compat._backends.base import JobTransaction, NextJob, WorkerChannel, WorkerSettings
from bullmq_compat._backoff import BackoffStrategy
from bullmq_compat._batch import BatchRunner, batch_options
from bullmq_compat._cancellation import AbortController, AbortSignal
from bullmq_compat._errors import (
    DelayedError,
    InvalidArgument,
    InvalidJobData,
    QueueClosed,
    RateLimitError,
    RedisUnavailable,
    ScriptError,
    UnrecoverableError,
    WaitingChildrenError,
    is_out_of_memory,
)
from bullmq_compat._job import Job
from bullmq_compat._lock_manager import LockManager
from bullmq_compat._queue import Connection, QueueBase
from bullmq_compat._scheduler import advance_for_worker
from bullmq_compat._telemetry import operation_span
from bullmq_compat._telemetry import resolve_both as resolve_telemetry
from bullmq_compat._wire.options import normalize_job_options
from bullmq_compat._worker_locks import LockKeepingMixin

logger = logging.getLogger("bullmq_compat.worker")
#: seconds between two reports (log line, 'error' event) of Redis refusing writes for lack of memory
OOM_REPORT_EVERY = 60.0

Processor = Union[Callable[..., Any], str]


RATE_LIMIT_MESSAGE = "bullmq:rateLimitExceeded"
MAX_BLOCK_SECONDS = 10.0
MIN_BLOCK_SECONDS = 0.001


def _now_ms() -> int:
    return int(time.time() * 1000)


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be an int >= {minimum}")
    return value


def _without_address(detail: str, label: str, address: str) -> str:
    """An unavailable-error's text without its own "cannot reach <label> at <address>: " (the log line says it)."""
    for lead in (f"cannot reach {label} at {address}: ", f"could not connect to {label} at {address}: "):
        if detail.startswith(lead):
            return detail[len(lead):]
    return detail


def load_processor(path: str) -> Callable[..., Any]:
    """Import ``"pkg.module:function"``."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(f"processor={path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InvalidArgument(f"processor={path!r}: cannot import {module_name!r} ({err})") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise InvalidArgument(f"processor={path!r}: {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise InvalidArgument(f"processor={path!r} is not callable")
    return target  # type: ignore[no-any-return]


def processor_arity(fn: Callable[..., Any]) -> int:
    """How many of ``(job, token, signal)`` a processor takes: 1, 2 or 3 (``*args``: 3), as Node reads
    ``processor.length``."""
    from bullmq_compat._sandbox import _positional_arity

    return _positional_arity(fn)


class Worker(LockKeepingMixin, QueueBase):
    """Processes jobs of one queue — jobs added by Python or by Node — as Node's Worker does.

    >>> async def process(job):
    ...     return {"double": job.data["i"] * 2}
    >>> worker = Worker("emails", process, connection="redis://127.0.0.1:6379/0", concurrency=50)
    >>> worker.on("completed", lambda job, result: print(job.id, result))
    >>> await worker.run()          # until close(); or: async with worker: ...
    """

    def __init__(self, queue_name: str, processor: Optional[Processor] = None, connection: Connection = None, *,
                 name: Optional[str] = None, prefix: str = "bull", schema: Optional[str] = None,
                 migrate: bool = False, concurrency: int = 1,
                 lock_duration: int = 30000, lock_renew_time: Optional[int] = None,
                 stalled_interval: int = 30000, max_stalled_count: int = 1,
                 limiter: Optional[Mapping[str, Any]] = None, remove_on_complete: Any = None,
                 remove_on_fail: Any = None, drain_delay: float = 5, metrics: Optional[Mapping[str, Any]] = None,
                 backoff_strategy: Optional[BackoffStrategy] = None, settings: Optional[Mapping[str, Any]] = None,
                 max_started_attempts: Optional[int] = None, skip_stalled_check: bool = False,
                 skip_lock_renewal: bool = False, run_retry_delay: int = 15000, use_processes: bool = False,
                 process_pool_size: Optional[int] = None, shutdown_timeout: float = 30.0,
                 fast_path: bool = True, group_keeper: Union[bool, str] = True, group_sweep_interval: float = 1.0,
                 telemetry: Any = None, autorun: bool = False, maximum_rate_limit_delay: int = 30000,
                 metrics_port: Optional[int] = None, batch: Optional[Mapping[str, Any]] = None,
                 max_bytes: Optional[int] = None, group_affinity: Optional[bool] = None,
                 transactional: bool = False, group: Optional[Mapping[str, Any]] = None) -> None:
        """A worker of queue ``queue_name``; it takes jobs once ``await worker.run()`` (or
        ``autorun=True``) starts it. Node's WorkerOptions under Python names (docs/worker.md has
        the table); durations are in **milliseconds** unless marked seconds.

        processor: an ``async def``, a plain ``def`` (run in a thread) or ``"pkg.module:function"``;
            it takes ``(job)``, ``(job, token)`` or ``(job, token, signal)``. None: manual
            processing with `get_next_job`.
        connection, prefix: as for `Queue` (a URL, a dict of client settings or a client).
        schema, migrate: for a ``postgresql://`` connection, as for `Queue`.
        name: the worker's name, shown by ``get_workers()`` (and Node's) and stored in each job's
            ``processed_by``.
        concurrency: jobs processed at once (``worker.concurrency = n`` changes it while running).
        lock_duration: ms a job's lock lasts without renewal (default 30000).
        lock_renew_time: ms; locks are checked every ``lock_renew_time / 2`` and extended once that
            old (default ``lock_duration // 2``).
        stalled_interval: ms between two checks for stalled jobs (default 30000).
        max_stalled_count: times a job may stall and be taken back before it fails (default 1).
        limiter: ``{"max": n, "duration": ms}``: at most n jobs per duration for the queue.
        remove_on_complete, remove_on_fail: as the job options of these names, for jobs that set none.
        drain_delay: **seconds** an idle worker blocks waiting for a job before asking again (default 5).
        metrics: ``{"max_data_points": n}``: record completed/failed counts per minute (n one-minute
            points, see `MetricsTime`).
        backoff_strategy: custom backoff ``fn(attempts_made, type, err, job) -> ms`` for a job's
            ``backoff={"type": <custom>}``.
        settings: Node's form of it: ``{"backoff_strategy": fn}``.
        max_started_attempts: fail a job once it has been started more than this many times.
        skip_stalled_check, skip_lock_renewal: run no stalled checker / renew no locks.
        run_retry_delay: ms, the longest wait between two tries of a call that met a connection
            error (the waits start at 100 ms and double, up to 5 s; default 15000).
        use_processes: run the processor (a ``"pkg.module:function"`` path) in child processes.
        process_pool_size: child processes with ``use_processes`` (default: ``concurrency``).
        shutdown_timeout: **seconds** `close` waits for active jobs before cancelling them (default 30).
        fast_path: hot calls over a pipelined hiredis connection (False: redis-py only).
        group_keeper: True (or "sweep"), "stream" or False: how this worker releases the groups of
            jobs Node workers finished (docs/groups.md).
        group_sweep_interval: **seconds** between two sweeps of the group keeper (default 1).
        telemetry: True or an OpenTelemetry TracerProvider: Node's spans and metrics.
        autorun: start processing at once on the running event loop (Node's default; ours is False).
        maximum_rate_limit_delay: ms; a rate-limited worker looks again after at most this long
            (default 30000).
        metrics_port: serve Prometheus job metrics on this port (the ``metrics`` extra).
        batch: ``{"size": n, "min_size": m, "timeout": ms, "max_bytes": b, "group_affinity": bool}``:
            the processor takes up to n jobs at a time (docs/worker.md, "Batches").
        max_bytes, group_affinity: the same as the keys of ``batch`` of these names.
        transactional: PostgreSQL only. The processor gets ``job.transaction``, a psycopg
            ``AsyncConnection`` in an open transaction; what it writes there commits in the same
            transaction as the job's completion (upstream's lock-token check included), or not at
            all: rolled back when the processor raises (the job then fails or retries as usual)
            and when the job's lock was lost. docs/postgres.md, "Transactions".
        group: BullMQ Pro's group options, as Pro spells them: ``{"limit": {"max": n, "duration": ms}}``
            sets the queue's default group rate limit (`Queue.set_default_group_rate_limit`) and
            ``{"concurrency": k}`` its default group concurrency, when the worker starts (both are
            stored in the datastore: every worker, Python or Node, honours them). docs/groups.md.

        Bad values raise `InvalidArgument` naming the keyword and its rule, before anything connects.
        """
        super().__init__(queue_name, connection, prefix=prefix, schema=schema, migrate=migrate)
        self.id = str(uuid.uuid4())
        self.worker_name = name
        self._concurrency = _positive_int("concurrency", concurrency)
        self._slot_count = 0  # slot tasks alive (the concurrency setter adds or retires slots)
        self.lock_duration = _positive_int("lock_duration", lock_duration)
        self.lock_renew_time = _positive_int("lock_renew_time", lock_renew_time or self.lock_duration // 2)
        self.stalled_interval = _positive_int("stalled_interval", stalled_interval)
        self.max_stalled_count = _positive_int("max_stalled_count", max_stalled_count, 0)
        if isinstance(drain_delay, bool) or not isinstance(drain_delay, (int, float)) or drain_delay <= 0:
            raise InvalidArgument(f"drain_delay={drain_delay!r} must be a number of seconds > 0")
        self.drain_delay = float(drain_delay)
        self.limiter = self._check_limiter(limiter)
        # remove_on_* take the same forms as the job options of the same names
        keep = normalize_job_options({k: v for k, v in (("remove_on_complete", remove_on_complete),
                                                         ("remove_on_fail", remove_on_fail)) if v is not None})
        self.remove_on_complete = keep.get("removeOnComplete")
        self.remove_on_fail = keep.get("removeOnFail")
        max_points: Any = ""
        if metrics:
            max_points = _positive_int("metrics.max_data_points",
                                       metrics.get("max_data_points", metrics.get("maxDataPoints")))
        self.backoff_strategy = backoff_strategy or (settings or {}).get("backoff_strategy") or (
            settings or {}).get("backoffStrategy")
        if max_started_attempts is not None:
            _positive_int("max_started_attempts", max_started_attempts, 0)
        self.max_started_attempts = max_started_attempts
        self.skip_stalled_check = skip_stalled_check
        self.skip_lock_renewal = skip_lock_renewal
        # Node waits run_retry_delay before retrying a call that met a connection error; ours back off
        # from 0.1 s, doubling, and never wait longer than run_retry_delay between two tries
        self.run_retry_delay = _positive_int("run_retry_delay", run_retry_delay)
        # a rate-limited worker looks again at least this often (ms), so delayed jobs get promoted
        self.maximum_rate_limit_delay = _positive_int("maximum_rate_limit_delay", maximum_rate_limit_delay)
        self.shutdown_timeout = shutdown_timeout
        self.fast_path = fast_path
        # spans (None: none); the meter of Node's MetricNames, fed by the jobs it finishes (None: none)
        self.telemetry, self.meter = resolve_telemetry(telemetry)
        # Prometheus job metrics on this port (one server per process, see _prometheus); None: off
        self._prometheus: Any = None
        if metrics_port is not None:
            from bullmq_compat._prometheus import WorkerMetrics

            self._prometheus = WorkerMetrics(self.name, metrics_port)
        # releases groups whose jobs Node workers finished (see _groups.py); ours release directly
        # group_keeper=True sweeps the queue's groups every group_sweep_interval; "stream" also follows
        # the events stream (releases within milliseconds, at some CPU per job); False: none
        if group_keeper not in (True, False, "stream", "sweep"):
            raise InvalidArgument(f"group_keeper={group_keeper!r} must be True, False, 'sweep' or 'stream'")
        make_keeper = getattr(self.backend, "group_keeper", None)  # the Redis gate's (groups are Redis-only)
        self._keeper: Any = (
            make_keeper(sweep_interval=group_sweep_interval, follow_stream=group_keeper == "stream")
            if group_keeper and make_keeper is not None else None)
        self.group_options = self._check_group_options(group)
        self.use_processes = use_processes
        # batch={"size": n, ...}: the processor takes up to n jobs at a time (_batch.py, docs/worker.md)
        self.batch = batch_options(batch, max_bytes, group_affinity)
        if self.batch is not None and use_processes:
            raise InvalidArgument("batch= is not supported with use_processes=True (a sandboxed processor takes "
                                  "one job): run the batch processor in the worker's process")
        self._batcher = BatchRunner(self, self.batch) if self.batch is not None else None
        # transactional=True (PostgreSQL): the processor's writes on job.transaction commit with the completion
        self.transactional = bool(transactional)
        if self.transactional:
            if not getattr(self.backend, "joins_transactions", False):
                raise InvalidArgument(f"transactional=True needs a PostgreSQL queue: {self.backend.description} is on "
                                      f"{self.backend.label}, where a processor's writes cannot join the completion")
            if use_processes or self.batch is not None:
                raise InvalidArgument("transactional=True is not supported with use_processes=True or batch= (the "
                                      "transaction is one job's, in the worker's process)")
        if process_pool_size is not None:
            _positive_int("process_pool_size", process_pool_size)
        self._process_pool_size_option = process_pool_size  # None: as many children as concurrency
        self._processor_path: Optional[str] = None
        self.processor: Optional[Callable[..., Any]] = None
        if isinstance(processor, str):
            self._processor_path = processor
            self.processor = load_processor(processor)
        elif processor is not None:
            if not callable(processor):
                raise InvalidArgument(f"processor={processor!r} must be a callable or 'pkg.module:function'")
            if use_processes:
                raise InvalidArgument("use_processes=True needs processor='pkg.module:function' (a path the "
                                      "child processes can import), not a function object")
            self.processor = processor
        self._settings = WorkerSettings(
            name=name, lock_duration=self.lock_duration, limiter=self.limiter,
            remove_on_complete=self.remove_on_complete, remove_on_fail=self.remove_on_fail,
            max_metrics_size=max_points, max_stalled_count=self.max_stalled_count,
            stalled_interval=self.stalled_interval, extra={"concurrency": self.concurrency})
        self._channel: Optional[WorkerChannel] = None
        self._channel_lock = asyncio.Lock()
        self._token_seq = 0
        self.lock_manager = LockManager(self, lock_renew_time=self.lock_renew_time, lock_duration=self.lock_duration,
                                        worker_id=self.id, worker_name=name)
        self._active = self.lock_manager.tracked_jobs  # job id -> [token, ts, AbortController or None]
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waiter_wanted = asyncio.Event()
        self._drained = False
        self._drain_reported = False  # 'drained' once per empty spell, as Node (not per block timeout)
        self._limit_until = 0
        self._block_until = 0
        self._waiting_until = 0  # when the marker waiter's current BZPOPMIN times out (ms); 0: not blocked
        self._poking = 0  # the due time of the delay marker being added (_poke_marker); 0: none
        self._paused = False
        self._running = False
        self._closed = asyncio.Event()
        self._closing_event = asyncio.Event()  # set by close(): wakes every _sleep at once
        self._tasks: list[asyncio.Task[Any]] = []
        self._slots: list[asyncio.Task[Any]] = []
        self._connection_down = False
        self._had_connection = False  # a call went through once: later trouble is "lost", not "cannot reach"
        self._retry_pause = 0.1
        self._oom_reported = -OOM_REPORT_EVERY  # time.monotonic() of the last OOM refusal reported
        self._thread_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._child_pool: Any = None  # _sandbox.ChildPool, made on the first job with use_processes
        self._arity = processor_arity(self.processor) if self.processor is not None else 1
        # as Node: a signal (an AbortController per job) only for a processor that takes one; sandboxed always
        self._wants_signal = self._arity >= 3 or use_processes
        self._is_async = bool(self.processor and inspect.iscoroutinefunction(self.processor))
        self._calls_directly = self._is_async and self._arity == 1 and not use_processes
        self._run_task: Optional[asyncio.Task[None]] = None
        self._autorun_task: Optional[asyncio.Task[None]] = None
        self.autorun = bool(autorun)
        # run() was called (or autorun asked for): else closing or dropping it warns (`_warn_never_run`)
        self._ran = bool(autorun)
        if autorun:
            if self.processor is None:
                raise InvalidArgument("autorun=True needs a processor: a worker without one is for manual "
                                      "processing (get_next_job)")
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise InvalidArgument("autorun=True needs a running event loop: create the Worker in async code, "
                                      "or pass autorun=False and await worker.run()") from None
            self._autorun_task = loop.create_task(self._autorun())

    @staticmethod
    def _check_group_options(group: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        from bullmq_compat._groups import check_concurrency, check_group_rate_limit_option

        if group is None:
            return {}
        if not isinstance(group, Mapping) or not set(group) <= {"limit", "concurrency"}:
            raise InvalidArgument(f"group={group!r} must be {{'limit': {{'max': n, 'duration': ms}}}} and/or "
                                  "{'concurrency': k} (BullMQ Pro's worker group options)")
        checked: dict[str, Any] = {}
        if "limit" in group:
            checked["limit"] = check_group_rate_limit_option(group["limit"], "group limit")
        if "concurrency" in group:
            try:
                checked["concurrency"] = check_concurrency(group["concurrency"])
            except InvalidArgument as err:
                raise InvalidArgument(f"group {err}") from None
        return checked

    async def _apply_group_options(self) -> None:
        """Store the ``group=`` options (the queue's group defaults) where every worker reads them."""
        if not self.group_options:
            return
        gate = self.backend.groups()
        await gate.ready()
        if "limit" in self.group_options:
            await gate.set_rate_limit(None, self.group_options["limit"])
        if "concurrency" in self.group_options:
            await gate.set_concurrency(None, self.group_options["concurrency"])

    async def rate_limit_group(self, job: Job, ms: int) -> None:
        """From a processor: the job's group starts no job for ``ms`` (BullMQ Pro's ``rateLimitGroup``),
        other groups go on. The job leaves active and waits its turn again (in upstream's delayed set,
        due in ``ms``, first of its group); the worker does not finish it, so the processor may
        return or raise `RateLimitError` after this call, as Pro's asks."""
        _positive_int("ms", ms)
        if job.group_id is None:
            raise InvalidArgument(f"job {job.id}: rate_limit_group needs a group job (this one has no group)")
        if not job.token:
            raise InvalidArgument(f"job {job.id}: rate_limit_group needs an active job of this worker (no lock token)")
        await self.wait_until_ready()
        await self.backend.groups().rate_limit_job(str(job.id), job.token, ms)
        job._handed_back = True
        tracked = self.lock_manager.tracked_jobs.get(str(job.id))
        if tracked is not None and tracked[0] == job.token:  # its lock is gone: no renewal to try
            self.lock_manager.untrack_job(str(job.id))

    @staticmethod
    def _check_limiter(limiter: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
        if limiter is None:
            return None
        if not isinstance(limiter, Mapping) or set(limiter) - {"max", "duration"}:
            raise InvalidArgument(f"limiter={limiter!r} must be {{'max': n, 'duration': ms}}")
        return {"max": _positive_int("limiter.max", limiter.get("max")),
                "duration": _positive_int("limiter.duration", limiter.get("duration"))}

    @property
    def concurrency(self) -> int:
        """How many jobs this worker runs at once (Node's ``concurrency``); settable while it runs."""
        return self._concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        """As Node's setter: takes effect at once on a running worker (more slots start; extra ones
        stop after their current job)."""
        self._concurrency = _positive_int("concurrency", value)
        if self._thread_pool is not None:  # sized to concurrency: the next sync job gets a new pool
            self._thread_pool.shutdown(wait=False)
            self._thread_pool = None
        if self._running and not self.closing:
            while self._slot_count < self._concurrency:
                self._start_slot()
            if self._slot_count > self._concurrency:
                self._wake_all()  # parked extra slots retire

    def _start_slot(self) -> None:
        self._slot_count += 1
        self._slots.append(asyncio.ensure_future(self._batcher.slot() if self._batcher is not None else self._slot()))

    # -- cancellation -------------------------------------------------------------------------
    def cancel_job(self, job_id: str, reason: Any = None) -> bool:
        """Abort the signal of active job ``job_id`` (Node: ``cancelJob``). False when this worker is not
        processing that job or its processor takes no signal. The processor decides what happens:
        raise to fail the attempt (retried while attempts remain), `UnrecoverableError` to stop retries."""
        return self.lock_manager.cancel_job(str(job_id), reason)

    def cancel_all_jobs(self, reason: Any = None) -> None:
        """Abort the signals of every job this worker is processing (Node: ``cancelAllJobs``)."""
        self.lock_manager.cancel_all_jobs(reason)

    # -- life cycle -----------------------------------------------------------------------------
    def _transient(self, err: BaseException) -> bool:
        return self.backend.is_transient(err)

    async def _ensure_channel(self) -> WorkerChannel:
        if self._channel is None:
            async with self._channel_lock:
                if self._channel is None:
                    await self.wait_until_ready()
                    suffix = f":w:{self.worker_name}" if self.worker_name else ""
                    self._channel = await self.backend.open_worker_channel(
                        self._settings, self.client_name(suffix), fast=self.fast_path)
        return self._channel

    async def worker_channel(self) -> WorkerChannel:
        """The connection this worker's hot calls go through (opened on first use), for manual
        processing helpers."""
        return await self._ensure_channel()

    @property
    def running(self) -> bool:
        """True while `run` is processing jobs (Node's ``running``)."""
        return self._running

    def is_running(self) -> bool:
        """True while `run` is processing jobs (Node's ``isRunning()``)."""
        return self._running

    def is_paused(self) -> bool:
        """True after `pause` until `resume` (Node's ``isPaused()``)."""
        return self._paused

    async def run(self, *, handle_signals: bool = True) -> None:
        """Process jobs until `close()` (or SIGTERM/SIGINT, which close gracefully)."""
        if self.processor is None:
            raise InvalidArgument("this worker has no processor: pass one to Worker(...) to run it")
        self._ran = True
        current = asyncio.current_task()
        autorun = self._autorun_task
        if autorun is not None and not autorun.done() and autorun is not current:
            await asyncio.wait([autorun])  # started by autorun=True: wait for that run (close() may cancel it)
            return
        if self._running:
            raise InvalidArgument("worker is already running")
        if self.closing or self._closed.is_set():  # closed (e.g. before autorun started): as Node, nothing to run
            return
        self._running = True
        self.closing = False
        self._closing_event.clear()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if handle_signals:  # before connecting: SIGTERM while the server is away stops us gracefully too
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass  # not the main thread, or no signal support: the caller closes us
        try:
            await self._run_connected()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._running = False

    async def _run_connected(self) -> None:
        while True:  # Redis may not be up yet: wait for it (logged once), as Node's worker does
            try:
                await self._ensure_channel()
                break
            except QueueClosed:  # close() came while we were still connecting: a clean stop, as Node's
                await self._closed.wait()
                return
            except (RedisUnavailable, *self.backend.transient_errors) as err:  # type: ignore[misc]
                if self.closing:
                    await self._closed.wait()  # close() (a signal's) finishes before we return
                    return
                await self._sleep(self._connection_trouble(err))
                if self.closing:
                    await self._closed.wait()
                    return
            except Exception:
                if self.closing:  # close() tore the connection down mid-handshake: redis-py may raise
                    await self._closed.wait()  # anything then (an AttributeError on its gone writer)
                    return
                raise
        self._connection_ok()
        await self._apply_group_options()
        self._tasks = [asyncio.ensure_future(self._marker_waiter())]
        if not self.skip_lock_renewal:
            self.lock_manager.start()
        if not self.skip_stalled_check:
            self._tasks.append(asyncio.ensure_future(self._stalled_checker()))
        if self._keeper is not None:
            self._tasks.append(self._keeper.start())
        self._slots = []
        self._slot_count = 0
        for _ in range(self._concurrency):
            self._start_slot()
        self.emit("ready")
        await self._closed.wait()

    async def _autorun(self) -> None:
        await asyncio.sleep(0)  # let the constructor's caller add listeners first ('ready', 'error')
        try:
            await self.run(handle_signals=False)
        except Exception as err:  # as Node's autorun: run()'s error goes to the 'error' event
            self.emit("error", err)

    def _on_signal(self, sig: signal.Signals) -> None:
        logger.info("worker %s got %s: finishing active jobs, then stopping", self.name, signal.Signals(sig).name)
        asyncio.ensure_future(self.close())

    def _warn_never_run(self, what: str) -> None:
        """Say so when a worker with a processor ends without having run: Node's Worker starts on
        construction, ours on ``run()`` (or ``autorun=True``), so a port from Node can forget it."""
        if self._ran or self.processor is None:
            return
        self._ran = True  # once: a close and then the garbage collector do not both say it
        logger.warning("worker for queue %r was %s without having run: call await worker.run() or pass "
                       "autorun=True (Node's Worker starts on construction)", self.name, what)

    def __del__(self) -> None:
        # no event loop here (the loop may be gone): only the flags and a log line
        try:
            if not getattr(self, "_ran", True):
                self._warn_never_run("garbage-collected")
        except Exception:  # interpreter shutdown: logging may be half torn down
            pass

    async def close(self, force: bool = False) -> None:
        """Stop taking jobs; wait for active ones to finish (unless ``force``), then disconnect."""
        self._warn_never_run("closed")
        if self._closed.is_set() or (self.closing and not force):
            await self._closed.wait() if self._running else None
            return
        if self.telemetry is not None:
            with self._span("close", {telemetry_attrs.WORKER_FORCE_CLOSE: force}):
                return await self._close(force)
        await self._close(force)

    def _span(self, operation: str, attributes: Mapping[str, Any]) -> Any:
        """Node's worker span ``"<operation> <queue>"`` (INTERNAL) with the worker's id and name."""
        named = {telemetry_attrs.WORKER_ID: self.id, **(
            {telemetry_attrs.WORKER_NAME: self.worker_name} if self.worker_name is not None else {})}
        return operation_span(self.telemetry, self.name, operation, {**named, **attributes})

    async def _close(self, force: bool) -> None:
        self.closing = True
        self._closing_event.set()
        self.emit("closing", "closing queue")
        self._wake_all()
        self._waiter_wanted.set()
        if self._slots:
            if force:
                for task in self._slots:
                    task.cancel()
            done, pending = await asyncio.wait(self._slots, timeout=None if force else self.shutdown_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self.lock_manager.close()
        if self._keeper is not None:
            await self._keeper.close()
        for task in self._tasks:
            task.cancel()
        if self._channel is not None:
            await self._channel.close()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self._thread_pool is not None:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)
        if self._child_pool is not None:
            await self._child_pool.close()
        await super().close()
        self._closed.set()
        self.emit("closed")

    async def __aenter__(self) -> "Worker":
        self._run_task = asyncio.ensure_future(self.run(handle_signals=False))
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
        task = self._run_task
        if task is not None:
            await task

    async def pause(self, do_not_wait_active: bool = False) -> None:
        """Stop this worker taking new jobs (other workers go on); active jobs finish unless told not to wait."""
        with self._span("pause", {telemetry_attrs.WORKER_DO_NOT_WAIT_ACTIVE: do_not_wait_active}):
            self._paused = True
            self._wake_all()
            if not do_not_wait_active:
                while self._active:
                    await asyncio.sleep(0.01)
            self.emit("paused")

    def resume(self) -> None:
        """Take jobs again after `pause` (Node's ``resume``); emits ``resumed``."""
        if self._paused:
            with self._span("resume", {}):
                self._paused = False
                self._drained = False
                self._wake_all()
                self.emit("resumed")

    async def rate_limit(self, expire_time_ms: int) -> None:
        """Rate-limit the whole queue for ``expire_time_ms``; then raise `RateLimitError` from the processor."""
        _positive_int("expire_time_ms", expire_time_ms)
        # Node's span has the worker's id but not its name
        with operation_span(self.telemetry, self.name, "rateLimit", {
                telemetry_attrs.WORKER_ID: self.id, telemetry_attrs.WORKER_RATE_LIMIT: expire_time_ms}):
            await self.wait_until_ready()
            # Node stores Number.MAX_SAFE_INTEGER: above any limiter max, so every worker (and the
            # queue's global rate limit) sees the queue as limited until the key expires
            await self.backend.set_rate_limit(expire_time_ms)

    # -- fetching -----------------------------------------------------------------------------------
    def _next_token(self) -> str:
        self._token_seq += 1
        return f"{self.id}:{self._token_seq}"

    def _wake_one(self) -> bool:
        while self._idle:
            fut = self._idle.popleft()
            if not fut.done():
                fut.set_result(None)
                return True
        return False

    def _wake_all(self) -> None:
        while self._wake_one():
            pass

    async def _park(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(fut)
        self._waiter_wanted.set()
        await fut

    def _update_delays(self, limit_delay: int, delay_until: int) -> None:
        self._limit_until = _now_ms() + limit_delay if limit_delay > 0 else 0
        self._block_until = max(delay_until, 0)
        if 0 < delay_until < self._waiting_until and not 0 < self._poking <= delay_until:
            # a slot learnt of a delayed job due before the marker waiter's BZPOPMIN ends: wake it
            # with that job's delay marker (as upstream adds them), else the job waits for drain_delay.
            # One poke in flight per due time (not one per slot: each would take a pooled connection)
            self._poking = delay_until
            asyncio.ensure_future(self._poke_marker(delay_until))

    async def _poke_marker(self, delay_until: int) -> None:
        try:
            if self._channel is not None:
                await self._channel.wake_at(delay_until)
        except Exception:  # the waiter's own timeout still comes
            pass
        finally:
            if self._poking == delay_until:
                self._poking = 0

    def _job_from_reply(self, reply: Optional[NextJob], token: str) -> Optional[Job]:
        raw, job_id, limit_delay, delay_until = reply or (None, None, 0, 0)
        if limit_delay or delay_until or self._limit_until or self._block_until:  # else all stay 0
            self._update_delays(limit_delay, delay_until)
        if raw is None or job_id is None:
            if not self._drained:
                self._drained = True
                if not self._drain_reported:
                    self._drain_reported = True
                    self.emit("drained")
            return None
        self._drained = False
        self._drain_reported = False
        job = Job.from_raw(self, job_id, raw)
        job.token = token
        if self._idle:  # a job found means more may wait: bring two more idle slots in (the ramp)
            self._wake_one()
            self._wake_one()
        self.emit("active", job, "waiting")
        return job

    def _out_of_memory(self, err: BaseException) -> float:
        """Redis answers but refuses writes (its OOM reply: maxmemory, noeviction). Calls that do not
        write first (completions) still go through meanwhile, so no success marks its end: it is
        reported at most every OOM_REPORT_EVERY seconds, and each refused call is sent again after 1 s."""
        now = time.monotonic()
        if now - self._oom_reported >= OOM_REPORT_EVERY:
            self._oom_reported = now
            logger.warning("worker %s: %s refuses writes, out of memory (%s: maxmemory reached, with "
                           "maxmemory-policy noeviction?); retrying every second", self.name, self.backend.label, err)
            self.emit("error", err)
        return min(1.0, self.run_retry_delay / 1000)

    def _connection_trouble(self, err: BaseException) -> float:
        if is_out_of_memory(err):  # connected, but refused: not "lost"
            return self._out_of_memory(err)
        if not self._connection_down:
            self._connection_down = True
            label = self.backend.label
            if self._had_connection:
                logger.warning("worker %s lost %s (%s); retrying with back-off", self.name, label, err)
            else:  # never connected: not "lost", the address (or the server) is wrong
                address = self.backend.address
                logger.warning("worker for queue %r cannot reach %s at %s (%s); retrying with back-off",
                               self.name, label, address, _without_address(str(err), label, address))
            self.emit("error", err)
        pause = min(self._retry_pause, self.run_retry_delay / 1000)
        self._retry_pause = min(self._retry_pause * 2, 5.0, self.run_retry_delay / 1000)
        return pause

    def _connection_ok(self) -> None:
        if self._connection_down:
            self._connection_down = False
            if self._had_connection:
                logger.info("worker %s reconnected to %s", self.name, self.backend.label)
            else:
                logger.info("worker %s reached %s at %s", self.name, self.backend.label, self.backend.address)
        self._had_connection = True
        self._retry_pause = 0.1

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the worker closes."""
        if self.closing or seconds <= 0:
            return
        try:
            await asyncio.wait_for(self._closing_event.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _fetch(self) -> Optional[Job]:
        """One moveToActive for this slot; parks the slot while the queue is drained."""
        now = _now_ms()
        if self._limit_until > now:  # as Node: at most maximum_rate_limit_delay, then look again
            await self._sleep(min(self._limit_until - now, self.maximum_rate_limit_delay) / 1000)
            self._drained = False
        if self._drained or self._paused:
            await self._park()
        if self.closing or self._paused or self._slot_count > self._concurrency:
            return None
        token = self._next_token()
        try:
            reply = await self._channel.move_to_active(token, _now_ms())  # type: ignore[union-attr]
        except Exception as err:
            if not self._transient(err):
                raise
            await self._sleep(self._connection_trouble(err))
            return None
        self._connection_ok()
        return self._job_from_reply(reply, token)

    async def _marker_waiter(self) -> None:
        """Block on the queue marker while slots are idle; each marker wakes one slot."""
        channel = self._channel
        assert channel is not None
        while not self.closing:
            if not self._idle or self._paused:
                self._waiter_wanted.clear()
                await self._waiter_wanted.wait()
                continue
            timeout = self._block_timeout()
            if timeout > 0:
                self._waiting_until = _now_ms() + int(timeout * 1000)
                try:
                    marker = await channel.wait_for_job(timeout)
                except Exception as err:  # e.g. NOREPLICAS in a failover: never let the waiter die
                    if self.closing:
                        return
                    await self._sleep(self._connection_trouble(err))
                    continue
                finally:
                    self._waiting_until = 0
                self._connection_ok()
                if marker is not None and marker[1] > _now_ms() + 1:
                    # a delayed job's marker: wait until it is due (or another marker)
                    self._block_until = int(marker[1])
                    continue
            self._block_until = 0
            self._drained = False
            self._wake_one()

    def _block_timeout(self) -> float:
        if self._block_until:
            seconds = (self._block_until - _now_ms()) / 1000
            if seconds <= 0:
                return 0
            return min(max(seconds, MIN_BLOCK_SECONDS), MAX_BLOCK_SECONDS)
        return max(self.drain_delay, MIN_BLOCK_SECONDS)

    async def _slot(self) -> None:
        job: Optional[Job] = None
        while True:
            try:
                if job is None:
                    if self.closing:
                        return
                    if self._slot_count > self._concurrency:  # concurrency was lowered: retire this slot
                        self._slot_count -= 1
                        return
                    job = await self._fetch()
                    continue
                if job.repeat_job_key is None and self.telemetry is None:  # _process's usual case, one frame less
                    job = await self._process_plain(job)
                else:
                    job = await self._process(job)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # never let a slot die: report and carry on
                job = None
                self.emit("error", err)
                await self._sleep(1.0)

    # -- processing ---------------------------------------------------------------------------------
    async def _invoke(self, job: Job, token: str, signal: Optional[AbortSignal]) -> Any:
        processor = self.processor
        assert processor is not None
        if self.use_processes:
            return await self._invoke_in_process(job, token, signal)
        arity = self._arity
        args = (job,) if arity == 1 else (job, token) if arity == 2 else (job, token, signal)
        if self._is_async:
            return await processor(*args)
        if self._thread_pool is None:
            self._thread_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._concurrency, thread_name_prefix=f"bullmq-{self.name}")
        result = await asyncio.get_running_loop().run_in_executor(self._thread_pool, lambda: processor(*args))
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _invoke_in_process(self, job: Job, token: str, signal: Optional[AbortSignal]) -> Any:
        from bullmq_compat._sandbox import ChildPool, run_sandboxed

        if self._child_pool is None:
            size = self._process_pool_size_option
            self._child_pool = ChildPool(self._processor_path or "",
                                         (lambda: size) if size else (lambda: self._concurrency))
        return await run_sandboxed(self._child_pool, job, token, signal)

    async def _process(self, job: Job) -> Optional[Job]:
        """Run the processor on ``job`` and finish it; returns the next job when fetched with it."""
        if job.repeat_job_key is not None:  # a job scheduler's job: make its next one, as Node
            await advance_for_worker(self, job)
        if self.telemetry is not None:
            return await self._process_traced(job)
        return await self._process_plain(job)

    async def _process_traced(self, job: Job) -> Optional[Job]:
        """The consumer span ``process <queue>``, child of the producer's span stored in opts.tm."""
        assert self.telemetry is not None
        tm = (job.opts.get("telemetry") or {}).get("metadata")
        with self.telemetry.span(SpanKind.CONSUMER, self.name, "process", self.name, parent_metadata=tm,
                                 attributes={telemetry_attrs.WORKER_ID: self.id,
                                             telemetry_attrs.WORKER_NAME: self.worker_name or "",
                                             telemetry_attrs.JOB_ID: str(job.id),
                                             telemetry_attrs.JOB_NAME: job.name,
                                             telemetry_attrs.MESSAGING_MESSAGE_ID: str(job.id)}) as (span, _):
            next_job = await self._process_plain(job)
            span.set_attribute(telemetry_attrs.JOB_ATTEMPTS_MADE, job.attempts_made)
            if job.error is not None:  # this attempt failed (retried or for good)
                span.add_event("job failed", {telemetry_attrs.JOB_FAILED_REASON: job.failed_reason or ""})
                span.set_status(Status(StatusCode.ERROR, job.failed_reason or ""))
            return next_job

    async def _process_plain(self, job: Job) -> Optional[Job]:
        token = job.token or ""
        job_id = str(job.id)
        controller: Optional[AbortController] = self.lock_manager.track_job(
            job_id, token, _now_ms(), self._wants_signal)
        tx: Optional[JobTransaction] = None
        try:
            if self.transactional:
                tx = await self._begin_transaction(job)
            if job.parse_error:
                raise UnrecoverableError(f"job {job.id} cannot be processed: {job.parse_error}")
            if job.deferred_failure:  # e.g. "job stalled more than allowable limit", as Node
                raise UnrecoverableError(job.deferred_failure)
            if self.max_started_attempts is not None and self.max_started_attempts < job.attempts_started:
                raise UnrecoverableError("job started more than allowable limit")
            if self._calls_directly:  # `async def process(job)`, in this process: _invoke's frame saved
                result = await self.processor(job)  # type: ignore[misc]
            else:
                result = await self._invoke(job, token, controller.signal if controller is not None else None)
        except BaseException as err:
            self._active.pop(job_id, None)
            if tx is not None:  # the processor's writes are rolled back; the job fails in a transaction of its own
                await self._end_transaction(job, tx)
            if not isinstance(err, Exception):
                raise
            return await self._handle_failed(job, err, token)
        self._active.pop(job_id, None)
        if job._handed_back:  # rate_limit_group: the job went back to wait its turn
            if tx is not None:
                await self._end_transaction(job, tx)
            return None
        if tx is not None:
            return await self._complete_in_transaction(job, result, token, tx)
        # completed: here rather than in a method of its own (a coroutine less per job)
        fetch_next = self._fetch_next()
        try:
            reply = await job.move_to_completed(result, token, fetch_next)
        except InvalidJobData as err:
            return await self._handle_failed(job, err, token)
        except ScriptError as err:
            self.emit("error", err)
            return None
        self.emit("completed", job, result, "active")
        if self._prometheus is not None:
            self._prometheus.completed(job)
        return self._job_from_reply(reply, token) if fetch_next else None

    async def _begin_transaction(self, job: Job) -> JobTransaction:
        channel = self._channel if self._channel is not None else await self._ensure_channel()
        tx = await channel.begin_transaction()
        job.transaction = tx.connection
        return tx

    async def _end_transaction(self, job: Job, tx: JobTransaction) -> None:
        job.transaction = None
        with contextlib.suppress(Exception):  # a broken session is discarded by the pool
            await tx.close()

    async def _complete_in_transaction(self, job: Job, result: Any, token: str, tx: JobTransaction) -> Optional[Job]:
        """Complete ``job`` in its processor's transaction: both commit, or neither. A refusal (its lock
        was lost: the job runs elsewhere) rolls the processor's writes back and is reported as an
        'error'; a transaction that cannot commit (the processor left it failed, the connection broke)
        fails the attempt as a processor error would."""
        fetch_next = self._fetch_next()
        try:
            reply = await job.move_to_completed(result, token, fetch_next, transaction=tx)
        except ScriptError as err:
            await self._end_transaction(job, tx)
            self.emit("error", err)
            return None
        except Exception as err:
            await self._end_transaction(job, tx)
            return await self._handle_failed(job, err, token)
        await self._end_transaction(job, tx)
        self.emit("completed", job, result, "active")
        if self._prometheus is not None:
            self._prometheus.completed(job)
        return self._job_from_reply(reply, token) if fetch_next else None

    async def finishing(self, send: Callable[[], Awaitable[Any]], failed: Optional[Exception] = None) -> Any:
        """A finishing call: sent again through connection trouble, so a finished job is not left active
        (``failed``: what its first attempt, made by the caller, raised)."""
        while True:
            if failed is not None:
                if self._closed.is_set() or not self._transient(failed):
                    raise failed
                await asyncio.sleep(self._connection_trouble(failed))
            try:
                reply = await send()
            except Exception as err:
                failed = err
                continue
            self._connection_ok()
            return reply

    def _fetch_next(self) -> bool:
        return not (self.closing or self._paused or self._slot_count > self._concurrency)

    async def _handle_failed(self, job: Job, err: Exception, token: str, *,
                             fetch_next: Optional[bool] = None) -> Optional[Job]:
        try:
            if job._handed_back:  # rate_limit_group moved it already (whatever the processor raised after)
                return None
            if isinstance(err, RateLimitError) or str(err) == RATE_LIMIT_MESSAGE:
                ttl = await job.move_to_wait(token)
                if ttl > 0:
                    self._limit_until = _now_ms() + ttl
                return None
            if isinstance(err, (DelayedError, WaitingChildrenError)) or type(err).__name__ in (
                    "DelayedError", "WaitingChildrenError", "WaitingError"):
                return None
            fetch_next = self._fetch_next() if fetch_next is None else fetch_next
            reply = await job.move_to_failed(err, token, fetch_next)
        except ScriptError as script_err:
            self.emit("error", script_err)
            return None
        self.emit("failed", job, err, "active")
        if self._prometheus is not None:
            self._prometheus.failed(job)
        return self._job_from_reply(reply, token) if fetch_next and reply is not None else None

    # -- manual processing ---------------------------------------------------------------------------
    async def get_next_job(self, token: str, block: bool = True) -> Optional[Job]:
        """Take the next job yourself (no processor): finish it with ``job.move_to_completed(v, token)``
        or ``job.move_to_failed(err, token)``; renew with ``job.extend_lock(token, ms)``."""
        channel = await self._ensure_channel()
        job = self._job_from_reply(await channel.move_to_active(token, _now_ms()), token)
        if job is None and block and not self.closing:
            await channel.wait_for_job(self._block_timeout() or MIN_BLOCK_SECONDS)
            job = self._job_from_reply(await channel.move_to_active(token, _now_ms()), token)
        if job is not None and job.repeat_job_key is not None:
            await advance_for_worker(self, job)
        return job

    async def start_stalled_check(self) -> list[str]:
        """Run the stalled-jobs check once now; returns the ids moved back to waiting."""
        channel = await self._ensure_channel()
        stalled = await channel.move_stalled_jobs_to_wait(_now_ms())
        for job_id in stalled:
            self.emit("stalled", job_id, "active")
        return list(stalled)

    def __repr__(self) -> str:
        return f"<Worker {self.name} id={self.id} concurrency={self._concurrency}>"
