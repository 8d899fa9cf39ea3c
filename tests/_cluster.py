"""A throw-away Redis Cluster (3 masters) and a Sentinel set-up, from local redis-server binaries
(`redis_server_binary()`: $REDIS_SERVER, e.g. Valkey, else redis-server; and the redis-cli beside it).

Both listen on free loopback ports only, in temporary directories, and are stopped (and their
directories removed) afterwards. Used by tests/test_cluster.py and tests/test_sentinel.py.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from tests._redis_server import RedisServer, free_port, redis_cli_binary, redis_server_binary


def _command(port: int, *args: str, timeout: float = 2.0) -> str:
    """One command over a fresh socket, through redis-cli (plain text reply)."""
    out = subprocess.run([redis_cli_binary(), "-h", "127.0.0.1", "-p", str(port), *args],
                         capture_output=True, text=True, timeout=timeout)
    return out.stdout.strip()


def _wait(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _free_ports(count: int) -> list[int]:
    """Distinct free ports whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    for _ in range(200):
        if len(ports) == count:
            break
        port = free_port()
        if port in ports or port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    if len(ports) != count:
        raise RuntimeError("could not find free loopback ports for the cluster")
    return ports


class LocalCluster:
    """Three redis-server masters joined with ``redis-cli --cluster create`` (no replicas)."""

    def __init__(self, masters: int = 3) -> None:
        self.ports = _free_ports(masters)
        self.servers: list[RedisServer] = []

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def nodes(self) -> list[dict[str, object]]:
        return [{"host": "127.0.0.1", "port": p} for p in self.ports]

    def start(self) -> "LocalCluster":
        for port in self.ports:
            server = RedisServer(port, extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", "5000"))
            self.servers.append(server)
            server.start()
        create = subprocess.run(
            [redis_cli_binary(), "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60)
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout}\n{create.stderr}")

        def all_ok() -> bool:
            infos = [_command(p, "CLUSTER", "INFO").splitlines() for p in self.ports]
            return all("cluster_state:ok" in info and f"cluster_known_nodes:{len(self.ports)}" in info
                       for info in infos)
        _wait("cluster_state:ok on every node", all_ok, 30)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@contextlib.contextmanager
def local_cluster() -> Iterator[LocalCluster]:
    redis_cli_binary()  # (it finds the server first): says what to install when either is missing
    cluster = LocalCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


# -- Sentinel ---------------------------------------------------------------------------------------
class LocalSentinel:
    """One master, one replica and ``sentinels`` sentinels (quorum = majority) watching ``mymaster``.

    ``min_replicas_to_write=1`` (Redis's guard against losing acknowledged writes in a failover)
    makes a master without a replica refuse writes (NOREPLICAS): the old master, from the moment
    its replica is promoted until the sentinels turn it into a replica, takes no write that would
    be thrown away afterwards.
    """

    service = "mymaster"

    def __init__(self, sentinels: int = 1, min_replicas_to_write: int = 0) -> None:
        guard = ("--min-replicas-to-write", str(min_replicas_to_write), "--min-replicas-max-lag", "10")
        self.master = RedisServer(extra_args=guard)
        self.replica = RedisServer(extra_args=guard)
        self.sentinel_ports = _free_ports(sentinels)
        self.quorum = sentinels // 2 + 1
        self.dir = Path(tempfile.mkdtemp(prefix="bullmq-compat-sentinel-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.sentinel_ports]

    def master_port(self, sentinel_port: Optional[int] = None) -> int:
        reply = _command(sentinel_port or self.sentinel_ports[0], "SENTINEL", "get-master-addr-by-name",
                         self.service).split()
        return int(reply[1])

    def start(self) -> "LocalSentinel":
        self.master.start()
        self.replica.extra_args += ("--replicaof", "127.0.0.1", str(self.master.port))
        self.replica.start()
        _wait("the replica to sync", lambda: "master_link_status:up" in _command(
            self.replica.port, "INFO", "replication"), 20)
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {self.dir}",
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} {self.quorum}",
                f"sentinel down-after-milliseconds {self.service} 2000",
                f"sentinel failover-timeout {self.service} 10000",
                f"sentinel parallel-syncs {self.service} 1", ""]))
            self.procs.append(subprocess.Popen([redis_server_binary(), str(conf), "--sentinel"],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in self.sentinel_ports:
            _wait(f"sentinel {port} to see the replica in sync", lambda port=port: self._replica_ok(port), 30)
        return self

    def _replica_ok(self, sentinel_port: int) -> bool:
        """The sentinel lists the replica, not down, with its link to the master up."""
        lines = _command(sentinel_port, "SENTINEL", "replicas", self.service).splitlines()
        fields = dict(zip(lines[0::2], lines[1::2]))
        return (fields.get("port") == str(self.replica.port) and fields.get("master-link-status") == "ok"
                and "down" not in fields.get("flags", ""))

    def failover(self, timeout: float = 60.0) -> int:
        """``SENTINEL FAILOVER``; waits until the sentinel names the other server as master and that
        server says it is one (the old master is turned into a replica ~10 s later, by the
        sentinels' next INFO round). Returns the new master's port. The bound is generous: a full
        `make test` once saw no promotion within 30 s."""
        old = self.master_port()
        deadline = time.monotonic() + timeout
        while True:
            reply = _command(self.sentinel_ports[0], "SENTINEL", "FAILOVER", self.service)
            if reply == "OK" or "INPROG" in reply:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"SENTINEL FAILOVER refused: {reply}")
            time.sleep(0.2)
        _wait("the failover", lambda: self.master_port() != old and "role:master" in _command(
            self.master_port(), "INFO", "replication"), timeout)
        return self.master_port()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.replica.stop()
        self.master.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def local_sentinel(sentinels: int = 1, min_replicas_to_write: int = 0) -> Iterator[LocalSentinel]:
    redis_cli_binary()  # (it finds the server first): says what to install when either is missing
    setup = LocalSentinel(sentinels, min_replicas_to_write)
    try:
        yield setup.start()
    finally:
        setup.stop()
