"""bullmq-compat side of scripts/bench.py: one measurement per invocation, in a process of its own.

    .venv/bin/python scripts/bench_compat.py '<json>'

Input and output are those of interop/bench.js (see there): {redis, queue, op, jobs, concurrency,
removeOnComplete, batch, interval} in, one line of JSON {seconds, jobs, cpuUserMs, cpuSysMs,
redisCommandstats, redisCpuBefore, redisCpuAfter, latenciesMs?} out. With {postgres: url, schema}
instead of redis, the queue lives in that PostgreSQL schema (migrated by the client itself, untimed,
before the measurement) and the output has no Redis figures.

The measuring harness (`run`) is shared with scripts/bench_official.py, which plugs in the
official PyPI ``bullmq`` port instead: both Python clients run exactly the same driving code,
and neither library is imported until its adapter is built.
"""
from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
import traceback
from typing import Any, Awaitable, Callable, Optional

JOB_NAME = "bench"


def now_ms() -> float:
    return time.time() * 1000.0


class Meter:
    """Wall clock (perf_counter) and this process's CPU (getrusage: user and system) of the timed section."""

    def __init__(self) -> None:
        self.t0 = self.t1 = 0.0
        self.ru0: Any = None
        self.ru1: Any = None

    def start(self) -> None:
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.t1 = time.perf_counter()
        self.ru1 = resource.getrusage(resource.RUSAGE_SELF)

    def result(self, jobs: int) -> dict[str, Any]:
        return {
            "seconds": self.t1 - self.t0,
            "jobs": jobs,
            "cpuUserMs": (self.ru1.ru_utime - self.ru0.ru_utime) * 1000.0,
            "cpuSysMs": (self.ru1.ru_stime - self.ru0.ru_stime) * 1000.0,
        }


class RedisStats:
    """CONFIG RESETSTAT before and INFO after the timed section, on a connection of its own.

    It speaks RESP itself (a few lines): this harness also runs in the official port's venv, and
    only the Redis backend's own files import a Redis client."""

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.streams: Any = None
        self.cpu_before = ""

    async def _command(self, *args: str) -> str:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(f"*{len(args)}\r\n".encode() + b"".join(
            f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args))
        await writer.drain()
        head = (await reader.readline()).decode().rstrip("\r\n")
        if head.startswith("$"):  # a bulk string: INFO's text
            text = (await reader.readexactly(int(head[1:]) + 2))[:-2]
            return text.decode()
        if head.startswith("-"):
            raise RuntimeError(f"Redis refused {args[0]}: {head[1:]}")
        return head[1:]  # +OK

    async def reset(self) -> None:
        await self._command("CONFIG", "RESETSTAT")
        self.cpu_before = await self._command("INFO", "cpu")

    async def read(self) -> dict[str, Any]:
        return {
            "redisCpuBefore": self.cpu_before,
            "redisCpuAfter": await self._command("INFO", "cpu"),
            "redisCommandstats": await self._command("INFO", "commandstats"),
        }

    async def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


class Adapter:
    """What the harness needs from a client library; one subclass per implementation."""

    async def queue_ready(self) -> None: ...
    async def add(self, i: int) -> Any: ...
    async def add_bulk(self, items: list[dict[str, Any]]) -> Any: ...
    async def close_queue(self) -> None: ...

    def make_worker(self, on_start: Optional[Callable[[Any], None]], concurrency: int,
                    remove_on_complete: bool, on_completed: Callable[..., None]) -> None:
        """A worker whose processor does nothing (on_start None) or only calls on_start(job).

        The adapter writes the processor with the signature its library calls natively, so no
        wrapper layer is added to any implementation."""
    async def worker_ready(self) -> None: ...
    def start_worker(self) -> None: ...
    async def close_worker(self) -> None: ...


async def preload(adapter: Adapter, jobs: int, batch: int, groups: int = 0) -> None:
    """Add the jobs in bulk; with ``groups``, job i belongs to group ``g<i % groups>`` (bullmq-compat only)."""
    for start in range(0, jobs, batch):
        await adapter.add_bulk([
            {"name": JOB_NAME, "data": {"i": i}, **({"opts": {"group": f"g{i % groups}"}} if groups else {})}
            for i in range(start, min(start + batch, jobs))])


async def op_add(args: dict[str, Any], adapter: Adapter, stats: RedisStats, meter: Meter) -> dict[str, Any]:
    await stats.reset()
    add = adapter.add
    meter.start()
    for i in range(args["jobs"]):
        await add(i)
    meter.stop()
    return {}


async def op_add_bulk(args: dict[str, Any], adapter: Adapter, stats: RedisStats, meter: Meter) -> dict[str, Any]:
    await stats.reset()
    meter.start()
    await preload(adapter, args["jobs"], args.get("batch") or 1000)
    meter.stop()
    return {}


async def op_process(args: dict[str, Any], adapter: Adapter, stats: RedisStats, meter: Meter) -> dict[str, Any]:
    jobs = args["jobs"]
    rate = args.get("groupRateLimit")  # {"max", "duration"}: every group limited so (bullmq-compat only)
    if rate:
        await adapter.queue.set_default_group_rate_limit(max=rate["max"], duration=rate["duration"])  # type: ignore[attr-defined]
    await preload(adapter, jobs, args.get("batch") or 1000, args.get("groups") or 0)
    all_done = asyncio.get_running_loop().create_future()
    done = 0
    # with a rate limit: the time the first window's jobs (groups x max) were done, for the steady rate
    first_window = (args.get("groups") or 0) * rate["max"] if rate else 0
    t_first: list[float] = []

    def on_completed(*_: Any) -> None:
        nonlocal done
        done += 1
        if done == first_window:
            t_first.append(time.perf_counter())
        if done == jobs:
            meter.stop()
            t_end = time.perf_counter()
            if t_first and t_end > t_first[0]:
                extra["steadyJobsPerSec"] = (jobs - first_window) / (t_end - t_first[0])
            all_done.set_result(None)

    extra: dict[str, Any] = {}

    adapter.make_worker(None, args.get("concurrency") or 1, bool(args.get("removeOnComplete")), on_completed)
    await adapter.worker_ready()
    await stats.reset()
    meter.start()
    adapter.start_worker()
    await all_done
    await adapter.close_worker()
    return extra


async def op_latency(args: dict[str, Any], adapter: Adapter, stats: RedisStats, meter: Meter) -> dict[str, Any]:
    jobs = args["jobs"]
    latencies: list[float] = []
    all_done = asyncio.get_running_loop().create_future()

    def on_start(job: Any) -> None:
        latencies.append(now_ms() - job.timestamp)

    def on_completed(*_: Any) -> None:
        if len(latencies) == jobs and not all_done.done():
            meter.stop()
            all_done.set_result(None)

    adapter.make_worker(on_start, args.get("concurrency") or 1, bool(args.get("removeOnComplete")), on_completed)
    await adapter.worker_ready()
    adapter.start_worker()
    await asyncio.sleep(0.3)  # let the worker go idle: blocked on the queue marker
    await stats.reset()
    meter.start()
    interval = args.get("interval", 20)
    t0 = now_ms()
    for i in range(jobs):
        wait = t0 + i * interval - now_ms()
        if wait > 0:
            await asyncio.sleep(wait / 1000.0)
        await adapter.add(i)
    await all_done
    await adapter.close_worker()
    return {"latenciesMs": latencies}


OPS = {"add": op_add, "addBulk": op_add_bulk, "process": op_process, "latency": op_latency}


class NoStats:
    """Stands in for RedisStats on PostgreSQL: no server figures."""

    async def reset(self) -> None:
        pass

    async def read(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        pass


async def run_async(args: dict[str, Any], make_adapter: Callable[[dict[str, Any]], Adapter]) -> dict[str, Any]:
    op = OPS.get(args.get("op", ""))
    if op is None:
        raise ValueError(f"unknown op {args.get('op')!r}")
    adapter = make_adapter(args)
    await adapter.queue_ready()
    stats: Any = NoStats() if args.get("postgres") else RedisStats(args["redis"])
    meter = Meter()
    extra = await op(args, adapter, stats, meter)
    out = {**meter.result(args["jobs"]), **extra, **(await stats.read())}
    await adapter.close_queue()
    await stats.close()
    return out


def run(make_adapter: Callable[[dict[str, Any]], Adapter]) -> None:
    """Entry point of both Python runners: argv[1] is the JSON job description."""
    args = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    try:
        out = asyncio.run(run_async(args, make_adapter))
    except BaseException:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


class CompatAdapter(Adapter):
    def __init__(self, args: dict[str, Any]) -> None:
        from bullmq_compat import Queue

        self.args = args
        # PostgreSQL: the schema is migrated as the queue connects (untimed: queue_ready)
        self.where: dict[str, Any] = ({"connection": args["postgres"], "schema": args["schema"], "migrate": True}
                                      if args.get("postgres") else {"connection": args["redis"]})
        self.queue = Queue(args["queue"], **self.where)
        self.worker: Any = None
        self.task: Optional[asyncio.Future[Any]] = None

    async def queue_ready(self) -> None:
        await self.queue.wait_until_ready()
        if self.args.get("pgGroups"):  # our group objects in the run's schema (untimed)
            from bullmq_compat import migrate_postgres

            await migrate_postgres(self.args["postgres"], self.args["schema"], groups=True)

    def add(self, i: int) -> Awaitable[Any]:
        return self.queue.add(JOB_NAME, {"i": i})

    def add_bulk(self, items: list[dict[str, Any]]) -> Awaitable[Any]:
        return self.queue.add_bulk(items)

    async def close_queue(self) -> None:
        await self.queue.close()

    def make_worker(self, on_start: Optional[Callable[[Any], None]], concurrency: int,
                    remove_on_complete: bool, on_completed: Callable[..., None]) -> None:
        from bullmq_compat import Worker

        if on_start is None:
            async def process(job: Any) -> Any:
                return None
        else:
            async def process(job: Any) -> Any:
                on_start(job)

        batch = {"batch": {"size": self.args["batchSize"]}} if self.args.get("batchSize") else {}
        self.worker = Worker(self.args["queue"], process, **self.where, concurrency=concurrency,
                             remove_on_complete=True if remove_on_complete else None, **batch)
        self.worker.on("error", lambda err, *_: print(f"worker error: {err!r}", file=sys.stderr))
        self.worker.on("completed", on_completed)

    async def worker_ready(self) -> None:
        await self.worker.wait_until_ready()

    def start_worker(self) -> None:
        self.task = asyncio.ensure_future(self.worker.run(handle_signals=False))

    async def close_worker(self) -> None:
        await self.worker.close()
        if self.task is not None:
            await self.task


if __name__ == "__main__":
    run(CompatAdapter)
