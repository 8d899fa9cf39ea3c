"""The floor of scripts/bench.py: what this machine allows a Python client of these upstream scripts.

    .venv/bin/python scripts/bench_floor.py '<json>'

Same input and output as scripts/bench_compat.py (its harness runs this too: same timing, same
Redis figures), but instead of the library a bare loop over the very calls bullmq-compat sends:

  add      one addStandardJob EVALSHA per job, awaited one at a time
  addBulk  1,000 addStandardJob EVALSHAs a batch, written together, awaited together
  process  (pre-loaded in bulk, untimed) ``concurrency`` loops, each: moveToActive, then per job
           moveToFinished with fetchNext=1 (which hands back the next job), until the queue is empty

Kept honest, so that it is a floor the product could reach and not a trick: the same upstream
scripts (loaded byte-identical from the npm tarball), the same keys, arguments and msgpack
option packs as the product sends, over the product's own pipelining connection (hiredis
framing, replies decoded to str in C); a lock token per moveToActive (the jobs fetched by moveToFinished
keep it, as in the product); every reply read,
checked and the job's data decoded from JSON; a no-op ``async`` processor awaited for each job,
and the harness's 'completed' callback called. Left out is what a product must add around
that, and which is what the floor measures: Job objects, option normalisation, events, lock
renewal, the stalled checker, the marker wait (the loops stop when the queue is empty; jobs are
pre-loaded), retries on connection trouble. The latency measurement has no floor (it waits).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any, Awaitable, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from bench_compat import JOB_NAME, Adapter, run  # noqa: E402


def _fail_fast(task: "asyncio.Task[None]") -> None:
    """A loop that failed would leave the harness waiting for completions that never come: report
    the error as the harness does (one line of JSON) and stop."""
    if not task.cancelled() and task.exception() is not None:
        err = task.exception()
        print(json.dumps({"error": f"floor loop failed: {err!r}"}), flush=True)
        os._exit(1)


class FloorAdapter(Adapter):
    def __init__(self, args: dict[str, Any]) -> None:
        if args.get("postgres"):
            raise ValueError("the floor runs on Redis only")
        if args.get("op") == "latency":
            raise ValueError("the latency measurement has no floor")
        if args.get("groups"):
            raise ValueError("the floor has no group gate")
        import msgpack

        from bullmq_compat._backends.redis.keys import QueueKeys
        from bullmq_compat._backends.redis.lua import upstream_scripts

        self.args = args
        self.pack = msgpack.Packer(use_bin_type=True).pack
        k = self.keys = QueueKeys("bull", args["queue"])
        scripts = upstream_scripts()
        self.add_script = scripts["addStandardJob"]
        self.active_script = scripts["moveToActive"]
        self.finished_script = scripts["moveToFinished"]
        self.add_keys = [k.wait, k.paused, k.meta, k.id, k.completed, k.delayed, k.active, k.events, k.marker]
        self.active_keys = [k.wait, k.active, k.prioritized, k.events, k.stalled, k.limiter, k.delayed, k.paused,
                            k.meta, k.pc, k.marker]
        self.finished_head = [k.wait, k.active, k.prioritized, k.events, k.stalled, k.limiter, k.delayed, k.paused,
                              k.meta, k.pc, k.completed]
        self.finished_tail = [k["metrics:completed"], k.marker]
        self.dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        self.loads = json.JSONDecoder().decode
        self.conn: Any = None
        self.loops: list[asyncio.Task[None]] = []
        self.worker_id = str(uuid.uuid4())
        self.seq = 0

    async def queue_ready(self) -> None:
        from redis.asyncio import Redis

        from bullmq_compat._backends.redis.fastconn import FastConnection

        client = Redis.from_url(self.args["redis"])
        try:
            self.conn = await FastConnection.from_redis_py(client, decode=True)
        finally:
            await client.aclose()
        for script in (self.add_script, self.active_script, self.finished_script):
            await self.conn.execute("SCRIPT", "LOAD", script.lua)

    # -- adding: addStandardJob with the arguments the product sends for a job without options
    #    (Node's defaults merged in: attempts 0)
    def _add(self, name: str, data: Any) -> Awaitable[Any]:
        keys = self.keys
        packed = self.pack([keys.prefix_key, "", name, int(time.time() * 1000), None, None, None, None, None, None])
        return self.conn.execute("EVALSHA", self.add_script.sha, self.add_script.num_keys, *self.add_keys, packed,
                                 self.dumps(data), self.pack({"attempts": 0}))

    async def add(self, i: int) -> Any:
        job_id = await self._add(JOB_NAME, {"i": i})
        if not isinstance(job_id, str):
            raise RuntimeError(f"addStandardJob answered {job_id!r}")
        return job_id

    async def add_bulk(self, items: list[dict[str, Any]]) -> Any:
        futures = [self._add(item["name"], item.get("data")) for item in items]
        for future in futures:
            job_id = await future
            if not isinstance(job_id, str):
                raise RuntimeError(f"addStandardJob answered {job_id!r}")
        return futures

    async def close_queue(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    # -- processing ------------------------------------------------------------------------------
    def make_worker(self, on_start: Optional[Callable[[Any], None]], concurrency: int,
                    remove_on_complete: bool, on_completed: Callable[..., None]) -> None:
        self.concurrency = concurrency
        self.keep = {"count": 0 if remove_on_complete else -1}
        self.on_completed = on_completed

    async def worker_ready(self) -> None:
        pass

    def start_worker(self) -> None:
        self.loops = [asyncio.ensure_future(self._loop()) for _ in range(self.concurrency)]
        for task in self.loops:
            task.add_done_callback(_fail_fast)

    def _token(self) -> str:
        self.seq += 1
        return f"{self.worker_id}:{self.seq}"

    async def _loop(self) -> None:
        execute, pack, loads, sha_finished = self.conn.execute, self.pack, self.loads, self.finished_script.sha
        prefix_key, head, tail = self.keys.prefix_key, self.finished_head, self.finished_tail
        keep, on_completed = self.keep, self.on_completed
        num_keys = self.finished_script.num_keys

        async def process(data: Any) -> Any:
            return None

        token = self._token()
        reply = await execute("EVALSHA", self.active_script.sha, self.active_script.num_keys, *self.active_keys, prefix_key,
                              int(time.time() * 1000), pack({"token": token, "lockDuration": 30000, "limiter": None,
                                                             "name": None}))
        while type(reply) is list and reply[0]:
            flat, job_id = reply[0], reply[1]
            fields = dict(zip(flat[0::2], flat[1::2]))
            result = await process(loads(fields["data"]))
            attempts = loads(fields.get("opts") or "{}").get("attempts") or 0
            packed = pack({"token": token, "name": None, "keepJobs": keep, "limiter": None, "lockDuration": 30000,
                           "attempts": attempts, "maxMetricsSize": "", "fpof": False, "cpof": False, "idof": False,
                           "rdof": False})
            # fetchNext=1: the reply is the next job, locked with this call's token (as the product does)
            reply = await execute("EVALSHA", sha_finished, num_keys, *head, prefix_key + job_id, *tail, job_id,
                                  int(time.time() * 1000), "returnvalue", self.dumps(result), "completed", 1,
                                  prefix_key, packed, "")
            if type(reply) is int and reply < 0:
                raise RuntimeError(f"moveToFinished answered {reply} for job {job_id}")
            on_completed()

    async def close_worker(self) -> None:
        for task in self.loops:
            await task


if __name__ == "__main__":
    run(FloorAdapter)
