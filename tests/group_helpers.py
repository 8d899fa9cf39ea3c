"""Shared pieces of the per-group FIFO tests (tests/test_groups.py, tests/test_interop_groups.py).

Every handler — the Python one here and the Node one in interop/group_worker.js — records its
run in Redis the same way, so one checker covers Python workers, Node workers and both at once:

    INCR  <rec>:run:<g>   at start; the reply ``n`` is how many jobs of g run at that moment
    RPUSH <rec>:starts    {"g","s","id","a","t0","w","pid","p"}             at start (p: the job's processedOn)
    DECR  <rec>:run:<g>   and  RPUSH <rec> {"g","s","id","a","t0","t1","n","w","pid"}   at the end

``t0``/``t1`` are whole wall-clock milliseconds (floored, as Node's Date.now()), so a job that
starts after another ended never looks earlier. ``s`` is the job's place in its group's add order,
``a`` the attempt (attemptsMade + 1: a rerun after a stall has the same ``a``), ``pid`` the
process that ran it (so the SIGKILL tests can tell which repeats a kill explains). A worker in a
process of its own (tests/group_worker_proc.py) also records its event-loop lags in
``<rec>:lags``, as tests/chaos_worker_proc.py does.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Optional, Sequence

import redis.asyncio as aioredis

from bullmq_compat import Queue, Worker
from tests.node import INTEROP, NodeProcess, exited, stop_process

ROOT = Path(__file__).resolve().parent.parent

#: the size for "a group with many waiting jobs does not delay a one-job group": the issue's 100,000
#: under BULLMQ_COMPAT_CHAOS=1 (`make chaos`); 20,000 in `make test` (the cost is the adding, not the
#: property: the one-job group's start does not depend on the held count)
HELD_JOBS = 100_000 if os.environ.get("BULLMQ_COMPAT_CHAOS", "") not in ("", "0") else 20_000


def now_ms() -> int:
    return int(time.time() * 1000)


async def finish_as_node(queue: Queue, worker: Worker, job: Any, token: str, target: str = "completed",
                         value: str = "null") -> None:
    """Finish ``job`` as a Node worker does: upstream's moveToFinished alone, so nothing is released."""
    script, keys, args = worker.backend.worker_calls(worker._settings).move_to_finished(
        job.id, job.opts, target, value, token, now_ms(), False)
    await queue.backend.runner.call(script, keys, args)


@contextlib.asynccontextmanager
async def a_queue(name: str, url: str, **kwargs: Any) -> AsyncIterator[Queue]:
    """A Queue, closed on the way out."""
    queue = Queue(name, connection=url, **kwargs)
    try:
        yield queue
    finally:
        await queue.close()


async def held_ids(queue: Queue, gid: str) -> list[str]:
    """The ids of the group's jobs waiting for their turn, in the order they will run."""
    return [job.id for job in await queue.get_group_jobs(gid)]


def rec_key(queue_name: str) -> str:
    return f"rec:{queue_name}"


def recording_processor(redis_url: str, rec: str, *, fail_reason: str = "failing on purpose"
                        ) -> tuple[Callable[[Any], Awaitable[Any]], aioredis.Redis]:
    """The Python handler: records (g, s, a, t0, t1, n, pid) as described above; returns it and its client
    (close the client when done)."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    pid = os.getpid()

    async def process(job: Any) -> Any:
        data = job.data or {}
        g, s = data.get("g"), data.get("s")
        t0 = now_ms()
        pipe = client.pipeline(transaction=True)
        pipe.incr(f"{rec}:run:{g}")
        attempt = job.attempts_made + 1
        pipe.rpush(f"{rec}:starts", json.dumps({"g": g, "s": s, "id": job.id, "a": attempt, "t0": t0, "w": "py",
                                                "pid": pid, "p": job.processed_on}))
        n, _ = await pipe.execute()
        if data.get("sleepMs"):
            await asyncio.sleep(data["sleepMs"] / 1000)
        t1 = now_ms()
        pipe = client.pipeline(transaction=True)
        pipe.decr(f"{rec}:run:{g}")
        pipe.rpush(rec, json.dumps({"g": g, "s": s, "id": job.id, "a": attempt, "t0": t0, "t1": t1, "n": n,
                                    "w": "py", "pid": pid}))
        await pipe.execute()
        if data.get("fail"):
            from bullmq_compat import UnrecoverableError

            raise UnrecoverableError(str(data["fail"]))
        if data.get("failTimes") is not None and job.attempts_made < data["failTimes"]:
            raise RuntimeError(fail_reason)
        return {"g": g, "s": s}

    return process, client


def group_jobs(groups: int, per_group: int, *, sleep_ms: Any = (1, 4), name: str = "step",
               shuffle: bool = True, seed: int = 7) -> list[dict[str, Any]]:
    """add_bulk items: ``per_group`` jobs in each of ``groups`` groups ("g000"...), interleaved
    (randomly, but each group's own jobs in order s = 0, 1, ...)."""
    rng = random.Random(seed)
    order = [g for g in range(groups) for _ in range(per_group)]
    if shuffle:
        rng.shuffle(order)
    seen: dict[int, int] = defaultdict(int)
    items = []
    for g in order:
        s = seen[g]
        seen[g] += 1
        sleep = rng.randint(*sleep_ms) if isinstance(sleep_ms, tuple) else sleep_ms
        gid = f"g{g:03d}"
        items.append({"name": name, "data": {"g": gid, "s": s, "sleepMs": sleep}, "opts": {"group": gid}})
    return items


async def add_in_batches(queue: Queue, items: Sequence[Mapping[str, Any]], batch: int = 1000) -> list[Any]:
    jobs: list[Any] = []
    for i in range(0, len(items), batch):
        jobs += await queue.add_bulk(items[i:i + batch])
    return jobs


async def read_records(redis: aioredis.Redis, rec: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(finished runs, starts), each in the order Redis saw them."""
    ends = [json.loads(x) for x in await redis.lrange(rec, 0, -1)]
    starts = [json.loads(x) for x in await redis.lrange(f"{rec}:starts", 0, -1)]
    return ends, starts


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str,
                     progress: Optional[Callable[[], Awaitable[str]]] = None) -> float:
    """Poll ``predicate`` every 20 ms; returns the seconds it took. Fails with ``progress()``."""
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > timeout:
            detail = f" ({await progress()})" if progress else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def wait_records(redis: aioredis.Redis, rec: str, count: int, timeout: float,
                       queue: Optional[Queue] = None) -> float:
    async def progress() -> str:
        text = f"{await redis.llen(rec)} of {count} recorded"
        if queue is not None:
            text += f"; counts {await queue.get_job_counts()}; groups {(await queue.get_groups())[:5]}"
        return text

    return await wait_until(lambda: _at_least(redis, rec, count), timeout, f"{count} finished runs", progress)


async def wait_completed(queue: Queue, count: int, timeout: float) -> float:
    """Until ``count`` jobs are completed (runs cut short by a kill and rerun would make the
    record count overshoot the number of jobs done)."""
    async def done() -> bool:
        return (await queue.get_job_counts("completed"))["completed"] >= count

    async def progress() -> str:
        return f"counts {await queue.get_job_counts()}; groups {(await queue.get_groups())[:5]}"

    return await wait_until(done, timeout, f"{count} completed jobs", progress)


async def _at_least(redis: aioredis.Redis, rec: str, count: int) -> bool:
    return int(await redis.llen(rec)) >= count


def check_groups(ends: list[dict[str, Any]], starts: list[dict[str, Any]], expected: Mapping[str, int], *,
                 k: int = 1, use_counter: bool = True, cut_off: Optional[Mapping[int, int]] = None,
                 allow_reruns: bool = False, may_overlap: Iterable[str] = ()) -> dict[str, int]:
    """Assert the group invariants over recorded runs; returns the max overlap seen per group.

    ``expected``: group id -> number of jobs (s = 0..n-1). For k == 1: no two runs of a group
    overlap in time, and the group's jobs started in add order (by the order Redis saw the
    starts). For any k: never more than k runs of a group at once (by the Redis counter and by
    the time intervals). ``cut_off``: pid -> time (ms) the process was SIGKILLed: its runs that
    never finished count as running until then. ``allow_reruns``: a job may start again (after a
    stall), though never while it still runs (which repeats a kill explains: tests/chaos_helpers.py's
    `check_group_kills`). ``may_overlap``: ids of jobs whose lock was lost while their worker lived:
    their runs are left out of the overlap checks (the one overlap at-least-once permits).
    """
    may_overlap = set(may_overlap)
    finished = {(e["g"], e["s"], e["pid"], e["t0"]): e for e in ends}
    by_group: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # g -> [(t0, t1, s)] in start order,
    # the runs of jobs in may_overlap left out
    start_order: dict[str, list[int]] = defaultdict(list)
    for st in starts:
        end = finished.get((st["g"], st["s"], st["pid"], st["t0"]))
        if end is not None:
            t1 = end["t1"]
        else:
            assert cut_off and st["pid"] in cut_off, f"a run started and never finished: {st}"
            t1 = cut_off[st["pid"]]
        if st.get("id") not in may_overlap:
            by_group[st["g"]].append((st["t0"], t1, st["s"]))
        start_order[st["g"]].append(st["s"])

    assert set(start_order) == set(expected), (
        f"groups run {sorted(set(start_order) ^ set(expected))[:10]} differ from those added")
    completed = defaultdict(set)
    for e in ends:
        completed[e["g"]].add(e["s"])
    for g, n in expected.items():
        assert completed[g] == set(range(n)), f"group {g}: finished {sorted(completed[g])}, want 0..{n - 1}"
        order = start_order[g]
        if not allow_reruns:
            assert len(order) == n, f"group {g}: {len(order)} starts for {n} jobs: {order}"
        collapsed = [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s]
        if k == 1:
            assert collapsed == list(range(n)), f"group {g} started out of add order: {order}"
        else:  # job s is released only after jobs 0..s-k started: the i-th start is one of 0..i+k-1
            assert all(s <= i + k - 1 for i, s in enumerate(collapsed)), f"group {g} started out of order: {order}"

    overlaps: dict[str, int] = {}
    for g, runs in by_group.items():
        events = sorted([(t0, 1) for t0, _, _ in runs] + [(t1, -1) for _, t1, _ in runs])  # ends first on ties
        level = peak = 0
        for _, delta in events:
            level += delta
            peak = max(peak, level)
        overlaps[g] = peak
        assert peak <= k, f"group {g}: {peak} runs overlapped in time (k={k}): {sorted(runs)[:20]}"
        if k == 1:
            ordered = sorted(runs)
            for (a0, a1, sa), (b0, b1, sb) in zip(ordered, ordered[1:]):
                assert b0 >= a1, f"group {g}: job {sb} started at {b0} before job {sa} ended at {a1}"
    if use_counter:
        for e in ends:
            assert e["n"] <= k, f"group {e['g']}: {e['n']} of its jobs were running when job {e['s']} started"
    return overlaps


# -- processes ----------------------------------------------------------------------------------

class Proc:
    """A background subprocess that prints a first line when ready; SIGTERM (then SIGKILL) on exit."""

    def __init__(self, *argv: str, ready_timeout: float = 30.0) -> None:
        self.argv = argv
        self.ready_timeout = ready_timeout
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.first_line = ""
        self.killed_at: Optional[int] = None
        self._stderr: Optional[asyncio.Task[bytes]] = None
        self._stdout: Optional[asyncio.Task[bytes]] = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def __aenter__(self) -> "Proc":
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=str(ROOT), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._stderr = asyncio.ensure_future(self.proc.stderr.read())  # type: ignore[union-attr]
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), self.ready_timeout)  # type: ignore[union-attr]
            if not line:
                await self.proc.wait()
                raise AssertionError(f"{self.argv[:3]} exited ({self.proc.returncode}) before it was ready: "
                                     f"{(await self._stderr).decode(errors='replace')[-2000:]}")
            self.first_line = line.decode(errors="replace").strip()
        except BaseException:
            await self.__aexit__()
            raise
        self._stdout = asyncio.ensure_future(self.proc.stdout.read())  # type: ignore[union-attr]
        return self

    async def kill(self) -> int:
        """SIGKILL; returns (and remembers) the time in ms."""
        assert self.proc is not None
        self.killed_at = now_ms()
        self.proc.send_signal(signal.SIGKILL)
        if not await exited(self.proc, 30):
            raise AssertionError(f"{self.argv[:3]} pid {self.proc.pid}: not reaped 30 s after SIGKILL")
        return self.killed_at

    async def stderr(self) -> str:
        if self._stderr is None or not self._stderr.done():
            return ""
        return self._stderr.result().decode(errors="replace")

    async def __aexit__(self, *exc: Any) -> None:
        proc = self.proc
        if proc is None:
            return
        await stop_process(proc, 10)
        for task in (self._stdout, self._stderr):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 5)


def keeper_proc(redis_url: str, queue_name: str, sweep_interval: float = 0.5, prefix: str = "bull") -> Proc:
    """``python -m bullmq_compat keeper`` (ready once it prints its line)."""
    return Proc(sys.executable, "-m", "bullmq_compat", "keeper", "--queue", queue_name, "--redis", redis_url,
                "--prefix", prefix, "--sweep-interval", str(sweep_interval))


def python_worker_proc(redis_url: str, queue_name: str, *, concurrency: int = 10, lock_duration: int = 30000,
                       stalled_interval: int = 30000, sweep_interval: float = 0.5) -> Proc:
    """tests/group_worker_proc.py: a Python Worker with the recording processor, in its own process."""
    return Proc(sys.executable, "-m", "tests.group_worker_proc", redis_url, queue_name,
                "--concurrency", str(concurrency), "--lock-duration", str(lock_duration),
                "--stalled-interval", str(stalled_interval), "--sweep-interval", str(sweep_interval))


def node_workers(redis_url: str, queue_name: str, **args: Any) -> NodeProcess:
    """interop/group_worker.js: Node BullMQ Workers with the recording handler (fields: workers,
    concurrency, lockDuration, stalledInterval, maxStalledCount, removeOnComplete, removeOnFail,
    prefix, rec)."""
    return NodeProcess(INTEROP / "group_worker.js", json.dumps({"redis": redis_url, "queue": queue_name, **args}))


@contextlib.asynccontextmanager
async def python_workers(redis_url: str, queue_name: str, count: int, *, concurrency: int = 20,
                         sweep_interval: float = 0.5, **kwargs: Any) -> AsyncIterator[list[Worker]]:
    """``count`` in-process Workers with the recording processor, closed on the way out."""
    process, client = recording_processor(redis_url, rec_key(queue_name))
    workers = [Worker(queue_name, process, connection=redis_url, concurrency=concurrency,
                      group_sweep_interval=sweep_interval, name=f"py{i}", **kwargs) for i in range(count)]
    tasks = [asyncio.ensure_future(w.run(handle_signals=False)) for w in workers]
    try:
        await asyncio.sleep(0.05)
        for task in tasks:
            assert not task.done(), f"worker.run() ended at once: {task.exception() if task.done() else ''}"
        yield workers
    finally:
        for worker in workers:
            await worker.close()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        await client.aclose()


def counts_by_group(items: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    expected: dict[str, int] = defaultdict(int)
    for item in items:
        expected[item["data"]["g"]] += 1
    return dict(expected)
