"""Dramatiq side of scripts/bench.py (run in bench-results/.venv-dramatiq), Redis broker: see
scripts/bench_peer_common.py.

    bench-results/.venv-dramatiq/bin/python scripts/bench_peer_dramatiq.py '<json>'

The RedisBroker with its default middleware and no result backend; the workers' queue prefetch
raised to 64 messages (dramatiq_queue_prefetch, Dramatiq's setting for it; the default, 2 per
thread, makes a worker of one thread back off and sleep while its 2 messages are unacked:
248 jobs/s at c=1 here against 4,015 with 64), as Celery's prefetch multiplier is. Enqueue: Actor.send, one
message per job. Bulk: none (group and pipeline are composition primitives that send one message
each): "--". Worker: the ``dramatiq`` command line, its processes x threads model; concurrency 1:
``-p 1 -t 1``; concurrency 10: ``-p 2 -t 5`` (2 processes, Dramatiq's default count, of 5 threads).
This module is also the broker module the workers import: the queue and the URL come from the
environment (BENCH_QUEUE, BENCH_REDIS_URL), set by the runner.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_peer_common import COUNTER_KEY, LATENCY_KEY, SyncLib, WorkerProcess, drive, now_ms  # noqa: E402

PREFETCH = 64
broker: Any = None
noop: Any = None
started: Any = None


def setup(url: str, queue: str) -> None:
    global broker, noop, started
    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    client = redis.Redis.from_url(url)

    @dramatiq.actor(actor_name="bench_noop", queue_name=queue, max_retries=0)
    def _noop(i: int) -> None:
        client.incrby(COUNTER_KEY, 1)

    @dramatiq.actor(actor_name="bench_started", queue_name=queue, max_retries=0)
    def _started(i: int, enqueued_ms: float) -> None:
        client.append(LATENCY_KEY, f"{now_ms() - enqueued_ms:.3f},")

    noop, started = _noop, _started


if __name__ != "__main__" and os.environ.get("BENCH_REDIS_URL"):  # imported by the dramatiq workers
    setup(os.environ["BENCH_REDIS_URL"], os.environ["BENCH_QUEUE"])


class Dramatiq(SyncLib):
    def __init__(self, args: dict[str, Any]) -> None:
        import importlib.metadata

        self.version = importlib.metadata.version("dramatiq")
        self.url, self.name = args["redis"], args["queue"]
        setup(self.url, self.name)
        self.dramatiq = os.path.join(os.path.dirname(sys.executable), "dramatiq")

    def enqueue(self, i: int) -> None:
        noop.send(i)

    def enqueue_latency(self, i: int, enqueued_ms: float) -> None:
        started.send(i, enqueued_ms)

    def shape(self, concurrency: int) -> tuple[int, int]:
        return (1, 1) if concurrency == 1 else (2, concurrency // 2)

    def model(self, concurrency: int) -> str:
        p, t = self.shape(concurrency)
        return f"{p} process{'es' if p > 1 else ''} x {t} thread{'s' if t > 1 else ''}, prefetch {PREFETCH}"

    def worker(self, concurrency: int) -> WorkerProcess:
        p, t = self.shape(concurrency)
        argv = [self.dramatiq, "bench_peer_dramatiq:broker", "-p", str(p), "-t", str(t), "-Q", self.name,
                "--skip-logging"]
        env = {"BENCH_REDIS_URL": self.url, "BENCH_QUEUE": self.name, "dramatiq_queue_prefetch": str(PREFETCH)}
        return WorkerProcess(argv, env,
                             stop_signal=signal.SIGTERM)

    def close(self) -> None:
        broker.close()


if __name__ == "__main__":
    drive(Dramatiq)
