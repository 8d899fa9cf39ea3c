"""A Python Worker with the group tests' recording processor, in a process of its own (to SIGKILL).

    python -m tests.group_worker_proc REDIS_URL QUEUE [--concurrency N] [--lock-duration MS]
        [--stalled-interval MS] [--sweep-interval S]

Prints {"ready": pid} once consuming; SIGTERM/SIGINT close it gracefully. The processor is
tests/group_helpers.py's ``recording_processor`` (records into ``rec:<QUEUE>``, each run with this
process's pid); the process's event-loop lags go to ``rec:<QUEUE>:lags`` as {"pid", "t", "lag"}
(tests/chaos_worker_proc.py's `watch_lag`), so a lock lost by this worker is printed with its lag.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from bullmq_compat import Worker
from tests.chaos_worker_proc import retried, watch_lag
from tests.group_helpers import rec_key, recording_processor


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("queue")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--lock-duration", type=int, default=30000)
    parser.add_argument("--stalled-interval", type=int, default=30000)
    parser.add_argument("--sweep-interval", type=float, default=0.5)
    args = parser.parse_args()
    process, client = recording_processor(args.redis_url, rec_key(args.queue))
    worker = Worker(args.queue, process, connection=args.redis_url, concurrency=args.concurrency,
                    lock_duration=args.lock_duration, stalled_interval=args.stalled_interval,
                    group_sweep_interval=args.sweep_interval)
    worker.on("ready", lambda: (sys.stdout.write(json.dumps({"ready": os.getpid()}) + "\n"), sys.stdout.flush()))
    lags = f"{rec_key(args.queue)}:lags"
    watcher = asyncio.ensure_future(watch_lag(lambda lag: retried(lambda: client.rpush(lags, json.dumps(lag)))))
    try:
        await worker.run()
    finally:
        watcher.cancel()
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
