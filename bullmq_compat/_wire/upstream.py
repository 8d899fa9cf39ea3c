"""The pinned upstream BullMQ release whose Lua scripts and SQL we run, and where its fetched copy lives.

This module is the one place the pins are written down. The scripts themselves are never committed:
``scripts/fetch_upstream.py`` downloads the pinned npm tarball, checks its integrity and extracts
the Lua sources and the PostgreSQL commands and migrations into :data:`UPSTREAM_DIR`.
"""
from __future__ import annotations

from pathlib import Path

from bullmq_compat._errors import UpstreamScriptsMissing

UPSTREAM_PACKAGE = "bullmq"
UPSTREAM_VERSION = "6.7.0"
UPSTREAM_INTEGRITY = (
    "sha512-+LnKsqZ+PRV/Iul7T84qEZYOewsgtnnmTc3/TjXZk6dSaOeK68AuR/p8uzQ6WIQ8Jvf/GjitjsUrmTaRV2cfsQ=="
)

# sha256 of each PostgreSQL migration's UTF-8 text. The schema ledger keeps no checksums: whoever
# migrates version N first defines it for every client, so ours must be Node's, byte for byte.
POSTGRES_MIGRATION_SHA256: dict[str, str] = {
    "0001_schema.sql": "d0618c5c1af7c83af02c146616d9c7c9073a8c6b8302ff8a27278ad3248ed631",
    "0002_functions.sql": "85730dfcd752db5162410f577f846ce6be4b819582becf9baef20d05088477b9",
    "0003_dedup_stale_key.sql": "658605009ac8014066b6322379d787144aa511aa2e48877bde8181d52f486030",
    "0004_relay.sql": "9f03b19a1c673c6019a3bed9ff99ed70cf69eb506c414412a5ab88cfb409711c",
    "0005_flow_parent_release.sql": "674ce794e9e94eda68f831120228fbb8bf493142e63a9f2d79004bdd2d69fcd9",
    "0006_dedup_reschedule.sql": "8590e5519af414ac8e3f51540e894728d817447337b55e108be736a27feab81d",
    "0007_obliterate_dedup_lock_order.sql": "ef768eeeb457542eb1d46494411a8b876043333630724ff70dfcad2082a0ea2f",
    "0008_bulk_dedup_lock_order.sql": "fb83617c27c52148a2c1c10cae805019ba1814960f14f85db50746c7add0be3e",
    "0009_obliterate_bounded_dedup_locks.sql": "55e1de9eeb21c9ce0ace2cf9f61e0d3413822282c9e835739d1fa3aa2eb9e121",
    "0010_obliterate_finalization_lock.sql": "721d6e91f919b102ae7d46af5dc6c81250147345cb73988f5b897ad8e77974f2",
    "0011_obliterate_producer_lock.sql": "12a1956c4d1de8ae0a2d19d3b21b4e1e1e2d38e646d2575a498f55db139a53b2",
}
#: how many runtime commands ``SQL_COMMANDS`` holds in the pinned release
POSTGRES_COMMAND_COUNT = 101

UPSTREAM_DIR = Path(__file__).resolve().parent.parent / "_upstream"
"""Fetched copy of the pinned release (git-ignored). Holds ``commands/``, ``ready/``, ``postgres/``
(``commands/*.sql``, ``migrations/*.sql``) and ``VERSION``."""

FETCH_HINT = ("install a built package (pip install bullmq-compat: the wheel carries them), or run 'make setup' in a "
              "clone, or 'bullmq-compat fetch-upstream' (needs npm; --tarball FILE offline)")


def stamp_path(directory: Path | None = None) -> Path:
    """The file recording which upstream version the fetched copy came from."""
    return (UPSTREAM_DIR if directory is None else directory) / "VERSION"


def fetched_version(directory: Path | None = None) -> str | None:
    """The version of the fetched copy, or ``None`` when nothing (readable) has been fetched."""
    try:
        return stamp_path(directory).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def is_current(directory: Path | None = None) -> bool:
    """Whether the fetched copy (in ``directory``, default :data:`UPSTREAM_DIR`) exists, matches the pin
    and holds every part (a copy fetched before the SQL or the licence was extracted counts as stale)."""
    where = UPSTREAM_DIR if directory is None else directory
    return (fetched_version(where) == UPSTREAM_VERSION and (where / "postgres" / "migrations").is_dir()
            and (where / "LICENSE").is_file())


def _checked(sub: str, what: str = "Lua scripts") -> Path:
    # A copy fetched for another version would silently change the wire protocol, so a stale
    # copy is treated exactly like a missing one.
    found = fetched_version()
    path = UPSTREAM_DIR / sub
    if found != UPSTREAM_VERSION or not path.is_dir():
        state = "not fetched" if found is None else f"fetched for {found}, but the pin is {UPSTREAM_VERSION}"
        raise UpstreamScriptsMissing(
            f"upstream {UPSTREAM_PACKAGE} {UPSTREAM_VERSION} {what} are {state} "
            f"(looked in {path}): {FETCH_HINT}"
        )
    return path


def commands_dir() -> Path:
    """Directory of upstream's raw ``<name>-<numkeys>.lua`` scripts (with ``includes/`` inside)."""
    return _checked("commands")


def ready_dir() -> Path:
    """Directory of upstream's ready-built ``<name>-<numkeys>.js`` modules, as Node sends them."""
    return _checked("ready")


def postgres_commands_dir() -> Path:
    """Directory of upstream's PostgreSQL runtime commands, ``<name>.sql`` (``$1..$N`` placeholders)."""
    return _checked("postgres/commands", "PostgreSQL commands")


def postgres_migrations_dir() -> Path:
    """Directory of upstream's PostgreSQL schema migrations, ``0001_schema.sql`` ... in order."""
    return _checked("postgres/migrations", "PostgreSQL migrations")
