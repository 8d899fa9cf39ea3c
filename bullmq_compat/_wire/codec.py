"""Encoding as Node BullMQ encodes: JSON text for data and results, msgpack for script args."""
from __future__ import annotations

import json
import json.encoder as _json_encoder_c
from typing import Any, Mapping

import msgpack

from bullmq_compat._errors import InvalidJobData

_json_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# the C encoder JSONEncoder.encode builds on every call, built once: no cycle check (markers None),
# so whatever it refuses (a cycle among them) is encoded again by _json_encoder for its own error
_c_make_encoder: Any = getattr(_json_encoder_c, "c_make_encoder", None)
_c_encode: Any = None
if _c_make_encoder is not None:  # CPython
    _c_encode = _c_make_encoder(
        None, _json_encoder.default, _json_encoder_c.encode_basestring, None, ":", ",", False, False, False)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON (JavaScript's JSON.parse refuses it)")


# as JSON.parse: NaN, Infinity and -Infinity are not JSON (Python's json would take them)
_json_decoder = json.JSONDecoder(parse_constant=_not_json)


def dumps(value: Any, *, what: str = "data") -> str:
    """JSON text as JavaScript's JSON.stringify writes it (compact, UTF-8, no NaN)."""
    if value is None:  # a processor's usual result
        return "null"
    try:
        try:
            text = "".join(_c_encode(value, 0))
        except Exception:  # TypeError/ValueError/RecursionError, or no C encoder: the full encoder says why
            text = _json_encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidJobData(
            f"job {what} {_short(value)} is not JSON-serialisable ({err}); "
            "pass dicts, lists, str, int, float, bool or None") from None
    if not is_utf8(text):
        raise InvalidJobData(f"job {what} {_short(value)} holds a str that is not valid UTF-8 text "
                             "(a lone surrogate such as '\\ud800'): Redis stores UTF-8")
    return text


def is_utf8(text: str) -> bool:
    """False for a str Redis cannot be sent (lone surrogates, e.g. from undecodable file names)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_scan_once: Any = getattr(_json_decoder, "scan_once")


def loads(text: str) -> Any:
    """JSON.parse: the text must be one JSON value (surrounding whitespace allowed)."""
    try:  # the usual text, with no whitespace around it: straight to the C scanner
        value, end = _scan_once(text, 0)
        if end == len(text):
            return value
    except StopIteration:
        pass
    return _json_decoder.decode(text)  # whitespace, trailing text, or not JSON: the full decoder's answer


# one Packer for the process (msgpack.packb makes one per call, half of its cost); its pack runs
# whole under the GIL, so threads sharing it cannot interleave
_packer = msgpack.Packer(use_bin_type=True)


def pack(value: Any) -> bytes:
    """msgpack as upstream's msgpackr packs script arguments (str as str, None as nil)."""
    packed: bytes = _packer.pack(value)
    return packed


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def to_str(value: Any) -> Any:
    """Decode bytes replies (from a client without decode_responses) recursively."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [to_str(v) for v in value]
    return value


def flat_to_dict(flat: list[Any]) -> dict[str, str]:
    """A Redis flat [field, value, ...] array → dict of str."""
    items = to_str(flat)
    return dict(zip(items[0::2], items[1::2]))


def str_dict(mapping: Mapping[Any, Any]) -> dict[str, str]:
    """A hash reply (bytes or str keys and values) → dict of str."""
    return {to_str(k): to_str(v) for k, v in mapping.items()}


def dict_to_flat(mapping: Mapping[str, Any]) -> list[Any]:
    flat: list[Any] = []
    for key, value in mapping.items():
        flat.append(key)
        flat.append(value)
    return flat
