"""Celery side of scripts/bench.py (run in bench-results/.venv-celery), Redis as the broker: see
scripts/bench_peer_common.py.

    bench-results/.venv-celery/bin/python scripts/bench_peer_celery.py '<json>'

Configured as Celery's optimizing guide has it for many short tasks: no result backend and
task_ignore_result, a high prefetch multiplier (worker_prefetch_multiplier 64), rate limits off,
and the worker started without gossip, mingle and heartbeat (the cluster chatter of a lone
worker). Enqueue: Task.delay, one message per job. Bulk: none (a group is a canvas primitive that
publishes one message per signature, not a bulk enqueue): "--". Worker: the ``celery worker``
command line; concurrency 1: ``--pool=solo`` (tasks run in the worker's own process); concurrency
10: ``--pool=prefork``, Celery's default pool: 10 child processes (BENCH_CELERY_POOL=threads: one
process, 10 threads; prefork measured faster here). This module is also the app module the worker
imports (``-A bench_peer_celery``).
"""
from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_peer_common import COUNTER_KEY, LATENCY_KEY, SyncLib, WorkerProcess, drive, now_ms  # noqa: E402

POOL_C10 = os.environ.get("BENCH_CELERY_POOL", "prefork")
PREFETCH = 64


def make_app(url: str) -> Any:
    from celery import Celery

    app = Celery("bench_peer_celery", broker=url, set_as_current=True)
    app.conf.update(task_ignore_result=True, result_backend=None, worker_prefetch_multiplier=PREFETCH,
                    worker_disable_rate_limits=True, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False, task_default_queue=os.environ.get("BENCH_QUEUE", "celery"))
    client: dict[str, Any] = {}

    def conn() -> Any:
        if "r" not in client:
            import redis

            client["r"] = redis.Redis.from_url(url)
        return client["r"]

    @app.task(name="bench.noop")
    def noop(i: int) -> None:
        conn().incrby(COUNTER_KEY, 1)

    @app.task(name="bench.started")
    def started(i: int, enqueued_ms: float) -> None:
        conn().append(LATENCY_KEY, f"{now_ms() - enqueued_ms:.3f},")

    app.bench_noop, app.bench_started = noop, started
    return app


def __getattr__(name: str) -> Any:  # the worker's ``-A bench_peer_celery``: the app, built on first access
    if name in ("app", "celery"):
        value = make_app(os.environ["BENCH_REDIS_URL"])
        globals()["app"] = globals()["celery"] = value
        return value
    raise AttributeError(name)


class CeleryLib(SyncLib):
    def __init__(self, args: dict[str, Any]) -> None:
        import importlib.metadata

        self.version = importlib.metadata.version("celery")
        self.url, self.name = args["redis"], args["queue"]
        os.environ["BENCH_QUEUE"] = self.name
        self.app = make_app(self.url)
        self.celery = os.path.join(os.path.dirname(sys.executable), "celery")

    def enqueue(self, i: int) -> None:
        self.app.bench_noop.delay(i)

    def enqueue_latency(self, i: int, enqueued_ms: float) -> None:
        self.app.bench_started.delay(i, enqueued_ms)

    def model(self, concurrency: int) -> str:
        if concurrency == 1:
            return f"1 process (pool solo), prefetch x{PREFETCH}"
        if POOL_C10 == "threads":
            return f"1 process x {concurrency} threads (pool threads), prefetch x{PREFETCH}"
        return f"{concurrency} processes (pool {POOL_C10}), prefetch x{PREFETCH}"

    def worker(self, concurrency: int) -> WorkerProcess:
        pool = "solo" if concurrency == 1 else POOL_C10
        argv = [self.celery, "-A", "bench_peer_celery", "worker", f"--pool={pool}", f"--concurrency={concurrency}",
                f"--prefetch-multiplier={PREFETCH}", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-Q", self.name, "-l", "WARNING"]
        return WorkerProcess(argv, {"BENCH_REDIS_URL": self.url, "BENCH_QUEUE": self.name})

    def close(self) -> None:
        self.app.close()


if __name__ == "__main__":
    drive(CeleryLib)
