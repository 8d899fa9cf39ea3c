"""Job: one job hash, read and changed only through the upstream scripts."""
from __future__ import annotations

import decimal
import math
import re
import time
import traceback
from typing import TYPE_CHECKING, Any, Mapping, Optional

from bullmq_compat._backoff import retry_delay
from bullmq_compat._errors import (
    BullMQCompatError,
    InvalidArgument,
    JobLockNotFound,
    UnrecoverableError,
)
from bullmq_compat._job_flow import FlowJobMixin
from bullmq_compat._meter import record_job
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import attempts_of, from_wire, int_or_zero, normalize_job_options, to_node_names

if TYPE_CHECKING:
    from bullmq_compat._queue import QueueBase


def _group_id(value: Any) -> Optional[str]:
    """A group id as the gate stores it (a non-empty str Redis can take back), else None: a corrupt
    or foreign hash's value must not make its job unfinishable."""
    if type(value) is not str or not value:
        return None
    try:
        value.encode()
    except UnicodeEncodeError:  # undecodable bytes read back as surrogates
        return None
    return value


def _json(text: Optional[str], default: Any) -> Any:
    if text is None:
        return default
    try:
        return codec.loads(text)
    except ValueError:
        return default


# JavaScript's white space, which parseInt skips before the number
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_INT = re.compile(r"([+-]?)(?:0[xX]([0-9a-fA-F]+)|([0-9]+))")


def _js_int(text: Optional[str]) -> Optional[int]:
    """JavaScript's ``parseInt(text)``, as Node reads a job hash's numbers: white space skipped, a
    sign, then the longest run of decimal digits (hexadecimal after ``0x``), the rest ignored; the
    value as a double holds it (beyond 2**53 rounded, as Node's JSON writes it). None for NaN."""
    if text and text.isascii() and text.isdigit() and len(text) < 16:  # the usual stored number
        return int(text)
    if text is None:
        return None
    match = _JS_INT.match(text.lstrip(_JS_SPACE))
    if match is None:
        return None
    sign, hex_digits, digits = match.groups()
    value = int(hex_digits, 16) if hex_digits is not None else int(digits)
    if value > 2 ** 53:  # the double's shortest decimal, as Node's JSON writes it (Infinity: null there)
        value = int(decimal.Decimal(repr(float(value)))) if value < 2 ** 1024 else 0
    return -value if sign == "-" else value


def _opts_from_stored(text: Optional[str]) -> dict[str, Any]:
    """Node's optsFromJSON: stored options (short keys) → JobsOptions names (``tm``/``omc`` into
    ``telemetry``)."""
    stored = _json(text or "{}", {})
    return to_node_names(from_wire(stored)) if isinstance(stored, dict) else {}


# stored options text -> (Python-named options, problem): jobs of one kind share the same text, so
# a worker decodes and renames it once, not per job. Only options of scalar values are kept (a
# Job gets its own copy of the dict, which then shares nothing mutable); bounded, cleared when full.
_OPTS_CACHE: dict[str, tuple[dict[str, Any], Optional[str]]] = {}
_OPTS_CACHE_MAX = 512
_SCALARS = (str, int, float, bool, type(None))


def _stored_opts(text: str) -> tuple[dict[str, Any], Optional[str]]:
    """A job hash's ``opts`` text as `Job.opts` holds it, and what is wrong with it (or None).
    The dict returned may be shared: copy it before changing it (the Job constructor does)."""
    cached = _OPTS_CACHE.get(text)
    if cached is not None:
        return cached
    problem: Optional[str] = None
    try:
        stored = codec.loads(text)
        if not isinstance(stored, dict):
            raise ValueError("not an object")
    except ValueError as err:
        stored = {}
        problem = f"opts is not a JSON object ({err})"
    attempts = stored.get("attempts")
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, (int, float))
                                 or not math.isfinite(attempts)):
        problem = f"opts.attempts={attempts!r} is not a finite number"
    result = (_as_node_builds(from_wire(stored)), problem)
    if all(type(value) in _SCALARS for value in result[0].values()):
        if len(_OPTS_CACHE) >= _OPTS_CACHE_MAX:
            _OPTS_CACHE.clear()
        _OPTS_CACHE[text] = result
    return result


def _as_node_builds(opts: dict[str, Any]) -> dict[str, Any]:
    """Read options as Node's Job constructor keeps them: without ``repeatJobKey`` (the job's
    ``repeat_job_key``), and a finite number ``backoff`` as ``{"type": "fixed", "delay": n}``
    (Backoffs.normalize; a falsy one is dropped)."""
    opts.pop("repeat_job_key", None)
    if "backoff" in opts:
        backoff = opts["backoff"]
        if isinstance(backoff, (int, float)) and not isinstance(backoff, bool) and math.isfinite(backoff):
            opts["backoff"] = {"type": "fixed", "delay": backoff}
        elif not backoff:
            del opts["backoff"]
    return opts


def job_json_from_raw(raw: Mapping[str, str]) -> dict[str, Any]:
    """A job hash as Node's ``JobJson`` (rawToJobJson): ``data`` stays JSON text, numbers are
    numbers, options have Node's names; fields the hash lacks are left out (Node: undefined)."""
    out: dict[str, Any] = {
        "id": raw.get("id"), "name": raw.get("name"), "data": raw.get("data") or "{}",
        "opts": _opts_from_stored(raw.get("opts")), "progress": _json(raw.get("progress") or "0", 0),
        "delay": _js_int(raw.get("delay")), "priority": _js_int(raw.get("priority")),
        "timestamp": _js_int(raw.get("timestamp")), "attemptsStarted": _js_int(raw.get("ats") or "0"),
        "attemptsMade": _js_int(raw.get("attemptsMade") or raw.get("atm") or "0"),
        "stalledCounter": _js_int(raw.get("stc") or "0"),
        "finishedOn": _js_int(raw.get("finishedOn")) if raw.get("finishedOn") else None,
        "processedOn": _js_int(raw.get("processedOn")) if raw.get("processedOn") else None,
        "repeatJobKey": raw.get("rjk"), "debounceId": raw.get("deid"), "deduplicationId": raw.get("deid"),
        "failedReason": raw.get("failedReason"), "deferredFailure": raw.get("defa"),
        "stacktrace": raw.get("stacktrace"), "returnvalue": raw.get("returnvalue"),
        "parentKey": raw.get("parentKey"), "parent": _json(raw["parent"], None) if raw.get("parent") else None,
        "processedBy": raw.get("pb"),
    }
    return {key: value for key, value in out.items() if value is not None}


class Job(FlowJobMixin):
    """A job of a queue, as Node BullMQ's Job shows it, with Python names.

    >>> job = await queue.add("send", {"to": "a@b"}, attempts=3)
    >>> await job.get_state()
    'waiting'
    """

    #: while a ``Worker(transactional=True)`` processor runs: its transaction's connection (a psycopg
    #: ``AsyncConnection``); what the processor writes there commits with the job's completion
    transaction: Any = None
    #: set by ``Worker.rate_limit_group``: the job went back to wait its group's turn, its worker
    #: does not finish this attempt
    _handed_back: bool = False

    def __init__(self, queue: "QueueBase", name: str, data: Any = None,
                 opts: Optional[Mapping[str, Any]] = None, id: Optional[str] = None) -> None:
        """A job of ``queue`` not yet stored: `Queue.add` and `Job.create` store one; `Job.from_id`
        reads one back. ``opts`` are Node's job options (wire names)."""
        self.queue = queue
        self.id = id
        self.name = name
        self.data: Any = {} if data is None else data
        self.opts: dict[str, Any] = dict(opts or {})
        self.timestamp = 0
        self.delay = int_or_zero(self.opts.get("delay"))
        self.priority = int_or_zero(self.opts.get("priority"))
        self.attempts_made = 0
        self.attempts_started = 0
        self.stalled_counter = 0
        self.processed_on: Optional[int] = None
        self.finished_on: Optional[int] = None
        self.returnvalue: Any = None
        self.failed_reason: Optional[str] = None
        self.stacktrace: list[str] = []
        self.progress: Any = 0
        self.parent_key: Optional[str] = None
        self.parent: Optional[dict[str, Any]] = None
        self.repeat_job_key: Optional[str] = None
        self.deduplication_id: Optional[str] = None
        self.processed_by: Optional[str] = None
        #: the group (per-group FIFO) this job belongs to, or None
        group = self.opts.get("group")
        self.group_id: Optional[str] = _group_id(group.get("id")) if isinstance(group, dict) else None
        self.token: Optional[str] = None
        #: why the stored hash could not be read as a job (foreign or corrupt payload), else None
        self.parse_error: Optional[str] = None
        #: the error of this attempt, once `move_to_failed` recorded it
        self.error: Optional[BaseException] = None
        #: Node's deferredFailure ('defa'): set by the stalled check on a job stalled too often (and
        #: on a parent whose child failed); the worker that takes the job fails it with this reason
        self.deferred_failure: Optional[str] = None

    # -- reading --------------------------------------------------------------------------
    @classmethod
    def from_raw(cls, queue: "QueueBase", job_id: str, raw: Mapping[str, str]) -> "Job":
        """Build a Job from its hash fields, as upstream stores them."""
        get = raw.get
        problems: Optional[list[str]] = None  # what makes the hash unreadable as a job; the usual: nothing
        data_text = get("data")
        if data_text is None:
            data: Any = {}
        else:
            try:
                data = codec.loads(data_text)
            except ValueError as err:
                data = data_text
                problems = [f"data is not JSON ({err})"]
        opts, opts_problem = _stored_opts(get("opts") or "{}")
        if opts_problem is not None or "name" not in raw:
            problems = [*(problems or ()), *([opts_problem] if opts_problem else []),
                        *([] if "name" in raw else ["the job hash has no name"])]
        # every attribute set once, from the hash, in the constructor's order (the constructor's
        # defaults would only be overwritten): a worker builds one Job per job it takes
        job = cls.__new__(cls)
        job.queue = queue
        job.id = job_id
        job.name = get("name", "")
        job.data = {} if data is None else data
        job.opts = opts = dict(opts)
        # numbers as Node reads them (rawToJobJson's parseInt, then Job.fromJSON; NaN, which an int
        # cannot hold, reads 0; processedOn/finishedOn that are NaN or 0 are not set, as in Node;
        # attemptsMade || atm: "0" is true in JavaScript, "" is not)
        job.timestamp = _js_int(get("timestamp")) or 0
        job.delay = _js_int(get("delay")) or 0
        job.priority = _js_int(get("priority")) or 0
        job.attempts_made = _js_int(get("attemptsMade") or get("atm")) or 0
        job.attempts_started = _js_int(get("ats")) or 0
        job.stalled_counter = _js_int(get("stc")) or 0
        job.processed_on = _js_int(get("processedOn")) or None
        job.finished_on = _js_int(get("finishedOn")) or None
        # the fields below are absent from a job that is not finished, retried or a flow's
        job.returnvalue = _json(raw["returnvalue"], raw["returnvalue"]) if "returnvalue" in raw else None
        job.failed_reason = get("failedReason")
        job.stacktrace = []
        if "stacktrace" in raw:
            traces = _json(raw["stacktrace"], [])
            if isinstance(traces, list):
                job.stacktrace = traces
        job.progress = _json(raw["progress"], raw["progress"]) if "progress" in raw else 0
        job.parent_key = get("parentKey") or None
        job.parent = _json(raw["parent"], None) if "parent" in raw else None
        job.repeat_job_key = get("rjk")
        job.deduplication_id = get("deid")
        job.processed_by = get("pb")
        group_id = _group_id(raw["gid"]) if "gid" in raw else None
        if group_id is None and "group" in opts:
            group = opts["group"]
            group_id = _group_id(group.get("id")) if isinstance(group, dict) else None
        job.group_id = group_id
        job.token = None
        job.parse_error = "; ".join(problems) if problems else None
        job.error = None
        job.deferred_failure = get("defa") or None
        return job

    # -- Node's static constructors -------------------------------------------------------
    @classmethod
    async def create(cls, queue: Any, name: str, data: Any = None, opts: Optional[Mapping[str, Any]] = None) -> "Job":
        """Add one job to ``queue`` (Node's ``Job.create``): as `Queue.add`, but without the
        queue's 'waiting' event."""
        job: Job = await queue._add_one(name, data, dict(opts or {}))
        return job

    @classmethod
    async def create_bulk(cls, queue: Any, jobs: Any) -> list["Job"]:
        """Add many jobs to ``queue`` in one round trip (Node's ``Job.createBulk``): as `Queue.add_bulk`."""
        added: list[Job] = await queue.add_bulk(jobs)
        return added

    @classmethod
    async def from_id(cls, queue: "QueueBase", job_id: Optional[str]) -> Optional["Job"]:
        """The job ``job_id`` of ``queue``, or None (Node's ``Job.fromId``; an empty id gives None)."""
        if not job_id:
            return None
        return await queue.get_job(str(job_id))

    @classmethod
    def from_json(cls, queue: "QueueBase", json: Mapping[str, Any], job_id: Optional[str] = None) -> "Job":
        """A Job from Node's ``JobJson`` (what `Queue.get_dependencies` lists, or `as_json` gives):
        ``data`` as JSON text, Node's field and option names (Node's ``Job.fromJSON``)."""
        if not isinstance(json, Mapping):
            raise InvalidArgument(f"json={json!r} must be a dict shaped as Node's JobJson")
        try:
            data = codec.loads(json.get("data") or "{}")
        except (TypeError, ValueError) as err:
            raise InvalidArgument(f"JobJson data {json.get('data')!r} is not JSON text ({err})") from None
        opts = json.get("opts") or {}
        if not isinstance(opts, Mapping):
            raise InvalidArgument(f"JobJson opts {opts!r} must be a dict")
        job = cls(queue, str(json.get("name") or ""), data, _as_node_builds(from_wire(opts)), json.get("id") or job_id)
        job.progress = json.get("progress", 0) if json.get("progress") is not None else 0
        job.delay = int_or_zero(json.get("delay"))
        job.priority = int_or_zero(json.get("priority"))
        job.timestamp = int_or_zero(json.get("timestamp"))
        job.finished_on = json.get("finishedOn") or None
        job.processed_on = json.get("processedOn") or None
        job.repeat_job_key = json.get("repeatJobKey") or job.repeat_job_key
        job.deduplication_id = json.get("deduplicationId") or job.deduplication_id
        job.failed_reason = json.get("failedReason") or None
        job.attempts_started = int_or_zero(json.get("attemptsStarted"))
        job.attempts_made = int_or_zero(json.get("attemptsMade"))
        job.stalled_counter = int_or_zero(json.get("stalledCounter"))
        job.deferred_failure = json.get("deferredFailure") or None
        traces = _json(json.get("stacktrace") or None, [])
        job.stacktrace = traces if isinstance(traces, list) else []
        if isinstance(json.get("returnvalue"), str):
            job.returnvalue = _json(json["returnvalue"], None)
        job.parent_key = json.get("parentKey") or None
        job.parent = json.get("parent") or None
        job.processed_by = json.get("processedBy") or None
        return job

    # -- Node's views ---------------------------------------------------------------------
    @property
    def queue_name(self) -> str:
        """The name of this job's queue."""
        return self.queue.name

    @property
    def prefix(self) -> str:
        """The key prefix of this job's queue, as Node derives it from the qualified name
        (``""`` where the backend has none, e.g. PostgreSQL)."""
        qualified, name = self.queue.qualified_name, self.queue.name
        return qualified[:len(qualified) - len(name) - 1] if len(qualified) > len(name) + 1 else ""

    def as_json(self) -> dict[str, Any]:
        """The job as Node's ``asJSON`` prepares it for storage: ``data``, ``failedReason``,
        ``stacktrace`` and ``returnvalue`` as JSON text, Node's names, unset fields left out."""
        out: dict[str, Any] = {
            "id": self.id, "name": self.name, "data": codec.dumps(self.data),
            "opts": {"attempts": 0, **to_node_names(self.opts)},
            "parent": dict(self.parent) if self.parent else None, "parentKey": self.parent_key,
            "progress": self.progress, "attemptsMade": self.attempts_made,
            "attemptsStarted": self.attempts_started, "stalledCounter": self.stalled_counter,
            "finishedOn": self.finished_on, "processedOn": self.processed_on, "timestamp": self.timestamp,
            "failedReason": codec.dumps(self.failed_reason) if self.failed_reason is not None else None,
            "stacktrace": codec.dumps(self.stacktrace), "deduplicationId": self.deduplication_id,
            "repeatJobKey": self.repeat_job_key, "returnvalue": codec.dumps(self.returnvalue),
        }
        return {key: value for key, value in out.items() if value is not None}

    def to_json(self) -> dict[str, Any]:
        """The job as Node's ``toJSON`` shows it (``JSON.stringify(job)``): its fields by Node's
        names, values decoded, without the queue."""
        out: dict[str, Any] = {
            "name": self.name, "data": self.data, "opts": {"attempts": 0, **to_node_names(self.opts)},
            "id": self.id, "progress": self.progress, "returnvalue": self.returnvalue,
            "stacktrace": self.stacktrace, "delay": self.delay, "priority": self.priority,
            "attemptsStarted": self.attempts_started, "attemptsMade": self.attempts_made,
            "stalledCounter": self.stalled_counter, "repeatJobKey": self.repeat_job_key,
            "timestamp": self.timestamp, "parentKey": self.parent_key, "parent": self.parent,
            "deduplicationId": self.deduplication_id, "queueQualifiedName": self.queue.qualified_name,
            "finishedOn": self.finished_on, "processedOn": self.processed_on,
            "failedReason": self.failed_reason, "processedBy": self.processed_by,
            "deferredFailure": self.deferred_failure,
        }
        keep = {"returnvalue", "stacktrace"}  # null in Node's JSON rather than left out
        return {key: value for key, value in out.items() if value is not None or key in keep}

    @property
    def full_key(self) -> str:
        """``<qualified queue name>:<id>``: the key a child's ``parent_key`` names."""
        return f"{self.queue.qualified_name}:{self.id}"

    @property
    def attempts(self) -> int:
        """How many attempts the job has in all (its ``attempts`` option; 0 when unset or
        unreadable, i.e. no retries)."""
        return attempts_of(self.opts)

    def to_dict(self) -> dict[str, Any]:
        """The job's fields as a plain dict (for logs, JSON APIs and tests)."""
        return {
            "id": self.id, "name": self.name, "data": self.data, "opts": self.opts,
            "timestamp": self.timestamp, "delay": self.delay, "priority": self.priority,
            "attempts_made": self.attempts_made, "attempts_started": self.attempts_started,
            "processed_on": self.processed_on, "finished_on": self.finished_on,
            "returnvalue": self.returnvalue, "failed_reason": self.failed_reason,
            "stacktrace": self.stacktrace, "progress": self.progress, "parent_key": self.parent_key,
            "processed_by": self.processed_by,
        }

    def __repr__(self) -> str:
        return f"<Job {self.queue.name}:{self.id} name={self.name!r}>"

    async def get_state(self) -> str:
        """'completed', 'failed', 'delayed', 'active', 'waiting', 'waiting-children', 'prioritized' or 'unknown'."""
        return await self.queue.get_job_state(str(self.id))

    async def is_completed(self) -> bool:
        """True when the job is in the completed state now (read from the backend)."""
        return await self.get_state() == "completed"

    async def is_failed(self) -> bool:
        """True when the job is in the failed state now (read from the backend)."""
        return await self.get_state() == "failed"

    async def is_waiting(self) -> bool:
        """True when the job is waiting now (read from the backend)."""
        return await self.get_state() == "waiting"

    async def is_delayed(self) -> bool:
        """True when the job is delayed now (read from the backend)."""
        return await self.get_state() == "delayed"

    async def is_active(self) -> bool:
        """True when the job is active now (read from the backend)."""
        return await self.get_state() == "active"

    async def is_waiting_children(self) -> bool:
        """Whether this job waits for its children (or, a group job, for its group's turn)."""
        return await self.get_state() == "waiting-children"

    async def wait_until_finished(self, queue_events: Any, timeout: Optional[int] = None) -> Any:
        """Wait (listening through a running `QueueEvents` of this queue) until the job finishes:
        its return value, or `JobFailed` with its failedReason; `JobWaitTimeout` after ``timeout`` ms.
        A job already finished answers at once."""
        from bullmq_compat._queue_events import wait_until_finished

        return await wait_until_finished(self, queue_events, timeout)

    # -- changing ---------------------------------------------------------------------------
    @property
    def _backend(self) -> Any:
        return self.queue.backend

    async def update_data(self, data: Any) -> None:
        """Replace the job's data (JSON-serialisable)."""
        text = codec.dumps(data)
        await self._backend.update_data(str(self.id), text)
        self.data = data

    async def update_progress(self, progress: Any) -> None:
        """Set progress (a number or a JSON-serialisable object) and emit the 'progress' event."""
        text = codec.dumps(progress, what="progress")
        await self._backend.update_progress(str(self.id), text)
        self.progress = progress
        self.queue.emit("progress", self, progress)

    async def log(self, row: str) -> int:
        """Append a log line; returns the number of lines kept."""
        keep = self.opts.get("keep_logs")
        return int(await self._backend.add_log(str(self.id), str(row), keep if keep else None))

    async def remove(self, remove_children: bool = True) -> None:
        """Remove the job (and, by default, its children), as Node's `job.remove()`."""
        removed = await self._backend.remove(str(self.id), remove_children)
        if not removed:
            raise BullMQCompatError(
                f"Job {self.id} could not be removed because it is locked by another worker")
        self.queue.emit("removed", self)

    async def clear_logs(self, keep: Optional[int] = None) -> None:
        """Remove this job's log lines, keeping the newest ``keep`` (None or 0: remove all)."""
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise InvalidArgument(f"keep={keep!r} must be an int >= 0 (0: remove all) or None")
        await self._backend.clear_logs(str(self.id), keep or None)

    async def remove_deduplication_key(self) -> bool:
        """Forget this job's deduplication id, so the next add with it makes a new job; only while
        the id still points at this job (another job's claim is left alone). True when removed."""
        if not self.deduplication_id:
            return False
        return bool(await self._backend.remove_deduplication_key(self.deduplication_id, str(self.id)))

    async def retry(self, state: str = "failed", *, reset_attempts_made: bool = False,
                    reset_attempts_started: bool = False) -> None:
        """Move a failed (or completed) job back to waiting (a group job back behind its group's gate)."""
        if state not in ("failed", "completed"):
            raise InvalidArgument(f"state={state!r}: a job can be retried from 'failed' or 'completed' only")
        await self._backend.reprocess_job(str(self.id), state, bool(self.opts.get("lifo")), reset_attempts_made,
                                          reset_attempts_started, group_id=self.group_id)
        self.failed_reason = None
        self.finished_on = None
        self.processed_on = None
        self.returnvalue = None
        if reset_attempts_made:
            self.attempts_made = 0
        if reset_attempts_started:
            self.attempts_started = 0

    async def promote(self) -> None:
        """Move a delayed job to waiting now."""
        await self._backend.promote(str(self.id))
        self.delay = 0

    async def change_delay(self, delay: int) -> None:
        """Reschedule a delayed job to run `delay` ms from now."""
        delay = normalize_job_options({"delay": delay})["delay"]
        await self._backend.change_delay(str(self.id), delay, int(time.time() * 1000))
        self.delay = delay

    async def change_priority(self, priority: int = 0, lifo: bool = False) -> None:
        """Change the priority of a waiting or prioritized job.

        A group job that waits for its turn behind its group's gate (docs/groups.md, "Priority
        within a group") gets ``priority`` as its *group* priority (``opts["group"]["priority"]``,
        an int from 0 to 2,097,151) and moves within its group; its own priority is left as it is
        (``lifo`` is refused there). A released group job, like any other, changes its own priority."""
        if self.group_id is not None:
            from bullmq_compat._groups import check_group_priority

            check_group_priority({"id": self.group_id, "priority": priority}, priority)
            gate = self._backend.groups()
            await gate.ready()
            if await gate.change_held_priority(str(self.id), priority, lifo):
                group = self.opts.get("group")
                self.opts["group"] = {**(group if isinstance(group, dict) else {"id": self.group_id}),
                                      "priority": priority}
                return
        priority = normalize_job_options({"priority": priority})["priority"]
        await self._backend.change_priority(str(self.id), priority, lifo)
        self.priority = priority

    async def get_logs(self, start: int = 0, end: int = -1, asc: bool = True) -> dict[str, Any]:
        """The job's log rows from ``start`` to ``end`` (inclusive, -1 the last), oldest first
        unless ``asc=False``: ``{"logs": [...], "count": n}`` (Node's ``Queue.getJobLogs``)."""
        logs, count = await self._backend.get_job_logs(str(self.id), start, end, asc)
        return {"logs": logs, "count": count}

    # -- finishing (what a worker does; also usable by hand with a token) --------------------------
    async def _channel(self) -> Any:
        # a running Worker's channel is there already: skip the two awaits of worker_channel()
        channel = getattr(self.queue, "_channel", None)
        return channel if channel is not None else await self.queue.worker_channel()

    async def move_to_completed(self, return_value: Any, token: str, fetch_next: bool = False, *,
                                transaction: Any = None) -> Any:
        """Complete this active job (its lock ``token`` must match); returns the next job's
        `NextJob` when ``fetch_next``. Raises `InvalidJobData` for a value that is not JSON.
        ``transaction``: the worker's `JobTransaction` for this job (``Worker(transactional=True)``),
        committed with the completion."""
        value = codec.dumps(return_value, what="return value")
        now = int(time.time() * 1000)
        if transaction is not None:
            reply = await transaction.complete(str(self.id), self.opts, value, token, now, fetch_next)
            self._completed(return_value, now)
            return reply
        channel = getattr(self.queue, "_channel", None)  # a running Worker's: no coroutine to await
        if channel is None:
            channel = await self._channel()
        job_id = str(self.id)
        try:  # the first attempt here: one coroutine less per job; the queue's retrying after trouble
            reply = await channel.move_to_finished(
                job_id, self.opts, "completed", value, token, now, fetch_next, group_id=self.group_id)
        except Exception as err:
            reply = await self.queue.finishing(lambda: channel.move_to_finished(
                job_id, self.opts, "completed", value, token, now, fetch_next, group_id=self.group_id), err)
        else:
            self.queue._connection_ok()
        self._completed(return_value, now)
        return reply

    def _completed(self, return_value: Any, now: int) -> None:
        self.returnvalue = return_value
        self.finished_on = now
        self.attempts_made += 1
        if getattr(self.queue, "meter", None) is not None:
            record_job(self, "completed")

    async def move_to_failed(self, err: BaseException, token: str, fetch_next: bool = False) -> Any:
        """Fail this attempt as Node does: retry (now, or after the backoff) while attempts remain and
        the error is not an `UnrecoverableError`; else move to failed. Returns the next job's `NextJob`."""
        reason = str(err) or type(err).__name__
        self.error = err
        self.stacktrace = list(self.stacktrace or [])
        self.stacktrace.append("".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip())
        limit = self.opts.get("stack_trace_limit")
        if limit == 0:
            self.stacktrace = []
        elif limit:
            self.stacktrace = self.stacktrace[-int(limit):]
        unrecoverable = isinstance(err, UnrecoverableError) or type(err).__name__ == "UnrecoverableError"
        max_started = self.queue.max_started_attempts
        should_retry, delay = False, 0
        if (self.attempts_made + 1 < self.attempts and not unrecoverable
                and not (max_started and max_started <= self.attempts_started)):
            try:
                delay = await retry_delay(self.opts.get("backoff"), self.attempts_made + 1, err, self,
                                          self.queue.backoff_strategy)
                should_retry, delay = delay != -1, max(delay, 0)
            except Exception as backoff_err:
                reason = f"{reason} (and the backoff failed: {backoff_err})"
        fields = {"failedReason": reason, "stacktrace": codec.dumps(self.stacktrace)}
        now = int(time.time() * 1000)
        channel = await self._channel()
        job_id = str(self.id)
        reply: Any = None
        if should_retry and delay:
            reply = await self.queue.finishing(lambda: channel.move_to_delayed(
                job_id, now, delay, token, fields_to_update=fields, fetch_next=fetch_next))
            self.delay = delay
            state = "delayed"
        elif should_retry:
            await self.queue.finishing(lambda: channel.retry_job(job_id, bool(self.opts.get("lifo")), token, now, fields))
            state = "retried"
        else:
            reply = await self.queue.finishing(lambda: channel.move_to_finished(
                job_id, self.opts, "failed", reason, token, now, fetch_next, fields, group_id=self.group_id))
            self.finished_on = now
            state = "failed"
        self.failed_reason = reason
        if getattr(self.queue, "meter", None) is not None:
            record_job(self, state)
        self.attempts_made += 1
        return reply

    async def move_to_delayed(self, timestamp: int, token: str) -> None:
        """From a processor: postpone this job until ``timestamp`` (ms), then raise `DelayedError`."""
        now = int(time.time() * 1000)
        delay = max(int(timestamp) - now, 0)
        channel = await self._channel()
        await self.queue.finishing(lambda: channel.move_to_delayed(str(self.id), now, delay, token, skip_attempt=True))
        self.delay = delay
        if getattr(self.queue, "meter", None) is not None:
            record_job(self, "delayed")

    async def move_to_waiting_children(self, token: str, child: Optional[Mapping[str, str]] = None) -> bool:
        """From a processor: wait for this job's children; True when moved (then raise
        `WaitingChildrenError`), False when it has no pending children."""
        child_key = ""
        if child:
            # as in Node, child["queue"] is the qualified name ("<prefix>:<queue>", like parent=);
            # a bare queue name (queue names have no ':') is taken to be under this job's prefix
            queue = child["queue"] if ":" in child["queue"] else f"{self.queue.prefix}:{child['queue']}"
            child_key = f"{queue}:{child['id']}"
        channel = await self._channel()
        moved = bool(await self.queue.finishing(lambda: channel.move_to_waiting_children(
            str(self.id), token, int(time.time() * 1000), child_key)))
        if moved and getattr(self.queue, "meter", None) is not None:
            record_job(self, "waiting-children")
        return moved

    async def extend_lock(self, token: str, duration: int) -> None:
        """Keep this active job's lock for ``duration`` more ms (the worker does this on its own)."""
        channel = await self._channel()
        if not await self.queue.finishing(lambda: channel.extend_lock(str(self.id), token, duration)):
            raise JobLockNotFound(f"Missing lock for job {self.id}. extendLock", job_id=str(self.id),
                                  command="extendLock")

    async def move_to_wait(self, token: Optional[str] = None) -> int:
        """Put this active job back to waiting (as the worker does for `RateLimitError`); returns the
        queue's rate-limit TTL in ms. Without ``token``, as Node's default ``'0'``: the job's lock is
        not checked (for a job taken by hand)."""
        token = "0" if token is None else token
        channel = await self._channel()
        ttl = int(await self.queue.finishing(lambda: channel.move_job_from_active_to_wait(str(self.id), token)) or 0)
        if getattr(self.queue, "meter", None) is not None:
            record_job(self, "waiting")
        return ttl
