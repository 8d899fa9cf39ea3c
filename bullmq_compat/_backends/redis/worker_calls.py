"""The worker-side upstream script calls, built as (script, keys, args) for any channel.

Keys, argument order and the packed option dicts follow what Node BullMQ's worker sends,
so Redis sees the same calls whichever language processes the job.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from bullmq_compat._backends.redis.keys import QueueKeys
from bullmq_compat._backends.redis.lua import Script, own_script, upstream_scripts
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import attempts_of, int_or_zero  # noqa: F401 (re-exported)

Call = tuple[Script, list[Any], list[Any]]

# the job options (Python names) moveToFinished's packed options are made of, besides attempts
_FINISH_JOB_OPTIONS = frozenset({"remove_on_complete", "remove_on_fail", "fail_parent_on_failure",
                                 "continue_parent_on_failure", "ignore_dependency_on_failure",
                                 "remove_dependency_on_failure"})
_PACKED_FINISH_MAX = 1024


@dataclass
class WorkerWireOptions:
    """The worker options that travel inside script arguments."""

    name: Optional[str] = None
    lock_duration: int = 30000
    limiter: Optional[dict[str, Any]] = None
    remove_on_complete: Any = None
    remove_on_fail: Any = None
    max_metrics_size: Any = ""
    max_stalled_count: int = 1
    stalled_interval: int = 30000
    _fetch_opts: bytes = field(default=b"", init=False, repr=False)

    def fetch_opts(self, token: str) -> bytes:
        return codec.pack({"token": token, "lockDuration": self.lock_duration,
                           "limiter": self.limiter, "name": self.name})


def keep_jobs(job_value: Any, worker_value: Any) -> Any:
    """Node's getKeepJobs: the job's own remove_on_* wins, else the worker's, else keep all."""
    if job_value is None:
        if worker_value is None or worker_value is False:
            return {"count": -1}
        return keep_jobs(worker_value, None)
    if isinstance(job_value, dict):
        return job_value
    if isinstance(job_value, bool):
        return {"count": 0 if job_value else -1}
    if isinstance(job_value, (int, float)):
        return {"count": int(job_value)}
    return {"count": -1}


class WorkerCalls:
    """Builds a queue's worker script calls; key lists are made once."""

    def __init__(self, keys: QueueKeys, opts: WorkerWireOptions) -> None:
        self.keys = keys
        self.opts = opts
        s = upstream_scripts()
        self._move_to_active = s["moveToActive"]
        self._move_to_finished = s["moveToFinished"]
        self._batch_fetch_opts = codec.pack({"lockDuration": opts.lock_duration, "limiter": opts.limiter,
                                             "name": opts.name})
        self._move_to_delayed = s["moveToDelayed"]
        self._retry_job = s["retryJob"]
        self._extend_locks = s["extendLocks"]
        self._extend_lock = s["extendLock"]
        self._move_stalled = s["moveStalledJobsToWait"]
        self._active_to_wait = s["moveJobFromActiveToWait"]
        self._to_waiting_children = s["moveToWaitingChildren"]
        k = keys
        self._active_keys = [k.wait, k.active, k.prioritized, k.events, k.stalled, k.limiter, k.delayed,
                             k.paused, k.meta, k.pc, k.marker]
        self._finished_head = [k.wait, k.active, k.prioritized, k.events, k.stalled, k.limiter, k.delayed,
                               k.paused, k.meta, k.pc]
        self._completed_tail = (k.completed, k["metrics:completed"], k.marker)
        self._failed_tail = (k.failed, k["metrics:failed"], k.marker)
        self._delayed_keys_head = [k.marker, k.active, k.prioritized, k.delayed]
        self._packed_finish: dict[Any, bytes] = {}
        self._stalled_keys = [k.stalled, k.wait, k.active, k.stalled_check, k.meta, k.paused, k.marker,
                              k.events, k.repeat]

    # our scripts, built when first used (groups and batches only: a plain worker never builds them)
    @functools.cached_property
    def _move_to_finished_group(self) -> Script:
        return own_script("moveToFinishedGroup-15.lua")

    @functools.cached_property
    def _move_to_active_batch(self) -> Script:
        return own_script("moveToActiveBatch-11.lua")

    @functools.cached_property
    def _complete_batch(self) -> Script:
        return own_script("moveToFinishedBatch-14.lua")

    @functools.cached_property
    def _take_group_jobs(self) -> Script:
        return own_script("takeGroupJobs-12.lua")

    def move_to_active(self, token: str, now: int) -> Call:
        return self._move_to_active, self._active_keys, [self.keys.prefix_key, now, self.opts.fetch_opts(token)]

    def move_to_finished(self, job_id: str, job_opts: Mapping[str, Any], target: str, value: str, token: str,
                         now: int, fetch_next: bool, fields_to_update: Optional[Mapping[str, Any]] = None,
                         group_id: Optional[str] = None) -> Call:
        """``target`` is 'completed' (value = JSON text) or 'failed' (value = the failed reason).

        A group job (``group_id``) finishes through our moveToFinishedGroup script: upstream's
        moveToFinished unchanged, then its group's next job released, in the same call."""
        completed = target == "completed"
        tail_set, metrics, marker = self._completed_tail if completed else self._failed_tail
        packed = self.finish_opts(job_opts, completed, token)
        keys = [*self._finished_head, tail_set, self.keys.job(job_id), metrics, marker]
        args = [job_id, now, "returnvalue" if completed else "failedReason", value, target,
                1 if fetch_next else 0, self.keys.prefix_key, packed,
                codec.pack(codec.dict_to_flat(fields_to_update)) if fields_to_update else ""]
        if group_id is None:
            return self._move_to_finished, keys, args
        keys.append(self.keys.waiting_children)
        args.append(group_id)
        return self._move_to_finished_group, keys, args

    def finish_opts(self, job_opts: Mapping[str, Any], completed: bool, token: Optional[str]) -> bytes:
        """moveToFinished's packed opts (its ARGV[8]) for one job, as Node's worker packs them
        (without ``token`` when it is None: moveToFinishedBatch adds each job's). For a job with
        none of the options they carry but ``attempts`` (the usual job), the pack depends only on
        the token and the attempts: kept, as a slot finishes job after job with one token
        (moveToFinished's fetchNext reuses it)."""
        key: Any = None
        attempts = job_opts.get("attempts")
        if type(attempts) in (int, type(None)) and not (job_opts.keys() & _FINISH_JOB_OPTIONS):
            key = (completed, token, attempts)
            packed = self._packed_finish.get(key)
            if packed is not None:
                return packed
        worker_keep = self.opts.remove_on_complete if completed else self.opts.remove_on_fail
        job_keep = job_opts.get("remove_on_complete" if completed else "remove_on_fail")
        packed = codec.pack({
            **({} if token is None else {"token": token}),
            "name": self.opts.name, "keepJobs": keep_jobs(job_keep, worker_keep),
            "limiter": self.opts.limiter, "lockDuration": self.opts.lock_duration,
            "attempts": attempts_of(job_opts), "maxMetricsSize": self.opts.max_metrics_size,
            "fpof": bool(job_opts.get("fail_parent_on_failure")),
            "cpof": bool(job_opts.get("continue_parent_on_failure")),
            "idof": bool(job_opts.get("ignore_dependency_on_failure")),
            "rdof": bool(job_opts.get("remove_dependency_on_failure")),
        })
        if key is not None:
            if len(self._packed_finish) >= _PACKED_FINISH_MAX:  # old tokens: their slots moved on
                self._packed_finish.clear()
            self._packed_finish[key] = packed
        return packed

    def move_to_active_batch(self, tokens: Sequence[str], now: int) -> Call:
        """Our moveToActiveBatch: upstream's moveToActive once per token, in one call (a batch worker's)."""
        return self._move_to_active_batch, self._active_keys, [
            self.keys.prefix_key, now, self._batch_fetch_opts, *tokens]

    def take_group_jobs(self, group_id: str, tokens: Sequence[str], now: int) -> Call:
        """Our takeGroupJobs: the group's next held jobs straight into active (group affinity)."""
        return self._take_group_jobs, [*self._active_keys, self.keys.waiting_children], [
            self.keys.prefix_key, now, self._batch_fetch_opts, group_id, *tokens]

    def complete_batch(self, jobs: Sequence[tuple[str, str, str, Mapping[str, Any]]], now: int) -> Call:
        """Our moveToFinishedBatch: upstream's moveToFinished ("completed", no next job) once per
        ``(job id, return value JSON, lock token, Job.opts)``, in one call. The packed opts are sent
        once per distinct kind (the jobs of a batch mostly share one), each job naming its own."""
        keys = [*self._finished_head, *self._completed_tail[:1], self.keys.prefix_key, *self._completed_tail[1:]]
        kinds: dict[tuple[Any, ...], int] = {}
        blobs: list[bytes] = []
        per_job: list[Any] = []
        for job_id, value, token, job_opts in jobs:
            kind = (repr(job_opts.get("remove_on_complete")), attempts_of(job_opts),
                    bool(job_opts.get("fail_parent_on_failure")), bool(job_opts.get("continue_parent_on_failure")),
                    bool(job_opts.get("ignore_dependency_on_failure")),
                    bool(job_opts.get("remove_dependency_on_failure")))
            index = kinds.get(kind)
            if index is None:
                blobs.append(self.finish_opts(job_opts, True, None))
                index = kinds[kind] = len(blobs)
            per_job += (job_id, value, token, index)
        return self._complete_batch, keys, [now, self.keys.prefix_key, len(blobs), *blobs, *per_job]

    def move_to_delayed(self, job_id: str, now: int, delay: int, token: str, *, skip_attempt: bool = False,
                        fields_to_update: Optional[Mapping[str, Any]] = None, fetch_next: bool = False) -> Call:
        k = self.keys
        keys = [*self._delayed_keys_head, k.job(job_id), k.events, k.meta, k.stalled, k.wait, k.limiter, k.pc]
        return self._move_to_delayed, keys, [
            k.prefix_key, now, job_id, token, delay, "1" if skip_attempt else "0",
            codec.pack(codec.dict_to_flat(fields_to_update)) if fields_to_update else "",
            1 if fetch_next else 0, self.opts.fetch_opts(token) if fetch_next else "",
        ]

    def retry_job(self, job_id: str, lifo: bool, token: str, now: int,
                  fields_to_update: Optional[Mapping[str, Any]] = None) -> Call:
        k = self.keys
        keys = [k.active, k.wait, k.paused, k.job(job_id), k.meta, k.events, k.delayed, k.prioritized, k.pc,
                k.marker, k.stalled]
        return self._retry_job, keys, [
            k.prefix_key, now, "RPUSH" if lifo else "LPUSH", job_id, token,
            codec.pack(codec.dict_to_flat(fields_to_update)) if fields_to_update else "",
        ]

    def extend_locks(self, job_ids: Sequence[str], tokens: Sequence[str], duration: int) -> Call:
        return self._extend_locks, [self.keys.stalled], [
            self.keys.prefix_key, codec.pack(list(tokens)), codec.pack(list(job_ids)), duration]

    def extend_lock(self, job_id: str, token: str, duration: int) -> Call:
        return self._extend_lock, [self.keys.job(job_id) + ":lock", self.keys.stalled], [token, duration, job_id]

    def move_stalled_to_wait(self, now: int) -> Call:
        return self._move_stalled, self._stalled_keys, [
            self.opts.max_stalled_count, self.keys.prefix_key, now, self.opts.stalled_interval]

    def move_from_active_to_wait(self, job_id: str, token: str) -> Call:
        k = self.keys
        return self._active_to_wait, [k.active, k.wait, k.stalled, k.paused, k.meta, k.limiter, k.prioritized,
                                      k.marker, k.events], [job_id, token, k.job(job_id)]

    def move_to_waiting_children(self, job_id: str, token: str, now: int, child_key: str = "") -> Call:
        k = self.keys
        keys = [k.active, k.waiting_children, k.job(job_id), k.job(job_id) + ":dependencies",
                k.job(job_id) + ":unsuccessful", k.stalled, k.events]
        return self._to_waiting_children, keys, [token, child_key, codec.dumps(now), job_id, k.prefix_key]


def parse_next_job(result: Any) -> tuple[Optional[dict[str, str]], Optional[str], int, int]:
    """moveToActive / moveToFinished(fetchNext) reply → (job hash, id, rate-limit delay, delay-until)."""
    if type(result) is not list or not result:
        return None, None, 0, 0
    flat = result[0]
    raw = None
    if flat:
        if type(flat[0]) is bytes:
            flat = codec.to_str(flat)
        pairs = iter(flat)
        raw = dict(zip(pairs, pairs))
    n = len(result)
    job_id = result[1] if n > 1 else None
    if not job_id:
        job_id = None
    elif type(job_id) is not str:
        job_id = codec.to_str(job_id)
    limit = int(result[2] or 0) if n > 2 else 0
    delay_until = int(result[3] or 0) if n > 3 else 0
    return raw, job_id, limit, delay_until
