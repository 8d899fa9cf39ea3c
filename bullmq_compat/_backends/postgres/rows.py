"""What goes into and comes out of upstream's tables, in the shapes the rest of the client uses.

In: JSON text for every ``jsonb`` parameter, refused (before anything is sent) when it holds
U+0000, which PostgreSQL's ``jsonb`` and ``text`` cannot store. Out: a ``job`` row as the
Redis-hash `JobFields` that ``Job.from_raw`` reads (Node's ``rowToJobJson``, with upstream's short
option keys), and a ``scheduler`` row as Node's ``mapSchedulerRow``.
"""
from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Mapping, Optional

from bullmq_compat._backends.base import JobFields
from bullmq_compat._errors import InvalidArgument, InvalidJobData, InvalidQueueName
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import to_wire

# A JSON \u0000 escape not itself escaped (preceded by an even number of backslashes).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Reading back: what the server stored is JSON already; never refuse it on the way out.
_out = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def has_nul(text: str) -> bool:
    """Whether JSON (or plain) text holds U+0000, literally or as a ``\\u0000`` escape."""
    return "\x00" in text or ("\\u0000" in text and _JSON_NUL.search(text) is not None)


def json_param(value: Any, *, what: str = "data") -> str:
    """``value`` as JSON text for a ``jsonb`` parameter (`InvalidJobData` when it cannot be stored)."""
    text = codec.dumps(value, what=what)
    if has_nul(text):
        raise InvalidJobData(f"job {what} {_short(value)} holds the character U+0000 ('\\u0000'), which "
                             "PostgreSQL's jsonb cannot store: remove it (or encode the value, e.g. base64)")
    return text


def json_text_param(text: Any, *, what: str) -> str:
    """JSON text given by the caller, checked the same way as `json_param`."""
    if not isinstance(text, str):
        raise InvalidJobData(f"job {what}={_short(text)} must be JSON text (a str)")
    try:
        codec.loads(text)
    except ValueError as err:
        raise InvalidJobData(f"job {what}={_short(text)} is not JSON ({err})") from None
    if has_nul(text) or not codec.is_utf8(text):
        raise InvalidJobData(f"job {what}={_short(text)} holds U+0000 or a lone surrogate, which PostgreSQL "
                             "cannot store")
    return text


def text_param(value: Any, *, what: str) -> str:
    """A ``text`` parameter: a str without U+0000 (ids and queue names are always bound as text)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what}={value!r} must be a str")
    if "\x00" in value or not codec.is_utf8(value):
        raise InvalidArgument(f"{what}={_short(value)} holds U+0000 or a lone surrogate, which PostgreSQL "
                              "text cannot store")
    return value


def now_ms() -> int:
    """The client's clock in ms: every ``now`` upstream's functions take is the caller's."""
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


def js_string(value: Any) -> str:
    """``String(value)`` as JavaScript writes it (meta values are stored as Node stringifies them)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if value.is_integer() and abs(value) < 1e21:
            return str(int(value))
        return repr(value)
    return str(value)


def dump_out(value: Any) -> str:
    """A value read from a ``jsonb`` column, back to compact JSON text."""
    return _out.encode(value)


def _number(value: Any) -> str:
    return str(int(value))


def job_fields(row: Mapping[str, Any]) -> JobFields:
    """A ``job`` row as upstream's Redis job hash (see `JobFields`); unset fields are absent."""
    fields: JobFields = {
        "name": row["name"] if row.get("name") is not None else "",
        "data": dump_out(row["data"] if row.get("data") is not None else {}),  # Node: row.data ?? {}
        "opts": dump_out(to_wire(row.get("opts") or {})),
        "timestamp": _number(row.get("added_at_ms") or 0),
        "atm": _number(row.get("attempts_made") or 0),
        "ats": _number(row.get("attempts_started") or 0),
        "stc": _number(row.get("stalled_count") or 0),
    }
    for column, key in (("delay_ms", "delay"), ("priority", "priority"), ("processed_at_ms", "processedOn"),
                        ("finished_at_ms", "finishedOn")):
        if row.get(column) is not None:
            fields[key] = _number(row[column])
    for column, key in (("progress", "progress"), ("return_value", "returnvalue"), ("stacktrace", "stacktrace")):
        if row.get(column) is not None:
            fields[key] = dump_out(row[column])
    for column, key in (("failed_reason", "failedReason"), ("parent_key", "parentKey"), ("scheduler_id", "rjk"),
                        ("dedup_id", "deid"), ("processed_by", "pb"), ("deferred_failure", "defa")):
        if row.get(column) is not None:
            fields[key] = str(row[column])
    if row.get("parent_id") is not None:
        fields["parent"] = dump_out({"id": row["parent_id"], "queueKey": row.get("parent_queue") or ""})
    return fields


def scheduler_fields(row: Mapping[str, Any]) -> dict[str, str]:
    """A ``scheduler`` row as upstream's Redis scheduler hash (Node's ``mapSchedulerRow``)."""
    fields: dict[str, str] = {}
    for column, key in (("name", "name"), ("iteration_count", "ic"), ("limit_count", "limit"),
                        ("start_date_ms", "startDate"), ("end_date_ms", "endDate"), ("tz", "tz"),
                        ("pattern", "pattern"), ("every_ms", "every"), ("offset_ms", "offset")):
        if row.get(column) is not None:
            fields[key] = js_string(row[column])
    for column, key in (("template_data", "data"), ("template_opts", "opts")):
        if row.get(column) is not None:
            text = dump_out(row[column])
            if text != "{}":
                fields[key] = text
    return fields


def optional_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
