"""Worker throughput on PostgreSQL: our channel against Node BullMQ's Postgres worker, same machine, same run.

    .venv/bin/python scripts/bench_postgres.py [--jobs 3000] [--rounds 3] [--concurrency 1 10] [--no-node]

Each measurement gets a fresh schema (migrated, dropped after) and ``--jobs`` no-op jobs added with
``add_jobs`` (1,000 per call, untimed). Ours: ``concurrency`` slots, each claiming with
``move_to_active`` and then finishing with ``move_to_finished(fetch_next=True)`` through one
`PostgresWorkerChannel` until nothing is left -- the worker's steady state, one SQL call per job.
``--async-commit`` adds ours with the opt-in ``synchronous_commit=off`` of the worker's sessions
(Redis-like durability; not comparable with Node, whose commits wait for the disk).
Node: ``interop/bench_pg.js`` (a Worker with an empty processor, timed from run() to the last
'completed'). Rounds alternate ours / Node so both see the same machine load; the median of the
rounds is reported, with client CPU per job (this process, or the Node process).

The server is whatever POSTGRES_URL names (default postgresql://postgres@127.0.0.1:5432/test).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bullmq_compat import migrate_postgres  # noqa: E402
from bullmq_compat._backends.base import NewJob, WorkerSettings  # noqa: E402
from bullmq_compat._backends.postgres.backend import PostgresBackend  # noqa: E402
from bullmq_compat._backends.postgres.connection import PostgresConnection  # noqa: E402

URL = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
QUEUE = "bench"


def now_ms() -> int:
    return int(time.time() * 1000)


def backend_class() -> type[PostgresBackend]:
    """PostgresBackend, with contract methods it may not have yet stubbed (unused here)."""
    missing = getattr(PostgresBackend, "__abstractmethods__", frozenset())
    if not missing:
        return PostgresBackend

    def stub(*_: Any, **__: Any) -> Any:
        raise NotImplementedError

    return type("PostgresBackend", (PostgresBackend,), {name: stub for name in missing})


def drop_schema(schema: str) -> None:
    subprocess.run([shutil.which("psql") or "psql", "-X", "-q", "-c", f'DROP SCHEMA IF EXISTS "{schema}" CASCADE',
                    "--dbname", URL], check=True, capture_output=True, timeout=60)


async def ours(jobs: int, concurrency: int, synchronous_commit: Optional[str] = None) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    await migrate_postgres(URL, schema)
    backend = backend_class()(PostgresConnection(URL, schema=schema), QUEUE)
    try:
        await backend.connect()
        stamp = now_ms()
        for start in range(0, jobs, 1000):
            batch = [NewJob("bench", {"i": i}, {"attempts": 0}, stamp) for i in range(start, min(jobs, start + 1000))]
            await backend.add_jobs(batch)
        channel = await backend.open_worker_channel(
            WorkerSettings(name="bench", extra={"concurrency": concurrency, "synchronous_commit": synchronous_commit}),
            backend.client_name(":w:bench"))
        done = 0

        async def slot(index: int) -> None:
            nonlocal done
            token = f"bench:{index}"
            _, job_id, _, _ = await channel.move_to_active(token, now_ms())
            while job_id is not None:
                reply = await channel.move_to_finished(job_id, {}, "completed", "null", token, now_ms(), True)
                done += 1
                job_id = reply[1] if reply is not None else None

        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        await asyncio.gather(*(slot(i) for i in range(concurrency)))
        seconds = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        await channel.close()
        assert done == jobs, (done, jobs)
        cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        return {"jobs_per_s": jobs / seconds, "cpu_us_per_job": cpu / jobs * 1e6}
    finally:
        await backend.close()
        drop_schema(schema)


def node(jobs: int, concurrency: int) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    args = {"postgres": URL, "schema": schema, "migrate": True, "queue": QUEUE, "jobs": jobs,
            "concurrency": concurrency}
    try:
        out = subprocess.run(["node", str(ROOT / "interop" / "bench_pg.js"), json.dumps(args)],
                             capture_output=True, text=True, timeout=600, check=True).stdout
    finally:
        drop_schema(schema)
    result = json.loads(out.strip().splitlines()[-1])
    return {"jobs_per_s": float(result["jobsPerSec"]),
            "cpu_us_per_job": (result["cpuUserMs"] + result["cpuSysMs"]) * 1000 / jobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--no-node", action="store_true", help="measure ours only")
    parser.add_argument("--async-commit", action="store_true",
                        help="also measure ours with the opt-in synchronous_commit=off (not Node's durability)")
    args = parser.parse_args()
    for concurrency in args.concurrency:
        runs: dict[str, list[dict[str, float]]] = {"bullmq-compat": [], "node": [], "ours, async": []}
        for _ in range(args.rounds):
            runs["bullmq-compat"].append(asyncio.run(ours(args.jobs, concurrency)))
            if args.async_commit:
                runs["ours, async"].append(asyncio.run(ours(args.jobs, concurrency, "off")))
            if not args.no_node:
                runs["node"].append(node(args.jobs, concurrency))
        for who, results in runs.items():
            if not results:
                continue
            rates = [r["jobs_per_s"] for r in results]
            cpu = statistics.median(r["cpu_us_per_job"] for r in results)
            print(f"c={concurrency:<3} {who:<14} {statistics.median(rates):7.0f} jobs/s  (rounds: "
                  f"{', '.join(f'{r:.0f}' for r in rates)})  client CPU {cpu:.0f} us/job", flush=True)
        if runs["node"]:
            ratio = statistics.median(r["jobs_per_s"] for r in runs["bullmq-compat"]) / statistics.median(
                r["jobs_per_s"] for r in runs["node"])
            print(f"c={concurrency:<3} ours / node    {ratio:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
