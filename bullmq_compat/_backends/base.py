"""The backend contract: what Queue, Job, Worker, QueueEvents, FlowProducer and the scheduler code
ask of a datastore, in queue words only (Node BullMQ 6's ``IQueueBackend``, under Python names).

Two backends implement it: ``_backends/redis`` (upstream's Lua scripts) and ``_backends/postgres``
(upstream's SQL functions). The classes above never import a datastore client; they hold a
`QueueBackend` and call it. Every state change is one atomic call of upstream's script or SQL
function (or ours composed from them), so a crash never leaves a change half-done.

Shapes shared by both backends:

* `JobFields` -- a job as upstream's Redis hash stores it (Node's ``JobJson``), all values text:
  ``name``, ``data`` (JSON), ``opts`` (JSON, upstream's short keys such as ``kl``, ``de``),
  ``timestamp``, ``delay``, ``priority``, ``processedOn``, ``finishedOn``, ``atm`` (attempts
  made), ``ats`` (attempts started), ``stc`` (stalled count), ``returnvalue`` (JSON),
  ``failedReason``, ``stacktrace`` (JSON list), ``progress`` (JSON), ``parentKey``, ``parent``
  (JSON ``{"id", "queueKey"}``), ``rjk`` (scheduler id), ``deid`` (deduplication id), ``pb``
  (processed by), ``defa`` (deferred failure). A field that is not set is absent.
  ``Job.from_raw`` reads this one shape whatever the backend.
* `NextJob` -- what a claim returns: ``(fields or None, job id or None, rate-limit delay ms,
  next delayed job's due time ms)``; the last two are 0 when they do not apply.
* Job options handed to a backend are Node's long names as `normalize_job_options` gives them
  (``removeOnComplete``, ``deduplication``, ``parent`` ...).
* Errors: a refused call raises the `ScriptError` subclass of upstream's code (`script_error`);
  connection trouble raises one of `QueueBackend.transient_errors`; an operation the backend
  cannot do raises `NotSupportedOnBackend`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from bullmq_compat._errors import InvalidArgument

JobFields = dict[str, str]
NextJob = tuple[Optional[JobFields], Optional[str], int, int]


@dataclass
class NewJob:
    """One job to add, validated and merged with the queue's defaults."""

    name: str
    data: Any
    opts: dict[str, Any]          # Node-form options (long names)
    timestamp: int                # ms, the producer's clock
    job_id: str = ""              # "" asks the backend for the queue's next sequence id
    queue_name: str = ""          # for flows: the node's queue ("" = the backend's queue)


@dataclass
class FinishJob:
    """One active job to finish in `WorkerChannel.finish_many`: the arguments of `move_to_finished`."""

    job_id: str
    job_opts: Mapping[str, Any]   # Job.opts
    target: str                   # "completed" or "failed" (for good)
    value: str                    # JSON return value, or the failed reason
    token: str
    fields_to_update: Optional[Mapping[str, str]] = None
    group_id: Optional[str] = None


@dataclass
class WorkerSettings:
    """What a worker's calls need besides the job: Node's WorkerOptions that reach the datastore."""

    name: Optional[str] = None
    lock_duration: int = 30000
    stalled_interval: int = 30000
    max_stalled_count: int = 1
    limiter: Optional[dict[str, int]] = None
    remove_on_complete: Any = None
    remove_on_fail: Any = None
    max_metrics_size: Any = ""
    extra: dict[str, Any] = field(default_factory=dict)


class JobTransaction(abc.ABC):
    """A transaction opened for one job's processor (``Worker(transactional=True)``): what the
    processor writes on `connection` commits with the job's completion, or not at all."""

    #: the driver connection, in the open transaction (a psycopg ``AsyncConnection`` on PostgreSQL)
    connection: Any

    @abc.abstractmethod
    async def complete(self, job_id: str, job_opts: Mapping[str, Any], value: str, token: str, now: int,
                       fetch_next: bool = False) -> Optional[NextJob]:
        """Complete the active job in this transaction (the lock ``token`` checked as upstream
        checks it), claim the next one when ``fetch_next`` (its `NextJob` returned) and commit; on a
        refusal (a lost lock) roll back and raise it."""

    @abc.abstractmethod
    async def rollback(self) -> None:
        """Roll back what the processor wrote (the job is then failed or retried on its own)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Give the connection back (rolling back what was not committed)."""


class WorkerChannel(abc.ABC):
    """One worker's hot path: claim, finish-and-fetch, locks, stalls, and the wait for work."""

    async def begin_transaction(self) -> JobTransaction:
        """A transaction for one job's processor (backends with ``joins_transactions``)."""
        raise InvalidArgument("transactional=True needs a PostgreSQL queue: a processor's writes can join only "
                              "a database transaction")

    @abc.abstractmethod
    async def move_to_active(self, token: str, now: int) -> NextJob:
        """Claim the next job for ``token`` (promoting due delayed jobs, honouring pause, limits)."""

    @abc.abstractmethod
    async def move_to_finished(self, job_id: str, job_opts: Mapping[str, Any], target: str, value: str,  # (Job.opts)
                               token: str, now: int, fetch_next: bool,
                               fields_to_update: Optional[Mapping[str, str]] = None,
                               group_id: Optional[str] = None) -> Optional[NextJob]:
        """Complete (``target="completed"``, ``value`` = JSON return value) or fail for good
        (``"failed"``, ``value`` = reason) an active job, then claim the next one when ``fetch_next``."""

    async def move_to_active_many(self, tokens: Sequence[str], now: int) -> list[NextJob]:
        """Claim up to ``len(tokens)`` jobs, the i-th with lock ``tokens[i]`` (a batch): one reply per
        claim made, in order; claiming stops at the first that finds no job (that reply is last,
        with its rate-limit delay / next delayed due time). This default claims one by one; the
        backends override it with one round trip."""
        replies: list[NextJob] = []
        for token in tokens:
            reply = await self.move_to_active(token, now)
            replies.append(reply)
            if reply[0] is None or reply[1] is None:
                break
        return replies

    async def take_group_jobs(self, group_id: str, tokens: Sequence[str], now: int) -> list[NextJob]:
        """Group affinity of a batch: take up to ``len(tokens)`` of the group's next held jobs (in group
        order) straight into active, the i-th locked with ``tokens[i]``; one reply per job taken.
        Backends without groups (PostgreSQL) take none."""
        return []

    async def finish_many(self, jobs: Sequence[FinishJob], now: int) -> list[Optional[BaseException]]:
        """Complete or fail for good several active jobs (a batch; no next job fetched): per job None
        when finished, or the exception that refused it (the others still finish). This default
        finishes one by one; the backends override it with one round trip."""
        results: list[Optional[BaseException]] = []
        for job in jobs:
            try:
                await self.move_to_finished(job.job_id, job.job_opts, job.target, job.value, job.token, now,
                                            False, job.fields_to_update, group_id=job.group_id)
                results.append(None)
            except Exception as err:
                results.append(err)
        return results

    @abc.abstractmethod
    async def move_to_delayed(self, job_id: str, now: int, delay: int, token: str, *,
                              skip_attempt: bool = False, fields_to_update: Optional[Mapping[str, str]] = None,
                              fetch_next: bool = False) -> Optional[NextJob]:
        """Back an active job off for ``delay`` ms (a retry with backoff, or the processor's own)."""

    @abc.abstractmethod
    async def retry_job(self, job_id: str, lifo: bool, token: str, now: int,
                        fields_to_update: Optional[Mapping[str, str]] = None) -> None:
        """Put an active job straight back to waiting for its next attempt."""

    @abc.abstractmethod
    async def extend_locks(self, job_ids: Sequence[str], tokens: Sequence[str], duration: int) -> list[str]:
        """Renew the locks; returns the ids whose lock could not be renewed."""

    @abc.abstractmethod
    async def extend_lock(self, job_id: str, token: str, duration: int) -> bool:
        """Renew one lock; False when it is not held with ``token``."""

    @abc.abstractmethod
    async def move_stalled_jobs_to_wait(self, now: int) -> list[str]:
        """One stalled check: returns the ids moved back to waiting."""

    @abc.abstractmethod
    async def move_job_from_active_to_wait(self, job_id: str, token: str) -> int:
        """Put an active job back to waiting (RateLimitError); returns the queue's rate-limit TTL."""

    @abc.abstractmethod
    async def move_to_waiting_children(self, job_id: str, token: str, now: int, child_key: str = "") -> bool:
        """Park a parent until its children finish; False when it has none pending."""

    @abc.abstractmethod
    async def wait_for_job(self, timeout: float) -> Optional[tuple[str, float]]:
        """Block up to ``timeout`` s until work may be there; ``(member, due ms)`` when woken, else None."""

    async def wake_at(self, due_ms: int) -> None:
        """Make a blocked `wait_for_job` return by ``due_ms`` (a delayed job learnt of meanwhile)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the channel's connections."""


class EventsReader(abc.ABC):
    """A cursor over the queue's events, as QueueEvents reads them."""

    @abc.abstractmethod
    async def last_id(self) -> str:
        """The id of the newest event now ("0-0" / "0" when none): where "$" starts."""

    @abc.abstractmethod
    async def read(self, after_id: str, block_ms: int) -> list[tuple[str, dict[str, str]]]:
        """Events after ``after_id``, waiting up to ``block_ms`` for the first (0: forever)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the reader's connection."""


@dataclass
class QueueFigures:
    """One queue's figures for a metrics scrape (`QueueBackend.get_figures`)."""

    #: job counts, one per state asked, in that order (as `QueueBackend.get_counts`)
    counts: list[int]
    #: Node's metrics totals (``getMetrics(...).meta.count``) of completed and failed jobs
    completed_total: int
    failed_total: int
    #: the fields (at least ``timestamp``) of the job next in line of the wait list and of the
    #: prioritized set (0, 1 or 2 jobs)
    next_waiting: list[JobFields]
    #: the workers (of any language) connected to the queue, as `get_client_list` finds them
    workers: int


class GroupGate(abc.ABC):
    """One queue's per-group gate (docs/groups.md), as `Queue`'s group methods use it. ``gid`` None
    names the queue's default where a setting has one. Backends without groups have none
    (`QueueBackend.groups` raises `NotSupportedOnBackend`)."""

    async def ready(self) -> None:
        """Check the gate can be used (on PostgreSQL: our objects are installed); raise if not."""

    @abc.abstractmethod
    async def set_concurrency(self, gid: Optional[str], concurrency: int) -> None:
        """Let up to ``concurrency`` jobs of the group (None: of every group without its own) run at once."""

    @abc.abstractmethod
    async def set_ordering_delay(self, gid: Optional[str], ms: Optional[int]) -> None:
        """The ordering delay of the group (None: the queue's); ``ms`` None removes the group's own."""

    @abc.abstractmethod
    async def set_paused(self, gid: str, paused: bool) -> None:
        """Pause (hold every not-yet-released job of) or resume a group."""

    @abc.abstractmethod
    async def set_rate_limit(self, gid: Optional[str], limit: Optional[tuple[int, int]]) -> None:
        """The group's rate limit ``(max, duration_ms)`` (None: the queue's default for groups without
        their own); ``limit`` None removes the setting."""

    @abc.abstractmethod
    async def get_rate_limit(self, gid: Optional[str]) -> Optional[tuple[int, int]]:
        """The rate limit in force for the group (its own, else the queue's), or the queue's; None: none."""

    @abc.abstractmethod
    async def rate_limit_ttl(self, gid: str) -> int:
        """Ms before the group may start another job by its rate limits (manual or not); 0: now."""

    @abc.abstractmethod
    async def rate_limit_job(self, job_id: str, token: str, ms: int) -> int:
        """The manual group rate limit: the active job ``job_id`` (lock ``token``) leaves active and
        waits its turn; its group starts no job for ``ms``. Returns ``ms``; raises as upstream's
        moveJobFromActiveToWait (lock lost, not active) or for a job that is not a group job."""

    @abc.abstractmethod
    async def get_concurrency(self, gid: str) -> int: ...

    @abc.abstractmethod
    async def get_ordering_delay(self, gid: Optional[str]) -> int: ...

    @abc.abstractmethod
    async def is_paused(self, gid: str) -> bool: ...

    @abc.abstractmethod
    async def held_count(self, gid: str) -> int:
        """How many of the group's jobs wait for their turn."""

    @abc.abstractmethod
    async def held_ids(self, gid: str, start: int, end: int) -> list[str]:
        """The ids of the group's held jobs, in the order they will run (``end`` -1: to the last)."""

    @abc.abstractmethod
    async def counts_per_priority(self, gid: str, priorities: Sequence[int]) -> list[int]:
        """How many of the group's held jobs have each group priority of ``priorities`` (0: none), in order."""

    @abc.abstractmethod
    async def change_held_priority(self, job_id: str, priority: int, lifo: bool) -> bool:
        """Give the held group job ``job_id`` group priority ``priority``, moving it within its group
        (after the held jobs of that priority added before it, before those added after it); False,
        changing nothing, when it is not a held group job. Raises `InvalidArgument` for ``lifo`` or
        for a priority >= 1 on a job with an order_ms."""

    @abc.abstractmethod
    async def held_total(self, batch: int) -> int:
        """How many jobs wait for their turn, over every group (groups read ``batch`` at a time)."""

    @abc.abstractmethod
    async def active_count(self, gid: str) -> int:
        """How many of the group's jobs are active (started by a worker, not finished)."""

    @abc.abstractmethod
    async def list(self) -> list[dict[str, Any]]:
        """Every group with jobs (or paused): ``{"id", "waiting", "running", "paused", "concurrency"}``,
        by id; one whose jobs not finished yet include one with a maxSize also ``"max_size"``
        (`stored_max_size` of the most recently added such job); one with a rate limit in force also
        ``"rate_limit"`` (``{"max", "duration"}``, None for a manual limit alone) and
        ``"rate_limit_ttl"`` (ms)."""

    @abc.abstractmethod
    async def delete_held(self, gid: str) -> int:
        """Remove the group's held jobs (released ones are left); returns how many."""

    @abc.abstractmethod
    async def sweep(self) -> int:
        """Release every group whose current job has finished; returns how many jobs were released."""


class QueueBackend(abc.ABC):
    """One queue on one datastore. Built by `open_backend`; shared by a Queue's jobs."""

    #: "redis" or "postgres": named in `NotSupportedOnBackend` and in docs
    kind: str = ""
    #: whether adds can join the caller's transaction (`in_transaction`) and a worker's completion its
    #: processor's (`WorkerChannel.begin_transaction`): a database backend
    joins_transactions: bool = False
    #: the datastore's name in messages ("Redis", "PostgreSQL")
    label: str = ""
    #: exception classes that mean the datastore could not be reached (retried with back-off)
    transient_errors: tuple[type[BaseException], ...] = ()

    name: str
    #: Node's qualifiedName: the ``queue`` of a ``parent=`` option (``<prefix>:<name>`` on Redis)
    qualified_name: str

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Where this backend connects, for messages (never with a password)."""

    @property
    def address(self) -> str:
        """The datastore's address alone (a URL without its password), for "cannot reach ... at"."""
        return self.description

    def is_transient(self, err: BaseException) -> bool:
        """Whether ``err`` is trouble that passes (connection lost, server busy): sent again."""
        return isinstance(err, self.transient_errors)

    # -- life cycle ------------------------------------------------------------------------
    @abc.abstractmethod
    async def connect(self) -> None:
        """Check the datastore answers (and, on PostgreSQL, the schema); raise naming the address."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close what this backend opened (a client passed in by the user stays open)."""

    async def disconnect(self) -> None:
        """Drop this backend's connections now (Node's ``disconnect``); the next call connects
        again. By default the same as `close`."""
        await self.close()

    @abc.abstractmethod
    def for_queue(self, name: str, prefix: Optional[str] = None) -> "QueueBackend":
        """A backend for another queue on the same connection (flows across queues)."""

    @abc.abstractmethod
    def split_job_key(self, key: str) -> tuple[Optional[str], str, str]:
        """A job key as `get_dependencies` lists them → (prefix, or None for this backend's own,
        queue name, job id)."""

    # -- adding ------------------------------------------------------------------------------
    def in_transaction(self, connection: Any) -> "QueueBackend":
        """This queue's backend writing on the caller's own database ``connection``, inside the
        caller's open transaction (``add(..., transaction=conn)``): its adds commit or roll back
        with the caller's work. Only a database backend can join a caller's transaction; the
        default refuses."""
        raise InvalidArgument(
            f"transaction= is for PostgreSQL queues: {self.description} is on {self.label}, whose writes "
            f"cannot join a database transaction (got transaction={type(connection).__name__})")

    @abc.abstractmethod
    async def add_jobs(self, jobs: Sequence[NewJob]) -> list[Any]:
        """Add each job (one round trip where possible); per item its id, or the exception that
        refused it (the others are still added, as Node's addBulk)."""

    @abc.abstractmethod
    def prepare_flow_node(self, job: NewJob, *, parent_key: Optional[str], parent_link: Optional[dict[str, Any]],
                          has_children: bool) -> Any:
        """Validate and encode one flow node (``job.job_id`` set; ``parent_link`` is upstream's
        ``{"id", "queueKey", "fpof"...}``); nothing is sent. Has ``name``, ``data``, ``opts``,
        ``timestamp`` like `NewJob`."""

    @abc.abstractmethod
    async def add_flow(self, nodes: Sequence[Any]) -> list[Any]:
        """Add prepared flow nodes (parents before children, as `FlowProducer` orders them) in one
        transaction, then release parents left without pending children; per node its id or code."""

    # -- reading -----------------------------------------------------------------------------
    @abc.abstractmethod
    async def get_job(self, job_id: str) -> Optional[JobFields]: ...

    @abc.abstractmethod
    async def get_state(self, job_id: str) -> str: ...

    @abc.abstractmethod
    async def is_finished(self, job_id: str) -> tuple[int, Optional[str]]:
        """(1, return value JSON) when completed, (2, failed reason) when failed, (0, None) when not
        finished, (-1, None) when there is no such job."""

    @abc.abstractmethod
    async def get_counts(self, states: Sequence[str], delayed_timestamp: Optional[int] = None) -> list[int]:
        """Counts of jobs in each state (Python names: waiting, prioritized, waiting-children ...);
        with ``delayed_timestamp`` (ms), ``delayed`` counts only jobs due strictly before it (Node's
        ``getCounts(types, delayedTimestamp)``)."""

    @abc.abstractmethod
    async def get_jobs(self, states: Sequence[str], start: int, end: int, asc: bool
                       ) -> list[tuple[str, JobFields]]: ...

    @abc.abstractmethod
    async def get_job_logs(self, job_id: str, start: int, end: int, asc: bool) -> tuple[list[str], int]: ...

    @abc.abstractmethod
    async def get_counts_per_priority(self, priorities: Sequence[int]) -> list[int]: ...

    @abc.abstractmethod
    async def get_metrics(self, type: str, start: int, end: int) -> tuple[list[Any], list[Any], int]:
        """(meta [count, prevTS, prevCount], data points newest first, number of points)."""

    @abc.abstractmethod
    async def get_figures(self, states: Sequence[str]) -> QueueFigures:
        """What a metrics scrape reads of this queue (`QueueFigures`, counts of ``states``), in as few
        round trips as the datastore allows (`bullmq-compat metrics`, see _prometheus)."""

    @abc.abstractmethod
    async def get_rate_limit_ttl(self, max_jobs: Optional[int]) -> int: ...

    @abc.abstractmethod
    async def get_deduplication_job_id(self, deduplication_id: str) -> Optional[str]: ...

    @abc.abstractmethod
    async def get_client_list(self) -> list[dict[str, str]]:
        """The connections of this queue's workers (of any language), as Node's getWorkers finds
        them: dicts with at least ``name`` (the connection's name)."""

    @abc.abstractmethod
    async def get_queue_events_clients(self) -> list[dict[str, str]]:
        """The connections of this queue's QueueEvents readers (Node's ``getQueueEvents``: those
        named ``<client name>:qe``), as `get_client_list` lists clients."""

    @abc.abstractmethod
    async def is_maxed(self) -> bool:
        """Whether the queue's global concurrency is reached (Node's ``isMaxed``: active jobs >=
        meta ``concurrency``)."""

    @abc.abstractmethod
    async def paginate_dependencies(self, parent_id: str, type: str, start: int, end: int) -> dict[str, Any]:
        """One page of a parent's children (Node's ``Queue.getDependencies`` through
        ``paginate``): ``type`` "processed" (children done, with values) or "pending" (children
        not done); ``end`` -1 for all. Returns ``{"items": [{"id": child key, "v": value}] (a
        value that is not JSON gives ``"err"`` instead of ``"v"``; pending items have ``id``
        only), "jobs": [one JobFields per item, in the same order, ``{}`` where that child's hash is
        gone], "total": how many children of that type there are}``."""

    @abc.abstractmethod
    async def remove_orphaned_jobs(self, count: int, limit: int) -> int:
        """Delete job data that no state of the queue lists (Node's ``removeOrphanedJobs``),
        scanning about ``count`` keys a batch, stopping once ``limit`` (0: no limit) are removed;
        returns how many jobs were removed."""

    # -- queue meta (pause, limits, versions) -------------------------------------------------
    @abc.abstractmethod
    async def set_meta(self, values: Mapping[str, Any]) -> None: ...

    @abc.abstractmethod
    async def get_meta_field(self, field: str) -> Optional[str]: ...

    @abc.abstractmethod
    async def get_meta(self) -> dict[str, str]: ...

    @abc.abstractmethod
    async def remove_meta_fields(self, fields: Sequence[str]) -> int: ...

    # -- changing one job --------------------------------------------------------------------
    @abc.abstractmethod
    async def update_data(self, job_id: str, data_json: str) -> None: ...

    @abc.abstractmethod
    async def update_progress(self, job_id: str, progress_json: str) -> None: ...

    @abc.abstractmethod
    async def add_log(self, job_id: str, row: str, keep_logs: Optional[int]) -> int: ...

    @abc.abstractmethod
    async def clear_logs(self, job_id: str, keep_logs: Optional[int] = None) -> None:
        """Remove a job's log lines, keeping the newest ``keep_logs`` when it is > 0 (Node's
        ``clearLogs``); a job without logs is not an error."""

    @abc.abstractmethod
    async def remove(self, job_id: str, remove_children: bool) -> int: ...

    @abc.abstractmethod
    async def reprocess_job(self, job_id: str, state: str, lifo: bool, reset_attempts_made: bool,
                            reset_attempts_started: bool, group_id: Optional[str] = None) -> None:
        """Retry a finished (failed or completed) job."""

    @abc.abstractmethod
    async def promote(self, job_id: str) -> None: ...

    @abc.abstractmethod
    async def change_delay(self, job_id: str, delay: int, now: int) -> None: ...

    @abc.abstractmethod
    async def change_priority(self, job_id: str, priority: int, lifo: bool) -> None: ...

    # -- managing the queue ------------------------------------------------------------------
    @abc.abstractmethod
    async def pause(self, paused: bool) -> None: ...

    @abc.abstractmethod
    async def drain(self, delayed: bool) -> None: ...

    @abc.abstractmethod
    async def clean(self, state: str, timestamp: int, limit: int) -> list[str]: ...

    @abc.abstractmethod
    async def obliterate(self, force: bool, count: int) -> None: ...

    @abc.abstractmethod
    async def retry_jobs(self, state: str, count: int, timestamp: int) -> None: ...

    @abc.abstractmethod
    async def promote_jobs(self, count: int) -> None: ...

    @abc.abstractmethod
    async def set_rate_limit(self, expire_ms: int) -> None:
        """Rate-limit the whole queue for ``expire_ms`` (Worker.rate_limit)."""

    @abc.abstractmethod
    async def remove_rate_limit_key(self) -> int:
        """End the queue's rate-limit window now (Node's ``removeRateLimitKey``); 1 when there was one."""

    @abc.abstractmethod
    async def remove_deduplication_key(self, deduplication_id: str, job_id: Optional[str] = None) -> int:
        """Forget a deduplication id (Node's ``deleteDeduplicationKey``); with ``job_id``, only
        while the id still points at that job (Node's ``removeDeduplicationKey`` script, used by
        ``Job.removeDeduplicationKey``). 1 when a key was removed, else 0."""

    @abc.abstractmethod
    async def trim_events(self, max_length: int) -> int: ...

    @abc.abstractmethod
    async def publish_event(self, fields: Mapping[str, Any], max_events: int) -> str: ...

    # -- flows --------------------------------------------------------------------------------
    @abc.abstractmethod
    async def get_processed_children_values(self, job_id: str) -> dict[str, str]:
        """``{child key: JSON text of its return value}``."""

    @abc.abstractmethod
    async def get_ignored_children_failures(self, job_id: str) -> dict[str, str]: ...

    @abc.abstractmethod
    async def get_dependencies(self, job_id: str, pages: Mapping[str, Optional[tuple[int, int]]]) -> dict[str, Any]:
        """A parent's children by state: with every page None, all of them (``processed`` and
        ``ignored`` as {child key: text}, ``unprocessed`` and ``failed`` as [child key]); else one
        page ``(cursor, count)`` of each state asked, and ``next_<state>_cursor`` for each."""

    @abc.abstractmethod
    async def get_dependency_counts(self, job_id: str, types: Sequence[str]) -> list[int]: ...

    @abc.abstractmethod
    async def remove_child_dependency(self, job_id: str, parent_key: str) -> bool: ...

    @abc.abstractmethod
    async def remove_unprocessed_children(self, job_id: str) -> None: ...

    # -- job schedulers (option dicts in upstream's stored form: short keys) --------------------
    @abc.abstractmethod
    async def add_job_scheduler(self, scheduler_id: str, next_millis: Optional[int], scheduler_opts: Mapping[str, Any],
                                template_data_json: str, template_opts: Mapping[str, Any],
                                delayed_job_opts: Mapping[str, Any], now: int,
                                producer_id: Optional[str]) -> tuple[str, int]:
        """Create or replace a scheduler and its next job; returns (that job's id, its delay)."""

    @abc.abstractmethod
    async def update_job_scheduler(self, scheduler_id: str, next_millis: Optional[int], template_data_json: str,
                                   delayed_job_opts: Mapping[str, Any], now: int, producer_id: str) -> Optional[str]:
        """Make the iteration after ``producer_id``'s (once, whoever asks); its id, or None."""

    @abc.abstractmethod
    async def remove_job_scheduler(self, scheduler_id: str) -> bool: ...

    @abc.abstractmethod
    async def get_job_scheduler(self, scheduler_id: str) -> tuple[dict[str, str], Optional[int]]:
        """(the scheduler's fields as upstream's Redis hash holds them, its next run ms)."""

    @abc.abstractmethod
    async def get_job_schedulers(self, start: int, end: int, asc: bool
                                 ) -> list[tuple[str, dict[str, str], Optional[int]]]: ...

    @abc.abstractmethod
    async def get_job_schedulers_count(self) -> int: ...

    @abc.abstractmethod
    async def is_job_scheduler(self, scheduler_id: str) -> bool: ...

    # -- per-group FIFO ------------------------------------------------------------------------
    def groups(self) -> GroupGate:
        """This queue's group gate; `NotSupportedOnBackend` where the backend has none."""
        from bullmq_compat._errors import NotSupportedOnBackend

        raise NotSupportedOnBackend("groups (group=, the group API)", self.kind)

    # -- workers and events ------------------------------------------------------------------
    @abc.abstractmethod
    async def open_worker_channel(self, settings: WorkerSettings, client_name: str, *,
                                  fast: bool = True) -> WorkerChannel: ...

    @abc.abstractmethod
    async def open_events_reader(self, client_name: str) -> EventsReader: ...


def metrics_total(meta: Sequence[Any]) -> int:
    """The total of a `QueueBackend.get_metrics` meta (``[count, prevTS, prevCount]``, text or bytes), 0 when unset."""
    value = meta[0] if meta else 0
    try:
        return int(float(value.decode() if isinstance(value, bytes) else value or 0))
    except (TypeError, ValueError):
        return 0


# -- Relay (BullMQ 6.7's fleet pub/sub) --------------------------------------------------------------
@dataclass
class RelayEntry:
    """One entry of a node's inbox, as upstream's readInbox decodes it: ``kind`` "msg" (other kinds,
    added by newer versions, are skipped), the ``topic``, the message id ``mid`` (a decimal string),
    the publisher's ``ts`` (ms), ``data`` (the JSON text as published) and the node's ``endpoints``
    (endpoint ids) the message is for."""

    kind: str
    topic: str
    mid: str
    ts: int
    data: str
    endpoints: list[str]


@dataclass
class RelayBatch:
    """What `RelayBackend.read_inbox` read: its entries and the cursor after them."""

    entries: list[RelayEntry]
    cursor: Any


class RelayBackend(abc.ABC):
    """One relay node's datastore side, in Node's words (``IRelayBackend``): every operation is one
    of upstream's ``relay*`` Lua scripts (Redis) or ``relay_*`` SQL functions (PostgreSQL), passed
    its arguments, its answer decoded. `bullmq_compat.Relay` runs the timers, reads the inbox and
    calls listeners. Refusals of the datastore (topic grammar, sizes, a layout mismatch) raise
    `RelayError` with upstream's code."""

    #: "redis" or "postgres"
    kind: str = ""
    #: the datastore's name in messages ("Redis", "PostgreSQL")
    label: str = ""
    #: the cursor a new node reads its inbox from (Redis: "0-0"; PostgreSQL: its own)
    initial_inbox_cursor: Any = None
    #: exception classes that mean the datastore could not be reached (retried with back-off)
    transient_errors: tuple[type[BaseException], ...] = ()
    #: set by `bullmq_compat.Relay`: where a backend reports errors of its background work (Node's
    #: backend 'error' events, e.g. a namespace registry touch that failed three times)
    on_error: Optional[Callable[[BaseException], None]] = None

    @abc.abstractmethod
    async def wait_until_ready(self) -> None:
        """Connect and check the datastore can host a relay (Redis >= 6.2; PostgreSQL: migrated)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close what this backend opened (interrupting a blocked `read_inbox`)."""

    @abc.abstractmethod
    def interrupt_inbox(self) -> None:
        """Make a blocked or later `read_inbox` return at once with no entries (closing)."""

    @abc.abstractmethod
    async def register_node(self, node_id: str, lease_ms: int, info: Mapping[str, Any],
                            inbox_max_length: int) -> None:
        """Register (or re-register) the node with a lease of ``lease_ms``; ``info`` is Node's
        ``{"name", "host", "pid", "version"}``."""

    @abc.abstractmethod
    async def heartbeat(self, node_id: str, lease_ms: int) -> bool:
        """Renew the lease; False when the node's lease had expired (or it was swept): recover."""

    @abc.abstractmethod
    async def unregister_node(self, node_id: str) -> bool:
        """Remove the node and its subscriptions; whether it was registered."""

    @abc.abstractmethod
    async def sweep(self, limit: int) -> list[str]:
        """Remove up to ``limit`` nodes whose lease expired; their ids."""

    @abc.abstractmethod
    async def subscribe(self, node_id: str, endpoint_id: str, pattern: str) -> tuple[bool, Optional[dict[str, Any]]]:
        """Subscribe endpoint ``endpoint_id`` of the node to ``pattern``: (added, the exact topic's
        retained message ``{"mid", "ts", "data"}`` or None)."""

    @abc.abstractmethod
    async def remove_endpoint(self, node_id: str, endpoint_id: str) -> Any:
        """Unsubscribe one endpoint."""

    @abc.abstractmethod
    async def publish(self, topic: str, data: str, *, ts: int, retain_ms: int, max_size: int) -> dict[str, Any]:
        """Publish ``data`` (JSON text) on ``topic``: ``{"mid": str, "nodes": int, "endpoints": int}``."""

    @abc.abstractmethod
    async def delete_retained(self, topic: str) -> bool:
        """Delete the topic's retained message; whether there was one."""

    @abc.abstractmethod
    async def read_inbox(self, node_id: str, cursor: Any, *, block_ms: int, count: int) -> RelayBatch:
        """The node's next entries after ``cursor`` (up to ``count``), waiting up to ``block_ms`` for one."""

    @abc.abstractmethod
    async def trim_inbox(self, node_id: str, cursor: Any, max_length: int) -> int:
        """Drop consumed entries (up to ``cursor``), cap the inbox at ``max_length``; the unread backlog."""

    @abc.abstractmethod
    async def get_counts(self) -> dict[str, int]:
        """``{"nodes", "subscriptions", "patterns", "retained"}`` of the namespace."""

    @abc.abstractmethod
    async def get_nodes(self, start: int, end: int) -> list[dict[str, Any]]:
        """Nodes in registration order: ``{"id", "info", "registered_at", "lease_until",
        "last_heartbeat", "backlog", "dropped", "subscriptions"}``."""

    @abc.abstractmethod
    async def get_subscriptions(self, node_id: Optional[str], pattern: Optional[str], start: int,
                                end: int) -> list[dict[str, str]]:
        """``{"node_id", "endpoint_id", "pattern"}``, of one node or one pattern, or all."""

    @abc.abstractmethod
    async def get_patterns(self, start: int, end: int) -> list[dict[str, Any]]:
        """``{"pattern", "subscriptions"}`` by pattern."""

    @abc.abstractmethod
    async def get_retained(self, start: int, end: int) -> list[dict[str, Any]]:
        """Retained messages by expiry: ``{"topic", "expires_at", "mid", "ts", "data"}`` (data as JSON text)."""

    @abc.abstractmethod
    async def get_node_connections(self, node_id: str) -> list[dict[str, Any]]:
        """The node's inbox connection(s) as the datastore lists them (address, age, idle)."""

    @abc.abstractmethod
    async def get_namespaces(self) -> list[str]:
        """Namespaces in use on this datastore (Redis: under this prefix)."""
