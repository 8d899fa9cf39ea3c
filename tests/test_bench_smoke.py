"""Smoke test of scripts/bench.py: a quick run of bullmq-compat, Node BullMQ and the floor (the bare
script loop of scripts/bench_floor.py); no official port.

It starts its own redis-server (so it needs redis-server on PATH), plus node and interop/node_modules.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
    # (the timeout bounds it: a quick run takes well under a minute on an idle machine)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--only", "compat,node,floor", "--jobs",
         "200", "--rounds", "1", "--backends", "redis", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "BULLMQ_COMPAT_BUSY_POLL_US": "150"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "vs Node" in proc.stdout
    # the busy-poll budget the Python runners inherited, in the report and the JSON
    assert "busy-poll budget 150 µs" in proc.stdout

    doc = json.loads(out.read_text())
    assert set(doc["implementations"]) == {"compat", "node", "floor"}
    assert doc["machine"]["cores"] and doc["machine"]["redis_version"]
    assert doc["machine"]["busy_poll_us"] == 150
    keys = {m["key"] for m in doc["config"]["measurements"]}
    assert {"add", "add-bulk", "process-c1", "process-c10-roc", "process-c100", "latency"} <= keys
    only = {m["key"]: m.get("only") for m in doc["config"]["measurements"]}
    assert only.get("process-grouped") == "compat" and only.get("process-batch50") == "compat"
    batch = doc["summary"]["process-batch50"]["compat"]
    assert batch["pairedRatio"]["median"] > 0 and batch["pairedCpuRatio"]["median"] > 0
    assert "client CPU per job median" in proc.stdout  # the batch row's CPU ratio to its twin
    # rate-limited groups: never faster than the limits allow (the shortest run they allow over the
    # run's time is at most 1; ms rounding of the starts aside)
    assert only.get("process-grouped-rl") == "compat"
    limited = doc["summary"]["process-grouped-rl"]["compat"]
    assert 0 < limited["rateCeilingShare"]["max"] <= 1.01, limited["rateCeilingShare"]
    assert "rate-limited groups: the run took" in proc.stdout
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
            else:  # the share of a core redis-server used: jobs/s x its CPU per job
                share = s["redisCeilingShare"]["median"]
                assert 0 < share <= 1.5, (key, impl, share)  # one core at most, give or take the sampling
        # the floor runs every Redis row but latency and the rows of one implementation (groups, batches)
        floor = per_impl.get("floor")
        if key == "latency" or only.get(key):
            assert floor is None, (key, floor)
        else:
            assert floor is not None and floor["jobsPerSec"]["median"] > 0, (key, doc["runs"][key]["floor"]["errors"])
            assert floor["redisCmdUsPerJob"]["median"] > 0
    assert "of floor" in proc.stdout and "floor (bare script loop)" in proc.stdout
    if Path("/proc/stat").exists():  # the host's steal, per run and for the whole bench
        assert 0 <= doc["machine"]["steal_share"] <= 1 and "% of CPU time" in proc.stdout
        for per_impl in doc["runs"].values():
            for cell in per_impl.values():
                for run in cell["runs"]:
                    assert 0 <= run["stealShare"] <= 1, run


def test_bench_quick_postgres_rows(tmp_path: Path, postgres_url: str) -> None:
    """One PostgreSQL row (the worker at c=10, whose pre-load is an add_bulk), ours and Node's,
    tiny, on the suite's own PostgreSQL (POSTGRES_URL, the local server, or a cluster the suite
    starts): the row prints, the ratio note follows, and each run's schema is dropped."""
    import psycopg

    url = postgres_url

    out = tmp_path / "bench-pg.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--only", "compat,node",
         "--backends", "postgres", "--measurements", "pg-process-c10", "--jobs", "50", "--rounds", "1",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "POSTGRES_URL": url})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== PostgreSQL: worker c=10" in proc.stdout
    assert "ours vs Node's Postgres backend" in proc.stdout
    doc = json.loads(out.read_text())
    assert {m["key"] for m in doc["config"]["measurements"]} == {"pg-process-c10"}
    assert doc["machine"]["postgres_version"]
    for impl in ("compat", "node"):
        s = doc["summary"]["pg-process-c10"][impl]
        assert s is not None, (impl, doc["runs"]["pg-process-c10"][impl]["errors"])
        assert s["jobsPerSec"]["median"] > 0 and s["clientCpuUsPerJob"]["median"] > 0
        assert "redisCmdUsPerJob" not in s
    used = {run["schema"] for impl in ("compat", "node")
            for run in doc["runs"]["pg-process-c10"][impl]["runs"]}
    assert len(used) == 2 and all(name.startswith("bench_") for name in used)
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", [list(used)]).fetchall()
    assert not left, f"schemas not dropped: {left}"


def test_bench_memory_small(tmp_path: Path) -> None:
    """scripts/bench_memory.py at a tiny size: each mode reports RSS before the first job, at every
    step and at the end, from a process of its own, and every job is done (the worker's last reading
    comes from its 'completed' listener, the producer's after its last add)."""
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_memory.py"), "--jobs", "300", "--every", "100",
         "--concurrency", "3", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"worker", "producer"}
    for mode, result in doc["results"].items():
        readings = result["readings"]
        assert [r["jobs"] for r in readings] == [0, 100, 200, 300], (mode, readings)
        assert all(r["rssMb"] > 5 for r in readings), readings
        s = result["summary"]
        assert s["startMb"] == readings[0]["rssMb"] and s["endMb"] == readings[-1]["rssMb"]
        assert s["minMb"] <= s["maxMb"]
    assert "worker: RSS" in proc.stdout and "producer: RSS" in proc.stdout


def test_bench_transactions_rows(postgres_url: str) -> None:
    """scripts/bench_transactions.py (make bench's transaction pairs), tiny, on the suite's own
    PostgreSQL: both rows print with a ratio, and every schema it made is dropped."""
    import psycopg

    def schemas() -> set[str]:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_tx_%'").fetchall()
        return {r[0] for r in rows}

    before = schemas()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_transactions.py"), "--jobs", "40",
                           "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "POSTGRES_URL": postgres_url})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| enqueue", "| completion"))]
    assert len(rows) == 2, proc.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1].replace(",", "")) > 0 and float(cells[2].replace(",", "")) > 0, row
        assert cells[3].endswith("×"), row
    assert schemas() - before == set(), "schemas left behind"


def test_bench_relay_rows(postgres_url: str) -> None:
    """scripts/bench_relay.py (make bench's Relay fan-out rows), tiny: its own redis-server and the
    suite's PostgreSQL; every row has positive Node and Python figures and a ratio, and every
    schema it made is dropped."""
    import psycopg

    def schemas() -> set[str]:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_relay_%'").fetchall()
        return {r[0] for r in rows}

    before = schemas()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_relay.py"), "--quick", "--messages", "50",
                           "--rounds", "1", "--backends", "redis,postgres", "--postgres-url", postgres_url],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| Redis |", "| PostgreSQL |"))]
    for backend in ("Redis", "PostgreSQL"):
        mine = [r for r in rows if r.startswith(f"| {backend} |")]
        assert len(mine) == 7, proc.stdout
        assert any("deliveries/s" in r for r in mine) and any("p99" in r for r in mine), mine
        for row in mine:
            cells = [c.strip() for c in row.strip("|").split("|")]
            node, python = (float(c.replace(",", "")) for c in cells[2:4])
            assert node > 0 and python > 0, row
            assert cells[4].endswith("×"), row
    assert "LOST" not in proc.stdout and "FAILED" not in proc.stdout, proc.stdout
    assert schemas() - before == set(), "schemas left behind"


def test_bench_pg_gate_rows(postgres_url: str) -> None:
    """scripts/bench_pg_gate.py (make bench's step for the group gate's server CPU), tiny, on the
    suite's PostgreSQL: a plain and a grouped run per round, every job finished (the script voids a
    run otherwise), both medians and the difference printed, and every schema it made dropped."""
    import psycopg

    def schemas() -> set[str]:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_gate_%'").fetchall()
        return {r[0] for r in rows}

    before = schemas()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_pg_gate.py"), "--jobs", "60", "--groups", "6",
                           "--rounds", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "POSTGRES_URL": postgres_url})
    if "is not a process of this machine" in proc.stderr:
        pytest.skip("the suite's PostgreSQL runs on another machine: its backends' CPU cannot be read here")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [line.split() for line in proc.stdout.splitlines() if line.startswith("  round ")]
    assert sorted(r[2] for r in runs) == ["grouped", "grouped", "plain", "plain"], proc.stdout
    assert all(float(r[-2]) > 0 for r in runs), proc.stdout  # wall µs per job
    for kind in ("plain", "grouped"):
        assert any(line.startswith(f"  {kind} ") and "server CPU" in line for line in proc.stdout.splitlines()), proc.stdout
    assert "grouped - plain:" in proc.stdout, proc.stdout
    assert schemas() - before == set(), "schemas left behind"
