"""A relay node in a subprocess (Node's interop/relay.js or interop/pg_relay.js, or our
tests/relay_proc.py), driven by JSON lines: `RelayProc.call` sends a command and waits for its
answer, `RelayProc.wait_event` waits for an event line (messages, 'swept', 'recovered', 'lag')."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from tests.node import _node_binary, stop_process

ROOT = Path(__file__).resolve().parent.parent


class RelayProc:
    def __init__(self, argv: list[str], *, ready_timeout: float = 30.0) -> None:
        self.argv = argv
        self.ready_timeout = ready_timeout
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.node_id = ""
        self.events: list[dict[str, Any]] = []
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._reader: Optional[asyncio.Task[None]] = None
        self._stderr = bytearray()
        self._stderr_task: Optional[asyncio.Task[None]] = None
        self._changed = asyncio.Event()

    @classmethod
    def node(cls, redis_url: str, namespace: str, **options: Any) -> "RelayProc":
        """Node's Relay (options in Node's names: nodeId, leaseDuration...)."""
        return cls([_node_binary(), str(ROOT / "interop" / "relay.js"), "node", redis_url, namespace,
                    json.dumps(options)])

    @classmethod
    def node_pg(cls, postgres_url: str, schema: str, namespace: str, **options: Any) -> "RelayProc":
        """Node's Relay on its PostgreSQL backend (interop/pg_relay.js; options in Node's names, those
        pg_relay.js passes on). Its message events name the pattern as ``pattern``, not ``sub``:
        `messages` reads either."""
        args = {"postgres": postgres_url, "schema": schema, "namespace": namespace, **options}
        return cls([_node_binary(), str(ROOT / "interop" / "pg_relay.js"), json.dumps(args)], ready_timeout=60.0)

    @classmethod
    def python(cls, redis_url: str, namespace: str, **options: Any) -> "RelayProc":
        """Our Relay (options in Python names: node_id, lease_duration...)."""
        return cls([sys.executable, "-m", "tests.relay_proc", "node", redis_url, namespace, json.dumps(options)])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def stderr(self) -> str:
        return self._stderr.decode(errors="replace")

    async def __aenter__(self) -> "RelayProc":
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        try:
            assert self.proc.stdout is not None
            line = await asyncio.wait_for(self.proc.stdout.readline(), self.ready_timeout)
            if not line:
                await self.proc.wait()
                await asyncio.sleep(0.1)
                raise AssertionError(f"{self.argv[:3]} exited ({self.proc.returncode}) before it was ready: "
                                     f"{self.stderr[-2000:]}")
            first = json.loads(line)
            assert first.get("ready") is True, first
            self.node_id = first["nodeId"]
        except BaseException:
            await self.__aexit__()
            raise
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._stderr += chunk

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if "id" in obj and obj["id"] in self._answers:
                future = self._answers.pop(obj["id"])
                if not future.done():
                    future.set_result(obj)
            else:
                self.events.append(obj)
                self._changed.set()
        for future in self._answers.values():
            if not future.done():
                future.set_exception(AssertionError(f"{self.argv[:3]} exited: {self.stderr[-2000:]}"))

    async def call(self, op: str, timeout: float = 30.0, **args: Any) -> Any:
        """Run one command; its result (AssertionError with the error text if it failed)."""
        assert self.proc is not None and self.proc.stdin is not None
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[self._next_id] = future
        self.proc.stdin.write((json.dumps({"id": self._next_id, "op": op, **args}) + "\n").encode())
        await self.proc.stdin.drain()
        answer = await asyncio.wait_for(future, timeout)
        if "error" in answer:
            raise AssertionError(f"{op} failed: {answer['error']} (code {answer.get('code')})")
        return answer["result"]

    def messages(self, sub: Optional[str] = None) -> list[dict[str, Any]]:
        return [e["message"] for e in self.events
                if e.get("event") == "message" and (sub is None or e.get("sub", e.get("pattern")) == sub)]

    async def wait_event(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0,
                         what: str = "event") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if predicate(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what}; events: {self.events[-20:]}; "
                                     f"stderr: {self.stderr[-1000:]}")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))

    async def wait_messages(self, count: int, sub: Optional[str] = None, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.messages(sub)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {count} messages on {sub}: {self.messages(sub)}; "
                                     f"stderr: {self.stderr[-1000:]}")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.5)
        return self.messages(sub)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL: its registration stays until a sweep removes it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def __aexit__(self, *exc: Any) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                proc.send_signal(signal.SIGCONT)
            await stop_process(proc, 10)
        for task in (self._reader, self._stderr_task):
            if task is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 5)


async def no_retained(relay: Any) -> bool:
    """True once ``relay.get_retained()`` lists nothing, and then a few ms later (for use with
    ``wait_until``). On Redis the two views of a retained message can disagree for one millisecond:
    upstream's relayGet drops a message whose index score (publish's TIME + retain) is <= now, while
    relaySubscribe reads the message's hash, which Redis expires only when now > its PEXPIRE time
    (the publish script's start + retain, <= that score). A subscribe in the same millisecond as the
    get that found nothing can still be handed the message; 5 ms later the hash is gone for sure."""
    if await relay.get_retained():
        return False
    await asyncio.sleep(0.005)
    return True



class SlowListener:
    """A listener that holds its first message (data 0) until `release` is set, then records the
    data of every message it is given (``got``); `entered` is set once it holds message 0."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.got: list[Any] = []

    async def __call__(self, message: Any) -> None:
        if message.data == 0:
            self.entered.set()
            await self.release.wait()
        self.got.append(message.data)
