"""`QueueBackend` on PostgreSQL: the queue side (adding, reading, changing and managing jobs).

Each method is one of upstream's SQL commands, called with the parameters, defaults and result
shapes of Node's ``PostgresQueueBackend`` (``dist/cjs/postgres/postgres-queue-backend.js``), so a
Node peer on the same schema sees exactly what a Node client would have written. The queue is a
value of the ``queue`` column, the namespace the connection's schema; there is no key prefix.

>>> conn = PostgresConnection("postgresql://postgres@127.0.0.1/test", schema="bullmq")
>>> backend = PostgresBackend(conn, "emails")
>>> await backend.connect()
>>> [job_id] = await backend.add_jobs([NewJob("send", {"to": "a@b"}, {"attempts": 0}, int(time.time() * 1000))])
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Mapping, Optional, Sequence

from bullmq_compat._backends.base import (
    EventsReader,
    JobFields,
    NewJob,
    QueueBackend,
    QueueFigures,
    WorkerChannel,
    WorkerSettings,
    metrics_total,
)
from bullmq_compat._backends.postgres import adding, migrator, rows, sql
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._backends.postgres.driver import load_psycopg
from bullmq_compat._backends.postgres.schedulers import JobSchedulerCalls

if TYPE_CHECKING:
    from bullmq_compat._backends.postgres.groups import PostgresGroups
from bullmq_compat._errors import (
    BullMQCompatError,
    GroupsNotInstalled,
    InvalidArgument,
    NotSupportedOnBackend,
    PostgresUnavailable,
    script_error,
)
from bullmq_compat._groups import group_priority, stored_max_size

#: Node's commandByType: the list-backed states whose ranges the getters reverse when ``asc``
_LIST_STATES = frozenset({"active", "wait", "waiting"})


@dataclass
class FlowNode(NewJob):
    """A flow node for `PostgresBackend.add_flow`: the job and Node's parentKeyOpts."""

    link: dict[str, Any] = field(default_factory=dict)


@dataclass
class _AddPlan:
    """An `add_jobs` call worked out before anything is sent: the results so far (a job refused at
    the edge has its exception), the entries to send (with their index) and the statement."""

    results: list[Any]
    entries: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    command: Optional[str] = None
    params: list[Any] = field(default_factory=list)
    op: str = ""
    job_id: Optional[str] = None
    parent_key: Optional[str] = None
    single: bool = False

    def failed(self, err: BaseException) -> list[Any]:
        """A statement that failed adds nothing: each of its jobs gets the error."""
        for index, _ in self.entries:
            self.results[index] = err
        return self.results

    def answered(self, found: Sequence[Mapping[str, Any]]) -> list[Any]:
        if self.single:
            self.results[self.entries[0][0]] = str(found[0]["id"])
            return self.results
        for (index, entry), row in zip(self.entries, found):
            self.results[index] = adding.id_or_error(str(row["id"]), entry, "addBulk")
        return self.results


async def _first(pending: Awaitable[list[Any]]) -> Any:
    return (await pending)[0]


def open_postgres_backend(connection: Any, name: str, *, schema: str = migrator.DEFAULT_SCHEMA,
                          migrate: bool = False) -> "PostgresBackend":
    """A backend for queue ``name`` owning a new `PostgresConnection` (what ``open_backend`` builds
    for a ``postgresql://`` URL or a ``psycopg_pool.AsyncConnectionPool``); connect it with
    ``await backend.connect()``."""
    return PostgresBackend(PostgresConnection(connection, schema=schema, migrate=migrate), name)


class PostgresBackend(JobSchedulerCalls, QueueBackend):
    """One queue on a `PostgresConnection`; `for_queue` siblings share the connection."""

    kind = "postgres"
    label = "PostgreSQL"
    joins_transactions = True
    transient_errors: tuple[type[BaseException], ...] = (PostgresUnavailable,)

    def __init__(self, connection: PostgresConnection, name: str, *, owns_connection: bool = True) -> None:
        self.name = rows.check_queue_name(name)
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

    @property
    def address(self) -> str:
        return self.connection.where

    async def connect(self) -> None:
        await self.connection.connect()

    async def close(self) -> None:
        if self._owns_connection:
            await self.connection.close()

    def for_queue(self, name: str, prefix: Optional[str] = None) -> "PostgresBackend":  # (no prefix here)
        return PostgresBackend(self.connection, name, owns_connection=False)

    def split_job_key(self, key: str) -> tuple[Optional[str], str, str]:
        """``<queue>:<id>`` (no prefix on PostgreSQL; a queue name holds no colon, an id may)."""
        queue, _, job_id = key.partition(":")
        return None, queue, job_id

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
    def in_transaction(self, connection: Any) -> "PostgresBackend":
        """This queue's adds on the caller's psycopg connection, in its open transaction
        (`transactions.CallerConnection`: upstream's same commands, the schema's search_path set
        for each and the caller's put back)."""
        from bullmq_compat._backends.postgres.transactions import CallerConnection

        caller: Any = CallerConnection(self.connection, connection)
        return PostgresBackend(caller, self.name, owns_connection=False)

    def _add_lanes(self) -> Any:
        """Our connection's add lanes; None on a caller's connection (`in_transaction`: its adds must
        go on the caller's transaction) or a user's pool."""
        conn = self.connection
        return conn.add_lanes() if type(conn) is PostgresConnection else None

    async def _run_add(self, command: str, params: Sequence[Any], *, job_id: Optional[str] = None, op: str = "",
                       parent_key: Optional[str] = None) -> list[dict[str, Any]]:
        """An adding command's rows: on the connection's add lanes (raw libpq, rows as text) when it
        has them, else as `_run`; a BM001 refusal becomes its `ScriptError` either way."""
        lanes = self._add_lanes()
        if lanes is None:
            return (await self._run(command, params, job_id=job_id, op=op, parent_key=parent_key)).rows
        try:
            return list(await lanes.run(command, params))
        except self._psycopg_error as err:
            raise self._refusal(err, job_id=job_id, op=op or command, parent_key=parent_key) from None

    def _refusal(self, err: BaseException, *, job_id: Optional[str], op: str, parent_key: Optional[str]) -> BaseException:
        mapped = sql.domain_error(err, job_id=job_id, command=op, parent_key=parent_key)
        return mapped if mapped is not None else err

    # -- per-group FIFO (our gate: _backends/postgres/groups.py) ---------------------------------
    def groups(self) -> "PostgresGroups":
        from bullmq_compat._backends.postgres.groups import PostgresGroups

        return PostgresGroups(self)

    #: the feature each version of our group objects brought (named when a schema's are older)
    GROUP_FEATURES = {2: "a group's max_size", 3: "a group priority", 4: "a group rate limit"}

    async def ensure_groups(self, min_version: int = 1) -> None:
        """Check once per connection that our group objects are installed (`GroupsNotInstalled` if not;
        ``min_version``: at least that version of them, read again while the known one is older)."""
        conn = self.connection
        if getattr(conn, "groups_version", 0) >= min_version:
            return
        from bullmq_compat._backends.postgres.groups import groups_version

        await conn.connect()
        async with conn._pooled() as session:
            version = await groups_version(session, conn.schema)
        if not version:
            raise GroupsNotInstalled(conn.schema)
        conn.groups_version = version
        if version < min_version:
            raise GroupsNotInstalled(conn.schema, self.GROUP_FEATURES.get(min_version, "this group feature"))

    async def add_jobs(self, jobs: Sequence[NewJob]) -> list[Any]:
        """One job: ``add_job`` (Node's addJob). Several: one statement for the whole batch, as
        Node's addJobs -- ``add_jobs_bulk`` when no job has a parent or deduplication, else
        ``add_flow``. A job refused at the edge (e.g. data holding U+0000) gets its exception
        and is not sent; a statement that fails adds nothing, so each of its jobs gets the error."""
        if any(job.opts.get("group") is not None for job in jobs):
            # without our triggers a group job would go straight to wait; max_size: version 2's trigger;
            # a group priority: version 3's order
            await self.ensure_groups(3 if any(group_priority(job.opts) for job in jobs)
                                     else 2 if any(stored_max_size(job.opts) for job in jobs) else 1)
        plan = self._add_plan(jobs)
        if plan.command is None:
            return plan.results
        try:
            found = await self._run_add(plan.command, plan.params, job_id=plan.job_id, op=plan.op,
                                        parent_key=plan.parent_key)
        except BullMQCompatError as err:
            return plan.failed(err)
        return plan.answered(found)

    def _add_plan(self, jobs: Sequence[NewJob]) -> "_AddPlan":
        plan = _AddPlan([None] * len(jobs))
        opts_json = None
        for index, job in enumerate(jobs):
            try:
                entry, opts_json = adding.entry_and_opts(job, self.name)  # Node: always this queue
                plan.entries.append((index, entry))
            except InvalidArgument as err:
                plan.results[index] = err
        if not plan.entries:
            return plan
        if len(jobs) == 1:
            entry = plan.entries[0][1]
            plan.command, plan.params, plan.op = "add_job", adding.add_job_params(entry, opts_json), "addJob"
            plan.job_id, plan.parent_key, plan.single = entry["id"] or None, entry["parentKey"], True
            return plan
        payload = [entry for _, entry in plan.entries]
        if all(e["parentId"] is None and e["parentQueue"] is None and e["dedupId"] is None for e in payload):
            plan.command, plan.params = "add_jobs_bulk", [self.name, rows.dump_out(payload)]
        else:
            plan.command, plan.params, plan.op = "add_flow", [rows.dump_out(payload)], "addBulk"
        return plan

    def submit_prepared(self, jobs: Sequence[NewJob]) -> Optional[Awaitable[list[Any]]]:
        """`add_jobs` with its statement sent before this returns (on an idle add lane where it is
        prepared), so Queue builds the Jobs while the server runs it; None (nothing sent) when that
        cannot be: then Queue calls `add_jobs`."""
        lanes = self._add_lanes()
        if lanes is None or any(job.opts.get("group") is not None for job in jobs):
            return None
        plan = self._add_plan(jobs)
        if plan.command is None:
            return None
        started = lanes.start(plan.command, plan.params)
        if started is None:
            return None
        return self._add_answers(plan, started)

    def submit_one(self, job: NewJob) -> Optional[Awaitable[Any]]:
        """`submit_prepared` of one job: the awaitable of its result (its id, or its exception)."""
        pending = self.submit_prepared([job])
        return None if pending is None else _first(pending)

    async def _add_answers(self, plan: "_AddPlan", started: Awaitable[list[Any]]) -> list[Any]:
        try:
            found = await started
        except self._psycopg_error as err:
            refusal = self._refusal(err, job_id=plan.job_id, op=plan.op or str(plan.command), parent_key=plan.parent_key)
            if not isinstance(refusal, BullMQCompatError):
                raise refusal from None
            return plan.failed(refusal)
        except BullMQCompatError as err:
            return plan.failed(err)
        return plan.answered(found)

    def prepare(self, job: NewJob) -> NewJob:
        """Check one add now (Queue.add_bulk prepares every job before sending any): what PostgreSQL
        cannot store (data holding U+0000) raises here, so a bulk with one bad job writes nothing,
        as Node's addBulk, whose one statement jsonb refuses whole. The job comes back with what
        sending it needs (`adding.PreparedJob`): `add_jobs` does not check or encode it again."""
        return adding.prepared(job, self.name)

    def prepare_flow_node(self, job: NewJob, *, parent_key: Optional[str], parent_link: Optional[dict[str, Any]],
                          has_children: bool) -> "FlowNode":
        """One node for `add_flow`, checked now (nothing is sent until every node is)."""
        node = FlowNode(job.name, job.data, job.opts, job.timestamp, job.job_id, job.queue_name,
                        link={"parentKey": parent_key, "addToWaitingChildren": has_children})
        adding.batch_entry(node, rows.check_queue_name(job.queue_name) if job.queue_name else self.name, node.link)
        return node

    async def add_flow(self, nodes: Sequence[Any]) -> list[Any]:
        """Add a flow's nodes in one ``add_flow`` statement (atomic); returns their ids in input order.

        Each node is ``(job, link)``: ``job.queue_name`` its queue ("" = this one), ``job.job_id``
        its id (a UUID is made when empty, as Node's FlowProducer does), ``job.opts["parent"]``
        its parent ``{"id", "queue"}``; ``link`` Node's parentKeyOpts (``parentKey``,
        ``addToWaitingChildren`` -- True for a node that has children). Nodes may come in any
        order: they are sent parents first, as upstream's function needs. A refused node (a
        missing parent, -5; a parent that cannot be replaced, -7) raises its `ScriptError`.
        """
        entries = []
        for node in nodes:
            job, link = (node, node.link) if isinstance(node, FlowNode) else node
            if not job.job_id:
                job = NewJob(job.name, job.data, job.opts, job.timestamp, str(uuid.uuid4()), job.queue_name)
            queue = rows.check_queue_name(job.queue_name) if job.queue_name else self.name
            entries.append(adding.batch_entry(job, queue, link))
        order = adding.parents_first(entries)
        result = await self._run("add_flow", [rows.dump_out([entries[i] for i in order])], op="addFlow")
        ids: list[str] = [""] * len(entries)
        for position, row in zip(order, result.rows):
            outcome = adding.id_or_error(str(row["id"]), entries[position], "addFlow")
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

    async def get_dependencies(self, job_id: str,
                               pages: Optional[Mapping[str, Optional[tuple[int, int]]]] = None) -> dict[str, Any]:
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
        if not pages or all(page is None for page in pages.values()):
            return found
        out: dict[str, Any] = {}
        for name, page in pages.items():  # one page of each asked state; the cursor is an offset
            if page is None:
                continue
            cursor, count = page
            items = found[name]
            keys = list(items)[cursor:cursor + count]
            out[name] = {k: items[k] for k in keys} if isinstance(items, dict) else keys
            out[f"next_{name}_cursor"] = cursor + count if cursor + count < len(items) else 0
        return out

    async def get_counts_per_priority(self, priorities: Sequence[int]) -> list[int]:
        result = await self._run("get_counts_per_priority", [self.name, [int(p) for p in priorities]])
        return [int(r["cnt"]) for r in result.rows]

    async def get_metrics(self, type: str, start: int, end: int) -> tuple[list[Any], list[Any], int]:
        """As Node on PostgreSQL: meta ``[total, "0", "0"]``, the points (newest first) as text, and
        the number of points returned."""
        row = (await self._run("get_metrics", [self.name, type, start, end])).first() or {}
        data = [str(point) for point in (row.get("data") or [])]
        return [str(row.get("total") or 0), "0", "0"], data, len(data)

    # the job next in line without priority (least seq, as a worker takes it) and with (by priority, seq),
    # each one step of job_ready_idx: what the Redis backend reads at the ends of its wait list and prioritized set
    _NEXT_WAITING_SQL = (
        "SELECT (SELECT added_at_ms FROM job WHERE queue = $1 AND state = 'waiting' AND priority = 0 "
        "ORDER BY seq LIMIT 1) AS plain, (SELECT added_at_ms FROM job WHERE queue = $1 AND state = 'waiting' "
        "AND priority > 0 ORDER BY priority, seq LIMIT 1) AS prioritized")

    async def get_figures(self, states: Sequence[str]) -> QueueFigures:
        """The scrape's reads, concurrently; the next waiting jobs by one indexed query (upstream's
        get_range orders a state's rows newest first, so its first row is not the next in line)."""
        counts, completed, failed, next_rows, clients = await asyncio.gather(
            self.get_counts(states), self.get_metrics("completed", 0, 0), self.get_metrics("failed", 0, 0),
            self.connection.execute(self._NEXT_WAITING_SQL, [self.name]), self.get_client_list())
        row = next_rows.first() or {}
        return QueueFigures(counts=list(counts), completed_total=metrics_total(completed[0]),
                            failed_total=metrics_total(failed[0]),
                            next_waiting=[{"timestamp": str(row[key])} for key in ("plain", "prioritized")
                                          if row.get(key) is not None],
                            workers=len(clients))

    async def get_rate_limit_ttl(self, max_jobs: Optional[int]) -> int:
        result = await self._run("get_rate_limit_ttl", [self.name, max_jobs or 0, rows.now_ms()])
        return int(result.rows[0]["ttl"])

    async def set_rate_limit(self, expire_ms: int) -> None:
        """Hold the queue's limiter window for ``expire_ms`` ms (Node's setRateLimit)."""
        await self._run("set_rate_limit", [self.name, int(expire_ms), rows.now_ms()])

    async def remove_rate_limit_key(self) -> int:
        """End the limiter window now (Node's removeRateLimitKey); 1 when there was one."""
        return int((await self._run("remove_rate_limit", [self.name])).rows[0]["n"])

    async def get_deduplication_job_id(self, deduplication_id: str) -> Optional[str]:
        dedup_id = rows.text_param(deduplication_id, what="deduplication id")
        row = (await self._run("get_deduplication_job_id", [self.name, dedup_id, rows.now_ms()])).first()
        return rows.optional_str(row["job_id"]) if row else None

    async def get_client_list(self) -> list[dict[str, str]]:
        """The sessions of this queue's workers (Node names only LISTEN sessions: ``<queue>``,
        ``<queue>:w:<worker>``, ``<queue>:qe``; the whole database is read, as Node reads it), as
        ``{"name": application_name}``."""
        names = (str(r["application_name"]) for r in (await self._run("get_client_list")).rows)
        # this queue's workers, as Node's getWorkers matches them (not its QueueEvents, not others')
        return [{"name": name} for name in names if name == self.name or name.startswith(f"{self.name}:w:")]

    async def get_queue_events_clients(self) -> list[dict[str, str]]:
        names = (str(r["application_name"]) for r in (await self._run("get_client_list")).rows)
        return [{"name": name} for name in names if name == f"{self.name}:qe"]

    async def paginate_dependencies(self, parent_id: str, type: str, start: int, end: int) -> dict[str, Any]:
        """As Node's paginate over a parent's ``:processed`` / ``:dependencies``: one query."""
        status = "processed" if type == "processed" else "pending"
        offset = max(start, 0)
        limit = end - offset + 1 if end >= 0 else None
        result = await self._run("paginate_dependencies", [self.name, self._id(parent_id), status, offset, limit])
        items: list[dict[str, Any]] = []
        jobs: list[JobFields] = []
        for row in result.rows:
            item: dict[str, Any] = {"id": str(row["child_key"])}
            if status == "processed":
                item["v"] = row["dep_value"]
            items.append(item)
            jobs.append(rows.job_fields(row) if row.get("id") is not None else {})
        total = int(result.rows[0]["total"]) if result.rows else 0
        return {"items": items, "jobs": jobs, "total": total}

    async def remove_orphaned_jobs(self, count: int, limit: int) -> int:
        return 0  # as Node's PostgreSQL backend: a row is never left without its state

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
        # (a group job goes back behind its group's gate: our trigger holds it when the group is busy)
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
                await self._forget_group_settings()
                return

    async def _forget_group_settings(self) -> None:
        """After an obliterate: our group settings of the queue go too (upstream's obliterate knows
        only its own tables)."""
        if not getattr(self.connection, "groups_version", 0):
            try:
                await self.ensure_groups()
            except GroupsNotInstalled:
                return
        await self.connection.execute("DELETE FROM bullmq_compat_group WHERE queue = $1", [self.name])
        await self.connection.execute("DELETE FROM bullmq_compat_group_queue WHERE queue = $1", [self.name])
        if getattr(self.connection, "groups_version", 0) >= 4:  # (group rate limits' start log: version 4)
            await self.connection.execute("DELETE FROM bullmq_compat_group_start WHERE queue = $1", [self.name])

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
        result = await self._run("remove_deduplication_key", [self.name, dedup_id, self._id(job_id), rows.now_ms()])
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
        result = await self._run("remove_child_dependency", [self.name, job_id, parent_key, rows.now_ms()],
                                 job_id=job_id, op="removeChildDependency", parent_key=parent_key)
        return int(result.rows[0]["n"]) == 0

    async def remove_unprocessed_children(self, job_id: str) -> None:
        await self._run("remove_unprocessed_children", [self.name, self._id(job_id)])

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


async def discover_queues(connection: Any, schema: str = migrator.DEFAULT_SCHEMA) -> list[str]:
    """The names of the queues of ``schema`` (those with jobs or queue meta), sorted (`bullmq-compat info`)."""
    conn = PostgresConnection(connection, schema=schema)
    try:
        await conn.connect()
        result = await conn.execute("SELECT queue FROM meta UNION SELECT queue FROM job ORDER BY 1")
        return [str(row["queue"]) for row in result.rows]
    finally:
        await conn.close()
