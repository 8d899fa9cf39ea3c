"""Free loopback ports for the servers the tests start, safe with pytest-xdist and other sessions.

`free_port` picks from 12000-21999, below the kernel's ephemeral range (32768+: what ``bind(0)`` and
outgoing connections use), so a port handed out here is not taken by some client's connection before
our server binds it; a cluster node's bus port (port + 10000) stays below that range too. Each xdist
worker draws from a slice of its own (by ``PYTEST_XDIST_WORKER``), at random within it, and never hands
out the same port twice: two workers never race for one port, and a second session on the machine
rarely does -- the servers retry on another port if one was taken all the same (see `_redis_server`).
"""
from __future__ import annotations

import os
import random
import socket

_LOW, _HIGH = 12000, 22000
_handed_out: set[int] = set()


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    span = (_HIGH - _LOW) // count
    low = _LOW + (index % count) * span
    return range(low, low + span)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nobody listens on now, not handed out before in this process."""
    ports = _slice()
    for _ in range(1000):
        port = random.choice(ports)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # the slice is used up: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
