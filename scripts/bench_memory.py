"""Memory over a long run: a worker's and a producer's RSS across 1,000,000 jobs.

    .venv/bin/python scripts/bench_memory.py [--jobs 1000000] [--every 100000] [--modes worker,producer]
                                             [--concurrency 10] [--maxmemory 4gb] [--json out.json]
    make bench-memory [BENCH_MEMORY_ARGS=...]

It starts a redis-server of its own (loopback, free port, ``--maxmemory`` as given, no persistence)
and, for each mode, runs the client in a fresh process that prints its resident set size
(VmRSS of /proc/self/status) before the first job, after every ``--every`` jobs, and at the end:

  worker    the jobs are pre-loaded in bulk (by this process, untimed), then one Worker with
            remove_on_complete (so Redis does not fill) and a no-op processor at ``--concurrency``
            takes them all; RSS is read from its 'completed' listener
  producer  one Queue adds the jobs one at a time (sequential awaits); Redis keeps them (about
            0.5 KB each: 1,000,000 jobs need some 600 MB of --maxmemory)

A steady state is flat: after the first reading or two (connection buffers, the encoders' caches
of repeated strings, bounded) it should not grow with the job count. The report gives each
reading, the growth from the second reading to the end, and the peak (ru_maxrss).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KB


def report(done: int, started: float) -> None:
    print(json.dumps({"jobs": done, "rssMb": round(rss_mb(), 2), "seconds": round(time.monotonic() - started, 2),
                      "cpuSeconds": round(time.process_time(), 2)}), flush=True)


# -- the measured processes ------------------------------------------------------------------------
async def child_worker(url: str, queue: str, jobs: int, every: int, concurrency: int) -> None:
    from bullmq_compat import Worker

    async def process(job: Any) -> Any:
        return None

    finished = asyncio.get_running_loop().create_future()
    done = 0
    started = time.monotonic()

    def on_completed(*_: Any) -> None:
        nonlocal done
        done += 1
        if done % every == 0 or done == jobs:
            report(done, started)
        if done == jobs and not finished.done():
            finished.set_result(None)

    worker = Worker(queue, process, connection=url, concurrency=concurrency, remove_on_complete=True)
    worker.on("completed", on_completed)
    worker.on("error", lambda err, *_: print(f"worker error: {err!r}", file=sys.stderr))
    await worker.wait_until_ready()
    report(0, started)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    await finished
    await worker.close()
    await task


async def child_producer(url: str, queue: str, jobs: int, every: int) -> None:
    from bullmq_compat import Queue

    q = Queue(queue, connection=url)
    await q.wait_until_ready()
    started = time.monotonic()
    report(0, started)
    add = q.add
    for i in range(jobs):
        await add("bench", {"i": i})
        if (i + 1) % every == 0 or i + 1 == jobs:
            report(i + 1, started)
    await q.close()


# -- the driver -------------------------------------------------------------------------------------
async def preload(url: str, queue: str, jobs: int) -> None:
    from bullmq_compat import Queue

    q = Queue(queue, connection=url)
    for start in range(0, jobs, 1000):
        await q.add_bulk([{"name": "bench", "data": {"i": i}} for i in range(start, min(start + 1000, jobs))])
    await q.close()


def run_child(mode: str, url: str, queue: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    argv = [sys.executable, os.path.abspath(__file__), "--child", mode, "--url", url, "--queue", queue,
            "--jobs", str(args.jobs), "--every", str(args.every), "--concurrency", str(args.concurrency)]
    readings: list[dict[str, Any]] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            reading = json.loads(line)
            readings.append(reading)
            print(f"  {mode:<8} {reading['jobs']:>9,} jobs  RSS {reading['rssMb']:8.1f} MB  "
                  f"{reading['seconds']:7.1f} s", flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {mode} process exited with {proc.returncode}")
    return readings


def summary(readings: list[dict[str, Any]]) -> dict[str, Any]:
    rss = [r["rssMb"] for r in readings]
    steady = rss[1:] if len(rss) > 2 else rss
    return {"startMb": rss[0], "endMb": rss[-1], "minMb": min(rss), "maxMb": max(rss),
            "growthAfterFirstStepMb": round(steady[-1] - steady[0], 2),
            "spreadAfterFirstStepMb": round(max(steady) - min(steady), 2)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--modes", default="worker,producer")
    parser.add_argument("--concurrency", type=int, default=10, help="the worker's concurrency")
    parser.add_argument("--maxmemory", default="4gb", help="the redis-server's maxmemory")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", choices=("worker", "producer"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.every < 1 or args.concurrency < 1:
        parser.error("--jobs, --every and --concurrency must be >= 1")
    if args.child == "worker":
        asyncio.run(child_worker(args.url, args.queue, args.jobs, args.every, args.concurrency))
        return 0
    if args.child == "producer":
        asyncio.run(child_producer(args.url, args.queue, args.jobs, args.every))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"worker", "producer"}:
        parser.error("--modes takes worker,producer")

    from tests._redis_server import RedisServer

    server = RedisServer(extra_args=("--maxmemory", args.maxmemory)).start()
    results: dict[str, Any] = {}
    try:
        print(f"own redis-server on 127.0.0.1:{server.port} (maxmemory {args.maxmemory}); {args.jobs:,} jobs per "
              f"mode, RSS every {args.every:,}; load average {os.getloadavg()[0]:.2f}", flush=True)
        for mode in modes:
            queue = f"mem-{mode}-{os.getpid()}"
            if mode == "worker":
                t0 = time.monotonic()
                asyncio.run(preload(server.url, queue, args.jobs))
                print(f"  pre-loaded {args.jobs:,} jobs in {time.monotonic() - t0:.0f} s", flush=True)
            readings = run_child(mode, server.url, queue, args)
            results[mode] = {"readings": readings, "summary": summary(readings)}
            s = results[mode]["summary"]
            print(f"{mode}: RSS {s['startMb']:.1f} MB at start, {s['endMb']:.1f} MB at the end; from the first "
                  f"step to the end {s['growthAfterFirstStepMb']:+.1f} MB (spread {s['spreadAfterFirstStepMb']:.1f} MB)",
                  flush=True)
            subprocess.run(["redis-cli", "-p", str(server.port), "FLUSHALL"], capture_output=True, check=True)
    finally:
        server.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jobs": args.jobs, "every": args.every, "concurrency": args.concurrency, "results": results,
                       "loadavg_at_end": list(os.getloadavg())}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
