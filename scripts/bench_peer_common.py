"""What the runners of the other Python queues (scripts/bench_peer_*.py) share: the runner protocol of
scripts/bench_compat.py for libraries that are not BullMQ clients.

Each runner is started by scripts/bench.py as ``<its venv's python> scripts/bench_peer_<lib>.py '<json>'``
with the JSON of bench_compat.py ({redis, queue, op, jobs, concurrency, batch, interval}) and prints one
line of JSON {seconds, jobs, cpuUserMs, cpuSysMs, redisCommandstats, redisCpuBefore, redisCpuAfter,
latenciesMs?, version, model}. Only this file and the library's own client are imported: the runner
runs in the library's venv, which has nothing of this project.

Method, as for the BullMQ runners: wall time (perf_counter) and CPU (user+sys) of the timed section
only; CONFIG RESETSTAT and INFO cpu right before it, INFO cpu and commandstats right after it. A
worker that runs in processes of its own (RQ, Celery, Dramatiq: their documented way of running
one) is started inside the timed section, so its start-up counts, and its CPU is added to the
runner's: the utime+stime of the worker's process tree read from /proc (children it reaped
included), at the end of the timed section less at its start.

Completion: the task of an out-of-process worker does INCRBY on a counter key (one Redis command
per job, the only work of the "no-op" task); the runner polls it (GETRANGE, every 2 ms) until it
reaches the job count. Latency: the task gets its enqueue time (time.time() just before the
library's enqueue call) as an argument and APPENDs "now - that," to a key that the runner reads.
These harness commands (INCRBY, APPEND, GETRANGE) are left out of the Redis command time
(scripts/bench.py), not out of Redis CPU.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

COUNTER_KEY = "bench-peer:done"
LATENCY_KEY = "bench-peer:latency"
POLL_S = 0.002
SCRIPTS = os.path.dirname(os.path.abspath(__file__))
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def now_ms() -> float:
    return time.time() * 1000.0


class Resp:
    """A few RESP commands on a socket of its own (the harness's: stats, polling), blocking."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def command(self, *args: Any) -> Any:
        parts = [str(a).encode() for a in args]
        self.sock.sendall(f"*{len(parts)}\r\n".encode() + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
        head = self.file.readline().rstrip(b"\r\n")
        kind, rest = head[:1], head[1:]
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2].decode()
        if kind == b"-":
            raise RuntimeError(f"Redis refused {args[0]}: {rest.decode()}")
        if kind == b":":
            return int(rest)
        return rest.decode()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Stats:
    def __init__(self, resp: Resp) -> None:
        self.resp = resp
        self.cpu_before = ""
        self.taken: Optional[dict[str, Any]] = None

    def reset(self) -> None:
        self.resp.command("CONFIG", "RESETSTAT")
        self.cpu_before = self.resp.command("INFO", "cpu")

    def take(self) -> None:
        """Right after the timed section (before the worker is stopped)."""
        self.taken = {"redisCpuBefore": self.cpu_before, "redisCpuAfter": self.resp.command("INFO", "cpu"),
                      "redisCommandstats": self.resp.command("INFO", "commandstats")}

    def read(self) -> dict[str, Any]:
        if self.taken is None:
            self.take()
        assert self.taken is not None
        return self.taken


def tree_cpu(root: Optional[int]) -> float:
    """CPU seconds (user+sys) of process ``root`` and all its live descendants, their reaped
    children included (cutime/cstime), from /proc; 0 without a root or off Linux."""
    if root is None:
        return 0.0
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pid = int(name)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    members, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in members:
                members.add(child)
                frontier.append(child)
    return sum(ticks.get(p, 0) for p in members) / CLK_TCK


class Meter:
    """The timed section: wall time, this process's CPU and that of the worker's process tree."""

    def __init__(self) -> None:
        self.t0 = self.t1 = 0.0
        self.ru0: Any = None
        self.ru1: Any = None
        self.worker_pid: Optional[int] = None
        self.w0 = self.w1 = 0.0

    def start(self, worker_pid: Optional[int] = None) -> None:
        self.worker_pid = worker_pid
        self.w0 = tree_cpu(worker_pid)
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.t1 = time.perf_counter()
        self.ru1 = resource.getrusage(resource.RUSAGE_SELF)
        self.w1 = tree_cpu(self.worker_pid)

    def result(self, jobs: int) -> dict[str, Any]:
        worker_ms = (self.w1 - self.w0) * 1000.0
        return {"seconds": self.t1 - self.t0, "jobs": jobs,
                # the worker's processes: /proc gives user+sys together, counted here as user
                "cpuUserMs": (self.ru1.ru_utime - self.ru0.ru_utime) * 1000.0 + worker_ms,
                "cpuSysMs": (self.ru1.ru_stime - self.ru0.ru_stime) * 1000.0,
                "workerCpuMs": worker_ms}


class WorkerProcess:
    """A worker run the library's documented way, in processes of its own."""

    def __init__(self, argv: list[str], env: dict[str, str], stop_signal: int = signal.SIGTERM) -> None:
        self.argv, self.env, self.stop_signal = argv, env, stop_signal
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.log = open(os.devnull, "wb") if os.environ.get("BENCH_PEER_QUIET", "1") == "1" else None

    def start(self) -> int:
        self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env, "PYTHONPATH": SCRIPTS}, cwd=SCRIPTS,
                                     stdout=self.log or sys.stderr, stderr=self.log or sys.stderr,
                                     start_new_session=True)
        return self.proc.pid

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.argv[:3]} exited with {self.proc.returncode}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        try:  # anything of its process group left behind (pool children)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.log is not None:
            self.log.close()


def wait_counter(resp: Resp, jobs: int, worker: Optional[WorkerProcess] = None, timeout: float = 1500) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = resp.command("GETRANGE", COUNTER_KEY, 0, -1)
        if value and int(value) >= jobs:
            return
        if worker is not None:
            worker.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {value or 0} of {jobs} jobs done after {timeout:.0f} s")
        time.sleep(POLL_S)


def wait_latencies(resp: Resp, jobs: int, worker: Optional[WorkerProcess] = None, timeout: float = 600) -> list[float]:
    deadline = time.monotonic() + timeout
    while True:
        text = resp.command("GETRANGE", LATENCY_KEY, 0, -1) or ""
        values = [float(x) for x in text.split(",") if x]
        if len(values) >= jobs:
            return values
        if worker is not None:
            worker.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(values)} of {jobs} latencies after {timeout:.0f} s")
        time.sleep(POLL_S)


def pace(jobs: int, interval_ms: float, send: Callable[[int], None]) -> None:
    """Call send(i) for i < jobs, ``interval_ms`` apart (from the first call)."""
    t0 = now_ms()
    for i in range(jobs):
        wait = t0 + i * interval_ms - now_ms()
        if wait > 0:
            time.sleep(wait / 1000.0)
        send(i)


def run(body: Callable[[dict[str, Any], Resp, Stats, Meter], dict[str, Any]]) -> None:
    """Entry point: argv[1] is the JSON of the run; ``body`` does the op and returns extra fields."""
    args = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    try:
        resp = Resp(args["redis"])
        stats, meter = Stats(resp), Meter()
        extra = body(args, resp, stats, meter)
        out = {**meter.result(args["jobs"]), **extra, **stats.read()}
        resp.close()
    except BaseException:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


class SyncLib:
    """What the generic driver needs from a library with a blocking client (RQ, Celery, Dramatiq)."""

    version = ""
    has_bulk = False

    def enqueue(self, i: int) -> None: ...
    def enqueue_latency(self, i: int, enqueued_ms: float) -> None: ...
    def enqueue_bulk(self, start: int, end: int) -> None: ...
    def worker(self, concurrency: int) -> WorkerProcess: ...
    def model(self, concurrency: int) -> str: ...

    def preload(self, jobs: int, batch: int) -> None:
        """Untimed: the library's bulk enqueue where it has one, else one at a time."""
        if self.has_bulk:
            for start in range(0, jobs, batch):
                self.enqueue_bulk(start, min(start + batch, jobs))
        else:
            for i in range(jobs):
                self.enqueue(i)

    def close(self) -> None: ...


def drive(make_lib: Callable[[dict[str, Any]], SyncLib]) -> None:
    """The four measurements for a SyncLib (see the module docstring)."""

    def body(args: dict[str, Any], resp: Resp, stats: Stats, meter: Meter) -> dict[str, Any]:
        resp.command("DEL", COUNTER_KEY, LATENCY_KEY)  # (scripts/bench.py flushes Redis before each run anyway)
        lib = make_lib(args)
        jobs, op, concurrency = args["jobs"], args["op"], args.get("concurrency") or 1
        extra: dict[str, Any] = {"version": lib.version}
        if op == "add":
            stats.reset()
            meter.start()
            for i in range(jobs):
                lib.enqueue(i)
            meter.stop()
            stats.take()
        elif op == "addBulk":
            if not lib.has_bulk:
                raise RuntimeError("this library has no bulk enqueue")
            stats.reset()
            meter.start()
            lib.preload(jobs, args.get("batch") or 1000)
            meter.stop()
            stats.take()
        elif op == "process":
            lib.preload(jobs, args.get("batch") or 1000)
            worker = lib.worker(concurrency)
            extra["model"] = lib.model(concurrency)
            stats.reset()
            try:
                meter.start()
                meter.worker_pid = worker.start()  # its CPU from its very start: all of it is timed
                wait_counter(resp, jobs, worker)
                meter.stop()
                stats.take()
            finally:
                worker.stop()
        elif op == "latency":
            worker = lib.worker(concurrency)
            extra["model"] = lib.model(concurrency)
            try:
                pid = worker.start()
                # readiness (untimed): one job through the idle worker, then it is idle again
                lib.enqueue(-1)
                wait_counter(resp, 1, worker, timeout=120)
                time.sleep(0.3)
                stats.reset()
                meter.start(pid)
                pace(jobs, args.get("interval", 20), lambda i: lib.enqueue_latency(i, now_ms()))
                extra["latenciesMs"] = wait_latencies(resp, jobs, worker)[:jobs]
                meter.stop()
                stats.take()
            finally:
                worker.stop()
        else:
            raise ValueError(f"unknown op {op!r}")
        lib.close()
        return extra

    run(body)
