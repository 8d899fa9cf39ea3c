"""The commit ceiling of scripts/bench.py's PostgreSQL rows: pgbench running the row's transactions.

    .venv/bin/python scripts/bench_pg_ceiling.py '<json>'

Same input and output as scripts/bench_compat.py with {postgres, schema}: the schema is migrated
(untimed) with bullmq-compat's migrator (upstream's migrations), then ``pgbench -n -M prepared -f``
runs the row's transaction shape on the same server, with the row's client count, one pgbench
thread (a single process, as every client of the bench), and the server's synchronous_commit (as
the rows use). The script is upstream's command text itself (its comment lines dropped), each
``$N`` a pgbench variable set with ``-D`` (an SQL NULL or, for add_bulk's 1,000-entry array, a
literal in the text):

  add      one ``add_job`` per transaction (the 15 arguments Queue.add sends), 1 client
  addBulk  one ``add_jobs_bulk`` of ``batch`` entries per transaction, 1 client (at least 30
           transactions, whatever the row's job count); the array is a literal in the script, sent
           with ``-M extended`` (unnamed: parsed at every call, as the clients' parameter is)
  process  (pre-loaded with add_jobs_bulk, untimed) ``concurrency`` clients; each one's first
           transaction is ``move_to_active``, then one ``move_to_completed_fetch`` per
           transaction, with the id the previous one claimed (``\\gset``): one job per commit, as
           Node's worker and ours at concurrency 1 (ours batches several slots' calls into one
           commit when they queue, so at concurrency 10 it can pass this ceiling)

Out: seconds = transactions / pgbench's tps (without connection time), jobs = transactions x jobs
per transaction, so the harness's jobs/s is what the server allows for that shape; the CPU is
pgbench's own (a C client over libpq), for comparison.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LOCK_MS = 30000


def pgbench_path() -> Optional[str]:
    """pgbench on PATH, else under Debian's /usr/lib/postgresql/<major>/bin; None when missing."""
    found = shutil.which("pgbench")
    if found:
        return found
    base = "/usr/lib/postgresql"
    try:
        majors = sorted(os.listdir(base), key=lambda v: int(v) if v.isdigit() else 0, reverse=True)
    except OSError:
        return None
    for major in majors:
        path = os.path.join(base, major, "bin", "pgbench")
        if os.access(path, os.X_OK):
            return path
    return None


def command_text(name: str) -> str:
    from bullmq_compat._backends.postgres import sql

    return "\n".join(line for line in sql.command(name).splitlines() if not line.lstrip().startswith("--"))


def literal(value: Any) -> str:
    if value is None:
        return "NULL"
    return "'" + str(value).replace("'", "''") + "'"


def bind(name: str, params: list[Any], variables: dict[str, str], prefix: str,
         literals: frozenset[int] = frozenset()) -> str:
    """Upstream's ``name`` with ``$N`` as ``:<prefix>N`` (its value into ``variables``), NULL, a literal
    for the positions in ``literals``, or the given pgbench expression for a value ``(":id",)``."""
    def one(match: "re.Match[str]") -> str:
        n = int(match.group(1))
        value = params[n - 1]
        if isinstance(value, tuple):
            return str(value[0])
        if value is None:
            return "NULL"
        if n in literals or value == "":  # pgbench takes no empty -D value
            return literal(value)
        variables[f"{prefix}{n}"] = "t" if value is True else "f" if value is False else str(value)
        return f":{prefix}{n}"

    text = re.sub(r"\$(\d+)", one, command_text(name)).strip()
    return text if text.endswith(";") else text + ";"


def bulk_json(queue: str, start: int, count: int, stamp: int) -> str:
    """The entries Queue.add_bulk sends, with a space after each ':' (in pgbench's script text a
    ':' before a name is a variable); the server stores the same jsonb."""
    dumps = json.JSONEncoder(separators=(",", ": "), ensure_ascii=False).encode
    return dumps([{"queue": queue, "id": "", "name": "bench", "data": dumps({"i": i}), "opts": {"attempts": 0},
                   "priority": 0, "delay": 0, "timestamp": stamp, "attempts": 0, "parentQueue": None,
                   "parentId": None, "parentKey": None, "dedupId": None, "schedulerId": None, "lifo": False,
                   "addToWaitingChildren": False} for i in range(start, start + count)])


def preload(url: str, schema: str, queue: str, jobs: int) -> None:
    import psycopg

    from bullmq_compat._backends.postgres import sql
    from bullmq_compat._backends.postgres.connection import _connect_kwargs

    params, _ = _connect_kwargs(url, schema)
    stamp = int(time.time() * 1000)
    with psycopg.connect(**params, autocommit=True) as conn, psycopg.RawCursor(conn) as cur:
        for start in range(0, jobs, 1000):
            cur.execute(sql.command("add_jobs_bulk"), [queue, bulk_json(queue, start, min(1000, jobs - start), stamp)])


def main() -> None:
    args = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    try:
        out = measure(args)
    except Exception as err:  # noqa: BLE001 -- one line of JSON for the harness
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


def measure(args: dict[str, Any]) -> dict[str, Any]:
    from bullmq_compat import migrate_postgres

    pgbench = pgbench_path()
    if pgbench is None:
        raise RuntimeError("pgbench is not installed (Debian: postgresql-client / postgresql-contrib)")
    url, schema, queue, op = args["postgres"], args["schema"], args["queue"], args["op"]
    jobs = int(args["jobs"])
    asyncio.run(migrate_postgres(url, schema))
    stamp = int(time.time() * 1000)
    variables: dict[str, str] = {}
    clients, per_tx, mode = 1, 1, "prepared"
    if op == "add":
        script = bind("add_job", [queue, "", "bench", '{"i":1}', '{"attempts":0}', 0, 0, stamp, 0, None, None, None,
                                  None, None, False], variables, "a")
        transactions = jobs
    elif op == "addBulk":
        per_tx = int(args.get("batch") or 1000)
        script = bind("add_jobs_bulk", [queue, bulk_json(queue, 0, per_tx, stamp)], variables, "b",
                      literals=frozenset({2}))
        transactions = max(30, jobs // per_tx)  # a few seconds, not a handful of statements
        # the array is a literal (too long for -D): a prepared statement would parse it once, at
        # PREPARE; sent unnamed (extended), the server parses it at every call, as it does the
        # clients' parameter
        mode = "extended"
    elif op == "process":
        clients = int(args.get("concurrency") or 1)
        transactions = -(-jobs // clients)
        preload(url, schema, queue, transactions * clients + clients)  # every fetch finds a next job
        claim = bind("move_to_active", [queue, "tok", LOCK_MS, stamp, "ceiling", None, None], variables, "c")
        finish = bind("move_to_completed_fetch", [queue, (":id",), "tok", "null", stamp, bool(args.get(
            "removeOnComplete")), None, None, LOCK_MS, stamp, "ceiling", None, None], variables, "f")
        script = f"\\if :id = 0\n{claim}\n\\gset\n\\else\n{finish}\n\\gset\n\\endif\n"
        variables["id"] = "0"
    else:
        raise ValueError(f"no commit ceiling for op {op!r}")
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script + "\n")
        path = f.name
    argv = [pgbench, "-n", "-M", mode, "-f", path, "-c", str(clients), "-j", "1", "-t", str(transactions)]
    for key, value in variables.items():
        argv += ["-D", f"{key}={value}"]
    env = {**os.environ, "PGOPTIONS": f"{os.environ.get('PGOPTIONS', '')} -c search_path={schema}".strip()}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run([*argv, url], capture_output=True, text=True, timeout=600, env=env)
    finally:
        os.unlink(path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    processed = re.search(r"actually processed: (\d+)/(\d+)", done.stdout)
    if done.returncode != 0 or tps is None or processed is None or processed.group(1) != processed.group(2):
        raise RuntimeError(f"pgbench failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[:300]}")
    total_tx = int(processed.group(1))
    rate = float(tps.group(1))
    return {"seconds": total_tx / rate, "jobs": total_tx * per_tx, "cpuUserMs": (after.ru_utime - before.ru_utime) * 1000,
            "cpuSysMs": (after.ru_stime - before.ru_stime) * 1000, "tps": rate, "jobsPerTransaction": per_tx,
            "clients": clients}


if __name__ == "__main__":
    main()
