"""Worker start-up benchmark (issue #32): how long a fresh Python process takes from its start to its
first job done, and where that time goes.

    .venv/bin/python scripts/bench_startup.py [--runs 10] [--python PATH] [--json out.json]

Each run: one job is added to a fresh queue on a redis-server of this script's own (a free loopback
port, tests._redis_server), then a new process of this venv's Python runs the child below, timed by
the parent from spawn to exit:

    t0; import asyncio; from bullmq_compat import Worker          -> "import"
    Worker(queue, processor, connection=url, autorun=False)        -> "Worker()"
    asyncio.ensure_future(worker.run()) ... processor called       -> "first job" (connect, scripts,
                                                                      the blocking fetch)
    await worker.close()                                           -> "close"

The child runs with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed; one warm-up run
writes the caches first), as an installed wheel runs: pip compiles a wheel's modules when it
installs it. The interpreter's own start (``python -c pass``) and the import of redis-py alone
(``python -c "import redis.asyncio"``) are timed the same way, for scale, and so are the imports
of the other Python queues' worker modules where scripts/bench.py made their venvs
(bench-results/.venv-<name>: arq, RQ, Celery, Dramatiq); a missing venv is skipped with a note.

--python: the interpreter of the measured processes (default: this one). The project's venv holds the
test and benchmark tools too, opentelemetry-sdk among them, which redis-py imports when it is
installed (about 50 ms); a venv with the runtime dependencies alone (``python -m venv V &&
V/bin/pip install -e .``) measures what a user's worker starts with.

Prints medians over the runs (ms) and the ten packages with the most import time
(``python -X importtime``, self time summed per top-level package).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import time
t0 = time.perf_counter()
import asyncio, json, sys
from bullmq_compat import Worker
t_import = time.perf_counter()

async def main():
    done = asyncio.Event()
    t = {}
    async def processor(job):
        t.setdefault("first", time.perf_counter())
        done.set()
    worker = Worker(sys.argv[2], processor, connection=sys.argv[1], autorun=False)
    t["ctor"] = time.perf_counter()
    run = asyncio.ensure_future(worker.run())
    await asyncio.wait_for(done.wait(), 60)
    await worker.close()
    await run
    t["closed"] = time.perf_counter()
    print(json.dumps({"import": t_import - t0, "ctor": t["ctor"] - t_import, "first": t["first"] - t["ctor"],
                      "close": t["closed"] - t["first"]}))

asyncio.run(main())
"""

ADD = r"""
import asyncio, sys
from bullmq_compat import Queue

async def main():
    queue = Queue(sys.argv[2], connection=sys.argv[1])
    await queue.add("start-up", {})
    await queue.close()

asyncio.run(main())
"""

#: the worker modules a peer's worker process imports first
PEER_IMPORTS = {
    "arq": "import arq.worker",
    "rq": "import rq, rq.worker",
    "celery": "import celery, celery.worker, kombu.transport.redis",
    "dramatiq": "import dramatiq, dramatiq.brokers.redis, dramatiq.worker",
}


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def wall(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]}: exit {done.returncode}: {done.stderr.strip()[-1500:]}")
    return seconds, done.stdout


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def import_profile(python: str, code: str) -> list[tuple[str, float]]:
    done = subprocess.run([python, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=120)
    per: collections.Counter[str] = collections.Counter()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line.split(":", 1)[1].split("|")
        module = name.strip()
        top = ".".join(module.split(".")[:2]) if module.startswith("bullmq_compat.") else module.split(".")[0]
        per[top] += int(self_us)
    return [(name, us / 1000) for name, us in per.most_common(10)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per row (10)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter measured (this one)")
    parser.add_argument("--json", help="write the figures here too")
    opts = parser.parse_args()
    if opts.runs < 1:
        parser.error("--runs must be at least 1")

    from tests._redis_server import RedisServer

    python = opts.python
    server = RedisServer().start()
    rows: dict[str, Any] = {}
    try:
        url = server.url
        parts: dict[str, list[float]] = {"import": [], "ctor": [], "first": [], "close": []}
        totals: list[float] = []
        for i in range(opts.runs + 1):  # the first one writes the bytecode caches: not counted
            queue = f"startup-{uuid.uuid4().hex[:8]}"
            wall([python, "-c", ADD, url, queue])
            seconds, out = wall([python, "-c", CHILD, url, queue])
            if i == 0:
                continue
            figures = json.loads(out.strip().splitlines()[-1])
            totals.append(seconds)
            for key in parts:
                parts[key].append(figures[key])
        rows["bullmq-compat Worker: process start to first job done, and exit"] = median_ms(totals)
        for key, label in (("import", "  import bullmq_compat (asyncio, redis-py, ...)"),
                           ("ctor", "  Worker(...)"), ("first", "  run() to the first job's processor"),
                           ("close", "  close()")):
            rows[label] = median_ms(parts[key])
        for label, code in (("python -c pass (the interpreter alone)", "pass"),
                            ('python -c "import redis.asyncio"', "import redis.asyncio")):
            rows[label] = median_ms([wall([python, "-c", code])[0] for _ in range(opts.runs)])
        notes = []
        for key, code in PEER_IMPORTS.items():
            peer = ROOT / "bench-results" / f".venv-{key}" / "bin" / "python"
            if not peer.exists():
                notes.append(f"{key}: no bench-results/.venv-{key} (make bench creates it)")
                continue
            wall([str(peer), "-c", code])  # caches
            rows[f"{key}: python -c {code!r}"] = median_ms([wall([str(peer), "-c", code])[0]
                                                           for _ in range(opts.runs)])
        profile = import_profile(python, "import bullmq_compat")
    finally:
        server.stop()

    print(f"Worker start-up, median of {opts.runs} fresh processes each (ms); {python}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n| what | ms |\n|---|---|")
    for label, ms in rows.items():
        print(f"| {label} | {ms:,.0f} |")
    for note in notes:
        print(f"(skipped {note})")
    print("\nimport bullmq_compat, self time per package (python -X importtime, one run): "
          + ", ".join(f"{name} {ms:.0f}" for name, ms in profile))
    if opts.json:
        Path(opts.json).write_text(json.dumps({"rows": rows, "importProfile": profile}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
