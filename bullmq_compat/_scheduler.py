"""Job schedulers: jobs made on a schedule (every N ms, or a cron pattern), as Node BullMQ makes them.

A scheduler is a hash ``<prefix>:<queue>:repeat:<id>`` (name, every/pattern, tz, limit, startDate,
endDate, offset, the template's data and opts, and ``ic``, the iteration count) and an entry of
the ``repeat`` sorted set scored by the time of its next job. Its jobs have the ids
``repeat:<id>:<millis>``. Each job is made when the previous one is taken by a worker, of either
language: Node's Worker and ours (`advance_job_scheduler`) both call upstream's
updateJobScheduler script, with ``producerId`` = the id of the job taken, so an iteration is made
once whoever takes the job. Cron times are computed as cron-parser computes them (`_cron`).

    >>> await queue.upsert_job_scheduler("report", {"pattern": "0 0 9 * * 1-5", "tz": "Europe/Paris"},
    ...                                  template={"name": "daily-report", "data": {"to": "ops"}})
"""
from __future__ import annotations

import inspect
import logging
import math
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping, Optional

from opentelemetry.trace import SpanKind

from bullmq_compat._cron import _zone, next_cron_millis, parse_cron
from bullmq_compat._errors import BullMQCompatError, InvalidArgument, InvalidJobOptions
from bullmq_compat._job import Job
from bullmq_compat._telemetry import JOB_ID, JOB_SCHEDULER_ID
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import JOB_OPTIONS, from_wire, normalize_job_options, to_wire

if TYPE_CHECKING:
    from bullmq_compat._queue import QueueBase

__all__ = ["JobSchedulerMixin", "advance_job_scheduler", "default_repeat_strategy",
           "normalize_repeat_options", "is_legacy_repeat_key"]

logger = logging.getLogger("bullmq_compat.scheduler")

# Python and Node names of the repeat options → Node's name
_REPEAT_KEYS = {
    "every": "every", "pattern": "pattern", "tz": "tz", "limit": "limit", "offset": "offset",
    "immediately": "immediately", "count": "count",
    "start_date": "startDate", "startDate": "startDate", "end_date": "endDate", "endDate": "endDate",
}
# job options a template cannot carry: each iteration sets them itself (Node: JobSchedulerTemplateOptions)
_NOT_IN_TEMPLATE = {"jobId", "delay", "deduplication", "parent", "prevMillis", "repeatJobKey", "timestamp"}
_PY_NAME = {opt.node: opt.python for opt in JOB_OPTIONS}
_WIRE = {}
for _opt in JOB_OPTIONS:
    _WIRE[_opt.python] = _opt.wire
    _WIRE[_opt.node] = _opt.wire
_DEDUP_NODE = {"keep_last_if_active": "keepLastIfActive"}

LEGACY_MIGRATION_URL = "https://docs.bullmq.io/guide/migrations/migrate-from-v5-to-v6"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ms(name: str, value: Any) -> int:
    """A date as epoch milliseconds: an int/float of ms, a datetime, or an ISO 8601 string."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be epoch milliseconds, a datetime or an ISO 8601 string")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InvalidArgument(f"{name}={value!r} must be finite")
        return int(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        except ValueError:
            raise InvalidArgument(f"{name}={value!r} is not an ISO 8601 date") from None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)  # a naive datetime is local time, as in JavaScript
    raise InvalidArgument(f"{name}={value!r} must be epoch milliseconds, a datetime or an ISO 8601 string")


def _int_option(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()) or value < minimum:
        raise InvalidArgument(f"repeat option {name}={value!r} must be an integer >= {minimum}")
    return int(value)


def normalize_repeat_options(repeat: Mapping[str, Any]) -> dict[str, Any]:
    """Repeat options by Python or Node name → Node's form, checked as Node checks them."""
    if not isinstance(repeat, Mapping):
        raise InvalidArgument(f"repeat options {repeat!r} must be a dict with 'every' or 'pattern'")
    out: dict[str, Any] = {}
    for key, value in repeat.items():
        node_key = _REPEAT_KEYS.get(key)
        if node_key is None:
            raise InvalidArgument(f"unknown repeat option {key!r}; known: {', '.join(sorted(set(_REPEAT_KEYS)))}")
        if value is not None:
            out[node_key] = value
    every, pattern = out.get("every"), out.get("pattern")
    if every is not None and pattern is not None:
        raise InvalidArgument("Both .pattern and .every options are defined for this repeatable job")
    if every is None and pattern is None:
        raise InvalidArgument("Either .pattern or .every options must be defined for this repeatable job")
    if out.get("immediately") and "startDate" in out:
        raise InvalidArgument("Both .immediately and .startDate options are defined for this repeatable job")
    if every is not None:
        out["every"] = _int_option("every", every, 1)
    if pattern is not None:
        parse_cron(pattern)  # raises InvalidArgument where cron-parser throws
    if "tz" in out:
        if not isinstance(out["tz"], str):
            raise InvalidArgument(f"repeat option tz={out['tz']!r} must be an IANA zone name such as 'Europe/Paris'")
        _zone(out["tz"])
    for key in ("limit", "count", "offset"):
        if key in out:
            out[key] = _int_option(key, out[key], 0)
    if "immediately" in out and not isinstance(out["immediately"], bool):
        raise InvalidArgument(f"repeat option immediately={out['immediately']!r} must be True or False")
    for key in ("startDate", "endDate"):
        if key in out:
            out[key] = _ms(key, out[key])
    return out


def _template_opts(defaults: Mapping[str, Any], opts: Mapping[str, Any]) -> dict[str, Any]:
    """The template's job options (Node form), merged over the queue's defaults, as Node stores them."""
    if not isinstance(opts, Mapping):
        raise InvalidJobOptions(f"template opts {opts!r} must be a dict")
    from bullmq_compat._groups import GROUP_OPTIONS

    normalized = normalize_job_options(opts, extra=GROUP_OPTIONS)
    ordered = [k for k in ("order_ms", "orderMs") if k in normalized]
    if ordered:
        raise InvalidJobOptions(f"a job scheduler's template cannot set {ordered[0]}: each iteration is ordered "
                                "in its group by when it is made (pass group= alone)")
    if isinstance(normalized.get("group"), Mapping) and "maxSize" in normalized["group"]:
        raise InvalidJobOptions(f"a job scheduler's template cannot set group={normalized['group']!r} with a "
                                "max_size: a full group would refuse an iteration, which ends the schedule")
    refused = sorted(_PY_NAME.get(k, k) for k in _NOT_IN_TEMPLATE & set(normalized))
    if refused:
        raise InvalidJobOptions(f"a job scheduler's template cannot set {', '.join(refused)}: "
                                "each iteration sets them itself")
    for key in ("backoff",):  # Node stores a template's number backoff as given
        raw = opts.get(key)
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            normalized[key] = raw
    return {**defaults, **normalized}


def _wire_from_python(opts: Mapping[str, Any]) -> dict[str, Any]:
    """A Job's options (Python names, from the stored hash) → the stored form (Node's short keys)."""
    wire: dict[str, Any] = {}
    for key, value in opts.items():
        if key == "telemetry" and isinstance(value, Mapping):
            if value.get("metadata") is not None:
                wire["tm"] = value["metadata"]
            omit = value.get("omit_context", value.get("omitContext"))
            if omit is not None:
                wire["omc"] = omit
            continue
        if key == "deduplication" and isinstance(value, Mapping):
            value = {_DEDUP_NODE.get(k, k): v for k, v in value.items()}
        wire[_WIRE.get(key, key)] = value
    return wire


def _repeat_for_job(repeat: Mapping[str, Any], offset: Optional[int], count: int) -> dict[str, Any]:
    """``repeat`` of an iteration's options: Node's ``{...repeat, offset, count, startDate, endDate}``
    without ``immediately`` (null and undefined values are dropped, as they are in Redis)."""
    out = {k: v for k, v in repeat.items() if k != "immediately" and v is not None}
    out.pop("offset", None)
    if offset is not None:
        out["offset"] = offset
    out["count"] = count
    return out


def _next_cron(repeat: Mapping[str, Any], millis: int) -> Optional[int]:
    """Node's defaultRepeatStrategy: the next cron time after ``millis`` (now when ``immediately``)."""
    if repeat.get("immediately"):
        return _now_ms()
    return next_cron_millis(repeat["pattern"], millis, tz=repeat.get("tz"),
                            start_date=repeat.get("startDate"), end_date=repeat.get("endDate"))


def default_repeat_strategy(millis: int, opts: Mapping[str, Any], name: Optional[str] = None) -> Optional[int]:
    """Node's ``defaultRepeatStrategy``: the next time (epoch ms) of a cron scheduler after
    ``millis`` -- the pattern's next time in ``tz`` from ``max(millis, start_date)``, now when
    ``immediately``, None when there is none before ``end_date``. ``opts`` are the repeat options
    (Node's or Python names); ``name`` (the job name) is unused, as in Node.

    Pass your own function with the same signature as ``Queue(..., repeat_strategy=f)`` to
    compute the times yourself; it may be async."""
    repeat = {_REPEAT_KEYS.get(key, key): value for key, value in opts.items()}
    if not isinstance(repeat.get("pattern"), str):
        raise InvalidArgument(f"repeat options {dict(opts)!r} have no cron 'pattern'")
    for key in ("startDate", "endDate"):
        if repeat.get(key) is not None:
            repeat[key] = _ms(key, repeat[key])
    return _next_cron(repeat, int(millis))


async def _strategy_next(queue: Any, repeat: Mapping[str, Any], now: int, name: str) -> Optional[int]:
    """The next cron time by the queue's ``repeat_strategy`` (Node's settings.repeatStrategy)."""
    strategy = getattr(queue, "repeat_strategy", None)
    if strategy is None:
        return _next_cron(repeat, now)
    result = strategy(now, dict(repeat), name)
    if inspect.isawaitable(result):
        result = await result
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
        raise BullMQCompatError(f"repeat_strategy returned {result!r}; it must return epoch ms (an int) or None")
    return int(result)


def is_legacy_repeat_key(key: str) -> bool:
    """Node's hasLegacyRepeatableKeyShape: ``name:id:endDate:tz:<cron|every>`` (BullMQ 5 keys)."""
    parts = key.split(":", 4)
    if len(parts) < 5:
        return False
    end_date, suffix = parts[2], parts[4]
    if end_date and not (end_date.isascii() and end_date.isdigit()):
        return False
    if not suffix:
        return False
    return " " in suffix or (suffix.isascii() and suffix.isdigit())


def _legacy_error(key: str) -> BullMQCompatError:
    return BullMQCompatError(
        f'Legacy repeatable job metadata is not supported in BullMQ v6 (key: "{key}"). Migrate legacy '
        f"repeatable jobs to Job Schedulers before upgrading. See {LEGACY_MIGRATION_URL}")


def _to_int(value: Any) -> Optional[int]:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _scheduler_from_hash(key: str, raw: Mapping[str, str], next_millis: Optional[int]) -> Optional[dict[str, Any]]:
    """Node's transformSchedulerData, with Python key names."""
    if not raw:
        if is_legacy_repeat_key(key):
            raise _legacy_error(key)
        return None
    out: dict[str, Any] = {"key": key, "name": raw.get("name"), "next": next_millis}
    for field, name in (("ic", "iteration_count"), ("limit", "limit"), ("startDate", "start_date"),
                        ("endDate", "end_date")):
        if raw.get(field):
            out[name] = _to_int(raw[field])
    if raw.get("tz"):
        out["tz"] = raw["tz"]
    if raw.get("pattern"):
        out["pattern"] = raw["pattern"]
    if raw.get("every"):
        out["every"] = _to_int(raw["every"])
    if raw.get("offset"):
        out["offset"] = _to_int(raw["offset"])
    if raw.get("data") or raw.get("opts"):
        template: dict[str, Any] = {}
        if raw.get("data"):
            template["data"] = codec.loads(raw["data"])
        if raw.get("opts"):
            template["opts"] = from_wire(codec.loads(raw["opts"]))
        out["template"] = template
    return out


class JobSchedulerMixin:
    """Queue methods for job schedulers (Node's upsertJobScheduler and friends)."""

    async def upsert_job_scheduler(self: Any, job_scheduler_id: str, repeat: Mapping[str, Any],
                                   template: Optional[Mapping[str, Any]] = None) -> Optional[Job]:
        """Create or update the scheduler ``job_scheduler_id`` and return its next job.

        ``repeat``: ``{"every": ms}`` or ``{"pattern": cron, "tz": ..., }``, plus ``start_date``,
        ``end_date`` (epoch ms, datetime or ISO string), ``limit``, ``offset``, ``immediately``
        (Node's camelCase names work too). ``template``: ``{"name", "data", "opts"}``; the name
        defaults to the scheduler id. Returns None, as Node returns undefined, when the scheduler
        has nothing left to run (``limit`` reached, or no cron time before ``end_date``).
        """
        if not isinstance(job_scheduler_id, str) or not job_scheduler_id:
            raise InvalidArgument(f"job_scheduler_id={job_scheduler_id!r} must be a non-empty str")
        repeat_opts = normalize_repeat_options(repeat)
        template = dict(template or {})
        unknown = set(template) - {"name", "data", "opts"}
        if unknown:
            raise InvalidArgument(f"template has unknown keys {sorted(unknown)}; use name, data, opts")
        name = template.get("name")
        name = job_scheduler_id if name is None else name
        if not isinstance(name, str):
            raise InvalidArgument(f"template name {name!r} must be a str")
        data = template.get("data")
        data = {} if data is None else data
        data_json = codec.dumps(data)
        opts = _template_opts(self.default_job_options, template.get("opts") or {})
        end_date = repeat_opts.get("endDate")
        if end_date is not None and end_date < _now_ms():
            raise InvalidArgument("End date must be greater than current timestamp")
        if repeat_opts.get("immediately") and repeat_opts.get("every") is not None:
            logger.warning("Using option immediately with every does not affect the job's schedule. "
                           "Job will run immediately anyway.")
        if opts.get("group") is not None:
            await _check_scheduler_groups(self, opts["group"])
        await self.wait_until_ready()
        return await _upsert(self, job_scheduler_id, repeat_opts, name, data, data_json, opts,
                             override=True, producer_id=None)

    async def get_job_scheduler(self: Any, job_scheduler_id: str) -> Optional[dict[str, Any]]:
        """The scheduler as Node's getJobScheduler shows it, with Python key names, or None:
        ``{"key", "name", "next", "iteration_count", "every" | "pattern", "tz", "limit",
        "start_date", "end_date", "offset", "template": {"data", "opts"}}`` (keys present when set)."""
        await self.wait_until_ready()
        raw, score = await self.backend.get_job_scheduler(job_scheduler_id)
        return _scheduler_from_hash(job_scheduler_id, raw, score)

    async def get_job_schedulers(self: Any, start: int = 0, end: int = -1, asc: bool = False
                                 ) -> list[dict[str, Any]]:
        """Schedulers by next run time (latest first unless ``asc``); like Node, an entry whose hash
        is gone is removed."""
        await self.wait_until_ready()
        out: list[dict[str, Any]] = []
        for scheduler_id, raw, score in await self.backend.get_job_schedulers(start, end, asc):
            found = _scheduler_from_hash(scheduler_id, raw, score)
            if found is None:
                await self.remove_job_scheduler(scheduler_id)
            else:
                out.append(found)
        return out

    async def get_job_schedulers_count(self: Any) -> int:
        """How many job schedulers the queue has."""
        await self.wait_until_ready()
        return int(await self.backend.get_job_schedulers_count())

    async def remove_job_scheduler(self: Any, job_scheduler_id: str) -> bool:
        """Remove the scheduler and its next (delayed) job; True when there was one."""
        await self.wait_until_ready()
        return bool(await self.backend.remove_job_scheduler(job_scheduler_id))


async def _check_scheduler_groups(queue: Any, group: Mapping[str, Any]) -> None:
    """A template with group=: each iteration joins its group (on PostgreSQL our trigger gates what
    upstream's SQL inserts; on Redis our scheduler scripts gate what upstream's make, and keepers
    what a Node worker's updateJobScheduler makes). Refused where the backend has no gate."""
    from bullmq_compat._groups import group_support

    group_support(queue.backend)
    ensure = getattr(queue.backend, "ensure_groups", None)
    if ensure is not None:
        await queue.wait_until_ready()
        await ensure()


async def _upsert(queue: "QueueBase", scheduler_id: str, repeat: dict[str, Any], name: str, data: Any,
                  data_json: str, opts: Mapping[str, Any], *, override: bool, producer_id: Optional[str],
                  wire_base: Optional[dict[str, Any]] = None) -> Optional[Job]:
    """Node's JobScheduler.upsertJobScheduler. ``opts`` is Node form (override) or ignored when
    ``wire_base`` (the taken job's stored options) is given (worker path).

    With telemetry, as Node's: a producer span ``add <queue>.<name>`` around adding the iteration,
    whose context the iteration carries (opts.tm) unless it has one already (a worker's next
    iteration keeps the first one's, so all iterations join the upsert's trace) or omits it."""
    telemetry = getattr(queue, "telemetry", None)
    if telemetry is None:
        return await _upsert_untraced(queue, scheduler_id, repeat, name, data, data_json, opts, override=override,
                                      producer_id=producer_id, wire_base=wire_base)
    with telemetry.span(SpanKind.PRODUCER, queue.name, "add", f"{queue.name}.{name}") as (span, metadata):
        job = await _upsert_untraced(queue, scheduler_id, repeat, name, data, data_json, opts, override=override,
                                     producer_id=producer_id, wire_base=wire_base, trace_metadata=metadata)
        if job is not None:
            span.set_attributes({JOB_SCHEDULER_ID: scheduler_id, JOB_ID: str(job.id)})
        return job


async def _upsert_untraced(queue: "QueueBase", scheduler_id: str, repeat: dict[str, Any], name: str, data: Any,
                           data_json: str, opts: Mapping[str, Any], *, override: bool, producer_id: Optional[str],
                           wire_base: Optional[dict[str, Any]] = None,
                           trace_metadata: Optional[str] = None) -> Optional[Job]:
    every, pattern, limit, offset = (repeat.get(k) for k in ("every", "pattern", "limit", "offset"))
    iteration = repeat["count"] + 1 if repeat.get("count") else 1
    if limit is not None and iteration > limit:
        return None
    now = _now_ms()
    end_date = repeat.get("endDate")
    if end_date and now > end_date:
        return None
    prev_millis = (wire_base or {}).get("prevMillis") or 0
    now = max(now, prev_millis)
    new_offset = offset if every and offset else None
    next_millis: Optional[int] = None
    if pattern:
        next_millis = await _strategy_next(queue, repeat, now, name)
        if next_millis is not None and next_millis < now:
            next_millis = now
    if not next_millis and not every:
        return None
    # the options of the iteration to add (Node's getNextJobOpts), in stored (wire) form
    wire = dict(wire_base) if wire_base is not None else to_wire(opts)
    job_id = f"repeat:{scheduler_id}:{next_millis}" if next_millis is not None else None
    stamp = _now_ms()
    wire["repeat"] = _repeat_for_job(repeat, new_offset, iteration)
    wire["jobId"] = job_id  # set by the script from the time it computes (every)
    wire["timestamp"] = stamp
    wire["repeatJobKey"] = scheduler_id
    if next_millis is not None:
        wire["delay"] = max(next_millis + (new_offset or 0) - stamp, 0)
        wire["prevMillis"] = next_millis
    else:
        wire["delay"] = 0  # the script sets it
        wire.pop("prevMillis", None)
    if trace_metadata is not None and not wire.get("tm") and not wire.get("omc"):
        wire["tm"] = trace_metadata
    wire = {k: v for k, v in wire.items() if v is not None}
    backend = queue.backend
    if override:
        if next_millis is not None and next_millis < now:
            next_millis = now
        scheduler_opts = {
            "name": name, "startDate": repeat.get("startDate"), "endDate": end_date, "tz": repeat.get("tz"),
            "pattern": pattern, "every": every, "limit": limit, "offset": new_offset,
        }
        job_id, delay = await backend.add_job_scheduler(
            scheduler_id, next_millis, {key: v for key, v in scheduler_opts.items() if v is not None},
            data_json, to_wire(opts), wire, _now_ms(), producer_id)
        wire["delay"] = delay
        wire["jobId"] = job_id
        job = Job(queue, name, data, from_wire(wire), job_id)
        job.delay = delay
    else:
        assert producer_id is not None
        next_id = await backend.update_job_scheduler(scheduler_id, next_millis, data_json, wire, _now_ms(),
                                                     producer_id)
        if next_id is None:
            return None
        job_id = next_id
        job = Job(queue, name, data, from_wire(wire), job_id)
    job.timestamp = stamp
    job.repeat_job_key = scheduler_id
    return job


async def advance_job_scheduler(queue: "QueueBase", job: Job) -> Optional[Job]:
    """What Node's Worker does on taking a job with a repeatJobKey: make the scheduler's next job
    (producerId = this job's id, so it is made once, whichever worker of whichever language
    takes the job). Raises BullMQCompatError for a legacy (BullMQ 5) repeatable job."""
    key = job.repeat_job_key
    if not key:
        return None
    if is_legacy_repeat_key(key) and not await queue.backend.is_job_scheduler(key):
        raise _legacy_error(key)
    wire = _wire_from_python(job.opts)
    # Node's Job constructor: attempts default 0, a number backoff becomes a fixed one
    wire.setdefault("attempts", 0)
    backoff = wire.get("backoff")
    if isinstance(backoff, (int, float)) and not isinstance(backoff, bool) and math.isfinite(backoff):
        wire["backoff"] = {"type": "fixed", "delay": backoff}
    wire.pop("repeatJobKey", None)
    repeat = wire.get("repeat")
    if not isinstance(repeat, Mapping) or not (repeat.get("every") or repeat.get("pattern")):
        raise BullMQCompatError(f"job {job.id} of scheduler {key!r} has no repeat options (every or pattern)")
    repeat = {k: v for k, v in repeat.items() if v is not None}
    if repeat.get("every") and repeat.get("pattern"):
        raise BullMQCompatError("Both .pattern and .every options are defined for this repeatable job")
    return await _upsert(queue, key, repeat, job.name, job.data, codec.dumps(job.data), {}, override=False,
                         producer_id=str(job.id), wire_base=wire)


async def advance_for_worker(worker: Any, job: Job) -> None:
    """The Worker's hook for a taken job with a repeatJobKey: make the scheduler's next job, riding
    out connection trouble as Node's retryIfFailed does; any other failure is emitted as an
    'error' (the job itself is still processed)."""
    while True:
        try:
            await advance_job_scheduler(worker, job)
            return
        except worker.backend.transient_errors as err:
            if worker.closing:
                worker.emit("error", BullMQCompatError(
                    f"Failed to add repeatable job for next iteration: {err}"))
                return
            await worker._sleep(worker._connection_trouble(err))
        except Exception as err:
            worker.emit("error", BullMQCompatError(f"Failed to add repeatable job for next iteration: {err}"))
            return

