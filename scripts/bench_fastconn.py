"""Benchmark: FastConnection vs redis-py asyncio for EVALSHA of a trivial script.

    .venv/bin/python scripts/bench_fastconn.py [--n 200000] [--windows 1,10,100] [--url redis://...]

Without --url (or REDIS_URL) it starts a throw-away redis-server.  For each window
W (commands in flight at once) it runs N commands and prints commands/s (wall
clock) and client CPU microseconds per command (time.process_time, so the
redis-server process is not counted).

Modes:
  fast-batch     FastConnection: issue W commands in one tick, await the last one
                 (replies resolve in order), check every result.
  fast-tasks     FastConnection: W concurrent tasks, each awaiting one command at a time.
  redispy-pipe   redis-py: a non-transactional pipeline of W commands, awaited.
  redispy-plain  redis-py: W concurrent tasks, each awaiting one command at a time
                 (the pool opens up to W connections).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any, Awaitable, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bullmq_compat._backends.redis.connection import RedisHandle  # noqa: E402  (its redis-py client)
from bullmq_compat._backends.redis.fastconn import FastConnection  # noqa: E402

SCRIPT = "return ARGV[1]"
KEY = "bench:fastconn"
ARG = "7"


async def fast_batch(conn: FastConnection, sha: str, n: int, window: int) -> None:
    ex = conn.execute
    done = 0
    while done < n:
        w = min(window, n - done)
        futs = [ex("EVALSHA", sha, 1, KEY, ARG) for _ in range(w)]
        await futs[-1]
        for f in futs:
            if f.result() != b"7":
                raise AssertionError(f.result())
        done += w


async def fast_tasks(conn: FastConnection, sha: str, n: int, window: int) -> None:
    ex = conn.execute
    per, extra = divmod(n, window)

    async def worker(count: int) -> None:
        for _ in range(count):
            if await ex("EVALSHA", sha, 1, KEY, ARG) != b"7":
                raise AssertionError

    await asyncio.gather(*(worker(per + (1 if i < extra else 0)) for i in range(window)))


async def redispy_pipe(client: Any, sha: str, n: int, window: int) -> None:
    done = 0
    while done < n:
        w = min(window, n - done)
        pipe = client.pipeline(transaction=False)
        for _ in range(w):
            pipe.evalsha(sha, 1, KEY, ARG)
        results = await pipe.execute()
        if results[-1] != b"7":
            raise AssertionError(results[-1])
        done += w


async def redispy_plain(client: Any, sha: str, n: int, window: int) -> None:
    per, extra = divmod(n, window)

    async def worker(count: int) -> None:
        for _ in range(count):
            if await client.evalsha(sha, 1, KEY, ARG) != b"7":
                raise AssertionError

    await asyncio.gather(*(worker(per + (1 if i < extra else 0)) for i in range(window)))


async def measure(run: Awaitable[None], n: int) -> tuple[float, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await run
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return n / wall, cpu * 1e6 / n


async def main(url: str, n: int, windows: list[int], modes: list[str]) -> None:
    client = RedisHandle({"url": url, "max_connections": max(windows) + 4, "decode_responses": False}).client
    sha = await client.script_load(SCRIPT)
    conn = await FastConnection.from_redis_py(client)

    runners: dict[str, Callable[[int, int], Awaitable[None]]] = {
        "fast-batch": lambda count, w: fast_batch(conn, sha, count, w),
        "fast-tasks": lambda count, w: fast_tasks(conn, sha, count, w),
        "redispy-pipe": lambda count, w: redispy_pipe(client, sha, count, w),
        "redispy-plain": lambda count, w: redispy_plain(client, sha, count, w),
    }
    # warm up every path (connections, caches) before measuring
    for mode in modes:
        for w in windows:
            await runners[mode](max(2000, w * 20), w)

    print(f"EVALSHA {SCRIPT!r}, N={n:,} per row, Python {sys.version.split()[0]}, {url}")
    print(f"{'mode':<15}{'window':>7}{'cmds/s':>12}{'client CPU us/cmd':>20}")
    for mode in modes:
        for w in windows:
            rate, cpu_us = await measure(runners[mode](n, w), n)
            print(f"{mode:<15}{w:>7}{rate:>12,.0f}{cpu_us:>20.1f}", flush=True)
    await conn.close()
    await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--windows", default="1,10,100")
    parser.add_argument("--modes", default="fast-batch,fast-tasks,redispy-pipe,redispy-plain")
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"))
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    modes = args.modes.split(",")
    server = None
    url = args.url
    if not url:
        from tests._redis_server import RedisServer

        server = RedisServer().start()
        url = server.url
    try:
        asyncio.run(main(url, args.n, windows, modes))
    finally:
        if server is not None:
            server.stop()
