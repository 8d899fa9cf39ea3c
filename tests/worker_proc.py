"""A Python worker in a process of its own, for tests that kill or signal it.

    python -m tests.worker_proc REDIS_URL QUEUE [--lock-duration MS] [--stalled-interval MS] [--drain-delay S]

Runs ``Worker.run()`` (with its SIGTERM/SIGINT handlers) until closed. The processor sleeps
``job.data["sleep"]`` seconds and returns ``{"pid": ...}``. Prints one JSON line per event on
stdout: {"ready": pid}, {"started": id}, {"completed": id}, {"closing": ...}, {"exit": 0}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from bullmq_compat import Worker


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def process(job: Any) -> dict[str, int]:
    say(started=job.id)
    await asyncio.sleep(float((job.data or {}).get("sleep", 0)))
    return {"pid": os.getpid()}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("queue")
    parser.add_argument("--lock-duration", type=int, default=30000)
    parser.add_argument("--stalled-interval", type=int, default=30000)
    parser.add_argument("--shutdown-timeout", type=float, default=30.0)
    parser.add_argument("--drain-delay", type=float, default=5.0)
    args = parser.parse_args()
    worker = Worker(args.queue, process, connection=args.redis_url, lock_duration=args.lock_duration,
                    stalled_interval=args.stalled_interval, shutdown_timeout=args.shutdown_timeout,
                    drain_delay=args.drain_delay)
    worker.on("ready", lambda: say(ready=os.getpid()))
    worker.on("completed", lambda job, result, prev: say(completed=job.id))
    worker.on("closing", lambda msg: say(closing=msg))
    await worker.run()
    say(exit=0)


if __name__ == "__main__":
    asyncio.run(main())
