"""What a transaction costs on PostgreSQL (issue #29's bench rows), same machine, same run.

    .venv/bin/python scripts/bench_transactions.py [--jobs 2000] [--rounds 3]

Two pairs, each on a fresh schema (migrated, dropped after), rounds alternating A / B:

- **enqueue**: a one-row business transaction (INSERT into an ``orders`` table) and then
  ``queue.add`` after the commit, against the same INSERT and ``queue.add(transaction=conn)``
  inside it (one commit instead of two);
- **completion**: a worker (concurrency 10) whose processor writes one row in a transaction of its
  own, against ``Worker(transactional=True)`` writing it on ``job.transaction`` (committed with
  the completion).

Prints jobs per second (median of the rounds) and the ratio transactional / plain. The server is
whatever POSTGRES_URL names (default postgresql://postgres@127.0.0.1:5432/test).
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
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bullmq_compat import Queue, Worker, migrate_postgres  # noqa: E402

URL = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def fresh_schema() -> str:
    schema = f"bench_tx_{uuid.uuid4().hex[:8]}"
    await migrate_postgres(URL, schema)
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await conn.execute(f'CREATE TABLE "{schema}".orders (id int PRIMARY KEY)')
    return schema


async def drop(schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def enqueue(jobs: int, transactional: bool) -> float:
    schema = await fresh_schema()
    queue = Queue("bench", connection=URL, schema=schema)
    try:
        await queue.wait_until_ready()
        async with await psycopg.AsyncConnection.connect(URL) as conn:
            started = time.perf_counter()
            for i in range(jobs):
                async with conn.transaction():
                    await conn.execute(f'INSERT INTO "{schema}".orders VALUES (%s)', [i])
                    if transactional:
                        await queue.add("confirm", {"order": i}, transaction=conn)
                if not transactional:
                    await queue.add("confirm", {"order": i})
            return jobs / (time.perf_counter() - started)
    finally:
        await queue.close()
        await drop(schema)


async def completion(jobs: int, transactional: bool) -> float:
    schema = await fresh_schema()
    queue = Queue("bench", connection=URL, schema=schema)
    done = asyncio.Event()
    finished = 0
    pool: Any = None
    if transactional:
        async def process(job: Any) -> None:
            await job.transaction.execute(f'INSERT INTO "{schema}".orders VALUES (%s)', [job.data["i"]])
    else:
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(URL, min_size=10, max_size=10, open=False)
        await pool.open()

        async def process(job: Any) -> None:
            async with pool.connection() as conn:
                await conn.execute(f'INSERT INTO "{schema}".orders VALUES (%s)', [job.data["i"]])

    def on_completed(*_: Any) -> None:
        nonlocal finished
        finished += 1
        if finished >= jobs:
            done.set()

    try:
        for start in range(0, jobs, 1000):
            await queue.add_bulk([{"name": "j", "data": {"i": i}} for i in range(start, min(start + 1000, jobs))])
        worker = Worker("bench", process, connection=URL, schema=schema, concurrency=10, transactional=transactional)
        worker.on("completed", on_completed)
        started = time.perf_counter()
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        await asyncio.wait_for(done.wait(), 600)
        seconds = time.perf_counter() - started
        await worker.close()
        await running
        return jobs / seconds
    finally:
        if pool is not None:
            await pool.close()
        await queue.close()
        await drop(schema)


async def pair(name: str, run: Callable[[int, bool], Awaitable[float]], jobs: int, rounds: int) -> None:
    plain: list[float] = []
    tx: list[float] = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for transactional in order:
            (tx if transactional else plain).append(await run(jobs, transactional))
    p, t = statistics.median(plain), statistics.median(tx)
    ratios = [b / a for a, b in zip(plain, tx)]
    print(f"| {name} | {p:,.0f} | {t:,.0f} | {statistics.median(ratios):.2f}× |", flush=True)


async def answers() -> bool:
    try:
        async with await psycopg.AsyncConnection.connect(URL, connect_timeout=5):
            return True
    except psycopg.OperationalError:
        return False


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.jobs < 1 or args.rounds < 1:
        parser.error(f"--jobs and --rounds must be >= 1 (got {args.jobs}, {args.rounds})")
    if not await answers():
        print(f"PostgreSQL transactions: skipped, no PostgreSQL answers at {URL} (set POSTGRES_URL)")
        return
    print(f"PostgreSQL transactions, {args.jobs} jobs, median of {args.rounds} rounds (jobs/s)\n")
    print("| row | plain | transactional | transactional / plain |")
    print("|---|---|---|---|")
    await pair("enqueue: one business row, then add / add inside its transaction", enqueue, args.jobs, args.rounds)
    await pair("completion, concurrency 10: the row in its own transaction / in the job's", completion,
               args.jobs, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
