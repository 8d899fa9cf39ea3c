"""A Python Worker with a recording, plan-following handler, in a process of its own (to SIGKILL).

    python -m tests.chaos_worker_proc REDIS_URL QUEUE --rec KEY [--concurrency N] [--lock-duration MS]
        [--stalled-interval MS] [--max-stalled-count N] [--name NAME] [--redis-py] [--remove]

Used by tests/test_chaos.py and tests/test_leaks.py. Prints {"ready": pid} once consuming, then a
JSON line per worker 'error' ({"error": text}); SIGTERM/SIGINT close it gracefully.

Every run of the handler records itself in Redis (see tests/chaos_helpers.py):

    RPUSH <rec>:starts {"id", "a", "t0", "pid", "g", "s"}     when it starts
    RPUSH <rec>:ends   {"id", "a", "t0", "t1", "pid", "out"}  when its outcome is decided
    INCR  <rec>:done                                          then, for "completed" outcomes
    RPUSH <rec>:fins   {"id", "a", "t0", "pid", "t"}          once the worker's finish of the run
                                                              was acknowledged (its 'completed' or
                                                              'failed' event)

and the process's event-loop lag (a 50 ms sleep that overslept by LAG_MS or more):

    RPUSH <rec>:lags   {"pid", "t", "lag"}                    (ms)

``a`` is the attempt (attemptsMade + 1: a rerun after a stall has the same ``a``). What the
handler does follows ``job.data["plan"]``: "ok" returns; "retry" fails attempt 1 only (then
succeeds); "always" fails every attempt; "fatal" raises UnrecoverableError. ``job.data["ms"]``
is how long it works first (``job.data["rerun_ms"]``, if set, instead in a run of a job
started before: a re-run after a stall). With ``--no-record`` it follows the plan but only counts completions.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Awaitable, Callable, Optional

import redis.asyncio as aioredis
import redis.exceptions as redis_exc

from bullmq_compat import UnrecoverableError, Worker

RETRY_REASON = "planned failure on attempt 1"
ALWAYS_REASON = "planned failure on every attempt"
FATAL_REASON = "planned unrecoverable failure"
#: an event-loop lag at least this long (ms) is recorded
LAG_MS = 100


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def now_ms() -> int:
    return int(time.time() * 1000)


async def retried(write: Callable[[], Awaitable[Any]], seconds: float = 30.0) -> Any:
    """A record write, retried through connection trouble (a Redis restart, CLIENT KILL), so the
    handler's outcome never depends on it. A write whose reply was lost may land twice: the
    checker counts identical records once."""
    deadline = time.monotonic() + seconds
    pause = 0.02
    while True:
        try:
            return await write()
        except (redis_exc.ConnectionError, redis_exc.TimeoutError, OSError) as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not record for {seconds}s: {err}") from err
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)


def make_handler(client: aioredis.Redis, rec: str, record: bool = True,
                 runs: Optional[dict[tuple[str, str], tuple[int, int]]] = None) -> Any:
    """The handler; it notes each run's (attempt, t0) in ``runs`` by (job id, token) for `fin_recorder`."""
    pid = os.getpid()

    async def process(job: Any) -> Any:
        data = job.data or {}
        attempt = job.attempts_made + 1
        plan = data.get("plan", "ok")
        out = {"ok": "completed", "retry": "retry" if attempt == 1 else "completed",
               "always": "error", "fatal": "fatal"}[plan]
        t0 = now_ms()
        if runs is not None:
            runs[(str(job.id), str(job.token))] = (attempt, t0)
        if record:
            start = json.dumps({"id": job.id, "a": attempt, "t0": t0, "pid": pid, "g": data.get("g"),
                                "s": data.get("s")})
            await retried(lambda: client.rpush(f"{rec}:starts", start))
        # "rerun_ms": how long a run works once the job was started before (a stall re-run)
        ms = data.get("rerun_ms") if data.get("rerun_ms") and job.attempts_started > 1 else data.get("ms")
        if ms:
            await asyncio.sleep(ms / 1000)
        end = json.dumps({"id": job.id, "a": attempt, "t0": t0, "t1": now_ms(), "pid": pid, "out": out})
        if out == "completed":
            async def both() -> Any:
                pipe = client.pipeline(transaction=True)
                if record:
                    pipe.rpush(f"{rec}:ends", end)
                pipe.incr(f"{rec}:done")
                return await pipe.execute()

            await retried(both)
            return {"i": data.get("i"), "a": attempt}
        if record:
            await retried(lambda: client.rpush(f"{rec}:ends", end))
        if out == "fatal":
            raise UnrecoverableError(FATAL_REASON)
        raise RuntimeError(RETRY_REASON if out == "retry" else ALWAYS_REASON)

    return process


def fin_recorder(client: aioredis.Redis, rec: str, runs: dict[tuple[str, str], tuple[int, int]],
                 tasks: set[asyncio.Task[Any]]) -> Callable[..., None]:
    """A 'completed'/'failed' listener: the run's finish was acknowledged; RPUSH <rec>:fins."""
    pid = os.getpid()

    def on_finish(job: Any, *_: Any) -> None:
        run = runs.pop((str(job.id), str(job.token)), None)
        if run is None:
            return
        fin = json.dumps({"id": job.id, "a": run[0], "t0": run[1], "pid": pid, "t": now_ms()})
        task = asyncio.ensure_future(retried(lambda: client.rpush(f"{rec}:fins", fin)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return on_finish


async def watch_lag(write: Callable[[dict[str, Any]], Awaitable[Any]], period: float = 0.05) -> None:
    """Forever: sleep ``period``; a wake-up LAG_MS or more late is written as {"pid", "t", "lag"}."""
    pid = os.getpid()
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(period)
        lag = int((loop.time() - before - period) * 1000)
        if lag >= LAG_MS:
            await write({"pid": pid, "t": now_ms(), "lag": lag})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("queue")
    parser.add_argument("--rec", required=True)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--lock-duration", type=int, default=30000)
    parser.add_argument("--stalled-interval", type=int, default=30000)
    parser.add_argument("--max-stalled-count", type=int, default=1)
    parser.add_argument("--sweep-interval", type=float, default=0.5)
    parser.add_argument("--name", default=None)
    parser.add_argument("--redis-py", action="store_true", help="fast_path=False")
    parser.add_argument("--remove", action="store_true", help="remove_on_complete/remove_on_fail=True")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    # two connections at most for the records, so the process's connections are the worker's + 2
    client = aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(
        args.redis_url, max_connections=2, decode_responses=True, client_name=f"rec:{args.name or ''}"))
    remove = {"remove_on_complete": True, "remove_on_fail": True} if args.remove else {}
    runs: dict[tuple[str, str], tuple[int, int]] = {}
    record = not args.no_record
    worker = Worker(args.queue, make_handler(client, args.rec, record, runs if record else None),
                    connection=args.redis_url,
                    concurrency=args.concurrency, lock_duration=args.lock_duration,
                    stalled_interval=args.stalled_interval, max_stalled_count=args.max_stalled_count,
                    group_sweep_interval=args.sweep_interval, name=args.name, fast_path=not args.redis_py,
                    **remove)
    worker.on("ready", lambda: say(ready=os.getpid()))
    worker.on("error", lambda err: say(error=f"{type(err).__name__}: {err}"))
    tasks: set[asyncio.Task[Any]] = set()
    watcher = None
    if record:
        on_finish = fin_recorder(client, args.rec, runs, tasks)
        worker.on("completed", on_finish)
        worker.on("failed", on_finish)
        watcher = asyncio.ensure_future(watch_lag(
            lambda lag: retried(lambda: client.rpush(f"{args.rec}:lags", json.dumps(lag)))))
    try:
        await worker.run()
    finally:
        if watcher is not None:
            watcher.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()
    say(exit=0)


if __name__ == "__main__":
    asyncio.run(main())
