"""Jobs as upstream's add functions take them: Node's ``toBatchEntry``, parents before children.

``add_job`` takes an entry's fields as parameters; ``add_jobs_bulk`` and ``add_flow`` take a JSON
array of entries in which ``data`` is a JSON *string* (read back with ``(j->>'data')::jsonb``), so
scalar data such as ``"plain"`` or ``7`` survives; ``opts`` is the options object (Node's long
names, without ``repeatJobKey``, which travels as ``schedulerId``).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from bullmq_compat._backends.base import NewJob
from bullmq_compat._backends.postgres import rows
from bullmq_compat._errors import InvalidArgument, script_error

#: options that are not stored as they are: the scheduler id travels as schedulerId, an order_ms
#: inside the group option
_NOT_STORED = frozenset({"repeatJobKey", "order_ms", "orderMs"})


def batch_entry(job: NewJob, queue: str, link: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """One job as Node's ``toBatchEntry`` builds it; `InvalidArgument` for what PostgreSQL cannot store.

    ``link`` is Node's parentKeyOpts (``parentKey``, ``addToWaitingChildren``) for a flow node.
    """
    name = rows.text_param(job.name, what="job name")
    opts = {key: value for key, value in job.opts.items() if key not in _NOT_STORED}
    if opts.get("group") is not None:
        # BullMQ Pro's {"id": ...}; a producer's order_ms travels beside it, where our gate reads it
        order_ms = job.opts.get("order_ms", job.opts.get("orderMs"))
        if order_ms is not None:
            opts["group"] = {**opts["group"], "orderMs": int(order_ms)}
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
        "dedupId": dedup.get("id") if isinstance(dedup, Mapping) else None,
        "schedulerId": job.opts.get("repeatJobKey"),
        "lifo": bool(opts.get("lifo", False)),
        "addToWaitingChildren": bool(link.get("addToWaitingChildren", False)),
    }


def add_job_params(entry: Mapping[str, Any]) -> list[Any]:
    """The 15 parameters of ``add_job`` for one entry."""
    return [entry["queue"], entry["id"], entry["name"], entry["data"], rows.json_param(entry["opts"], what="options"),
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
