"""A Python Worker on PostgreSQL with a recording, plan-following handler, in a process of its own
(to SIGKILL, or to keep running while its PostgreSQL restarts).

    python -m tests.pg_chaos_worker_proc PG_URL SCHEMA QUEUE --rec DIR [--concurrency N]
        [--lock-duration MS] [--stalled-interval MS] [--max-stalled-count N] [--name NAME]
        [--drain-delay S] [--effects TABLE]

Used by tests/test_postgres_reliability.py. Prints {"ready": pid} once consuming, then a JSON line
per worker 'error' ({"error": text}); SIGTERM/SIGINT close it gracefully.

The handler is tests/chaos_worker_proc.py's (same plans, same reasons, same record fields), but
records go to a file of this process (``DIR/<pid>.jsonl``), not to Redis and not to the database
under test (which may be down): one ``write(2)`` per line on an O_APPEND descriptor, so a line
written before a SIGKILL is kept.

    {"k": "start", "id", "a", "t0", "pid", "g", "s"}      when a run starts
    {"k": "end", "id", "a", "t0", "t1", "pid", "out"}     when its outcome is decided
    {"k": "fin", "id", "a", "t0", "pid", "t"}             once its finish was acknowledged (the
                                                          worker's 'completed'/'failed' event)
    {"k": "lag", "pid", "t", "lag"}                       an event-loop lag of LAG_MS or more (ms)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any, Callable, Optional

from bullmq_compat import UnrecoverableError, Worker
from tests.chaos_worker_proc import ALWAYS_REASON, FATAL_REASON, RETRY_REASON, watch_lag


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def now_ms() -> int:
    return int(time.time() * 1000)


def recorder(rec_dir: str) -> Callable[..., None]:
    """record(**fields): one line of this process's record file."""
    fd = os.open(os.path.join(rec_dir, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(**fields: Any) -> None:
        os.write(fd, (json.dumps(fields) + "\n").encode())

    return record


def make_handler(rec_dir: str, runs: Optional[dict[tuple[str, str], tuple[int, int]]] = None,
                 effects: Optional[str] = None) -> Any:
    """The handler; it notes each run's (attempt, t0) in ``runs`` by (job id, token) for the fins.
    With ``effects`` (a table, for ``Worker(transactional=True)``) every run first writes a row
    (job_id, attempt, pid) on ``job.transaction``: it commits only with the job's completion."""
    pid = os.getpid()
    record = recorder(rec_dir)

    async def process(job: Any) -> Any:
        data = job.data or {}
        attempt = job.attempts_made + 1
        plan = data.get("plan", "ok")
        out = {"ok": "completed", "retry": "retry" if attempt == 1 else "completed",
               "always": "error", "fatal": "fatal"}[plan]
        t0 = now_ms()
        if runs is not None:
            runs[(str(job.id), str(job.token))] = (attempt, t0)
        record(k="start", id=job.id, a=attempt, t0=t0, pid=pid, g=data.get("g"), s=data.get("s"))
        if effects is not None:
            await job.transaction.execute(f"INSERT INTO {effects} (job_id, attempt, pid) VALUES (%s, %s, %s)",
                                          [job.id, attempt, pid])
        # "rerun_ms": how long a run works once the job was started before (a stall re-run)
        ms = data.get("rerun_ms") if data.get("rerun_ms") and job.attempts_started > 1 else data.get("ms")
        if ms:
            await asyncio.sleep(ms / 1000)
        record(k="end", id=job.id, a=attempt, t0=t0, t1=now_ms(), pid=pid, out=out)
        if out == "completed":
            return {"i": data.get("i"), "a": attempt}
        if out == "fatal":
            raise UnrecoverableError(FATAL_REASON)
        raise RuntimeError(RETRY_REASON if out == "retry" else ALWAYS_REASON)

    return process


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("queue")
    parser.add_argument("--rec", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lock-duration", type=int, default=30000)
    parser.add_argument("--stalled-interval", type=int, default=30000)
    parser.add_argument("--max-stalled-count", type=int, default=1)
    parser.add_argument("--drain-delay", type=float, default=5)
    parser.add_argument("--name", default=None)
    parser.add_argument("--effects", default=None, help="transactional=True, each run writing a row of this table")
    args = parser.parse_args()
    runs: dict[tuple[str, str], tuple[int, int]] = {}
    worker = Worker(args.queue, make_handler(args.rec, runs, args.effects), connection=args.url,
                    transactional=args.effects is not None, schema=args.schema,
                    concurrency=args.concurrency, lock_duration=args.lock_duration,
                    stalled_interval=args.stalled_interval, max_stalled_count=args.max_stalled_count,
                    drain_delay=args.drain_delay, name=args.name)
    def dump_tasks() -> None:  # SIGUSR1: every task's stack on stderr (what a test that times out shows)
        import io
        out = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=out)
        sys.stderr.write(f"tasks of {os.getpid()}: idle={getattr(worker, '_idle', '?')}\n{out.getvalue()}\n")
        sys.stderr.flush()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    worker.on("ready", lambda: say(ready=os.getpid()))
    worker.on("error", lambda err: say(error=f"{type(err).__name__}: {err}", t=now_ms()))
    record = recorder(args.rec)
    pid = os.getpid()

    def on_finish(job: Any, *_: Any) -> None:
        run = runs.pop((str(job.id), str(job.token)), None)
        if run is not None:
            record(k="fin", id=job.id, a=run[0], t0=run[1], pid=pid, t=now_ms())

    async def write_lag(lag: dict[str, Any]) -> None:
        record(k="lag", **lag)

    worker.on("completed", on_finish)
    worker.on("failed", on_finish)
    watcher = asyncio.ensure_future(watch_lag(write_lag))
    try:
        await worker.run()
    finally:
        watcher.cancel()
    say(exit=0)


if __name__ == "__main__":
    asyncio.run(main())
