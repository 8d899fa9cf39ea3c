"""Batches: a Worker whose processor takes up to ``size`` jobs at a time (BullMQ Pro's ``batch`` option).

``Worker(q, process, batch={"size": 50, "min_size": 10, "timeout": 1000, "max_bytes": 1 << 20})``.
Each batched job is an ordinary job of the queue: claimed with its own lock token by upstream's
``moveToActive`` (a batch's claims pipelined in one round trip, `WorkerChannel.move_to_active_many`),
renewed by the worker's lock manager, finished by upstream's ``moveToFinished`` (a batch's
completions in one round trip, `WorkerChannel.finish_many`), so its events, its hash and its
stalled recovery are what Node and Bull-Board expect of any job. See docs/worker.md, "Batches".
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from bullmq_compat._backends.base import FinishJob, NextJob
from bullmq_compat._cancellation import AbortController
from bullmq_compat._errors import (
    InvalidArgument,
    InvalidJobData,
    UnrecoverableError,
)
from bullmq_compat._job import Job
from bullmq_compat._meter import record_job
from bullmq_compat._scheduler import advance_for_worker
from bullmq_compat._wire import codec

if TYPE_CHECKING:
    from bullmq_compat._queue import QueueBase
    from bullmq_compat._worker import Worker

_KEYS = {"size": "size", "min_size": "min_size", "minSize": "min_size", "timeout": "timeout",
         "max_bytes": "max_bytes", "maxBytes": "max_bytes", "maxBatchBytes": "max_bytes",
         "group_affinity": "group_affinity", "groupAffinity": "group_affinity"}


@dataclass(frozen=True)
class BatchOptions:
    """A worker's validated ``batch`` option."""

    size: int
    min_size: int = 1
    timeout: int = 0                 # ms to wait for min_size jobs; 0: no cap (wait while below min_size)
    max_bytes: Optional[int] = None  # cap on the summed size of the batch's job data (UTF-8 JSON text)
    group_affinity: bool = False


def _int_option(name: str, value: Any, minimum: int, maximum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        rule = f"an int >= {minimum}" if maximum is None else f"an int from {minimum} to {maximum}"
        raise InvalidArgument(f"batch {name}={value!r} must be {rule}")
    return value


def batch_options(batch: Optional[Mapping[str, Any]], max_bytes: Optional[int] = None,
                  group_affinity: Optional[bool] = None) -> Optional[BatchOptions]:
    """``batch={...}`` (Python or Node key names) and the ``max_bytes=`` / ``group_affinity=`` keywords,
    validated; None: no batches."""
    if batch is None:
        if max_bytes is not None:
            raise InvalidArgument(f"max_bytes={max_bytes!r} caps a batch: it needs batch={{'size': n}}")
        if group_affinity is not None:
            raise InvalidArgument(f"group_affinity={group_affinity!r} fills a batch from one group: it needs "
                                  "batch={'size': n}")
        return None
    if not isinstance(batch, Mapping):
        raise InvalidArgument(f"batch={batch!r} must be a mapping such as {{'size': 50, 'min_size': 10, "
                              "'timeout': 1000}")
    given: dict[str, Any] = {}
    for key, value in batch.items():
        name = _KEYS.get(key) if isinstance(key, str) else None
        if name is None:
            raise InvalidArgument(f"batch has an unknown key {key!r}: the keys are size, min_size, timeout, "
                                  "max_bytes and group_affinity")
        if name in given and given[name] != value:
            raise InvalidArgument(f"batch gives {name} twice ({given[name]!r} and {value!r})")
        given[name] = value
    if "size" not in given:
        raise InvalidArgument(f"batch={dict(batch)!r} needs a size (the most jobs in one batch)")
    size = _int_option("size", given["size"], 1)
    min_size = _int_option("min_size", given.get("min_size", 1), 1, size)
    timeout = _int_option("timeout", given.get("timeout", 0), 0)
    if max_bytes is not None:
        if "max_bytes" in given and given["max_bytes"] != max_bytes:
            raise InvalidArgument(f"max_bytes={max_bytes!r} and batch max_bytes={given['max_bytes']!r} differ: "
                                  "give it once")
        given["max_bytes"] = max_bytes
    if group_affinity is not None:
        if "group_affinity" in given and given["group_affinity"] != group_affinity:
            raise InvalidArgument(f"group_affinity={group_affinity!r} and batch group_affinity="
                                  f"{given['group_affinity']!r} differ: give it once")
        given["group_affinity"] = group_affinity
    cap = given.get("max_bytes")
    if cap is not None:
        cap = _int_option("max_bytes", cap, 1)
    affinity = given.get("group_affinity", False)
    if not isinstance(affinity, bool):
        raise InvalidArgument(f"batch group_affinity={affinity!r} must be True or False")
    return BatchOptions(size=size, min_size=min_size, timeout=timeout, max_bytes=cap, group_affinity=affinity)


class BatchedJob(Job):
    """A job of a batch (what `BatchJob.get_batch` lists): an ordinary `Job`, plus `set_as_failed`."""

    batch_error: Optional[BaseException] = None
    data_bytes: int = 0

    def set_as_failed(self, err: BaseException) -> None:
        """Fail this job when the batch's processor returns (its retries as its options say); the
        batch's other jobs complete."""
        if not isinstance(err, BaseException):
            raise InvalidArgument(f"set_as_failed({err!r}) needs an exception (the job's failed reason)")
        self.batch_error = err


class BatchJob(Job):
    """What a batch worker's processor is called with: not stored anywhere (its id is None); its
    ``data`` is the list of the batched jobs' data, `get_batch` the jobs themselves."""

    def __init__(self, queue: "QueueBase", jobs: Sequence[BatchedJob]) -> None:
        """The batch of ``jobs`` taken from ``queue``'s backend: made by the worker, not by user
        code."""
        super().__init__(queue, jobs[0].name if jobs else "", [job.data for job in jobs], {}, None)
        self._jobs = list(jobs)
        self.token = jobs[0].token if jobs else None

    def get_batch(self) -> list[BatchedJob]:
        """The jobs of this batch, in the order they were taken (a group's in group order)."""
        return list(self._jobs)


def return_values(result: Any, count: int) -> list[Any]:
    """Each job's return value: a list of ``count`` items gives job i item i; any value that is not a
    list gives every job that value; a list of another length is refused."""
    if isinstance(result, list):
        if len(result) != count:
            raise InvalidArgument(
                f"the batch processor returned a list of {len(result)} values for a batch of {count} jobs: "
                "return one value per job (in get_batch() order), or a value that is not a list for all")
        return result
    return [result] * count


def _now_ms() -> int:
    return int(time.time() * 1000)


class BatchRunner:
    """A batch worker's slots: collect a batch, run the processor once, finish every job."""

    def __init__(self, worker: "Worker", options: BatchOptions) -> None:
        self.worker = worker
        self.options = options

    # -- collecting ----------------------------------------------------------------------------------
    async def slot(self) -> None:
        w = self.worker
        carry: list[BatchedJob] = []
        while True:
            held: list[BatchedJob] = carry
            try:
                if not carry:
                    if w.closing:
                        return
                    if w._slot_count > w.concurrency:  # concurrency was lowered: retire this slot
                        w._slot_count -= 1
                        return
                held = await self._collect(carry)
                batch, carry = self._cut(held)
                if batch:
                    await self._run(batch)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # never let a slot die: report, let the held jobs stall back
                for job in held:
                    w._active.pop(str(job.id), None)
                carry = []
                w.emit("error", err)
                await w._sleep(1.0)

    def _cut(self, jobs: list[BatchedJob]) -> tuple[list[BatchedJob], list[BatchedJob]]:
        """The batch to run now and the jobs kept for the next (over max_bytes; at least one job runs)."""
        cap = self.options.max_bytes
        if cap is None or len(jobs) <= 1:
            return jobs, []
        total = 0
        for i, job in enumerate(jobs):
            total += job.data_bytes
            if total > cap and i > 0:
                return jobs[:i], jobs[i:]
        return jobs, []

    async def _collect(self, jobs: list[BatchedJob]) -> list[BatchedJob]:
        """Claim jobs until the batch has ``size`` (or its bytes are over max_bytes), or it has
        ``min_size`` and nothing more waits, or ``timeout`` ran out with at least one job."""
        w = self.worker
        opts = self.options
        jobs = list(jobs)
        deadline: Optional[float] = None
        last_round = False
        if opts.group_affinity and jobs and jobs[0].group_id is not None:
            return jobs  # a group batch's jobs kept over max_bytes: the next batch, of that group alone
        while True:
            if w.closing or w._paused or w._slot_count > w.concurrency:
                return jobs  # (checked before parking too: close() wakes only the slots parked by then)
            now = _now_ms()
            if not jobs and w._limit_until > now:  # as a single slot: at most maximum_rate_limit_delay
                await w._sleep(min(w._limit_until - now, w.maximum_rate_limit_delay) / 1000)
                w._drained = False
            if not jobs and (w._drained or w._paused):
                await w._park()
            if w.closing or w._paused or w._slot_count > w.concurrency:
                return jobs
            want = opts.size - len(jobs)
            if opts.group_affinity and not jobs:
                want = 1  # the batch's first job decides: a group job's batch is filled from its group
            if want > 0 and not self._full(jobs):
                channel = await w._ensure_channel()
                tokens = [w._next_token() for _ in range(want)]
                try:
                    replies = await channel.move_to_active_many(tokens, _now_ms())
                except Exception as err:
                    if not w._transient(err):
                        raise
                    await w._sleep(w._connection_trouble(err))
                    if jobs:
                        return jobs
                    continue
                w._connection_ok()
                found = self._jobs_from(replies, tokens, had=bool(jobs))
                jobs.extend(found)
                if len(found) == want:
                    w._wake_one()  # more may wait: bring another idle slot in
                if opts.group_affinity and len(jobs) == 1 and found and jobs[0].group_id is not None:
                    return await self._fill_from_group(jobs)
            if len(jobs) >= opts.size or self._full(jobs) or (jobs and last_round):
                return jobs
            if len(jobs) >= opts.min_size and jobs:
                return jobs
            if not jobs:
                continue  # drained: the next round parks until a marker
            # below min_size: wait for more jobs, at most until the timeout (none: until there are)
            if deadline is None and opts.timeout:
                deadline = time.monotonic() + opts.timeout / 1000
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                last_round = True  # one more claim, then run what there is
                continue
            if w._limit_until > _now_ms():
                limit_wait = min(w._limit_until - _now_ms(), w.maximum_rate_limit_delay) / 1000
                remaining = limit_wait if remaining is None else min(remaining, limit_wait)
            await self._wait(remaining)

    async def _fill_from_group(self, jobs: list[BatchedJob]) -> list[BatchedJob]:
        """Group affinity: the batch of a group's current job takes the group's next held jobs (our
        takeGroupJobs script), in group order; no wait for min_size (a group's jobs are all there)."""
        w = self.worker
        group_id = jobs[0].group_id
        assert group_id is not None
        channel = await w._ensure_channel()
        tokens = [w._next_token() for _ in range(self.options.size - len(jobs))]
        if not tokens:
            return jobs
        try:
            replies = await channel.take_group_jobs(group_id, tokens, _now_ms())
        except Exception as err:
            if not w._transient(err):
                raise
            w._connection_trouble(err)
            return jobs  # the batch goes with its first job; the group's others wait their turn
        taken = self._jobs_from(replies, tokens, had=True)
        for job in taken:
            job.group_id = group_id
        return jobs + taken

    def _full(self, jobs: Sequence[BatchedJob]) -> bool:
        cap = self.options.max_bytes
        return cap is not None and sum(job.data_bytes for job in jobs) >= cap

    async def _wait(self, timeout: Optional[float]) -> None:
        """Park as an idle slot (the marker waiter wakes one per new job marker), at most ``timeout`` s."""
        w = self.worker
        if w.closing:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        w._idle.append(fut)
        w._waiter_wanted.set()
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass

    def _jobs_from(self, replies: Sequence[NextJob], tokens: Sequence[str], had: bool) -> list[BatchedJob]:
        w = self.worker
        found: list[BatchedJob] = []
        now = _now_ms()
        track = w.lock_manager.track_job
        for (raw, job_id, _limit, _due), token in zip(replies, tokens):
            if raw is None or job_id is None:
                break
            job = BatchedJob.from_raw(w, job_id, raw)
            assert isinstance(job, BatchedJob)
            job.token = token
            if self.options.max_bytes is not None:
                job.data_bytes = len((raw.get("data") or "").encode())
            track(job_id, token, now, False)
            found.append(job)
            w.emit("active", job, "waiting")
        if replies:
            _raw, _id, limit_delay, delay_until = replies[-1]
            w._update_delays(limit_delay, delay_until)
        if found:
            w._drained = False
            w._drain_reported = False
        elif not had and not w._drained:
            w._drained = True
            if not w._drain_reported:
                w._drain_reported = True
                w.emit("drained")
        return found

    # -- processing ----------------------------------------------------------------------------------
    @staticmethod
    def _refusal(w: "Worker", job: Job) -> Optional[BaseException]:
        """Why a taken job fails before the processor sees it (as a single job would)."""
        if job.parse_error:
            return UnrecoverableError(f"job {job.id} cannot be processed: {job.parse_error}")
        if job.deferred_failure:
            return UnrecoverableError(job.deferred_failure)
        if w.max_started_attempts is not None and w.max_started_attempts < job.attempts_started:
            return UnrecoverableError("job started more than allowable limit")
        return None

    async def _run(self, jobs: list[BatchedJob]) -> None:
        w = self.worker
        outcomes: list[tuple[BatchedJob, Optional[BaseException], Any]] = []  # (job, error, value)
        runnable: list[BatchedJob] = []
        for job in jobs:
            if job.repeat_job_key is not None:  # a job scheduler's job: make its next one, as Node
                await advance_for_worker(w, job)
            refusal = self._refusal(w, job)
            if refusal is not None:
                outcomes.append((job, refusal, None))
            else:
                runnable.append(job)
        if runnable:
            controller = AbortController() if w._wants_signal else None
            if controller is not None:
                for job in runnable:  # one signal for the batch: cancel_job(any of its ids) aborts it
                    tracked = w._active.get(str(job.id))
                    if tracked is not None:
                        tracked[2] = controller
            wrapper = BatchJob(w, runnable)
            try:
                result = await w._invoke(wrapper, runnable[0].token or "",
                                         controller.signal if controller is not None else None)
                values = return_values(result, len(runnable))
            except asyncio.CancelledError:
                raise
            except BaseException as err:
                if not isinstance(err, Exception):
                    raise
                outcomes.extend((job, err, None) for job in runnable)
            else:
                outcomes.extend((job, job.batch_error, value) for job, value in zip(runnable, values))
        for job in jobs:
            w._active.pop(str(job.id), None)
        await self._finish(outcomes)

    async def _finish(self, outcomes: list[tuple[BatchedJob, Optional[BaseException], Any]]) -> None:
        """Completions in one `finish_many` call; failures (retried, backed off or failed for good, as
        each job's options say) sent in the same loop tick, so the fast channel writes them all at once."""
        w = self.worker
        completing: list[tuple[BatchedJob, Any, str]] = []
        failing: list[tuple[BatchedJob, BaseException]] = []
        texts: dict[int, str] = {}  # one encoding of a value every job of the batch got
        for job, err, value in outcomes:
            if err is not None:
                failing.append((job, err))
                continue
            try:
                text = texts.get(id(value))
                if text is None:
                    text = texts[id(value)] = codec.dumps(value, what="return value")
                completing.append((job, value, text))
            except InvalidJobData as bad:
                failing.append((job, bad))
        channel = await w._ensure_channel()
        now = _now_ms()
        items = [FinishJob(str(job.id), job.opts, "completed", text, job.token or "", group_id=job.group_id)
                 for job, _value, text in completing]
        sends: list[Any] = [self._fail(job, err) for job, err in failing]
        if items:
            sends.insert(0, w.finishing(lambda: channel.finish_many(items, now)))
        if len(sends) == 1:  # the usual case: no gather (its task would send one loop turn later)
            try:
                answers: list[Any] = [await sends[0]]
            except Exception as err:
                answers = [err]
        else:
            answers = await asyncio.gather(*sends, return_exceptions=True)
        if items:
            finished = answers[0]
            if isinstance(finished, BaseException):
                raise finished
            retry: list[Any] = []
            for (job, value, _text), refused in zip(completing, finished):
                if refused is None:
                    job.returnvalue = value
                    job.finished_on = now
                    job.attempts_made += 1
                    if w.meter is not None:
                        record_job(job, "completed")
                    w.emit("completed", job, value, "active")
                    if w._prometheus is not None:
                        w._prometheus.completed(job)
                elif isinstance(refused, InvalidJobData):  # e.g. a value PostgreSQL's jsonb cannot store
                    retry.append(self._fail(job, refused))
                else:
                    w.emit("error", refused)
            if retry:
                answers = [*answers, *await asyncio.gather(*retry, return_exceptions=True)]
        for answer in answers[1 if items else 0:]:
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                w.emit("error", answer)

    async def _fail(self, job: BatchedJob, err: BaseException) -> None:
        """One job's failed attempt, as a single job's (without fetching a next job)."""
        assert isinstance(err, Exception)
        await self.worker._handle_failed(job, err, job.token or "", fetch_next=False)
