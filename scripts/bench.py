"""Benchmark: bullmq-compat against Node BullMQ 6.7.0 and the official PyPI ``bullmq`` port.

    .venv/bin/python scripts/bench.py [--quick] [--json out.json] [--rounds N] [--jobs N]
                                      [--only node,official,compat] [--measurements add,process-c1,...]
                                      [--backends redis,postgres] [--postgres-url URL]

One invocation starts its own redis-server on a free loopback port, flushes it (and only it)
before every run, and runs each measurement for each implementation in a fresh process:

  node      node interop/bench.js '<json>'
  official  bench-results/.venv-official/bin/python scripts/bench_official.py '<json>'
            (the venv is created and ``bullmq==<latest>`` installed into it by this script;
            skipped with a note if that fails)
  compat    .venv/bin/python scripts/bench_compat.py '<json>'
  floor     .venv/bin/python scripts/bench_floor.py '<json>': not a client but the bare loop over the
            same upstream scripts, keys and arguments bullmq-compat sends, on its own connection class
            (see that file): what this machine allows a Python client, so every row is also given
            as a fraction of it ("of floor"); none for latency or groups. On the PostgreSQL rows it is
            scripts/bench_pg_floor.py: the same upstream SQL commands with the same arguments on one
            of the product's raw-libpq sessions (add_job one at a time; add_jobs_bulk per batch; the
            worker's move_to_active + move_to_completed_fetch loop, several slots' calls pipelined in
            one transaction where the row has several slots).
  ceiling   .venv/bin/python scripts/bench_pg_ceiling.py '<json>' (PostgreSQL rows only, needs pgbench:
            `make pgbench`; skipped with a note without it): pgbench -f running upstream's command
            text of the row, one job (add_bulk: one batch) per transaction, the row's client count,
            the server's synchronous_commit -- the commits/s the server allows that transaction
            shape, as jobs/s ("of commit ceiling").
  arq, rq, celery, dramatiq
            bench-results/.venv-<name>/bin/python scripts/bench_peer_<name>.py '<json>': other Python
            queues (issue #32), not BullMQ clients: each library's latest release in a venv of its own
            (created and updated as the official port's: arq, rq, celery[redis], dramatiq[redis];
            skipped with a note if that fails), on the same redis-server with the same no-op task.
            Redis rows add, add-bulk (RQ only: Queue.enqueue_many, the only bulk enqueue among them),
            process-c1, process-c10 (each library's own worker model: PEER_MODELS) and latency; see
            scripts/bench_peer_common.py for how completion, CPU and latency are taken. They run by
            default (about 5 minutes a round more on 2 cores, at the same job counts as everyone);
            --no-peers leaves them out. After the Redis tables, one line per row: bullmq-compat over
            the fastest of them, against the goal of 2x.

All three do identical work: jobs {name: "bench", data: {"i": i}} with no options, no-op
processors, one process per run, no warm-up for anyone. Rounds interleave the implementations
(the order rotates every round), so drift of the machine hits all of them alike.

PostgreSQL rows (--backends; by default on when the PostgreSQL of --postgres-url, else
POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/test, answers): the same runners on each
one's own PostgreSQL backend -- Node's (bullmq's createPostgresBackend, migrate: true), ours
(Queue/Worker with a postgresql:// connection, schema=..., migrate=True) and the official port's
({"backend": "postgres", ...}, with the driver of its ``postgres`` extra). Every run gets a fresh
schema bench_<hex>, created and migrated by the client itself before the timed section and
dropped after the run. No Redis figures there; each row shows "of floor" and "of commit ceiling"
(jobs/s over the floor's and pgbench's medians), and the closing note each row's ratio to Node
against PG_TARGETS. --check exits 1 when a row with a target misses it (ours / Node, median of the
per-round ratios, >= 3 rounds; and our client CPU per job at or below Node's; on Redis, where the
other Python queues ran, PEER_GOAL x the fastest of them), printing which.

  pg-add          PostgreSQL: add one at a time (2,000 jobs, sequential awaits)
  pg-add-bulk     PostgreSQL: add_bulk (10,000 jobs in batches of 1,000)
  pg-process-cN   PostgreSQL: worker c=N (3,000 pre-loaded no-op jobs, jobs kept; N = 1, 10)
                  (--quick: 300, 1,000 and 1,000 jobs; --jobs sets all three, as for Redis)

Measurements (job counts for the default run; --quick: fewer jobs and 1 round):
  add            10,000 jobs added one at a time (sequential awaits)
  add-bulk       20,000 jobs added in batches of 1,000
  process-cN     20,000 jobs pre-loaded (bulk add, untimed), then a worker at concurrency N,
  process-cN-roc timed from worker start to the last 'completed' event; -roc: with
                 remove-on-complete (N = 1, 10, 100)
  process-grouped bullmq-compat only: as process-c100 with the jobs over 1,000 groups; each round
                 also runs an ungrouped twin (process-c100's settings) right before or after it,
                 alternately, and reports the pair's ratio (its median over the rounds), besides
                 the ratio of its median to process-c100's
  process-batch50 bullmq-compat only: the same jobs taken by a batch worker (batch={"size": 50},
                 concurrency 2: 2 batches in flight), paired as process-grouped with a
                 concurrency-100 twin; reports the ratios of jobs/s and of client CPU per job
  process-grouped-rl bullmq-compat only: 25,000 jobs over 1,000 groups, each group limited to 5 jobs/s
                 (set_default_group_rate_limit(max=5, duration=1000)), concurrency 100: the run's
                 time against the shortest the limits allow (4 s), and the rate after the first
                 window (its 5,000 jobs) against the limits' 5,000 jobs/s
  pg-process-grouped, pg-process-gate, pg-add-gate  bullmq-compat only, PostgreSQL: pg-process-c10's
                 jobs over n/20 groups in a schema with our group objects, paired with an ungrouped
                 twin there; ungrouped jobs with our objects, paired with a twin without them
                 (worker c=10, and adds one at a time)
  latency        idle worker; 200 jobs added one at a time, 20 ms apart; latency = handler start
                 time minus job.timestamp, p50/p99 (nearest rank) per round

For each run the runner reports wall time and its own CPU (user+sys) over the timed section only,
and the raw Redis INFO texts around it (CONFIG RESETSTAT right before). From them:
  client CPU us/job  runner process CPU / jobs
  Redis cmd us/job   INFO commandstats: sum of usec of the commands the clients sent / jobs.
                     Redis counts a command run inside a Lua script (or queued in MULTI/EXEC) on
                     its own line *and* inside its caller's usec, so only the outermost commands
                     are summed: script calls (EVALSHA...), blocking pops, connection/transaction
                     commands. Data commands (HSET, ZADD...) are counted as nested: inside the timed
                     sections every client issues them from scripts only (checked with MONITOR).
                     The nested sum is kept in the JSON as redisNestedUsec.
  Redis CPU us/job   INFO cpu: redis-server's used_cpu_user+used_cpu_sys delta / jobs (all the
                     work of the server, parsing and networking included).
  of floor           jobs/s median / the floor's jobs/s median (same measurement, same run).
  of Redis ceiling   jobs/s x Redis CPU us/job: the share of one core redis-server used, i.e. the
                     throughput as a fraction of 1 / Redis CPU per job, the rate at which Redis
                     itself would be the limit (single-threaded: one core at most).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ("redis", "postgres")
# targets of ours against Node on PostgreSQL (jobs/s ratio), by measurement
PG_TARGETS = {"pg-add": 1.2, "pg-add-bulk": 1.2, "pg-process-c1": 1.3, "pg-process-c10": 1.5}
# and on every PostgreSQL row with a target, our client CPU per job at or below Node's (issue #32)
sys.path.insert(0, ROOT)

from bullmq_compat._busy_poll import busy_poll_budget  # noqa: E402
from tests._redis_server import RedisServer  # noqa: E402

OFFICIAL_VENV = os.path.join(ROOT, "bench-results", ".venv-official")
IMPLS = ("node", "official", "compat", "floor", "ceiling")
# other Python queues (issue #32 §2): not BullMQ clients, the same no-op jobs on the same redis-server,
# each in a venv of its own (bench-results/.venv-<key>), runner scripts/bench_peer_<key>.py
PEER_IMPLS = ("arq", "rq", "celery", "dramatiq")
PEER_SPECS = {"arq": "arq", "rq": "rq", "celery": "celery[redis]", "dramatiq": "dramatiq[redis]"}
PEER_NAMES = {"arq": "arq", "rq": "RQ", "celery": "Celery", "dramatiq": "Dramatiq"}
PEER_ROWS = ("add", "add-bulk", "process-c1", "process-c10", "latency")  # the Redis rows they run
# the library's own bulk enqueue, where it has one; the others have none ("--" in add-bulk)
PEER_BULK = {"rq": "Queue.enqueue_many + Queue.prepare_data, one pipeline per batch"}
PEER_NO_BULK = {"arq": "no bulk enqueue (enqueue_job per job)",
                "celery": "no bulk enqueue (group is a canvas primitive: one publish per task)",
                "dramatiq": "no bulk enqueue (group/pipeline: one send per message)"}
# each peer's worker model (its runner reports the same string; shown in the tables)
PEER_MODELS = {
    ("arq", 1): "asyncio: 1 process, max_jobs=1, poll_delay 0",
    ("arq", 10): "asyncio: 1 process, max_jobs=10 tasks, poll_delay 0",
    ("rq", 1): "processes: 1 rq worker (SimpleWorker)",
    ("rq", 10): "processes: rq worker-pool -n 10 (SimpleWorker)",
    ("celery", 1): "process: --pool=solo, prefetch x64",
    ("celery", 10): "processes: --pool=prefork -c 10, prefetch x64",
    ("dramatiq", 1): "processes x threads: -p 1 -t 1, prefetch 64",
    ("dramatiq", 10): "processes x threads: -p 2 -t 5, prefetch 64",
}
# the harness's own commands in the peers' runs (the tasks' completion counter and latency record,
# the runner's polling): left out of their Redis command time
PEER_HARNESS_COMMANDS = {"incrby", "append", "getrange"}
IMPLS = (*IMPLS, *PEER_IMPLS)
RUN_TIMEOUT = 1800

# commands that run at top level only (or that BullMQ clients only send at top level):
# their usec is the server time of the request; every other command line is nested work
SCRIPT_CALLS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
TOP_LEVEL = SCRIPT_CALLS | {
    "multi", "discard", "watch", "unwatch", "hello", "ping", "select", "auth", "quit", "reset", "echo",
    "bzpopmin", "bzpopmax", "bzmpop", "blpop", "brpop", "brpoplpush", "blmove", "blmpop", "xread",
}
TOP_LEVEL_PREFIXES = ("client|", "script|", "function|", "command|", "cluster|", "memory|")
# the harness's own INFO and CONFIG RESETSTAT
IGNORED = {"info", "config|resetstat"}


@dataclass
class Measurement:
    key: str
    title: str
    op: str
    jobs: int
    concurrency: int = 1
    remove_on_complete: bool = False
    batch: int = 1000
    interval: int = 20
    groups: int = 0               # jobs spread over this many groups (bullmq-compat only)
    only: Optional[str] = None    # run this implementation only
    baseline: Optional[str] = None  # the measurement (same implementation) to give a ratio against
    backend: str = "redis"        # "redis" or "postgres"
    batch_size: int = 0           # a batch worker (bullmq-compat only): batch={"size": batch_size}
    twin_concurrency: int = 0     # the paired twin's concurrency (0: the same as this one's)
    gate: bool = False            # PostgreSQL: our group objects installed in the run's schema (untimed)
    twin_gate: Optional[bool] = None  # the paired twin's gate (None: the same as this one's)
    twin_label: str = ""          # what the paired twin is, for the report ("" : an ungrouped twin)
    group_rate: Optional[tuple[int, int]] = None  # every group limited to (max, duration ms) (bullmq-compat only)

    @property
    def is_latency(self) -> bool:
        return self.op == "latency"


@dataclass
class Impl:
    key: str
    label: str
    argv: list[str]
    version: str = ""
    postgres_argv: Optional[list[str]] = None  # the runner of the PostgreSQL rows, when not argv


@dataclass
class Cell:
    """All rounds of one measurement for one implementation."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# -- machine -------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def command_output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_ticks() -> Optional[tuple[int, int]]:
    """(steal, all) CPU time of this machine so far, in ticks, from /proc/stat (None off Linux).
    Steal is the time the hypervisor gave this VM's CPUs to other guests: on a shared host it
    slows every implementation of a run, so each run and the whole bench report their share."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return fields[7], sum(fields[:8])  # user nice system idle iowait irq softirq steal


def steal_share(before: Optional[tuple[int, int]], after: Optional[tuple[int, int]]) -> Optional[float]:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def machine_info(redis_version: str, postgres_version: Optional[str] = None) -> dict[str, Any]:
    node = shutil.which("node")
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "redis_version": redis_version,
        "postgres_version": postgres_version,
        "python_version": platform.python_version(),
        "node_version": command_output([node, "--version"]) if node else None,
        "loadavg_at_start": list(os.getloadavg()),
        # what bullmq-compat's and the floor's runners poll for a due reply (they inherit this
        # process's environment): it changes every Redis row where each job waits for the last
        "busy_poll_us": busy_poll_budget(),
    }


# -- implementations ----------------------------------------------------------------------------
def node_impl() -> tuple[Optional[Impl], str]:
    node = shutil.which("node")
    if node is None:
        return None, "node is not on PATH"
    pkg = os.path.join(ROOT, "interop", "node_modules", "bullmq", "package.json")
    try:
        with open(pkg) as f:
            version = json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return None, "interop/node_modules/bullmq is not installed (cd interop && npm ci)"
    return Impl("node", f"node bullmq {version}", [node, os.path.join(ROOT, "interop", "bench.js")], version), ""


def compat_impl() -> tuple[Optional[Impl], str]:
    version = command_output([sys.executable, "-c", "import bullmq_compat; print(bullmq_compat.__version__)"])
    if not version:
        return None, "bullmq_compat is not importable from this interpreter"
    return Impl("compat", f"bullmq-compat {version}", [sys.executable, os.path.join(ROOT, "scripts",
                                                                                       "bench_compat.py")],
                version), ""


def floor_impl() -> tuple[Optional[Impl], str]:
    """The bare upstream-script loop (scripts/bench_floor.py), in this interpreter."""
    version = command_output([sys.executable, "-c", "import bullmq_compat; print(bullmq_compat.__version__)"])
    if not version:
        return None, "bullmq_compat is not importable from this interpreter (the floor uses its scripts)"
    return Impl("floor", "floor (bare script loop)", [sys.executable, os.path.join(ROOT, "scripts", "bench_floor.py")],
                version, postgres_argv=[sys.executable, os.path.join(ROOT, "scripts", "bench_pg_floor.py")]), ""


def ceiling_impl() -> tuple[Optional[Impl], str]:
    """pgbench running each PostgreSQL row's transactions (scripts/bench_pg_ceiling.py)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_pg_ceiling import pgbench_path

    found = pgbench_path()
    if found is None:
        return None, ("pgbench is not installed (Debian package postgresql-15 / postgresql-contrib; make pgbench): "
                      "no commit ceiling")
    match = re.search(r"\) ([0-9][0-9.]*)", command_output([found, "--version"]))
    version = match.group(1) if match else "?"
    return Impl("ceiling", f"commit ceiling (pgbench {version})",
                [sys.executable, os.path.join(ROOT, "scripts", "bench_pg_ceiling.py")], version), ""


def runs_here(impl: Impl, m: Measurement) -> bool:
    """Whether ``impl`` takes part in measurement ``m``."""
    if m.only and impl.key != m.only:
        return False
    if impl.key == "floor":  # a loop over upstream's scripts / SQL: no idle wait, no group gate
        return not m.is_latency and not m.groups and not m.gate
    if impl.key == "ceiling":  # pgbench: the PostgreSQL rows of every implementation
        return m.backend == "postgres" and not m.is_latency and not m.groups and not m.gate
    if impl.key in PEER_IMPLS:  # other queues: their Redis rows, add-bulk where they have a bulk enqueue
        return m.backend == "redis" and m.key in PEER_ROWS and (m.key != "add-bulk" or impl.key in PEER_BULK)
    return True


def _pip(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=600)


def _installed_version(python: str) -> str:
    return command_output([python, "-c", "import importlib.metadata as m; print(m.version('bullmq'))"])


def official_postgres(python: str) -> str:
    """Why the official port cannot run on PostgreSQL here ("" if it can): its backend needs the
    driver of its ``postgres`` extra (installed into its venv when missing)."""
    probe = "import bullmq.backends.postgres_backend"
    if subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0:
        return ""
    version = _installed_version(python)
    print(f"installing bullmq[postgres]=={version} into {os.path.relpath(OFFICIAL_VENV, ROOT)} ...", flush=True)
    done = _pip(python, "install", "-q", f"bullmq[postgres]=={version}")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return "pip install bullmq[postgres] failed: " + " / ".join(tail)
    probe_run = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    if probe_run.returncode != 0:
        last = (probe_run.stderr.strip().splitlines() or ["?"])[-1]
        return f"bullmq {version} has no usable PostgreSQL backend here: {last}"
    return ""


def official_impl() -> tuple[Optional[Impl], str]:
    """The latest PyPI ``bullmq`` in a venv of its own (created and updated as needed)."""
    python = os.path.join(OFFICIAL_VENV, "bin", "python")
    try:
        if not os.path.exists(python):
            print(f"creating {os.path.relpath(OFFICIAL_VENV, ROOT)} for the official bullmq port ...", flush=True)
            subprocess.run([sys.executable, "-m", "venv", OFFICIAL_VENV], check=True, capture_output=True,
                           timeout=300)
        latest = ""
        listing = _pip(python, "index", "versions", "bullmq")
        match = re.search(r"^bullmq \(([^)]+)\)", listing.stdout, re.M)
        if match:
            latest = match.group(1)
        installed = _installed_version(python)
        if not installed or (latest and installed != latest):
            spec = f"bullmq=={latest}" if latest else "bullmq"
            print(f"installing {spec} into {os.path.relpath(OFFICIAL_VENV, ROOT)} ...", flush=True)
            done = _pip(python, "install", "-q", *([] if latest else ["--upgrade"]), spec)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                return None, "pip install bullmq failed: " + " / ".join(tail)
            installed = _installed_version(python)
        if not installed:
            return None, "bullmq is not importable in the official venv"
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"could not set up the official venv: {err}"
    return Impl("official", f"bullmq (PyPI) {installed}",
                [python, os.path.join(ROOT, "scripts", "bench_official.py")], installed), ""


def peer_impl(key: str) -> tuple[Optional[Impl], str]:
    """Another Python queue (arq, RQ, Celery, Dramatiq): its latest release in a venv of its own,
    bench-results/.venv-<key>, created and updated as the official port's; skipped with a note
    when that fails."""
    venv = os.path.join(ROOT, "bench-results", f".venv-{key}")
    python = os.path.join(venv, "bin", "python")
    spec = PEER_SPECS[key]
    name = spec.split("[")[0]
    probe = f"import importlib.metadata as m; print(m.version({name!r}))"
    try:
        if not os.path.exists(python):
            print(f"creating {os.path.relpath(venv, ROOT)} for {PEER_NAMES[key]} ...", flush=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=300)
        listing = _pip(python, "index", "versions", name)
        match = re.search(rf"^{re.escape(name)} \(([^)]+)\)", listing.stdout, re.M)
        latest = match.group(1) if match else ""
        installed = command_output([python, "-c", probe])
        if not installed or (latest and installed != latest):
            pinned = f"{spec}=={latest}" if latest else spec
            print(f"installing {pinned} into {os.path.relpath(venv, ROOT)} ...", flush=True)
            done = _pip(python, "install", "-q", *([] if latest else ["--upgrade"]), pinned)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                return None, f"pip install {spec} failed: " + " / ".join(tail)
            installed = command_output([python, "-c", probe])
        if not installed:
            return None, f"{name} is not importable in {os.path.relpath(venv, ROOT)}"
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"could not set up the {key} venv: {err}"
    return Impl(key, f"{PEER_NAMES[key]} {installed}",
                [python, os.path.join(ROOT, "scripts", f"bench_peer_{key}.py")], installed), ""


def peer_view(impl: Impl, m: Measurement) -> Impl:
    """A peer with its worker model in the label, for the tables of the worker and latency rows."""
    model = PEER_MODELS.get((impl.key, 1 if m.is_latency else m.concurrency))
    if impl.key not in PEER_IMPLS or not model or m.op not in ("process", "latency"):
        return impl
    return replace(impl, label=f"{impl.label} ({model})")


#: bullmq-compat over the fastest other Python queue, on every row they share (the README's goal)
PEER_GOAL = 2.0


def peer_ratios(plan: list[Measurement], impls: list[Impl],
                summary: dict[str, Any]) -> list[tuple[str, Optional[float], str]]:
    """Per Redis row the peers have: (row, bullmq-compat / the fastest peer or None, what it says)."""
    peers = [i for i in impls if i.key in PEER_IMPLS]
    out: list[tuple[str, Optional[float], str]] = []
    if not peers:
        return out
    for m in plan:
        if m.backend != "redis" or m.key not in PEER_ROWS:
            continue
        per = summary.get(m.key) or {}
        ours = per.get("compat")
        theirs = {p.key: per.get(p.key) for p in peers if runs_here(p, m) and per.get(p.key)}
        if not theirs:
            out.append((m.key, None, "-- no peer has this row (" + "; ".join(
                f"{PEER_NAMES[p.key]}: {PEER_NO_BULK.get(p.key, 'no result')}" for p in peers) + ")"))
            continue
        if not ours:
            out.append((m.key, None, "n/a (no bullmq-compat result)"))
            continue
        if m.is_latency:  # lower is better: the fastest peer's p50 over ours
            best = min(theirs, key=lambda k: theirs[k]["p50Ms"]["median"])
            ratio = theirs[best]["p50Ms"]["median"] / ours["p50Ms"]["median"] if ours["p50Ms"]["median"] else 0.0
            p99 = theirs[best]["p99Ms"]["median"] / ours["p99Ms"]["median"] if ours["p99Ms"]["median"] else 0.0
            what = f" (p50, lower is better: theirs / ours; p99 {p99:.2f}x)"
        else:
            best = max(theirs, key=lambda k: theirs[k]["jobsPerSec"]["median"])
            ratio = ours["jobsPerSec"]["median"] / theirs[best]["jobsPerSec"]["median"]
            what = ""
        out.append((m.key, ratio, f"bullmq-compat / fastest peer: {ratio:.2f}\u00d7 ({PEER_NAMES[best]}){what} "
                                  f"\u2014 goal {PEER_GOAL:g}\u00d7: {'met' if ratio >= PEER_GOAL else 'not met'}"))
    return out


def peer_lines(plan: list[Measurement], impls: list[Impl], summary: dict[str, Any]) -> list[str]:
    """After the Redis tables: bullmq-compat over the fastest peer, per row, against the 2x goal."""
    rows = peer_ratios(plan, impls, summary)
    if not rows:
        return []
    return ["bullmq-compat vs the other Python queues (medians; goal: >= 2x the fastest of them on every row):"] + [
        f"  {key:<12} {what}" for key, _, what in rows]


# -- Redis stats --------------------------------------------------------------------------------
def parse_info(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value
    return out


def parse_commandstats(text: str) -> dict[str, dict[str, float]]:
    stats: dict[str, dict[str, float]] = {}
    for key, value in parse_info(text).items():
        if not key.startswith("cmdstat_"):
            continue
        fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
        stats[key[len("cmdstat_"):]] = {"calls": float(fields.get("calls", 0)), "usec": float(fields.get("usec", 0))}
    return stats


def is_top_level(command: str) -> bool:
    return command in TOP_LEVEL or command.startswith(TOP_LEVEL_PREFIXES)


def redis_figures(out: dict[str, Any]) -> dict[str, Any]:
    stats = parse_commandstats(out.get("redisCommandstats", ""))
    top = nested = 0.0
    for command, row in stats.items():
        if command in IGNORED:
            continue
        if is_top_level(command):
            top += row["usec"]
        else:
            nested += row["usec"]
    before, after = parse_info(out.get("redisCpuBefore", "")), parse_info(out.get("redisCpuAfter", ""))

    def cpu(info: dict[str, str]) -> float:
        return float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0))

    return {
        "redisTopUsec": top,
        "redisNestedUsec": nested,
        "redisCpuUsec": (cpu(after) - cpu(before)) * 1e6,
        "commandstats": {k: v for k, v in stats.items() if k not in IGNORED},
    }


# -- PostgreSQL ---------------------------------------------------------------------------------
def psql(url: str, sql: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """One statement through psql (the bench's own SQL: a version probe, dropping its schemas)."""
    return subprocess.run([shutil.which("psql") or "psql", "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql,
                           "--dbname", url], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PGCONNECT_TIMEOUT": "5"})


def postgres_version(url: str) -> tuple[Optional[str], str]:
    """The server's version, or None and why it does not answer."""
    try:
        done = psql(url, "SHOW server_version", timeout=15)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"psql did not answer: {err}"
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or ["psql failed"])[0]
    return done.stdout.strip() or "?", ""


def drop_schema(url: str, schema: str) -> None:
    psql(url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE').check_returncode()


def postgres_server_cpu_us() -> Optional[float]:
    """CPU (user+sys) of every process named postgres on this machine so far, with their exited
    children's (the postmaster reaps the backends), in µs (/proc; None off Linux): the server's own
    work, its background writers included, when it runs here."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, seen = 0, False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name, rest = text[text.find("(") + 1:text.rfind(")")], text[text.rfind(")") + 2:].split()
        if name.startswith("postgres"):
            seen = True
            # utime, stime, and cutime, cstime: the postmaster's reaped children (backends that exited)
            total += int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return total * 1e6 / tick if seen else None


def postgres_counters(url: str) -> Optional[dict[str, float]]:
    """The server's commits (this database) and WAL figures so far (pg_stat_database, pg_stat_wal),
    and its processes' CPU: read before and after a run, for the profile of a PostgreSQL row."""
    try:
        done = psql(url, "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), "
                         "wal_records, wal_bytes, wal_write, wal_sync FROM pg_stat_wal", timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        commits, records, wal_bytes, writes, syncs = (float(x) for x in done.stdout.strip().split("|"))
    except ValueError:
        return None
    return {"commits": commits, "walRecords": records, "walBytes": wal_bytes, "walWrites": writes,
            "walSyncs": syncs, "serverCpuUs": postgres_server_cpu_us() or 0.0}


# -- running ------------------------------------------------------------------------------------
def redis_cli(port: int, *args: str) -> str:
    """One command to the bench's own redis-server (redis-cli ships with it)."""
    return subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(port), *args], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def flush(port: int) -> None:
    redis_cli(port, "FLUSHALL")


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


@dataclass
class Target:
    """Where the runs go: the Redis server and/or the PostgreSQL database."""
    redis: Optional[RedisServer] = None
    postgres_url: Optional[str] = None


def run_one(impl: Impl, m: Measurement, target: Target) -> dict[str, Any]:
    args: dict[str, Any] = {"queue": f"bench-{m.key}-{uuid.uuid4().hex[:8]}", "op": m.op, "jobs": m.jobs,
                            "concurrency": m.concurrency, "removeOnComplete": m.remove_on_complete,
                            "batch": m.batch, "interval": m.interval, "groups": m.groups,
                            "batchSize": m.batch_size}
    if m.group_rate:
        args["groupRateLimit"] = {"max": m.group_rate[0], "duration": m.group_rate[1]}
    schema = None
    if m.backend == "postgres":
        assert target.postgres_url
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        args.update(postgres=target.postgres_url, schema=schema, pgGroups=m.gate)
    else:
        assert target.redis is not None
        flush(target.redis.port)
        args["redis"] = target.redis.url
    ticks = cpu_ticks()
    counters_before = postgres_counters(target.postgres_url) if schema is not None and target.postgres_url else None
    counters_after = None
    try:
        argv = impl.postgres_argv if m.backend == "postgres" and impl.postgres_argv else impl.argv
        proc = subprocess.run([*argv, json.dumps(args)], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              cwd=ROOT)
    finally:
        steal = steal_share(ticks, cpu_ticks())
        if counters_before is not None:
            time.sleep(0.2)  # the runner's sessions have exited: their statistics reach the server
            counters_after = postgres_counters(target.postgres_url or "")
        if schema is not None:
            drop_schema(target.postgres_url or "", schema)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"exit {proc.returncode}, no JSON; stderr: {proc.stderr.strip()[-2000:]}") from None
    if "error" in out or proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {out.get('error', '')} {proc.stderr.strip()[-2000:]}")
    jobs = out["jobs"]
    run = {"seconds": out["seconds"], "jobs": jobs, "cpuUserMs": out["cpuUserMs"], "cpuSysMs": out["cpuSysMs"]}
    if m.group_rate and "steadyJobsPerSec" in out:
        # the shortest run the limits allow: a group's last job starts no sooner than (windows - 1) x
        # duration after its first, so limitSeconds / seconds is at most 1 while the limits hold
        per_group = -(-jobs // m.groups)
        windows = -(-per_group // m.group_rate[0])
        run["limitSeconds"] = (windows - 1) * m.group_rate[1] / 1000
        run["rateCeilingShare"] = run["limitSeconds"] / out["seconds"] if out["seconds"] else 0.0
        run["steadyJobsPerSec"] = out["steadyJobsPerSec"]  # after the first window's jobs were done
    if steal is not None:
        run["stealShare"] = steal  # of the whole process's life (its set-up included)
    run["jobsPerSec"] = jobs / out["seconds"] if out["seconds"] > 0 else 0.0
    run["clientCpuUsPerJob"] = (out["cpuUserMs"] + out["cpuSysMs"]) * 1000.0 / jobs
    # the client's CPU over its wall time: near 100 % (one core) means the client is what limits
    run["clientCpuShare"] = (out["cpuUserMs"] + out["cpuSysMs"]) / 1000.0 / out["seconds"] if out["seconds"] else 0.0
    if m.backend == "redis":
        run.update(redis_figures(out))
        if impl.key in PEER_IMPLS:
            # plain commands, MULTI/EXEC and scripts alike: each command once (EXEC and script calls
            # only hold the commands counted on their own lines), the harness's own left out
            run["redisTopUsec"] = sum(row["usec"] for cmd, row in run["commandstats"].items()
                                      if cmd not in SCRIPT_CALLS and cmd != "exec"
                                      and cmd not in PEER_HARNESS_COMMANDS)
            run["workerCpuMs"] = out.get("workerCpuMs", 0.0)
            if out.get("model"):
                run["model"] = out["model"]
        run["redisCmdUsPerJob"] = run["redisTopUsec"] / jobs
        run["redisCpuUsPerJob"] = run["redisCpuUsec"] / jobs
        # throughput over 1 / (Redis CPU per job): how busy the single-threaded server was
        run["redisCeilingShare"] = run["jobsPerSec"] * run["redisCpuUsPerJob"] / 1e6
    if schema is not None:
        run["schema"] = schema
    if counters_before and counters_after:
        # over the runner's whole life (its migration and pre-load included) and server-wide
        # (whatever else ran on the server then too): a profile, not a measurement of the timed part
        delta = {k: counters_after[k] - counters_before[k] for k in counters_before}
        run["pgServer"] = delta
        run["serverCpuUsPerJob"] = delta["serverCpuUs"] / jobs
        run["commitsPerJob"] = delta["commits"] / jobs
        run["walFlushesPerJob"] = delta["walSyncs"] / jobs
        run["walBytesPerJob"] = delta["walBytes"] / jobs
    if m.is_latency:
        lat = out.get("latenciesMs") or []
        if len(lat) != jobs:
            raise RuntimeError(f"{len(lat)} latencies for {jobs} jobs")
        run["p50Ms"] = percentile(lat, 50)
        run["p99Ms"] = percentile(lat, 99)
        run["maxMs"] = max(lat)
        run["latenciesMs"] = [round(x, 3) for x in lat]
    if proc.stderr.strip():
        run["stderr"] = proc.stderr.strip()[-2000:]
    return run


def run_paired(impl: Impl, m: Measurement, server: Target, twin_first: bool) -> dict[str, Any]:
    """Run ``m`` and, right before or after it (alternating by round), its twin without groups:
    the same jobs and worker settings, so that the machine's drift, which is large here, hits both
    alike. The run of ``m`` carries the twin's rate and the ratio of the two."""
    twin = replace(m, key=f"{m.key}-twin", groups=0, batch_size=0, baseline=None,
                   concurrency=m.twin_concurrency or m.concurrency,
                   gate=m.gate if m.twin_gate is None else m.twin_gate, twin_gate=None)
    if twin_first:
        base = run_one(impl, twin, server)
        run = run_one(impl, m, server)
    else:
        run = run_one(impl, m, server)
        base = run_one(impl, twin, server)
    run["pairedBaselineJobsPerSec"] = base["jobsPerSec"]
    run["pairedRatio"] = run["jobsPerSec"] / base["jobsPerSec"] if base["jobsPerSec"] else 0.0
    run["pairedBaselineCpuUsPerJob"] = base["clientCpuUsPerJob"]
    run["pairedCpuRatio"] = (run["clientCpuUsPerJob"] / base["clientCpuUsPerJob"]
                             if base["clientCpuUsPerJob"] else 0.0)
    return run


def postgres_measurements(args: argparse.Namespace) -> list[Measurement]:
    if args.quick:
        n_add, n_bulk, n_proc = 300, 1000, 1000
    else:
        n_add, n_bulk, n_proc = 2000, 10_000, 3000
    if args.jobs:
        n_add = n_bulk = n_proc = args.jobs
    out = [
        Measurement("pg-add", f"PostgreSQL: add one at a time ({n_add:,} jobs, sequential awaits)", "add", n_add,
                    backend="postgres"),
        Measurement("pg-add-bulk", f"PostgreSQL: add_bulk ({n_bulk:,} jobs, batches of {min(1000, n_bulk):,})",
                    "addBulk", n_bulk, batch=min(1000, n_bulk), backend="postgres"),
    ]
    for c in (1, 10):
        out.append(Measurement(f"pg-process-c{c}", f"PostgreSQL: worker c={c} ({n_proc:,} pre-loaded no-op jobs, "
                               "jobs kept)", "process", n_proc, concurrency=c, batch=min(1000, n_proc),
                               backend="postgres"))
    n_groups = max(1, n_proc // 20)
    out += [
        Measurement("pg-process-grouped", f"PostgreSQL: worker c=10, the jobs over {n_groups:,} groups (bullmq-compat "
                    "only; paired with an ungrouped twin in a schema with our group objects)", "process", n_proc,
                    concurrency=10, batch=min(1000, n_proc), groups=n_groups, only="compat", baseline="pg-process-c10",
                    backend="postgres", gate=True),
        Measurement("pg-process-gate", "PostgreSQL: worker c=10, ungrouped jobs in a schema with our group objects "
                    "(bullmq-compat only; paired with a twin in a schema without them)", "process", n_proc,
                    concurrency=10, batch=min(1000, n_proc), only="compat", baseline="pg-process-c10",
                    backend="postgres", gate=True, twin_gate=False, twin_label="twin without our group objects"),
        Measurement("pg-add-gate", f"PostgreSQL: add one at a time ({n_add:,} ungrouped jobs) in a schema with our "
                    "group objects (bullmq-compat only; paired with a twin without them)", "add", n_add,
                    only="compat", baseline="pg-add", backend="postgres", gate=True, twin_gate=False,
                    twin_label="twin without our group objects"),
    ]
    return out


def measurements(args: argparse.Namespace) -> list[Measurement]:
    """Every measurement of the run, both backends (main drops those of a backend not wanted)."""
    if args.quick:
        n_add, n_bulk, n_proc, n_lat = 1000, 2000, 2000, 50
    else:
        n_add, n_bulk, n_proc, n_lat = 10_000, 20_000, 20_000, 200
    if args.jobs:
        n_add = n_bulk = n_proc = args.jobs
    if args.latency_jobs:
        n_lat = args.latency_jobs
    out = [
        Measurement("add", f"add one at a time ({n_add:,} jobs, sequential awaits)", "add", n_add),
        Measurement("add-bulk", f"add in bulk ({n_bulk:,} jobs, batches of {min(1000, n_bulk):,})", "addBulk",
                    n_bulk, batch=min(1000, n_bulk)),
    ]
    for c in (1, 10, 100):
        for roc in (False, True):
            out.append(Measurement(
                f"process-c{c}{'-roc' if roc else ''}",
                f"process {n_proc:,} pre-loaded no-op jobs, concurrency {c}, "
                f"{'removeOnComplete' if roc else 'jobs kept'}", "process", n_proc, concurrency=c,
                remove_on_complete=roc, batch=min(1000, n_proc)))
    out.append(Measurement(
        "process-grouped", f"process {n_proc:,} pre-loaded no-op jobs over {max(1, n_proc // 20):,} groups, "
        f"concurrency 100, jobs kept (bullmq-compat only; ratio against its ungrouped run)", "process", n_proc,
        concurrency=100, batch=min(1000, n_proc), groups=max(1, n_proc // 20), only="compat",
        baseline="process-c100"))
    n_rl = args.jobs or (10_000 if args.quick else 25_000)
    rl_groups = max(1, min(1000, n_rl // 25))  # 25 jobs a group: the first window and four more
    out.append(Measurement(
        "process-grouped-rl", f"process {n_rl:,} pre-loaded no-op jobs over {rl_groups:,} groups, each group "
        f"rate-limited to 5 jobs/s (set_default_group_rate_limit(max=5, duration=1000)), concurrency 100 "
        f"(bullmq-compat only; its time against the shortest the limits allow)",
        "process", n_rl, concurrency=100, batch=min(1000, n_rl), groups=rl_groups, only="compat",
        group_rate=(5, 1000)))
    out.append(Measurement(
        "process-batch50", f"process {n_proc:,} pre-loaded no-op jobs in batches of 50 (batch worker, 2 batches "
        f"in flight), jobs kept (bullmq-compat only; ratio against its concurrency-100 run)", "process", n_proc,
        concurrency=2, batch=min(1000, n_proc), batch_size=50, twin_concurrency=100, only="compat",
        baseline="process-c100"))
    out.append(Measurement("latency", f"latency add -> processing start, idle worker ({n_lat} jobs, 20 ms apart)",
                           "latency", n_lat, interval=20))
    out += postgres_measurements(args)
    if args.measurements:
        wanted = [w.strip() for w in args.measurements.split(",") if w.strip()]
        unknown = set(wanted) - {m.key for m in out}
        if unknown:
            raise SystemExit(f"unknown measurement(s) {sorted(unknown)}; known: {[m.key for m in out]}")
        out = [m for m in out if m.key in wanted]
    return out


# -- reporting ----------------------------------------------------------------------------------
def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell_summary(cell: Cell, m: Measurement) -> Optional[dict[str, Any]]:
    if not cell.runs:
        return None
    keys = ["jobsPerSec", "seconds", "clientCpuUsPerJob", "clientCpuShare"]
    if m.backend == "redis":
        keys += ["redisCmdUsPerJob", "redisCpuUsPerJob", "redisCeilingShare"]
    profile = ["serverCpuUsPerJob", "commitsPerJob", "walFlushesPerJob", "walBytesPerJob"]
    if m.backend == "postgres" and all(k in r for r in cell.runs for k in profile):
        keys += profile
    if m.is_latency:
        keys += ["p50Ms", "p99Ms"]
    if all("pairedRatio" in r for r in cell.runs):
        keys += ["pairedRatio", "pairedBaselineJobsPerSec", "pairedCpuRatio", "pairedBaselineCpuUsPerJob"]
    if all("steadyJobsPerSec" in r for r in cell.runs):
        keys += ["steadyJobsPerSec", "rateCeilingShare"]
    return {k: summarize([r[k] for r in cell.runs]) for k in keys} | {"rounds": len(cell.runs)}


def fmt_num(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_range(s: dict[str, float]) -> str:
    return f"{fmt_num(s['median'])} [{fmt_num(s['min'])}-{fmt_num(s['max'])}]"


def baseline_ratio(m: Measurement, summary: dict[str, Any]) -> Optional[float]:
    """Median jobs/s of ``m`` over that of its baseline measurement, for the same implementation."""
    if not (m.baseline and m.only):
        return None
    mine = (summary.get(m.key) or {}).get(m.only)
    base = (summary.get(m.baseline) or {}).get(m.only)
    if not mine or not base or not base["jobsPerSec"]["median"]:
        return None
    return float(mine["jobsPerSec"]["median"] / base["jobsPerSec"]["median"])


def render_table(m: Measurement, impls: list[Impl], summary: dict[str, Any], cells: dict[str, Cell],
                 not_here: Optional[dict[str, str]] = None) -> str:
    """``not_here``: implementation -> why it has no run of this measurement (printed as n/a)."""
    node = summary.get("node")
    pg = m.backend == "postgres"
    if pg:
        header = ["implementation", "jobs/s median [min-max]", "vs Node", "of floor", "of commit ceiling",
                  "client CPU us/job", "client CPU/wall"]
    elif m.is_latency:
        header = ["implementation", "p50 ms median [min-max]", "p99 ms median [min-max]", "p50 vs Node",
                  "client CPU us/job", "Redis cmd us/job", "Redis CPU us/job"]
    else:
        header = ["implementation", "jobs/s median [min-max]", "vs Node", "of floor", "client CPU us/job",
                  "Redis cmd us/job", "Redis CPU us/job", "of Redis ceiling"]
    floor = summary.get("floor")
    ceiling = summary.get("ceiling")
    rows = []
    for impl in impls:
        s = summary.get(impl.key)
        if not runs_here(impl, m):
            continue
        if not_here and impl.key in not_here:
            rows.append([impl.label, f"n/a: {not_here[impl.key]}"] + [""] * (len(header) - 2))
            continue
        if s is None:
            err = cells[impl.key].errors[-1].splitlines()[0][:80] if cells[impl.key].errors else "no runs"
            rows.append([impl.label, f"FAILED: {err}"] + [""] * (len(header) - 2))
            continue
        cpu = fmt_num(s["clientCpuUsPerJob"]["median"])
        if pg:
            ratio = (f"{s['jobsPerSec']['median'] / node['jobsPerSec']['median']:.2f}x"
                     if node and node["jobsPerSec"]["median"] else "-")
            of_floor = (f"{s['jobsPerSec']['median'] / floor['jobsPerSec']['median'] * 100:.0f}%"
                        if floor and floor["jobsPerSec"]["median"] else "-")
            of_ceiling = (f"{s['jobsPerSec']['median'] / ceiling['jobsPerSec']['median'] * 100:.0f}%"
                          if ceiling and ceiling["jobsPerSec"]["median"] else "-")
            rows.append([impl.label, fmt_range(s["jobsPerSec"]), ratio, of_floor, of_ceiling, cpu,
                         f"{s['clientCpuShare']['median'] * 100:.0f}%"])
            continue
        rcmd = fmt_num(s["redisCmdUsPerJob"]["median"])
        rcpu = fmt_num(s["redisCpuUsPerJob"]["median"])
        if m.is_latency:
            ratio = f"{s['p50Ms']['median'] / node['p50Ms']['median']:.2f}x" if node and node["p50Ms"]["median"] else "-"
            rows.append([impl.label, fmt_range(s["p50Ms"]), fmt_range(s["p99Ms"]), ratio, cpu, rcmd, rcpu])
        else:
            ratio = (f"{s['jobsPerSec']['median'] / node['jobsPerSec']['median']:.2f}x"
                     if node and node["jobsPerSec"]["median"] else "-")
            of_floor = (f"{s['jobsPerSec']['median'] / floor['jobsPerSec']['median'] * 100:.0f}%"
                        if floor and floor["jobsPerSec"]["median"] else "-")
            ceiling = f"{s['redisCeilingShare']['median'] * 100:.0f}%"
            rows.append([impl.label, fmt_range(s["jobsPerSec"]), ratio, of_floor, cpu, rcmd, rcpu, ceiling])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"== {m.title}"]
    for i, r in enumerate([header, *rows]):
        lines.append("  ".join(str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in
                               enumerate(zip(r, widths))).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if m.is_latency:
        lines.append("   (p50 vs Node: lower is better; per-job figures are over the whole timed section)")
    elif not pg:
        lines.append("   (of floor: jobs/s over the bare script loop's; of Redis ceiling: jobs/s x Redis CPU per job, "
                     "the share of a core redis-server used)")
    elif floor or ceiling:
        lines.append("   (of floor: jobs/s over the bare psycopg/libpq loop's over the same upstream SQL calls; of commit "
                     "ceiling: over pgbench's, the same transactions with the row's clients; median over median)")
    return "\n".join(lines)


def round_ratios(cells: dict[str, Cell], impl: str, base: str = "node") -> list[float]:
    """``impl``'s jobs/s over ``base``'s, round by round (the rounds where both have a run): the
    two ran minutes apart at most, so the machine's drift, large here, mostly cancels."""
    if impl not in cells or base not in cells:
        return []
    theirs = {r["round"]: r["jobsPerSec"] for r in cells[base].runs if r.get("jobsPerSec")}
    return [r["jobsPerSec"] / theirs[r["round"]] for r in cells[impl].runs if r["round"] in theirs]


def postgres_note(plan: list[Measurement], summary: dict[str, Any], machine: dict[str, Any],
                  cells: Optional[dict[str, dict[str, Cell]]] = None) -> list[str]:
    """The closing note of the PostgreSQL rows: ours / Node and the official port / Node per row
    (ratio of the medians, and the median of the per-round ratios), against the targets, and for
    a row below target what the figures say limits it."""
    rows = [m for m in plan if m.backend == "postgres"]
    if not rows:
        return []
    cores = machine.get("cores") or 1
    targets = ", ".join(f"{key} >= {value}x" for key, value in PG_TARGETS.items())
    lines = [f"PostgreSQL, ours vs Node's Postgres backend (median jobs/s ratio; targets, median of the per-round "
             f"ratios: {targets}; client CPU per job at or below Node's):"]
    for m in rows:
        per = summary.get(m.key) or {}
        node, ours, official = per.get("node"), per.get("compat"), per.get("official")
        title = m.title.split(" (")[0]
        if not node or not ours:
            lines.append(f"  {title:<38} n/a (no {'Node' if not node else 'bullmq-compat'} result)")
            continue
        ratio = ours["jobsPerSec"]["median"] / node["jobsPerSec"]["median"]
        target = PG_TARGETS.get(m.key)
        verdict = "" if target is None else (" meets target" if ratio >= target else f" BELOW target {target}x")
        off = (f"; official port {official['jobsPerSec']['median'] / node['jobsPerSec']['median']:.2f}x"
               if official else "")
        paired = round_ratios(cells[m.key], "compat") if cells and m.key in cells else []
        per_round = (f" (per round: median {statistics.median(paired):.2f}x [{min(paired):.2f}-{max(paired):.2f}])"
                     if len(paired) > 1 else "")
        lines.append(f"  {title:<38} ours {ratio:.2f}x{per_round}{verdict}{off}")
        if target is not None and ratio < target:
            share = ours["clientCpuShare"]["median"]
            # per job: how much longer ours takes than Node, and how much more CPU it spends
            extra_wall = 1e6 / ours["jobsPerSec"]["median"] - 1e6 / node["jobsPerSec"]["median"]
            extra_cpu = ours["clientCpuUsPerJob"]["median"] - node["clientCpuUsPerJob"]["median"]
            if extra_wall > 0 and extra_cpu >= 0.4 * extra_wall:
                why = (f"client CPU: {ours['clientCpuUsPerJob']['median']:.0f} us/job against Node's "
                       f"{node['clientCpuUsPerJob']['median']:.0f}, spent while no statement is in flight; the "
                       f"{extra_cpu:.0f} us more are {min(100.0, 100 * extra_cpu / extra_wall):.0f}% of the "
                       f"{extra_wall:.0f} us/job by which ours is slower")
            elif share >= 0.85:
                why = (f"our process is CPU-bound ({share * 100:.0f}% of a core, "
                       f"{ours['clientCpuUsPerJob']['median']:.0f} us/job)")
            else:
                why = (f"our process is busy only {share * 100:.0f}% of the wall time "
                       f"({ours['clientCpuUsPerJob']['median']:.0f} us CPU/job, Node "
                       f"{node['clientCpuUsPerJob']['median']:.0f}): it waits on PostgreSQL -- one statement "
                       f"and one synchronous commit per call, the same SQL as Node's, on a server that shares "
                       f"the {cores} cores with the clients")
            lines.append(f"  {'':<38}   limit: {why}")
        lines += postgres_profile(per)
    return lines


def postgres_profile(per: dict[str, Any]) -> list[str]:
    """Per job, medians over the rounds: the server's CPU, commits and WAL flushes of each
    implementation's runs (over each runner's whole life, set-up included, server-wide)."""
    out = []
    for key, label in (("compat", "ours"), ("node", "Node"), ("floor", "floor"), ("ceiling", "pgbench")):
        s = per.get(key)
        if not s or "commitsPerJob" not in s:
            continue
        out.append(f"{label} {s['clientCpuUsPerJob']['median']:.1f}/{s['serverCpuUsPerJob']['median']:.0f} us, "
                   f"{s['commitsPerJob']['median']:.3f} commits, {s['walFlushesPerJob']['median']:.3f} WAL flushes, "
                   f"{s['walBytesPerJob']['median']:,.0f} B WAL")
    if not out:
        return []
    return [f"  {'':<38}   per job (client/server CPU; whole runs, set-up incl.): " + "; ".join(out)]


def check_targets(plan: list[Measurement], summary: dict[str, Any],
                  cells: dict[str, dict[str, Cell]], impls: Sequence[Impl] = ()) -> list[str]:
    """The rows that miss their target (``--check``), one line each: a PostgreSQL row of PG_TARGETS
    needs ours / Node's jobs/s, per round, at the target or above (the median of >= 3 rounds) and our
    client CPU per job (median) at or below Node's; a Redis row the other Python queues ran (``impls``
    holds them) needs bullmq-compat at PEER_GOAL x the fastest of them or better. The other Redis rows
    have no target here."""
    misses = [f"{key}: {what.strip()}" for key, ratio, what in peer_ratios(plan, list(impls), summary)
              if ratio is not None and ratio < PEER_GOAL]
    for m in plan:
        target = PG_TARGETS.get(m.key) if m.backend == "postgres" else None
        if target is None:
            continue
        per = summary.get(m.key) or {}
        node, ours = per.get("node"), per.get("compat")
        if not node or not ours:
            misses.append(f"{m.key}: no {'Node' if not node else 'bullmq-compat'} result")
            continue
        paired = round_ratios(cells[m.key], "compat")
        if len(paired) < 3:
            misses.append(f"{m.key}: {len(paired)} round(s) with both results; the target needs >= 3")
        elif statistics.median(paired) < target:
            misses.append(f"{m.key}: ours / Node {statistics.median(paired):.2f}x (median of {len(paired)} per-round "
                          f"ratios) below the target {target}x")
        ours_cpu, node_cpu = ours["clientCpuUsPerJob"]["median"], node["clientCpuUsPerJob"]["median"]
        if ours_cpu > node_cpu:
            misses.append(f"{m.key}: client CPU {ours_cpu:.1f} us/job above Node's {node_cpu:.1f}")
    return misses


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs and 1 round (smoke runs)")
    parser.add_argument("--json", metavar="PATH", help="write machine, config, every run and the summary here")
    parser.add_argument("--rounds", type=int, help="rounds per measurement (default 3; 1 with --quick)")
    parser.add_argument("--jobs", type=int, help="job count of the add, bulk and process measurements")
    parser.add_argument("--latency-jobs", type=int, help="job count of the latency measurement (default 200)")
    parser.add_argument("--only", help="comma-separated implementations among " + ",".join(IMPLS))
    parser.add_argument("--no-peers", action="store_true",
                        help="leave out the other Python queues (arq, rq, celery, dramatiq), which run by default")
    parser.add_argument("--measurements", help="comma-separated measurement keys (default: all)")
    parser.add_argument("--backends", help="comma-separated among redis,postgres (default: redis, and postgres "
                                           "when it answers)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a row misses its target (PG_TARGETS, per-round ratios to Node, and client "
                             "CPU per job at or below Node's), printing which")
    parser.add_argument("--postgres-url", help=f"the PostgreSQL of the postgres rows (default: POSTGRES_URL, else "
                                               f"{DEFAULT_POSTGRES_URL})")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be >= 1")
    wanted = [w.strip() for w in (args.only or ",".join(IMPLS)).split(",") if w.strip()]
    if args.no_peers:
        wanted = [w for w in wanted if w not in PEER_IMPLS]
    if set(wanted) - set(IMPLS):
        parser.error(f"--only takes {','.join(IMPLS)}")
    backends = [w.strip() for w in (args.backends or ",".join(BACKENDS)).split(",") if w.strip()]
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends takes {','.join(BACKENDS)}")
    plan = [m for m in measurements(args) if m.backend in backends]
    if not plan:
        parser.error("no measurement left: --measurements names none of the --backends")

    postgres_url = args.postgres_url or os.environ.get("POSTGRES_URL") or DEFAULT_POSTGRES_URL
    pg_version: Optional[str] = None
    if any(m.backend == "postgres" for m in plan):
        pg_version, why = postgres_version(postgres_url)
        if pg_version is None:
            shown = re.sub(r"^([a-z]+://[^:@/]*):[^@]*@", r"\1:***@", postgres_url)
            # asked for by name: an error; by default: the Redis rows alone
            if args.backends or (args.measurements and all(m.backend == "postgres" for m in plan)):
                print(f"PostgreSQL at {shown} does not answer: {why}", file=sys.stderr)
                return 2
            print(f"NOTE: no PostgreSQL rows: {shown} does not answer ({why})", flush=True)
            plan = [m for m in plan if m.backend != "postgres"]
    if not plan:
        print("nothing to run", file=sys.stderr)
        return 2
    use_redis = any(m.backend == "redis" for m in plan)
    use_pg = any(m.backend == "postgres" for m in plan)

    impls: list[Impl] = []
    skipped: dict[str, str] = {}
    not_on_pg: dict[str, str] = {}   # implementation -> why it has no PostgreSQL runs
    for key, factory in (("node", node_impl), ("official", official_impl), ("compat", compat_impl),
                         ("floor", floor_impl), ("ceiling", ceiling_impl)):
        if key not in wanted or (key == "ceiling" and not use_pg):  # pgbench: PostgreSQL rows only
            continue
        impl, why = factory()
        if impl is None:
            skipped[key] = why
            print(f"NOTE: skipping {key}: {why}", flush=True)
            continue
        impls.append(impl)
        if key == "official" and use_pg:
            why_not = official_postgres(impl.argv[0])
            if why_not:
                not_on_pg[key] = why_not
                print(f"NOTE: official port on PostgreSQL: n/a: {why_not}", flush=True)
    for key in PEER_IMPLS:  # the other Python queues: Redis rows only
        if key not in wanted or not use_redis or not any(m.backend == "redis" and m.key in PEER_ROWS for m in plan):
            continue
        impl, why = peer_impl(key)
        if impl is None:
            skipped[key] = why
            print(f"NOTE: skipping {key}: {why}", flush=True)
            continue
        impls.append(impl)
    if not impls:
        print("nothing to run", file=sys.stderr)
        return 2

    server = RedisServer().start() if use_redis else None
    try:
        redis_version = "n/a"
        if server is not None:
            redis_version = parse_info(redis_cli(server.port, "INFO", "server")).get("redis_version", "?")
        target = Target(redis=server, postgres_url=postgres_url if use_pg else None)
        machine = machine_info(redis_version, pg_version)
        where = []
        if server is not None:
            where.append(f"Redis {redis_version} (own redis-server on 127.0.0.1:{server.port})")
        if use_pg:
            where.append(f"PostgreSQL {pg_version} (a fresh schema per run)")
        print(f"machine: {machine['cores']} cores, {machine['cpu_model']}; {'; '.join(where)}; "
              f"Python {machine['python_version']}; Node {machine['node_version']}", flush=True)
        print("implementations: " + ", ".join(i.label for i in impls), flush=True)
        peer_models = {i.key: {str(c): PEER_MODELS[(i.key, c)] for c in (1, 10)} for i in impls if i.key in PEER_IMPLS}
        if peer_models:
            print("other Python queues (Redis rows: add, add-bulk where they have a bulk enqueue, worker c=1 and "
                  "c=10 with jobs kept, latency): " + "; ".join(
                      f"{i.label}: c=1 {PEER_MODELS[(i.key, 1)]}, c=10 {PEER_MODELS[(i.key, 10)]}"
                      for i in impls if i.key in PEER_IMPLS), flush=True)
        print(f"{rounds} round(s); each run in a fresh process, Redis flushed / a new PostgreSQL schema before it; "
              "no warm-up", flush=True)

        cells = {m.key: {i.key: Cell() for i in impls} for m in plan}
        started = time.monotonic()
        ticks_at_start = cpu_ticks()
        for r in range(rounds):
            for m in plan:
                order = impls[r % len(impls):] + impls[:r % len(impls)]
                for impl in order:
                    if not runs_here(impl, m):
                        continue
                    if m.backend == "postgres" and impl.key in not_on_pg:
                        continue
                    cell = cells[m.key][impl.key]
                    try:
                        if m.baseline and impl.key == m.only:
                            run = run_paired(impl, m, target, twin_first=r % 2 == 0)
                        else:
                            run = run_one(impl, m, target)
                    except (RuntimeError, subprocess.TimeoutExpired) as err:
                        cell.errors.append(str(err))
                        print(f"  round {r + 1} {m.key:<16} {impl.key:<8} FAILED: {str(err)[:300]}",
                              file=sys.stderr, flush=True)
                        continue
                    run["round"] = r + 1
                    cell.runs.append(run)
                    extra = (f"p50 {run['p50Ms']:.2f} ms p99 {run['p99Ms']:.2f} ms" if m.is_latency
                             else f"{run['jobsPerSec']:>10,.0f} jobs/s")
                    if "steadyJobsPerSec" in run:
                        extra += (f" (the limits' shortest run {run['limitSeconds']:.1f} s: "
                                  f"{run['rateCeilingShare'] * 100:.0f}% of it; after the first window "
                                  f"{run['steadyJobsPerSec']:,.0f} jobs/s)")
                    if "pairedRatio" in run:
                        twin_name = m.twin_label or ("concurrency-100 twin" if m.batch_size else "ungrouped twin")
                        extra += (f" ({twin_name} {run['pairedBaselineJobsPerSec']:,.0f} jobs/s: "
                                  f"{run['pairedRatio']:.2f}x; cpu {run['pairedBaselineCpuUsPerJob']:.1f} us/job: "
                                  f"{run['pairedCpuRatio']:.2f}x)")
                    server_part = (f"  redis {run['redisCmdUsPerJob']:.1f} us/job" if "redisCmdUsPerJob" in run
                                   else f"  cpu/wall {run['clientCpuShare'] * 100:.0f}%")
                    if "stealShare" in run:
                        server_part += f"  steal {run['stealShare'] * 100:.0f}%"
                    print(f"  round {r + 1} {m.key:<16} {impl.key:<8} {extra}  "
                          f"cpu {run['clientCpuUsPerJob']:.1f} us/job{server_part}", flush=True)
        elapsed = time.monotonic() - started
        machine["loadavg_at_end"] = list(os.getloadavg())
        machine["steal_share"] = steal_share(ticks_at_start, cpu_ticks())

        summary = {m.key: {k: cell_summary(c, m) for k, c in cells[m.key].items()} for m in plan}
        print()
        print(f"Results: median [min-max] over {rounds} round(s); vs Node = median / Node's median "
              f"(jobs/s: higher is better). {elapsed:.0f} s in all.")
        print(f"machine: {machine['cores']} cores, {machine['cpu_model']}; Redis {redis_version}; "
              f"PostgreSQL {pg_version or 'n/a'}; Python {machine['python_version']}; Node {machine['node_version']}; "
              f"load average {machine['loadavg_at_start'][0]:.2f} at start, {machine['loadavg_at_end'][0]:.2f} at end"
              + ("" if machine["steal_share"] is None else
                 f"; steal {machine['steal_share'] * 100:.1f}% of CPU time (the host ran other guests: "
                 "every figure of a run with much steal is slowed)"))
        print(f"bullmq-compat and the floor: busy-poll budget {machine['busy_poll_us']} µs "
              "(BULLMQ_COMPAT_BUSY_POLL_US; 0: off)")
        if peer_models:
            print("other Python queues: " + ", ".join(i.label for i in impls if i.key in PEER_IMPLS)
                  + " (each in bench-results/.venv-<name>; worker models in the worker rows; a worker in processes "
                  "of its own is started inside the timed section and its CPU counted as client CPU)")
        for note_key, why in skipped.items():
            print(f"skipped {note_key}: {why}")
        for m in plan:
            print()
            print(render_table(m, [peer_view(i, m) for i in impls], summary[m.key], cells[m.key],
                               not_on_pg if m.backend == "postgres" else None))
            absent = [f"{PEER_NAMES[k]}: {PEER_NO_BULK[k]}" for k in PEER_NO_BULK if k in {i.key for i in impls}]
            if absent and m.key == "add-bulk":
                print("   -- (no row): " + "; ".join(absent))
            ratio = baseline_ratio(m, summary)
            if ratio is not None:
                print(f"   {m.only} here vs its own {m.baseline} run: {ratio:.2f}x")
            paired = summary[m.key].get(m.only or "", {}) or {}
            if "steadyJobsPerSec" in paired and m.group_rate:
                st, share = paired["steadyJobsPerSec"], paired["rateCeilingShare"]
                ceiling = m.groups * m.group_rate[0] * 1000 / m.group_rate[1]
                print(f"   rate-limited groups: the run took median {share['median'] * 100:.0f}% "
                      f"[{share['min'] * 100:.0f}-{share['max'] * 100:.0f}] of the shortest the limits allow "
                      f"(limit seconds / seconds); after the first window (its {m.groups * m.group_rate[0]:,} jobs) "
                      f"median {st['median']:,.0f} jobs/s [{st['min']:,.0f}-{st['max']:,.0f}], against the limits' "
                      f"{ceiling:,.0f} jobs/s ({m.groups:,} groups x {m.group_rate[0]} per {m.group_rate[1]} ms)")
            if "pairedRatio" in paired:
                p = paired["pairedRatio"]
                twin_name = (f"a {m.twin_label}" if m.twin_label else
                             "a concurrency-100 twin (no batches)" if m.batch_size else "an ungrouped twin")
                c = paired["pairedCpuRatio"]
                print(f"   paired: each round's run vs {twin_name} run just before or after it: jobs/s "
                      f"median {p['median']:.2f}x [{p['min']:.2f}-{p['max']:.2f}], client CPU per job "
                      f"median {c['median']:.2f}x [{c['min']:.2f}-{c['max']:.2f}] (twin "
                      f"{paired['pairedBaselineCpuUsPerJob']['median']:.1f} us/job)")
        lines_vs_peers = peer_lines(plan, impls, summary)
        if lines_vs_peers:
            print()
            print("\n".join(lines_vs_peers))
        note = postgres_note(plan, summary, machine, cells)
        if note:
            print()
            print("\n".join(note))

        failed = any(c.errors for per in cells.values() for c in per.values())
        if args.json:
            doc = {
                "machine": machine,
                "config": {"rounds": rounds, "quick": args.quick, "redis_port": server.port if server else None,
                           "postgres": bool(use_pg), "measurements": [m.__dict__ for m in plan]},
                "implementations": {i.key: {"label": i.label, "version": i.version} for i in impls},
                "skipped": skipped,
                "not_on_postgres": not_on_pg,
                "peers": {k: {"version": i.version, "models": v, "bulk": PEER_BULK.get(k) or PEER_NO_BULK.get(k)}
                          for k, v in peer_models.items() for i in impls if i.key == k},
                "vs_peers": lines_vs_peers,
                "summary": summary,
                "runs": {m.key: {k: {"runs": c.runs, "errors": c.errors} for k, c in cells[m.key].items()}
                         for m in plan},
                "elapsed_seconds": elapsed,
            }
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"\nwrote {args.json}")
        if args.check:
            misses = check_targets(plan, summary, cells, impls)
            print()
            if misses:
                print("--check: targets missed:")
                print("\n".join(f"  {line}" for line in misses))
                return 1
            print("--check: every row with a target meets it")
        return 1 if failed else 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
