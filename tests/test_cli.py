"""The `bullmq-compat` command line, run as a subprocess as users run it."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bullmq_compat import Queue

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_add_then_info_shows_the_counts(redis_url, queue_name):
    added = cli("add", "--redis", redis_url, "--queue", queue_name, "--name", "n", "--data", '{"i": 1}')
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "1"
    bulk = cli("add", "--redis", redis_url, "--queue", queue_name, "--name", "n", "--count", "2500")
    assert bulk.returncode == 0 and "added 2500 jobs" in bulk.stdout
    info = cli("info", "--redis", redis_url, "--queue", queue_name)
    assert info.returncode == 0, info.stderr
    assert f"queue {queue_name}" in info.stdout
    assert any(line.split() == ["waiting", "2501"] for line in info.stdout.splitlines())


def test_info_lists_groups_with_their_counts(redis_url, queue_name):
    for _ in range(3):
        assert cli("add", "--redis", redis_url, "--queue", queue_name, "--name", "g",
                   "--opts", '{"group": "user:7"}').returncode == 0
    info = cli("info", "--redis", redis_url, "--queue", queue_name)
    row = next(line.split() for line in info.stdout.splitlines() if line.startswith("user:7"))
    assert row[:3] == ["user:7", "2", "1"]


def test_pause_and_resume(redis_url, queue_name):
    async def paused() -> bool:
        queue = Queue(queue_name, redis_url)
        try:
            return await queue.is_paused()
        finally:
            await queue.close()

    assert cli("pause", "--redis", redis_url, "--queue", queue_name).returncode == 0
    assert asyncio.run(paused()) is True
    assert cli("resume", "--redis", redis_url, "--queue", queue_name).returncode == 0
    assert asyncio.run(paused()) is False


def _run_cli_worker(redis_url, queue_name, count, worker_args, timeout=30):
    """Add ``count`` jobs {"i": i}, run ``bullmq-compat worker <worker_args>`` until they all have a
    return value, stop it with SIGTERM; returns (the return values, the worker's stdout)."""
    async def add_and_read(ids=None):
        queue = Queue(queue_name, redis_url)
        try:
            if ids is None:
                return [str(job.id) for job in await queue.add_bulk([{"name": "d", "data": {"i": i}}
                                                                       for i in range(count)])]
            return [(await queue.get_job(i)).returnvalue for i in ids]
        finally:
            await queue.close()

    ids = asyncio.run(add_and_read())
    proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "worker", *worker_args,
                             "--queue", queue_name, "--redis", redis_url],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        values = asyncio.run(add_and_read(ids))
        while None in values and time.monotonic() < deadline:
            time.sleep(0.2)
            values = asyncio.run(add_and_read(ids))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        return values, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_worker_processes_jobs_and_stops_gracefully_on_sigterm(redis_url, queue_name):
    values, _ = _run_cli_worker(redis_url, queue_name, 3, ["tests.cli_jobs:double", "--concurrency", "2"])
    assert values == [{"double": 0}, {"double": 2}, {"double": 4}]


def test_worker_with_batch_options_processes_jobs_in_batches(redis_url, queue_name):
    values, out = _run_cli_worker(redis_url, queue_name, 6, [
        "tests.cli_jobs:batch_sizes", "--batch", "3", "--batch-min-size", "3", "--batch-timeout", "5000"])
    assert values == [3] * 6  # 6 waiting jobs, batches of 3
    assert "batches of up to 3" in out


def test_retry_failed_and_clean(redis_url, queue_name):
    async def make_failed() -> None:
        from bullmq_compat import Worker

        queue = Queue(queue_name, redis_url)
        await queue.add_bulk([{"name": "f", "data": {}} for _ in range(5)])

        async def fail(job):
            raise ValueError("nope")

        done = asyncio.Event()
        count = 0

        def on_failed(*_):
            nonlocal count
            count += 1
            if count == 5:
                done.set()

        worker = Worker(queue_name, fail, redis_url, concurrency=5, group_keeper=False)
        worker.on("failed", on_failed)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        await asyncio.wait_for(done.wait(), 10)
        await worker.close()
        await task
        await queue.close()

    async def counts() -> dict:
        queue = Queue(queue_name, redis_url)
        try:
            return await queue.get_job_counts("failed", "waiting")
        finally:
            await queue.close()

    asyncio.run(make_failed())
    assert asyncio.run(counts()) == {"failed": 5, "waiting": 0}
    retried = cli("retry-failed", "--redis", redis_url, "--queue", queue_name)
    assert retried.returncode == 0 and "moved 5 failed jobs" in retried.stdout
    assert asyncio.run(counts()) == {"failed": 0, "waiting": 5}
    cleaned = cli("clean", "--redis", redis_url, "--queue", queue_name, "--state", "waiting")
    assert cleaned.returncode == 0 and "removed 5 waiting jobs" in cleaned.stdout
    assert asyncio.run(counts()) == {"failed": 0, "waiting": 0}


@pytest.mark.parametrize("args, message", [
    (["info", "--redis", "redis://127.0.0.1:1/0"], "cannot reach Redis at redis://127.0.0.1:1/0"),
    (["add", "--queue", "q", "--name", "n", "--data", "{bad"], "--data is not valid JSON"),
    (["add", "--queue", "q", "--name", "n", "--opts", '{"nope": 1}'], "unknown job option 'nope'"),
    (["worker", "no_such_module:fn", "--queue", "q"], "cannot import 'no_such_module'"),
    (["lua", "nothing"], "no script named 'nothing'"),
    (["worker", "tests.cli_jobs:double", "--queue", "q", "--batch", "0"], "batch size=0 must be an int >= 1"),
    (["worker", "tests.cli_jobs:double", "--queue", "q", "--batch-timeout", "10"], "need --batch SIZE"),
])
def test_errors_print_one_line_without_a_traceback(args, message, redis_url):
    if "--redis" not in args:
        args = [*args, "--redis", redis_url] if args[0] != "lua" else args
    result = cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_keeper_runs_until_sigterm(redis_url, queue_name):
    proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "keeper", "--queue", queue_name,
                             "--redis", redis_url], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert "keeper running" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "bullmq-compat"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, env={**os.environ})
    assert result.returncode == 0 and "keeper" in result.stdout


def test_console_script_worker_imports_the_processor_from_the_current_directory(redis_url, queue_name, tmp_path):
    """`bullmq-compat worker myapp.jobs:send` run from the folder holding myapp/ (issue #26): the
    console script's sys.path[0] is its bin/ folder, so the worker puts the current directory first."""
    package = tmp_path / f"app_{queue_name.replace('-', '_')}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text("async def send(job):\n    return {'sent': job.data['i']}\n")
    script = Path(sys.executable).with_name("bullmq-compat")
    assert script.exists(), script

    async def add_and_read(job_id=None):
        queue = Queue(queue_name, redis_url)
        try:
            if job_id is None:
                return str((await queue.add("send", {"i": 7})).id)
            return (await queue.get_job(job_id)).returnvalue
        finally:
            await queue.close()

    job_id = asyncio.run(add_and_read())
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    proc = subprocess.Popen([str(script), "worker", f"{package.name}.jobs:send", "--queue", queue_name,
                             "--redis", redis_url], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        value = None
        while value is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            value = asyncio.run(add_and_read(job_id))
        if proc.poll() is not None:  # it stopped by itself: the import failed
            pytest.fail(f"the worker exited with {proc.returncode}: {proc.stderr.read()}")
        assert value == {"sent": 7}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
