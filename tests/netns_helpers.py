"""A network namespace of the test's own, linked to the host by a veth pair, that can be cut off.

    with netns_link() as link:          # skips the test (saying why) where namespaces cannot be made
        server listens on link.host_ip  # e.g. redis-server --bind 127.0.0.1 <host_ip>
        argv = link.exec_argv(sys.executable, "-m", ...)   # runs inside, reaches the host at host_ip
        link.partition()                # from now on every packet either way is silently dropped
        link.heal()

What a partition looks like to the programs on either side: nothing. Every packet, either way, is
dropped by a ``pfifo limit 0`` qdisc on the egress of both veth ends (`tc`; this kernel has neither
netem nor the matchall/u32 classifiers, and a link taken down is not silent: the route goes with it,
so a connect() fails at once with ENETUNREACH and queued segments error out). A dropped packet is
reported to its sender's qdisc layer only, so TCP sees loss: established connections stay open,
half-open, retransmitting with back-off; a new connect() hangs until its timeout; nobody gets an RST
or an ICMP error. The neighbour (ARP) entries of both ends are made permanent at setup, so ARP
failing during the partition cannot turn into "no route to host" errors either. `heal` removes the
qdiscs: the retransmissions get through and the same connections carry on.

Names and addresses are the test's own: the namespace and the veth ends are named from a uuid, and
the /30 (in 10.200.0.0-10.249.255.255) is drawn at random and checked against every IPv4 address
and route of the host, so parallel xdist workers (and other sessions) never collide. The namespace
and the veth pair are deleted on the way out, even when the test fails.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import subprocess
import threading
import uuid
from typing import Iterator, Sequence

import pytest

_lock = threading.Lock()
_taken: set[ipaddress.IPv4Network] = set()


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _tc(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [*(("ip", "netns", "exec", netns) if netns else ()), "tc", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address in or a route to (the default route aside)."""
    nets: list[ipaddress.IPv4Network] = []
    for entry in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for info in entry.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{info['local']}/{info.get('prefixlen', 32)}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "default")
        if dst == "default" or not dst[0].isdigit():
            continue
        nets.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    return nets


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _in_use()
    for _ in range(200):
        base = (10 << 24) | (rng.randrange(200, 250) << 16) | (rng.randrange(256) << 8) | (rng.randrange(64) * 4)
        net = ipaddress.ip_network(f"{ipaddress.IPv4Address(base)}/30")
        if net not in _taken and not any(net.overlaps(other) for other in used):
            _taken.add(net)
            return net
    raise RuntimeError("no free /30 found in 10.200.0.0/16-10.249.0.0/16")


def unavailable_reason() -> str | None:
    """Why a network namespace cannot be made here (None: it can)."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN + CAP_NET_ADMIN); the suite is not run as root"
    probe = f"bq-probe-{uuid.uuid4().hex[:8]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused here ({made.stderr.strip()}): no CAP_NET_ADMIN/CAP_SYS_ADMIN?"
    _ip("netns", "del", probe, check=False)
    return None


class NetnsLink:
    """A namespace and its veth pair to the host (see the module's docstring)."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.netns = f"bq-{tag}"
        self.host_dev = f"bq{tag}h"  # at most 15 characters (IFNAMSIZ)
        self.ns_dev = f"bq{tag}n"
        with _lock:
            self.subnet = _pick_subnet(random.Random(uuid.uuid4().int))
        hosts = list(self.subnet.hosts())
        self.host_ip, self.ns_ip = str(hosts[0]), str(hosts[1])
        self.partitioned = False
        self._made_ns = False

    # -- setup and teardown
    def create(self) -> "NetnsLink":
        _ip("netns", "add", self.netns)
        self._made_ns = True
        _ip("link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev)
        _ip("link", "set", self.ns_dev, "netns", self.netns)
        prefix = self.subnet.prefixlen
        _ip("addr", "add", f"{self.host_ip}/{prefix}", "dev", self.host_dev)
        _ip("link", "set", self.host_dev, "up")
        _ip("addr", "add", f"{self.ns_ip}/{prefix}", "dev", self.ns_dev, netns=self.netns)
        _ip("link", "set", self.ns_dev, "up", netns=self.netns)
        _ip("link", "set", "lo", "up", netns=self.netns)
        # permanent neighbours: ARP cannot fail during a partition (that would be "no route to host")
        _ip("neigh", "replace", self.ns_ip, "lladdr", self._mac(self.ns_dev, self.netns), "dev", self.host_dev,
            "nud", "permanent")
        _ip("neigh", "replace", self.host_ip, "lladdr", self._mac(self.host_dev, None), "dev", self.ns_dev,
            "nud", "permanent", netns=self.netns)
        return self

    def _mac(self, dev: str, netns: str | None) -> str:
        entries = json.loads(_ip("-j", "link", "show", "dev", dev, netns=netns).stdout)
        return str(entries[0]["address"])

    def destroy(self) -> None:
        # deleting one end of a veth pair deletes both; the namespace's own end goes with it too
        _ip("link", "del", self.host_dev, check=False)
        if self._made_ns:
            _ip("netns", "del", self.netns, check=False)
        with _lock:
            _taken.discard(self.subnet)

    # -- use
    def exec_argv(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: the pid is the program's)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def partition(self) -> None:
        """Silently drop every packet both ways from now on (see the module's docstring)."""
        _tc("qdisc", "replace", "dev", self.host_dev, "root", "pfifo", "limit", "0")
        _tc("qdisc", "replace", "dev", self.ns_dev, "root", "pfifo", "limit", "0", netns=self.netns)
        self.partitioned = True

    def heal(self) -> None:
        _tc("qdisc", "del", "dev", self.host_dev, "root", check=False)
        _tc("qdisc", "del", "dev", self.ns_dev, "root", check=False, netns=self.netns)
        self.partitioned = False

    def dropped(self) -> dict[str, int]:
        """Packets the partition qdiscs dropped so far, per end (``tc -s``): proof it was in force."""
        out = {}
        for dev, netns in ((self.host_dev, None), (self.ns_dev, self.netns)):
            stats = json.loads(_tc("-s", "-j", "qdisc", "show", "dev", dev, netns=netns).stdout or "[]")
            out[dev] = sum(int(q.get("drops", 0)) for q in stats if q.get("kind") == "pfifo")
        return out


@contextlib.contextmanager
def netns_link() -> Iterator[NetnsLink]:
    """A `NetnsLink`, created, and destroyed on the way out; skips the test (saying why) where
    namespaces cannot be made (not root, no CAP_NET_ADMIN, no iproute2)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no network namespace for a partition test: {reason}")
    link = NetnsLink()
    try:
        link.create()
        yield link
    finally:
        link.heal()
        link.destroy()


def pg_hba_for(subnets: Sequence[str]) -> list[str]:
    """pg_hba.conf lines: initdb's trust defaults plus trust for ``subnets`` (CIDR)."""
    return ["local all all trust", "host all all 127.0.0.1/32 trust", "host all all ::1/128 trust",
            *(f"host all all {net} trust" for net in subnets)]
