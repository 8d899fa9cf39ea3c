"""A worker's two background loops: lock renewal (one extendLocks call per batch) and the stalled check."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from bullmq_compat._backends.base import QueueBackend, WorkerChannel


class LockKeepingMixin:
    """Keeps the locks of a worker's active jobs and returns stalled jobs of the queue to waiting."""

    backend: "QueueBackend"
    closing: bool
    lock_renew_time: int
    lock_duration: int
    stalled_interval: int
    _active: dict[str, list[Any]]
    _channel: Optional["WorkerChannel"]
    if TYPE_CHECKING:
        def emit(self, event: str, *args: Any) -> bool: ...
        def _connection_trouble(self, err: BaseException) -> float: ...
        async def _sleep(self, seconds: float) -> None: ...

    async def _lock_renewer(self) -> None:
        interval = self.lock_renew_time / 2 / 1000
        while not self.closing:
            await asyncio.sleep(interval)
            now = time.monotonic()
            due = [(job_id, entry[0]) for job_id, entry in self._active.items()
                   if entry[1] + interval <= now]
            if not due:
                continue
            for job_id, _ in due:
                entry = self._active.get(job_id)
                if entry is not None:
                    entry[1] = now
            try:
                failed = await self._channel.extend_locks(  # type: ignore[union-attr]
                    [j for j, _ in due], [t for _, t in due], self.lock_duration)
            except self.backend.transient_errors as err:
                self._connection_trouble(err)
                continue
            except Exception as err:
                self.emit("error", err)
                continue
            for job_id in failed:
                self.emit("error", RuntimeError(f"could not renew lock for job {job_id}"))
                self.emit("lockRenewalFailed", [job_id])

    async def _stalled_checker(self) -> None:
        while not self.closing:
            try:
                stalled = await self._channel.move_stalled_jobs_to_wait(int(time.time() * 1000))  # type: ignore[union-attr]
                for job_id in stalled:
                    self.emit("stalled", job_id, "active")
            except self.backend.transient_errors as err:
                self._connection_trouble(err)
            except Exception as err:
                self.emit("error", err)
            await self._sleep(self.stalled_interval / 1000)
