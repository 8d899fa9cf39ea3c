"""Drive the Node.js BullMQ side of the interop tests (interop/cli.js, bullmq_compat/_board/board.js).

``await node(op, **args)`` runs one ``interop/cli.js`` command (in this test process's
``cli.js serve`` command server) and returns its JSON result;
``NodeProcess`` runs a long-lived script (the Bull-Board server, or a ``cli.js work`` worker)
in the background for the duration of an ``async with`` block.

Nothing here is tied to Redis: the args name the datastore. ``redis=url`` (and ``prefix``) for
Redis, or ``postgres=url, schema=name, migrate=True`` for Node's own PostgreSQL backend (see
interop/backend.js; tests/pg_node_helpers.py makes a fresh schema and drops it).

Tests that need Node never skip: when ``interop/node_modules`` is missing the driver raises
:class:`NodeNotInstalled`, which says to run ``make setup``.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
INTEROP = ROOT / "interop"
CLI = INTEROP / "cli.js"
# the board ships in the package; in a clone its Node modules are interop/node_modules (NODE_PATH)
BOARD = ROOT / "bullmq_compat" / "_board" / "board.js"

# Slack on top of a command's own time budget before we give up on the subprocess.
_SLACK_S = 30.0


class NodeError(RuntimeError):
    """A Node command failed: ``name`` is the JavaScript error's name, ``stderr`` its output."""

    def __init__(self, message: str, name: str | None = None, stderr: str = "") -> None:
        text = f"{name}: {message}" if name else message
        if stderr.strip():
            text = f"{text}\n--- node stderr ---\n{stderr.strip()}"
        super().__init__(text)
        self.message = message
        self.name = name
        self.stderr = stderr


class NodeNotInstalled(RuntimeError):
    """Node.js or interop/node_modules is missing."""


def node_available() -> bool:
    """True when ``node`` is on PATH and interop/node_modules holds bullmq."""
    return shutil.which("node") is not None and (INTEROP / "node_modules" / "bullmq").is_dir()


def _node_binary() -> str:
    binary = shutil.which("node")
    if binary is None:
        raise NodeNotInstalled("Node.js is not on PATH: install Node 20+, then run `make setup`")
    if not (INTEROP / "node_modules" / "bullmq").is_dir():
        raise NodeNotInstalled(
            f"{INTEROP / 'node_modules'} is missing: run `make setup` (or `cd interop && npm ci`)"
        )
    return binary


def _error_from(stdout: str, stderr: str, returncode: int | None) -> NodeError:
    """The NodeError for a failed run: cli.js's {"error", "name"} line if there is one."""
    for line in reversed(stdout.splitlines()):
        try:
            payload = json.loads(line)
        except ValueError:
            continue
        if isinstance(payload, dict) and "error" in payload:
            return NodeError(str(payload["error"]), payload.get("name"), stderr)
    return NodeError(f"node exited with status {returncode}; stdout: {stdout.strip()!r}", None, stderr)


def _last_json_line(stdout: str, stderr: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise NodeError("node printed no result", None, stderr)
    try:
        return json.loads(lines[-1])
    except ValueError as exc:
        raise NodeError(f"node printed a line that is not JSON: {lines[-1]!r}", None, stderr) from exc


async def run_node(argv: Sequence[str], *, label: str, budget: float, stdin: bytes | None = None) -> Any:
    """Run ``node <argv>`` and return the JSON of its last stdout line; `NodeError` when it fails or
    overruns ``budget`` seconds (the process is never left behind)."""
    proc = await asyncio.create_subprocess_exec(
        _node_binary(), *argv, cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), budget)
    except BaseException as exc:  # timed out, or the test was cancelled: never leave node behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if isinstance(exc, asyncio.TimeoutError):
            raise NodeError(f"{label} did not finish within {budget:.0f}s") from None
        raise
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if proc.returncode != 0:
        raise _error_from(stdout, stderr, proc.returncode)
    return _last_json_line(stdout, stderr)


#: BULLMQ_COMPAT_NODE_SERVER=0 runs every `node()` command in a Node process of its own
_SERVED = os.environ.get("BULLMQ_COMPAT_NODE_SERVER", "1") not in ("", "0")
#: commands that stay one process each: a worker (its own lifetime), migrations (a fresh module state)
_ONE_SHOT = frozenset({"work", "migrate"})


class _CommandServer:
    """One ``node interop/cli.js serve`` per test process (and event loop), running `node()`'s
    commands: a Node start-up (~0.3 s of CPU, seconds on a loaded machine) per command was most of
    what the interop tests cost. Requests carry an id; replies come as they finish. A command that
    overruns its budget kills the server (the next command starts another), as it would have
    killed its own process."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.stderr = bytearray()
        self._tasks: list[asyncio.Task[None]] = []

    async def _ensure(self) -> asyncio.subprocess.Process:
        loop = asyncio.get_running_loop()
        if self.proc is not None and self.proc.returncode is None and self.loop is loop:
            return self.proc
        self._forget()
        self.proc = await asyncio.create_subprocess_exec(
            _node_binary(), str(CLI), "serve", cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=1 << 28)
        self.loop = loop
        self.pending = {}
        self._tasks = [asyncio.ensure_future(self._read(self.proc, self.pending)),
                       asyncio.ensure_future(self._drain_stderr(self.proc))]
        return self.proc

    def _forget(self) -> None:
        """Drop the current server (of another loop, dead, or stuck): kill it, fail its commands."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(NodeError("the Node command server was stopped", None, self.stderr_tail()))
        self.pending = {}

    def stderr_tail(self, since: int = 0) -> str:
        return self.stderr[max(since, len(self.stderr) - 4000):].decode(errors="replace")

    async def _read(self, proc: asyncio.subprocess.Process, pending: dict[int, asyncio.Future[Any]]) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            try:
                reply = json.loads(line)
                fut = pending.pop(reply["id"])
            except (ValueError, KeyError, TypeError):  # not a reply (something an op printed)
                continue
            if not fut.done():
                fut.set_result(reply)
        status = await proc.wait()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(NodeError(f"the Node command server exited with status {status}", None,
                                            self.stderr_tail()))
        pending.clear()

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(65536):
            self.stderr += chunk
            if len(self.stderr) > 1 << 20:
                del self.stderr[:len(self.stderr) - (1 << 19)]

    async def call(self, op: str, args: dict[str, Any], budget: float) -> Any:
        proc = await self._ensure()
        assert proc.stdin is not None
        self.next_id += 1
        request_id = self.next_id
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = fut
        since = len(self.stderr)
        proc.stdin.write((json.dumps({"id": request_id, "op": op, "args": args}) + "\n").encode())
        try:
            await proc.stdin.drain()
            reply = await asyncio.wait_for(fut, budget)
        except asyncio.TimeoutError:
            self._forget()
            raise NodeError(f"cli.js {op} did not finish within {budget:.0f}s") from None
        finally:
            self.pending.pop(request_id, None)
        if "error" in reply:
            raise NodeError(str(reply["error"]), reply.get("name"), self.stderr_tail(since))
        return reply.get("result")

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None or self.loop is not asyncio.get_running_loop():
            self._forget_process(proc)
            return
        assert proc.stdin is not None
        proc.stdin.close()  # the server ends once its commands have
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            self._forget_process(proc)
        for task in self._tasks:
            task.cancel()

    @staticmethod
    def _forget_process(proc: asyncio.subprocess.Process | None) -> None:
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


_server = _CommandServer()


async def close_node_server() -> None:
    """Stop the command server of this test process (conftest does, at the end of the session)."""
    await _server.close()


async def node(op: str, **args: Any) -> Any:
    """Run ``interop/cli.js <op>`` with ``args`` and return its parsed JSON result.

    ``args`` are the JSON fields of the command (``redis``, ``queue``, ``prefix``, ...; or
    ``postgres``, ``schema``, ``migrate`` in place of ``redis``/``prefix``).
    Raises :class:`NodeError` when the command fails. It runs in this process's command server
    (`_CommandServer`), or as ``node interop/cli.js <op> <json(args)>`` for `_ONE_SHOT` ones and
    with BULLMQ_COMPAT_NODE_SERVER=0.
    """
    budget = float(args.get("timeoutMs", 30000)) / 1000 + _SLACK_S
    if _SERVED and op not in _ONE_SHOT:
        return await _server.call(op, args, budget)
    return await run_node([str(CLI), op, json.dumps(args)], label=f"cli.js {op}", budget=budget)


async def exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether the process has exited within ``timeout`` seconds. Polls ``returncode``, which asyncio
    sets when the child is reaped: CPython 3.11's ``proc.wait()`` also waits until the child's stdout
    and stderr pipes have closed, which a process the child left behind (or a lost EOF) can put off
    for good."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def stop_process(proc: asyncio.subprocess.Process, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; returns once the process is gone (fails,
    saying so, if even SIGKILL has not ended it 30 s later)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        if not await exited(proc, timeout):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            if not await exited(proc, 30):
                raise AssertionError(f"pid {proc.pid}: not reaped 30 s after SIGKILL")


class NodeProcess:
    """A Node script running in the background for the length of an ``async with`` block.

    On entry it starts the script and (unless ``wait_for_line=False``) waits for its first
    stdout line, parsed as JSON into ``first_line``. On exit it sends SIGTERM and waits
    (SIGKILL after ``stop_timeout``). ``await result()`` waits for the script to end by itself
    and returns its last JSON line (``cli.js work``'s result).

        async with NodeProcess.board(redis_url, port, [queue]) as board:
            ...  # board.url == "http://127.0.0.1:<port>/"
        async with NodeProcess.work(redis=redis_url, queue=q, count=3) as worker:
            ...  # the Node worker is connected and consuming here
            outcome = await worker.result()
    """

    def __init__(self, script: str | os.PathLike[str], *argv: str, wait_for_line: bool = True,
                 start_timeout: float = 30.0, stop_timeout: float = 10.0,
                 result_timeout: float = 60.0 + _SLACK_S, env: dict[str, str] | None = None) -> None:
        self.script = Path(script)
        self.env = env  # added to os.environ
        if not self.script.is_absolute():
            self.script = ROOT / self.script
        self.argv = tuple(argv)
        self.wait_for_line = wait_for_line
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.result_timeout = result_timeout
        self.first_line: Any = None
        self.proc: asyncio.subprocess.Process | None = None
        self._stderr = bytearray()
        self._stderr_task: asyncio.Task[None] | None = None
        self._result: Any = None
        self._done = False

    @classmethod
    def board(cls, redis: str | None, port: int, queues: Sequence[str], prefix: str = "bull", *,
              postgres: str | None = None, schema: str | None = None,
              migrate: bool | None = None) -> "NodeProcess":
        """Bull-Board (bullmq_compat/_board/board.js) over ``queues``, on 127.0.0.1:``port``: on Redis at
        ``redis`` (keys under ``prefix``), or with ``redis=None, postgres=url, schema=name`` on
        Node's PostgreSQL backend (``migrate=True`` lets Node create the schema)."""
        if (redis is None) == (postgres is None):
            raise ValueError("give either redis or postgres")
        if redis is not None:
            argv = ["--redis", redis, "--port", str(port), "--prefix", prefix]
        else:
            assert postgres is not None
            argv = ["--postgres", postgres, "--port", str(port)]
            if schema is not None:
                argv += ["--schema", schema]
            if migrate is not None:
                argv += ["--migrate", "true" if migrate else "false"]
        for queue in queues:
            argv += ["--queue", queue]
        return cls(BOARD, *argv, env={"NODE_PATH": str(INTEROP / "node_modules")})

    @classmethod
    def work(cls, **args: Any) -> "NodeProcess":
        """A Node Worker (``cli.js work``); entering the block waits until it is connected."""
        budget = float(args.get("timeoutMs", 30000)) / 1000 + _SLACK_S
        return cls(CLI, "work", json.dumps({**args, "ready": True}), result_timeout=budget)

    @property
    def url(self) -> str:
        """The board's base URL, from its ``{"listening": url}`` line."""
        return str(self.first_line["listening"])

    @property
    def stderr(self) -> str:
        return self._stderr.decode(errors="replace")

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._stderr += chunk

    async def __aenter__(self) -> "NodeProcess":
        binary = _node_binary()
        self.proc = await asyncio.create_subprocess_exec(
            binary, str(self.script), *self.argv,
            cwd=str(ROOT), stdin=asyncio.subprocess.DEVNULL, env={**os.environ, **self.env} if self.env else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        if self.wait_for_line:
            try:
                await self._read_first_line()
            except BaseException:
                await self._stop()
                raise
        return self

    async def _read_first_line(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), self.start_timeout)
        except asyncio.TimeoutError:
            raise NodeError(f"{self.script.name} printed nothing within {self.start_timeout}s",
                            None, self.stderr) from None
        if not line:  # the script ended before becoming ready
            await self.proc.wait()
            await self._finish_stderr()
            raise _error_from("", self.stderr, self.proc.returncode)
        try:
            self.first_line = json.loads(line)
        except ValueError:
            raise NodeError(f"{self.script.name} printed a line that is not JSON: {line!r}",
                            None, self.stderr) from None
        if isinstance(self.first_line, dict) and "error" in self.first_line:
            await self.proc.wait()
            await self._finish_stderr()
            raise NodeError(str(self.first_line["error"]), self.first_line.get("name"), self.stderr)

    async def _finish_stderr(self) -> None:
        if self._stderr_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stderr_task, 5)

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the script to exit by itself and return its last stdout JSON line."""
        if self._done:
            return self._result
        assert self.proc is not None and self.proc.stdout is not None, "use inside `async with`"
        budget = self.result_timeout if timeout is None else timeout
        try:
            rest = await asyncio.wait_for(self.proc.stdout.read(), budget)
            await asyncio.wait_for(self.proc.wait(), self.stop_timeout)
        except asyncio.TimeoutError:
            raise NodeError(f"{self.script.name} did not finish within {budget}s", None, self.stderr) from None
        await self._finish_stderr()
        stdout = rest.decode(errors="replace")
        if self.proc.returncode != 0:
            raise _error_from(stdout, self.stderr, self.proc.returncode)
        self._result = _last_json_line(stdout, self.stderr)
        self._done = True
        return self._result

    async def _stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        await stop_process(proc, self.stop_timeout)
        await self._finish_stderr()

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()
