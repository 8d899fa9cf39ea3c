"""Issue #7: no leaks — in Redis keys, in connections, in memory.

- 2,000 jobs (some retried, some failing for good) with remove_on_complete=True and
  remove_on_fail=True: once they are done, the queue's keys (SCAN bull:<queue>:*) are exactly
  the ones a queue keeps for good — meta, id, events (plus stalled-check, which expires by
  itself) — and with groups, every grp:* key is gone but the add-sequence counter grp:seq.
- A long-running worker process: its connections (its sockets, and the CLIENT LIST entries at
  their addresses) are the same after 1,000 and after 5,000 jobs, and its RSS grows by less
  than LEAK_BOUND_KB between the two (see there). BULLMQ_COMPAT_CHAOS=1: 20,000 jobs.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis.asyncio as aioredis

from bullmq_compat import Queue, Worker
from tests.chaos_helpers import (
    CHAOS,
    EXPECTED_STATE,
    add_plan,
    chaos_worker,
    clients_of,
    local_ports,
    plan_jobs,
    poll_until,
    report,
    rss_kb,
    socket_inodes,
)
from tests.chaos_worker_proc import make_handler

#: What a queue keeps for good once every job is gone: the id counter, the meta hash (options,
#: version) and the events stream (trimmed to opts.maxLenEvents, never deleted).
KEPT = {"id", "meta", "events"}
#: Keys that expire by themselves, with the longest TTL each may have here: the stalled check's lock
#: (PX stalled_interval, 500 ms in these tests) and the group keepers' sweep lease (PX
#: group_sweep_interval, 500 ms, which a slow sweep stretches to SWEEP_DUTY_FACTOR times its own
#: duration: a sweep of 200 ms on a loaded machine leaves a 4 s lease; 30 s allows a 1.5 s sweep).
EXPIRING = {"stalled-check": 500, "grp:sweep": 30_000}
#: The group gate's add-sequence counter: it must keep growing for later adds, like "id".
GROUP_KEPT = {"grp:seq"}


async def queue_keys(client: aioredis.Redis, queue_name: str) -> dict[str, int]:
    """suffix -> PTTL of every key of the queue (a key that expired between the scan and its PTTL,
    -2, is gone: not listed)."""
    prefix = f"bull:{queue_name}:"
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    ttls = [await client.pttl(key) for key in keys]
    return {key[len(prefix):]: ttl for key, ttl in zip(keys, ttls) if ttl != -2}


@pytest.mark.parametrize("grouped", [0.0, 0.5], ids=["plain", "groups"])
async def test_removed_jobs_leave_no_keys(redis_url: str, queue_name: str, redis: aioredis.Redis,
                                          grouped: float) -> None:
    plan = plan_jobs(2000, seed=21, grouped=grouped, per_group=20, ms=(0, 2), retry=0.10, always=0.05,
                     fatal=0.05, extra_opts={"remove_on_complete": True, "remove_on_fail": True})
    want_completed = sum(EXPECTED_STATE[item["data"]["plan"]] == "completed" for item in plan.items)
    rec = f"rec:{queue_name}"
    record_client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    queue = Queue(queue_name, connection=redis_url)
    worker = Worker(queue_name, make_handler(record_client, rec, record=False), connection=redis_url,
                    concurrency=10, stalled_interval=500, group_sweep_interval=0.5)
    failed: list[str] = []
    worker.on("failed", lambda job, err, prev: failed.append(job.id) if job.finished_on else None)
    try:
        await queue.wait_until_ready()
        baseline = await queue_keys(redis, queue_name)
        assert set(baseline) == {"meta"}, baseline
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await add_plan(queue, plan)
            during = len(await queue_keys(redis, queue_name))

            async def done() -> bool:
                counts = await queue.get_job_counts()
                return int(await redis.get(f"{rec}:done") or 0) >= want_completed and not any(counts.values())

            async def progress() -> str:
                return f"done {await redis.get(f'{rec}:done')} of {want_completed}; {await queue.get_job_counts()}"

            await poll_until(done, 60, "every job to finish", progress)
            await asyncio.sleep(0.3)  # the last finishes' group releases
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
        after = await queue_keys(redis, queue_name)
        kept = KEPT | (GROUP_KEPT if grouped else set())
        persistent = {k for k, ttl in after.items() if ttl == -1}
        expiring = {k: ttl for k, ttl in after.items() if ttl != -1}
        report(f"\nkeys of bull:{queue_name}:*: baseline {sorted(baseline)}, {during} while adding, "
              f"after {sorted(after)} (expiring: {expiring}); {len(failed)} failed for good")
        assert persistent == kept, f"left behind: {sorted(persistent - kept)}; missing: {sorted(kept - persistent)}"
        assert set(expiring) <= set(EXPIRING) and all(0 < ttl <= EXPIRING[k] for k, ttl in expiring.items()), expiring
        assert len(failed) == sum(EXPECTED_STATE[item["data"]["plan"]] == "failed" for item in plan.items)
        if grouped:
            assert await queue.get_groups() == []
    finally:
        await queue.close()
        await record_client.aclose()


# -- a long-running worker process ------------------------------------------------------------------

#: RSS growth allowed between the samples after 1,000 and after 5,000 jobs. Every job carries a
#: 1 KB string in its data, so a worker that kept anything of each job (a Job object, its data,
#: a future, a span) would hold >= 1 KB more per job: >= 4,000 KB over those 4,000 jobs (19 MB
#: over the 19,000 of BULLMQ_COMPAT_CHAOS). Half of the smaller figure is still far above what a
#: warmed-up worker grows by (measured: ~330 KB after 5,000 jobs, ~580 KB after 20,000; tracemalloc
#: puts it in bounded caches, mostly the fast connection's encoding cache of at most 4,096 strings,
#: which fills with job keys before it is cleared).
LEAK_BOUND_KB = 2048
PAD = 1024


async def test_long_running_worker_keeps_its_connections_and_memory(redis_url: str, queue_name: str,
                                                                     redis: aioredis.Redis) -> None:
    checkpoints = [1000, 5000] + ([10_000, 20_000] if CHAOS else [])
    rec = f"rec:{queue_name}"
    queue = Queue(queue_name, connection=redis_url)
    samples: dict[int, dict[str, Any]] = {}
    want_completed = 0
    added = 0
    try:
        async with chaos_worker(redis_url, queue_name, rec, concurrency=10, lock_duration=30000,
                                stalled_interval=1000, name="leak", remove=True, record=False) as proc:
            for checkpoint in checkpoints:
                plan = plan_jobs(checkpoint - added, seed=checkpoint, grouped=0.25, per_group=20, ms=(0, 1),
                                 retry=0.05, always=0.02, fatal=0.02, pad=PAD,
                                 extra_opts={"remove_on_complete": True, "remove_on_fail": True})
                want_completed += sum(EXPECTED_STATE[it["data"]["plan"]] == "completed" for it in plan.items)
                added = checkpoint
                await add_plan(queue, plan)

                async def done() -> bool:
                    return int(await redis.get(f"{rec}:done") or 0) >= want_completed \
                        and await queue.count() == 0 and (await queue.get_job_counts("active"))["active"] == 0

                await poll_until(done, 120, f"{checkpoint} jobs to finish", every=0.05)
                await asyncio.sleep(0.5)  # settle: back to blocking on the marker
                clients = await clients_of(redis, proc.pid)
                samples[checkpoint] = {
                    "rss_kb": rss_kb(proc.pid), "sockets": len(socket_inodes(proc.pid)),
                    "tcp": len(local_ports(proc.pid)),
                    "clients": sorted((c.get("name", ""), c["addr"]) for c in clients),
                    "cmds": sorted(c.get("cmd", "") for c in clients)}
            assert proc.proc is not None and proc.proc.returncode is None
    finally:
        await queue.close()
        with contextlib.suppress(Exception):
            await redis.delete(f"{rec}:done")
    first, last = samples[checkpoints[0]], samples[checkpoints[-1]]
    report("\nlong-running worker: " + "; ".join(
        f"after {n}: RSS {s['rss_kb']} KB, {s['sockets']} sockets, {len(s['clients'])} Redis clients"
        for n, s in samples.items()))
    report(f"RSS growth {first['rss_kb']} -> {last['rss_kb']} KB: {last['rss_kb'] - first['rss_kb']} KB "
           f"over {checkpoints[-1] - checkpoints[0]} jobs (bound {LEAK_BOUND_KB} KB)")
    print(f"clients {last['clients']}, their last commands {last['cmds']}")
    # The worker's redis-py pool opens a second connection the first time two commands of the
    # worker's tasks that use it overlap, which may happen after the first sample (seen in about
    # one run in five, before and after the group finish became a Redis Function; last command
    # EVALSHA): one connection more, once, is that, not a leak (a leak grows with the jobs:
    # thousands here).
    for n, s in samples.items():
        assert first["sockets"] <= s["sockets"] <= first["sockets"] + 1, \
            f"sockets after {n} jobs: {s['sockets']} (first {first['sockets']})"
        assert len(first["clients"]) <= len(s["clients"]) <= len(first["clients"]) + 1, \
            f"Redis clients after {n} jobs: {s['clients']} vs {first['clients']}"
    assert last["sockets"] - first["sockets"] == len(last["clients"]) - len(first["clients"])
    assert len(first["clients"]) == first["tcp"], "a TCP socket of the worker is not a Redis connection"
    # the worker's own: its fast connection, its marker wait, redis-py's pool and the group keeper's
    # stream reader (the other two are the test handler's records, at most two by its pool)
    worker_own = [c for c in last["clients"] if not c[0].startswith("rec:")]
    assert len(worker_own) <= 5, f"the worker holds {len(worker_own)} connections: {worker_own}"
    assert last["rss_kb"] - first["rss_kb"] < LEAK_BOUND_KB
