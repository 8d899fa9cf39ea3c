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
import urllib.request
from pathlib import Path

import pytest

from bullmq_compat import Queue, Worker
from tests._redis_server import free_port
from tests.node import NodeProcess

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed: run 'make setup' (it installs Debian's chromium package)")
    return binary


async def render(url: str, *, screenshot: Path | None = None) -> str:
    """The page's text after its scripts ran (and, optionally, a screenshot of it)."""
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=6000",
            "--window-size=1400,1000"]
    if screenshot is not None:
        proc = await asyncio.create_subprocess_exec(*args, f"--screenshot={screenshot}", url,
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.wait_for(proc.wait(), 60)
    proc = await asyncio.create_subprocess_exec(*args, "--dump-dom", url, stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = re.sub(r"<[^>]+>", " ", out.decode(errors="replace"))
    return re.sub(r"\s+", " ", text)


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
