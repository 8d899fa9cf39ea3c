"""Relay fan-out benchmark (issue #30): one publisher to 10 subscribers, bullmq-compat against Node
BullMQ 6.7.0, on Redis and on PostgreSQL.

    .venv/bin/python scripts/bench_relay.py [--messages 5000] [--rounds 3] [--subscribers 10]
                                            [--backends redis,postgres] [--postgres-url URL]
                                            [--quick] [--json out.json]

Each run is a fresh process of one implementation holding 11 relays, each its own node with its
own connection(s): 10 subscribers, each subscribed to the exact topic ``bench.fanout``, and one
publisher (no subscription). Both implementations do the same:

  node      node interop/bench_relay.js '<json>'                 (bullmq's Relay; on PostgreSQL
                                                                   createPostgresRelayBackend)
  python    .venv/bin/python scripts/bench_relay.py --runner '<json>'   (bullmq_compat.Relay)

A run: all relays ready and subscribed; a warm-up of 50 messages (not measured: scripts loaded,
readers blocking), then

  throughput  N messages (--messages, default 5,000) published one after the other (sequential
              awaits, as fast as they go), each with data {"i": i, "t": <publish time, ms since the
              epoch as a float: performance.timeOrigin + performance.now() / time.time() * 1000>};
              publish rate = N / (last publish returned - first publish started), delivery rate =
              deliveries / (last delivery - first publish started), latency = delivery time - t
              (same process, same clock), p50/p99 (nearest rank) over the N x 10 deliveries. This
              latency is mostly queueing (the publisher outruns the readers or not).
  latency     200 messages/s for 2 s (400 messages, 4,000 deliveries): latency p50/p99 with the
              readers mostly idle -- what one message costs end to end.

The runner's CPU (user+sys) over the throughput phase gives client CPU us per delivery. A run waits
for every delivery, or until none arrived for 10 s (the relay is at most once: missing deliveries are
reported, never hidden).

Redis: a redis-server of this script's own on a free loopback port (tests._redis_server), flushed
before every run and stopped at the end. PostgreSQL (on when the server of --postgres-url, else
POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/test answers; else skipped with a note):
every run gets a fresh schema bench_relay_<hex> migrated with bullmq_compat.migrate_postgres, dropped
after the run. Rounds alternate the order of the implementations (python first in even rounds, node
first in odd ones), so drift of the machine hits both alike.

Prints, per backend, | backend | row | Node | Python | Python / Node |: medians over the rounds,
and the median of the per-round ratios (for latency and CPU, above 1 means Python is slower).
--quick: 1,000 messages, 1 round, a 1 s latency phase.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOPIC = "bench.fanout"
IMPLS = ("node", "python")
RUN_TIMEOUT = 600
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


# -- the Python runner -----------------------------------------------------------------------------
async def run_python(args: dict[str, Any]) -> dict[str, Any]:
    from bullmq_compat import Relay

    errors: list[str] = []
    subscribers: int = args["subscribers"]
    connection = args["postgres"] if args["backend"] == "postgres" else args["redis"]
    extra: dict[str, Any] = {"schema": args["schema"]} if args["backend"] == "postgres" else {}

    def make(node_id: str) -> Relay:
        relay = Relay(connection, namespace=args["namespace"], node_id=node_id,
                      inbox_max_length=args["inboxMaxLength"], **extra)
        relay.on("error", lambda err: errors.append(str(err)))
        return relay

    relays = [make(f"sub{s}") for s in range(subscribers)]
    publisher = make("pub")
    relays.append(publisher)
    phase: dict[str, Any] = {"lo": 0, "hi": 0}

    def on_message(message: Any) -> None:
        now = time.time() * 1000
        p = phase
        data = message.data
        if p["lo"] <= data["i"] < p["hi"]:
            p["count"] += 1
            p["last"] = now
            p["latencies"].append(round(now - data["t"], 3))
            if p["count"] >= p["expected"]:
                p["done"].set()

    next_i = 0

    def start_phase(count: int) -> dict[str, Any]:
        nonlocal next_i, phase
        phase = {"lo": next_i, "hi": next_i + count, "expected": count * subscribers, "count": 0, "last": 0.0,
                 "latencies": [], "done": asyncio.Event()}
        next_i += count
        return phase

    async def wait_deliveries(p: dict[str, Any]) -> None:
        seen = -1
        while p["count"] < p["expected"] and p["count"] != seen:
            seen = p["count"]
            try:
                await asyncio.wait_for(p["done"].wait(), args["idleTimeoutMs"] / 1000)
            except asyncio.TimeoutError:
                pass

    try:
        await asyncio.gather(*(r.wait_until_ready() for r in relays))
        for relay in relays[:subscribers]:
            await relay.subscribe(TOPIC, on_message)

        if args["warmup"] > 0:
            p = start_phase(args["warmup"])
            for i in range(p["lo"], p["hi"]):
                await publisher.publish(TOPIC, {"i": i, "t": time.time() * 1000})
            await wait_deliveries(p)

        tp = start_phase(args["messages"])
        cpu0 = time.process_time()
        t0 = time.time() * 1000
        for i in range(tp["lo"], tp["hi"]):
            await publisher.publish(TOPIC, {"i": i, "t": time.time() * 1000})
        published = time.time() * 1000
        await wait_deliveries(tp)
        cpu = time.process_time() - cpu0
        throughput = {"published": args["messages"], "publishSeconds": (published - t0) / 1000,
                      "expected": tp["expected"], "deliveries": tp["count"],
                      "deliverySeconds": ((tp["last"] or published) - t0) / 1000, "cpuMs": cpu * 1000,
                      "latencies": tp["latencies"]}

        count = max(1, round(args["latencyRate"] * args["latencySeconds"]))
        lp = start_phase(count)
        interval = 1000 / args["latencyRate"]
        l0 = time.time() * 1000
        for k in range(count):
            wait = l0 + k * interval - time.time() * 1000
            if wait > 0:
                await asyncio.sleep(wait / 1000)
            await publisher.publish(TOPIC, {"i": lp["lo"] + k, "t": time.time() * 1000})
        await wait_deliveries(lp)
        latency = {"published": count, "expected": lp["expected"], "deliveries": lp["count"],
                   "latencies": lp["latencies"]}
        return {"throughput": throughput, "latency": latency, "errors": errors[:10]}
    finally:
        await asyncio.gather(*(r.close() for r in relays), return_exceptions=True)


def runner_main(text: str) -> int:
    try:
        out = asyncio.run(run_python(json.loads(text)))
    except Exception as err:  # noqa: BLE001 -- reported to the driver
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return 1
    print(json.dumps(out))
    return 0


# -- the driver ------------------------------------------------------------------------------------
def percentile(values: list[float], pct: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def postgres_answers(url: str) -> Optional[str]:
    """None if PostgreSQL answers at ``url``, else why not."""
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as err:  # noqa: BLE001 -- any failure: skipped with the reason
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def runner_argv(impl: str) -> list[str]:
    if impl == "node":
        return [shutil.which("node") or "node", str(ROOT / "interop" / "bench_relay.js")]
    return [sys.executable, str(Path(__file__).resolve()), "--runner"]


def run_once(impl: str, backend: str, cfg: dict[str, Any], redis_url: Optional[str],
             postgres_url: Optional[str]) -> dict[str, Any]:
    args = {**cfg, "backend": backend, "namespace": f"bench-{uuid.uuid4().hex[:8]}"}
    schema = None
    if backend == "postgres":
        from bullmq_compat import migrate_postgres

        assert postgres_url
        schema = f"bench_relay_{uuid.uuid4().hex[:10]}"
        asyncio.run(migrate_postgres(postgres_url, schema))
        args.update(postgres=postgres_url, schema=schema)
    else:
        assert redis_url
        import redis

        client = redis.Redis.from_url(redis_url)
        client.flushall()
        client.close()
        args["redis"] = redis_url
    try:
        proc = subprocess.run([*runner_argv(impl), json.dumps(args)], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        if schema is not None:
            assert postgres_url
            drop_schema(postgres_url, schema)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"{impl}: exit {proc.returncode}, no JSON; stderr: {proc.stderr.strip()[-2000:]}") from None
    if "error" in out or proc.returncode != 0:
        raise RuntimeError(f"{impl}: exit {proc.returncode}: {out.get('error', '')} {proc.stderr.strip()[-2000:]}")
    tp, lat = out["throughput"], out["latency"]
    row: dict[str, Any] = {
        "publishRate": tp["published"] / tp["publishSeconds"],
        "deliveryRate": tp["deliveries"] / tp["deliverySeconds"] if tp["deliverySeconds"] > 0 else 0.0,
        "deliveries": tp["deliveries"], "expected": tp["expected"],
        "cpuUsPerDelivery": tp["cpuMs"] * 1000 / max(1, tp["deliveries"]),
        "loadP50Ms": percentile(tp["latencies"], 50) if tp["latencies"] else None,
        "loadP99Ms": percentile(tp["latencies"], 99) if tp["latencies"] else None,
        "latencyDeliveries": lat["deliveries"], "latencyExpected": lat["expected"],
        "p50Ms": percentile(lat["latencies"], 50) if lat["latencies"] else None,
        "p99Ms": percentile(lat["latencies"], 99) if lat["latencies"] else None,
        "errors": out.get("errors", []),
    }
    return row


#: (key, label, format) of the table's rows
ROWS = (
    ("publishRate", "publish, messages/s (one publisher, sequential awaits)", "{:,.0f}"),
    ("deliveryRate", "deliveries/s (10 subscribers)", "{:,.0f}"),
    ("cpuUsPerDelivery", "runner CPU µs per delivery", "{:,.1f}"),
    ("loadP50Ms", "publish→deliver p50, ms, at full rate (queueing)", "{:,.2f}"),
    ("loadP99Ms", "publish→deliver p99, ms, at full rate (queueing)", "{:,.2f}"),
    ("p50Ms", "publish→deliver p50, ms, at {rate} msg/s", "{:,.2f}"),
    ("p99Ms", "publish→deliver p99, ms, at {rate} msg/s", "{:,.2f}"),
)


def summarize(runs: dict[str, list[dict[str, Any]]], key: str) -> tuple[Optional[float], Optional[float],
                                                                         Optional[float]]:
    node = [r[key] for r in runs["node"] if r.get(key) is not None]
    py = [r[key] for r in runs["python"] if r.get(key) is not None]
    ratios = [p[key] / n[key] for p, n in zip(runs["python"], runs["node"])
              if p.get(key) is not None and n.get(key)]
    return (statistics.median(node) if node else None, statistics.median(py) if py else None,
            statistics.median(ratios) if ratios else None)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--runner":
        return runner_main(sys.argv[2] if len(sys.argv) > 2 else "{}")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=None, help="messages of the throughput phase (5,000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (3)")
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--latency-rate", type=int, default=200, help="messages/s of the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=None, help="length of the latency phase (2)")
    parser.add_argument("--backends", default="redis,postgres")
    parser.add_argument("--postgres-url", default=os.environ.get("POSTGRES_URL", DEFAULT_POSTGRES))
    parser.add_argument("--quick", action="store_true", help="1,000 messages, 1 round, 1 s of latency phase")
    parser.add_argument("--json", help="write every run's figures to this file")
    opts = parser.parse_args()
    messages = opts.messages if opts.messages is not None else (1000 if opts.quick else 5000)
    rounds = opts.rounds if opts.rounds is not None else (1 if opts.quick else 3)
    latency_seconds = opts.latency_seconds if opts.latency_seconds is not None else (1.0 if opts.quick else 2.0)
    backends = [b.strip() for b in opts.backends.split(",") if b.strip()]
    if messages < 1 or rounds < 1 or opts.subscribers < 1 or opts.latency_rate < 1 or latency_seconds <= 0:
        parser.error("--messages, --rounds, --subscribers, --latency-rate and --latency-seconds must be positive")
    unknown = set(backends) - {"redis", "postgres"}
    if unknown or not backends:
        parser.error(f"--backends: redis and/or postgres (got {opts.backends!r})")
    if shutil.which("node") is None or not (ROOT / "interop" / "node_modules" / "bullmq").is_dir():
        print("Relay bench: skipped, node or interop/node_modules is missing (make interop)")
        return 0
    cfg = {"subscribers": opts.subscribers, "messages": messages, "warmup": 50, "latencyRate": opts.latency_rate,
           "latencySeconds": latency_seconds, "inboxMaxLength": max(10000, 2 * (messages + 50)),
           "idleTimeoutMs": 10000}

    if "postgres" in backends:
        why_not = postgres_answers(opts.postgres_url)
        if why_not:
            print(f"NOTE: Relay bench on PostgreSQL skipped: nothing answers at {opts.postgres_url} ({why_not})")
            backends.remove("postgres")
    if not backends:
        return 0

    from tests._redis_server import RedisServer

    server = RedisServer().start() if "redis" in backends else None
    doc: dict[str, Any] = {"config": {**cfg, "rounds": rounds, "backends": backends},
                           "machine": {"cpu": platform.processor() or platform.machine(),
                                       "cores": os.cpu_count(), "python": platform.python_version(),
                                       "loadAverageAtStart": load_average()},
                           "runs": {}}
    failed = False
    started = time.time()
    print(f"Relay fan-out: 1 publisher -> {opts.subscribers} subscribers, {messages:,} messages "
          f"(+ {cfg['latencyRate']} msg/s for {latency_seconds:g} s), {rounds} round(s); "
          f"load average {load_average()}", flush=True)
    try:
        for backend in backends:
            runs: dict[str, list[dict[str, Any]]] = {"node": [], "python": []}
            doc["runs"][backend] = runs
            for r in range(rounds):
                order = ("python", "node") if r % 2 == 0 else ("node", "python")
                for impl in order:
                    try:
                        row = run_once(impl, backend, cfg, server.url if server else None, opts.postgres_url)
                    except (RuntimeError, subprocess.TimeoutExpired) as err:
                        print(f"  {backend} round {r + 1} {impl}: FAILED {err}", flush=True)
                        failed = True
                        continue
                    runs[impl].append(row)
                    lost = row["expected"] - row["deliveries"] + row["latencyExpected"] - row["latencyDeliveries"]
                    print(f"  {backend} round {r + 1} {impl:6}: publish {row['publishRate']:,.0f}/s, "
                          f"deliver {row['deliveryRate']:,.0f}/s, CPU {row['cpuUsPerDelivery']:.1f} µs/delivery, "
                          f"load p50/p99 {row['loadP50Ms']:.1f}/{row['loadP99Ms']:.1f} ms, "
                          f"{cfg['latencyRate']}/s p50/p99 {row['p50Ms']:.2f}/{row['p99Ms']:.2f} ms"
                          + (f", LOST {lost} deliveries" if lost else "")
                          + (f", errors: {row['errors'][:3]}" if row["errors"] else ""), flush=True)
    finally:
        if server is not None:
            server.stop()

    print(f"\nRelay, median of {rounds} round(s); Python / Node: median of the per-round ratios "
          f"(latency and CPU: above 1 = Python slower); load average at the end {load_average()}, "
          f"{time.time() - started:.0f} s\n")
    print("| backend | row | Node | Python | Python / Node |")
    print("|---|---|---|---|---|")
    for backend in backends:
        runs = doc["runs"][backend]
        label_backend = "Redis" if backend == "redis" else "PostgreSQL"
        for key, label, fmt in ROWS:
            node, py, ratio = summarize(runs, key)
            cells = [fmt.format(v) if v is not None else "n/a" for v in (node, py)]
            print(f"| {label_backend} | {label.format(rate=cfg['latencyRate'])} | {cells[0]} | {cells[1]} | "
                  f"{'n/a' if ratio is None else f'{ratio:.2f}×'} |")
    if opts.json:
        Path(opts.json).write_text(json.dumps(doc, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
