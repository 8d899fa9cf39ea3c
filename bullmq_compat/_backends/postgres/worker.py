"""A worker's hot path on PostgreSQL: upstream's worker commands, called as Node's Postgres backend calls them.

Each method is one of upstream's SQL commands with the parameters Node's ``PostgresQueueBackend``
passes (``moveToActive``, ``moveToCompleted``/``moveToFailed`` with ``fetchNext``, ``moveToDelayed``,
``retryJob``, ``extendLocks`` ...), so a Node worker on the same schema and ours share every job.
Retries are decided by the caller (`Job.move_to_failed`: ``move_to_delayed`` or ``retry_job`` while
attempts remain); ``move_to_failed_fetch`` fails for good. The parent policies (fail / continue /
ignore / remove dependency on failure) are read by upstream's functions from the child's stored
``opts``: Node passes none of them, nor do we.

Connections: the channel keeps `Lanes` (lanes.py) -- up to `lane_count` sessions of its own
(``settings.extra["pool_size"]``, else half ``["concurrency"]``), opened as they are needed, each
running one prepared statement (or a batch of several slots' claims and finishes, one commit) at a
time through libpq -- and one session named
``client_name`` (``<queue>`` or ``<queue>:w:<worker>``, what Node's getWorkers looks for) to wait
on. A psycopg_pool checkout per call cost more client CPU than the call itself (measured with
scripts/bench_postgres.py), hence the lanes.

Waiting (`wait_for_job`): ``LISTEN bullmq_jobs`` (one channel for the database, payload = the queue
name), then probe ``has_waiting_job`` and ``next_delay`` on that session -- on every wait, as Node,
so a job added before the LISTEN or while the session was being rebuilt is not missed -- and sleep
until a NOTIFY for our queue, the next delayed job's due time, a `wake_at` time or the timeout.
A lost session is rebuilt (re-LISTEN, probe) at once; when that fails too, the error is one of
`PostgresBackend.transient_errors` and the worker retries with back-off.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from bullmq_compat._backends.base import FinishJob, JobFields, JobTransaction, NextJob, WorkerChannel, WorkerSettings
from bullmq_compat._backends.postgres import rows, sql
from bullmq_compat._backends.postgres.lanes import Lanes, TextRow, field_names, text_rows
from bullmq_compat._errors import (
    InvalidArgument,
    InvalidJobData,
    PostgresUnavailable,
    script_error,
)

if TYPE_CHECKING:
    import psycopg

    from bullmq_compat._backends.postgres.backend import PostgresBackend
    from bullmq_compat._backends.postgres.connection import PostgresConnection

logger = logging.getLogger("bullmq_compat.postgres")

#: the concurrency assumed when ``settings.extra`` names none
DEFAULT_CONCURRENCY = 10
#: query sessions at most, whatever the concurrency (node-postgres' Pool default)
MAX_LANES = 10
#: the NOTIFY channel producers post to (upstream's ``listen_jobs``); the payload is the queue name
JOBS_CHANNEL = "bullmq_jobs"
#: how long a wait may sleep when the probe keeps saying "a job waits" but claims come back empty
#: (the queue's global concurrency is reached, or its jobs are locked): poll, don't spin
SUSPECT_PROBE_WAIT_S = 1.0

#: the commands whose calls by several slots may share one transaction (each one job's atomic step)
BATCHABLE = frozenset({"move_to_active", "move_to_completed_fetch", "move_to_failed_fetch", "move_to_completed",
                       "move_to_failed"})

_NO_JOB: NextJob = (None, None, 0, 0)


def now_ms() -> int:
    return int(time.time() * 1000)


def keep_params(value: Any) -> tuple[bool, Optional[int], Optional[int]]:
    """Node's normalizeKeep: a removeOnComplete/removeOnFail value as (remove all, keep age s, keep count)."""
    if value is True:
        return True, None, None
    if value is None or value is False:
        return False, None, None
    if isinstance(value, (int, float)):
        return False, None, int(value)
    if isinstance(value, Mapping):
        age, count = value.get("age"), value.get("count")
        return False, None if age is None else int(age), None if count is None else int(count)
    return False, None, None


def json_text(text: Optional[str], what: str) -> Optional[str]:
    """JSON text we encoded ourselves (a return value, a stack trace) for a ``jsonb`` parameter:
    only what jsonb cannot store is refused here (`InvalidJobData`), without parsing it again."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidJobData(f"job {what} must be JSON text (a str), not {type(text).__name__}")
    if rows.has_nul(text):
        raise InvalidJobData(f"job {what} holds the character U+0000, which PostgreSQL's jsonb cannot store")
    return text


#: the ``jsonb`` columns of ``job``: parsed from their text, as psycopg would, for `rows.job_fields`
_JSON_COLUMNS = ("data", "opts", "progress", "return_value", "stacktrace")


def job_fields(row: TextRow) -> JobFields:
    """A ``job`` row read as text, as `rows.job_fields` makes it from psycopg's typed row (the same
    `JobFields` as ``get_job``; integer columns are text already, as the function wants them)."""
    typed: dict[str, Any] = dict(row)
    for column in _JSON_COLUMNS:
        text = row.get(column)
        if text is not None:
            typed[column] = json.loads(text)
    return rows.job_fields(typed)


def lane_count(extra: Mapping[str, Any]) -> int:
    """The query sessions of a channel: ``extra["pool_size"]``, else half the concurrency (at least
    1, at most `MAX_LANES`). Half, so that when every slot finishes at once the calls of two slots
    share a lane and a commit (`Lanes`): measured faster than a session per slot (the commits,
    not the sessions, are what PostgreSQL processing waits on)."""
    if extra.get("pool_size"):
        return max(1, int(extra["pool_size"]))
    concurrency = int(extra.get("concurrency") or DEFAULT_CONCURRENCY)
    return max(1, min(MAX_LANES, -(-concurrency // 2)))


#: what ``settings.extra["synchronous_commit"]`` may be (PostgreSQL's values; None: the server's)
SYNCHRONOUS_COMMIT = ("on", "off", "local", "remote_write", "remote_apply")


def synchronous_commit(extra: Mapping[str, Any]) -> Optional[str]:
    """The opt-in ``synchronous_commit`` of the worker's query sessions. "off" trades durability for
    throughput, as Redis's default persistence does: a server crash may forget the last few hundred
    ms of finishes and claims (never an add: producers are not affected), and those jobs then run
    again after the stalled check -- BullMQ's at-least-once. Node has no such option: by default
    (None) the server's setting applies, as for Node."""
    value = extra.get("synchronous_commit")
    if value is None:
        return None
    if value not in SYNCHRONOUS_COMMIT:
        raise InvalidArgument(f"synchronous_commit={value!r} must be one of {', '.join(SYNCHRONOUS_COMMIT)}")
    return str(value)


def transient(err: BaseException) -> BaseException:
    """Connection trouble psycopg does not call OperationalError (a closed connection, a socket
    error) as `PostgresUnavailable`, which the worker retries; anything else as it is."""
    import psycopg

    if isinstance(err, (psycopg.InterfaceError, OSError)) and not isinstance(err, PostgresUnavailable):
        return PostgresUnavailable(f"lost the PostgreSQL connection: {err}")
    return err


def is_connection_error(err: BaseException) -> bool:
    import psycopg

    return isinstance(err, (psycopg.OperationalError, psycopg.InterfaceError, OSError))


class JobsListener:
    """The named session a worker waits on: LISTENs on ``bullmq_jobs`` for the time of a wait.

    Between waits the session is UNLISTENed: nobody reads it while the worker is busy, and a
    LISTENing session that is not read holds back the server's notification queue for every
    session of the cluster (Node's ``pg`` reads its socket all the time; psycopg reads only while a
    command or ``notifies`` runs). Each wait LISTENs before it probes, so nothing added meanwhile
    is missed. The session stays open (and named) for the channel's life; it is rebuilt when lost.
    """

    def __init__(self, connection: "PostgresConnection", queue: str, client_name: str) -> None:
        self.connection = connection
        self.queue = queue
        self.client_name = client_name
        self.conn: Optional["psycopg.AsyncConnection[Any]"] = None
        self.listening = False
        self.opened = 0  # sessions opened so far (a test sees a rebuild as opened > 1)

    async def session(self) -> "psycopg.AsyncConnection[Any]":
        if self.conn is None or self.conn.closed:
            await self.drop()
            self.conn = await self.connection.open_listen_session(self.client_name or None)
            self.opened += 1
        return self.conn

    async def listen(self) -> "psycopg.AsyncConnection[Any]":
        conn = await self.session()
        if not self.listening:
            await sql.execute(conn, sql.command("listen_jobs"))
            self.listening = True
        return conn

    async def unlisten(self) -> None:
        conn = self.conn
        if conn is None or conn.closed or not self.listening:
            return
        try:
            await sql.execute(conn, f"UNLISTEN {JOBS_CHANNEL}")
            self.listening = False
        except Exception:  # a lost session: the next wait rebuilds it
            await self.drop()

    async def probe(self) -> tuple[bool, Optional[int]]:
        """(a claimable job waits, the next delayed job's due time ms or None), asked on the session
        once it LISTENs: a NOTIFY arriving meanwhile is kept by psycopg for the next `notifies`."""
        conn = await self.listen()
        present = (await sql.execute(conn, sql.command("has_waiting_job"), [self.queue])).rows[0]["present"]
        due = (await sql.execute(conn, sql.command("next_delay"), [self.queue])).rows[0]["next_delay"]
        return bool(present), None if due is None else int(due)

    async def next_notify(self, timeout: float) -> bool:
        """True at the first NOTIFY on ``bullmq_jobs`` for our queue; False when ``timeout`` passes."""
        conn = await self.listen()
        async for notify in conn.notifies(timeout=max(timeout, 0.0)):
            if notify.channel == JOBS_CHANNEL and notify.payload == self.queue:
                return True
        return False

    async def drop(self) -> None:
        conn, self.conn = self.conn, None
        self.listening = False
        if conn is not None:
            with contextlib.suppress(Exception):
                await self.connection.close_listen_session(conn)


class PostgresWorkerChannel(WorkerChannel):
    """One worker's calls on PostgreSQL (see the module docstring).

    >>> channel = await backend.open_worker_channel(WorkerSettings(name="w1"), backend.client_name(":w:w1"))
    >>> job_fields, job_id, rate_limit_ms, next_delayed_ms = await channel.move_to_active("token-1", now_ms())
    """

    def __init__(self, backend: "PostgresBackend", settings: WorkerSettings, client_name: str) -> None:
        import psycopg

        self.backend = backend
        self.queue = backend.name
        self.settings = settings
        self.client_name = client_name
        extra = settings.extra or {}
        self.lanes = Lanes(backend.connection, lane_count(extra), synchronous_commit=synchronous_commit(extra))
        self.listener = JobsListener(backend.connection, self.queue, client_name)
        limiter = settings.limiter or {}
        self._limiter_max: Optional[int] = limiter.get("max")
        self._limiter_duration: Optional[int] = limiter.get("duration")
        self._psycopg_error: type[BaseException] = psycopg.Error
        self._wake_due: Optional[int] = None
        self._wake_changed: Optional[asyncio.Event] = None
        self._probe_woke = False  # the last wait returned because the probe said "a job waits"
        self._suspect_probe = False  # ... and claims came back empty since: the probe is not enough
        self._closed = False

    # -- running commands --------------------------------------------------------------------
    async def _run(self, name: str, params: Sequence[Any], *, job_id: Optional[str] = None,
                   op: str = "", state: str = "") -> list[TextRow]:
        try:
            return await self.lanes.run(name, params, batchable=name in BATCHABLE)
        except self._psycopg_error as err:
            mapped = sql.domain_error(err, job_id=job_id, command=op or name, state=state)
            if mapped is not None:
                raise mapped from None
            wrapped = transient(err)
            if wrapped is err:
                raise
            raise wrapped from err
        except OSError as err:
            raise transient(err) from err

    def _claim_params(self, now: int) -> list[Any]:
        """lock ms, now, worker name, limiter max, limiter duration: the tail of every claim."""
        return [int(self.settings.lock_duration), int(now), self.settings.name, self._limiter_max,
                self._limiter_duration]

    async def _next_job(self, found: list[TextRow], now: int) -> NextJob:
        """Node's buildNextJobResult: the claimed job, else the rate-limit TTL or the next delayed due time."""
        if found:
            self._probe_woke = False
            self._suspect_probe = False
            row = found[0]
            return job_fields(row), str(row["id"]), 0, 0
        if self._probe_woke:
            self._suspect_probe = True
        signal = await self._run("next_signal", [self.queue, self._limiter_max, int(now)])
        first = signal[0] if signal else {}
        ttl = int(first.get("rate_limit_ttl") or 0)
        if ttl > 0:
            return None, None, ttl, 0
        return None, None, 0, int(first.get("next_delay") or 0)

    # -- the contract ------------------------------------------------------------------------
    async def move_to_active(self, token: str, now: int) -> NextJob:
        found = await self._run("move_to_active", [self.queue, token, *self._claim_params(now)],
                                op="moveToActive")
        return await self._next_job(found, now)

    async def move_to_finished(self, job_id: str, job_opts: Mapping[str, Any], target: str, value: str,
                               token: str, now: int, fetch_next: bool,
                               fields_to_update: Optional[Mapping[str, str]] = None,
                               group_id: Optional[str] = None) -> Optional[NextJob]:
        job_id = rows.text_param(job_id, what="job_id")
        command, params = self._finish_call(job_id, job_opts, target, value, token, now, fetch_next,
                                            fields_to_update, group_id)
        found = await self._run(command, params, job_id=job_id, op="moveToFinished", state="active")
        await self._collect_metrics("completed" if target == "completed" else "failed", int(now))
        return await self._next_job(found, now) if fetch_next else None

    def _finish_call(self, job_id: str, job_opts: Mapping[str, Any], target: str, value: str, token: str,
                     now: int, fetch_next: bool, fields_to_update: Optional[Mapping[str, str]],
                     group_id: Optional[str]) -> tuple[str, list[Any]]:
        """upstream's finishing command and its parameters (Node's moveToCompleted / moveToFailed).
        A group job finishes the same way: our trigger releases its group's next job in that
        transaction (``group_id`` is not needed)."""
        completed = target == "completed"
        own = job_opts.get("remove_on_complete" if completed else "remove_on_fail")
        if own is None:
            own = job_opts.get("removeOnComplete" if completed else "removeOnFail")
        keep = keep_params(own if own is not None else
                           (self.settings.remove_on_complete if completed else self.settings.remove_on_fail))
        finished_on = int(now)
        if completed:
            head: list[Any] = [self.queue, job_id, token, json_text(value, "return value"), finished_on, *keep]
        else:
            stacktrace = (fields_to_update or {}).get("stacktrace")
            head = [self.queue, job_id, token, rows.text_param(value, what="failed reason"),
                    json_text(stacktrace, "stacktrace"),
                    finished_on, *keep]
        command = ("move_to_completed" if completed else "move_to_failed") + ("_fetch" if fetch_next else "")
        return command, head + self._claim_params(now) if fetch_next else head

    async def begin_transaction(self) -> "PostgresJobTransaction":
        """A pooled session of ours (the schema's search_path) with BEGIN sent, for one processor. A
        session the server ended while it was idle in the pool (a restart, pg_terminate_backend,
        idle_session_timeout) is dropped and another one taken: the job's attempt is not charged
        for a session it never used."""
        connection = self.backend.connection
        for attempt in range(3):
            conn = await connection.borrow()
            try:
                await conn.execute("BEGIN")
            except Exception as err:
                await connection.discard(conn)
                if attempt == 2 or not is_connection_error(err):
                    raise transient(err) from err
                continue
            except BaseException:
                await connection.discard(conn)
                raise
            return PostgresJobTransaction(self, conn)
        raise AssertionError("unreachable")

    def _mapped(self, err: BaseException, *, job_id: Optional[str] = None, op: str = "",
                state: str = "") -> BaseException:
        """A failed command's error as `_run` raises it (upstream's refusal, or connection trouble)."""
        if isinstance(err, self._psycopg_error):
            mapped = sql.domain_error(err, job_id=job_id, command=op, state=state)
            if mapped is not None:
                return mapped
            return transient(err)
        if isinstance(err, OSError):
            return transient(err)
        return err

    async def move_to_active_many(self, tokens: Sequence[str], now: int) -> list[NextJob]:
        """A batch's claims: upstream's moveToActive once per token, in one transaction (one commit)."""
        if not tokens:
            return []
        if self.lanes.closed:
            raise PostgresUnavailable("the worker's PostgreSQL channel is closed")
        tail = self._claim_params(now)
        try:
            answers = await self.lanes.run_many([("move_to_active", [self.queue, token, *tail]) for token in tokens])
        except Exception as err:
            raise self._mapped(err, op="moveToActive") from err
        replies: list[NextJob] = []
        for found in answers:
            if isinstance(found, BaseException):
                if replies:  # the claims before it stand
                    break
                raise self._mapped(found, op="moveToActive") from found
            replies.append(await self._next_job(found, now))
            if not found:
                break
        return replies

    async def take_group_jobs(self, group_id: str, tokens: Sequence[str], now: int) -> list[NextJob]:
        """Group affinity: our bullmq_compat_take_group_jobs, the group's next held jobs straight into active."""
        if not tokens:
            return []
        await self.backend.ensure_groups()
        found = await self._run("bullmq_compat_take_group_jobs",
                                [self.queue, rows.text_param(group_id, what="group id"), [str(t) for t in tokens],
                                 int(self.settings.lock_duration), int(now), self.settings.name], op="takeGroupJobs")
        return [(job_fields(row), str(row["id"]), 0, 0) for row in found]

    async def finish_many(self, jobs: Sequence[FinishJob], now: int) -> list[Optional[BaseException]]:
        """A batch's finishes in one transaction (one commit); one by one when any is refused."""
        results: list[Optional[BaseException]] = [None] * len(jobs)
        calls: list[tuple[str, Sequence[Any]]] = []
        sent: list[int] = []
        for i, job in enumerate(jobs):
            try:
                job_id = rows.text_param(job.job_id, what="job_id")
                calls.append(self._finish_call(job_id, job.job_opts, job.target, job.value, job.token, now, False,
                                               job.fields_to_update, job.group_id))
                sent.append(i)
            except Exception as err:
                results[i] = err
        if calls:
            if self.lanes.closed:
                raise PostgresUnavailable("the worker's PostgreSQL channel is closed")
            try:
                answers = await self.lanes.run_many(calls)
            except Exception as err:
                raise self._mapped(err, op="moveToFinished") from err
            for i, answer in zip(sent, answers):
                if isinstance(answer, BaseException):
                    results[i] = self._mapped(answer, job_id=jobs[i].job_id, op="moveToFinished", state="active")
                else:
                    await self._collect_metrics("completed" if jobs[i].target == "completed" else "failed", int(now))
        return results

    async def _collect_metrics(self, kind: str, finished_on: int) -> None:
        """Node's collectMetrics: a statement of its own after the finish, best-effort."""
        max_points = self.settings.max_metrics_size
        if not max_points:
            return
        try:
            await self._run("collect_metrics", [self.queue, kind, int(max_points), finished_on])
        except Exception as err:  # the job is finished: a lost data point must not undo that
            logger.warning("queue %s: could not record a %s metric (%s)", self.queue, kind, err)

    async def move_to_delayed(self, job_id: str, now: int, delay: int, token: str, *,
                              skip_attempt: bool = False, fields_to_update: Optional[Mapping[str, str]] = None,
                              fetch_next: bool = False) -> Optional[NextJob]:
        job_id = rows.text_param(job_id, what="job_id")
        fields = fields_to_update or {}
        stacktrace = fields.get("stacktrace")
        await self._run("move_to_delayed", [
            self.queue, job_id, token or "", int(now) + int(delay), int(delay), bool(skip_attempt),
            fields.get("failedReason"), json_text(stacktrace, "stacktrace"),
        ], job_id=job_id, op="moveToDelayed", state="active")
        if not (fetch_next and token):
            return None
        # Node: moveToActive after, and the next job only when one was claimed (no delay hint)
        found = await self._run("move_to_active", [self.queue, token, *self._claim_params(now)],
                                op="moveToActive")
        return await self._next_job(found, now) if found else _NO_JOB

    async def retry_job(self, job_id: str, lifo: bool, token: str, now: int,
                        fields_to_update: Optional[Mapping[str, str]] = None) -> None:
        job_id = rows.text_param(job_id, what="job_id")
        fields = fields_to_update or {}
        stacktrace = fields.get("stacktrace")
        await self._run("retry_job", [
            self.queue, job_id, token or "", bool(lifo), fields.get("failedReason"),
            json_text(stacktrace, "stacktrace"),
        ], job_id=job_id, op="retryJob", state="active")

    async def extend_locks(self, job_ids: Sequence[str], tokens: Sequence[str], duration: int) -> list[str]:
        if not job_ids:
            return []
        found = await self._run("extend_locks", [self.queue, [str(i) for i in job_ids], [str(t) for t in tokens],
                                                 int(duration), now_ms()])
        return [str(r["id"]) for r in found]

    async def extend_lock(self, job_id: str, token: str, duration: int) -> bool:
        found = await self._run("extend_lock", [self.queue, rows.text_param(job_id, what="job_id"), token,
                                                int(duration), now_ms()])
        return bool(found and int(found[0]["n"] or 0))

    async def move_stalled_jobs_to_wait(self, now: int) -> list[str]:
        found = await self._run("move_stalled_jobs_to_wait", [
            self.queue, int(self.settings.max_stalled_count), int(now), int(self.settings.stalled_interval)])
        return [str(r["id"]) for r in found]

    async def move_job_from_active_to_wait(self, job_id: str, token: str) -> int:
        job_id = rows.text_param(job_id, what="job_id")
        found = await self._run("move_active_to_wait", [self.queue, job_id, token or "0", now_ms()],
                                job_id=job_id, op="moveJobFromActiveToWait")
        n = int(found[0]["n"] or 0)
        if n < 0:
            raise script_error(n, job_id=job_id, command="moveJobFromActiveToWait")
        return n

    async def move_to_waiting_children(self, job_id: str, token: str, now: int, child_key: str = "") -> bool:
        job_id = rows.text_param(job_id, what="job_id")
        found = await self._run("move_to_waiting_children", [self.queue, job_id, token],
                                job_id=job_id, op="moveToWaitingChildren", state="active")
        code = int(found[0]["code"] or 0)
        if code < 0:
            raise script_error(code, job_id=job_id, command="moveToWaitingChildren", state="active")
        return code == 1

    # -- waiting for work --------------------------------------------------------------------
    async def wait_for_job(self, timeout: float) -> Optional[tuple[str, float]]:
        """``(queue, 0)`` at a NOTIFY for our queue (or when the probe finds a waiting job),
        ``(queue, due ms)`` when a delayed job (or a `wake_at` time) comes due, None at ``timeout``."""
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(float(timeout), 0.0)
        if self._wake_changed is None:
            self._wake_changed = asyncio.Event()
        try:
            return await self._wait(deadline)
        except asyncio.CancelledError:
            await self.listener.drop()  # a wait cut off mid-command: its session is in an unknown state
            raise
        finally:
            if not self._closed:
                await self.listener.unlisten()

    async def _wait(self, deadline: float) -> Optional[tuple[str, float]]:
        assert self._wake_changed is not None
        loop = asyncio.get_running_loop()
        present, next_delay = await self._probe()
        if present and not self._suspect_probe:
            self._probe_woke = True
            return self.queue, 0.0
        if present:  # claims keep coming back empty although jobs wait: poll instead of spinning
            deadline = min(deadline, loop.time() + SUSPECT_PROBE_WAIT_S)
        while not self._closed:
            due = min((d for d in (next_delay, self._wake_due) if d is not None), default=None)
            until = deadline
            if due is not None:
                until = min(until, loop.time() + (due - now_ms() + 1) / 1000)
            remaining = until - loop.time()
            if remaining <= 0:
                break
            self._wake_changed.clear()
            if await self._notify_or_wake(remaining):
                self._probe_woke = False
                return self.queue, 0.0
        due = min((d for d in (next_delay, self._wake_due) if d is not None), default=None)
        if due is not None and due <= now_ms() + 5:
            while now_ms() < due and not self._closed:  # timers may fire a little early: the job is due *now*
                await asyncio.sleep(0.001)
            if self._wake_due is not None and self._wake_due <= now_ms():
                self._wake_due = None
            return self.queue, float(due)
        return None

    async def _probe(self) -> tuple[bool, Optional[int]]:
        try:
            return await self.listener.probe()
        except Exception as err:
            if not is_connection_error(err):
                raise
            await self.listener.drop()  # the session was lost: rebuild it (LISTEN, probe) once now
        try:
            return await self.listener.probe()
        except Exception as err:
            await self.listener.drop()
            raise transient(err) from err

    async def _notify_or_wake(self, remaining: float) -> bool:
        """Wait up to ``remaining`` s for a NOTIFY (True) or a `wake_at` / `close` (False)."""
        assert self._wake_changed is not None
        notified = asyncio.ensure_future(self.listener.next_notify(remaining))
        woken = asyncio.ensure_future(self._wake_changed.wait())
        try:
            await asyncio.wait({notified, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            if not notified.done():
                notified.cancel()
                with contextlib.suppress(BaseException):
                    await notified
        if notified.cancelled():
            return False
        err = notified.exception()
        if err is None:
            return bool(notified.result())
        await self.listener.drop()
        if not is_connection_error(err):
            raise err
        # the session was lost mid-wait (pg_terminate_backend, a restart): rebuild it now and look
        present, _ = await self._probe()
        return present

    async def announce(self) -> None:
        """Open the named session now, so the worker is listed (Node's getWorkers) before it waits."""
        await self.listener.session()

    async def wake_at(self, due_ms: int) -> None:
        if self._wake_due is None or due_ms < self._wake_due:
            self._wake_due = int(due_ms)
        if self._wake_changed is not None:
            self._wake_changed.set()

    async def close(self) -> None:
        self._closed = True
        if self._wake_changed is not None:
            self._wake_changed.set()
        await self.lanes.close()
        await self.listener.drop()


class PostgresJobTransaction(JobTransaction):
    """One processor's transaction (``Worker(transactional=True)``): upstream's ``move_to_completed``
    runs in it, after whatever the processor wrote, and the two commit together. The token check is
    upstream's: a job whose lock was lost (it stalled and runs elsewhere) is refused, the
    transaction rolls back, and the processor's writes are gone."""

    def __init__(self, channel: PostgresWorkerChannel, connection: "psycopg.AsyncConnection[Any]") -> None:
        self.channel = channel
        self.connection = connection
        self._open = True

    async def complete(self, job_id: str, job_opts: Mapping[str, Any], value: str, token: str, now: int,
                       fetch_next: bool = False) -> Optional[NextJob]:
        channel = self.channel
        job_id = rows.text_param(job_id, what="job_id")
        command, params = channel._finish_call(job_id, job_opts, "completed", value, token, now, fetch_next,
                                               None, None)
        try:
            # the finish (and the claim of the next job) and the commit in one round trip
            found = await self._run_then_commit(sql.command(command), params)
        except BaseException as err:
            lost = self.connection.closed or self.connection.broken
            await self.rollback()
            mapped = channel._mapped(err, job_id=job_id, op="moveToFinished", state="active")
            if lost and is_connection_error(err):
                raise PostgresUnavailable(
                    f"job {job_id}: the session of its transaction was lost before the commit (ended by the "
                    f"server: idle_in_transaction_session_timeout, pg_terminate_backend or a restart), so "
                    f"neither the processor's writes nor the completion were committed: {err}") from None
            raise mapped from None
        self._open = False
        await channel._collect_metrics("completed", int(now))
        return await channel._next_job(found, now) if fetch_next else None

    async def _run_then_commit(self, text: str, params: Sequence[Any]) -> list[TextRow]:
        """One command and ``COMMIT`` in one round trip (a pipeline); the command's rows, read as the
        lanes read them. A failing command aborts the commit and raises."""
        import psycopg
        from psycopg import pq

        conn = self.connection
        async with psycopg.AsyncRawCursor(conn) as cur:
            async with conn.pipeline():
                await cur.execute(text, list(params))
                await conn.execute("COMMIT")
            result = cur.pgresult
            if result is None or result.status != pq.ExecStatus.TUPLES_OK:
                return []
            return text_rows(result, field_names(result))

    async def rollback(self) -> None:
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(Exception):  # a broken session: the server rolled it back
            await self.connection.execute("ROLLBACK")

    async def close(self) -> None:
        await self.rollback()
        conn, self.connection = self.connection, None
        if conn is not None:
            await self.channel.backend.connection.pool.putconn(conn)
