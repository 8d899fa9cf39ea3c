"""Shared pieces of the reliability tests (tests/test_chaos.py, test_redis_faults.py, test_leaks.py).

Jobs follow a *plan* the test decides up front (``job.data["plan"]``, see tests/chaos_worker_proc.py):
"ok", "retry" (fails attempt 1, then succeeds), "always" (fails every attempt) or "fatal"
(UnrecoverableError). Handlers record every run in Redis; `check_runs` checks the records
against what the plan says and against the kills the test made, and returns the figures.
`judge_repeats`, its part that decides what explains a repeated run, also judges the group
SIGKILL tests' records (`check_group_kills`, tests/group_helpers.py's records).
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
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence

import redis.asyncio as aioredis

from tests._redis_server import RedisServer
from tests.chaos_worker_proc import ALWAYS_REASON, FATAL_REASON
from tests.group_helpers import Proc, check_groups

ROOT = Path(__file__).resolve().parent.parent

#: BULLMQ_COMPAT_CHAOS=1 (``make chaos``) runs the full sizes; ``make test`` runs short versions.
CHAOS = os.environ.get("BULLMQ_COMPAT_CHAOS", "") not in ("", "0")

ATTEMPTS = 3
EXPECTED_ATTEMPTS = {"ok": 1, "retry": 2, "always": ATTEMPTS, "fatal": 1}
EXPECTED_STATE = {"ok": "completed", "retry": "completed", "always": "failed", "fatal": "failed"}
EXPECTED_REASON = {"always": ALWAYS_REASON, "fatal": FATAL_REASON}
#: a run that ended this long before its process was killed had time to write its finish
KILL_WINDOW_MS = 1000
#: how long after a kill's recorded time its process may still start (and record) a run: the time
#: is read before the signal is sent (a make chaos run saw a start 2 ms after it)
KILL_SLACK_MS = 50


def now_ms() -> int:
    return int(time.time() * 1000)


ARTIFACTS = ROOT / "test-artifacts"


def report(line: str) -> None:
    """Print a figures line, and keep it in test-artifacts/reliability.txt (pytest -q hides prints)."""
    print(line)
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "reliability.txt", "a") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {'chaos' if CHAOS else 'default'} {line.strip()}\n")


# -- plans ---------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What the test adds and what each job must end as."""

    items: list[dict[str, Any]]
    groups: dict[str, int]                       # group id -> its number of jobs (s = 0..n-1)
    ids: list[str] = field(default_factory=list)  # job ids, once added, in item order

    def spec(self, index: int) -> Mapping[str, Any]:
        return self.items[index]["data"]


def plan_jobs(n: int, *, seed: int = 1, grouped: float = 0.25, per_group: int = 20, retry: float = 0.10,
              always: float = 0.03, fatal: float = 0.02, ms: tuple[int, int] = (20, 80),
              extra_opts: Optional[Mapping[str, Any]] = None, pad: int = 0) -> Plan:
    """``n`` jobs: a ``grouped`` share in groups of ``per_group`` (interleaved with the rest, each
    group in order s = 0, 1, ...), ``retry`` failing on attempt 1 only (half of them with a
    backoff, so both the retry and the delayed path run), ``always``/``fatal`` failing for good."""
    rng = random.Random(seed)
    n_grouped = int(n * grouped)
    n_groups = max(1, n_grouped // per_group) if n_grouped else 0
    group_of = [f"g{rng.randrange(n_groups):04d}" if i < n_grouped else None for i in range(n)]
    rng.shuffle(group_of)
    seq: dict[str, int] = defaultdict(int)
    items = []
    for i, g in enumerate(group_of):
        r = rng.random()
        plan = "retry" if r < retry else "always" if r < retry + always else \
            "fatal" if r < retry + always + fatal else "ok"
        data: dict[str, Any] = {"i": i, "plan": plan, "ms": rng.randint(*ms)}
        opts: dict[str, Any] = {"attempts": ATTEMPTS, **(extra_opts or {})}
        if plan == "retry" and i % 2:
            opts["backoff"] = {"type": "fixed", "delay": 100}
        if g is not None:
            data["g"], data["s"] = g, seq[g]
            seq[g] += 1
            opts["group"] = g
        if pad:
            data["pad"] = "x" * pad
        items.append({"name": plan, "data": data, "opts": opts})
    return Plan(items, dict(seq))


async def add_plan(queue: Any, plan: Plan, batch: int = 1000) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(plan.items), batch):
        ids += [str(job.id) for job in await queue.add_bulk(plan.items[start:start + batch])]
    plan.ids = ids
    return ids


async def add_plan_part(queue: Any, plan: Plan, part: int, parts: int, batch: int = 1000) -> list[str]:
    """Add the ``part``-th (from 0) of ``parts`` consecutive slices of the plan; call them in order
    (``plan.ids`` grows with each, in item order, as `add_plan` sets it)."""
    if part == 0:
        plan.ids = []
    n = len(plan.items)
    lo, hi = n * part // parts, n * (part + 1) // parts
    ids: list[str] = []
    for start in range(lo, hi, batch):
        ids += [str(job.id) for job in await queue.add_bulk(plan.items[start:min(start + batch, hi)])]
    plan.ids += ids
    return ids


# -- records -------------------------------------------------------------------------------------

async def read_list(client: aioredis.Redis, key: str, batch: int = 10000) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    total = int(await client.llen(key))
    for start in range(0, total, batch):
        out += [json.loads(x) for x in await client.lrange(key, start, start + batch - 1)]
    return out


async def final_states(client: aioredis.Redis, prefix: str, ids: Sequence[str], batch: int = 2000
                       ) -> dict[str, dict[str, Any]]:
    """id -> {"state", "atm", "returnvalue", "failedReason", "stc"} for every job id."""
    out: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        pipe = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.zscore(f"{prefix}completed", job_id)
            pipe.zscore(f"{prefix}failed", job_id)
            pipe.hmget(f"{prefix}{job_id}", "atm", "returnvalue", "failedReason", "stc", "ats")
        replies = await pipe.execute()
        for k, job_id in enumerate(chunk):
            done, failed, (atm, rv, reason, stc, ats) = replies[3 * k: 3 * k + 3]
            state = "completed" if done is not None else "failed" if failed is not None else "unfinished"
            out[job_id] = {"state": state, "atm": int(atm or 0), "returnvalue": json.loads(rv) if rv else None,
                           "failedReason": reason, "stc": int(stc or 0), "ats": int(ats or 0)}
    return out


async def finish_events(client: aioredis.Redis, events_key: str, batch: int = 20000) -> dict[str, Any]:
    """'completed'/'failed'/'stalled' events per job id (Counters), from the whole events stream, and
    ``stalled_at``: job id -> the times (ms, the entries' ids) of its 'stalled' events."""
    counts: dict[str, Any] = {"completed": Counter(), "failed": Counter(), "stalled": Counter(),
                              "stalled_at": defaultdict(list)}
    last = "-"
    while True:
        entries = await client.xrange(events_key, min=last, max="+", count=batch)
        if last != "-" and entries and entries[0][0] == last:
            entries = entries[1:]
        if not entries:
            break
        for entry_id, fields in entries:
            event = fields.get("event")
            if event in counts:
                counts[event][fields.get("jobId")] += 1
                if event == "stalled":
                    counts["stalled_at"][fields.get("jobId")].append(int(entry_id.split("-")[0]))
        last = entries[-1][0]
    return counts


@dataclass
class Figures:
    jobs: int = 0
    grouped: int = 0
    groups: int = 0
    completed: int = 0
    failed: int = 0
    starts: int = 0
    kills: int = 0
    restarts: int = 0
    killed_runs: int = 0        # runs cut short by a kill (started, never ended)
    duplicates: int = 0         # extra starts of the same (job, attempt)
    lock_lost: int = 0          # duplicates of a run whose live worker lost its lock (the job's stalled event)
    unexplained: int = 0        # duplicates neither a kill, a fault nor a lost lock explains (must be 0)
    losses: int = 0
    stalled_events: int = 0
    seconds: float = 0.0
    #: one line per lock lost by a live worker: the job, its runs, its stalled events, the worker's lag
    lock_lost_runs: list[str] = field(default_factory=list)

    def short(self) -> str:
        return (f"jobs={self.jobs} completed={self.completed} failed={self.failed} starts={self.starts} "
                f"duplicates={self.duplicates} lock_lost={self.lock_lost} unexplained={self.unexplained} "
                f"losses={self.losses} stalled_events={self.stalled_events}")

    def line(self) -> str:
        return (f"jobs={self.jobs} grouped={self.grouped} groups={self.groups} completed={self.completed} "
                f"failed={self.failed} starts={self.starts} kills={self.kills} restarts={self.restarts} "
                f"killed_runs={self.killed_runs} duplicates={self.duplicates} lock_lost={self.lock_lost} "
                f"unexplained={self.unexplained} losses={self.losses} stalled_events={self.stalled_events} "
                f"seconds={self.seconds:.1f}")


#: one run of a job: (t0, t1, attempt, pid, ended); a run cut short by a kill ends at the kill
Run = tuple[int, int, int, int, bool]


@dataclass
class Repeats:
    """What `judge_repeats` found in the records of one soak."""

    starts: list[dict[str, Any]]            # the start records, each run once
    runs: dict[str, list[Run]]              # job id -> its runs, in start order
    may_overlap: set[str]                   # jobs whose lock was lost (a fault, may_repeat, a live worker)
    killed_runs: int = 0                    # runs cut short by a kill (started, never ended)
    duplicates: int = 0                     # extra starts of the same (job, attempt)
    lock_lost: int = 0                      # duplicates of a run whose live worker lost its lock
    lock_lost_runs: list[str] = field(default_factory=list)


def judge_repeats(starts: Sequence[Mapping[str, Any]], ends: Sequence[Mapping[str, Any]], kills: Mapping[int, int],
                  events: Mapping[str, Any], *, windows: Sequence[tuple[int, int]] = (),
                  may_repeat: Iterable[str] = (), fins: Sequence[Mapping[str, Any]] = (),
                  lags: Sequence[Mapping[str, Any]] = ()) -> Repeats:
    """Judge every repeated run; assert none is unexplained and no job ran twice at once.

    ``starts``/``ends``: {"id", "a", "pid", "t0"} (+ "t1" in ends) of every run, as the soaks'
    workers record them (tests/chaos_worker_proc.py; the group tests' records, tests/group_helpers.py,
    have the same fields); a run that never ended must be of a killed process (``kills``: pid -> ms,
    read just before the SIGKILL). ``fins``: the runs whose finish the datastore acknowledged.
    ``events``: "stalled" (job id -> count) and "stalled_at" (job id -> ms), as `finish_events`.
    A repeated start of the same (job, attempt) is a *duplicate*; the earlier run it repeats is

    - **explained by a kill** only if its process was SIGKILLed after the run started (or, for a
      run it never ended, at most KILL_SLACK_MS before) and before the repeat started; the run's
      finish was never acknowledged (no ``fins`` record; with no ``fins`` at all, its end was less
      than KILL_WINDOW_MS before the kill); and, where the stalled events have their times, the job
      had no ``stalled`` event between the run's start and the kill (one before it: the lock was
      already lost while the process lived);
    - explained by a fault: in flight during a fault window (``windows``: (start, end) ms — Redis
      down, connections killed), or a job in ``may_repeat`` (e.g. active when CLIENT PAUSE began);
    - else a **lock lost by a live worker**, if the job has a ``stalled`` event between the two
      starts (a stalled count alone if no times): counted in ``lock_lost``, each printed with its
      stalled events and the worker's event-loop lag then (``lags``: {"pid", "t", "lag"} records of
      lags of the worker processes);
    - else **unexplained**: the assertion fails.

    No job runs twice at once, checked for every job, except a job whose lock was lost (by a fault
    or a live worker): that is the only overlap at-least-once permits.
    """
    may_repeat = set(may_repeat)
    finished = {(e["id"], e["a"], e["pid"], e["t0"]): e for e in ends}
    acked = {(f["id"], f["a"], f["pid"], f["t0"]) for f in fins}
    # a record written twice (its reply lost, the write retried) is one run
    unique = list({(st["id"], st["a"], st["pid"], st["t0"]): st for st in starts}.values())
    out = Repeats(starts=unique, runs=defaultdict(list), may_overlap=set(may_repeat))
    runs = out.runs
    for st in unique:
        end = finished.get((st["id"], st["a"], st["pid"], st["t0"]))
        if end is not None:
            t1, ended = end["t1"], True
        else:
            assert st["pid"] in kills, f"a run started and never ended, and its process was not killed: {st}"
            t1, ended = kills[st["pid"]], False
            out.killed_runs += 1
        runs[st["id"]].append((st["t0"], t1, st["a"], st["pid"], ended))
    stalled_at: Mapping[str, Sequence[int]] = events.get("stalled_at") or {}

    def by_kill(job_id: str, run: Run, next_t0: int) -> bool:
        t0, t1, attempt, pid, ended = run
        if pid not in kills or not kills[pid] <= next_t0:
            return False
        # the kill's time is read just before the signal is sent, and the process runs on until it
        # lands: a run it started in that moment, and never ended, was cut by the kill all the same
        if t0 > kills[pid] and (ended or t0 - kills[pid] > KILL_SLACK_MS):
            return False
        # stalled while its process still lived: the kill came after the lock was lost
        if any(t0 <= t < kills[pid] for t in stalled_at.get(job_id, ())):
            return False
        if fins:
            return (job_id, attempt, pid, t0) not in acked
        return not ended or kills[pid] - t1 < KILL_WINDOW_MS

    def by_window(t0: int, t1: int) -> bool:
        return any(t0 <= w1 and t1 >= w0 - KILL_WINDOW_MS for w0, w1 in windows)

    def lag_of(pid: int, t0: int, t1: int) -> str:
        seen = [rec["lag"] for rec in lags if rec["pid"] == pid and t0 <= rec["t"] <= t1]
        return f"max event-loop lag {max(seen)} ms" if seen else "no event-loop lag recorded"

    unexplained = []
    for job_id, job_runs in runs.items():
        job_runs.sort()
        if any(by_window(t0, t1) for t0, t1, *_ in job_runs):
            out.may_overlap.add(job_id)
        per_attempt: dict[int, list[Run]] = defaultdict(list)
        for run in job_runs:
            per_attempt[run[2]].append(run)
        for attempt, same in per_attempt.items():
            out.duplicates += len(same) - 1
            for run, after in zip(same, same[1:]):
                t0, t1, _a, pid, _ended = run
                if job_id in may_repeat or by_kill(job_id, run, after[0]) or by_window(t0, t1):
                    continue
                stalls = [t for t in stalled_at.get(job_id, ()) if t0 <= t <= after[0]]
                if stalls or (not stalled_at and events["stalled"][job_id]):
                    out.lock_lost += 1
                    out.may_overlap.add(job_id)
                    out.lock_lost_runs.append(
                        f"job {job_id} attempt {attempt}: run {t0}-{t1} in pid {pid} "
                        f"({'killed at ' + str(kills[pid]) if pid in kills else 'not killed'}), repeated at "
                        f"{after[0]} in pid {after[3]}; stalled events at {stalls or 'unknown times'}; "
                        f"{lag_of(pid, t0 - 1000, after[0])}")
                else:
                    unexplained.append((job_id, attempt, same))
        if job_id not in out.may_overlap:
            for (a0, a1, *_), (b0, b1, *_) in zip(job_runs, job_runs[1:]):
                assert b0 >= a1, f"job {job_id} ran twice at once: {job_runs}"
    assert not unexplained, f"{len(unexplained)} repeated runs not explained by a kill, a fault or a lost lock " \
        f"(no stalled event): {unexplained[:5]}"
    out.runs = dict(runs)
    return out


def check_runs(plan: Plan, states: Mapping[str, Mapping[str, Any]], starts: list[dict[str, Any]],
               ends: list[dict[str, Any]], kills: Mapping[int, int], events: Mapping[str, Mapping[str, Any]], *,
               windows: Sequence[tuple[int, int]] = (), may_repeat: Iterable[str] = (),
               fins: Sequence[Mapping[str, Any]] = (), lags: Sequence[Mapping[str, Any]] = ()) -> Figures:
    """Assert every invariant over one run; returns its figures.

    Records (see tests/chaos_worker_proc.py): ``starts`` and ``ends`` of every handler run, and
    ``fins``, one per run whose finish (moveToFinished) the datastore acknowledged. Every job ended
    as its handler decided, once; its repeated runs are judged by `judge_repeats` (what explains
    one, what may overlap); no two jobs of a group run at once, except around a job whose lock was
    lost, and each group started in add order. Whether a lost lock fails the test is the caller's
    decision (``figures.lock_lost``, `judge_lock_lost`).
    """
    figures = Figures(jobs=len(plan.ids), grouped=sum(plan.groups.values()), groups=len(plan.groups),
                      kills=len(kills))
    by_id = {job_id: plan.spec(i) for i, job_id in enumerate(plan.ids)}

    # 1. every job ended as its handler decided, once
    wrong = []
    for job_id, spec in by_id.items():
        st = states[job_id]
        want = EXPECTED_STATE[spec["plan"]]
        if st["state"] == "unfinished":
            figures.losses += 1
            continue
        if st["state"] == "completed":
            figures.completed += 1
        else:
            figures.failed += 1
        ok = st["state"] == want and st["atm"] == EXPECTED_ATTEMPTS[spec["plan"]]
        if want == "completed":
            ok = ok and st["returnvalue"] == {"i": spec["i"], "a": EXPECTED_ATTEMPTS[spec["plan"]]}
        else:
            ok = ok and st["failedReason"] == EXPECTED_REASON[spec["plan"]]
        ok = ok and events["completed"][job_id] == (want == "completed") \
            and events["failed"][job_id] == (want == "failed")
        if not ok:
            wrong.append((job_id, spec["plan"], st, events["completed"][job_id], events["failed"][job_id]))
    figures.stalled_events = sum(events["stalled"].values())
    assert figures.losses == 0, f"{figures.losses} jobs never finished: " + str(
        [(j, s) for j, s in states.items() if s["state"] == "unfinished"][:10])
    assert not wrong, f"{len(wrong)} jobs ended otherwise than their handler decided (or not once): {wrong[:10]}"

    # 2. runs: intervals (a run cut short by a kill ends at the kill), duplicates and their causes
    repeats = judge_repeats(starts, ends, kills, events, windows=windows, may_repeat=may_repeat, fins=fins, lags=lags)
    runs, lock_lost = repeats.runs, repeats.may_overlap
    assert set(runs) == set(by_id), f"jobs never started: {sorted(set(by_id) - set(runs))[:10]}"
    figures.starts, figures.killed_runs, figures.duplicates = len(repeats.starts), repeats.killed_runs, \
        repeats.duplicates
    figures.lock_lost, figures.lock_lost_runs = repeats.lock_lost, repeats.lock_lost_runs

    # 3. groups: in order, one at a time, every job run
    group_starts: dict[str, list[int]] = defaultdict(list)
    group_runs: dict[str, list[tuple[int, int, int, str]]] = defaultdict(list)
    for st in repeats.starts:
        if st.get("g") is not None:
            group_starts[st["g"]].append(st["s"])
    for job_id, job_runs in runs.items():
        spec = by_id[job_id]
        if spec.get("g") is not None:
            group_runs[spec["g"]] += [(t0, t1, spec["s"], job_id) for t0, t1, *_ in job_runs]
    assert set(group_starts) == set(plan.groups)
    for g, n in plan.groups.items():
        order = group_starts[g]
        collapsed = [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s]
        assert collapsed == list(range(n)), f"group {g} started out of order: {order}"
        ordered = sorted(group_runs[g])
        for (a0, a1, sa, ida), (b0, b1, sb, idb) in zip(ordered, ordered[1:]):
            if ida not in lock_lost and idb not in lock_lost:
                assert b0 >= a1, f"group {g}: job {sb} started at {b0} while job {sa} ran until {a1}"
    return figures


def check_group_kills(ends: list[dict[str, Any]], starts: list[dict[str, Any]], expected: Mapping[str, int],
                      kills: Mapping[int, int], events: Mapping[str, Any], *,
                      lags: Sequence[Mapping[str, Any]] = ()) -> Figures:
    """The group SIGKILL tests (tests/test_groups.py, tests/test_interop_groups.py): their records
    (tests/group_helpers.py: the Python and the Node handler record each run's job id, attempt,
    pid, start and end) judged as the crash soak's are, by `judge_repeats`: a repeated run is
    accepted only if a kill explains it (the earlier run's pid was killed before that run ended and
    before the job stalled), or counted as a lock lost by a live worker (with its stalled event);
    any other fails. Then `check_groups`: every job of every group done, in add order, one at a
    time, the only overlaps around a lost lock. ``kills``: pid -> ms of every SIGKILL; ``events``:
    `finish_events` of the queue. Returns the figures; call `judge_lock_lost` with them."""
    def with_attempt(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "a": r.get("a", 1)} for r in records]

    repeats = judge_repeats(with_attempt(starts), with_attempt(ends), kills, events, lags=lags)
    check_groups(ends, starts, expected, use_counter=False, cut_off=kills, allow_reruns=True,
                 may_overlap=repeats.may_overlap)
    return Figures(jobs=len(repeats.runs), grouped=sum(expected.values()), groups=len(expected),
                   completed=len({(e["g"], e["s"]) for e in ends}), starts=len(repeats.starts), kills=len(kills),
                   killed_runs=repeats.killed_runs, duplicates=repeats.duplicates, lock_lost=repeats.lock_lost,
                   stalled_events=sum(events["stalled"].values()), lock_lost_runs=repeats.lock_lost_runs)


def judge_lock_lost(figures: Figures, what: str) -> None:
    """Print every lock lost by a live worker (`check_runs`); in ``make chaos`` (an idle machine) there
    must be none. Under a loaded ``make test`` a worker starved of CPU can miss renewing its lock with
    no fault at all: there the count is reported (test-artifacts/reliability.txt), not failed."""
    for line in figures.lock_lost_runs:
        report(f"{what}: lock lost by a live worker: {line}")
    if CHAOS:
        assert figures.lock_lost == 0, f"{what}: {figures.lock_lost} locks lost by live workers: " \
            f"{figures.lock_lost_runs[:5]}"


# -- worker processes ----------------------------------------------------------------------------

def chaos_worker(redis_url: str, queue_name: str, rec: str, *, concurrency: int = 4, lock_duration: int = 1000,
                 stalled_interval: int = 500, max_stalled_count: int = 1000, name: Optional[str] = None,
                 redis_py: bool = False, remove: bool = False, record: bool = True) -> Proc:
    argv = [sys.executable, "-m", "tests.chaos_worker_proc", redis_url, queue_name, "--rec", rec,
            "--concurrency", str(concurrency), "--lock-duration", str(lock_duration),
            "--stalled-interval", str(stalled_interval), "--max-stalled-count", str(max_stalled_count)]
    if name:
        argv += ["--name", name]
    if redis_py:
        argv.append("--redis-py")
    if remove:
        argv.append("--remove")
    if not record:
        argv.append("--no-record")
    return Proc(*argv)


def proc_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


async def stdout_of(proc: Proc) -> str:
    """What a finished Proc printed after its ready line."""
    task = proc._stdout
    if task is None:
        return ""
    with contextlib.suppress(Exception):
        return (await asyncio.wait_for(task, 5)).decode(errors="replace")
    return ""


# -- processes: sockets, memory ------------------------------------------------------------------

def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def local_ports(pid: int) -> set[int]:
    """Local TCP ports of ``pid``'s sockets (from /proc/<pid>/net/tcp and tcp6 by inode)."""
    inodes = socket_inodes(pid)
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[9] in inodes:
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


async def clients_of(client: aioredis.Redis, pid: int) -> list[dict[str, str]]:
    """The CLIENT LIST entries of ``pid``'s connections (matched by their local port)."""
    ports = local_ports(pid)
    out = []
    for entry in await client.client_list():
        addr = entry.get("addr", "")
        if addr.startswith("127.0.0.1:") and int(addr.rsplit(":", 1)[1]) in ports:
            out.append(entry)
    return out


# -- a Redis we may kill -------------------------------------------------------------------------

class KillableRedis:
    """A redis-server with AOF (fsync always) that can be SIGKILLed and restarted on its port and dir."""

    def __init__(self, extra_args: tuple[str, ...] = ("--appendonly", "yes", "--appendfsync", "always")) -> None:
        self.server = RedisServer(extra_args=extra_args)
        self.dir = self.server.dir
        self.port = self.server.port
        self.url = self.server.url
        self.kills = 0

    def start(self) -> "KillableRedis":
        self.server.start()
        return self

    def kill(self) -> None:
        proc = self.server.proc
        assert proc is not None and proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.kills += 1

    def restart(self) -> None:
        fresh = RedisServer(port=self.port, extra_args=self.server.extra_args)
        os.rmdir(fresh.dir)
        fresh.dir = self.dir  # the same AOF
        deadline = time.monotonic() + 15
        while True:  # the port may linger a moment
            try:
                fresh.start()
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.server = fresh

    def stop(self) -> None:
        self.server.stop()


async def poll_until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str,
                     progress: Optional[Callable[[], Awaitable[str]]] = None, every: float = 0.1) -> float:
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > timeout:
            detail = f" ({await progress()})" if progress else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        await asyncio.sleep(every)
    return time.monotonic() - start


async def delete_queue_keys(client: aioredis.Redis, pattern: str) -> int:
    n = 0
    async for key in client.scan_iter(match=pattern, count=1000):
        n += int(await client.unlink(key))
    return n
