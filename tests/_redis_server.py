"""Where the tests get a Redis: REDIS_URL, a testcontainers Redis, or a redis-server of our own.

Tests never flush a Redis they did not start; they use unique queue names instead. Every server the
suite starts is `redis_server_binary()`: ``$REDIS_SERVER`` when set (e.g. Valkey 8, `make valkey`),
else redis-server on PATH.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator

from tests._ports import free_port

__all__ = ["RedisServer", "free_port", "redis_cli_binary", "redis_for_tests", "redis_server_binary"]


def redis_server_binary() -> str:
    """The server the suite starts: ``$REDIS_SERVER`` (a path or a name on PATH, e.g.
    ``.valkey/usr/bin/valkey-server``), else ``redis-server`` on PATH."""
    wanted = os.environ.get("REDIS_SERVER") or "redis-server"
    found = shutil.which(wanted)
    if found is None:
        if os.environ.get("REDIS_SERVER"):
            raise RuntimeError(f"REDIS_SERVER={wanted} is not an executable (Valkey: run make valkey)")
        raise RuntimeError("redis-server is not on PATH: install it (apt-get install redis-server), "
                           "or set REDIS_SERVER or REDIS_URL")
    # absolute, not resolved: valkey-server is a symlink to valkey-check-rdb, and its name selects server mode
    return os.path.abspath(found)


def redis_cli_binary() -> str:
    """The command-line client of that server: the ``*-cli`` beside it (valkey-cli beside a
    valkey-server), else ``redis-cli`` on PATH."""
    server = redis_server_binary()
    beside = os.path.join(os.path.dirname(server), os.path.basename(server).replace("-server", "-cli"))
    found = beside if beside != server and os.access(beside, os.X_OK) else shutil.which("redis-cli")
    if found is None:
        raise RuntimeError(f"no command-line client beside {server} nor redis-cli on PATH (apt-get install redis-tools)")
    return found


def die_with_parent() -> None:
    """preexec_fn for a server we start: it gets SIGTERM when this process dies (a killed pytest or
    xdist worker leaves no redis-server behind on the shared machine). Linux only; else nothing."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 -- not Linux: the fixtures still stop what they started
        pass


def _ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
            # a server with requirepass answers NOAUTH: it is up all the same
            return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")
    except OSError:
        return False


class RedisServer:
    """A redis-server child process on a free loopback port, in a temporary directory."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self._retry_ports = port is None  # a port of our choosing: another one if it was taken meanwhile
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="bullmq-compat-redis-")
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        binary = redis_server_binary()
        for attempt in range(5):
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.dir, *self.extra_args],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent,
            )
            deadline = time.monotonic() + 30
            while not _ping(self.port):
                if self.proc.poll() is not None:
                    break  # exited: the port was taken meanwhile (or a bad argument)
                if time.monotonic() > deadline:
                    self.proc.kill()
                    self.proc.wait()
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.02)
            else:
                if self.proc.poll() is None:  # ours answered (not some server that took the port)
                    return self
            if not self._retry_ports:
                break
            self.port = free_port()
        raise RuntimeError(f"redis-server did not start (exit status {self.proc.returncode}, last port {self.port})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _docker_answers() -> bool:
    if not (os.path.exists("/var/run/docker.sock") or os.environ.get("DOCKER_HOST")):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def redis_for_tests() -> Iterator[str]:
    """Yield a Redis URL for the test session, starting (and later stopping) a server when needed."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    if not os.environ.get("REDIS_SERVER") and _docker_answers():  # REDIS_SERVER names the server to run
        from testcontainers.redis import RedisContainer  # type: ignore[import-untyped]

        with RedisContainer("redis:7.0") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.stop()
