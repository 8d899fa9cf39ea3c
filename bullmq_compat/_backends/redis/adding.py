"""Turning one `add` into one upstream script call, choosing the script the way Node does."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from bullmq_compat._backends.redis.keys import QueueKeys
from bullmq_compat._backends.redis.lua import Script, upstream_scripts
from bullmq_compat._errors import InvalidArgument, InvalidJobOptions
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import from_wire, to_wire


@dataclass
class PreparedAdd:
    """Everything needed to send one add, and to build the Job it returns."""

    name: str
    data: Any
    data_json: str
    opts: dict[str, Any]          # Node-form options
    wire_opts: dict[str, Any]     # what is packed and stored
    timestamp: int
    job_id: Optional[str]
    script: Script
    keys: list[str]
    args: list[Any]
    # a flow node's parent (its key and upstream's parent link), for the release after the adds
    parent_key: Optional[str] = None
    parent_link: Optional[dict[str, Any]] = None


def check_job_name(name: Any) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"job name {name!r} must be a str")
    if not name.isascii() and not codec.is_utf8(name):
        raise InvalidArgument(f"job name {name!r} is not valid UTF-8 text (a lone surrogate)")
    return name


def _add_keys(keys: QueueKeys) -> tuple[tuple[str, ...], ...]:
    """The KEYS of addParentJob, addDelayedJob, addPrioritizedJob and addStandardJob for a queue
    (made once per queue and kept on its keys, not per add)."""
    made: Optional[tuple[tuple[str, ...], ...]] = keys.__dict__.get("_add_keys")
    if made is None:
        made = _make_add_keys(keys)
        object.__setattr__(keys, "_add_keys", made)  # QueueKeys is frozen: a cache, not a field
    return made


def _make_add_keys(keys: QueueKeys) -> tuple[tuple[str, ...], ...]:
    return (
        (keys.meta, keys.id, keys.delayed, keys.waiting_children, keys.completed, keys.events),
        (keys.marker, keys.meta, keys.id, keys.delayed, keys.completed, keys.events),
        (keys.marker, keys.meta, keys.id, keys.prioritized, keys.delayed, keys.completed, keys.active, keys.events,
         keys.pc),
        (keys.wait, keys.paused, keys.meta, keys.id, keys.completed, keys.delayed, keys.active, keys.events,
         keys.marker),
    )


def checked_data(name: Any, data: Any, opts: Mapping[str, Any]) -> str:
    """What can refuse a job whose options are normalised: its name, its data (JSON text, returned)
    and the data's size. What `prepare_add` does after this cannot fail (every option value was
    checked packable as it was normalised), so an add_bulk checks every job with this first and
    then prepares and sends them one after another (`RedisBackend.submit_new`)."""
    check_job_name(name)
    data_json = codec.dumps({} if data is None else data)
    size_limit = opts.get("sizeLimit")
    if size_limit and len(data_json.encode("utf-8")) > size_limit:
        raise InvalidJobOptions(
            f"the data of job {name!r} is {len(data_json.encode('utf-8'))} bytes, over size_limit={size_limit}")
    return data_json


def add_head(keys: QueueKeys, name: str, timestamp: int, job_id: Optional[str] = None,
             parent_key: Optional[str] = None, parent_dependencies_key: Optional[str] = None,
             parent: Optional[dict[str, Any]] = None, repeat_job_key: Optional[str] = None,
             dedup_key: Optional[str] = None, defer_parent_release: bool = False) -> list[Any]:
    """The add scripts' first argument, before it is packed (upstream's ARGV[1] list)."""
    return [keys.prefix_key, job_id if job_id is not None else "", name, timestamp, parent_key,
            parent_dependencies_key, parent, repeat_job_key, dedup_key, 1 if defer_parent_release else None]


# options that make each add's arguments its own: a queue whose defaults hold one has no PlainAdd
_PER_ADD = ("jobId", "timestamp", "group", "parent", "deduplication", "debounce", "repeatJobKey", "repeat",
            "orderMs", "order_ms", "telemetry")


class PlainAdd:
    """An add that gives no options of its own (``queue.add(name, data)``), its queue's defaults
    merged: everything of its script call but the name, the data and the timestamp, made once by
    `prepare_add` itself, so that such an add sends exactly what `prepare_add` would make of it."""

    __slots__ = ("keys", "merged", "script", "script_keys", "packed_opts", "job_opts")

    def __init__(self, keys: QueueKeys, merged: Mapping[str, Any]) -> None:
        made = prepare_add(keys, "", {}, merged, timestamp=0)
        self.keys = keys
        #: the merged options (Node form) it was made from: what `checked_data` reads (size_limit)
        self.merged = made.opts
        self.script = made.script
        self.script_keys = made.keys
        self.packed_opts = made.args[2]
        #: the options each added Job shows (Python names), copied into each
        self.job_opts = from_wire(made.wire_opts)

    @staticmethod
    def of(keys: QueueKeys, merged: Mapping[str, Any]) -> Optional["PlainAdd"]:
        """The PlainAdd of a queue's merged defaults; None where they hold an option that makes
        each add's arguments its own (a job id, a group, a parent, ...)."""
        if any(name in merged for name in _PER_ADD):
            return None
        return PlainAdd(keys, merged)

    def call(self, name: str, data: Any) -> tuple[int, str, tuple[Script, list[str], list[Any]]]:
        """One add's timestamp, data JSON and script call; refuses what `prepare_add` refuses."""
        data_json = checked_data(name, data, self.merged)
        timestamp = int(time.time() * 1000)
        return timestamp, data_json, (self.script, self.script_keys, [
            codec.pack(add_head(self.keys, name, timestamp)), data_json, self.packed_opts])


def prepare_add(keys: QueueKeys, name: str, data: Any, opts: Mapping[str, Any], *,
                parent_key: Optional[str] = None, parent_dependencies_key: Optional[str] = None,
                parent: Optional[Mapping[str, Any]] = None, add_to_waiting_children: bool = False,
                defer_parent_release: bool = False, job_id: Optional[str] = None,
                data_json: Optional[str] = None, timestamp: Optional[int] = None) -> PreparedAdd:
    """Validate and encode one job; ``opts`` is already normalised and merged (Node form).

    ``job_id`` is an id chosen by the caller without storing it in the options (as Node's
    FlowProducer does with the ids it generates); by default the id is ``opts["jobId"]``.
    ``data_json``: what `checked_data` gave for this job (then it is not checked again).
    """
    if data_json is None:
        data_json = checked_data(name, data, opts)
    if timestamp is None:
        timestamp = int(opts.get("timestamp") or time.time() * 1000)
    job_id = opts.get("jobId") if job_id is None else job_id
    opts = dict(opts)  # its own copy: the PreparedAdd keeps it
    order_ms = opts.pop("order_ms", None) if "order_ms" in opts else None
    if "orderMs" in opts:
        order_ms = opts.pop("orderMs")
    group = opts.get("group")  # checked with its options by the caller (check_group_combination)
    wire_opts = to_wire(opts)
    dedup = opts.get("deduplication")
    args = add_head(keys, name, timestamp, job_id, parent_key, parent_dependencies_key,
                    dict(parent) if parent else None, opts.get("repeatJobKey"),
                    f"{keys.de}:{dedup['id']}" if dedup else None, defer_parent_release)
    scripts = upstream_scripts()
    delay = opts.get("delay")
    extra_args: list[Any] = []
    if group is not None:
        from bullmq_compat._backends.redis.groups import add_script, gate_keys

        script = add_script()
        script_keys = [*gate_keys(keys), keys.id]
        extra_args = [group["id"], order_ms if order_ms is not None else timestamp, int(time.time() * 1000),
                      1 if order_ms is not None else 0]
    elif add_to_waiting_children:
        script = scripts["addParentJob"]
        script_keys = list(_add_keys(keys)[0])
    elif isinstance(delay, (int, float)) and delay > 0:
        script = scripts["addDelayedJob"]
        script_keys = list(_add_keys(keys)[1])
    elif opts.get("priority"):
        script = scripts["addPrioritizedJob"]
        script_keys = list(_add_keys(keys)[2])
    else:
        script = scripts["addStandardJob"]
        script_keys = list(_add_keys(keys)[3])
    return PreparedAdd(
        name=name, data=data if data is not None else {}, data_json=data_json, opts=opts,
        wire_opts=wire_opts, timestamp=timestamp, job_id=job_id, script=script, keys=script_keys,
        args=[codec.pack(args), data_json, codec.pack(wire_opts), *extra_args],
    )
