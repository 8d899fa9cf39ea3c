"""`QueueBackend` on PostgreSQL: the queue side (adding, reading, changing and managing jobs).

Each method is one of upstream's SQL commands, called with the parameters, defaults and result
shapes of Node's ``PostgresQueueBackend`` (``dist/cjs/postgres/postgres-queue-backend.js``), so a
Node peer on the same schema sees exactly what a Node client would have written. The queue is a
value of the ``queue`` column, the namespace the connection's schema; there is no key prefix.

>>> conn = PostgresConnection("postgresql://postgres@127.0.0.1/test", schema="bullmq")
>>> backend = PostgresBackend(conn, "emails")
>>> await backend.connect()
>>> [job_id] = await backend.add_jobs([NewJob("send", {"to": "a@b"}, {"attempts": 0}, now_ms())])
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Mapping, Optional, Sequence

from bullmq_compat._backends.base import (
    EventsReader,
    JobFields,
    NewJob,
    QueueBackend,
    WorkerChannel,
    WorkerSettings,
)
from bullmq_compat._backends.postgres import rows, sql
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._backends.postgres.driver import load_psycopg
from bullmq_compat._errors import (
    BullMQCompatError,
    InvalidArgument,
    InvalidQueueName,
    NotSupportedOnBackend,
    PostgresUnavailable,
    script_error,
)

#: Node's commandByType: the list-backed states whose ranges the getters reverse when ``asc``
_LIST_STATES = frozenset({"active", "wait", "waiting"})


def now_ms() -> int:
    return int(time.time() * 1000)


def check_queue_name(name: Any) -> str:
    """Node's rule (a non-empty name without ':'), plus what PostgreSQL text cannot hold."""
    if not isinstance(name, str) or not name:
        raise InvalidQueueName(f"queue name {name!r} must be a non-empty str")
    if ":" in name:
        raise InvalidQueueName(f"queue name {name!r} cannot contain ':' (Node BullMQ refuses it)")
    if "\x00" in name:
        raise InvalidQueueName(f"queue name {name!r} cannot contain U+0000 (PostgreSQL text cannot store it)")
    return name


class PostgresBackend(QueueBackend):
    """One queue on a `PostgresConnection`; `for_queue` siblings share the connection."""

    kind = "postgres"
    transient_errors: tuple[type[BaseException], ...] = (PostgresUnavailable,)

    def __init__(self, connection: PostgresConnection, name: str, *, owns_connection: bool = True) -> None:
        self.name = check_queue_name(name)
        self.qualified_name = self.name  # no prefix: a parent's "queue" is the bare name
        self.connection = connection
        self._owns_connection = owns_connection
        psycopg, psycopg_pool = load_psycopg()
        self.transient_errors = (PostgresUnavailable, psycopg.OperationalError, psycopg_pool.PoolTimeout)
        self._psycopg_error: type[BaseException] = psycopg.Error

    # -- life cycle ------------------------------------------------------------------------
    @property
    def description(self) -> str:
        return f"queue {self.name!r} on {self.connection.description}"

    async def connect(self) -> None:
        await self.connection.connect()

    async def close(self) -> None:
        if self._owns_connection:
            await self.connection.close()

    def for_queue(self, name: str) -> "PostgresBackend":
        return PostgresBackend(self.connection, name, owns_connection=False)

    # -- running commands --------------------------------------------------------------------
    async def _run(self, command: str, params: Sequence[Any] = (), *, job_id: Optional[str] = None,
                   op: str = "", state: str = "", parent_key: Optional[str] = None) -> sql.Result:
        """Run upstream's ``command``; a BM001 refusal becomes the `ScriptError` of its code."""
        try:
            return await self.connection.run(command, params)
        except self._psycopg_error as err:
            mapped = sql.domain_error(err, job_id=job_id, command=op or command, state=state,
                                      parent_key=parent_key)
            if mapped is not None:
                raise mapped from None
            raise

    def _id(self, job_id: Any) -> str:
        return rows.text_param(job_id, what="job_id")

    # -- adding ------------------------------------------------------------------------------
    def _entry(self, job: NewJob, link: Optional[Mapping[str, Any]] = None, *,
               queue: Optional[str] = None) -> dict[str, Any]:
        """One job as Node's ``toBatchEntry`` builds it (also the parameters of ``add_job``)."""
        queue = queue or (check_queue_name(job.queue_name) if job.queue_name else self.name)
        name = rows.text_param(job.name, what="job name")
        opts = {key: value for key, value in job.opts.items() if key != "repeatJobKey"}
        # opts are stored as JSON: refuse here what jsonb cannot hold (the whole call, not a half)
        rows.json_param(opts, what="options")
        parent = job.opts.get("parent")
        parent_queue = parent_id = None
        if isinstance(parent, Mapping):
            parent_queue = rows.text_param(parent.get("queue"), what="parent queue")
            parent_id = rows.text_param(parent.get("id"), what="parent id")
        link = link or {}
        parent_key = link.get("parentKey") or (f"{parent_queue}:{parent_id}" if parent_id is not None else None)
        dedup = job.opts.get("deduplication")
        return {
            "queue": queue,
            "id": rows.text_param(job.job_id, what="job_id") if job.job_id else "",
            "name": name,
            "data": rows.json_param(job.data),  # a JSON *string*: add_jobs_bulk reads (j->>'data')::jsonb
            "opts": opts,
            "priority": int(opts.get("priority") or 0),
            "delay": int(opts.get("delay") or 0),  # bigint in SQL: a fractional delay is truncated
            "timestamp": int(job.timestamp),
            "attempts": opts["attempts"] if opts.get("attempts") is not None else 1,
            "parentQueue": parent_queue,
            "parentId": parent_id,
            "parentKey": parent_key,
            "dedupId": dedup.get("id") if isinstance(dedup, Mapping) else None,
            "schedulerId": job.opts.get("repeatJobKey"),
            "lifo": bool(opts.get("lifo", False)),
            "addToWaitingChildren": bool(link.get("addToWaitingChildren", False)),
        }

    async def _add_one(self, entry: dict[str, Any]) -> str:
        result = await self._run("add_job", [
            entry["queue"], entry["id"], entry["name"], entry["data"], rows.json_param(entry["opts"], what="options"),
            entry["priority"], entry["delay"], entry["timestamp"], entry["attempts"], entry["parentQueue"],
            entry["parentId"], entry["parentKey"], entry["dedupId"], entry["schedulerId"], entry["lifo"],
        ], job_id=entry["id"] or None, op="addJob", parent_key=entry["parentKey"])
        return str(result.rows[0]["id"])

    async def add_jobs(self, jobs: Sequence[NewJob]) -> list[Any]:
        """One job: ``add_job`` (Node's addJob). Several: one statement for the whole batch, as
        Node's addJobs -- ``add_jobs_bulk`` when no job has a parent or deduplication, else
        ``add_flow``. A job refused at the edge (e.g. data holding U+0000) gets its exception
        and is not sent; a statement that fails adds nothing, so each of its jobs gets the error."""
        results: list[Any] = [None] * len(jobs)
        entries: list[tuple[int, dict[str, Any]]] = []
        for index, job in enumerate(jobs):
            try:
                entries.append((index, self._entry(job, queue=self.name)))  # Node: always this queue
            except InvalidArgument as err:
                results[index] = err
        if len(jobs) == 1 and entries:
            try:
                results[0] = await self._add_one(entries[0][1])
            except BullMQCompatError as err:
                results[0] = err
            return results
        if not entries:
            return results
        payload = [entry for _, entry in entries]
        independent = all(e["parentId"] is None and e["parentQueue"] is None and e["dedupId"] is None
                          for e in payload)
        try:
            if independent:
                ids = (await self._run("add_jobs_bulk", [self.name, rows.dump_out(payload)])).rows
            else:
                ids = (await self._run("add_flow", [rows.dump_out(payload)], op="addBulk")).rows
        except BullMQCompatError as err:
            for index, _ in entries:
                results[index] = err
            return results
        for (index, entry), row in zip(entries, ids):
            results[index] = self._id_or_error(str(row["id"]), entry, "addBulk")
        return results

    @staticmethod
    def _id_or_error(job_id: str, entry: Mapping[str, Any], op: str) -> Any:
        """add_flow answers a refused entry with a negative code as its id (-5 missing parent, -7 ...)."""
        try:
            code = int(job_id)
        except ValueError:
            return job_id
        if code < 0:
            return script_error(code, job_id=entry["id"] or None, command=op, parent_key=entry["parentKey"])
        return job_id

    async def add_flow(self, nodes: Sequence[tuple[NewJob, Optional[dict[str, Any]]]]) -> list[str]:
        """Add a flow's nodes in one ``add_flow`` statement (atomic); returns their ids in input order.

        Each node is ``(job, link)``: ``job.queue_name`` its queue ("" = this one), ``job.job_id``
        its id (a UUID is made when empty, as Node's FlowProducer does), ``job.opts["parent"]``
        its parent ``{"id", "queue"}``; ``link`` Node's parentKeyOpts (``parentKey``,
        ``addToWaitingChildren`` -- True for a node that has children). Nodes may come in any
        order: they are sent parents first, as upstream's function needs. A refused node (a
        missing parent, -5; a parent that cannot be replaced, -7) raises its `ScriptError`.
        """
        entries = []
        for job, link in nodes:
            if not job.job_id:
                job = NewJob(job.name, job.data, job.opts, job.timestamp, str(uuid.uuid4()), job.queue_name)
            entries.append(self._entry(job, link))
        order = _parents_first(entries)
        result = await self._run("add_flow", [rows.dump_out([entries[i] for i in order])], op="addFlow")
        ids: list[str] = [""] * len(entries)
        for position, row in zip(order, result.rows):
            outcome = self._id_or_error(str(row["id"]), entries[position], "addFlow")
            if isinstance(outcome, BaseException):
                raise outcome
            ids[position] = outcome
        return ids

    # -- reading -----------------------------------------------------------------------------
    async def get_job(self, job_id: str) -> Optional[JobFields]:
        row = (await self._run("get_job_data", [self.name, self._id(job_id)])).first()
        return rows.job_fields(row) if row is not None else None

    async def get_state(self, job_id: str) -> str:
        row = (await self._run("get_state", [self.name, self._id(job_id)])).first()
        if row is None:
            return "unknown"
        if row["state"] == "waiting" and (row["priority"] or 0) > 0:
            return "prioritized"
        return str(row["state"])

    async def get_counts(self, states: Sequence[str], delayed_timestamp: Optional[int] = None) -> list[int]:
        """As Node: while paused, waiting jobs count as ``paused`` (and ``wait``/``waiting`` as 0);
        with ``delayed_timestamp``, ``delayed`` counts only the jobs due before it."""
        if delayed_timestamp is not None and "delayed" in states:
            others = [state for state in states if state != "delayed"]
            other_counts = iter(await self.get_counts(others) if others else [])
            due = (await self._run("get_delayed_count", [self.name, int(delayed_timestamp)])).rows[0]["count"]
            return [int(due) if state == "delayed" else next(other_counts) for state in states]
        counts = (await self._run("get_counts", [self.name])).rows[0]
        waiting = int(counts["waiting"])
        paused = counts["paused"] == "1"
        lookup = {
            "active": int(counts["active"]), "completed": int(counts["completed"]),
            "failed": int(counts["failed"]), "delayed": int(counts["delayed"]),
            "wait": 0 if paused else waiting, "waiting": 0 if paused else waiting,
            "prioritized": int(counts["prioritized"]),
            "waiting-children": int(counts["waiting-children"]),
            "paused": waiting if paused else 0,
        }
        return [lookup.get(state, 0) for state in states]

    async def get_ranges(self, states: Sequence[str], start: int = 0, end: int = -1, asc: bool = False
                         ) -> list[str]:
        """The ids in ``states`` (one ``get_range`` each), each state's list reversed for ``asc`` when
        it is list-backed in Redis, concatenated without repeats (Node's getRanges)."""
        ids: list[str] = []
        for state in states:
            found = [str(r["id"]) for r in (await self._run("get_range", [self.name, state, start, end, asc])).rows]
            if asc and state in _LIST_STATES:
                found.reverse()
            ids.extend(found)
        return list(dict.fromkeys(ids))

    async def get_jobs(self, states: Sequence[str], start: int, end: int, asc: bool
                       ) -> list[tuple[str, JobFields]]:
        """`get_ranges`, then each job (one query per job, as Node); jobs gone meanwhile are skipped."""
        jobs = []
        for job_id in await self.get_ranges(states, start, end, asc):
            fields = await self.get_job(job_id)
            if fields is not None:
                jobs.append((job_id, fields))
        return jobs

    async def get_job_logs(self, job_id: str, start: int, end: int, asc: bool) -> tuple[list[str], int]:
        """Lines ``start..end`` (inclusive, negative from the end, as LRANGE) and the total count."""
        job_id = self._id(job_id)
        count = int((await self._run("get_job_logs_count", [self.name, job_id])).rows[0]["count"])
        first = max(count + start, 0) if start < 0 else start
        last = count + end if end < 0 else end
        limit = last - first + 1
        if limit <= 0:
            return [], count
        command = "get_job_logs_asc" if asc else "get_job_logs_desc"
        lines = [str(r["row"]) for r in (await self._run(command, [self.name, job_id, first, limit])).rows]
        return lines, count

    async def is_finished(self, job_id: str) -> tuple[int, str]:
        """Node's isFinished with returnValue: ``(1, return value JSON)`` completed, ``(2, reason)``
        failed, ``(0, "")`` not finished, ``(-1, message)`` no such job."""
        job_id = self._id(job_id)
        row = (await self._run("is_finished", [self.name, job_id])).first()
        if row is None:
            return -1, f"Missing key for job {self.name}:{job_id}. isFinished"
        if row["state"] == "completed":
            return 1, rows.dump_out(row["return_value"])
        if row["state"] == "failed":
            return 2, str(row["failed_reason"] or "")
        return 0, ""

    async def is_maxed(self) -> bool:
        """Whether the queue's global concurrency is reached (Node's isMaxed)."""
        return bool((await self._run("is_maxed", [self.name])).rows[0]["maxed"])

    async def get_dependencies(self, job_id: str) -> dict[str, Any]:
        """All of a parent's children by category, unpaginated (Node's getDependencies without
        options): ``processed`` {child key: return value JSON}, ``unprocessed`` [child keys],
        ``ignored`` {child key: failure reason}, ``failed`` [child keys]."""
        found: dict[str, Any] = {"processed": {}, "unprocessed": [], "ignored": {}, "failed": []}
        for row in (await self._run("get_dependencies", [self.name, self._id(job_id)])).rows:
            key, status = str(row["child_key"]), row["status"]
            if status == "processed":
                found["processed"][key] = rows.dump_out(row["value"])
            elif status == "pending":
                found["unprocessed"].append(key)
            elif status == "ignored":
                value = row["value"]
                found["ignored"][key] = value if isinstance(value, str) else rows.dump_out(value)
            elif status == "failed":
                found["failed"].append(key)
        return found

    async def get_counts_per_priority(self, priorities: Sequence[int]) -> list[int]:
        result = await self._run("get_counts_per_priority", [self.name, [int(p) for p in priorities]])
        return [int(r["cnt"]) for r in result.rows]

    async def get_metrics(self, type: str, start: int, end: int) -> tuple[list[Any], list[Any], int]:
        """As Node on PostgreSQL: meta ``[total, "0", "0"]``, the points (newest first) as text, and
        the number of points returned."""
        row = (await self._run("get_metrics", [self.name, type, start, end])).first() or {}
        data = [str(point) for point in (row.get("data") or [])]
        return [str(row.get("total") or 0), "0", "0"], data, len(data)

    async def get_rate_limit_ttl(self, max_jobs: Optional[int]) -> int:
        result = await self._run("get_rate_limit_ttl", [self.name, max_jobs or 0, now_ms()])
        return int(result.rows[0]["ttl"])

    async def set_rate_limit(self, expire_ms: int) -> None:
        """Hold the queue's limiter window for ``expire_ms`` ms (Node's setRateLimit)."""
        await self._run("set_rate_limit", [self.name, int(expire_ms), now_ms()])

    async def remove_rate_limit_key(self) -> int:
        """End the limiter window now (Node's removeRateLimitKey); 1 when there was one."""
        return int((await self._run("remove_rate_limit", [self.name])).rows[0]["n"])

    async def get_deduplication_job_id(self, deduplication_id: str) -> Optional[str]:
        dedup_id = rows.text_param(deduplication_id, what="deduplication id")
        row = (await self._run("get_deduplication_job_id", [self.name, dedup_id, now_ms()])).first()
        return rows.optional_str(row["job_id"]) if row else None

    async def get_client_list(self) -> list[dict[str, str]]:
        """Every named session of the database (Node names only LISTEN sessions: ``<queue>``,
        ``<queue>:w:<worker>``, ``<queue>:qe``), as ``{"name": application_name}``."""
        return [{"name": str(r["application_name"])} for r in (await self._run("get_client_list")).rows]

    # -- queue meta ---------------------------------------------------------------------------
    async def set_meta(self, values: Mapping[str, Any]) -> None:
        if not values:
            return
        fields = [rows.text_param(f, what="meta field") for f in values]
        await self._run("set_queue_meta", [self.name, fields,
                                           [rows.text_param(rows.js_string(v), what=f"meta {f}")
                                            for f, v in values.items()]])

    async def get_meta_field(self, field: str) -> Optional[str]:
        row = (await self._run("get_queue_meta_field", [self.name, field])).first()
        return rows.optional_str(row["value"]) if row else None

    async def get_meta(self) -> dict[str, str]:
        return {str(r["field"]): str(r["value"]) for r in (await self._run("get_queue_meta", [self.name])).rows}

    async def remove_meta_fields(self, fields: Sequence[str]) -> int:
        if not fields:
            return 0
        return (await self._run("remove_queue_meta_fields", [self.name, list(fields)])).rowcount

    # -- changing one job --------------------------------------------------------------------
    async def update_data(self, job_id: str, data_json: str) -> None:
        job_id = self._id(job_id)
        data = rows.json_text_param(data_json, what="data")
        if not (await self._run("update_data", [self.name, job_id, data])).rows:
            raise script_error(-1, job_id=job_id, command="updateData")

    async def update_progress(self, job_id: str, progress_json: str) -> None:
        job_id = self._id(job_id)
        progress = rows.json_text_param(progress_json, what="progress")
        if not (await self._run("update_progress", [self.name, job_id, progress])).rows[0]["updated"]:
            raise script_error(-1, job_id=job_id, command="updateProgress")

    async def add_log(self, job_id: str, row: str, keep_logs: Optional[int]) -> int:
        """Append a log line; returns the number of lines kept (at most ``keep_logs``)."""
        job_id = self._id(job_id)
        line = rows.text_param(row, what="log row")
        psycopg, _ = load_psycopg()
        try:
            result = await self._run("add_log", [self.name, job_id, line])
        except psycopg.errors.ForeignKeyViolation:  # 23503: the job is gone
            raise script_error(-1, job_id=job_id, command="addLog") from None
        count = int(result.rows[0]["idx"]) + 1
        if keep_logs and count > keep_logs:
            await self._run("trim_logs", [self.name, job_id, count - keep_logs])
            return keep_logs
        return count

    async def clear_logs(self, job_id: str, keep_logs: Optional[int] = None) -> None:
        """Remove a job's logs, keeping the newest ``keep_logs`` (Node's clearLogs)."""
        await self._run("clear_logs", [self.name, self._id(job_id), keep_logs])

    async def remove(self, job_id: str, remove_children: bool) -> int:
        """1 when removed, 0 when locked by a worker; a scheduler's job raises (-8)."""
        job_id = self._id(job_id)
        result = await self._run("remove", [self.name, job_id, bool(remove_children)], job_id=job_id, op="remove")
        return int(result.rows[0]["n"])

    async def reprocess_job(self, job_id: str, state: str, lifo: bool, reset_attempts_made: bool,
                            reset_attempts_started: bool, group_id: Optional[str] = None) -> None:
        if group_id is not None:
            raise NotSupportedOnBackend("per-group FIFO (group_id)", self.kind)
        job_id = self._id(job_id)
        code = int((await self._run("reprocess_job", [self.name, job_id, state, bool(lifo),
                                                      bool(reset_attempts_made), bool(reset_attempts_started)]
                                    )).rows[0]["code"])
        if code != 1:
            raise script_error(code, job_id=job_id, command="reprocessJob", state=state)

    async def promote(self, job_id: str) -> None:
        job_id = self._id(job_id)
        code = int((await self._run("promote", [self.name, job_id])).rows[0]["code"])
        if code < 0:
            raise script_error(code, job_id=job_id, command="promote", state="delayed")

    async def change_delay(self, job_id: str, delay: int, now: int) -> None:
        job_id = self._id(job_id)
        code = int((await self._run("change_delay", [self.name, job_id, int(delay), int(now)])).rows[0]["code"])
        if code < 0:
            raise script_error(code, job_id=job_id, command="changeDelay", state="delayed")

    async def change_priority(self, job_id: str, priority: int, lifo: bool) -> None:
        job_id = self._id(job_id)
        code = int((await self._run("change_priority", [self.name, job_id, int(priority or 0), bool(lifo)]
                                    )).rows[0]["code"])
        if code < 0:
            raise script_error(code, job_id=job_id, command="changePriority")

    # -- managing the queue ------------------------------------------------------------------
    async def pause(self, paused: bool) -> None:
        await self._run("pause", [self.name, bool(paused)])

    async def drain(self, delayed: bool) -> None:
        await self._run("drain", [self.name, bool(delayed)])

    async def clean(self, state: str, timestamp: int, limit: int) -> list[str]:
        """One ``clean`` call: ids of jobs in ``state`` older than ``timestamp`` (at most ``limit``, 0 = all)."""
        result = await self._run("clean", [self.name, state, int(timestamp), int(limit or 0)])
        return [str(r["id"]) for r in result.rows]

    async def obliterate(self, force: bool, count: int) -> None:
        """Delete the queue ``count`` jobs per call until done (Node's loop); the queue must be paused."""
        while True:
            cursor = int((await self._run("obliterate", [self.name, int(count), bool(force)])).rows[0]["cursor"])
            if cursor == -1:
                raise InvalidArgument("Cannot obliterate non-paused queue")
            if cursor == -2:
                raise InvalidArgument(f"Cannot obliterate queue {self.name!r} with active jobs; pass force=True")
            if cursor == 0:
                return

    async def retry_jobs(self, state: str, count: int, timestamp: int) -> None:
        """Move finished jobs (finished by ``timestamp``) back to waiting, ``count`` per call until none."""
        while int((await self._run("retry_jobs", [self.name, state or "failed", count, timestamp])).rows[0]["n"]):
            pass

    async def promote_jobs(self, count: int) -> None:
        """Move every delayed job to waiting, ``count`` per call."""
        while int((await self._run("promote_jobs", [self.name, count])).rows[0]["n"]):
            pass

    async def remove_deduplication_key(self, deduplication_id: str, job_id: Optional[str] = None) -> int:
        """Remove the key (Queue.removeDeduplicationKey); with ``job_id``, only while that job is its
        live winner (Job.removeDeduplicationKey). Returns 1 when a key was removed, else 0."""
        dedup_id = rows.text_param(deduplication_id, what="deduplication id")
        if job_id is None:
            return len((await self._run("delete_deduplication_key", [self.name, dedup_id])).rows)
        result = await self._run("remove_deduplication_key", [self.name, dedup_id, self._id(job_id), now_ms()])
        return len(result.rows)

    async def trim_events(self, max_length: int) -> int:
        raise NotSupportedOnBackend("trim_events", self.kind)

    async def publish_event(self, fields: Mapping[str, Any], max_events: int) -> str:
        """Append ``{"event": name, ...}`` to the stream (retention is upstream's, ``max_events`` unused
        as in Node); returns the event id."""
        rest = {key: value for key, value in fields.items() if key != "event"}
        event = rows.text_param(rows.js_string(fields.get("event")), what="event")
        result = await self._run("publish_event", [self.name, event, rows.json_param(rest, what="event fields")])
        return str(result.rows[0]["id"])

    # -- flows --------------------------------------------------------------------------------
    async def get_processed_children_values(self, job_id: str) -> dict[str, str]:
        result = await self._run("get_processed_children_values", [self.name, self._id(job_id)])
        return {str(r["child_key"]): str(r["value"]) for r in result.rows}

    async def get_ignored_children_failures(self, job_id: str) -> dict[str, str]:
        result = await self._run("get_ignored_children_failures", [self.name, self._id(job_id)])
        return {str(r["child_key"]): str(r["reason"]) for r in result.rows}

    async def get_dependency_counts(self, job_id: str, types: Sequence[str]) -> list[int]:
        counts = (await self._run("get_dependency_counts", [self.name, self._id(job_id)])).rows[0]
        return [int(counts[t]) if t in ("processed", "unprocessed", "ignored", "failed") else 0 for t in types]

    async def remove_child_dependency(self, job_id: str, parent_key: str) -> bool:
        """True when the link to ``parent_key`` was removed; False when there was none."""
        job_id = self._id(job_id)
        result = await self._run("remove_child_dependency", [self.name, job_id, parent_key, now_ms()],
                                 job_id=job_id, op="removeChildDependency", parent_key=parent_key)
        return int(result.rows[0]["n"]) == 0

    async def remove_unprocessed_children(self, job_id: str) -> None:
        await self._run("remove_unprocessed_children", [self.name, self._id(job_id)])

    # -- job schedulers (Node's addJobScheduler ... getJobSchedulersCount) --------------------
    async def add_job_scheduler(self, job_scheduler_id: str, next_millis: Optional[int], template_data: str,
                                template_opts: Optional[Mapping[str, Any]], opts: Optional[Mapping[str, Any]],
                                delayed_job_opts: Optional[Mapping[str, Any]], producer_id: Optional[str] = None,
                                *, now: Optional[int] = None) -> tuple[str, int]:
        """Register or update a scheduler and enqueue its next iteration (Node's addJobScheduler).

        ``template_data`` is JSON text ("" = ``{}``); ``template_opts`` the job template's options,
        ``opts`` the repeat options (``pattern``/``every``/``limit``/``startDate``/``endDate``/
        ``tz``/``offset``, Node's names), ``delayed_job_opts`` the options of the iteration job;
        ``producer_id`` the iteration that asks (Node passes the processed job's id); ``now``
        defaults to the clock. None values are sent as JSON null: leave a key out to omit it, as
        JSON.stringify drops undefined. Returns ``(iteration job id, its delay in ms)``; upstream's
        refusals raise (-10 an iteration id already taken, -11 both time slots busy).
        """
        scheduler_id = rows.text_param(job_scheduler_id, what="job scheduler id")
        data = rows.json_text_param(template_data or "{}", what="template data")
        row = (await self._run("add_job_scheduler", [
            self.name, scheduler_id, next_millis, data, rows.json_param(dict(template_opts or {}), what="options"),
            rows.json_param(dict(opts or {}), what="repeat options"),
            rows.json_param(dict(delayed_job_opts or {}), what="options"),
            now_ms() if now is None else int(now), producer_id,
        ], op="addJobScheduler")).rows[0]
        return str(row["job_id"]), int(row["delay"])

    async def update_job_scheduler_next_millis(self, job_scheduler_id: str, next_millis: Optional[int],
                                               template_data: str, delayed_job_opts: Optional[Mapping[str, Any]],
                                               producer_id: Optional[str] = None, *, now: Optional[int] = None
                                               ) -> Optional[str]:
        """Advance a scheduler to its next iteration without changing its template (Node's
        updateJobSchedulerNextMillis). ``producer_id`` is the id of the iteration whose processing
        asks for the next one: only the current iteration's producer may advance the scheduler.
        Returns the new iteration's id; None when the scheduler is gone, the producer is not the
        current iteration, or the next iteration exists already (a ``duplicated`` event)."""
        row = (await self._run("update_job_scheduler", [
            self.name, rows.text_param(job_scheduler_id, what="job scheduler id"), next_millis,
            rows.json_text_param(template_data or "{}", what="template data"),
            rows.json_param(dict(delayed_job_opts or {}), what="options"),
            now_ms() if now is None else int(now), producer_id,
        ])).first()
        return rows.optional_str(row["job_id"]) if row else None

    async def remove_job_scheduler(self, job_scheduler_id: str) -> int:
        """Remove a scheduler and its still-delayed iteration. Upstream's answer as Node passes it on:
        0 when it was removed, 1 when there was none (Node's Queue.removeJobScheduler negates it)."""
        row = (await self._run("remove_job_scheduler", [self.name, job_scheduler_id])).first()
        return int(row["removed"] or 0) if row else 0

    async def get_job_scheduler(self, job_scheduler_id: str) -> tuple[Optional[dict[str, str]], Optional[str]]:
        """``(fields, next run ms as text)`` as the Redis scheduler hash and score (Node returns the
        fields as a flat list), ``(None, None)`` when there is no such scheduler."""
        row = (await self._run("get_job_scheduler", [self.name, job_scheduler_id])).first()
        if row is None:
            return None, None
        return rows.scheduler_fields(row), rows.optional_str(row["next_run_ms"])

    async def is_job_scheduler(self, job_scheduler_id: str) -> bool:
        row = (await self._run("is_job_scheduler", [self.name, job_scheduler_id])).first()
        return bool(row and row["exists"])

    async def get_job_schedulers_range(self, start: int, end: int, asc: bool) -> list[tuple[str, str]]:
        """Schedulers ``start..end`` (``end`` < 0: all the rest) ordered by next run, as
        ``(id, next run ms)`` pairs (Node: the same pairs flattened)."""
        count = None if end < 0 else end - start + 1
        result = await self._run("get_job_schedulers_range", [self.name, bool(asc), start, count])
        return [(str(r["scheduler_id"]), str(r["next_run_ms"])) for r in result.rows]

    async def get_job_schedulers_count(self) -> int:
        row = (await self._run("get_job_schedulers_count", [self.name])).first()
        return int(row["count"]) if row else 0

    # -- workers and events: the worker channel and events reader are built apart ------------
    def client_name(self, suffix: str = "") -> str:
        """Node's clientName: ``<queue><suffix>`` (``<queue>:w:<worker>``, ``<queue>:qe``), the
        ``application_name`` of a LISTEN session."""
        return f"{self.name}{suffix}"

    async def open_worker_channel(self, settings: WorkerSettings, client_name: str, *,
                                  fast: bool = True) -> WorkerChannel:
        from bullmq_compat._backends.postgres.worker import PostgresWorkerChannel

        await self.connection.connect()
        channel = PostgresWorkerChannel(self, settings, client_name)
        if fast:  # a Worker's: named and listed at once, as Node's; a Queue's plain one only when it waits
            await channel.announce()
        return channel

    async def open_events_reader(self, client_name: str) -> EventsReader:
        from bullmq_compat._backends.postgres.events import PostgresEventsReader

        await self.connection.connect()
        return PostgresEventsReader(self, client_name)


def _parents_first(entries: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indexes of ``entries`` ordered so a node comes after its parent when both are in the batch
    (otherwise the input order is kept)."""
    position = {(e["queue"], e["id"]): i for i, e in enumerate(entries)}
    order: list[int] = []
    state: dict[int, int] = {}  # 1 = visiting, 2 = placed

    def place(index: int) -> None:
        if state.get(index) == 2:
            return
        if state.get(index) == 1:
            raise InvalidArgument(f"flow node {entries[index]['id']!r} is its own ancestor")
        state[index] = 1
        entry = entries[index]
        parent = position.get((entry["parentQueue"], entry["parentId"]))
        if parent is not None:
            place(parent)
        state[index] = 2
        order.append(index)

    for index in range(len(entries)):
        place(index)
    return order
