"""For tests/test_prometheus.py: a Prometheus server of the test's own (Debian's ``prometheus``,
installed by ``make setup``), the ``bullmq-compat metrics`` endpoint as a subprocess, and reading
``/metrics`` pages and Prometheus' query API."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest

from tests._redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A /metrics page's samples: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(page: dict[tuple[str, frozenset[tuple[str, str]]], float], series: str, /, **labels: str
          ) -> Optional[float]:
    """The sample of ``series`` with exactly ``labels`` (None: not on the page)."""
    return page.get((series, frozenset(labels.items())))


class MetricsCli:
    """``bullmq-compat metrics ... --port 0`` as a subprocess; ``port`` read from its first line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "metrics", *args, "--port", "0",
                                      "--host", "127.0.0.1"], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the CLI prints it once listening (or exits)
        found = re.search(r":(\d+)/metrics", line)
        if found is None:
            self.stop()
            errors = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the metrics CLI did not start: {line!r} {errors}")
        self.port = int(found.group(1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def page(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return samples(get(self.url))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)


class PrometheusServer:
    """``prometheus`` on a free loopback port, with its own config and TSDB directory, scraping
    ``targets`` (host:port) every second."""

    def __init__(self, targets: Sequence[str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: run 'make setup' (it installs Debian's prometheus package)")
        self.dir = Path(tempfile.mkdtemp(prefix="bullmq-compat-prometheus-"))
        self.port = free_port()
        config = self.dir / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "bullmq", "static_configs": [{"targets": list(targets)}]}],
        }))
        self.log = open(self.dir / "prometheus.log", "w")
        self.proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            try:
                get(f"{self.url}/-/ready", timeout=2)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "prometheus.log").read_text()[-2000:]
                    self.stop()
                    raise AssertionError(f"prometheus did not start: {log}")
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> dict[str, Any]:
        """``/api/v1/query``'s answer (``status``, ``data``; ``error`` when refused)."""
        try:
            return dict(json.loads(get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")))
        except urllib.error.HTTPError as err:  # a bad expression answers 400 with the error as JSON
            return dict(json.loads(err.read().decode()))

    def vector(self, expr: str) -> list[tuple[dict[str, str], float]]:
        answer = self.query(expr)
        assert answer["status"] == "success", (expr, answer)
        return [(item["metric"], float(item["value"][1])) for item in answer["data"]["result"]]

    def scalar(self, expr: str) -> Optional[float]:
        """The single value of ``expr``, None while it has none."""
        found = self.vector(expr)
        assert len(found) <= 1, (expr, found)
        return found[0][1] if found else None

    def wait_for(self, expr: str, check: Callable[[Optional[float]], bool], timeout: float = 90) -> float:
        """Wait (generously: the machine is shared) until ``check`` holds for ``expr``'s value."""
        deadline = time.monotonic() + timeout
        got = self.scalar(expr)
        while not check(got):
            if time.monotonic() > deadline:
                targets = get(f"{self.url}/api/v1/targets")
                raise AssertionError(f"{expr} is {got} after {timeout} s; targets: {targets[:1500]}")
            time.sleep(0.5)
            got = self.scalar(expr)
        assert got is not None
        return got

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
