"""README.md's code runs as pasted, and the README keeps its shape.

Every fenced block of README.md is either run here or marked, on the line before it, with an HTML
comment ``<!-- not run: why -->`` (``pip install`` lines, ``make test`` itself...). A block is run
with only its connection substituted: ``redis://127.0.0.1:6379/0`` becomes the test's own Redis, the
Node block's ``{ host: '127.0.0.1', port: 6379 }`` the same server, the PostgreSQL URL the test's
PostgreSQL and ``schema="bullmq"`` a schema of the test's own (dropped after, by `pg_schema`).

Python and bash blocks run as a user who did ``pip install bullmq-compat`` would run them: with the
wheel built from this checkout installed into a new venv (tests/wheel_helpers.py), ``PATH`` holding
only that venv's ``bin`` (no node, no npm, not the checkout's package). Node blocks run with ``node``
and NODE_PATH at interop/node_modules. Each must exit 0 within its timeout. A section that has a Node
block runs its blocks together (the Node producer waits for the job that the section's Python worker
processes).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import unquote, urlsplit

import pytest

from tests.node import INTEROP, _node_binary
from tests.wheel_helpers import build_dists, install_into_new_venv

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TIMEOUT_S = 120

REDIS_URL = "redis://127.0.0.1:6379/0"
NODE_CONNECTION = "{ host: '127.0.0.1', port: 6379 }"
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_SCHEMA = 'schema="bullmq"'

SECTIONS = ["Install", "Quick start", "The same queue from Node", "PostgreSQL", "Features", "Performance",
            "Reliability", "Documentation", "Contributing", "Versioning", "Licence"]
RUNNABLE = {"python": "python", "bash": "bash", "js": "node", "javascript": "node"}
SUFFIX = {"python": "py", "node": "js", "bash": "sh"}
NOT_RUN = re.compile(r"^<!-- not run: \S.* -->$")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    section: str
    not_run: str | None  # the marker's comment, when the block is not run

    @property
    def runner(self) -> str | None:
        return RUNNABLE.get(self.lang)

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.lang or 'no language'}, section {self.section!r})"


def blocks() -> list[Block]:
    lines = README.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("```"):
            lang = line[3:].strip()
            end = i + 1
            while end < len(lines) and lines[end].rstrip() != "```":
                end += 1
            assert end < len(lines), f"README.md:{i + 1}: the block is never closed"
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = before if NOT_RUN.match(before) else None
            found.append(Block(i + 1, lang, "\n".join(lines[i + 1:end]) + "\n", section, marker))
            i = end
        i += 1
    return found


def _run_blocks() -> list[Block]:
    return [b for b in blocks() if b.not_run is None]


def _node_sections() -> set[str]:
    return {b.section for b in _run_blocks() if b.runner == "node"}


def _uses_postgres(block: Block) -> bool:
    return POSTGRES_URL in block.text


def redis_only_blocks() -> list[Block]:
    return [b for b in _run_blocks() if b.section not in _node_sections() and not _uses_postgres(b)]


def node_section_blocks() -> list[Block]:
    return [b for b in _run_blocks() if b.section in _node_sections()]


def postgres_blocks() -> list[Block]:
    return [b for b in _run_blocks() if b.section not in _node_sections() and _uses_postgres(b)]


# -- substitution and running ------------------------------------------------------------------
def _node_connection(redis_url: str) -> str:
    url = urlsplit(redis_url)
    options: dict[str, object] = {"host": url.hostname or "127.0.0.1", "port": url.port or 6379}
    db = url.path.strip("/")
    if db and db != "0":
        options["db"] = int(db)
    if url.username:
        options["username"] = unquote(url.username)
    if url.password:
        options["password"] = unquote(url.password)
    if url.scheme == "rediss":
        options["tls"] = {}
    return json.dumps(options)


def substituted(block: Block, redis_url: str, postgres_url: str | None = None, schema: str | None = None) -> str:
    """The block's text with its connection pointed at the test's servers (and nothing else changed)."""
    text = block.text
    if block.runner == "node":
        assert NODE_CONNECTION in text, f"{block}: a Node block connects with {NODE_CONNECTION}"
        text = text.replace(NODE_CONNECTION, _node_connection(redis_url))
    else:
        text = text.replace(REDIS_URL, redis_url)
    if postgres_url is not None:
        assert POSTGRES_URL in text and POSTGRES_SCHEMA in text, f"{block}: names {POSTGRES_URL} and {POSTGRES_SCHEMA}"
        assert schema is not None
        text = text.replace(POSTGRES_URL, postgres_url).replace(POSTGRES_SCHEMA, f'schema="{schema}"')
    # whatever still names the default ports would reach the system's servers, not the test's
    for default in (":6379", "port: 6379", ":5432/test"):
        assert default not in text.replace(redis_url, "").replace(postgres_url or "\0", ""), \
            f"{block}: {default!r} is left after substitution (the test would use the system's server)"
    return text


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a new venv holding the wheel built from this checkout (and [postgres])."""
    work = tmp_path_factory.mktemp("readme-wheel")
    return install_into_new_venv(build_dists(work)["wheel"], work / "venv")


def _start(block: Block, text: str, tmp_path: Path, installed: Path) -> subprocess.Popen[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "NODE_PATH")}
    script = tmp_path / f"readme_{block.line}.{SUFFIX[block.runner or '']}"
    script.write_text(text, encoding="utf-8")
    if block.runner == "node":
        argv = [_node_binary(), str(script)]
        env["NODE_PATH"] = str(INTEROP / "node_modules")
    else:
        argv = [str(installed / "python"), str(script)] if block.runner == "python" else ["/bin/bash", "-e", str(script)]
        env["PATH"] = str(installed)
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(block: Block, proc: subprocess.Popen[str]) -> str:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{block} did not exit within {TIMEOUT_S} s\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    assert proc.returncode == 0, f"{block} exited with {proc.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
    return out


def _run_together(pairs: list[tuple[Block, str]], tmp_path: Path, installed: Path,
                  diagnose: Optional[Callable[[], str]] = None,
                  first_ready: Optional[Callable[["subprocess.Popen[str]"], None]] = None) -> list[str]:
    """Run the blocks at once; each must exit 0. When one fails, the message also has what the
    others printed (each stopped first) and ``diagnose()``'s account of the datastore. With
    ``first_ready``, the others start once it has returned (it waits on the first block's process)."""
    procs = [(pairs[0][0], _start(pairs[0][0], pairs[0][1], tmp_path, installed))]
    if first_ready is not None:
        first_ready(procs[0][1])
    procs += [(block, _start(block, text, tmp_path, installed)) for block, text in pairs[1:]]
    try:
        return [_finish(block, proc) for block, proc in procs]
    except (AssertionError, pytest.fail.Exception) as failure:
        others = []
        for block, proc in procs:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate()
            if out or err:
                others.append(f"{block} (exit {proc.returncode}):\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
        state = diagnose() if diagnose is not None else ""
        raise AssertionError("\n".join([str(failure), *others, state])) from None
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _redis_queue_state(redis_url: str, queue: str) -> str:
    """The queue's job hashes (name, state fields) and its last events, for a failure's message."""
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        prefix = f"bull:{queue}:"
        jobs = {key: client.hmget(key, "name", "processedOn", "finishedOn", "returnvalue", "failedReason")
                for key in sorted(client.scan_iter(prefix + "*")) if key[len(prefix):].isdigit()}
        lists = {name: client.zrange(prefix + name, 0, -1) if client.type(prefix + name) == "zset"
                 else client.lrange(prefix + name, 0, -1) for name in ("wait", "active", "completed", "failed")}
        events = client.xrevrange(prefix + "events", count=12)
        return f"queue {queue!r}: jobs {jobs}; {lists}; last events {events}"
    finally:
        client.close()


# -- the tests -----------------------------------------------------------------------------------
def test_the_readme_is_short_and_its_sections_are_in_order() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    assert text.startswith("# bullmq-compat\n")
    headings = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
    assert headings == SECTIONS
    assert "make test" in text
    for words in ("pip install bullmq-compat", "pip install 'bullmq-compat[postgres]'", "[metrics]",
                  "fetch-upstream --tarball", "autorun=True", "await worker.run()", "docs/performance.md",
                  "make setup", "bullmq-compat --version", "MIT"):
        assert words in text, words


def test_every_block_is_run_or_marked_not_run() -> None:
    found = blocks()
    assert found, "README.md has no code blocks"
    for block in found:
        if block.not_run is None:
            assert block.runner is not None, f"{block}: not a language this test runs; mark it <!-- not run: why -->"
    run = _run_blocks()
    chosen = [*redis_only_blocks(), *node_section_blocks(), *postgres_blocks()]
    assert sorted(b.line for b in chosen) == sorted(b.line for b in run)  # each run block by exactly one test
    # the blocks the brief asks for are there and run: a Python quick start, a Node one, PostgreSQL
    assert any(b.runner == "python" and b.section == "Quick start" for b in run)
    assert any(b.runner == "node" for b in run) and any(b.runner == "python" for b in node_section_blocks())
    assert postgres_blocks()


def test_the_redis_blocks_run_as_pasted(redis_url: str, tmp_path: Path, installed: Path) -> None:
    chosen = redis_only_blocks()
    assert chosen
    for block in chosen:  # one after the other, in README order (the quick start before the shell's look)
        out, = _run_together([(block, substituted(block, redis_url))], tmp_path, installed)
        if block.section == "Quick start" and block.runner == "python":
            assert "'double': 42" in out  # the job's return value, read back from the queue


def _until_events_are_read(redis_url: str, queue: str, proc: "subprocess.Popen[str]", timeout_s: float = 60) -> None:
    """Until the queue's QueueEvents (the Node producer's: its connection is named
    ``bull:<queue in base64>:qe``) blocks in XREAD from ``$``, or the process has exited. A worker
    already running would finish the Node producer's job within ms: done before that XREAD, its
    completed event is never read, and upstream's waitUntilFinished times out (seen once in a
    fresh-clone run). The worker starts once the events are read."""
    import base64
    import time

    import redis

    name = f"bull:{base64.b64encode(queue.encode()).decode()}:qe"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if any(c.get("name") == name and c.get("cmd") == "xread" and "b" in c.get("flags", "")
                   for c in client.client_list()):
                return
            time.sleep(0.05)
    finally:
        client.close()


def test_the_node_producer_and_the_python_worker_run_together(redis_url: str, tmp_path: Path, installed: Path) -> None:
    chosen = node_section_blocks()
    assert [block.runner for block in chosen] == ["node", "python"]
    outputs = _run_together([(block, substituted(block, redis_url)) for block in chosen], tmp_path, installed,
                            lambda: _redis_queue_state(redis_url, "emails"),
                            first_ready=lambda proc: _until_events_are_read(redis_url, "emails", proc))
    node_out = next(out for block, out in zip(chosen, outputs) if block.runner == "node")
    assert "double" in node_out and "42" in node_out  # what the Python worker returned, as Node read it


def test_the_postgres_block_runs_as_pasted(postgres_url: str, pg_schema: str, tmp_path: Path, installed: Path) -> None:
    chosen = postgres_blocks()
    assert chosen
    for block in chosen:
        out, = _run_together([(block, substituted(block, "\0", postgres_url, pg_schema))], tmp_path, installed)
        assert "completed" in out
