"""A worker's lock keeping: the calls its `LockManager` makes (lock renewal, one extendLocks call per
batch, is in _lock_manager.py) and the stalled check."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    from bullmq_compat._backends.base import QueueBackend, WorkerChannel


class LockKeepingMixin:
    """Keeps the locks of a worker's active jobs and returns stalled jobs of the queue to waiting."""

    backend: "QueueBackend"
    closing: bool
    stalled_interval: int
    _channel: Optional["WorkerChannel"]
    if TYPE_CHECKING:
        def emit(self, event: str, *args: Any) -> bool: ...
        def _connection_trouble(self, err: BaseException) -> float: ...
        async def _sleep(self, seconds: float) -> None: ...

    async def extend_job_locks(self, job_ids: Sequence[str], tokens: Sequence[str], duration: int) -> list[str]:
        """Extend the locks of ``job_ids`` (held with ``tokens``) by ``duration`` ms; returns the ids that
        could not be (Node: ``extendJobLocks``, what the `LockManager` calls)."""
        channel = self._channel
        if channel is None:
            raise RuntimeError("the worker is not connected: run it, or call worker_channel() first")
        return await channel.extend_locks(job_ids, tokens, duration)

    def _lock_renewal_error(self, err: BaseException) -> None:
        if self.backend.is_transient(err):  # connection trouble, or a server refusing writes (OOM)
            self._connection_trouble(err)  # logged and emitted once per outage
        else:
            self.emit("error", err)

    async def _stalled_checker(self) -> None:
        while not self.closing:
            try:
                stalled = await self._channel.move_stalled_jobs_to_wait(int(time.time() * 1000))  # type: ignore[union-attr]
                for job_id in stalled:
                    self.emit("stalled", job_id, "active")
            except Exception as err:
                if self.backend.is_transient(err):
                    self._connection_trouble(err)
                else:
                    self.emit("error", err)
            await self._sleep(self.stalled_interval / 1000)
