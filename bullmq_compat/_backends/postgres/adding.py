"""Jobs as upstream's add functions take them: Node's ``toBatchEntry``, parents before children.

``add_job`` takes an entry's fields as parameters; ``add_jobs_bulk`` and ``add_flow`` take a JSON
array of entries in which ``data`` is a JSON *string* (read back with ``(j->>'data')::jsonb``), so
scalar data such as ``"plain"`` or ``7`` survives; ``opts`` is the options object (Node's long
names, without ``repeatJobKey``, which travels as ``schedulerId``).
"""
from __future__ import annotations

from collections.abc import Mapping as _Mapping
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from bullmq_compat._backends.base import NewJob
from bullmq_compat._backends.postgres import rows
from bullmq_compat._errors import InvalidArgument, script_error

#: options that are not stored as they are: the scheduler id travels as schedulerId, an order_ms
#: inside the group option
_NOT_STORED = frozenset({"repeatJobKey", "order_ms", "orderMs"})


@dataclass
class PreparedJob(NewJob):
    """A job `PostgresBackend.prepare` has checked for queue ``for_queue``, with what sending it needs:
    its options as JSON text and its entry -- or, for a plain job (no options but ``attempts``), its
    data as JSON text, the entry being built as it is sent (strings are not tracked by the cyclic
    collector, which otherwise walks a dict per job of a whole batch, again and again)."""

    entry: Optional[dict[str, Any]] = None
    opts_json: str = ""
    data_json: str = ""
    for_queue: str = ""


def _plain(job: NewJob) -> bool:
    """A job without options but Node's default ``attempts`` (an int), nor a custom id."""
    opts = job.opts
    return not job.job_id and len(opts) == 1 and type(opts.get("attempts")) is int


def _plain_entry(queue: str, name: str, data_json: str, opts: dict[str, Any], timestamp: int) -> dict[str, Any]:
    """The entry of a plain job (its opts are the job's own dict, {"attempts": n}: nothing changes
    it afterwards): what `entry_of` builds for it, built directly."""
    return {"queue": queue, "id": "", "name": name, "data": data_json, "opts": opts, "priority": 0, "delay": 0,
            "timestamp": timestamp, "attempts": opts["attempts"], "parentQueue": None, "parentId": None,
            "parentKey": None, "dedupId": None, "schedulerId": None, "lifo": False, "addToWaitingChildren": False}


def prepared(job: NewJob, queue: str) -> PreparedJob:
    """``job`` checked for ``queue`` (as `entry_of` checks it), with what sending it needs."""
    if _plain(job):
        name = rows.text_param(job.name, what="job name")
        return PreparedJob(name, job.data, job.opts, job.timestamp, job.job_id, job.queue_name,
                           opts_json=f'{{"attempts":{job.opts["attempts"]}}}', data_json=rows.json_param(job.data),
                           for_queue=queue)
    entry, opts_json = entry_of(job, queue)
    return PreparedJob(job.name, job.data, job.opts, job.timestamp, job.job_id, job.queue_name, entry=entry,
                       opts_json=opts_json, for_queue=queue)


def entry_and_opts(job: NewJob, queue: str) -> tuple[dict[str, Any], str]:
    """(the entry, its options as JSON text) of ``job`` for ``queue``: from what `prepared` kept, else built."""
    if type(job) is PreparedJob and job.for_queue == queue:
        if job.entry is None:
            return _plain_entry(queue, job.name, job.data_json, job.opts, int(job.timestamp)), job.opts_json
        return job.entry, job.opts_json
    return entry_of(job, queue)


def batch_entry(job: NewJob, queue: str, link: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """One job as Node's ``toBatchEntry`` builds it; `InvalidArgument` for what PostgreSQL cannot store.

    ``link`` is Node's parentKeyOpts (``parentKey``, ``addToWaitingChildren``) for a flow node.
    """
    return entry_of(job, queue, link)[0]


def entry_of(job: NewJob, queue: str, link: Optional[Mapping[str, Any]] = None) -> tuple[dict[str, Any], str]:
    """`batch_entry` and the entry's options as JSON text (what ``add_job`` takes as ``$5``)."""
    name = rows.text_param(job.name, what="job name")
    if link is None and _plain(job):
        opts = job.opts
        return _plain_entry(queue, name, rows.json_param(job.data), opts, int(job.timestamp)), \
            f'{{"attempts":{opts["attempts"]}}}'
    opts = {key: value for key, value in job.opts.items() if key not in _NOT_STORED}
    if opts.get("group") is not None:
        # BullMQ Pro's {"id": ...}; a producer's order_ms travels beside it, where our gate reads it
        order_ms = job.opts.get("order_ms", job.opts.get("orderMs"))
        if order_ms is not None:
            opts["group"] = {**opts["group"], "orderMs": int(order_ms)}
    # opts are stored as JSON: refuse here what jsonb cannot hold (the whole call, not a half)
    opts_json = rows.json_param(opts, what="options")
    parent = job.opts.get("parent")
    parent_queue = parent_id = None
    if parent is not None and isinstance(parent, _Mapping):
        parent_queue = rows.text_param(parent.get("queue"), what="parent queue")
        parent_id = rows.text_param(parent.get("id"), what="parent id")
    link = link or {}
    parent_key = link.get("parentKey") or (f"{parent_queue}:{parent_id}" if parent_id is not None else None)
    dedup = job.opts.get("deduplication")
    return {
        "queue": queue,
        # a custom id: the node's own (flows), else opts.jobId, as Node's Queue.add takes it
        "id": rows.text_param(job_id, what="job_id") if (job_id := job.job_id or job.opts.get("jobId")) else "",
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
        "dedupId": dedup.get("id") if dedup is not None and isinstance(dedup, _Mapping) else None,
        "schedulerId": job.opts.get("repeatJobKey"),
        "lifo": bool(opts.get("lifo", False)),
        "addToWaitingChildren": bool(link.get("addToWaitingChildren", False)),
    }, opts_json


def add_job_params(entry: Mapping[str, Any], opts_json: Optional[str] = None) -> list[Any]:
    """The 15 parameters of ``add_job`` for one entry (``opts_json``: its options as JSON text, when known)."""
    return [entry["queue"], entry["id"], entry["name"], entry["data"],
            opts_json if opts_json is not None else rows.json_param(entry["opts"], what="options"),
            entry["priority"], entry["delay"], entry["timestamp"], entry["attempts"], entry["parentQueue"],
            entry["parentId"], entry["parentKey"], entry["dedupId"], entry["schedulerId"], entry["lifo"]]


def id_or_error(job_id: str, entry: Mapping[str, Any], op: str) -> Any:
    """add_flow answers a refused entry with a negative code as its id (-5 missing parent, -7 ...)."""
    try:
        code = int(job_id)
    except ValueError:
        return job_id
    if code < 0:
        return script_error(code, job_id=entry["id"] or None, command=op, parent_key=entry["parentKey"])
    return job_id


def parents_first(entries: Sequence[Mapping[str, Any]]) -> list[int]:
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
