"""Fetch the pinned upstream BullMQ Lua scripts and PostgreSQL SQL into ``bullmq_compat/_upstream/``.

Usage: ``bullmq-compat fetch-upstream`` (needs npm), ``bullmq-compat fetch-upstream --tarball
bullmq-6.7.0.tgz`` (offline: a tarball downloaded elsewhere, same checks), or from a clone
``python scripts/fetch_upstream.py`` (what ``make setup`` runs). Building the sdist or the wheel
runs it too (setup.py), so a built package carries the files and needs neither Node nor npm.

Downloads the pinned npm tarball with ``npm pack`` (or takes the one given), refuses it unless its
sha512 matches the pin in ``bullmq_compat/_wire/upstream.py``, and extracts only the files we use:

* ``dist/cjs/commands/*.lua``          -> ``_upstream/commands/``
* ``dist/cjs/commands/includes/*.lua`` -> ``_upstream/commands/includes/``
* ``dist/cjs/scripts/<name>-<n>.js``   -> ``_upstream/ready/``
* ``dist/cjs/postgres/sql-scripts.js``: its two object literals ``SQL_COMMANDS`` and
  ``SQL_MIGRATIONS`` (JSON string keys and values, read with `json`, Node is not run)
  -> ``_upstream/postgres/commands/<name>.sql`` and ``_upstream/postgres/migrations/<name>.sql``,
  byte for byte; each migration must match its sha256 pin in ``upstream.py``

* ``LICENSE``                           -> ``_upstream/LICENSE`` (upstream's MIT licence, shipped beside its files)

then writes ``_upstream/VERSION``. Does nothing when that stamp already matches the pin.

This module imports only the standard library, `upstream` and `_errors`, so setup.py can run it
before the package's dependencies are installed.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from bullmq_compat._errors import BullMQCompatError
from bullmq_compat._wire import upstream

# Member (inside the tarball) -> destination (inside UPSTREAM_DIR). Only flat file names are
# accepted, so nothing in the tarball can steer a write outside the destination.
_FLAT_NAME = re.compile(r"[A-Za-z0-9_.-]+\Z")
_WANTED: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("package/dist/cjs/commands", "commands", re.compile(r"[A-Za-z0-9_]+-\d+\.lua\Z")),
    ("package/dist/cjs/commands/includes", "commands/includes", re.compile(r"[A-Za-z0-9_]+\.lua\Z")),
    # The index.js there only re-exports the others (and needs tslib), so it is left out.
    ("package/dist/cjs/scripts", "ready", re.compile(r"[A-Za-z0-9_]+-\d+\.js\Z")),
)


_SQL_SCRIPTS_MEMBER = "package/dist/cjs/postgres/sql-scripts.js"
_LICENSE_MEMBER = "package/LICENSE"
_SQL_NAME = re.compile(r"[A-Za-z0-9_]+\.sql\Z")
# object literal -> destination (inside UPSTREAM_DIR)
_SQL_LITERALS = (("SQL_COMMANDS", "postgres/commands"), ("SQL_MIGRATIONS", "postgres/migrations"))


class FetchError(BullMQCompatError):
    """A fetch failure, reported as one line."""


_json_decoder = json.JSONDecoder()


def parse_sql_literal(source: str, name: str) -> dict[str, str]:
    """The ``{"<file>.sql": "<text>", ...}`` literal assigned to ``name`` in sql-scripts.js.

    Every key and value there is a JSON string literal, so each is decoded with `json`; anything
    else (a computed value, a template string) is refused rather than guessed at.
    """
    match = re.search(r"(?:exports\.|export\s+const\s+)" + re.escape(name) + r"\s*=\s*\{", source)
    if match is None:
        raise FetchError(f"sql-scripts.js has no object literal {name}")
    entries: dict[str, str] = {}
    pos = match.end()

    def skip(at: int) -> int:
        while at < len(source) and source[at].isspace():
            at += 1
        return at

    def string(at: int, what: str) -> tuple[str, int]:
        if source[at:at + 1] != '"':
            raise FetchError(f"sql-scripts.js: {name} has a {what} that is not a JSON string at offset {at}")
        try:
            value, end = _json_decoder.raw_decode(source, at)
        except ValueError as err:
            raise FetchError(f"sql-scripts.js: {name} has a bad {what} at offset {at} ({err})") from None
        return value, end

    while True:
        pos = skip(pos)
        if source[pos:pos + 1] == "}":
            return entries
        key, pos = string(pos, "key")
        pos = skip(pos)
        if source[pos:pos + 1] != ":":
            raise FetchError(f"sql-scripts.js: {name} key {key!r} is not followed by ':'")
        value, pos = string(skip(pos + 1), "value")
        if not _SQL_NAME.match(key) or key in entries:
            raise FetchError(f"sql-scripts.js: {name} key {key!r} is not a new flat '<name>.sql' file name")
        entries[key] = value
        pos = skip(pos)
        if source[pos:pos + 1] == ",":
            pos += 1


def _write_sql(source: str, target: Path) -> int:
    """Write the SQL of sql-scripts.js under ``target``; returns how many files were written."""
    count = 0
    for literal, dest_dir in _SQL_LITERALS:
        entries = parse_sql_literal(source, literal)
        if literal == "SQL_MIGRATIONS":
            _check_migration_pins(entries)
        out_dir = target / dest_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        for file_name, text in entries.items():
            (out_dir / file_name).write_bytes(text.encode("utf-8"))
            count += 1
    return count


def _check_migration_pins(entries: dict[str, str]) -> None:
    pins = upstream.POSTGRES_MIGRATION_SHA256
    if sorted(entries) != sorted(pins):
        raise FetchError(f"sql-scripts.js holds the migrations {sorted(entries)}, the pins name {sorted(pins)}")
    for file_name, text in entries.items():
        got = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if got != pins[file_name]:
            raise FetchError(f"refusing migration {file_name}: sha256 {got} does not match the pin {pins[file_name]}")


def _destination(member: tarfile.TarInfo) -> str | None:
    """Where a tarball member goes relative to UPSTREAM_DIR, or None if we do not want it."""
    if not member.isfile():
        return None
    path = PurePosixPath(member.name)
    if not _FLAT_NAME.match(path.name):
        return None
    for source_dir, dest_dir, pattern in _WANTED:
        if str(path.parent) == source_dir and pattern.match(path.name):
            return f"{dest_dir}/{path.name}"
    return None


def _integrity(tarball: Path) -> str:
    digest = hashlib.sha512(tarball.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


_NPM_NOISE = re.compile(r"(code|syscall|errno|at|A complete log|In most cases)\b")


def _npm_error(stderr: str, returncode: int) -> str:
    """The one informative line of npm's error output (e.g. "ETARGET: notarget No matching version ...")."""
    lines = [ln.removeprefix("npm error").removeprefix("npm ERR!").strip() for ln in stderr.splitlines()]
    code = next((ln.split()[1] for ln in lines if ln.startswith("code ") and len(ln.split()) > 1), None)
    message = next((ln for ln in lines if ln and not _NPM_NOISE.match(ln)), None)
    if message is None:
        return f"exit status {returncode}"
    return f"{code}: {message}" if code else message


def _npm_pack(spec: str, dest: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError("npm is not on PATH: install Node.js (which provides npm) and retry")
    proc = subprocess.run(
        [npm, "pack", spec, "--pack-destination", str(dest), "--loglevel=error", "--no-fund", "--no-audit"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise FetchError(f"npm pack {spec} failed: {_npm_error(proc.stderr, proc.returncode)}")
    tarballs = sorted(dest.glob("*.tgz"))
    if len(tarballs) != 1:
        raise FetchError(f"npm pack {spec} did not produce exactly one tarball in {dest}")
    return tarballs[0]


def _extract(tarball: Path, target: Path) -> int:
    """Copy the wanted members into ``target``; returns how many files were written."""
    count = 0
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name == _SQL_SCRIPTS_MEMBER:
                scripts = tar.extractfile(member)
                if scripts is not None:
                    count += _write_sql(scripts.read().decode("utf-8"), target)
                continue
            rel = "LICENSE" if member.isfile() and member.name == _LICENSE_MEMBER else _destination(member)
            if rel is None:
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            out = target / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(source.read())
            count += 1
    return count


def _check_tarball(path: Path) -> None:
    if not path.is_file():
        raise FetchError(f"--tarball {path}: no such file (download it with 'npm pack "
                         f"{upstream.UPSTREAM_PACKAGE}@{upstream.UPSTREAM_VERSION}' on a machine with npm)")
    if not tarfile.is_tarfile(path):
        raise FetchError(f"--tarball {path} is not a tar archive: expected the npm package "
                         f"{upstream.UPSTREAM_PACKAGE}-{upstream.UPSTREAM_VERSION}.tgz")


def fetch(tarball: Path | None = None, target: Path | None = None) -> str:
    """Fetch, verify and install the pinned scripts; returns a one-line summary.

    ``tarball``: a ``bullmq-<version>.tgz`` already on disk (no npm, no network); ``target``: where
    to put the files (default :data:`upstream.UPSTREAM_DIR`, the package's own ``_upstream``).
    """
    spec = f"{upstream.UPSTREAM_PACKAGE}@{upstream.UPSTREAM_VERSION}"
    final = upstream.UPSTREAM_DIR if target is None else target
    if upstream.is_current(final):
        return f"upstream {spec} already fetched in {final}"
    if tarball is not None:
        _check_tarball(tarball)

    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bullmq-upstream-") as tmp:
        if tarball is None:
            tarball = _npm_pack(spec, Path(tmp))
        got = _integrity(tarball)
        if got != upstream.UPSTREAM_INTEGRITY:
            raise FetchError(
                f"refusing {tarball.name}: integrity {got} does not match the pin {upstream.UPSTREAM_INTEGRITY} "
                f"(it is not the npm package {spec})"
            )
        # Build next to the final place, then swap, so an interrupted fetch never leaves a
        # half-filled directory that looks current.
        staging = Path(tempfile.mkdtemp(prefix="._upstream-", dir=final.parent))
        try:
            count = _extract(tarball, staging)
            if (not any((staging / "commands").glob("*.lua")) or not any((staging / "ready").glob("*.js"))
                    or not any((staging / "postgres" / "migrations").glob("*.sql"))
                    or not (staging / "LICENSE").is_file()):
                raise FetchError(f"{tarball.name} does not contain the expected dist/cjs scripts and LICENSE")
            (staging / "VERSION").write_text(upstream.UPSTREAM_VERSION + "\n", encoding="utf-8")
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return f"fetched upstream {spec} ({count} files, {got[:20]}...) into {final}"


def main(argv: list[str] | None = None) -> int:
    """``bullmq-compat fetch-upstream [--tarball FILE] [--into DIR]``; ``scripts/fetch_upstream.py``."""
    parser = argparse.ArgumentParser(prog="bullmq-compat fetch-upstream", description=(
        f"Fetch the pinned upstream {upstream.UPSTREAM_PACKAGE} {upstream.UPSTREAM_VERSION} Lua scripts, SQL and licence."))
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args.tarball, args.into)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fetch-upstream`` (shared by the CLI's subcommand and the script)."""
    parser.add_argument("--tarball", type=Path, metavar="FILE",
                        help=f"use this {upstream.UPSTREAM_PACKAGE}-{upstream.UPSTREAM_VERSION}.tgz instead of "
                             "'npm pack' (offline; its sha512 is checked the same way)")
    parser.add_argument("--into", type=Path, metavar="DIR",
                        help="write the files here instead of the package's own _upstream folder")


def run(tarball: Path | None, into: Path | None) -> int:
    """Fetch and print one line; a failure prints one line on stderr and returns 1."""
    try:
        print(fetch(tarball, into))
    except FetchError as exc:
        print(f"fetch-upstream: error: {exc}", file=sys.stderr)
        return 1
    return 0
