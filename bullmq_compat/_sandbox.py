"""Process isolation (``use_processes=True``): run a processor given as 'pkg.module:function' in child processes.

As Node's sandboxed processors (``sandbox.js``, ``child-processor.js``): a pool of child
processes, each running one job at a time and kept for the next; the child's job
(`SandboxedJob`) calls back to the parent for what needs the datastore (``update_progress``,
``log``, ``update_data``, ``get_children_values``, ``get_ignored_children_failures``,
``move_to_delayed``, ``move_to_wait``, ``move_to_waiting_children``, ``get_dependencies``,
``get_dependencies_count``), and the parent's ``cancel_job`` aborts the child's signal.

Parent and child speak JSON lines over a socket pair (not stdin/stdout: the processor may print).
A child that dies (killed, out of memory, ``os._exit``) fails only its job with `ChildCrashed`.
"""
from __future__ import annotations

import asyncio
import base64
import importlib
import inspect
import json
import os
import pickle
import socket
import sys
import traceback
from typing import Any, Callable, Optional

from bullmq_compat._cancellation import AbortController, AbortError, AbortSignal
from bullmq_compat._errors import BullMQCompatError

_LINE_LIMIT = 1 << 30  # one message (a job's data, a return value) may be this long

# the calls a child's job may make, and what each answers
_CALLS = {
    "update_progress", "log", "update_data", "get_children_values", "get_ignored_children_failures",
    "move_to_delayed", "move_to_wait", "move_to_waiting_children", "get_dependencies", "get_dependencies_count",
}


class ChildCrashed(BullMQCompatError):
    """The child process running a job died before answering."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child process (its ``__cause__`` in the parent)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _positional_arity(fn: Callable[..., Any]) -> int:
    """How many of (job, token, signal) ``fn`` takes: 1, 2 or 3 (``*args`` takes all three)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 1
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 3
    n = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return max(1, min(n, 3))


def _encode_error(err: BaseException) -> dict[str, Any]:
    try:
        pickled: Optional[str] = base64.b64encode(pickle.dumps(err)).decode()
    except Exception:
        pickled = None
    return {"type": type(err).__name__, "module": type(err).__module__, "message": str(err),
            "traceback": "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip(),
            "pickle": pickled}


_by_name: dict[str, type[BaseException]] = {}


def _decode_error(payload: dict[str, Any]) -> BaseException:
    err: Optional[BaseException] = None
    if payload.get("pickle"):
        try:
            err = pickle.loads(base64.b64decode(payload["pickle"]))
        except Exception:
            err = None
    if not isinstance(err, BaseException):
        name = str(payload.get("type") or "Error")
        cls = _by_name.get(name)
        if cls is None:  # a class the parent cannot import: one of that name (so failed_reason and checks by name hold)
            cls = _by_name[name] = type(name, (Exception,), {"__module__": "bullmq_compat.sandboxed"})
        err = cls(payload.get("message", ""))
    if payload.get("traceback"):
        err.__cause__ = RemoteTraceback(payload["traceback"])
    return err


class _Conn:
    """One end of the parent-child socket: JSON lines."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, msg: dict[str, Any]) -> None:
        self.writer.write(json.dumps(msg).encode() + b"\n")
        await self.writer.drain()

    async def recv(self) -> Optional[dict[str, Any]]:
        try:
            line = await self.reader.readline()
        except (ConnectionError, asyncio.IncompleteReadError):
            return None
        if not line:
            return None
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:
            pass


# == the parent side ================================================================================
class _Child:
    def __init__(self, proc: asyncio.subprocess.Process, conn: _Conn) -> None:
        self.proc = proc
        self.conn = conn

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def kill(self) -> None:
        self.conn.close()
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


class ChildPool:
    """Child processes for one processor path: ``retain()`` a free one (or start one), ``release()`` it after."""

    def __init__(self, path: str, max_children: Callable[[], int]) -> None:
        self.path = path
        self._max_children = max_children
        self._idle: list[_Child] = []
        self._busy = 0
        self._changed = asyncio.Condition()
        self._all: set[_Child] = set()
        self.closed = False

    async def retain(self) -> _Child:
        async with self._changed:
            while self._busy >= max(1, self._max_children()) and not self.closed:
                await self._changed.wait()
            if self.closed:
                raise ChildCrashed("the worker is closing: no child process to run the job")
            self._busy += 1
        try:
            while self._idle:
                child = self._idle.pop()
                if child.alive:
                    return child
                self._all.discard(child)
            return await self._start()
        except BaseException:
            await self._done()
            raise

    async def _done(self) -> None:
        async with self._changed:
            self._busy -= 1
            self._changed.notify()

    async def release(self, child: Optional[_Child], *, broken: bool = False) -> None:
        if child is not None:
            if broken or self.closed or not child.alive:
                child.kill()
                self._all.discard(child)
            else:
                self._idle.append(child)
        await self._done()

    async def _start(self) -> _Child:
        parent_sock, child_sock = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", f"from bullmq_compat._sandbox import child_main; child_main({child_sock.fileno()})",
                pass_fds=(child_sock.fileno(),))
        finally:
            child_sock.close()
        reader, writer = await asyncio.open_connection(sock=parent_sock, limit=_LINE_LIMIT)
        child = _Child(proc, _Conn(reader, writer))
        self._all.add(child)
        try:
            await child.conn.send({"cmd": "init", "path": self.path, "sys_path": list(sys.path), "cwd": os.getcwd()})
            reply = await child.conn.recv()
        except BaseException:
            child.kill()
            self._all.discard(child)
            raise
        if reply is None or reply.get("cmd") != "init_ok":
            child.kill()
            self._all.discard(child)
            if reply is not None and reply.get("err"):
                raise _decode_error(reply["err"])
            raise ChildCrashed(f"the child process for processor {self.path!r} exited while starting")
        return child

    async def close(self) -> None:
        self.closed = True
        async with self._changed:
            self._changed.notify_all()
        children, self._all, self._idle = list(self._all), set(), []
        for child in children:
            child.conn.close()  # an idle child exits on EOF
        for child in children:
            try:
                await asyncio.wait_for(child.proc.wait(), 2.0)
            except asyncio.TimeoutError:
                child.kill()
                await child.proc.wait()


async def run_sandboxed(pool: ChildPool, job: Any, token: str, signal: Optional[AbortSignal]) -> Any:
    """Run ``job`` in a child of ``pool``: answers its calls, forwards cancellation, returns its result."""
    child = await pool.retain()
    broken = True
    conn = child.conn

    def on_abort() -> None:
        reason = signal.reason if signal is not None else None
        asyncio.ensure_future(_send_quietly(conn, {
            "cmd": "cancel", "value": None if isinstance(reason, AbortError) and reason.reason is None else (
                reason if isinstance(reason, (str, int, float, bool)) or reason is None else str(reason))}))

    try:
        payload = job.to_dict()
        payload["queue_name"] = job.queue.name
        payload["token"] = token
        await conn.send({"cmd": "start", "job": payload, "token": token})
        if signal is not None:
            if signal.aborted:
                on_abort()
            else:
                signal.add_listener(on_abort, once=True)
        while True:
            msg = await conn.recv()
            if msg is None:
                raise ChildCrashed(f"the child process running job {job.id} exited unexpectedly "
                                   "(killed, out of memory, or crashed)")
            cmd = msg.get("cmd")
            if cmd == "completed":
                broken = False
                return msg.get("value")
            if cmd == "failed":
                broken = False
                raise _decode_error(msg.get("err") or {})
            if cmd == "call":
                reply: dict[str, Any] = {"cmd": "reply", "rid": msg.get("rid")}
                try:
                    op = msg.get("op")
                    if op not in _CALLS:
                        raise ValueError(f"a sandboxed job cannot call {op!r}")
                    result = getattr(job, str(op))(*msg.get("args", []), **msg.get("kwargs", {}))
                    reply["value"] = await result if inspect.isawaitable(result) else result
                except Exception as err:
                    reply = {"cmd": "reply", "rid": msg.get("rid"), "err": _encode_error(err)}
                await conn.send(reply)
    finally:
        if signal is not None:
            signal.remove_listener(on_abort)
        await pool.release(child, broken=broken)


async def _send_quietly(conn: _Conn, msg: dict[str, Any]) -> None:
    try:
        await conn.send(msg)
    except Exception:  # the child may have exited already
        pass


# == the child side =================================================================================
class SandboxedJob:
    """What a processor running in a child process gets as its job: the job's fields (``id``, ``name``,
    ``data``, ``opts``, ``attempts_made``, ``attempts_started``, ``timestamp``, ``progress``,
    ``queue_name``, ``token``...) and these calls, made by the parent on the real job:
    ``update_progress``, ``log``, ``update_data``, ``get_children_values``,
    ``get_ignored_children_failures``, ``move_to_delayed``, ``move_to_wait``,
    ``move_to_waiting_children``, ``get_dependencies``, ``get_dependencies_count``.

    In an ``async def`` processor await them; in a plain ``def`` (run in a thread of the child)
    call them: they block until the parent has answered and return its answer.
    The ``token`` arguments default to this job's token."""

    def __init__(self, payload: dict[str, Any], caller: Optional["_Caller"] = None) -> None:
        """Made by the child process from the parent's ``payload`` (the job's fields); ``caller``
        sends the calls below to the parent."""
        self.id: Optional[str] = payload.get("id")
        self.name: str = payload.get("name", "")
        self.data: Any = payload.get("data")
        self.opts: dict[str, Any] = payload.get("opts") or {}
        self.attempts_made: int = payload.get("attempts_made", 0)
        self.attempts_started: int = payload.get("attempts_started", 0)
        self.timestamp: int = payload.get("timestamp", 0)
        self.queue_name: str = payload.get("queue_name", "")
        self.progress: Any = payload.get("progress", 0)
        self.token: Optional[str] = payload.get("token")
        for key in ("delay", "priority", "processed_on", "parent_key", "processed_by", "failed_reason",
                    "stacktrace", "returnvalue"):
            setattr(self, key, payload.get(key))
        self._caller = caller

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if self._caller is None:
            raise RuntimeError(f"job.{op}() needs the parent process: this SandboxedJob was made outside a worker")
        return self._caller.call(op, list(args), kwargs)

    def update_progress(self, progress: Any) -> Any:
        """Set the job's progress (a number or a JSON-serialisable object), as `Job.update_progress`
        in the parent."""
        self.progress = progress
        return self._call("update_progress", progress)

    def log(self, row: str) -> Any:
        """Append ``row`` to the job's log, as `Job.log` in the parent."""
        return self._call("log", row)

    def update_data(self, data: Any) -> Any:
        """Replace the job's data, as `Job.update_data` in the parent."""
        self.data = data
        return self._call("update_data", data)

    def get_children_values(self) -> Any:
        """The return values of this job's completed children, by child key
        (`Job.get_children_values`)."""
        return self._call("get_children_values")

    def get_ignored_children_failures(self) -> Any:
        """The failed reasons of children whose failure was ignored, by child key
        (`Job.get_ignored_children_failures`)."""
        return self._call("get_ignored_children_failures")

    def get_dependencies(self, **options: Any) -> Any:
        """This job's children by state (`Job.get_dependencies`, the same keyword options)."""
        return self._call("get_dependencies", **options)

    def get_dependencies_count(self, **options: Any) -> Any:
        """How many children this job has in each state (`Job.get_dependencies_count`)."""
        return self._call("get_dependencies_count", **options)

    def move_to_delayed(self, timestamp: int, token: Optional[str] = None) -> Any:
        """Move the job to delayed until ``timestamp`` (ms); raise `DelayedError` afterwards
        (`Job.move_to_delayed`)."""
        return self._call("move_to_delayed", timestamp, token or self.token)

    def move_to_wait(self, token: Optional[str] = None) -> Any:
        """Move the job back to waiting; raise `WaitingError` afterwards (`Job.move_to_wait`)."""
        return self._call("move_to_wait", token or self.token)

    def move_to_waiting_children(self, token: Optional[str] = None, child: Optional[dict[str, str]] = None) -> Any:
        """Move the job to waiting-children if it has unfinished children; raise
        `WaitingChildrenError` after a True answer (`Job.move_to_waiting_children`)."""
        return self._call("move_to_waiting_children", token or self.token, child)

    def __repr__(self) -> str:
        return f"<SandboxedJob {self.queue_name}:{self.id} name={self.name!r}>"


class _Caller:
    """The child's side of a job's calls to the parent."""

    def __init__(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.loop = loop
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.seq = 0

    async def _rpc(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.seq += 1
        rid = self.seq
        fut: asyncio.Future[Any] = self.loop.create_future()
        self.pending[rid] = fut
        await self.conn.send({"cmd": "call", "rid": rid, "op": op, "args": args, "kwargs": kwargs})
        return await fut

    def call(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        coro = self._rpc(op, args, kwargs)
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return coro
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # from a plain def's thread

    def answer(self, msg: dict[str, Any]) -> None:
        fut = self.pending.pop(int(msg.get("rid") or 0), None)
        if fut is None or fut.done():
            return
        if msg.get("err"):
            fut.set_exception(_decode_error(msg["err"]))
        else:
            fut.set_result(msg.get("value"))


def _load(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"processor={path!r} is not callable")
    return target  # type: ignore[no-any-return]


def child_main(fd: int) -> None:
    """Entry point of a child process (``python -c``): serve jobs on socket ``fd`` until EOF."""
    import signal

    # Ctrl-C reaches the whole process group: the parent's worker then closes gracefully and
    # waits for the jobs its children are running, so a child must not die of it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve(fd))


async def _serve(fd: int) -> None:
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd), limit=_LINE_LIMIT)
    conn = _Conn(reader, writer)
    loop = asyncio.get_running_loop()
    init = await conn.recv()
    if init is None:
        return
    for entry in reversed(init.get("sys_path") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        fn = _load(str(init.get("path")))
    except Exception as err:
        await conn.send({"cmd": "init_failed", "err": _encode_error(err)})
        return
    arity = _positional_arity(fn)
    await conn.send({"cmd": "init_ok"})
    caller = _Caller(conn, loop)
    controller: Optional[AbortController] = None
    task: Optional[asyncio.Task[None]] = None

    async def run_job(msg: dict[str, Any], signal: AbortSignal) -> None:
        try:
            job = SandboxedJob(msg.get("job") or {}, caller)
            args = (job, msg.get("token"), signal)[:arity]
            if inspect.iscoroutinefunction(fn):
                result = await fn(*args)
            else:
                result = await loop.run_in_executor(None, lambda: fn(*args))
                if inspect.isawaitable(result):
                    result = await result
            try:
                line = {"cmd": "completed", "value": result}
                json.dumps(line)
            except (TypeError, ValueError) as err:
                from bullmq_compat._errors import InvalidJobData
                raise InvalidJobData(f"the return value of job {job.id} is not JSON-serialisable ({err})") from None
            await conn.send(line)
        except Exception as err:
            await conn.send({"cmd": "failed", "err": _encode_error(err)})

    while True:
        msg = await conn.recv()
        if msg is None:
            break
        cmd = msg.get("cmd")
        if cmd == "start":
            controller = AbortController()
            task = asyncio.ensure_future(run_job(msg, controller.signal))
            # as Node's child, which runs the processor up to its first await before reading the next
            # message: a listener the processor adds at once hears a cancel sent right after the start
            await asyncio.sleep(0)
        elif cmd == "cancel":
            if controller is not None:
                controller.abort(msg.get("value"))
        elif cmd == "reply":
            caller.answer(msg)
    if task is not None and not task.done():
        task.cancel()
    os._exit(0)  # a plain def still running in a thread must not keep the child alive
