"""Official PyPI ``bullmq`` (the Python port) side of scripts/bench.py: one measurement per invocation.

    bench-results/.venv-official/bin/python scripts/bench_official.py '<json>'

Run with the interpreter of the venv scripts/bench.py installs the port into (never the project
venv). The harness is scripts/bench_compat.py's `run`, so both Python clients are driven by the
same code; only this adapter differs. Input and output: see interop/bench.js.

With {postgres: url, schema} the port's own PostgreSQL backend is used ({"backend": "postgres",
"connection": url, "schema": schema}; it needs the port's ``postgres`` extra), which
migrates the schema as it connects (untimed: queue_ready).
"""
from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Awaitable, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_compat import JOB_NAME, Adapter, run  # noqa: E402


class OfficialAdapter(Adapter):
    def __init__(self, args: dict[str, Any]) -> None:
        from bullmq import Queue

        self.args = args
        self.where: dict[str, Any] = ({"backend": "postgres", "connection": args["postgres"], "schema": args["schema"]}
                                      if args.get("postgres") else {"connection": args["redis"]})
        self.queue = Queue(args["queue"], dict(self.where))
        self.worker: Any = None
        self.task: Optional[asyncio.Future[Any]] = None

    async def queue_ready(self) -> None:
        await self.queue.backend.waitUntilReady()

    def add(self, i: int) -> Awaitable[Any]:
        return self.queue.add(JOB_NAME, {"i": i}, {})

    def add_bulk(self, items: list[dict[str, Any]]) -> Awaitable[Any]:
        return self.queue.addBulk([{"name": item["name"], "data": item["data"], "opts": {}} for item in items])

    async def close_queue(self) -> None:
        await self.queue.close()

    def make_worker(self, on_start: Optional[Callable[[Any], None]], concurrency: int,
                    remove_on_complete: bool, on_completed: Callable[..., None]) -> None:
        from bullmq import Worker

        # (job, token): the port's documented processor signature (a third parameter would make it
        # allocate an abort controller per job)
        if on_start is None:
            async def process(job: Any, token: str) -> Any:
                return None
        else:
            async def process(job: Any, token: str) -> Any:
                on_start(job)

        opts: dict[str, Any] = {**self.where, "concurrency": concurrency, "autorun": False}
        if remove_on_complete:
            opts["removeOnComplete"] = True
        self.worker = Worker(self.args["queue"], process, opts)
        self.worker.on("error", lambda err, *_: print(f"worker error: {err!r}", file=sys.stderr))
        self.worker.on("completed", on_completed)

    async def worker_ready(self) -> None:
        await self.worker.backend.waitUntilReady()

    def start_worker(self) -> None:
        self.task = asyncio.ensure_future(self.worker.run())

    async def close_worker(self) -> None:
        await self.worker.close()
        if self.task is not None:
            await self.task


if __name__ == "__main__":
    run(OfficialAdapter)
