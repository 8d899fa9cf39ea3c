"""`bullmq-compat board` outside a clone: the messages when Node.js or Bull-Board's Node modules
are missing, `board --install` (npm ci into the per-user cache), and the start-up line.

"An installed package" is simulated as it is laid out: a copy of the bullmq_compat/ folder alone
in a directory on PYTHONPATH (no interop/ next to it), with $XDG_CACHE_HOME in tmp_path."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bullmq_compat import __version__
from bullmq_compat._secrets import redact_url
from tests._ports import free_port
from tests.node import exited

ROOT = Path(__file__).resolve().parent.parent
INSTALL_HINT = "run 'bullmq-compat board --install' (needs Node.js 20+ and npm)"


def installed_copy(tmp_path: Path) -> Path:
    """A site-packages of our own holding a copy of the package: what a wheel install looks like."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "bullmq_compat", site / "bullmq_compat",
                    ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    return site


def environment(tmp_path: Path, site: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BULLMQ_COMPAT_BOARD_DIR", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == "", (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def path_with(tmp_path: Path, *programs: str) -> str:
    """A PATH holding only ``programs`` (links to the real ones)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for program in programs:
        real = shutil.which(program)
        assert real is not None, f"{program} is not on PATH"
        (folder / program).symlink_to(real)
    return str(folder)


# -- the messages ------------------------------------------------------------------------------------
@pytest.mark.node
def test_installed_package_without_the_modules_says_to_run_install(tmp_path: Path) -> None:
    site = installed_copy(tmp_path)
    result = cli("board", "--queue", "q", env=environment(tmp_path, site), cwd=tmp_path)
    cache = tmp_path / "cache" / "bullmq-compat" / f"board-{__version__}"
    assert one_line_error(result) == (
        f"bullmq-compat: board needs Bull-Board's Node modules, which are not in {cache}: {INSTALL_HINT}")


@pytest.mark.node
def test_board_dir_variable_is_where_it_looks(tmp_path: Path) -> None:
    """$BULLMQ_COMPAT_BOARD_DIR wins over the clone's interop/node_modules too."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("board", "--queue", "q", env=environment(tmp_path, BULLMQ_COMPAT_BOARD_DIR=str(empty)), cwd=ROOT)
    assert one_line_error(result) == (
        f"bullmq-compat: board needs Bull-Board's Node modules, which are not in {empty}: {INSTALL_HINT}")


NO_NODE = ("bullmq-compat: board needs Node.js 20+ for Bull-Board, and 'node' is not on PATH: install Node.js 20 "
           "or later (it comes with npm) and check with 'node --version'")


@pytest.mark.parametrize("args", [["--queue", "q"], ["--install"]])
def test_without_node_on_path_it_says_node_20_is_needed(tmp_path: Path, args: list[str]) -> None:
    site = installed_copy(tmp_path)
    result = cli("board", *args, env=environment(tmp_path, site, PATH=path_with(tmp_path)), cwd=tmp_path)
    assert one_line_error(result) == NO_NODE
    assert not (tmp_path / "cache").exists()


def test_a_node_older_than_20_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    node = folder / "node"
    node.write_text("#!/bin/sh\necho v18.19.0\n")
    node.chmod(0o755)
    result = cli("board", "--queue", "q", env=environment(tmp_path, PATH=str(folder)), cwd=ROOT)
    assert one_line_error(result) == (f"bullmq-compat: board needs Node.js 20+; {node} --version says v18.19.0: "
                                      "install Node.js 20 or later")


@pytest.mark.node
def test_install_without_npm_says_so(tmp_path: Path) -> None:
    site = installed_copy(tmp_path)
    result = cli("board", "--install", env=environment(tmp_path, site, PATH=path_with(tmp_path, "node")), cwd=tmp_path)
    assert one_line_error(result) == ("bullmq-compat: board --install needs npm (it comes with Node.js), and 'npm' is "
                                      "not on PATH: check with 'npm --version'")


def test_board_without_a_queue_says_what_to_pass(tmp_path: Path) -> None:
    result = cli("board", env=environment(tmp_path), cwd=ROOT)
    assert one_line_error(result) == ("bullmq-compat: board needs --queue NAME (repeat it for more queues), or "
                                      "--install to install Bull-Board")


def test_install_leaves_another_node_project_alone(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "package.json").write_text('{"name": "someone-elses"}')
    result = cli("board", "--install", env=environment(tmp_path, BULLMQ_COMPAT_BOARD_DIR=str(other)), cwd=tmp_path)
    if shutil.which("node") is not None:  # (without node it stops at that, as tested above)
        assert one_line_error(result) == (
            f"bullmq-compat: {other} holds another Node project ({other / 'package.json'}): set "
            "BULLMQ_COMPAT_BOARD_DIR to an empty directory, or remove that one")
    assert (other / "package.json").read_text() == '{"name": "someone-elses"}'
    assert sorted(p.name for p in other.iterdir()) == ["package.json"]


# -- a running board --------------------------------------------------------------------------------
class RunningBoard:
    """``python -m bullmq_compat board ...`` in the background, up to its first stdout line."""

    def __init__(self, *args: str, env: dict[str, str], cwd: Path, start_timeout: float = 60) -> None:
        self.argv = [sys.executable, "-m", "bullmq_compat", "board", *args]
        self.start_timeout = start_timeout
        self.env, self.cwd = env, cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.first_line = ""
        self.stderr = b""

    async def __aenter__(self) -> "RunningBoard":
        # a session of its own: the board's node child is killed with it (_kill)
        self.proc = await asyncio.create_subprocess_exec(*self.argv, cwd=str(self.cwd), env=self.env,
                                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                         start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), self.start_timeout)
        except BaseException:
            await self._kill()
            raise
        if not line:
            await self.proc.wait()
            raise AssertionError(f"the board printed nothing: {await self.proc.stderr.read()!r}")
        self.first_line = line.decode().rstrip("\n")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)  # passed on to node, which closes and exits 0
        try:
            _, self.stderr = await asyncio.wait_for(self.proc.communicate(), 30)
        except asyncio.TimeoutError:
            await self._kill()
            raise AssertionError(f"the board did not exit within 30 s of SIGTERM (pid {self.proc.pid})") from None

    async def _kill(self) -> None:
        """SIGKILL the board and its node child (their process group), and wait, bounded, for the
        board to be reaped: proc.wait() would also wait for pipes a child left open."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if not await exited(self.proc, 30):
            raise AssertionError(f"board pid {self.proc.pid}: not reaped 30 s after SIGKILL")


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


@pytest.mark.node
async def test_start_up_line_is_for_a_person_and_json_on_request(redis_url: str, queue_name: str,
                                                                  tmp_path: Path) -> None:
    env = environment(tmp_path, REDIS_URL=redis_url)
    other = f"{queue_name}-b"
    port = free_port()
    async with RunningBoard("--queue", queue_name, "--queue", other, "--port", str(port), "--read-only",
                            env=env, cwd=ROOT) as board:
        assert board.first_line == (f"Bull-Board for queues {queue_name}, {other} on {redact_url(redis_url)} at "
                                    f"http://127.0.0.1:{port}/ (read-only); Ctrl-C to stop")
    assert board.proc is not None and board.proc.returncode == 0, board.stderr
    port = free_port()
    async with RunningBoard("--json", "--queue", queue_name, "--port", str(port), env=env, cwd=ROOT) as board:
        assert json.loads(board.first_line) == {"listening": f"http://127.0.0.1:{port}/", "readOnly": False}
    assert board.proc is not None and board.proc.returncode == 0, board.stderr


@pytest.mark.node
async def test_install_then_the_board_runs_from_the_cache(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """npm ci from the shipped lock file (npm's registry, through npm's own cache), then the
    installed package's board runs on those modules and serves Bull-Board's page."""
    site = installed_copy(tmp_path)
    env = environment(tmp_path, site, REDIS_URL=redis_url)
    cache = tmp_path / "cache" / "bullmq-compat" / f"board-{__version__}"
    installed = await asyncio.to_thread(cli, "board", "--install", env=env, cwd=tmp_path, timeout=600)
    assert installed.returncode == 0, (installed.stdout, installed.stderr)
    steps = [line for line in installed.stdout.splitlines() if line.strip()]
    assert steps[0] == f"installing Bull-Board into {cache}"
    assert steps[1] == f"copied board.js, package.json, package-lock.json from {site / 'bullmq_compat' / '_board'}"
    assert steps[2].startswith(f"running: npm ci --omit=dev --no-audit --no-fund   (in {cache};")
    assert steps[-1] == f"Bull-Board is installed in {cache}: start it with 'bullmq-compat board --queue NAME'"
    assert (cache / "node_modules" / "@bull-board" / "express").is_dir()
    for name in ("board.js", "package.json", "package-lock.json"):
        assert (cache / name).read_bytes() == (ROOT / "bullmq_compat" / "_board" / name).read_bytes()

    port = free_port()
    async with RunningBoard("--queue", queue_name, "--port", str(port), env=env, cwd=tmp_path) as board:
        assert board.first_line == (f"Bull-Board for queue {queue_name} on {redact_url(redis_url)} at "
                                    f"http://127.0.0.1:{port}/; Ctrl-C to stop")
        status, page = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/")
        assert status == 200 and "<title>Bull Dashboard</title>" in page, page[:500]
        status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/api/queues")
        assert status == 200 and [q["name"] for q in json.loads(body)["queues"]] == [queue_name]
    assert board.proc is not None and board.proc.returncode == 0, board.stderr

    # a cache that another version of the package filled is not used
    (cache / "board.js").write_text("// someone else's\n")
    stale = cli("board", "--queue", queue_name, env=env, cwd=tmp_path)
    assert one_line_error(stale) == (
        f"bullmq-compat: Bull-Board in {cache} was installed by another bullmq-compat: {INSTALL_HINT}")

    # --install --json --queue: installs again (the steps and npm's output on stderr), then serves
    port = free_port()
    async with RunningBoard("--install", "--json", "--queue", queue_name, "--port", str(port), env=env, cwd=tmp_path,
                            start_timeout=600) as board:
        assert json.loads(board.first_line) == {"listening": f"http://127.0.0.1:{port}/", "readOnly": False}
        status, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/")
        assert status == 200
    assert board.proc is not None and board.proc.returncode == 0, board.stderr
    assert f"installing Bull-Board into {cache}\n".encode() in board.stderr
    assert f"Bull-Board is installed in {cache}\n".encode() in board.stderr
    assert (cache / "board.js").read_bytes() == (ROOT / "bullmq_compat" / "_board" / "board.js").read_bytes()
