"""Node's job.retry() (Bull-Board's *Retry*) on a failed group job while its group is busy, on Redis
(issue #28 section 6): upstream's reprocessJob moves the job straight to wait, past our gate, and a
keeper that follows the events stream puts it back behind the gate when it reads the retry's
'waiting' event (prev "failed", no "gid"). How often the retried job still runs beside its group's
current job is measured with the keeper's regating off (before) and on (after):

- Node workers with free slots: a Node worker may take the retried job before the keeper reads the
  event; the keeper then counts it in its group's running set (nothing else of the group is released
  beside it), and the overlap is reported, not hidden.
- Node workers whose slots are all busy: the retried job waits in wait for a slot, the keeper reads
  the event first, and no retried job runs beside its group's current job.

Each try: group g gets A (fails for good) and B (runs 1 s); once B runs, Node retries A. Every
start is recorded by interop/group_worker.js with how many of the group's jobs ran at that moment.
"""
from __future__ import annotations

import uuid
from typing import Any

import redis.asyncio as aioredis

from bullmq_compat import Queue
from bullmq_compat._backends.redis.groups import GroupKeeper
from tests.chaos_helpers import report
from tests.group_helpers import node_workers, read_records, rec_key, wait_until
from tests.node import node

TRIES = 200
WAVE = 50  # groups per wave
B_MS = 1000


async def _measure(redis_url: str, redis: aioredis.Redis, *, regate: bool, busy: bool) -> dict[str, Any]:
    """One cell: TRIES tries in waves of WAVE groups; returns the figures."""
    queue_name = f"t-{uuid.uuid4().hex[:12]}"
    rec = rec_key(queue_name)
    # busy: as many slots as groups of a wave, all taken by the B jobs when A is retried
    concurrency = WAVE if busy else 4 * WAVE
    async with Queue(queue_name, connection=redis_url) as queue:
        keeper = GroupKeeper.for_queue(queue, sweep_interval=0.5, regate_retries=regate)
        keeper.start()
        try:
            async with node_workers(redis_url, queue_name, workers=1, concurrency=concurrency):
                for wave in range(TRIES // WAVE):
                    groups = [f"w{wave}g{i}" for i in range(WAVE)]
                    a_ids, b_ids = [], []
                    for g in groups:
                        a_ids.append(str((await queue.add("a", {"g": g, "s": 0, "fail": "boom"}, group=g)).id))
                        b_ids.append(str((await queue.add("b", {"g": g, "s": 1, "sleepMs": B_MS}, group=g)).id))

                    async def bs_started() -> bool:
                        _, starts = await read_records(redis, rec)
                        return set(b_ids) <= {s["id"] for s in starts}

                    await wait_until(bs_started, 60, f"wave {wave}: every B to start")
                    await node("jobsRetry", redis=redis_url, queue=queue_name, ids=a_ids)

                    async def wave_done() -> bool:
                        ends, _ = await read_records(redis, rec)
                        runs = [e["id"] for e in ends]
                        return all(runs.count(a) == 2 for a in a_ids) and set(b_ids) <= set(runs)

                    await wait_until(wave_done, 60, f"wave {wave}: every retried A to run again and every B to end")
                ends, starts = await read_records(redis, rec)
        finally:
            await keeper.close()
        # the jobs the keeper put back: their 'waiting-children' event with prev "waiting" (regateRetriedJob's)
        put_back = {fields["jobId"] for _, fields in await redis.xrange(f"bull:{queue_name}:events")
                    if fields.get("event") == "waiting-children" and fields.get("prev") == "waiting"}
        b_end = {end["g"]: end for end in ends if end["s"] == 1}
        beside: list[str] = []  # retried A jobs whose second run started before their group's B ended
        a_runs: dict[str, list[dict[str, Any]]] = {}
        for end in ends:
            if end["s"] == 0:
                a_runs.setdefault(end["id"], []).append(end)
        for job_id, runs in a_runs.items():
            second = sorted(runs, key=lambda r: r["t0"])[1]
            if second["n"] > 1 or second["t0"] < b_end[second["g"]]["t1"]:
                beside.append(job_id)
        overlaps = len(beside)
        counts = await queue.get_job_counts("waiting", "active", "waiting-children")
    return {"overlaps": overlaps, "regated": keeper.regated, "late": keeper.regated_late, "counts": counts,
            "put_back": put_back, "beside": beside}


async def test_a_node_retry_of_a_busy_groups_job_is_put_back_behind_the_gate_by_the_keeper(
        redis_url: str, redis: aioredis.Redis) -> None:
    cells = {}
    for busy in (False, True):
        for regate in (False, True):
            cells[(busy, regate)] = await _measure(redis_url, redis, regate=regate, busy=busy)
    line = "; ".join(
        f"{'busy' if busy else 'free'} Node slots, keeper regating {'on' if regate else 'off'}: "
        f"{c['overlaps']}/{TRIES} retried jobs ran beside their group's current job "
        f"(put back {c['regated']}, taken by a worker first {c['late']})"
        for (busy, regate), c in cells.items())
    report(f"\nNode job.retry() on a busy group's failed job, {TRIES} tries per cell: " + line)
    for cell in cells.values():
        assert cell["counts"] == {"waiting": 0, "active": 0, "waiting-children": 0}, cell["counts"]
    off_free, on_free = cells[(False, False)], cells[(False, True)]
    off_busy, on_busy = cells[(True, False)], cells[(True, True)]
    # without regating nothing puts a retried job back, and with free slots the retried job runs
    # beside its group's current job: the window is there to measure
    for cell in (off_free, off_busy):
        assert cell["regated"] == cell["late"] == 0 and not cell["put_back"], cell["regated"]
    assert off_free["overlaps"] > 0
    # with it, every retry is seen: put back behind the gate, or (a worker took it first) counted
    # as its group's running job; and a job put back never runs beside its group's current job
    for cell in (on_free, on_busy):
        assert cell["regated"] + cell["late"] == TRIES, (cell["regated"], cell["late"])
        assert len(cell["put_back"]) == cell["regated"], (len(cell["put_back"]), cell["regated"])
        assert not set(cell["beside"]) & cell["put_back"], sorted(set(cell["beside"]) & cell["put_back"])[:5]
