"""The PostgreSQL floor of scripts/bench.py: a bare loop over upstream's SQL commands.

    .venv/bin/python scripts/bench_pg_floor.py '<json>'

Same input and output as scripts/bench_compat.py with {postgres, schema} (its harness runs this
too, same timing), but instead of the library the very statements bullmq-compat sends, with the
same arguments, on one of the product's raw-libpq sessions (`_backends/postgres/lanes.py`'s
`Lane`: connected by psycopg with the schema's search_path, then each command prepared once and
sent with PQsendQueryPrepared, text parameters, replies read as text):

  add      one ``add_job`` per job (the 15 parameters Queue.add sends for a job without options),
           awaited one at a time: one statement, one commit per job
  addBulk  one ``add_jobs_bulk`` per batch, its JSON array of entries built and encoded here as
           Queue.add_bulk's are (every key Node's toBatchEntry writes)
  process  (pre-loaded with add_jobs_bulk, untimed) the worker's sessions -- as many as the
           product opens for that concurrency (half of it, at least 1) -- each serving its share
           of the ``concurrency`` slots: ``move_to_active`` for each slot, then per job
           ``move_to_completed_fetch`` (which claims the next job); a session with several slots
           sends their calls together, pipelined as BEGIN, the calls, COMMIT (one round trip, one
           commit: the group commit the product makes when every slot has finished), until the
           queue is empty. At concurrency 1: one call, one commit per job.

Kept honest: every reply read and checked (the id of each add; each claimed job's data and
options decoded from JSON), a no-op ``async`` processor awaited per job and the harness's
'completed' callback called. Left out is what a product adds around that: Job objects, option
normalisation, events, lock renewal, the stalled checker, the LISTEN wake-ups (the loops stop when
the queue is empty; jobs are pre-loaded). The latency measurement and the group rows have no floor.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from bench_compat import Adapter, run  # noqa: E402

LOCK_MS = 30000  # the worker's default lock duration, as the product sends it


def _fail_fast(task: "asyncio.Task[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        print(json.dumps({"error": f"floor loop failed: {task.exception()!r}"}), flush=True)
        os._exit(1)


class PgFloorAdapter(Adapter):
    def __init__(self, args: dict[str, Any]) -> None:
        if not args.get("postgres"):
            raise ValueError("this floor runs on PostgreSQL only (scripts/bench_floor.py is Redis's)")
        if args.get("op") == "latency" or args.get("groups") or args.get("pgGroups"):
            raise ValueError("the latency measurement and the group rows have no floor")
        self.args = args
        self.queue = args["queue"]
        self.dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        self.loads = json.JSONDecoder().decode
        self.lane: Any = None
        self.lanes: list[Any] = []
        self.loops: list[asyncio.Task[None]] = []
        self.worker_name = f"floor-{uuid.uuid4().hex[:8]}"

    async def _session(self) -> Any:
        import psycopg

        from bullmq_compat._backends.postgres.connection import _connect_kwargs
        from bullmq_compat._backends.postgres.lanes import Lane

        params, _ = _connect_kwargs(self.args["postgres"], self.args["schema"])
        conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
        return Lane(conn)

    async def queue_ready(self) -> None:
        from bullmq_compat import migrate_postgres

        await migrate_postgres(self.args["postgres"], self.args["schema"])  # untimed, as the clients'
        self.lane = await self._session()

    # -- adding: what Queue.add / add_bulk send for a job without options (Node's defaults: attempts 0)
    async def add(self, i: int) -> Any:
        found = await self.lane.run("add_job", [self.queue, "", "bench", self.dumps({"i": i}), '{"attempts":0}', 0, 0,
                                                int(time.time() * 1000), 0, None, None, None, None, None, False])
        if not found or not found[0]["id"]:
            raise RuntimeError(f"add_job answered {found!r}")
        return found[0]["id"]

    async def add_bulk(self, items: list[dict[str, Any]]) -> Any:
        queue, dumps, stamp = self.queue, self.dumps, int(time.time() * 1000)
        entries = [{"queue": queue, "id": "", "name": item["name"], "data": dumps(item.get("data")),
                    "opts": {"attempts": 0}, "priority": 0, "delay": 0, "timestamp": stamp, "attempts": 0,
                    "parentQueue": None, "parentId": None, "parentKey": None, "dedupId": None, "schedulerId": None,
                    "lifo": False, "addToWaitingChildren": False} for item in items]
        found = await self.lane.run("add_jobs_bulk", [queue, dumps(entries)])
        if len(found) != len(items):
            raise RuntimeError(f"add_jobs_bulk answered {len(found)} ids for {len(items)} jobs")
        return found

    async def close_queue(self) -> None:
        for lane in [self.lane, *self.lanes]:
            if lane is not None:
                lane.detach()
                await lane.conn.close()

    # -- processing ------------------------------------------------------------------------------
    def make_worker(self, on_start: Optional[Callable[[Any], None]], concurrency: int,
                    remove_on_complete: bool, on_completed: Callable[..., None]) -> None:
        self.concurrency = concurrency
        self.remove_all = bool(remove_on_complete)
        self.on_completed = on_completed

    async def worker_ready(self) -> None:
        from bullmq_compat._backends.postgres.worker import lane_count

        self.lanes = [await self._session() for _ in range(lane_count({"concurrency": self.concurrency}))]

    def start_worker(self) -> None:
        slots = [[f"{self.worker_name}:{s}" for s in range(self.concurrency) if s % len(self.lanes) == n]
                 for n in range(len(self.lanes))]
        self.loops = [asyncio.ensure_future(self._loop(lane, tokens)) for lane, tokens in zip(self.lanes, slots)]
        for task in self.loops:
            task.add_done_callback(_fail_fast)

    async def _calls(self, lane: Any, calls: list[tuple[str, list[Any]]]) -> list[list[dict[str, Any]]]:
        if len(calls) == 1:
            return [await lane.run(*calls[0])]
        answers = await lane.run_batch(calls)
        if answers is None:
            raise RuntimeError("a batch of claims / finishes failed")
        return list(answers)

    async def _loop(self, lane: Any, tokens: list[str]) -> None:
        queue, name, loads, on_completed = self.queue, self.worker_name, self.loads, self.on_completed

        async def process(data: Any) -> Any:
            return None

        now = int(time.time() * 1000)
        replies = await self._calls(lane, [("move_to_active", [queue, token, LOCK_MS, now, name, None, None])
                                           for token in tokens])
        held = [(token, found[0]) for token, found in zip(tokens, replies) if found]
        while held:
            calls = []
            for token, row in held:
                loads(row["opts"] or "{}")
                result = await process(loads(row["data"] or "{}"))
                now = int(time.time() * 1000)
                # the finish and the claim of the next job in one call (as the product's worker)
                calls.append(("move_to_completed_fetch", [queue, row["id"], token, self.dumps(result), now,
                                                          self.remove_all, None, None, LOCK_MS, now, name, None,
                                                          None]))
            replies = await self._calls(lane, calls)
            for _ in replies:
                on_completed()
            held = [(token, found[0]) for (token, _), found in zip(held, replies) if found]

    async def close_worker(self) -> None:
        for task in self.loops:
            await task


if __name__ == "__main__":
    run(PgFloorAdapter)
