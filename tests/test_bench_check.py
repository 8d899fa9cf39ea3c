"""scripts/bench.py --check: which rows it names as missed, on made-up medians (no benchmark runs).

A PostgreSQL row of PG_TARGETS misses when ours / Node's per-round ratio (median of >= 3 rounds) is
below its target or our client CPU per job is above Node's; a Redis row the other Python queues ran
misses when bullmq-compat is below PEER_GOAL x the fastest of them (for latency: their p50 over ours).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_script", ROOT / "scripts" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_script", module)
    spec.loader.exec_module(module)
    return module


def jobs(per_sec: float, cpu: float = 10.0) -> dict[str, Any]:
    return {"jobsPerSec": {"median": per_sec}, "clientCpuUsPerJob": {"median": cpu}}


def latency(p50: float, p99: float) -> dict[str, Any]:
    return {"p50Ms": {"median": p50}, "p99Ms": {"median": p99}}


def test_check_names_the_rows_that_miss_and_only_those() -> None:
    b = bench()
    plan = [b.Measurement("add", "add", "add", 100), b.Measurement("process-c10", "c10", "process", 100, concurrency=10),
            b.Measurement("latency", "latency", "latency", 10),
            b.Measurement("pg-add", "pg add", "add", 100, backend="postgres"),
            b.Measurement("pg-process-c10", "pg c10", "process", 100, concurrency=10, backend="postgres")]
    impls = [b.Impl("compat", "bullmq-compat", []), b.Impl("node", "node", []), b.Impl("arq", "arq", []),
             b.Impl("dramatiq", "Dramatiq", [])]
    summary = {
        "add": {"compat": jobs(10_000), "arq": jobs(2_000), "dramatiq": jobs(5_000)},          # 2.0x: met
        "process-c10": {"compat": jobs(7_000), "arq": jobs(1_000), "dramatiq": jobs(4_000)},   # 1.75x: missed
        "latency": {"compat": latency(1.0, 2.0), "arq": latency(1.5, 3.0), "dramatiq": latency(8.0, 90.0)},
        "pg-add": {"compat": jobs(1_300, cpu=100), "node": jobs(1_000, cpu=300)},               # 1.3x: met
        "pg-process-c10": {"compat": jobs(1_400, cpu=320), "node": jobs(1_000, cpu=300)},       # 1.4x, CPU above
    }

    cells = {key: {"compat": b.Cell(runs=[{"round": i, "jobsPerSec": r} for i, r in enumerate(rounds)]),
                   "node": b.Cell(runs=[{"round": i, "jobsPerSec": 1.0} for i in range(len(rounds))])}
             for key, rounds in (("pg-add", [1.3, 1.2, 1.4]), ("pg-process-c10", [1.4, 1.4, 1.4]))}
    misses = b.check_targets(plan, summary, cells, impls)
    assert [line.split(":")[0] for line in misses] == ["process-c10", "latency", "pg-process-c10", "pg-process-c10"]
    assert "1.75" in misses[0] and "Dramatiq" in misses[0]
    assert "1.50" in misses[1] and "arq" in misses[1]  # their p50 1.5 over our 1.0
    assert "below the target 1.5x" in misses[2]
    assert "client CPU 320.0 us/job above Node's 300.0" in misses[3]
    # without the peers' results (a --no-peers run) only the PostgreSQL rows are judged
    assert [line.split(":")[0] for line in b.check_targets(plan, summary, cells)] == ["pg-process-c10"] * 2
