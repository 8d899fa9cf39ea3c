"""The pinned upstream BullMQ release whose Lua scripts we run, and where its fetched copy lives.

This module is the one place the pin is written down. The scripts themselves are never committed:
``scripts/fetch_upstream.py`` downloads the pinned npm tarball, checks its integrity and extracts
the Lua sources into :data:`UPSTREAM_DIR`.
"""
from __future__ import annotations

from pathlib import Path

from bullmq_compat._errors import UpstreamScriptsMissing

UPSTREAM_PACKAGE = "bullmq"
UPSTREAM_VERSION = "6.7.0"
UPSTREAM_INTEGRITY = (
    "sha512-+LnKsqZ+PRV/Iul7T84qEZYOewsgtnnmTc3/TjXZk6dSaOeK68AuR/p8uzQ6WIQ8Jvf/GjitjsUrmTaRV2cfsQ=="
)

UPSTREAM_DIR = Path(__file__).resolve().parent.parent / "_upstream"
"""Fetched copy of the pinned release (git-ignored). Holds ``commands/``, ``ready/`` and ``VERSION``."""

FETCH_HINT = "run 'make setup' in a clone, or 'bullmq-compat fetch-upstream' (needs npm)"


def stamp_path() -> Path:
    """The file recording which upstream version the fetched copy came from."""
    return UPSTREAM_DIR / "VERSION"


def fetched_version() -> str | None:
    """The version of the fetched copy, or ``None`` when nothing (readable) has been fetched."""
    try:
        return stamp_path().read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def is_current() -> bool:
    """Whether the fetched copy exists and matches the pin."""
    return fetched_version() == UPSTREAM_VERSION


def _checked(sub: str) -> Path:
    # A copy fetched for another version would silently change the wire protocol, so a stale
    # copy is treated exactly like a missing one.
    found = fetched_version()
    path = UPSTREAM_DIR / sub
    if found != UPSTREAM_VERSION or not path.is_dir():
        state = "not fetched" if found is None else f"fetched for {found}, but the pin is {UPSTREAM_VERSION}"
        raise UpstreamScriptsMissing(
            f"upstream {UPSTREAM_PACKAGE} {UPSTREAM_VERSION} Lua scripts are {state} "
            f"(looked in {path}): {FETCH_HINT}"
        )
    return path


def commands_dir() -> Path:
    """Directory of upstream's raw ``<name>-<numkeys>.lua`` scripts (with ``includes/`` inside)."""
    return _checked("commands")


def ready_dir() -> Path:
    """Directory of upstream's ready-built ``<name>-<numkeys>.js`` modules, as Node sends them."""
    return _checked("ready")
