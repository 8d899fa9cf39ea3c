"""The `bullmq-compat` command line (also `python -m bullmq_compat`).

Errors print one line saying what to do, never a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from bullmq_compat._errors import BullMQCompatError, GroupsNotInstalled, InvalidArgument
from bullmq_compat._secrets import redact_url, scrub, secrets_of

DEFAULT_REDIS = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
REPO_ROOT = Path(__file__).resolve().parent.parent


class CliError(BullMQCompatError):
    pass


class Progress:
    """A one-line progress bar on stderr for long operations (only on a terminal)."""

    def __init__(self, total: Optional[int], label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self.enabled = sys.stderr.isatty()

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.total:
            width = 30
            filled = int(width * min(self.done, self.total) / self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{' ' * (width - filled)}] {self.done}/{self.total}")
        else:
            sys.stderr.write(f"\r{self.label} {self.done}")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _json_arg(text: Optional[str], what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as err:
        raise CliError(f"--{what} is not valid JSON ({err}): pass e.g. --{what} '{{\"key\": 1}}'") from None


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _connection(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The connection URL and its keyword options: ``--postgres URL --schema S``, else ``--redis``."""
    if getattr(args, "postgres", None):
        return args.postgres, {"schema": args.schema}
    return args.redis, {"prefix": args.prefix}


def _where(args: argparse.Namespace) -> str:
    from bullmq_compat._secrets import redact_url

    url, _ = _connection(args)
    return redact_url(url) + (f" (schema {args.schema})" if getattr(args, "postgres", None) else "")


def _queue(args: argparse.Namespace, name: str) -> Any:
    from bullmq_compat._queue import Queue

    url, options = _connection(args)
    return Queue(name, url, **options)


async def _discover_queues(args: argparse.Namespace) -> list[str]:
    if getattr(args, "postgres", None):
        from bullmq_compat._backends.postgres.backend import discover_queues as discover_on_postgres

        return await discover_on_postgres(args.postgres, args.schema)
    from bullmq_compat._backends.redis.backend import discover_queues

    return await discover_queues(args.redis, args.prefix)


async def cmd_info(args: argparse.Namespace) -> int:
    queues = args.queue or await _discover_queues(args)
    if not queues:
        print(f"no queues {'' if getattr(args, 'postgres', None) else f'under prefix {args.prefix!r} '}"
              f"at {_where(args)}")
        return 0
    for name in queues:
        queue = _queue(args, name)
        try:
            counts = await queue.get_job_counts()
            paused = await queue.is_paused()
            print(f"queue {name}{' (paused)' if paused else ''}")
            print(_table([[state, n] for state, n in counts.items()], ["state", "jobs"]))
            try:
                groups = await queue.get_groups()
            except GroupsNotInstalled:  # a PostgreSQL schema without our group objects: no groups
                groups = []
            if groups:
                print()
                print(_table([[g["id"], g["waiting"], g["running"], "yes" if g["paused"] else "", g["concurrency"]]
                              for g in groups], ["group", "waiting", "running", "paused", "concurrency"]))
            workers = await queue.get_workers()
            print()
            print(_table([[w.get("rawname", ""), w.get("addr", ""), w.get("age", "")] for w in workers],
                         ["worker", "address", "age (s)"]) if workers else "workers: none connected")
            get_schedulers = getattr(queue, "get_job_schedulers", None)
            if get_schedulers is not None:
                schedulers = await get_schedulers()
                if schedulers:
                    print()
                    print(_table([[s.get("key", s.get("id", "")), s.get("pattern") or s.get("every", ""),
                                   s.get("next", "")] for s in schedulers], ["scheduler", "every/pattern", "next"]))
            print()
        finally:
            await queue.close()
    return 0


async def cmd_add(args: argparse.Namespace) -> int:
    data = _json_arg(args.data, "data")
    opts = _json_arg(args.opts, "opts") or {}
    queue = _queue(args, args.queue)
    try:
        if args.count == 1:
            job = await queue.add(args.name, data, **opts)
            print(job.id)
            return 0
        progress = Progress(args.count, "adding")
        left = args.count
        while left > 0:
            batch = min(1000, left)
            await queue.add_bulk([{"name": args.name, "data": data, "opts": opts} for _ in range(batch)])
            left -= batch
            progress.advance(batch)
        progress.finish()
        print(f"added {args.count} jobs to {args.queue}")
        return 0
    finally:
        await queue.close()


async def cmd_retry_failed(args: argparse.Namespace) -> int:
    queue = _queue(args, args.queue)
    try:
        total = (await queue.get_job_counts("failed"))["failed"]
        progress = Progress(total, "retrying")
        await queue.retry_jobs(count=args.count, state="failed")
        progress.advance(total)
        progress.finish()
        print(f"moved {total} failed jobs of {args.queue} back to waiting")
        return 0
    finally:
        await queue.close()


async def cmd_clean(args: argparse.Namespace) -> int:
    queue = _queue(args, args.queue)
    try:
        total = (await queue.get_job_counts(args.state)).get(args.state, 0) if args.state != "paused" else None
        progress = Progress(min(total, args.limit) if total and args.limit else total, "cleaning")
        removed = 0
        while True:  # in batches, so the bar moves and no script runs for long
            batch = await queue.clean(args.grace, 1000 if not args.limit else min(1000, args.limit - removed),
                                      args.state)
            removed += len(batch)
            progress.advance(len(batch))
            if len(batch) < 1000 or (args.limit and removed >= args.limit):
                break
        progress.finish()
        print(f"removed {removed} {args.state} jobs from {args.queue}")
        return 0
    finally:
        await queue.close()


async def cmd_pause(args: argparse.Namespace) -> int:
    for name in args.queue:
        queue = _queue(args, name)
        try:
            await (queue.pause() if args.command == "pause" else queue.resume())
            print(f"{name}: {'paused' if args.command == 'pause' else 'resumed'}")
        finally:
            await queue.close()
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from bullmq_compat._worker import Worker

    # as Celery and RQ: 'myapp.jobs:send' is found in the current directory (docs/cli.md) -- the
    # console script's sys.path[0] is its own bin/ folder, not the directory it is run from
    cwd = os.getcwd()
    if sys.path[:1] not in ([cwd], [""]):
        sys.path.insert(0, cwd)
    url, options = _connection(args)
    if args.metrics_port is not None:  # before the worker, so it shares this server (on --metrics-host)
        from bullmq_compat._prometheus import serve_worker_metrics

        serve_worker_metrics(args.metrics_port, args.metrics_host)
    batch: Optional[dict[str, Any]] = None
    if args.batch is not None:
        batch = {"size": args.batch, "min_size": args.batch_min_size or 1, "timeout": args.batch_timeout or 0,
                 "group_affinity": args.group_affinity}
        if args.batch_max_bytes is not None:
            batch["max_bytes"] = args.batch_max_bytes
    elif any(v for v in (args.batch_min_size, args.batch_timeout, args.batch_max_bytes, args.group_affinity)):
        raise InvalidArgument("--batch-min-size, --batch-timeout, --batch-max-bytes and --group-affinity "
                              "need --batch SIZE")
    worker = Worker(args.queue, args.processor, url, concurrency=args.concurrency,
                    name=args.name, use_processes=args.processes, batch=batch,
                    metrics_port=args.metrics_port, **options)
    what = f"batches of up to {args.batch}, " if batch else ""
    print(f"worker {args.name or worker.id} processing {args.queue} with {args.processor} "
          f"({what}concurrency {args.concurrency}); SIGTERM or Ctrl-C stops it gracefully", flush=True)
    await worker.run()
    return 0


async def cmd_keeper(args: argparse.Namespace) -> int:
    from bullmq_compat._groups import GroupKeeper

    keepers = [GroupKeeper(q, args.redis, prefix=args.prefix, sweep_interval=args.sweep_interval)
               for q in args.queue]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [keeper.start() for keeper in keepers]
    print(f"keeper running for {', '.join(args.queue)} on {redact_url(args.redis)}", flush=True)
    await stop.wait()
    for keeper in keepers:
        await keeper.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    return 0


async def cmd_metrics(args: argparse.Namespace) -> int:
    """Serve /metrics for Prometheus: each queue read at every scrape (see _prometheus)."""
    from bullmq_compat._prometheus import QueueCollector, QueueMetricsServer, QueueReader, check_port

    if bool(args.queue) == bool(args.all_queues):
        raise CliError("metrics needs the queues: --queue NAME (repeatable) or --all-queues (found at each scrape)")
    check_port("--port", args.port)
    if args.timeout <= 0:
        raise CliError(f"--timeout {args.timeout:g} must be a number of seconds > 0")
    if args.discovery_interval < 0:
        raise CliError(f"--discovery-interval {args.discovery_interval:g} must be a number of seconds >= 0")
    secrets = secrets_of([args.redis, args.postgres or ""])
    reader = QueueReader(lambda name: _queue(args, name), names=args.queue,
                         discover=None if args.queue else lambda: _discover_queues(args),
                         describe_error=lambda err: scrub(f"{type(err).__name__}: {err}", secrets),
                         discovery_interval=args.discovery_interval)
    server = QueueMetricsServer(QueueCollector(reader, asyncio.get_running_loop(), timeout=args.timeout))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = server.start(args.port, args.host)
    which = "all queues (found at each scrape)" if args.all_queues else ", ".join(args.queue)
    print(f"serving Prometheus metrics of {which} at {_where(args)} on http://{args.host}:{port}/metrics",
          flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await reader.close()
    return 0


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def board_argv(args: argparse.Namespace, node: str = "node", script: Optional[Path] = None) -> list[str]:
    """board.js's command line: the Redis URL is not on it (the process list would show its
    password to every local user) but in the environment, see `cmd_board`."""
    if script is None:
        from bullmq_compat._board_node import PACKAGED

        script = PACKAGED / "board.js"
    where = ["--schema", args.schema] if getattr(args, "postgres", None) else ["--prefix", args.prefix]
    argv = [node, str(script), "--port", str(args.port), *where, "--host", args.host]
    if args.read_only:
        argv += ["--read-only", "true"]
    for name in args.queue:
        argv += ["--queue", name]
    return argv


def _board_started_line(args: argparse.Namespace, line: bytes) -> str:
    """board.js's {"listening": url, "readOnly": bool} line, for a person."""
    try:
        ready = json.loads(line)
        url, read_only = str(ready["listening"]), bool(ready.get("readOnly"))
    except (ValueError, TypeError, KeyError):
        return line.decode(errors="replace").rstrip("\n")
    which = f"queue{'s' if len(args.queue) > 1 else ''} {', '.join(args.queue)}"
    return f"Bull-Board for {which} on {_where(args)} at {url}{' (read-only)' if read_only else ''}; Ctrl-C to stop"


def cmd_board(args: argparse.Namespace) -> int:
    from bullmq_compat import _board_node

    if args.install:
        # with --json stdout is for the board's JSON line only: the steps (and npm's output) go to stderr
        out = sys.stderr if args.json else sys.stdout
        out.flush()
        _board_node.install(lambda text: print(text, file=out, flush=True),
                            npm_stdout=sys.stderr if args.json else None, then_start=bool(args.queue))
        if not args.queue:
            return 0
    elif not args.queue:
        raise CliError("board needs --queue NAME (repeat it for more queues), or --install to install Bull-Board")
    node = _board_node.node_binary()
    project = _board_node.resolve()
    if args.host not in LOOPBACK_HOSTS:
        print(f"bullmq-compat: warning: Bull-Board is bound to {args.host}, beyond loopback: anyone who can reach "
              f"port {args.port} there can see job data{'' if args.read_only else ' and retry, promote, clean or remove jobs'}"
              " without logging in. Put it behind an authenticating proxy"
              f"{'' if args.read_only else ', or pass --read-only'}.", file=sys.stderr, flush=True)
    url_variable = "BULLMQ_COMPAT_POSTGRES_URL" if getattr(args, "postgres", None) else "BULLMQ_COMPAT_REDIS_URL"
    env = {**os.environ, **project.env, url_variable: args.postgres or args.redis}
    proc = subprocess.Popen(board_argv(args, node, project.script), env=env, stdout=subprocess.PIPE)
    # SIGTERM to us stops the board too (it is our child: it must not outlive us)
    previous = {sig: signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # {"listening": ...} once it serves; nothing if it failed to start
        if line:
            print(line.decode(errors="replace").rstrip("\n") if args.json else _board_started_line(args, line),
                  flush=True)
            shutil.copyfileobj(proc.stdout, sys.stdout.buffer)  # anything else it prints, as it is
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def cmd_migrate(args: argparse.Namespace) -> int:
    """Node's runMigrations on ``--postgres URL --schema S``: prints the schema version."""
    from bullmq_compat import migrate_postgres

    if not args.postgres:
        raise CliError("migrate needs --postgres URL (and --schema, default bullmq)")
    if args.groups and args.drop_groups:
        raise CliError("--groups installs the group objects and --drop-groups removes them: give one")
    if args.drop_groups:
        from bullmq_compat._backends.postgres.migrator import drop_postgres_groups

        released = await drop_postgres_groups(args.postgres, schema=args.schema)
        print(f"schema {args.schema} at {_where(args)}: bullmq-compat's group objects removed "
              f"({released} held group jobs released to wait)")
        return 0
    version = await migrate_postgres(args.postgres, schema=args.schema, groups=args.groups)
    extra = " with bullmq-compat's group objects" if args.groups else ""
    print(f"schema {args.schema} at {_where(args)} is at version {version}{extra}")
    return 0


def _relay(args: argparse.Namespace) -> Any:
    from bullmq_compat._relay import Relay

    url, options = _connection(args)
    return Relay(url, namespace=args.namespace, name="bullmq-compat cli", **options)


async def cmd_relay_publish(args: argparse.Namespace) -> int:
    """Publish one message: prints Node's publish result ``{"mid", "nodes", "endpoints"}``."""
    try:
        data = json.loads(args.data)
    except ValueError as err:
        raise CliError(f"the message is not valid JSON ({err}): pass e.g. '{{\"key\": 1}}'") from None
    if args.retain < 0:
        raise CliError(f"--retain {args.retain}: a number of ms >= 0")
    async with _relay(args) as relay:
        print(json.dumps(await relay.publish(args.topic, data, retain=args.retain)))
    return 0


async def cmd_relay_subscribe(args: argparse.Namespace) -> int:
    """Print one JSON line per message on ``pattern`` until interrupted (Ctrl-C, SIGTERM)."""
    def show(message: Any) -> None:
        print(json.dumps({"topic": message.topic, "data": message.data, "mid": message.mid, "ts": message.ts,
                          "retained": message.retained}), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with _relay(args) as relay:
        relay.on("error", lambda err: print(f"bullmq-compat: relay error: {_shown(err, args)}", file=sys.stderr))
        await relay.subscribe(args.pattern, show)
        print(f"subscribed to {args.pattern!r} in namespace {args.namespace!r} at {_where(args)} "
              f"as node {relay.node_id}", file=sys.stderr, flush=True)
        await stop.wait()
    return 0


async def cmd_relay_nodes(args: argparse.Namespace) -> int:
    """The namespace's nodes (this command's own node left out) and its totals."""
    async with _relay(args) as relay:
        nodes = [n for n in await relay.get_nodes() if n["id"] != relay.node_id]
        counts = await relay.get_counts()
    if args.json:
        print(json.dumps({"nodes": nodes, "counts": {**counts, "nodes": counts["nodes"] - 1}}))
        return 0
    if not nodes:
        print(f"no relay nodes in namespace {args.namespace!r} at {_where(args)}")
        return 0
    print(_table([[n["id"], n["info"].get("name", ""), n["info"].get("host", ""), n["info"].get("pid", ""),
                   n["subscriptions"], n["backlog"], n["dropped"]] for n in nodes],
                 ["node", "name", "host", "pid", "subscriptions", "backlog", "dropped"]))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    script = REPO_ROOT / "scripts" / "bench.py"
    if not script.exists():
        raise CliError("the benchmark lives in the repository (scripts/bench.py): run it from a clone")
    return subprocess.call([sys.executable, str(script), *args.rest])


def cmd_lua(args: argparse.Namespace) -> int:
    """Print one of our built Lua scripts (for Node producers of group jobs, see interop/groups.js)."""
    from bullmq_compat._backends.redis.lua import OWN_LUA_DIR, own_script

    matches = sorted(OWN_LUA_DIR.glob(f"{args.name}-*.lua"))
    if not matches:
        names = ", ".join(p.stem.rsplit("-", 1)[0] for p in sorted(OWN_LUA_DIR.glob("*-*.lua")))
        raise CliError(f"no script named {args.name!r}; ours are: {names}")
    sys.stdout.write(own_script(matches[0].name).lua)
    return 0


def version_line() -> str:
    """``bullmq-compat 0.1.0 (upstream bullmq 6.7.0)``: what ``--version`` prints."""
    from bullmq_compat._version import __version__
    from bullmq_compat._wire.upstream import UPSTREAM_PACKAGE, UPSTREAM_VERSION

    return f"bullmq-compat {__version__} (upstream {UPSTREAM_PACKAGE} {UPSTREAM_VERSION})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bullmq-compat", description="Node BullMQ-compatible queues from Python")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print our version and the upstream BullMQ it pins, then exit")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--redis", default=DEFAULT_REDIS,
                        help=f"Redis URL, rediss:// for TLS (default {redact_url(DEFAULT_REDIS)}, or $REDIS_URL)")
    common.add_argument("--prefix", default="bull", help="key prefix (default bull)")
    common.add_argument("--postgres", default=None, nargs="?", const=os.environ.get("POSTGRES_URL") or "",
                        help="a postgresql:// URL: the queues are on PostgreSQL (Node BullMQ's backend), not Redis; "
                             "--postgres alone takes $POSTGRES_URL")
    common.add_argument("--schema", default="bullmq", help="the PostgreSQL schema of the queues (default bullmq)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("worker", parents=[common], help="run a worker: bullmq-compat worker pkg.mod:fn --queue Q")
    p.add_argument("processor", help="the processor, as package.module:function")
    p.add_argument("--queue", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--name", default=None, help="worker name (shown in Bull-Board)")
    p.add_argument("--processes", action="store_true", help="run the processor in child processes")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus job metrics (duration histogram, counters) on this port (docs/metrics.md)")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address of --metrics-port (default 0.0.0.0)")
    p.add_argument("--batch", type=int, default=None, metavar="SIZE",
                   help="call the processor with up to SIZE jobs at a time (job.get_batch())")
    p.add_argument("--batch-min-size", type=int, default=None, metavar="N", help="wait for at least N jobs")
    p.add_argument("--batch-timeout", type=int, default=None, metavar="MS", help="... at most MS ms")
    p.add_argument("--batch-max-bytes", type=int, default=None, metavar="BYTES",
                   help="cap a batch by the size of its jobs' data")
    p.add_argument("--group-affinity", action="store_true", help="fill a group job's batch from its group")
    p.set_defaults(run=cmd_worker)

    p = sub.add_parser("metrics", parents=[common], help="serve /metrics for Prometheus: counts, totals, workers, "
                                                          "oldest waiting per queue (needs the metrics extra)")
    p.add_argument("--queue", action="append", help="a queue to export (repeatable)")
    p.add_argument("--all-queues", action="store_true", help="every queue, found again at each scrape")
    p.add_argument("--port", type=int, default=9464, help="port of /metrics (default 9464; 0: any free port)")
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--discovery-interval", type=float, default=0.0,
                   help="with --all-queues: seconds between two searches for queues (default 0: at every scrape)")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds a scrape waits for the reads; past it bullmq_up is 0 (default 5)")
    p.set_defaults(run=cmd_metrics)

    p = sub.add_parser("info", parents=[common], help="counts, groups, workers and schedulers per queue")
    p.add_argument("--queue", action="append")
    p.set_defaults(run=cmd_info)

    p = sub.add_parser("add", parents=[common], help="add jobs: --queue Q --name N --data JSON [--count N]")
    p.add_argument("--queue", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--data", default=None)
    p.add_argument("--opts", default=None, help="job options as JSON, Python or Node names")
    p.add_argument("--count", type=int, default=1)
    p.set_defaults(run=cmd_add)

    p = sub.add_parser("retry-failed", parents=[common], help="move failed jobs back to waiting")
    p.add_argument("--queue", required=True)
    p.add_argument("--count", type=int, default=1000, help="jobs per script call")
    p.set_defaults(run=cmd_retry_failed)

    p = sub.add_parser("clean", parents=[common], help="remove old jobs of one state")
    p.add_argument("--queue", required=True)
    p.add_argument("--state", default="completed")
    p.add_argument("--grace", type=int, default=0, help="keep jobs younger than this many ms")
    p.add_argument("--limit", type=int, default=0, help="at most this many (0 = all)")
    p.set_defaults(run=cmd_clean)

    for name in ("pause", "resume"):
        p = sub.add_parser(name, parents=[common], help=f"{name} queues for every worker")
        p.add_argument("--queue", action="append", required=True)
        p.set_defaults(run=cmd_pause)

    p = sub.add_parser("keeper", parents=[common], help="release groups whose jobs Node workers finished")
    p.add_argument("--queue", action="append", required=True)
    p.add_argument("--sweep-interval", type=float, default=5.0, help="seconds between sweeps")
    p.set_defaults(run=cmd_keeper)

    p = sub.add_parser("board", parents=[common], help="serve Bull-Board for queues (needs Node.js 20+)",
                       epilog="Bull-Board runs on Node.js: from an installed package run 'bullmq-compat board "
                              "--install' once (npm ci into ~/.cache/bullmq-compat, or $BULLMQ_COMPAT_BOARD_DIR)")
    p.add_argument("--queue", action="append", default=[], help="a queue to show (repeat for more)")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; anything else prints a warning)")
    p.add_argument("--read-only", action="store_true",
                   help="Bull-Board's read-only mode: no retry, promote, clean or remove buttons")
    p.add_argument("--install", action="store_true",
                   help="install Bull-Board's Node modules (npm ci) into the per-user cache first; "
                        "without --queue it then exits")
    p.add_argument("--json", action="store_true",
                   help='print the start-up line as JSON: {"listening": URL, "readOnly": BOOL}')
    p.set_defaults(run=cmd_board)

    p = sub.add_parser("migrate", parents=[common], help="create or upgrade a PostgreSQL schema (Node's migrations)")
    p.add_argument("--groups", action="store_true",
                   help="also install bullmq-compat's per-group gate (our own objects, beside Node's)")
    p.add_argument("--drop-groups", action="store_true",
                   help="remove bullmq-compat's group objects (held group jobs are released to wait)")
    p.set_defaults(run=cmd_migrate)

    relay_common = argparse.ArgumentParser(add_help=False, parents=[common])
    relay_common.add_argument("--namespace", default="default", help="the relay namespace (default default)")
    p = sub.add_parser("relay", help="the relay (BullMQ 6.7's fleet pub/sub): publish, subscribe, nodes")
    relay_sub = p.add_subparsers(dest="relay_command", required=True)
    p = relay_sub.add_parser("publish", parents=[relay_common], help="publish: relay publish TOPIC JSON [--retain MS]")
    p.add_argument("topic")
    p.add_argument("data", help="the message, as JSON")
    p.add_argument("--retain", type=int, default=0, help="keep it for new subscribers of the topic for MS ms")
    p.set_defaults(run=cmd_relay_publish)
    p = relay_sub.add_parser("subscribe", parents=[relay_common],
                             help="print one JSON line per message on PATTERN (* one segment, > the rest) until Ctrl-C")
    p.add_argument("pattern")
    p.set_defaults(run=cmd_relay_subscribe)
    p = relay_sub.add_parser("nodes", parents=[relay_common], help="the namespace's nodes")
    p.add_argument("--json", action="store_true", help="print them as JSON")
    p.set_defaults(run=cmd_relay_nodes)

    p = sub.add_parser("bench", help="the side-by-side benchmark (scripts/bench.py)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=cmd_bench)

    from bullmq_compat._wire import fetch

    p = sub.add_parser("fetch-upstream", help="fetch the pinned upstream BullMQ scripts and SQL (needs npm, or --tarball)")
    fetch.add_arguments(p)
    p.set_defaults(run=lambda args: fetch.run(args.tarball, args.into))

    p = sub.add_parser("lua", help="print one of our built Lua scripts (e.g. addGroupJob)")
    p.add_argument("name")
    p.set_defaults(run=cmd_lua)
    return parser


def _shown(err: BaseException, args: argparse.Namespace) -> str:
    """An error's text as the CLI prints it: the --redis and --postgres URLs' passwords never in it."""
    return scrub(str(err), secrets_of([getattr(args, "redis", ""), getattr(args, "postgres", None) or ""]))


def _postgres_errors() -> tuple[type[BaseException], ...]:
    """The PostgreSQL driver's base error (a refusal by the server), when the driver is installed."""
    from bullmq_compat._backends.postgres.driver import server_errors

    return server_errors()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # everything after 'bench' is the benchmark's own options
        try:
            return cmd_bench(argparse.Namespace(rest=argv[1:]))
        except BullMQCompatError as err:
            print(f"bullmq-compat: {err}", file=sys.stderr)
            return 2
    from bullmq_compat._backends.redis.backend import CONNECTION_ERRORS, REDIS_ERRORS

    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "postgres", None) == "":
            raise CliError("--postgres without a URL takes $POSTGRES_URL, which is not set: pass --postgres URL")
        result = args.run(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except BullMQCompatError as err:
        print(f"bullmq-compat: {_shown(err, args)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head and closed: not an error of ours
        return 0
    except CONNECTION_ERRORS as err:
        print(f"bullmq-compat: cannot reach Redis at {redact_url(getattr(args, 'redis', '?'))} "
              f"({_shown(err, args)}); check --redis and that redis-server is running", file=sys.stderr)
        return 2
    except REDIS_ERRORS as err:
        print(f"bullmq-compat: Redis refused the command: {_shown(err, args)}", file=sys.stderr)
        return 2
    except _postgres_errors() as err:  # the first line is the server's message; CONTEXT lines follow
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"bullmq-compat: PostgreSQL at {_where(args)} refused the command: "
              f"{scrub(first_line, secrets_of(getattr(args, 'postgres', None) or ''))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
