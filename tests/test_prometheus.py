"""Prometheus: the `bullmq-compat metrics` endpoint (its collector, on Redis and PostgreSQL), the
worker's job metrics (``Worker(metrics_port=...)``, ``worker --metrics-port``), and both scraped by
a real Prometheus (Debian's, started by the test on a port of its own) that also runs every
expression of the Grafana dashboard in docs/grafana/."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bullmq_compat import (
    InvalidArgument,
    MetricsUnavailable,
    Queue,
    Worker,
    serve_worker_metrics,
    stop_worker_metrics,
    worker_metrics_port,
    worker_metrics_registry,
)
from bullmq_compat._prometheus import QueueCollector, QueueReader, prometheus_client
from tests._redis_server import free_port
from tests.prometheus_helpers import ROOT, MetricsCli, PrometheusServer, get, samples, value

DASHBOARD = ROOT / "docs" / "grafana" / "bullmq-compat.json"
STATES = ("active", "completed", "delayed", "failed", "prioritized", "waiting", "waiting-children")


async def wait_until(check: Any, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)


def collector_for(names: Optional[list[str]], url: str, **options: Any) -> tuple[QueueReader, CollectorRegistry]:
    """A reader of ``names`` (None: every queue found at each scrape) and a registry with its collector."""
    from bullmq_compat._backends.redis.backend import discover_queues

    reader = QueueReader(lambda name: Queue(name, url), names=names,
                         discover=None if names else lambda: discover_queues(url, "bull"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(reader, asyncio.get_running_loop(), log=lambda line: None, **options))
    return reader, registry


async def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    # as the HTTP server does: on another thread, while this loop runs the reads
    return samples((await asyncio.to_thread(generate_latest, registry)).decode())


async def run_jobs(queue_name: str, url: str, ok: int, bad: int, schema: Optional[str] = None,
                   **worker_options: Any) -> None:
    """``ok`` jobs named "ok" completed and ``bad`` named "bad" failed (one attempt each) by a Python worker."""
    where = {"schema": schema} if schema else {}
    queue = Queue(queue_name, url, **where)
    await queue.add_bulk([{"name": "ok", "data": {}} for _ in range(ok)]
                         + [{"name": "bad", "data": {"fail": True}} for _ in range(bad)])

    async def process(job: Any) -> str:
        await asyncio.sleep(0.02)
        if job.data.get("fail"):
            raise ValueError("asked to fail")
        return "done"

    worker = Worker(queue_name, process, url, concurrency=4, metrics={"max_data_points": 100}, **where,
                    **worker_options)
    task = asyncio.ensure_future(worker.run(handle_signals=False))

    async def finished() -> bool:
        counts = await queue.get_job_counts("completed", "failed")
        return counts == {"completed": ok, "failed": bad}

    try:
        await wait_until(finished, what=f"{ok} completed and {bad} failed")
    finally:
        await worker.close()
        await task
        await queue.close()


# -- the collector (Redis) ---------------------------------------------------------------------------------


async def test_collector_series_equal_queue_figures_and_node_export(redis_url: str, queue_name: str) -> None:
    await run_jobs(queue_name, redis_url, ok=3, bad=2)
    queue = Queue(queue_name, redis_url)
    added = int(time.time() * 1000) - 120_000  # a job added two minutes ago waits first in line
    await queue.add("old", {}, timestamp=added)
    await queue.add("young", {})
    await queue.add("urgent", {}, priority=1)
    reader, registry = collector_for([queue_name], redis_url)
    try:
        page = await scrape(registry)
        counts = await queue.get_job_counts()
        for state in STATES:
            assert value(page, "bullmq_job_count", queue=queue_name, state=state) == counts[state]
        assert counts["completed"] == 3 and counts["failed"] == 2 and counts["waiting"] == 2
        assert value(page, "bullmq_job_completed_total", queue=queue_name) == 3
        assert value(page, "bullmq_job_failed_total", queue=queue_name) == 2
        # Node's series, as Queue.export_prometheus_metrics writes them (the same text as Node's), agree
        node = samples(await queue.export_prometheus_metrics() + "\n")
        assert node and all(page[key] == number for key, number in node.items())
        oldest = value(page, "bullmq_oldest_waiting_seconds", queue=queue_name)
        assert oldest is not None and 120 <= oldest < 120 + 600
        assert value(page, "bullmq_workers", queue=queue_name) == 0
        assert value(page, "bullmq_queue_up", queue=queue_name) == 1
        assert value(page, "bullmq_up") == 1 and value(page, "bullmq_scrape_errors_total") == 0
    finally:
        await reader.close()
        await queue.close()


async def test_collector_counts_connected_workers_and_reads_anew_each_scrape(redis_url: str, queue_name: str) -> None:
    queue = Queue(queue_name, redis_url)
    await queue.add("a", {})
    reader, registry = collector_for([queue_name], redis_url)

    async def never(job: Any) -> None:
        await asyncio.Event().wait()

    # concurrency 2: a slot is idle, so the worker's named (blocking) connection is open and listed
    worker = Worker(queue_name, never, redis_url, name="w1", concurrency=2)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        async def one_active_one_worker() -> bool:
            page = await scrape(registry)
            return (value(page, "bullmq_job_count", queue=queue_name, state="active") == 1
                    and value(page, "bullmq_workers", queue=queue_name) == 1)

        await wait_until(one_active_one_worker, what="the worker connected with its job active")
        page = await scrape(registry)
        assert value(page, "bullmq_job_count", queue=queue_name, state="waiting") == 0
        assert value(page, "bullmq_oldest_waiting_seconds", queue=queue_name) == 0  # none waits
    finally:
        await worker.close(force=True)
        await task
        await reader.close()
        await queue.close()


async def test_all_queues_are_found_again_at_each_scrape(redis_url: str, queue_name: str) -> None:
    first, later = f"{queue_name}-a", f"{queue_name}-b"
    queue_a, queue_b = Queue(first, redis_url), Queue(later, redis_url)
    await queue_a.add("x", {})
    # each scrape finds and reads every queue in the session's Redis (all the tests' queues so far):
    # a bound for a loaded machine, not the exporter's 5 s, which such a scrape once outlasted
    reader, registry = collector_for(None, redis_url, timeout=120)
    try:
        page = await scrape(registry)
        assert value(page, "bullmq_job_count", queue=first, state="waiting") == 1
        assert value(page, "bullmq_queue_up", queue=later) is None
        await queue_b.add_bulk([{"name": "y", "data": {}}, {"name": "y", "data": {}}])
        page = await scrape(registry)
        assert value(page, "bullmq_job_count", queue=later, state="waiting") == 2
        assert value(page, "bullmq_job_count", queue=first, state="waiting") == 1
    finally:
        await reader.close()
        await queue_a.close()
        await queue_b.close()


async def test_discovery_interval_searches_at_most_that_often(redis_url: str, queue_name: str) -> None:
    searches: list[float] = []
    found = [queue_name]

    async def discover() -> list[str]:
        searches.append(time.monotonic())
        return list(found)

    queue = Queue(queue_name, redis_url)
    await queue.add("x", {})
    reader = QueueReader(lambda name: Queue(name, redis_url), discover=discover, discovery_interval=3600)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(reader, asyncio.get_running_loop(), log=lambda line: None))
    try:
        for _ in range(3):
            page = await scrape(registry)
            assert value(page, "bullmq_job_count", queue=queue_name, state="waiting") == 1
        assert len(searches) == 1  # the queues found first are read again, not searched for
        found.append(f"{queue_name}-new")
        assert value(await scrape(registry), "bullmq_queue_up", queue=f"{queue_name}-new") is None
    finally:
        await reader.close()
        await queue.close()


async def test_a_datastore_error_is_an_up_gauge_of_0_not_a_failed_scrape() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    logged: list[str] = []
    reader = QueueReader(lambda name: Queue(name, url), names=["q1", "q2"])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(reader, asyncio.get_running_loop(), log=logged.append))
    try:
        for scrapes in (1, 2):
            page = await scrape(registry)
            assert value(page, "bullmq_up") == 0
            assert value(page, "bullmq_queue_up", queue="q1") == 0 and value(page, "bullmq_queue_up", queue="q2") == 0
            assert value(page, "bullmq_job_count", queue="q1", state="waiting") is None  # no stale figures
            assert value(page, "bullmq_scrape_errors_total") == 2 * scrapes
        assert len(logged) == 4 and all("cannot reach Redis" in line or "Connect" in line for line in logged), logged
    finally:
        await reader.close()


async def test_a_failing_discovery_and_a_slow_read_give_up_0() -> None:
    async def broken() -> list[str]:
        raise ConnectionError("the datastore is down")

    reader = QueueReader(lambda name: Queue(name), discover=broken)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(reader, asyncio.get_running_loop(), log=lambda line: None))
    page = await scrape(registry)
    assert value(page, "bullmq_up") == 0 and value(page, "bullmq_scrape_errors_total") == 1

    class Hanging(QueueReader):
        async def read(self) -> Any:
            await asyncio.sleep(30)

    slow = CollectorRegistry(auto_describe=False)
    slow.register(QueueCollector(Hanging(lambda name: Queue(name), names=["q"]), asyncio.get_running_loop(),
                                 timeout=0.5, log=lambda line: None))
    started = time.monotonic()
    page = await scrape(slow)
    assert value(page, "bullmq_up") == 0 and time.monotonic() - started < 20


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    with pytest.raises(MetricsUnavailable, match=r"bullmq-compat\[metrics\]"):
        prometheus_client()


# -- the CLI endpoint ----------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, message", [
    (["metrics"], "--queue NAME (repeatable) or --all-queues"),
    (["metrics", "--queue", "a", "--all-queues"], "--queue NAME (repeatable) or --all-queues"),
    (["metrics", "--queue", "a", "--port", "70000"], "--port=70000 must be a TCP port"),
    (["metrics", "--queue", "a", "--timeout", "0"], "--timeout 0 must be a number of seconds > 0"),
    (["metrics", "--all-queues", "--discovery-interval", "-1"], "--discovery-interval -1 must be"),
    (["worker", "tests.cli_jobs:double", "--queue", "a", "--metrics-port", "-1"], "metrics_port=-1 must be a TCP port"),
])
def test_cli_metrics_bad_options_say_what_to_pass(args: list[str], message: str, redis_url: str) -> None:
    done = cli(*args, "--redis", redis_url)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_cli_postgres_alone_without_postgres_url_says_so(redis_url: str) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "POSTGRES_URL"}
    done = subprocess.run([sys.executable, "-m", "bullmq_compat", "info", "--postgres"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "$POSTGRES_URL, which is not set" in done.stderr, done.stderr


def test_cli_metrics_on_a_datastore_down_answers_up_0_and_masks_the_password() -> None:
    endpoint = MetricsCli("--redis", f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0", "--queue", "a")
    try:
        page = endpoint.page()
        assert value(page, "bullmq_up") == 0 and value(page, "bullmq_queue_up", queue="a") == 0
        assert value(endpoint.page(), "bullmq_scrape_errors_total") == 2
    finally:
        assert endpoint.stop() == 0
    assert endpoint.proc.stderr is not None
    errors = endpoint.proc.stderr.read()
    assert "bullmq-compat metrics: queue a:" in errors and "s3cret-pw" not in errors, errors


def test_cli_metrics_serves_named_queues_on_redis(redis_url: str, queue_name: str) -> None:
    asyncio.run(run_jobs(queue_name, redis_url, ok=2, bad=1))
    endpoint = MetricsCli("--redis", redis_url, "--queue", queue_name)
    try:
        page = endpoint.page()
        assert value(page, "bullmq_job_count", queue=queue_name, state="completed") == 2
        assert value(page, "bullmq_job_completed_total", queue=queue_name) == 2
        assert value(page, "bullmq_job_failed_total", queue=queue_name) == 1
        assert value(page, "bullmq_up") == 1
    finally:
        assert endpoint.stop() == 0


def test_cli_metrics_on_postgres(postgres_url: str, pg_migrated: str, queue_name: str) -> None:
    async def fill() -> None:
        await run_jobs(queue_name, postgres_url, ok=2, bad=1, schema=pg_migrated)
        queue = Queue(f"{queue_name}-idle", postgres_url, schema=pg_migrated)
        await queue.add("old", {}, timestamp=int(time.time() * 1000) - 60_000)
        await queue.add("new", {})
        await queue.close()

    asyncio.run(fill())
    named = MetricsCli("--postgres", postgres_url, "--schema", pg_migrated, "--queue", queue_name,
                       "--queue", f"{queue_name}-idle")
    everything = MetricsCli("--postgres", postgres_url, "--schema", pg_migrated, "--all-queues")
    try:
        for endpoint in (named, everything):
            page = endpoint.page()
            assert value(page, "bullmq_job_count", queue=queue_name, state="completed") == 2
            assert value(page, "bullmq_job_count", queue=queue_name, state="failed") == 1
            assert value(page, "bullmq_job_completed_total", queue=queue_name) == 2
            assert value(page, "bullmq_job_failed_total", queue=queue_name) == 1
            assert value(page, "bullmq_job_count", queue=f"{queue_name}-idle", state="waiting") == 2
            oldest = value(page, "bullmq_oldest_waiting_seconds", queue=f"{queue_name}-idle")
            assert oldest is not None and 60 <= oldest < 60 + 600
            assert value(page, "bullmq_workers", queue=queue_name) == 0
            assert value(page, "bullmq_up") == 1
        assert {q for (name, labels), _ in everything.page().items() if name == "bullmq_queue_up"
                for key, q in labels} == {queue_name, f"{queue_name}-idle"}
    finally:
        assert named.stop() == 0 and everything.stop() == 0


# -- the worker's metrics ------------------------------------------------------------------------------------


async def test_worker_metrics_port_records_durations_and_counters_by_name(redis_url: str, queue_name: str) -> None:
    port = free_port()
    try:
        await run_jobs(queue_name, redis_url, ok=4, bad=2, metrics_port=port)
        assert worker_metrics_port() == port
        registry = worker_metrics_registry()
        assert registry.get_sample_value("bullmq_worker_jobs_completed_total", {"queue": queue_name, "name": "ok"}) == 4
        assert registry.get_sample_value("bullmq_worker_jobs_failed_total", {"queue": queue_name, "name": "bad"}) == 2
        assert registry.get_sample_value("bullmq_job_duration_seconds_count",
                                         {"queue": queue_name, "name": "ok", "status": "completed"}) == 4
        total = registry.get_sample_value("bullmq_job_duration_seconds_sum",
                                          {"queue": queue_name, "name": "ok", "status": "completed"})
        assert total is not None and 4 * 0.02 <= total < 4 * 60  # each slept 20 ms
        # served over HTTP, and a second worker of this process shares the port (0: whichever is served)
        page = samples(await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics"))
        assert value(page, "bullmq_worker_jobs_failed_total", queue=queue_name, name="bad") == 2
        other = Worker(f"{queue_name}-2", lambda job: None, redis_url, metrics_port=0)
        assert other._prometheus.port == port
        await other.close()
        with pytest.raises(InvalidArgument, match=f"already serves its worker metrics on port {port}"):
            Worker(f"{queue_name}-3", lambda job: None, redis_url, metrics_port=free_port())
    finally:
        stop_worker_metrics()
    assert worker_metrics_port() is None


async def test_a_batch_workers_jobs_are_counted_one_by_one(redis_url: str, queue_name: str) -> None:
    queue = Queue(queue_name, redis_url)
    await queue.add_bulk([{"name": "ok", "data": {}} for _ in range(6)] + [{"name": "bad", "data": {"fail": True}}] * 2)

    async def process(batch: Any) -> None:
        for job in batch.get_batch():
            if job.data.get("fail"):
                job.set_as_failed(ValueError("asked to fail"))

    worker = Worker(queue_name, process, redis_url, batch={"size": 4}, metrics_port=0)
    task = asyncio.ensure_future(worker.run(handle_signals=False))

    async def finished() -> bool:
        return await queue.get_job_counts("completed", "failed") == {"completed": 6, "failed": 2}

    try:
        await wait_until(finished, what="6 completed and 2 failed")
        registry = worker_metrics_registry()

        def counted() -> tuple[Any, Any]:  # (the counters move just after Redis has the job finished)
            return (registry.get_sample_value("bullmq_worker_jobs_completed_total", {"queue": queue_name, "name": "ok"}),
                    registry.get_sample_value("bullmq_worker_jobs_failed_total", {"queue": queue_name, "name": "bad"}))
        async def all_counted() -> bool:
            return counted() == (6, 2)
        await wait_until(all_counted, 15, "the metrics to count 6 completed and 2 failed")
        assert counted() == (6, 2)
    finally:
        await worker.close()
        await task
        await queue.close()
        stop_worker_metrics()


def test_a_worker_without_metrics_port_does_not_load_prometheus_client(redis_url: str) -> None:
    code = ("import sys; from bullmq_compat import Worker; w = Worker('q', lambda job: None, sys.argv[1]); "
            "assert w._prometheus is None; print('prometheus_client' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, redis_url], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_worker_metrics_port_must_be_a_port(redis_url: str) -> None:
    for bad in (-1, 65536, "9465", True):
        with pytest.raises(InvalidArgument, match="metrics_port=.* must be a TCP port"):
            Worker("q", lambda job: None, redis_url, metrics_port=bad)


def test_cli_worker_metrics_port(redis_url: str, queue_name: str) -> None:
    async def add() -> None:
        queue = Queue(queue_name, redis_url)
        await queue.add_bulk([{"name": "ok", "data": {}}] * 3 + [{"name": "bad", "data": {"fail": True}}])
        await queue.close()

    asyncio.run(add())
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "worker", "tests.cli_jobs:fail_when_asked",
                             "--queue", queue_name, "--redis", redis_url, "--metrics-port", str(port),
                             "--metrics-host", "127.0.0.1"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        page: dict[Any, float] = {}
        while not (value(page, "bullmq_worker_jobs_completed_total", queue=queue_name, name="ok") == 3
                   and value(page, "bullmq_worker_jobs_failed_total", queue=queue_name, name="bad") == 1):
            assert proc.poll() is None and time.monotonic() < deadline, (page, proc.stderr and proc.stderr.read())
            time.sleep(0.3)
            try:
                page = samples(get(f"http://127.0.0.1:{port}/metrics"))
            except OSError:
                continue
        assert value(page, "bullmq_job_duration_seconds_count", queue=queue_name, name="bad", status="failed") == 1
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


# -- a real Prometheus, and the Grafana dashboard ------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    assert len(exprs) >= 8 and board["templating"]["list"][0]["name"] == "queue"
    assert all(panel["datasource"]["uid"] == "${DS_PROMETHEUS}" for panel in board["panels"])
    return exprs


def test_dashboard_names_only_series_we_export() -> None:
    ours = set(re.findall(r"bullmq_[a-z_]+", (ROOT / "bullmq_compat" / "_prometheus.py").read_text()))
    ours |= {f"{name}_bucket" for name in ours} | {f"{name}_total" for name in ours}
    for expr in dashboard_exprs():
        named = set(re.findall(r"bullmq_[a-z_]+", expr))
        assert named and named <= ours, (expr, named - ours)


async def test_prometheus_scrapes_the_endpoint_and_a_worker(redis_url: str, queue_name: str) -> None:
    busy, idle = queue_name, f"{queue_name}-idle"
    worker_port = serve_worker_metrics(0, "127.0.0.1")
    endpoint = await asyncio.to_thread(MetricsCli, "--redis", redis_url, "--queue", busy, "--queue", idle)
    prometheus: Optional[PrometheusServer] = None
    queue = Queue(idle, redis_url)
    try:
        await queue.add_bulk([{"name": "later", "data": {}}] * 2)
        prometheus = await asyncio.to_thread(PrometheusServer, [f"127.0.0.1:{endpoint.port}",
                                                                f"127.0.0.1:{worker_port}"])
        p = prometheus

        async def wait_for(expr: str, check: Any) -> float:
            return await asyncio.to_thread(p.wait_for, expr, check)

        await wait_for('count(up{job="bullmq"} == 1)', lambda v: v == 2)
        await run_jobs(busy, redis_url, ok=6, bad=3, metrics_port=worker_port)
        await wait_for(f'bullmq_job_completed_total{{queue="{busy}"}}', lambda v: v == 6)
        await wait_for(f'bullmq_job_failed_total{{queue="{busy}"}}', lambda v: v == 3)
        await wait_for(f'bullmq_job_count{{queue="{busy}", state="completed"}}', lambda v: v == 6)
        await wait_for(f'bullmq_job_count{{queue="{idle}", state="waiting"}}', lambda v: v == 2)
        await wait_for(f'bullmq_oldest_waiting_seconds{{queue="{idle}"}}', lambda v: v is not None and v > 0)
        await wait_for(f'bullmq_workers{{queue="{busy}"}}', lambda v: v == 0)  # closed
        await wait_for('min(bullmq_up)', lambda v: v == 1)
        await wait_for(f'bullmq_worker_jobs_completed_total{{queue="{busy}", name="ok"}}', lambda v: v == 6)
        await wait_for(f'bullmq_worker_jobs_failed_total{{queue="{busy}", name="bad"}}', lambda v: v == 3)
        await wait_for(f'sum(bullmq_job_duration_seconds_count{{queue="{busy}"}})', lambda v: v == 9)
        # every dashboard expression, for our two queues: accepted, and with a result (rate() needs
        # two samples of a series: wait for the next scrapes, generously)
        for expr in dashboard_exprs():
            concrete = expr.replace("$queue", f"{busy}|{idle}").replace("$__rate_interval", "1m")
            deadline = time.monotonic() + 60
            while True:
                answer = await asyncio.to_thread(p.query, concrete)
                assert answer["status"] == "success", (concrete, answer)
                if answer["data"]["result"]:
                    break
                assert time.monotonic() < deadline, f"no result for the dashboard's {concrete}"
                await asyncio.sleep(0.5)
    finally:
        await queue.close()
        if prometheus is not None:
            await asyncio.to_thread(prometheus.stop)
        assert await asyncio.to_thread(endpoint.stop) == 0
        stop_worker_metrics()


def test_dashboard_json_parses_and_matches_docs() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["__inputs"][0]["name"] == "DS_PROMETHEUS"
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert "grafana/bullmq-compat.json" in text
    assert Path(ROOT / "docs" / "metrics-prometheus.png").stat().st_size < 300_000
