"""`LockManager`: renews the locks of a worker's active jobs and holds their abort controllers.

Node BullMQ 6's ``LockManager`` (``classes/lock-manager.js``) under Python names: every
``lock_renew_time / 2`` ms the locks that are at least that old are extended by
``lock_duration`` in one ``extendLocks`` call; then ``lockRenewalFailed`` is emitted once with the
ids that could not be renewed (and an ``error`` per id), and ``locksRenewed`` with
``{"count": n, "jobIds": [...]}`` for the others.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, Protocol, Sequence

from bullmq_compat._cancellation import AbortController
from bullmq_compat._errors import InvalidArgument


class LockManagerWorker(Protocol):
    """What a `LockManager` needs of its worker (Node: ``LockManagerWorkerContext``)."""

    def emit(self, event: str, *args: Any) -> bool: ...

    async def extend_job_locks(self, job_ids: Sequence[str], tokens: Sequence[str], duration: int) -> list[str]: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class LockManager:
    """Tracks a worker's active jobs (token, time of last renewal, abort controller) and renews their locks.

    ``LockManager(worker, lock_renew_time=..., lock_duration=..., worker_id=..., worker_name=None)``;
    ``worker`` has ``emit(event, *args)`` and ``async extend_job_locks(ids, tokens, duration)``
    (a `Worker` has both). The Worker makes and runs its own: ``worker.lock_manager``.
    """

    def __init__(self, worker: LockManagerWorker, *, lock_renew_time: int, lock_duration: int,
                 worker_id: str, worker_name: Optional[str] = None) -> None:
        """Renew the locks of ``worker``'s tracked jobs every ``lock_renew_time`` ms, each for
        ``lock_duration`` ms; ``worker_id``/``worker_name`` name the worker in spans."""
        for name, value in (("lock_renew_time", lock_renew_time), ("lock_duration", lock_duration)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name}={value!r} must be an int >= 1 (ms)")
        self.worker = worker
        self.lock_renew_time = lock_renew_time
        self.lock_duration = lock_duration
        self.worker_id = worker_id
        self.worker_name = worker_name
        #: job id -> [token, ts (ms of the last renewal, or when it became active), AbortController or None]
        self.tracked_jobs: dict[str, list[Any]] = {}
        self.closed = False
        self._task: Optional[asyncio.Task[None]] = None

    # -- Node's public methods ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the renewal timer (on the running loop); does nothing when closed or started."""
        if self.closed or self._task is not None:
            return
        self._task = asyncio.ensure_future(self._renew_loop())

    async def close(self) -> None:
        """Stop renewing and forget every tracked job."""
        if self.closed:
            return
        self.closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.tracked_jobs.clear()

    def track_job(self, job_id: str, token: str, ts: Optional[int],
                  should_create_controller: bool = False) -> Optional[AbortController]:
        """Track a job for renewal; returns its `AbortController` when ``should_create_controller``."""
        controller = AbortController() if should_create_controller else None
        if not self.closed and job_id:
            self.tracked_jobs[job_id] = [token, ts, controller]
        return controller

    def untrack_job(self, job_id: str) -> None:
        """Stop renewing the lock of job ``job_id`` (after it finished); unknown ids are ignored."""
        self.tracked_jobs.pop(job_id, None)

    def get_active_job_count(self) -> int:
        """How many jobs are tracked now."""
        return len(self.tracked_jobs)

    def is_running(self) -> bool:
        """True while the renewal timer runs (started and not closed)."""
        return not self.closed and self._task is not None and not self._task.done()

    def cancel_job(self, job_id: str, reason: Any = None) -> bool:
        """Abort the job's signal; False when the job is not tracked or has no controller."""
        tracked = self.tracked_jobs.get(str(job_id))
        if tracked is not None and tracked[2] is not None:
            tracked[2].abort(reason)
            return True
        return False

    def cancel_all_jobs(self, reason: Any = None) -> None:
        """Abort every tracked job's signal with ``reason`` (`Worker.cancel_all_jobs`)."""
        for tracked in list(self.tracked_jobs.values()):
            if tracked[2] is not None:
                tracked[2].abort(reason)

    def get_tracked_job_ids(self) -> list[str]:
        """The ids of the tracked jobs."""
        return list(self.tracked_jobs)

    # -- renewal -------------------------------------------------------------------------------------
    async def extend_locks(self, job_ids: Sequence[str]) -> None:
        """One ``extendLocks`` call for ``job_ids``, then the events (Node: protected ``extendLocks``)."""
        try:
            tokens = [(self.tracked_jobs.get(job_id) or [""])[0] or "" for job_id in job_ids]
            failed = list(await self.worker.extend_job_locks(list(job_ids), tokens, self.lock_duration))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            on_error = getattr(self.worker, "_lock_renewal_error", None)
            if on_error is not None:
                on_error(err)
            else:
                self.worker.emit("error", err)
            return
        if failed:
            self.worker.emit("lockRenewalFailed", failed)
            for job_id in failed:
                self.worker.emit("error", RuntimeError(f"could not renew lock for job {job_id}"))
        lost = set(failed)
        renewed = [job_id for job_id in job_ids if job_id not in lost]
        if renewed:
            self.worker.emit("locksRenewed", {"count": len(renewed), "jobIds": renewed})

    async def _renew_loop(self) -> None:
        half = self.lock_renew_time / 2
        while not self.closed:
            await asyncio.sleep(half / 1000)
            now = _now_ms()
            due = []
            for job_id, tracked in list(self.tracked_jobs.items()):
                if not tracked[1]:
                    tracked[1] = now
                elif tracked[1] + half <= now:
                    tracked[1] = now
                    due.append(job_id)
            if due:
                await self.extend_locks(due)

    def __repr__(self) -> str:
        return f"<LockManager worker={self.worker_id} tracked={len(self.tracked_jobs)} running={self.is_running()}>"
