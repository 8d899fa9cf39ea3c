"""`make demo`: a Node producer, a Python worker and Bull-Board on http://127.0.0.1:3000.

``DEMO_BACKEND=redis`` (the default) uses the Redis at REDIS_URL, else 127.0.0.1:6379 when one
answers, else starts a redis-server of its own. ``DEMO_BACKEND=postgres`` uses the PostgreSQL at
POSTGRES_URL, else 127.0.0.1:5432 (user postgres, database test), in the schema DEMO_SCHEMA
(default ``bullmq_demo``, migrated as Node's runMigrations does). It stops with an error when the
board's port (DEMO_PORT, default 3000) is already taken. Ctrl-C stops everything it started.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
QUEUE = os.environ.get("DEMO_QUEUE", "demo")
PORT = int(os.environ.get("DEMO_PORT", "3000"))
BACKEND = os.environ.get("DEMO_BACKEND", "redis")
SCHEMA = os.environ.get("DEMO_SCHEMA", "bullmq_demo")
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def port_taken(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:``port`` (the board would not be ours)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_url(started: list[subprocess.Popen[bytes]]) -> str:
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    if _answers("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--dir", tempfile.mkdtemp(prefix="bullmq-demo-")],
                            stdout=subprocess.DEVNULL)
    started.append(proc)
    deadline = time.monotonic() + 10
    while not _answers("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise SystemExit("redis-server did not start")
        time.sleep(0.05)
    return f"redis://127.0.0.1:{port}/0"


async def process(job):
    """The demo's Python processor: sleeps a little, fails `failTimes` times, then succeeds."""
    await asyncio.sleep(job.data.get("ms", 200) / 1000)
    if job.attempts_made < job.data.get("failTimes", 0):
        raise RuntimeError(f"{job.name} failed on attempt {job.attempts_made + 1} (demo)")
    await job.log(f"processed by the Python worker for {job.name}")
    return {"done": job.name, "by": "python"}


def connection_args(url: str) -> dict[str, object]:
    """The interop scripts' connection fields (interop/backend.js) for the demo's datastore."""
    if BACKEND == "postgres":
        return {"postgres": url, "schema": SCHEMA, "migrate": True}
    return {"redis": url}


async def run_worker(url: str) -> None:
    from bullmq_compat import Queue, Worker

    pg = {"schema": SCHEMA} if BACKEND == "postgres" else {}
    queue = Queue(QUEUE, url, **pg)  # type: ignore[arg-type]
    await queue.obliterate(force=True)  # a fresh demo each run (only the demo queue)
    await queue.close()
    args = json.dumps({**connection_args(url), "queue": QUEUE})
    producer = await asyncio.create_subprocess_exec("node", str(ROOT / "interop" / "demo_producer.js"), args,
                                                    cwd=str(ROOT))
    if await producer.wait() != 0:
        raise SystemExit("the Node producer failed")
    worker = Worker(QUEUE, process, url, name="python-demo-worker", concurrency=4, **pg)  # type: ignore[arg-type]
    worker.on("completed", lambda job, result: print(f"  completed {job.name} #{job.id}"))
    worker.on("failed", lambda job, err: print(f"  failed    {job.name} #{job.id}: {err}"))
    await worker.run()


def postgres_url() -> str:
    url = os.environ.get("POSTGRES_URL", DEFAULT_POSTGRES)
    from bullmq_compat import migrate_postgres

    asyncio.run(migrate_postgres(url, schema=SCHEMA))
    return url


def main() -> int:
    from bullmq_compat._secrets import redact_url

    if BACKEND not in ("redis", "postgres"):
        print(f"DEMO_BACKEND={BACKEND!r} must be 'redis' or 'postgres'", file=sys.stderr)
        return 2
    if port_taken(PORT):
        print(f"port {PORT} on 127.0.0.1 is already in use, so Bull-Board cannot listen there: stop what "
              f"uses it or pick another port with DEMO_PORT=...", file=sys.stderr)
        return 2
    started: list[subprocess.Popen[bytes]] = []
    try:
        url = postgres_url() if BACKEND == "postgres" else redis_url(started)
        # the URL goes in the environment, not on the process list (its password would show there)
        variable = "BULLMQ_COMPAT_POSTGRES_URL" if BACKEND == "postgres" else "BULLMQ_COMPAT_REDIS_URL"
        where = ["--schema", SCHEMA] if BACKEND == "postgres" else []
        # the board ships in the package (bullmq_compat/_board/); its Node modules are interop's here
        board = subprocess.Popen(["node", str(ROOT / "bullmq_compat" / "_board" / "board.js"), *where, "--port",
                                  str(PORT), "--queue", QUEUE], cwd=ROOT, stdout=subprocess.PIPE,
                                 env={**os.environ, variable: url, "NODE_PATH": str(ROOT / "interop" / "node_modules")})
        started.append(board)
        line = board.stdout.readline() if board.stdout else b""  # {"listening": ...}
        if not line:
            print(f"Bull-Board did not start (exit {board.wait()}); see its output above", file=sys.stderr)
            return 2
        label = "PostgreSQL" if BACKEND == "postgres" else "Redis"
        print(f"{label + ':':<11} {redact_url(url)}" + (f" (schema {SCHEMA})" if BACKEND == "postgres" else ""))
        print(f"Bull-Board: http://127.0.0.1:{PORT}/  (queue {QUEUE!r}; Ctrl-C stops the demo)")
        asyncio.run(run_worker(url))
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in reversed(started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    sys.exit(main())
