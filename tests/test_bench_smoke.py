"""Smoke test of scripts/bench.py: a quick run of bullmq-compat and Node BullMQ (no official port).

It starts its own redis-server (so it needs redis-server on PATH), plus node and interop/node_modules.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH"),
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not on PATH"),
    pytest.mark.skipif(not (ROOT / "interop" / "node_modules" / "bullmq").is_dir(),
                       reason="interop/node_modules is not installed (make interop)"),
]


def test_bench_quick_compat_and_node(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--only", "compat,node", "--jobs", "500",
         "--rounds", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert elapsed < 60, f"the quick benchmark took {elapsed:.0f} s"
    assert "vs Node" in proc.stdout

    doc = json.loads(out.read_text())
    assert set(doc["implementations"]) == {"compat", "node"}
    assert doc["machine"]["cores"] and doc["machine"]["redis_version"]
    keys = {m["key"] for m in doc["config"]["measurements"]}
    assert {"add", "add-bulk", "process-c1", "process-c10-roc", "process-c100", "latency"} <= keys
    only = {m["key"]: m.get("only") for m in doc["config"]["measurements"]}
    assert only.get("process-grouped") == "compat"
    for key, per_impl in doc["summary"].items():
        for impl in ((only[key],) if only.get(key) else ("compat", "node")):
            s = per_impl[impl]
            assert s is not None, f"{key}/{impl} has no result: {doc['runs'][key][impl]['errors']}"
            for field in ("jobsPerSec", "clientCpuUsPerJob", "redisCmdUsPerJob", "redisCpuUsPerJob"):
                value = s[field]["median"]
                assert isinstance(value, (int, float)) and value >= 0, (key, impl, field, value)
            assert s["jobsPerSec"]["median"] > 0
            assert s["redisCmdUsPerJob"]["median"] > 0
            if key == "latency":
                assert 0 <= s["p50Ms"]["median"] <= s["p99Ms"]["median"]
