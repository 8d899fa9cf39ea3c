"""What the PostgreSQL group gate costs the database, per job, without the noise of a busy machine.

    .venv/bin/python scripts/bench_pg_gate.py [--jobs 5000] [--groups 250] [--rounds 3]

One session claims and finishes pre-loaded no-op jobs one after the other, as a worker at
concurrency 1 does (upstream's ``move_to_active``, then ``move_to_completed_fetch`` per job, one
transaction each, ``synchronous_commit`` off so that the WAL flush is not timed), and the server
CPU that session's backend used over the loop is read from ``/proc/<pid>/stat``: so the server
must run on this machine. Two kinds of runs alternate, each on a fresh schema with our group
objects (migrated, dropped after): **plain** (ungrouped jobs) and **grouped** (the jobs over
``--groups`` groups, so every finish releases its group's next job through our trigger).

Prints server CPU µs per job and wall µs per job of each run, their medians, and the grouped run's
extra server CPU per job. ``make bench``'s pg-process-grouped row measures the same pair through
a worker at concurrency 10; this one isolates the database's share (docs/performance.md,
"PostgreSQL groups"). The server is whatever POSTGRES_URL names (default
postgresql://postgres@127.0.0.1:5432/test).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bullmq_compat import Queue, migrate_postgres  # noqa: E402

URL = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
CLAIM = "SELECT id FROM move_to_active(%s, %s, %s, %s, %s, %s, %s)"
FINISH = ("SELECT id FROM move_to_completed_fetch(%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, "
          "%s)")


def backend_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local process (the session's backend)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        raise SystemExit(f"bench_pg_gate: backend pid {pid} is not a process of this machine: the server "
                         "must run here (its CPU is read from /proc)") from None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(jobs: int, groups: int) -> tuple[float, float]:
    """(server CPU µs per job, wall µs per job) of one run; groups 0: plain jobs."""
    schema = f"bench_gate_{uuid.uuid4().hex[:8]}"
    await migrate_postgres(URL, schema, groups=True)
    try:
        queue = Queue("q", connection=URL, schema=schema)
        try:
            for start in range(0, jobs, 1000):
                await queue.add_bulk([{"name": "j", "data": {"i": i},
                                       **({"opts": {"group": f"g{i % groups}"}} if groups else {})}
                                      for i in range(start, min(jobs, start + 1000))])
        finally:
            await queue.close()
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute("SET synchronous_commit TO off")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            row = conn.execute(CLAIM, ["q", "t", 30000, int(time.time() * 1000), "w", None, None]).fetchone()
            done = 0
            cpu0, wall0 = backend_cpu_s(pid), time.perf_counter()
            while row is not None and row[0] is not None:
                now = int(time.time() * 1000)
                row = conn.execute(FINISH, ["q", row[0], "t", "null", now, False, None, None, 30000, now, "w",
                                            None, None]).fetchone()
                done += 1
            wall, cpu = time.perf_counter() - wall0, backend_cpu_s(pid) - cpu0
            left = conn.execute("SELECT count(*) FROM job WHERE state <> 'completed'").fetchone()[0]  # type: ignore[index]
        if done != jobs or left:
            raise SystemExit(f"bench_pg_gate: {done:,} of {jobs:,} jobs finished, {left:,} left: the run is void")
        return cpu / done * 1e6, wall / done * 1e6
    finally:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.jobs < 1 or args.groups < 1 or args.rounds < 1:
        parser.error(f"--jobs, --groups and --rounds must be at least 1, not {args.jobs}, {args.groups}, "
                     f"{args.rounds}")
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "grouped": []}
    for r in range(args.rounds):
        order = ("plain", "grouped") if r % 2 == 0 else ("grouped", "plain")
        for kind in order:
            cpu, wall = await one_run(args.jobs, args.groups if kind == "grouped" else 0)
            results[kind].append((cpu, wall))
            print(f"  round {r + 1} {kind:<8} server CPU {cpu:6.0f} µs/job   wall {wall:6.0f} µs/job", flush=True)
    med = {kind: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
           for kind, runs in results.items()}
    print(f"{args.jobs:,} jobs ({args.groups:,} groups when grouped), {args.rounds} round(s), one session, "
          "synchronous_commit off; medians:")
    for kind, (cpu, wall) in med.items():
        print(f"  {kind:<8} server CPU {cpu:6.0f} µs/job   wall {wall:6.0f} µs/job")
    ratio = f" ({med['grouped'][0] / med['plain'][0]:.2f}x)" if med["plain"][0] > 0 else ""
    print(f"  grouped - plain: {med['grouped'][0] - med['plain'][0]:+.0f} µs of server CPU per job{ratio} "
          "(CPU is counted in clock ticks: give a run some thousands of jobs)")


if __name__ == "__main__":
    asyncio.run(main())
