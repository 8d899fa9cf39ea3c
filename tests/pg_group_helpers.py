"""Shared pieces of tests/test_postgres_groups.py (per-group FIFO on PostgreSQL, Python workers).

Two ways of recording runs:

- `Runs`: an in-process handler for Workers of the test's own event loop. Every start and end
  takes the next value of one counter (``tick``), so "B started after A ended" is exact (no clock
  is involved), and ``live[g]`` counts the group's jobs running at that moment (``peak[g]`` is the
  most seen at once).
- tests/pg_chaos_worker_proc.py's handler (`make_handler`), in-process or in a subprocess
  (`pg_worker_proc`): JSON lines in files of a directory, wall-clock ms, read back by
  `read_run_files` in tests/chaos_helpers.py's format (so `check_runs` checks them).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

import psycopg

from bullmq_compat import UnrecoverableError
from tests.group_helpers import Proc


@dataclass
class Run:
    g: Optional[str]
    s: Any
    id: str
    attempt: int
    start: int                  # tick at start
    end: Optional[int] = None   # tick at end (None: still running)
    data: Any = None


@dataclass
class Runs:
    """What the in-process handler saw: every run, in start order, with exact happens-before."""

    runs: list[Run] = field(default_factory=list)
    live: dict[Any, int] = field(default_factory=lambda: defaultdict(int))
    peak: dict[Any, int] = field(default_factory=lambda: defaultdict(int))
    done: dict[Any, int] = field(default_factory=lambda: defaultdict(int))
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    tick: int = 0
    batches: list[list[tuple[Any, Any]]] = field(default_factory=list)

    def _next(self) -> int:
        self.tick += 1
        return self.tick

    def gate(self, name: str) -> asyncio.Event:
        """An event a job with ``data["hold"] == name`` waits for (set it to let the job finish)."""
        return self.gates.setdefault(name, asyncio.Event())

    async def _run_one(self, job: Any) -> Any:
        data = job.data or {}
        g = data.get("g")
        run = Run(g, data.get("s"), str(job.id), job.attempts_made + 1, self._next(), data=data)
        self.runs.append(run)
        self.live[g] += 1
        self.peak[g] = max(self.peak[g], self.live[g])
        try:
            peers, total = data.get("peers"), data.get("total", 0)
            if peers:  # wait (bounded) for that many of the group's jobs to run at once (rule 5)
                deadline = time.monotonic() + 10
                while (self.live[g] < peers and self.live[g] + self.done[g] < total
                       and time.monotonic() < deadline):
                    await asyncio.sleep(0.01)
            if data.get("hold"):
                await asyncio.wait_for(self.gate(data["hold"]).wait(), 60)
            if data.get("ms"):
                await asyncio.sleep(data["ms"] / 1000)
        finally:
            self.live[g] -= 1
            self.done[g] += 1
            run.end = self._next()
        fail = data.get("fail")
        first_run = sum(1 for r in self.runs if r.id == run.id) == 1
        if fail == "always" or (fail == "once" and first_run):  # (a retry may reset attempts_made)
            raise UnrecoverableError(f"{g}:{data.get('s')} fails on purpose")
        if fail == "retry" and run.attempt == 1:
            raise RuntimeError("retry me")
        return {"g": g, "s": data.get("s")}

    async def process(self, job: Any) -> Any:
        """The processor of a Worker (one job)."""
        return await self._run_one(job)

    async def process_batch(self, job: Any) -> Any:
        """The processor of a batch Worker: records the batch, then runs its jobs one by one."""
        batch = list(job.get_batch())
        self.batches.append([((b.data or {}).get("g"), (b.data or {}).get("s")) for b in batch])
        for member in batch:
            await self._run_one(member)
        return None

    def started(self, g: Optional[str] = None) -> list[Any]:
        """The ``s`` of every start (of group ``g``), in start order."""
        return [r.s for r in self.runs if g is None or r.g == g]

    def ids(self) -> list[str]:
        return [r.id for r in self.runs]

    def check_group(self, g: str, k: int = 1) -> None:
        """No more than ``k`` of the group's runs overlapped (exact, by ticks); for k == 1 each run
        started after the previous one ended."""
        runs = sorted((r for r in self.runs if r.g == g), key=lambda r: r.start)
        events = sorted([(r.start, 1) for r in runs] + [(r.end if r.end is not None else 1 << 60, -1) for r in runs])
        level = peak = 0
        for _, delta in events:
            level += delta
            peak = max(peak, level)
        assert peak <= k, f"group {g}: {peak} runs at once (k={k}): {[(r.s, r.start, r.end) for r in runs]}"
        assert self.peak[g] <= k
        if k == 1:
            for a, b in zip(runs, runs[1:]):
                assert a.end is not None and b.start > a.end, f"group {g}: {b.s} started before {a.s} ended"


def group_items(groups: int, per_group: int, *, seed: int = 3, ms: tuple[int, int] = (2, 8),
                retry: float = 0.0, prefix: str = "g") -> list[dict[str, Any]]:
    """add_bulk items for tests/pg_chaos_worker_proc.py's handler (tests/chaos_helpers.py's plans):
    ``per_group`` jobs in each of ``groups`` groups, interleaved at random (each group's own jobs
    in order s = 0, 1, ...); a ``retry`` share fails its first attempt (half of them with a
    backoff), the rest are "ok"."""
    import random

    from tests.chaos_helpers import ATTEMPTS

    rng = random.Random(seed)
    order = [g for g in range(groups) for _ in range(per_group)]
    rng.shuffle(order)
    seq: dict[int, int] = defaultdict(int)
    items = []
    for i, g in enumerate(order):
        gid = f"{prefix}{g:03d}"
        plan = "retry" if rng.random() < retry else "ok"
        opts: dict[str, Any] = {"group": gid, "attempts": ATTEMPTS}
        if plan == "retry" and i % 2:
            opts["backoff"] = {"type": "fixed", "delay": 50}
        items.append({"name": plan, "data": {"i": i, "plan": plan, "ms": rng.randint(*ms), "g": gid, "s": seq[g]},
                      "opts": opts})
        seq[g] += 1
    return items


def pg_worker_proc(url: str, schema: str, queue: str, rec_dir: Path, *, name: str, concurrency: int = 4,
                   lock_duration: int = 30000, stalled_interval: int = 30000, drain_delay: float = 2) -> Proc:
    """tests/pg_chaos_worker_proc.py in a process of its own (records in ``rec_dir``)."""
    return Proc(sys.executable, "-m", "tests.pg_chaos_worker_proc", url, schema, queue, "--rec", str(rec_dir),
                "--concurrency", str(concurrency), "--lock-duration", str(lock_duration),
                "--stalled-interval", str(stalled_interval), "--max-stalled-count", "1000",
                "--drain-delay", str(drain_delay), "--name", name)


def read_run_records(rec_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every record of every ``*.jsonl`` file of ``rec_dir`` by kind ("start", "end", "fin", "lag"; the
    "k" field dropped), each list in time order (`check_runs` reads a group's start order from the
    order of ``starts``: one file per process is not it)."""
    out: dict[str, list[dict[str, Any]]] = {"start": [], "end": [], "fin": [], "lag": []}
    for path in sorted(rec_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut by a SIGKILL mid-write (write(2) of a short line: not seen)
                continue
            out[entry.pop("k")].append(entry)
    for kind, key in (("start", "t0"), ("end", "t1"), ("fin", "t"), ("lag", "t")):
        out[kind].sort(key=lambda rec: rec[key])
    return out


def read_run_files(rec_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(starts, ends) of `read_run_records`."""
    records = read_run_records(rec_dir)
    return records["start"], records["end"]


async def final_states(url: str, schema: str, queue: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """id -> {"state", "atm", "returnvalue", "failedReason", "stc", "ats"} (chaos_helpers' shape)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            f'SELECT id, state::text, attempts_made, return_value, failed_reason, stalled_count, attempts_started '
            f'FROM "{schema}".job WHERE queue = %s', [queue])
        rows = {r[0]: r for r in await cur.fetchall()}
    out: dict[str, dict[str, Any]] = {}
    for job_id in ids:
        r = rows.get(job_id)
        state = r[1] if r is not None and r[1] in ("completed", "failed") else "unfinished"
        out[job_id] = {"state": state, "atm": r[2] if r else 0, "returnvalue": r[3] if r else None,
                       "failedReason": r[4] if r else None, "stc": r[5] if r else 0, "ats": r[6] if r else 0}
    return out


async def finish_events(url: str, schema: str, queue: str) -> dict[str, Any]:
    """'completed'/'failed'/'stalled' events per job id (Counters), from the queue's event table, and
    ``stalled_at``: job id -> the times (ms) of its 'stalled' events (chaos_helpers' shape)."""
    counts: dict[str, Any] = {"completed": Counter(), "failed": Counter(), "stalled": Counter(),
                              "stalled_at": defaultdict(list)}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(f'SELECT event, data->>\'jobId\', created_at_ms FROM "{schema}".event '
                                 "WHERE queue = %s AND event IN ('completed', 'failed', 'stalled')", [queue])
        for event, job_id, at in await cur.fetchall():
            counts[event][job_id] += 1
            if event == "stalled":
                counts["stalled_at"][job_id].append(int(at))
    return counts


async def sql_rows(url: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, list(params))
        return list(await cur.fetchall()) if cur.description is not None else []


async def our_objects(url: str, schema: str) -> dict[str, list[str]]:
    """The schema's bullmq_compat_* functions, relations (tables, indexes) and triggers, by name."""
    like = "bullmq_compat%"
    procs = await sql_rows(url, "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                                "WHERE n.nspname = %s AND p.proname LIKE %s ORDER BY 1", [schema, like])
    rels = await sql_rows(url, "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                               "WHERE n.nspname = %s AND c.relname LIKE %s ORDER BY 1", [schema, like])
    trigs = await sql_rows(url, "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE n.nspname = %s AND t.tgname LIKE %s ORDER BY 1", [schema, like])
    return {"functions": [r[0] for r in procs], "relations": [r[0] for r in rels], "triggers": [r[0] for r in trigs]}


async def all_objects(url: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every function (with its oid and source), relation and trigger of the schema: a snapshot to
    compare (an object dropped and made again has a new oid). Upstream's per-queue job id
    sequences (``bullmq_jid_*``, made by a queue's first add) are left out."""
    procs = await sql_rows(url, "SELECT p.proname, p.oid::int, md5(p.prosrc) FROM pg_proc p "
                                "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1, 2",
                           [schema])
    rels = await sql_rows(url, "SELECT c.relname, c.relkind::text, c.oid::int FROM pg_class c "
                               "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                               "AND c.relname NOT LIKE 'bullmq\\_jid\\_%%' ORDER BY 1", [schema])
    trigs = await sql_rows(url, "SELECT t.tgname, c.relname, t.oid::int FROM pg_trigger t "
                                "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE n.nspname = %s AND NOT t.tgisinternal ORDER BY 1", [schema])
    return {"functions": procs, "relations": rels, "triggers": trigs}


async def wait_for(predicate: Callable[[], Awaitable[Any]], timeout: float, what: str,
                   progress: Optional[Callable[[], Awaitable[str]]] = None) -> Any:
    """Poll ``predicate`` every 20 ms until it returns something truthy (returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f" ({await progress()})" if progress else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        await asyncio.sleep(0.02)


def by_group(items: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item["data"]["g"]] += 1
    return dict(counts)
