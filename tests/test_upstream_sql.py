"""Upstream's PostgreSQL SQL: the fetched copy is byte-identical to what Node BullMQ loads, and pinned."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from bullmq_compat._backends.postgres import sql
from bullmq_compat._errors import UpstreamScriptsMissing
from bullmq_compat._wire import fetch, upstream
from tests.node import INTEROP

# What Node's require() of the pinned package holds, as JSON.
_NODE_SQL = r"""
const s = require('bullmq/dist/cjs/postgres/sql-scripts.js');
process.stdout.write(JSON.stringify({commands: s.SQL_COMMANDS, migrations: s.SQL_MIGRATIONS}));
"""


@pytest.fixture(scope="module")
def node_sql() -> dict[str, dict[str, str]]:
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / "bullmq").is_dir():
        raise RuntimeError("Node.js and interop/node_modules are needed: run `make setup`")
    proc = subprocess.run([node, "-e", _NODE_SQL], cwd=INTEROP, capture_output=True, check=True)
    result: dict[str, dict[str, str]] = json.loads(proc.stdout.decode("utf-8"))
    return result


def _ours(directory_name: str) -> dict[str, bytes]:
    directory = upstream.UPSTREAM_DIR / "postgres" / directory_name
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.sql"))}


@pytest.mark.node
def test_every_command_is_byte_identical_to_what_node_loads(node_sql: dict[str, dict[str, str]]) -> None:
    ours = _ours("commands")
    assert len(node_sql["commands"]) == 101 == len(ours)
    assert sorted(ours) == sorted(node_sql["commands"])
    assert [name for name, text in node_sql["commands"].items() if ours[name] != text.encode("utf-8")] == []


@pytest.mark.node
def test_every_migration_is_byte_identical_to_what_node_loads(node_sql: dict[str, dict[str, str]]) -> None:
    ours = _ours("migrations")
    assert len(node_sql["migrations"]) == 11 == len(ours)
    assert sorted(ours) == sorted(node_sql["migrations"])
    assert [name for name, text in node_sql["migrations"].items() if ours[name] != text.encode("utf-8")] == []


def test_each_migration_matches_its_sha256_pin() -> None:
    ours = _ours("migrations")
    assert {name: hashlib.sha256(data).hexdigest() for name, data in ours.items()} == \
        upstream.POSTGRES_MIGRATION_SHA256


def test_the_command_loader_reads_every_command_by_name_without_sql() -> None:
    texts = sql.command_texts()
    assert len(texts) == upstream.POSTGRES_COMMAND_COUNT
    assert "add_job" in texts and "$15" in sql.command("add_job")


def test_sql_literals_are_parsed_as_json_strings_without_running_node() -> None:
    source = 'x;\nexports.SQL_COMMANDS = {\n    "a.sql": "SELECT $1 -- \\"q\\" \\u00e9\\n",\n    "b.sql": "",\n};\n'
    assert fetch.parse_sql_literal(source, "SQL_COMMANDS") == {"a.sql": 'SELECT $1 -- "q" é\n', "b.sql": ""}
    esm = 'export const SQL_MIGRATIONS = {"0001_x.sql": "CREATE TABLE t();"};'
    assert fetch.parse_sql_literal(esm, "SQL_MIGRATIONS") == {"0001_x.sql": "CREATE TABLE t();"}


@pytest.mark.parametrize("source", [
    'exports.SQL_COMMANDS = {\n "a.sql": `template`,\n};',          # not a JSON string
    'exports.SQL_COMMANDS = {\n "../a.sql": "x",\n};',                # not a flat file name
    'exports.SQL_COMMANDS = {\n "a.sql": "x",\n "a.sql": "y"};',      # a duplicate
    'exports.OTHER = {};',                                            # no such literal
])
def test_a_sql_literal_that_is_not_plain_json_strings_is_refused(source: str) -> None:
    with pytest.raises(fetch.FetchError):
        fetch.parse_sql_literal(source, "SQL_COMMANDS")


def test_a_migration_that_does_not_match_its_pin_is_refused_at_fetch() -> None:
    entries = {name: "-- x\n" for name in upstream.POSTGRES_MIGRATION_SHA256}
    with pytest.raises(fetch.FetchError, match="does not match the pin"):
        fetch._check_migration_pins(entries)


def test_missing_sql_raises_upstream_scripts_missing_with_the_fetch_hint(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: object) -> None:
    monkeypatch.setattr(upstream, "UPSTREAM_DIR", tmp_path)
    with pytest.raises(UpstreamScriptsMissing, match="make setup"):
        upstream.postgres_commands_dir()
    with pytest.raises(UpstreamScriptsMissing, match="PostgreSQL migrations are not fetched"):
        upstream.postgres_migrations_dir()
