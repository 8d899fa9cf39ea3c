"""The paper cuts of issue #26: closed queues, workers never run, the first connection's log line,
typed job options and the package's exports."""
from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bullmq_compat import FlowProducer, InvalidJobOptions, JobOptions, Queue, QueueClosed, QueueEvents, Worker
from tests._ports import free_port
from tests._redis_server import RedisServer
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent

# -- 2. a closed Queue raises QueueClosed and never reconnects ----------------------------------


def _calls(queue: Queue, job_id: str):
    """Public async calls of a Queue that reach the datastore, with arguments they accept."""
    return {
        "add": lambda: queue.add("n", {"i": 1}),
        "add(opts)": lambda: queue.add("n", {"i": 1}, attempts=2),
        "add_bulk": lambda: queue.add_bulk([{"name": "n", "data": {}}]),
        "get_job_counts": lambda: queue.get_job_counts(),
        "get_job": lambda: queue.get_job(job_id),
        "get_job_state": lambda: queue.get_job_state(job_id),
        "get_jobs": lambda: queue.get_jobs(["waiting"]),
        "count": lambda: queue.count(),
        "get_waiting_count": lambda: queue.get_waiting_count(),
        "pause": lambda: queue.pause(),
        "resume": lambda: queue.resume(),
        "is_paused": lambda: queue.is_paused(),
        "drain": lambda: queue.drain(),
        "clean": lambda: queue.clean(0, 10, "completed"),
        "remove": lambda: queue.remove(job_id),
        "retry_jobs": lambda: queue.retry_jobs(),
        "promote_jobs": lambda: queue.promote_jobs(),
        "get_meta": lambda: queue.get_meta(),
        "get_workers": lambda: queue.get_workers(),
        "get_job_logs": lambda: queue.get_job_logs(job_id),
        "get_metrics": lambda: queue.get_metrics("completed"),
        "set_global_concurrency": lambda: queue.set_global_concurrency(3),
        "get_job_schedulers": lambda: queue.get_job_schedulers(),
        "upsert_job_scheduler": lambda: queue.upsert_job_scheduler("s", {"every": 60000}),
        "obliterate": lambda: queue.obliterate(force=True),
        "wait_until_ready": lambda: queue.wait_until_ready(),
    }


async def _assert_closed(queue: Queue, job_id: str) -> None:
    for what, call in _calls(queue, job_id).items():
        with pytest.raises(QueueClosed) as raised:
            await call()
        message = str(raised.value)
        assert f"queue {queue.name!r} is closed" in message and "create a new Queue" in message, (what, message)


@pytest.fixture(params=["redis", "postgres"])
async def connect(request, queue_name):
    """Keyword arguments of a Queue on one backend (the PostgreSQL schema migrated)."""
    if request.param == "redis":
        return {"connection": request.getfixturevalue("redis_url")}
    postgres_url = request.getfixturevalue("postgres_url")
    schema = request.getfixturevalue("pg_schema")
    from bullmq_compat import migrate_postgres

    await migrate_postgres(postgres_url, schema)
    return {"connection": postgres_url, "schema": schema}


async def test_every_call_on_a_closed_queue_raises_queue_closed(connect, queue_name):
    queue = Queue(queue_name, **connect)
    job = await queue.add("n", {"i": 0})
    assert await queue.get_job_counts("waiting") == {"waiting": 1}
    await queue.close()
    await _assert_closed(queue, str(job.id))
    with pytest.raises(QueueClosed):  # a Job read before the close goes through its queue
        await job.get_state()
    with pytest.raises(QueueClosed):
        await job.update_progress(50)
    await queue.close()  # again: nothing to do
    # nothing was written after the close: a new Queue sees the one job only
    fresh = Queue(queue_name, **connect)
    try:
        assert await fresh.get_job_counts("waiting", "paused") == {"waiting": 1, "paused": 0}
    finally:
        await fresh.close()


async def test_a_queue_closed_before_its_first_call_refuses_later_ones(connect, queue_name):
    queue = Queue(queue_name, **connect)
    await queue.close()
    await _assert_closed(queue, "1")
    fresh = Queue(queue_name, **connect)
    try:
        assert await fresh.count() == 0
    finally:
        await fresh.close()


async def test_closed_worker_and_queue_events_raise_queue_closed(connect, queue_name):
    worker = Worker(queue_name, None, **connect)
    await worker.get_job("1")  # connected
    await worker.close()
    with pytest.raises(QueueClosed, match=f"Worker of queue '{queue_name}' is closed: create a new Worker"):
        await worker.get_job("1")
    with pytest.raises(QueueClosed):
        await worker.get_next_job("token", block=False)
    events = QueueEvents(queue_name, autorun=False, **connect)
    await events.close()
    with pytest.raises(QueueClosed, match="QueueEvents of queue"):
        await events.get_job("1")
    await events.close()


async def test_closed_flow_producer_raises_queue_closed(redis_url, queue_name):
    flow = FlowProducer(redis_url)
    node = await flow.add({"name": "p", "queue_name": queue_name, "children": [
        {"name": "c", "queue_name": queue_name}]})
    await flow.close()
    flow_call = {"name": "p", "queue_name": queue_name}
    with pytest.raises(QueueClosed, match="FlowProducer is closed: create a new FlowProducer"):
        await flow.add(flow_call)
    with pytest.raises(QueueClosed):
        await flow.get_flow({"id": str(node.job.id), "queue_name": queue_name})
    with pytest.raises(QueueClosed):
        await flow.wait_until_ready()
    with pytest.raises(QueueClosed):  # the flow's jobs went through its (now closed) queues
        await node.job.get_state()
    await flow.close()


_CLOSED_SCRIPT = """
import asyncio, sys
from bullmq_compat import Queue, QueueClosed

async def main(connect, add_first):
    queue = Queue(sys.argv[1], **connect)
    if add_first:
        await queue.add("n", {{}})
    await queue.close()
    try:
        await queue.add("n", {{}})
    except QueueClosed as err:
        print("refused:", err)
    else:
        raise SystemExit("add after close was accepted")
    try:
        await queue.get_job_counts()
    except QueueClosed:
        print("counts refused")

asyncio.run(main({connect!r}, {add_first!r}))
"""


@pytest.mark.parametrize("add_first", [False, True], ids=["closed-before-any-add", "closed-after-an-add"])
def test_closed_queue_leaks_no_socket_under_dev_mode(connect, queue_name, add_first, tmp_path):
    script = tmp_path / "closed.py"
    script.write_text(textwrap.dedent(_CLOSED_SCRIPT.format(connect=connect, add_first=add_first)))
    run = subprocess.run([sys.executable, "-X", "dev", "-W", "error::ResourceWarning", str(script), queue_name],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"refused: queue {queue_name!r} is closed" in run.stdout
    assert "counts refused" in run.stdout
    # a ResourceWarning raised in __del__ is printed, not raised: the exit code alone cannot tell
    assert "ResourceWarning" not in run.stderr and "unclosed" not in run.stderr, run.stderr


# -- 3. a Worker with a processor that never ran says so ------------------------------------------

async def _process(job):
    return "done"


def _never_run_records(caplog, queue_name):
    return [r for r in caplog.records if r.levelno == logging.WARNING and "without having run" in r.getMessage()
            and repr(queue_name) in r.getMessage()]


async def test_a_worker_closed_without_having_run_warns(redis_url, queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="bullmq_compat")
    worker = Worker(queue_name, _process, redis_url)
    await worker.close()
    await worker.close()
    records = _never_run_records(caplog, queue_name)
    assert len(records) == 1, caplog.text
    message = records[0].getMessage()
    assert message.startswith(f"worker for queue {queue_name!r} was closed without having run")
    assert "await worker.run()" in message and "autorun=True" in message
    assert records[0].name.startswith("bullmq_compat")


async def test_a_worker_garbage_collected_without_having_run_warns(redis_url, queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="bullmq_compat")
    worker = Worker(queue_name, _process, redis_url, group_keeper=False)
    del worker
    gc.collect()
    records = _never_run_records(caplog, queue_name)
    assert len(records) == 1, caplog.text
    assert "was garbage-collected without having run" in records[0].getMessage()


async def test_a_worker_that_ran_or_has_no_processor_does_not_warn(redis_url, queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="bullmq_compat")
    manual = Worker(queue_name, None, redis_url)  # manual processing: nothing to run
    assert await manual.get_next_job("t", block=False) is None
    await manual.close()
    ran = Worker(queue_name, _process, redis_url)
    task = asyncio.ensure_future(ran.run(handle_signals=False))
    await wait_until(ran.is_running, 30, "the worker running")
    await ran.close()
    await task
    auto = Worker(queue_name, _process, redis_url, autorun=True)
    await auto.close()
    del manual, ran, auto
    gc.collect()
    assert _never_run_records(caplog, queue_name) == [], caplog.text


async def test_a_worker_closed_while_it_is_still_connecting_stops_cleanly(connect, queue_name):
    """close() right after run() started, before its connection is open: run() returns, as Node's
    worker does when closed during start-up, instead of raising QueueClosed from its first call."""
    for pause in (0, 0, 0.001, 0.01):  # close at different points of the start-up
        worker = Worker(queue_name, _process, **connect)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        await asyncio.sleep(pause)
        await worker.close()
        await asyncio.wait_for(task, 30)
        assert not worker.is_running()


# -- 4. "cannot reach" when the worker never had a connection, "lost" only after one -------------

def _warnings(caplog, *words):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name.startswith("bullmq_compat") and all(w in r.getMessage() for w in words)]


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_a_worker_that_never_connected_says_cannot_reach(kind, queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="bullmq_compat")
    port = free_port()  # nothing listens there
    if kind == "redis":
        url, label, address = f"redis://127.0.0.1:{port}/0", "Redis", f"redis://127.0.0.1:{port}"
    else:
        pytest.importorskip("psycopg")
        url, label, address = f"postgresql://nobody@127.0.0.1:{port}/nothing", "PostgreSQL", f"127.0.0.1:{port}"
    worker = Worker(queue_name, _process, url)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        lines = await wait_until(lambda: _warnings(caplog, repr(queue_name), "cannot reach"), 30,
                                 "the worker's cannot-reach warning")
        assert f"worker for queue {queue_name!r} cannot reach {label} at " in lines[0], lines
        assert address in lines[0], lines
        assert lines[0].count("cannot reach") == 1, lines  # the error's own lead-in is not repeated
        assert _warnings(caplog, "lost") == [], caplog.text
    finally:
        await worker.close(force=True)
        await task


async def test_a_worker_that_had_a_connection_says_lost(queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="bullmq_compat")
    server = RedisServer().start()
    try:
        worker = Worker(queue_name, _process, server.url, drain_delay=1, group_keeper=False)
        ready = asyncio.Event()
        worker.on("ready", lambda: ready.set())
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        await asyncio.wait_for(ready.wait(), 30)
        server.stop()
        lines = await wait_until(lambda: _warnings(caplog, "lost Redis"), 30, "the worker's lost-Redis warning")
        assert queue_name in lines[0]
        assert _warnings(caplog, "cannot reach", repr(queue_name)) == [], caplog.text
        await worker.close(force=True)
        await task
    finally:
        server.stop()


# -- 5. typed job options -----------------------------------------------------------------------

def test_job_options_lists_every_option_add_accepts():
    from bullmq_compat._groups import GROUP_OPTIONS
    from bullmq_compat._wire.options import JOB_OPTIONS

    accepted = {opt.python for opt in JOB_OPTIONS} | {opt.node for opt in JOB_OPTIONS} | set(GROUP_OPTIONS)
    assert set(JobOptions.__annotations__) == accepted
    assert JobOptions.__total__ is False


_TYPED_GOOD = """
from bullmq_compat import JobOptions, Queue

async def main(queue: Queue) -> None:
    await queue.add("send", {"to": "a@b"}, attempts=3, delay=1500, backoff={"type": "exponential", "delay": 100},
                    remove_on_complete={"count": 10}, job_id="mail-1", priority=2, deduplication={"id": "d"},
                    group="user:7", lifo=False, keep_logs=None, jobId="mail-2", removeOnFail=True)
    opts: JobOptions = {"attempts": 2, "remove_on_fail": 5}
    await queue.add("send", {}, **opts)
"""


async def test_mypy_checks_the_options_of_queue_add(redis_url, queue_name, tmp_path):
    (tmp_path / "good.py").write_text(_TYPED_GOOD)
    (tmp_path / "bad_type.py").write_text(
        "from bullmq_compat import Queue\n\nasync def main(queue: Queue) -> None:\n"
        "    await queue.add('send', {}, attempts='x')\n")
    (tmp_path / "bad_name.py").write_text(
        "from bullmq_compat import Queue\n\nasync def main(queue: Queue) -> None:\n"
        "    await queue.add('send', {}, atempts=3)\n")
    env = {**os.environ, "MYPYPATH": str(ROOT)}  # an editable install's import hook is not seen by mypy
    run = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.10",
                         "--follow-imports", "silent", "--no-error-summary", "good.py", "bad_type.py", "bad_name.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert [line for line in lines if line.startswith("good.py")] == [], run.stdout
    assert any(line.startswith("bad_type.py:4:") and '"attempts"' in line and "[arg-type]" in line
               for line in lines), run.stdout + run.stderr
    assert any(line.startswith("bad_name.py:4:") and '"atempts"' in line and "[call-arg]" in line
               for line in lines), run.stdout + run.stderr
    assert len(lines) == 2, run.stdout
    # at run time nothing changed: the unknown option is still refused, naming it
    queue = Queue(queue_name, redis_url)
    try:
        with pytest.raises(InvalidJobOptions, match="unknown job option 'atempts'"):
            await queue.add("send", {}, atempts=3)  # type: ignore[call-arg]
        with pytest.raises(InvalidJobOptions, match="attempts='x'"):
            await queue.add("send", {}, attempts="x")  # type: ignore[arg-type]
    finally:
        await queue.close()


_UNITS = {"lock_duration": "ms", "lock_renew_time": "ms", "stalled_interval": "ms", "run_retry_delay": "ms",
          "maximum_rate_limit_delay": "ms", "drain_delay": "seconds", "shutdown_timeout": "seconds",
          "group_sweep_interval": "seconds"}


def _docstring_entries(doc: str) -> dict[str, str]:
    """``name, other: text`` entries of a docstring (indented lines continue the entry above)."""
    texts: list[str] = []
    names: dict[str, int] = {}
    for line in doc.splitlines():
        head = line.split(":", 1)[0]
        if ":" in line and not line.startswith(" ") and all(n.strip().isidentifier() for n in head.split(",")):
            texts.append(line.split(":", 1)[1])
            names.update({n.strip(): len(texts) - 1 for n in head.split(",")})
        elif line.startswith(" ") and texts:
            texts[-1] += " " + line.strip()
    return {name: texts[i] for name, i in names.items()}


@pytest.mark.parametrize("cls", [Worker, Queue], ids=lambda c: c.__name__)
def test_init_docstring_names_every_keyword_and_each_durations_unit(cls):
    doc = inspect.getdoc(cls.__init__) or ""
    entries = _docstring_entries(doc)
    keywords = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "name", "queue_name")]
    assert keywords and [k for k in keywords if k not in entries] == [], doc
    for keyword, unit in _UNITS.items():
        if keyword in keywords:
            assert unit in entries[keyword], (keyword, entries[keyword])


# -- 6. the package's exports -------------------------------------------------------------------

def test_the_package_exports_resolve_sorted_and_unique():
    import bullmq_compat

    names = bullmq_compat.__all__
    assert [name for name in names if not hasattr(bullmq_compat, name)] == []
    assert names == sorted(names)
    assert len(names) == len(set(names))
    assert {"QueueClosed", "JobOptions", "Queue", "Worker", "FlowProducer", "__version__"} <= set(names)


def test_every_exported_exception_is_in_bullmq_compat_errors():
    import bullmq_compat
    import bullmq_compat.errors as errors

    exported = {name for name in bullmq_compat.__all__
                if isinstance(getattr(bullmq_compat, name), type) and issubclass(getattr(bullmq_compat, name), BaseException)}
    assert {"QueueClosed", "JobNotFound", "GroupJobRefused", "ChildCrashed", "AbortError", "WaitingError"} <= exported
    assert set(errors.__all__) == exported
    assert errors.__all__ == sorted(errors.__all__)
    for name in errors.__all__:
        assert getattr(errors, name) is getattr(bullmq_compat, name), name
        assert issubclass(getattr(errors, name), bullmq_compat.BullMQCompatError), name
    from bullmq_compat.errors import JobNotFound, QueueClosed

    assert QueueClosed is bullmq_compat.QueueClosed and JobNotFound is bullmq_compat.JobNotFound


def test_the_package_imports_in_a_fresh_interpreter():
    run = subprocess.run([sys.executable, "-c", "import bullmq_compat.errors, bullmq_compat; "
                          "print(len(bullmq_compat.__all__))"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and int(run.stdout) > 60, run.stderr
