"""Prometheus metrics (``pip install 'bullmq-compat[metrics]'``, see docs/metrics.md).

Two sources, each served by ``prometheus_client``'s HTTP server:

* `QueueCollector`, behind ``bullmq-compat metrics``: a custom collector that reads the queues at
  every scrape (one pipelined read per queue on Redis), giving Node's ``exportPrometheusMetrics``
  series (``bullmq_job_count``, ``bullmq_job_completed_total``, ``bullmq_job_failed_total``) and
  ours (``bullmq_workers``, ``bullmq_oldest_waiting_seconds``, ``bullmq_queue_up``, ``bullmq_up``,
  ``bullmq_scrape_errors_total``, ``bullmq_scrape_duration_seconds``). A datastore error is a 0 on
  the ``up`` gauges, never a failed scrape.
* `WorkerMetrics`, the hook of ``Worker(metrics_port=...)``: per finished attempt, the histogram
  ``bullmq_job_duration_seconds{queue,name,status}`` and the counters
  ``bullmq_worker_jobs_completed_total`` / ``bullmq_worker_jobs_failed_total{queue,name}``. One
  registry and one HTTP server per process, whatever the number of workers (`serve_worker_metrics`,
  `stop_worker_metrics`, `worker_metrics_port`, `worker_metrics_registry`: exported by ``bullmq_compat``).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Optional, Sequence

from bullmq_compat._errors import InvalidArgument, MetricsUnavailable

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.metrics_core import Metric

    from bullmq_compat._job import Job
    from bullmq_compat._queue import Queue

EXTRA_HINT = "pip install 'bullmq-compat[metrics]'"

#: buckets of ``bullmq_job_duration_seconds`` (seconds): 5 ms to 10 min
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def prometheus_client() -> ModuleType:
    """The ``prometheus_client`` module, or a `MetricsUnavailable` naming the extra to install."""
    try:
        import prometheus_client as client
    except ImportError:
        raise MetricsUnavailable(f"Prometheus metrics need the prometheus_client package: {EXTRA_HINT}") from None
    return client


def check_port(what: str, port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"{what}={port!r} must be a TCP port, an int from 0 (any free port) to 65535")
    return port


def _listen(port: int, host: str, registry: "CollectorRegistry") -> tuple[Any, threading.Thread]:
    """prometheus_client's HTTP server for ``registry`` on ``host:port``, in a daemon thread."""
    client = prometheus_client()
    try:
        return client.start_http_server(port, addr=host, registry=registry)  # type: ignore[no-any-return]
    except OSError as err:
        raise InvalidArgument(f"cannot serve metrics on {host}:{port}: {err.strerror or err}") from None


def _stop(server: Any, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(5)


# -- the endpoint of `bullmq-compat metrics` ---------------------------------------------------------


@dataclass
class QueueReading:
    """One queue's figures at one scrape (None: the read failed)."""

    name: str
    counts: dict[str, int] = field(default_factory=dict)
    completed_total: int = 0
    failed_total: int = 0
    workers: int = 0
    oldest_waiting_seconds: float = 0.0
    error: Optional[str] = None


@dataclass
class Scrape:
    queues: list[QueueReading]
    discovery_error: Optional[str] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.discovery_error is None and all(q.error is None for q in self.queues)


def oldest_waiting_seconds(jobs: Iterable[dict[str, str]], now_ms: int) -> float:
    """The age (now - timestamp, in seconds, never negative) of the oldest of ``jobs``; 0 without any."""
    stamps = []
    for fields in jobs:
        try:
            stamps.append(int(float(fields.get("timestamp") or "")))
        except ValueError:
            continue
    return max(0.0, (now_ms - min(stamps)) / 1000) if stamps else 0.0


class QueueReader:
    """Reads queues for scrapes, on the event loop that owns their connections: the named ones, or
    (``names=None``) those ``discover()`` finds at each scrape (new queues appear, gone ones are closed)."""

    def __init__(self, open_queue: Callable[[str], "Queue"], names: Optional[Sequence[str]] = None,
                 discover: Optional[Callable[[], Awaitable[list[str]]]] = None,
                 describe_error: Callable[[BaseException], str] = str, discovery_interval: float = 0.0) -> None:
        if names is None and discover is None:
            raise InvalidArgument("QueueReader needs queue names or a discover() coroutine function")
        self._open_queue, self._names, self._discover = open_queue, list(names or []), discover
        self._describe_error = describe_error
        self._queues: dict[str, "Queue"] = {}
        # seconds between two discoveries (0: at every scrape); the queues found last are read meanwhile
        self._discovery_interval = discovery_interval
        self._discovered: Optional[list[str]] = None
        self._discovered_at = 0.0

    async def read(self) -> Scrape:
        from bullmq_compat._queue import ALL_STATES

        started = time.monotonic()
        names, discovery_error = self._names, None
        if self._discover is not None and not self._names:
            if self._discovered is not None and started - self._discovered_at < self._discovery_interval:
                names = self._discovered
            else:
                try:
                    names = self._discovered = await self._discover()
                    self._discovered_at = started
                except Exception as err:
                    names, discovery_error = list(self._queues), self._describe_error(err)
            for gone in set(self._queues) - set(names):
                await self._close_queue(gone)

        async def one(name: str) -> QueueReading:
            reading = QueueReading(name)
            try:
                queue = self._queues.get(name)
                if queue is None:
                    queue = self._queues[name] = self._open_queue(name)
                await queue.wait_until_ready()
                figures = await queue.backend.get_figures(ALL_STATES)
            except Exception as err:
                reading.error = self._describe_error(err)
                return reading
            reading.counts = dict(zip(ALL_STATES, figures.counts))
            reading.completed_total, reading.failed_total = figures.completed_total, figures.failed_total
            reading.workers = figures.workers
            reading.oldest_waiting_seconds = oldest_waiting_seconds(figures.next_waiting, int(time.time() * 1000))
            return reading

        queues = list(await asyncio.gather(*(one(name) for name in names)))
        return Scrape(queues, discovery_error, time.monotonic() - started)

    async def _close_queue(self, name: str) -> None:
        queue = self._queues.pop(name, None)
        if queue is not None:
            try:
                await queue.close()
            except Exception:  # closing a connection already broken: nothing more to free
                pass

    async def close(self) -> None:
        for name in list(self._queues):
            await self._close_queue(name)


class QueueCollector:
    """A prometheus_client collector: each ``collect()`` (a scrape, on the HTTP server's thread) runs
    one `QueueReader.read` on ``loop`` and waits for it at most ``timeout`` seconds."""

    def __init__(self, reader: QueueReader, loop: asyncio.AbstractEventLoop, timeout: float = 5.0,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        self.reader, self.loop, self.timeout, self.log = reader, loop, timeout, log
        self.errors = 0  # failed reads (a queue, or the discovery) since start
        self._lock = threading.Lock()

    def _scrape(self) -> Scrape:
        future = asyncio.run_coroutine_threadsafe(self.reader.read(), self.loop)
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return Scrape([], f"the reads took longer than {self.timeout:g} s", self.timeout)
        except Exception as err:
            return Scrape([], f"{type(err).__name__}: {err}")

    def collect(self) -> Iterable["Metric"]:
        core = prometheus_client().metrics_core
        with self._lock:  # one scrape at a time: two Prometheus servers do not double the load
            scrape = self._scrape()
            failures = [f"queue {q.name}: {q.error}" for q in scrape.queues if q.error is not None]
            if scrape.discovery_error is not None:
                failures.insert(0, f"finding the queues: {scrape.discovery_error}")
            self.errors += len(failures)
            errors = self.errors
        for failure in failures:
            self.log(f"bullmq-compat metrics: {failure}")
        read = [q for q in scrape.queues if q.error is None]
        counts = core.GaugeMetricFamily("bullmq_job_count", "Number of jobs in the queue by state",
                                        labels=["queue", "state"])
        completed = core.CounterMetricFamily("bullmq_job_completed", "Total number of completed jobs",
                                             labels=["queue"])
        failed = core.CounterMetricFamily("bullmq_job_failed", "Total number of failed jobs", labels=["queue"])
        workers = core.GaugeMetricFamily("bullmq_workers", "Workers (of any language) connected to the queue",
                                         labels=["queue"])
        oldest = core.GaugeMetricFamily(
            "bullmq_oldest_waiting_seconds",
            "Age of the oldest job next in line (waiting or prioritized), 0 when none waits", labels=["queue"])
        queue_up = core.GaugeMetricFamily("bullmq_queue_up", "1 when the queue was read at this scrape, else 0",
                                          labels=["queue"])
        for q in read:
            for state, count in q.counts.items():
                counts.add_metric([q.name, state], count)
            completed.add_metric([q.name], q.completed_total)
            failed.add_metric([q.name], q.failed_total)
            workers.add_metric([q.name], q.workers)
            oldest.add_metric([q.name], q.oldest_waiting_seconds)
        for q in scrape.queues:
            queue_up.add_metric([q.name], 0 if q.error else 1)
        yield from (counts, completed, failed, workers, oldest, queue_up)
        yield core.GaugeMetricFamily("bullmq_up", "1 when every queue (and the discovery) was read at this scrape",
                                     value=1 if scrape.ok else 0)
        yield core.CounterMetricFamily("bullmq_scrape_errors", "Failed reads (a queue or the discovery) since start",
                                       value=errors)
        yield core.GaugeMetricFamily("bullmq_scrape_duration_seconds", "Time the last scrape's reads took",
                                     value=scrape.seconds)


class QueueMetricsServer:
    """`QueueCollector` in a registry of its own, served on ``host:port`` until `close`."""

    def __init__(self, collector: QueueCollector) -> None:
        client = prometheus_client()
        self.collector = collector
        self.registry = client.CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None

    def start(self, port: int, host: str = "0.0.0.0") -> int:
        """Listen (port 0: any free port); returns the port."""
        self._server, self._thread = _listen(check_port("port", port), host, self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None and self._thread is not None:
            _stop(self._server, self._thread)
            self._server = self._thread = None


# -- the worker's job metrics ---------------------------------------------------------------------


class _WorkerInstruments:
    """The process's worker metrics: one registry (with prometheus_client's process collector)."""

    def __init__(self) -> None:
        client = prometheus_client()
        self.registry: CollectorRegistry = client.CollectorRegistry()
        client.ProcessCollector(registry=self.registry)
        self.duration: Histogram = client.Histogram(
            "bullmq_job_duration_seconds", "Processing time of finished job attempts, from processedOn",
            ["queue", "name", "status"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.completed: Counter = client.Counter(
            "bullmq_worker_jobs_completed", "Jobs completed by this process's workers",
            ["queue", "name"], registry=self.registry)
        self.failed: Counter = client.Counter(
            "bullmq_worker_jobs_failed", "Job attempts failed in this process's workers (retried ones too)",
            ["queue", "name"], registry=self.registry)


_lock = threading.Lock()
_instruments: Optional[_WorkerInstruments] = None
_served: Optional[tuple[int, Any, threading.Thread]] = None  # (port, server, thread)


def worker_metrics_registry() -> "CollectorRegistry":
    """The registry of this process's worker metrics (to serve it yourself, or to read it in tests)."""
    return _worker_instruments().registry


def _worker_instruments() -> _WorkerInstruments:
    global _instruments
    with _lock:
        if _instruments is None:
            _instruments = _WorkerInstruments()
        return _instruments


def serve_worker_metrics(port: int, host: str = "0.0.0.0") -> int:
    """Serve this process's worker metrics on ``host:port`` (0: any free port); returns the port.

    Once per process: while served, a call (or a ``Worker(metrics_port=...)``) with the same port,
    or 0, shares the server; another port is refused. Served until `stop_worker_metrics`."""
    global _served
    check_port("metrics_port", port)
    registry = worker_metrics_registry()
    with _lock:
        if _served is not None:
            if port not in (0, _served[0]):
                raise InvalidArgument(
                    f"metrics_port={port}: this process already serves its worker metrics on port {_served[0]} "
                    f"(one server per process, shared by all its workers): pass metrics_port={_served[0]}")
            return _served[0]
        server, thread = _listen(port, host, registry)
        _served = (int(server.server_port), server, thread)
        return _served[0]


def worker_metrics_port() -> Optional[int]:
    """The port this process serves its worker metrics on, None when it does not."""
    served = _served
    return served[0] if served is not None else None


def stop_worker_metrics() -> None:
    """Stop serving the worker metrics (the counters keep their values for a later server)."""
    global _served
    with _lock:
        served, _served = _served, None
    if served is not None:
        _stop(served[1], served[2])


class WorkerMetrics:
    """A worker's hook: `completed` / `failed` with the job when an attempt finishes. Label children
    are cached per job name, so a job costs a dict look-up, an observation and an increment."""

    __slots__ = ("queue", "port", "_instruments", "_children")

    def __init__(self, queue: str, port: int) -> None:
        self.queue = queue
        self._instruments = _worker_instruments()
        self.port = serve_worker_metrics(port)
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def _record(self, job: "Job", status: str) -> None:
        key = (job.name, status)
        children = self._children.get(key)
        if children is None:
            instruments = self._instruments
            counter = instruments.completed if status == "completed" else instruments.failed
            children = self._children[key] = (instruments.duration.labels(self.queue, job.name, status),
                                              counter.labels(self.queue, job.name))
        if job.processed_on:
            children[0].observe(max(0.0, time.time() - job.processed_on / 1000))
        children[1].inc()

    def completed(self, job: "Job") -> None:
        self._record(job, "completed")

    def failed(self, job: "Job") -> None:
        self._record(job, "failed")
