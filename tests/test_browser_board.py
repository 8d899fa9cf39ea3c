"""Bull-Board in a real browser shows what Python workers did with Node-produced jobs.

Headless Chromium (Debian's `chromium`, installed by `make setup` when missing) renders the
board's pages; the screenshot is kept in test-artifacts/ for a person to look at.
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bullmq_compat import Queue, Worker
from tests._redis_server import free_port
from tests.node import NodeProcess

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"

# one chromium at a time (it is the heaviest thing in the suite), on one xdist worker
pytestmark = pytest.mark.xdist_group("browser")


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed: run 'make setup' (it installs Debian's chromium package)")
    return binary


async def render(url: str, *, screenshot: Path | None = None) -> str:
    """The page's text after its scripts ran (and, optionally, a screenshot of it). Each chromium
    gets a profile directory of its own (two sharing one hand over to each other, or hang)."""
    with tempfile.TemporaryDirectory(prefix="bullmq-compat-chromium-") as profile:
        args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=6000",
                "--window-size=1400,1000", f"--user-data-dir={profile}"]
        if screenshot is not None:
            proc = await asyncio.create_subprocess_exec(*args, f"--screenshot={screenshot}", url,
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await _finish(proc)
        proc = await asyncio.create_subprocess_exec(*args, "--dump-dom", url, stdout=subprocess.PIPE,
                                                    stderr=subprocess.DEVNULL)
        out = await _finish(proc)
    text = re.sub(r"<[^>]+>", " ", out.decode(errors="replace"))
    return re.sub(r"\s+", " ", text)


async def _finish(proc: asyncio.subprocess.Process, timeout: float = 180) -> bytes:
    """Its stdout once it exits; killed (and the test failed) after ``timeout`` s."""
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return out or b""


async def slow_process(job):
    await asyncio.sleep(job.data.get("ms", 200) / 1000)
    if job.attempts_made < job.data.get("failTimes", 0):
        raise RuntimeError(f"{job.name} failed on attempt {job.attempts_made + 1}")
    return {"by": "python"}


async def test_board_shows_python_processed_jobs_and_the_python_worker(redis_url, queue_name):
    ARTIFACTS.mkdir(exist_ok=True)
    producer = await asyncio.create_subprocess_exec("node", str(ROOT / "interop" / "demo_producer.js"), redis_url,
                                                    queue_name, cwd=str(ROOT), stdout=subprocess.DEVNULL)
    assert await producer.wait() == 0
    queue = Queue(queue_name, redis_url)
    await queue.pause_group("user:1")  # its jobs keep waiting for their turn while we look
    worker = Worker(queue_name, slow_process, redis_url, name="python-browser-worker", concurrency=4)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    port = free_port()
    try:
        async with NodeProcess.board(redis_url, port, [queue_name]):
            # wait until some jobs are done while grouped ones still wait for their turn
            for _ in range(100):
                counts = await queue.get_job_counts()
                if counts["completed"] >= 3:
                    break
                await asyncio.sleep(0.1)
            counts = await queue.get_job_counts()
            assert counts["waiting-children"] > 0 and counts["delayed"] >= 1, counts
            base = f"http://127.0.0.1:{port}/queue/{queue_name}"
            waiting_for_group = await render(f"{base}?status=waiting-children",
                                             screenshot=ARTIFACTS / "board-waiting-for-group.png")
            assert "sync-account" in waiting_for_group and "group: user:" in waiting_for_group
            completed = await render(f"{base}?status=completed", screenshot=ARTIFACTS / "board-completed.png")
            assert "by python-browser-worker" in completed
            assert 'returnValue: { by: "python" }' in completed
            for _ in range(100):  # send-sms fails for good after its second attempt
                if (await queue.get_job_counts("failed"))["failed"] >= 1:
                    break
                await asyncio.sleep(0.1)
            failed = await render(f"{base}?status=failed")
            assert "send-sms" in failed and "failed on attempt" in failed
            delayed = await render(f"{base}?status=delayed")
            assert "weekly-report" in delayed
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/queues/{queue_name}/workers") as resp:
                workers = json.loads(resp.read())["workers"]
            assert any(w.get("name") == "python-browser-worker" for w in workers), workers
    finally:
        await worker.close()
        await task
        await queue.close()
    assert (ARTIFACTS / "board-completed.png").stat().st_size > 10_000


# -- `bullmq-compat board`: loopback unless --host says otherwise, and --read-only ------------------

SECRET = "board-s3cret-Jw4"


def non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one (no packet is sent)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def reachable(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


class CliBoard:
    """``python -m bullmq_compat board --json ...`` in the background: its first stdout line, its stderr."""

    def __init__(self, *argv: str, redis: str) -> None:
        import os
        import sys

        self.argv = [sys.executable, "-m", "bullmq_compat", "board", "--json", *argv]  # the JSON start-up line
        self.env = {**os.environ, "REDIS_URL": redis}  # the documented habit: not on a command line
        self.proc: asyncio.subprocess.Process | None = None
        self.first_line: dict = {}
        self.stderr = b""

    async def __aenter__(self) -> "CliBoard":
        self.proc = await asyncio.create_subprocess_exec(*self.argv, cwd=str(ROOT), stdout=subprocess.PIPE,
                                                         stderr=subprocess.PIPE, env=self.env)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert line, f"the board printed nothing: {await self.proc.stderr.read()!r}"  # type: ignore[union-attr]
        self.first_line = json.loads(line)
        return self

    def command_lines(self) -> list[str]:
        """Every process's command line (the board's node child included)."""
        lines = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
        return lines

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()  # the CLI passes it on to the node process, which exits cleanly
        _, self.stderr = await asyncio.wait_for(self.proc.communicate(), 30)


async def test_cli_board_binds_loopback_by_default_and_read_only_hides_the_actions(redis_url, queue_name):
    ARTIFACTS.mkdir(exist_ok=True)
    # the session's Redis wants no password; one given is ignored with a warning, and must show nowhere
    url = redis_url.replace("redis://", f"redis://:{SECRET}@", 1) if "@" not in redis_url else redis_url
    queue = Queue(queue_name, redis_url)
    try:
        await queue.add("later", {}, delay=3_600_000)
        await queue.add("send-sms", {"failTimes": 9}, attempts=1)

        async def fail(job):
            raise RuntimeError(f"{job.name} failed on purpose")
        worker = Worker(queue_name, fail, redis_url)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            for _ in range(300):
                if (await queue.get_job_counts("failed"))["failed"] >= 1:
                    break
                await asyncio.sleep(0.1)
        finally:
            await worker.close()
            await task
        other_address = non_loopback_address()

        # the default: loopback, no warning, the action buttons there
        port = free_port()
        async with CliBoard("--queue", queue_name, "--port", str(port), redis=url) as board:
            assert board.first_line == {"listening": f"http://127.0.0.1:{port}/", "readOnly": False}
            assert not any(SECRET in line for line in board.command_lines())  # node's included
            failed = await render(f"http://127.0.0.1:{port}/queue/{queue_name}?status=failed")
            assert "send-sms" in failed and "Retry all" in failed and "Clean all" in failed
            assert "Promote all" in await render(f"http://127.0.0.1:{port}/queue/{queue_name}?status=delayed")
            if other_address is not None:
                assert not reachable(other_address, port), "bound beyond loopback without --host"
        assert b"warning" not in board.stderr and SECRET.encode() not in board.stderr

        # --host 0.0.0.0 --read-only: a warning, reachable beyond loopback, no action buttons, API refuses
        port = free_port()
        async with CliBoard("--queue", queue_name, "--port", str(port), "--host", "0.0.0.0", "--read-only",
                            redis=url) as board:
            assert board.first_line == {"listening": f"http://0.0.0.0:{port}/", "readOnly": True}
            assert not any(SECRET in line for line in board.command_lines())  # node's included
            if other_address is not None:
                assert reachable(other_address, port)
            base = f"http://127.0.0.1:{port}/queue/{queue_name}"
            failed = await render(f"{base}?status=failed", screenshot=ARTIFACTS / "board-read-only-failed.png")
            assert "send-sms" in failed and "failed on purpose" in failed  # the jobs are shown ...
            delayed = await render(f"{base}?status=delayed")
            assert "later" in delayed
            for button in ("Retry", "Clean", "Promote", "Remove"):  # ... without their actions
                assert button not in failed and button not in delayed, button
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/queues/{queue_name}/retry/failed",
                                             method="PUT")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request)
            assert refused.value.code == 405
            assert (await queue.get_job_counts("failed"))["failed"] == 1
        warning = board.stderr.decode()
        assert "warning: Bull-Board is bound to 0.0.0.0, beyond loopback" in warning, warning
        assert SECRET not in warning
    finally:
        await queue.close()
    assert (ARTIFACTS / "board-read-only-failed.png").stat().st_size > 10_000
