"""Connection strings and options with their secrets masked, for messages, logs and ``repr()``.

One neutral module for every backend: Redis URLs (``redis://``, ``rediss://``, ``unix://``),
PostgreSQL URLs and libpq key=value strings, and keyword arguments such as redis-py's.

>>> redact_url("redis://default:s3cretpw@127.0.0.1:6379/0")
'redis://default:***@127.0.0.1:6379/0'
>>> redact_url("postgresql://app:pw@db.internal/jobs?sslmode=verify-full")
'postgresql://app:***@db.internal/jobs?sslmode=verify-full'

Only the password is masked: the scheme, user, host, port and database stay, because they are
what a person needs to tell which connection failed.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

REDACTED = "***"

# option names whose value is a secret (URL query parameters, libpq keywords, redis-py kwargs)
SECRET_NAMES = frozenset({
    "password", "passwd", "pwd", "pass", "ssl_password", "sslpassword", "secret", "token",
    "access_token", "auth", "auth_token",
})

_SCHEME = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY_SECRET = re.compile(
    r"([?&;](?:%s)=)([^&#;]*)" % "|".join(sorted(map(re.escape, SECRET_NAMES), key=len, reverse=True)),
    re.IGNORECASE)
# libpq "host=db user=app password='s3 cret'" (quoted or not)
_KEYWORD_SECRET = re.compile(
    r"(\b(?:password|sslpassword)\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact_url(url: Any) -> str:
    """``url`` as text with any password replaced by ``***``.

    Handles ``scheme://user:password@host...`` (also a password holding ``/``, ``#`` or ``@``
    written without percent-encoding), ``password=`` in the query string, a string missing its
    scheme (``user:password@host:6379``) and libpq ``key=value`` strings. Anything that is not a
    string is shown as ``str(url)`` after the same treatment.
    """
    text = url if isinstance(url, str) else str(url)
    out, last = [], 0
    for begin, end in _secret_spans(text):
        out.append(text[last:begin])
        out.append(REDACTED)
        last = end
    out.append(text[last:])
    return "".join(out)


def _secret_spans(text: str) -> list[tuple[int, int]]:
    """Where the secrets of a connection string are, as sorted, non-overlapping (start, end)."""
    spans: list[tuple[int, int]] = []
    match = _SCHEME.match(text)
    start = match.end() if match else 0
    if match or "@" in text:
        # the authority ends at the first "/", "?" or "#" (as urlparse reads it) ...
        end = min([i for i in (text.find(sep, start) for sep in "/?#") if i != -1], default=len(text))
        at = text.rfind("@", start, end)
        if at == -1:
            # ... unless the password itself holds one: then the last "@" ends the user info
            at = text.rfind("@", start)
        colon = text.find(":", start, at) if at != -1 else -1
        if colon != -1:
            spans.append((colon + 1, at))
    for pattern in (_QUERY_SECRET, _KEYWORD_SECRET):
        for m in pattern.finditer(text):
            if not any(b <= m.start(2) < e for b, e in spans):
                spans.append((m.start(2), m.end(2)))
    return sorted(spans)


def redact_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of connection keyword arguments (redis-py's, Sentinel's ``sentinel_kwargs``, a
    driver's) with secret values masked, nested mappings and lists included, URLs redacted."""
    return {key: REDACTED if _is_secret_name(key) and value is not None else redact_value(value)
            for key, value in kwargs.items()}


def redact_value(value: Any) -> Any:
    """``value`` with secrets masked: mappings as `redact_kwargs`, strings as `redact_url`,
    lists and tuples (node lists such as ``[("10.0.0.1", 26379), ...]``) item by item."""
    if isinstance(value, Mapping):
        return redact_kwargs(value)
    if isinstance(value, str):
        return redact_url(value) if ("@" in value or "=" in value) else value
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def redact_nodes(nodes: Iterable[Any]) -> str:
    """A node list (Sentinels, Cluster startup nodes) as ``host:port,host:port``: each node a
    ``(host, port)`` pair, an object with ``host``/``port`` (or ``name``), or a URL."""
    shown = []
    for node in nodes:
        if isinstance(node, (tuple, list)) and len(node) >= 2:
            shown.append(f"{node[0]}:{node[1]}")
        elif isinstance(node, str):
            shown.append(redact_url(node))
        elif getattr(node, "host", None) is not None:
            shown.append(f"{node.host}:{getattr(node, 'port', '?')}")
        else:
            shown.append(redact_url(getattr(node, "name", None) or "?"))
    return ",".join(shown)


def secrets_of(connection: Any) -> list[str]:
    """The secret strings a connection setting carries (passwords in a URL or in kwargs), for
    `scrub` to remove from text written by others (a driver's error message)."""
    found: list[str] = []

    def visit(value: Any, name: str = "") -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, str(key))
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, name)
        elif isinstance(value, str):
            if _is_secret_name(name):
                found.append(value)
            else:
                found.extend(_url_secrets(value))

    visit(connection)
    return [s for s in dict.fromkeys(found) if s]


def _url_secrets(text: str) -> list[str]:
    from urllib.parse import unquote

    out = []
    for begin, end in _secret_spans(text):
        secret = text[begin:end]
        if len(secret) >= 2 and secret[0] == secret[-1] == "'":
            secret = secret[1:-1]
        out += [secret, unquote(secret)]  # percent-decoded too: what a driver sends and may echo
    return out


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` (an error message from a driver) with each of ``secrets`` replaced by ``***``
    and any URL in it redacted."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= 3:  # shorter ones would mangle the message, and guard nothing
            text = text.replace(secret, REDACTED)
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _is_secret_name(name: str) -> bool:
    return name.lower() in SECRET_NAMES
