"""arq side of scripts/bench.py (run in bench-results/.venv-arq): see scripts/bench_peer_common.py.

    bench-results/.venv-arq/bin/python scripts/bench_peer_arq.py '<json>'

arq is asyncio-based, like bullmq-compat: its worker runs in the runner's own process, as ours does
in bench_compat.py (arq.worker.Worker, started inside the timed section, so its start-up counts),
concurrency = max_jobs (asyncio tasks), poll_delay 0 (arq polls the queue's sorted set; its default
is 0.5 s between polls) and its default queue_read_limit. Completion: arq's own after_job_end hook
(run once the job's result is recorded) counts the jobs; no harness command per job. Enqueue:
ArqRedis.enqueue_job, one awaited call per job. Bulk: none ("--"). Results are kept (arq's default
keep_result, 3,600 s).
"""
from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_peer_common import Meter, Resp, Stats, now_ms, run  # noqa: E402


async def noop(ctx: dict[str, Any], i: int) -> None:
    return None


async def main(args: dict[str, Any], stats: Stats, meter: Meter) -> dict[str, Any]:
    import importlib.metadata

    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    jobs, op, concurrency = args["jobs"], args["op"], args.get("concurrency") or 1
    queue = args["queue"]
    settings = RedisSettings.from_dsn(args["redis"])
    pool = await create_pool(settings, default_queue_name=queue)
    extra: dict[str, Any] = {"version": importlib.metadata.version("arq")}
    latencies: list[float] = []

    async def started(ctx: dict[str, Any], i: int, enqueued_ms: float) -> None:
        latencies.append(now_ms() - enqueued_ms)

    if op == "add":
        stats.reset()
        meter.start()
        for i in range(jobs):
            await pool.enqueue_job("noop", i)
        meter.stop()
        stats.take()
    elif op in ("process", "latency"):
        if op == "process":
            for i in range(jobs):  # untimed; arq has no bulk enqueue
                await pool.enqueue_job("noop", i)
        done = asyncio.get_running_loop().create_future()
        count = 0

        async def after_job_end(ctx: dict[str, Any]) -> None:
            nonlocal count
            count += 1
            if count == jobs and not done.done():
                meter.stop()
                stats.take()
                done.set_result(None)

        extra["model"] = f"1 process, max_jobs={concurrency} (asyncio tasks), poll_delay 0"
        if op == "process":
            stats.reset()
            meter.start()
        worker = Worker(functions=[func(noop, name="noop"), func(started, name="started")], queue_name=queue,
                        redis_settings=settings, max_jobs=concurrency, poll_delay=0, handle_signals=False,
                        after_job_end=after_job_end)
        task = asyncio.ensure_future(worker.async_run())
        if op == "latency":
            await asyncio.sleep(0.3)  # the worker started and idle, as in bench_compat.py
            stats.reset()
            meter.start()
            interval = args.get("interval", 20)
            t0 = now_ms()
            for i in range(jobs):
                wait = t0 + i * interval - now_ms()
                if wait > 0:
                    await asyncio.sleep(wait / 1000.0)
                await pool.enqueue_job("started", i, now_ms())
        await done
        await worker.close()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if op == "latency":
            extra["latenciesMs"] = latencies
    else:
        raise ValueError(f"unknown op {op!r}")
    await pool.aclose()
    return extra


def body(args: dict[str, Any], resp: Resp, stats: Stats, meter: Meter) -> dict[str, Any]:
    resp.command("DEL", "bench-peer:done")
    return asyncio.run(main(args, stats, meter))


if __name__ == "__main__":
    run(body)
