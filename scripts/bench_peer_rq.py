"""RQ side of scripts/bench.py (run in bench-results/.venv-rq): see scripts/bench_peer_common.py.

    bench-results/.venv-rq/bin/python scripts/bench_peer_rq.py '<json>'

Enqueue: Queue.enqueue, one call per job. Bulk: Queue.enqueue_many with Queue.prepare_data, in a
pipeline of its own per batch (RQ's documented bulk enqueue). Worker: the ``rq`` command line with
SimpleWorker (runs each job in the worker process: RQ's default Worker forks a work horse per job,
which is for isolation, not throughput); concurrency 1: ``rq worker``; concurrency 10: ``rq
worker-pool -n 10``, RQ's own pool of 10 worker processes (RQ has no in-process concurrency).
Results are kept (RQ's default result_ttl, 500 s). This module is also the tasks' module the
workers import.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_peer_common import COUNTER_KEY, LATENCY_KEY, SyncLib, WorkerProcess, drive, now_ms  # noqa: E402

_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _client


def noop(i: int) -> None:
    _redis().incrby(COUNTER_KEY, 1)


def started(i: int, enqueued_ms: float) -> None:
    _redis().append(LATENCY_KEY, f"{now_ms() - enqueued_ms:.3f},")


class RQ(SyncLib):
    has_bulk = True

    def __init__(self, args: dict[str, Any]) -> None:
        import importlib.metadata

        import redis
        from rq import Queue

        self.version = importlib.metadata.version("rq")
        self.url, self.name = args["redis"], args["queue"]
        self.conn = redis.Redis.from_url(self.url)
        self.queue = Queue(self.name, connection=self.conn)
        self.rq = os.path.join(os.path.dirname(sys.executable), "rq")

    def enqueue(self, i: int) -> None:
        self.queue.enqueue("bench_peer_rq.noop", i)

    def enqueue_latency(self, i: int, enqueued_ms: float) -> None:
        self.queue.enqueue("bench_peer_rq.started", i, enqueued_ms)

    def enqueue_bulk(self, start: int, end: int) -> None:
        from rq import Queue

        with self.conn.pipeline() as pipe:
            self.queue.enqueue_many([Queue.prepare_data("bench_peer_rq.noop", (i,)) for i in range(start, end)],
                                    pipeline=pipe)
            pipe.execute()

    def model(self, concurrency: int) -> str:
        return ("1 process (rq worker, SimpleWorker)" if concurrency == 1 else
                f"{concurrency} processes (rq worker-pool, SimpleWorker)")

    def worker(self, concurrency: int) -> WorkerProcess:
        common = ["-w", "rq.worker.SimpleWorker", "-u", self.url, "-q", self.name]
        argv: Optional[list[str]] = ([self.rq, "worker", "--disable-job-desc-logging", *common] if concurrency == 1
                                     else [self.rq, "worker-pool", "-n", str(concurrency), *common])
        assert argv is not None
        return WorkerProcess(argv, {"BENCH_REDIS_URL": self.url}, stop_signal=signal.SIGTERM)


if __name__ == "__main__":
    drive(RQ)
