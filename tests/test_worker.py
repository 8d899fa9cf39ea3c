"""The Python Worker on Python-added jobs: results, retries and backoff, processor-raised
control errors, events, manual processing, and jobs it cannot read (issue #3)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from bullmq_compat import (
    DelayedError,
    InvalidArgument,
    Job,
    JobLockMismatch,
    JobLockNotFound,
    Queue,
    ScriptError,
    UnrecoverableError,
    WaitingChildrenError,
    Worker,
    _backoff,
)
from bullmq_compat._backoff import builtin_delay, retry_delay
from tests.helpers import EventRecorder, wait_until

FAST = {"drain_delay": 0.5}
# delays are whole milliseconds (floored), so a measured gap can be a hair under the delay
EPS = 0.005


class Events(EventRecorder):
    """A worker's events, with a wait for them."""

    async def wait(self, name: str, count: int = 1, timeout: float = 30.0) -> list[tuple[Any, ...]]:
        await wait_until(lambda: len(self.of(name)) >= count, timeout, f"{count} {name!r} event(s)")
        return self.of(name)


@pytest.fixture
async def queue(redis_url: str, queue_name: str):
    q = Queue(queue_name, connection=redis_url)
    try:
        yield q
    finally:
        await q.close()


def make_worker(redis_url: str, queue_name: str, processor: Any = None, **kwargs: Any) -> Worker:
    return Worker(queue_name, processor, connection=redis_url, **{**FAST, **kwargs})


async def _state_is(queue: Queue, job_id: str, *states: str) -> bool:
    return await queue.get_job_state(job_id) in states


async def finished(queue: Queue, job_id: str, timeout: float = 10.0) -> Job:
    """The job once it is completed or failed."""
    async def done() -> Any:
        return await queue.get_job_state(job_id) in ("completed", "failed")
    await wait_until(done, timeout, f"job {job_id} to finish")
    job = await queue.get_job(job_id)
    assert job is not None
    return job


# -- processing Python-added jobs ----------------------------------------------------------------
async def test_results_processed_by_attempts_and_completed_event(redis_url: str, queue_name: str,
                                                                 queue: Queue, redis: Any) -> None:
    async def process(job: Job) -> Any:
        return {"double": job.data["i"] * 2, "name": job.name}

    jobs = [await queue.add("calc", {"i": i}) for i in range(3)]
    worker = make_worker(redis_url, queue_name, process, name="py-worker-1")
    events = Events(worker, "completed")
    before = int(time.time() * 1000)
    async with worker:
        completed = await events.wait("completed", 3)

    for source in jobs:
        job = await queue.get_job(source.id)
        assert job is not None
        assert await job.get_state() == "completed"
        assert job.returnvalue == {"double": source.data["i"] * 2, "name": "calc"}
        assert job.processed_by == "py-worker-1"
        assert (await redis.hget(f"bull:{queue_name}:{source.id}", "pb")) == "py-worker-1"
        assert job.attempts_made == 1 and job.attempts_started == 1
        assert before <= job.processed_on <= job.finished_on
        assert job.failed_reason is None and job.stacktrace == []
        # the stored value is the JSON text Node's JSON.parse reads
        assert json.loads(await redis.hget(f"bull:{queue_name}:{source.id}", "returnvalue")) == job.returnvalue

    ids = [job.id for job, _, _ in completed]
    assert ids == [j.id for j in jobs]  # FIFO at concurrency 1
    for job, result, prev in completed:
        assert isinstance(job, Job)
        assert result == {"double": job.data["i"] * 2, "name": "calc"}
        assert prev == "active"
        assert job.returnvalue == result and job.attempts_made == 1
    assert await queue.get_job_counts("completed", "active", "waiting") == {
        "completed": 3, "active": 0, "waiting": 0}


async def test_plain_def_processor_runs_in_a_thread(redis_url: str, queue_name: str, queue: Queue) -> None:
    main_thread = threading.get_ident()
    threads: list[tuple[int, str]] = []

    def process(job: Job) -> str:
        threads.append((threading.get_ident(), threading.current_thread().name))
        time.sleep(0.02)  # blocking is fine: the event loop is not this thread
        return f"sync:{job.data['v']}"

    added = [await queue.add("sync", {"v": i}) for i in range(2)]
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed", 2)

    assert len(threads) == 2
    assert all(ident != main_thread for ident, _ in threads)
    assert all(name.startswith("bullmq-") for _, name in threads)
    for i, job in enumerate(added):
        assert (await queue.get_job(job.id)).returnvalue == f"sync:{i}"


async def echo_processor(job: Job) -> Any:
    """Used by path: 'tests.test_worker:echo_processor'."""
    return {"echo": job.data}


async def test_processor_given_as_module_path(redis_url: str, queue_name: str, queue: Queue) -> None:
    job = await queue.add("p", {"x": 1})
    worker = make_worker(redis_url, queue_name, "tests.test_worker:echo_processor")
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed")
    assert (await queue.get_job(job.id)).returnvalue == {"echo": {"x": 1}}
    with pytest.raises(InvalidArgument, match="no attribute"):
        make_worker(redis_url, queue_name, "tests.test_worker:no_such_function")


async def test_fetch_next_keeps_move_to_active_calls_few(redis_url: str, queue_name: str,
                                                         queue: Queue, monkeypatch: Any) -> None:
    total = 200
    await queue.add_bulk([{"name": "n", "data": {"i": i}} for i in range(total)])
    processed: list[int] = []

    async def process(job: Job) -> int:
        processed.append(job.data["i"])
        return job.data["i"]

    from bullmq_compat._backends.redis.worker_calls import WorkerCalls

    worker = make_worker(redis_url, queue_name, process, concurrency=1, drain_delay=5)
    calls = 0
    original = WorkerCalls.move_to_active

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(WorkerCalls, "move_to_active", counting)
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed", total, timeout=30)
    assert processed == list(range(total))
    # one moveToActive to start; every later job arrives with the previous job's moveToFinished
    assert calls <= 3, calls
    assert (await queue.get_job_counts("completed"))["completed"] == total


# -- retries and backoff -------------------------------------------------------------------------
class Flaky:
    """A processor failing its first ``fail_times`` calls; records when each call started."""

    def __init__(self, fail_times: int, message: str = "flaky failure") -> None:
        self.fail_times = fail_times
        self.message = message
        self.starts: list[float] = []
        self.states_seen: list[int] = []

    async def __call__(self, job: Job) -> Any:
        self.starts.append(time.monotonic())
        self.states_seen.append(job.attempts_made)
        if len(self.starts) <= self.fail_times:
            raise RuntimeError(f"{self.message} #{len(self.starts)}")
        return {"after": len(self.starts)}

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:])]


async def test_fails_twice_then_succeeds_with_three_attempts(redis_url: str, queue_name: str,
                                                             queue: Queue) -> None:
    flaky = Flaky(2)
    added = await queue.add("retry", {}, attempts=3)
    worker = make_worker(redis_url, queue_name, flaky)
    events = Events(worker, "completed", "failed")
    async with worker:
        await events.wait("completed")
    job = await queue.get_job(added.id)
    assert await job.get_state() == "completed"
    assert job.returnvalue == {"after": 3}
    assert job.attempts_made == 3 and job.attempts_started == 3
    assert flaky.states_seen == [0, 1, 2]  # the processor sees attempts_made of earlier attempts
    # each failed attempt is reported, as Node's worker does, before the retry
    assert [(j.id, str(e), prev) for j, e, prev in events.of("failed")] == [
        (added.id, "flaky failure #1", "active"), (added.id, "flaky failure #2", "active")]
    assert job.failed_reason == "flaky failure #2"  # the last failure's reason stays, as in Node
    assert len(job.stacktrace) == 2


async def test_fixed_backoff_delays_the_retry(redis_url: str, queue_name: str, queue: Queue) -> None:
    flaky = Flaky(1)
    added = await queue.add("fixed", {}, attempts=2, backoff={"type": "fixed", "delay": 1000})
    worker = make_worker(redis_url, queue_name, flaky)
    events = Events(worker, "completed", "failed")
    async with worker:
        await events.wait("failed")
        state = await queue.get_job_state(added.id)
        delayed = (await queue.get_job_counts("delayed"))["delayed"]
        if time.monotonic() - flaky.starts[0] < 0.9:  # looked before it was due (a slow machine may not)
            assert (state, delayed) == ("delayed", 1)
        await events.wait("completed")
    assert len(flaky.starts) == 2
    assert 1.0 - EPS <= flaky.gaps()[0] < 4.0, flaky.gaps()
    job = await queue.get_job(added.id)
    assert job.attempts_made == 2 and job.returnvalue == {"after": 2}


async def test_numeric_backoff_is_fixed(redis_url: str, queue_name: str, queue: Queue) -> None:
    flaky = Flaky(1)
    added = await queue.add("num", {}, attempts=2, backoff=300)
    assert added.opts["backoff"] == {"type": "fixed", "delay": 300}
    worker = make_worker(redis_url, queue_name, flaky)
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed")
    assert flaky.gaps()[0] >= 0.3 - EPS


async def test_exponential_backoff_doubles(redis_url: str, queue_name: str, queue: Queue) -> None:
    flaky = Flaky(3)
    await queue.add("exp", {}, attempts=4, backoff={"type": "exponential", "delay": 150})
    worker = make_worker(redis_url, queue_name, flaky)
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed", timeout=15)
    gaps = flaky.gaps()
    assert len(gaps) == 3
    for gap, expected in zip(gaps, (0.15, 0.3, 0.6)):
        assert expected - EPS <= gap < expected + 2.5, gaps


async def test_fixed_backoff_with_jitter_waits_within_bounds(redis_url: str, queue_name: str,
                                                             queue: Queue) -> None:
    flaky = Flaky(1)
    await queue.add("jit", {}, attempts=2, backoff={"type": "fixed", "delay": 600, "jitter": 0.5})
    worker = make_worker(redis_url, queue_name, flaky)
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed")
    assert 0.3 - EPS <= flaky.gaps()[0] < 0.6 + 2.5, flaky.gaps()


def test_builtin_delay_matches_node_formulas(monkeypatch: pytest.MonkeyPatch) -> None:
    assert builtin_delay({"type": "fixed", "delay": 1000}, 1) == 1000
    assert builtin_delay({"type": "fixed", "delay": 1000}, 5) == 1000
    assert [builtin_delay({"type": "exponential", "delay": 100}, n) for n in (1, 2, 3, 4)] == [
        100, 200, 400, 800]
    assert builtin_delay({"type": "exponential"}, 3) == 0
    assert builtin_delay({"type": "custom", "delay": 5}, 1) is None
    assert builtin_delay({"type": "no-such"}, 1) is None

    # jitter: Math.floor(random * d * jitter + d * (1 - jitter)), at both ends of random()
    monkeypatch.setattr(_backoff.random, "random", lambda: 0.0)
    assert builtin_delay({"type": "fixed", "delay": 1000, "jitter": 0.25}, 1) == 750
    assert builtin_delay({"type": "exponential", "delay": 100, "jitter": 1}, 3) == 0
    monkeypatch.setattr(_backoff.random, "random", lambda: 0.999999)
    assert builtin_delay({"type": "fixed", "delay": 1000, "jitter": 0.25}, 1) == 999
    assert builtin_delay({"type": "exponential", "delay": 100, "jitter": 0.5}, 3) == 399
    monkeypatch.undo()

    for _ in range(500):
        fixed = builtin_delay({"type": "fixed", "delay": 1000, "jitter": 0.3}, 1)
        assert 700 <= fixed <= 1000
        exp = builtin_delay({"type": "exponential", "delay": 100, "jitter": 0.5}, 4)
        assert 400 <= exp <= 800
        assert isinstance(fixed, int) and isinstance(exp, int)


async def test_retry_delay_custom_and_errors() -> None:
    err = RuntimeError("x")
    assert await retry_delay(None, 1, err, None, None) == 0
    assert await retry_delay(250, 1, err, None, None) == 250

    seen: list[tuple[Any, ...]] = []

    async def strategy(attempts_made: int, kind: str, error: BaseException, job: Any) -> int:
        seen.append((attempts_made, kind, error, job))
        return attempts_made * 10

    assert await retry_delay({"type": "mine"}, 3, err, "job", strategy) == 30
    assert seen == [(3, "mine", err, "job")]
    with pytest.raises(ValueError, match="Unknown backoff strategy 'mine'"):
        await retry_delay({"type": "mine"}, 1, err, None, None)


async def test_custom_backoff_strategy(redis_url: str, queue_name: str, queue: Queue) -> None:
    calls: list[tuple[Any, ...]] = []

    def strategy(attempts_made: int, kind: str, err: BaseException, job: Job) -> int:
        calls.append((attempts_made, kind, str(err), type(err).__name__, job.id))
        return 250 * attempts_made

    flaky = Flaky(2)
    added = await queue.add("custom", {}, attempts=3, backoff={"type": "custom"})
    worker = make_worker(redis_url, queue_name, flaky, backoff_strategy=strategy)
    events = Events(worker, "completed", "failed")
    async with worker:
        await events.wait("failed")
        assert await queue.get_job_state(added.id) == "delayed"
        await events.wait("completed")
    assert calls == [(1, "custom", "flaky failure #1", "RuntimeError", added.id),
                     (2, "custom", "flaky failure #2", "RuntimeError", added.id)]
    gaps = flaky.gaps()
    assert gaps[0] >= 0.25 - EPS and gaps[1] >= 0.5 - EPS, gaps
    assert (await queue.get_job(added.id)).attempts_made == 3


async def test_custom_backoff_returning_minus_one_stops_retrying(redis_url: str, queue_name: str,
                                                                 queue: Queue) -> None:
    flaky = Flaky(5, "no more")
    added = await queue.add("custom", {}, attempts=5, backoff={"type": "custom"})
    worker = make_worker(redis_url, queue_name, flaky, backoff_strategy=lambda *a: -1)
    async with worker:
        job = await finished(queue, added.id)
    assert await job.get_state() == "failed"
    assert job.attempts_made == 1 and job.failed_reason == "no more #1"


async def test_unknown_backoff_type_without_strategy_fails_the_job(redis_url: str, queue_name: str,
                                                                   queue: Queue) -> None:
    added = await queue.add("custom", {}, attempts=3, backoff={"type": "custom"})
    worker = make_worker(redis_url, queue_name, Flaky(5, "oops"))
    async with worker:
        job = await finished(queue, added.id)
    assert await job.get_state() == "failed"
    assert job.attempts_made == 1
    assert job.failed_reason.startswith("oops #1")
    assert "Unknown backoff strategy 'custom'" in job.failed_reason


async def test_unrecoverable_error_fails_at_once(redis_url: str, queue_name: str, queue: Queue) -> None:
    calls = 0

    async def process(job: Job) -> None:
        nonlocal calls
        calls += 1
        raise UnrecoverableError("cannot ever work")

    added = await queue.add("doomed", {}, attempts=5, backoff={"type": "fixed", "delay": 10})
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "failed")
    async with worker:
        job = await finished(queue, added.id)
        await events.wait("failed")
    assert calls == 1
    assert await job.get_state() == "failed"
    assert job.attempts_made == 1
    assert job.failed_reason == "cannot ever work"
    assert "UnrecoverableError: cannot ever work" in job.stacktrace[-1]
    (failed_job, err, prev), = events.of("failed")
    assert isinstance(err, UnrecoverableError) and prev == "active" and failed_job.id == added.id


def _raise_deep(message: str) -> None:
    raise ValueError(message)


async def test_attempts_exhausted_keeps_reason_and_python_traceback(redis_url: str, queue_name: str,
                                                                    queue: Queue) -> None:
    raised: list[BaseException] = []

    async def process(job: Job) -> None:
        try:
            _raise_deep(f"bad input {job.attempts_made}")
        except ValueError as err:
            raised.append(err)
            raise

    added = await queue.add("bad", {}, attempts=2)
    worker = make_worker(redis_url, queue_name, process)
    async with worker:
        job = await finished(queue, added.id)
    assert await job.get_state() == "failed"
    assert job.attempts_made == 2
    assert job.failed_reason == str(raised[-1]) == "bad input 1"
    assert isinstance(job.stacktrace, list) and len(job.stacktrace) == 2
    last = job.stacktrace[-1]
    assert last.startswith("Traceback (most recent call last):")
    assert "_raise_deep" in last and "test_worker.py" in last
    assert last.endswith("ValueError: bad input 1")
    assert job.stacktrace[0].endswith("ValueError: bad input 0")


@pytest.mark.parametrize("limit, expected", [(1, ["boom 2"]), (2, ["boom 1", "boom 2"]), (0, [])])
async def test_stack_trace_limit(redis_url: str, queue_name: str, queue: Queue, limit: int,
                                 expected: list[str]) -> None:
    async def process(job: Job) -> None:
        raise RuntimeError(f"boom {job.attempts_made}")

    added = await queue.add("st", {}, attempts=3, stack_trace_limit=limit)
    worker = make_worker(redis_url, queue_name, process)
    async with worker:
        job = await finished(queue, added.id)
    assert job.attempts_made == 3 and job.failed_reason == "boom 2"
    assert [trace.rsplit("RuntimeError: ", 1)[-1] for trace in job.stacktrace] == expected


async def test_max_started_attempts_stops_retries(redis_url: str, queue_name: str, queue: Queue) -> None:
    flaky = Flaky(10, "again")
    added = await queue.add("m", {}, attempts=5)
    worker = make_worker(redis_url, queue_name, flaky, max_started_attempts=2)
    async with worker:
        job = await finished(queue, added.id)
    # as Node's shouldRetryJob: no retry once attempts_started reaches max_started_attempts
    assert await job.get_state() == "failed"
    assert len(flaky.starts) == 2
    assert (job.attempts_made, job.attempts_started, job.failed_reason) == (2, 2, "again #2")


# -- DelayedError and WaitingChildrenError -------------------------------------------------------
async def test_delayed_error_moves_the_job_to_delayed_and_it_runs_again(
        redis_url: str, queue_name: str, queue: Queue) -> None:
    runs: list[tuple[float, int, int]] = []

    async def process(job: Job, token: str) -> Any:
        runs.append((time.monotonic(), job.attempts_made, job.attempts_started))
        if len(runs) == 1:
            await job.move_to_delayed(int(time.time() * 1000) + 400, token)
            raise DelayedError()
        return "second run"

    added = await queue.add("later", {}, attempts=1)
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "completed", "failed")
    async with worker:
        await wait_until(lambda: _state_is(queue, added.id, "delayed"), what="job delayed")
        assert len(runs) == 1
        await events.wait("completed")
    assert events.of("failed") == []  # a DelayedError is not a failure
    assert runs[1][0] - runs[0][0] >= 0.4 - EPS
    job = await queue.get_job(added.id)
    assert await job.get_state() == "completed" and job.returnvalue == "second run"
    # moving to delayed from the processor does not use an attempt (skipAttempt, as Node)
    assert [r[1] for r in runs] == [0, 0]
    assert job.attempts_made == 1 and job.attempts_started == 2
    assert job.failed_reason is None


async def test_waiting_children_without_children_returns_false(redis_url: str, queue_name: str,
                                                               queue: Queue) -> None:
    """With no pending children, move_to_waiting_children() moves nothing and returns False (as
    Node's moveToWaitingChildren resolves false): the job stays active, and the processor goes on
    and finishes it. Raising WaitingChildrenError then would leave it active until it stalls."""
    outcomes: list[bool] = []

    async def process(job: Job, token: str) -> Any:
        moved = await job.move_to_waiting_children(token)
        outcomes.append(moved)
        if moved:
            raise WaitingChildrenError()
        assert await job.get_state() == "active"
        return "no children to wait for"

    added = await queue.add("parent", {})
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "completed")
    async with worker:
        await events.wait("completed")
    assert outcomes == [False]
    job = await queue.get_job(added.id)
    assert await job.get_state() == "completed" and job.returnvalue == "no children to wait for"


async def test_waiting_children_with_a_pending_child(redis_url: str, queue_name: str, queue: Queue,
                                                     redis: Any) -> None:
    """A job with a pending dependency moves to waiting-children; the worker leaves it there."""
    outcomes: list[bool] = []

    async def process(job: Job, token: str) -> Any:
        # what adding a child with opts.parent does to the parent's dependencies set
        await redis.sadd(f"bull:{queue_name}:{job.id}:dependencies", f"bull:{queue_name}:child-1")
        moved = await job.move_to_waiting_children(token)
        outcomes.append(moved)
        if moved:
            raise WaitingChildrenError()
        return "unexpected"

    added = await queue.add("parent", {})
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "completed", "failed", "error")
    async with worker:
        await wait_until(lambda: _state_is(queue, added.id, "waiting-children"), what="waiting-children")
        await asyncio.sleep(0.1)
    assert outcomes == [True]
    assert events.seen == []
    assert await queue.get_job_counts("active", "waiting-children") == {"active": 0, "waiting-children": 1}


# -- events --------------------------------------------------------------------------------------
async def test_active_progress_completed_failed_and_drained_events(redis_url: str, queue_name: str,
                                                                   queue: Queue) -> None:
    async def process(job: Job) -> Any:
        await job.update_progress(50)
        await job.update_progress({"step": "done", "pct": 100})
        if job.data.get("fail"):
            raise RuntimeError("asked to fail")
        return job.data["i"]

    ok = await queue.add("ok", {"i": 1})
    bad = await queue.add("bad", {"i": 2, "fail": True})
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "active", "progress", "completed", "failed", "drained", "error")
    async with worker:
        await events.wait("failed")
        await events.wait("drained")

    assert [(j.id, prev) for j, prev in events.of("active")] == [(ok.id, "waiting"), (bad.id, "waiting")]
    assert [(j.id, p) for j, p in events.of("progress")] == [
        (ok.id, 50), (ok.id, {"step": "done", "pct": 100}),
        (bad.id, 50), (bad.id, {"step": "done", "pct": 100})]
    assert [(j.id, r, prev) for j, r, prev in events.of("completed")] == [(ok.id, 1, "active")]
    (job, err, prev), = events.of("failed")
    assert (job.id, str(err), type(err), prev) == (bad.id, "asked to fail", RuntimeError, "active")
    assert job.failed_reason == "asked to fail"
    assert events.of("drained") and all(args == () for args in events.of("drained"))
    assert events.of("error") == []
    # the order a listener sees: active, progress..., then completed or failed
    names = [name for name, _ in events.seen if name != "drained"]
    assert names == ["active", "progress", "progress", "completed", "active", "progress", "progress", "failed"]
    stored = await queue.get_job(ok.id)
    assert stored.progress == {"step": "done", "pct": 100}


async def test_drained_is_emitted_once_per_empty_spell(redis_url: str, queue_name: str, queue: Queue) -> None:
    worker = make_worker(redis_url, queue_name, lambda job: None, drain_delay=0.2)
    events = Events(worker, "drained", "completed")
    async with worker:
        await events.wait("drained")
        await asyncio.sleep(0.6)  # several empty block timeouts: no new 'drained'
        assert len(events.of("drained")) == 1
        await queue.add("x", {})
        await events.wait("completed")
        await events.wait("drained", 2)


async def test_raising_listeners_do_not_break_the_worker(redis_url: str, queue_name: str, queue: Queue,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    def bad_listener(*args: Any) -> None:
        raise RuntimeError("listener bug")

    async def bad_async_listener(*args: Any) -> None:
        raise RuntimeError("async listener bug")

    worker = make_worker(redis_url, queue_name, lambda job: job.data["i"])
    for name in ("active", "completed", "drained", "error"):
        worker.on(name, bad_listener)
        worker.on(name, bad_async_listener)
    events = Events(worker, "completed", "error")
    added = await queue.add_bulk([{"name": "n", "data": {"i": i}} for i in range(5)])
    with caplog.at_level("ERROR"):
        async with worker:
            await events.wait("completed", 5)
    assert [j.id for j, _, _ in events.of("completed")] == [j.id for j in added]
    assert events.of("error") == []  # a listener's failure is logged, not turned into 'error'
    assert "listener bug" in caplog.text


async def test_error_event_when_a_job_loses_its_lock(redis_url: str, queue_name: str, queue: Queue,
                                                     redis: Any) -> None:
    async def process(job: Job) -> Any:
        if job.data.get("steal"):
            await redis.delete(f"bull:{queue_name}:{job.id}:lock")  # as if the lock expired
        return "done"

    stolen = await queue.add("stolen", {"steal": True})
    after = await queue.add("after", {})
    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "completed", "error")
    worker.on("error", lambda err: (_ for _ in ()).throw(RuntimeError("error listener bug")))
    async with worker:
        (err,), = await events.wait("error")
        await events.wait("completed")
    assert isinstance(err, JobLockNotFound)
    assert str(err) == f"Missing lock for job {stolen.id}. moveToFinished"
    # the worker went on with the next job
    assert [j.id for j, _, _ in events.of("completed")] == [after.id]
    assert await queue.get_job_state(stolen.id) == "active"  # left for the stalled checker, as Node


# -- manual processing ---------------------------------------------------------------------------
async def test_manual_processing(redis_url: str, queue_name: str, queue: Queue, redis: Any) -> None:
    first = await queue.add("one", {"n": 1})
    second = await queue.add("two", {"n": 2}, attempts=1)
    worker = make_worker(redis_url, queue_name, name="manual", lock_duration=5000)
    try:
        events = Events(worker, "active", "completed")
        job = await worker.get_next_job("token-1")
        assert job is not None and (job.id, job.name, job.data) == (first.id, "one", {"n": 1})
        assert job.token == "token-1"
        assert await job.get_state() == "active"
        lock_key = f"bull:{queue_name}:{job.id}:lock"
        assert await redis.get(lock_key) == "token-1"
        assert 0 < await redis.pttl(lock_key) <= 5000

        await job.extend_lock("token-1", 60000)
        assert 5000 < await redis.pttl(lock_key) <= 60000

        await job.move_to_completed({"manual": True}, "token-1")
        assert await job.get_state() == "completed"
        assert job.returnvalue == {"manual": True} and job.attempts_made == 1
        stored = await queue.get_job(job.id)
        assert stored.returnvalue == {"manual": True} and stored.processed_by == "manual"
        assert await redis.exists(lock_key) == 0

        job2 = await worker.get_next_job("token-2")
        assert job2 is not None and job2.id == second.id
        await job2.move_to_failed(ValueError("manual failure"), "token-2")
        stored = await queue.get_job(job2.id)
        assert await stored.get_state() == "failed"
        assert stored.failed_reason == "manual failure" and stored.attempts_made == 1

        assert await worker.get_next_job("token-3", block=False) is None
        started = time.monotonic()
        assert await worker.get_next_job("token-3") is None  # blocks up to drain_delay
        assert time.monotonic() - started < 10
        assert [j.id for j, _ in events.of("active")] == [first.id, second.id]
        assert events.of("completed") == []  # finishing by hand emits no worker event
    finally:
        await worker.close()


async def test_manual_processing_with_a_wrong_token(redis_url: str, queue_name: str, queue: Queue,
                                                    redis: Any) -> None:
    added = await queue.add("one", {"n": 1}, attempts=2)
    worker = make_worker(redis_url, queue_name)
    try:
        job = await worker.get_next_job("right")
        assert job is not None and job.id == added.id

        with pytest.raises(JobLockMismatch) as info:
            await job.move_to_completed("nope", "wrong")
        assert isinstance(info.value, ScriptError) and info.value.code == -6
        assert str(info.value) == f"Lock mismatch for job {added.id}. Cmd moveToFinished from active"

        with pytest.raises(JobLockMismatch):
            await job.move_to_failed(RuntimeError("nope"), "wrong")  # a retry (attempts=2): retryJob
        with pytest.raises(JobLockNotFound):
            await job.extend_lock("wrong", 1000)

        # nothing changed: still active, locked by the right token
        assert await job.get_state() == "active"
        assert await redis.get(f"bull:{queue_name}:{added.id}:lock") == "right"
        fresh = await queue.get_job(added.id)
        assert fresh.attempts_made == 0 and fresh.returnvalue is None

        job.attempts_made = 0
        await job.move_to_completed("yes", "right")
        assert (await queue.get_job(added.id)).returnvalue == "yes"
        with pytest.raises(ScriptError):  # finished already: no longer locked or active
            await job.move_to_completed("again", "right")
    finally:
        await worker.close()


# -- values and jobs the worker cannot store or read ---------------------------------------------
class NotJson:
    def __repr__(self) -> str:
        return "<NotJson>"


@pytest.mark.parametrize("value, detail", [
    (NotJson(), "Object of type NotJson is not JSON serializable"),
    ({1, 2}, "Object of type set is not JSON serializable"),
    (float("nan"), "Out of range float values are not JSON compliant"),
])
async def test_non_json_return_value_fails_the_job(redis_url: str, queue_name: str, queue: Queue,
                                                   value: Any, detail: str) -> None:
    async def process(job: Job) -> Any:
        return value

    added = await queue.add("v", {})
    after = await queue.add("after", {})
    worker = make_worker(redis_url, queue_name, process if not isinstance(value, NotJson)
                         else (lambda job: value))
    async with worker:
        job = await finished(queue, added.id)
        await finished(queue, after.id)
    assert await job.get_state() == "failed"
    assert job.failed_reason.startswith(f"job return value {value!r} is not JSON-serialisable")
    assert detail in job.failed_reason
    assert job.returnvalue is None and job.attempts_made == 1
    assert "InvalidJobData" in job.stacktrace[-1]
    assert await queue.get_job_state(after.id) == "failed"  # same processor, same fate


@pytest.mark.parametrize("corrupt, reason", [
    ({"data": "{not json"}, "data is not JSON"),
    ({"opts": "{broken"}, "opts is not a JSON object"),
    ({"opts": "[1, 2]"}, "opts is not a JSON object"),
    ({"name": None}, "the job hash has no name"),
    ({"data": "\x00\x01", "name": None}, "data is not JSON"),
])
async def test_corrupt_job_hash_fails_that_job_only(redis_url: str, queue_name: str, queue: Queue,
                                                    redis: Any, corrupt: dict[str, Any], reason: str) -> None:
    before = await queue.add("good", {"i": 0})
    broken = await queue.add("broken", {"i": 1}, attempts=3)
    after = await queue.add("good", {"i": 2})
    key = f"bull:{queue_name}:{broken.id}"
    for field, value in corrupt.items():
        if value is None:
            await redis.hdel(key, field)
        else:
            await redis.hset(key, field, value)
    seen: list[str] = []

    async def process(job: Job) -> Any:
        seen.append(job.id)
        return job.data["i"]

    worker = make_worker(redis_url, queue_name, process)
    events = Events(worker, "completed", "failed", "error")
    async with worker:
        job = await finished(queue, broken.id)
        await finished(queue, after.id)
    assert seen == [before.id, after.id]  # the processor never sees the unreadable job
    assert await job.get_state() == "failed"
    assert job.failed_reason.startswith(f"job {broken.id} cannot be processed: ")
    assert reason in job.failed_reason
    assert job.attempts_made == 1  # unreadable is unrecoverable: no retries
    assert [j.id for j, _, _ in events.of("completed")] == [before.id, after.id]
    assert [j.id for j, _, _ in events.of("failed")] == [broken.id]
    assert events.of("error") == []


async def test_a_worker_starting_on_a_fresh_redis_loads_each_script_once() -> None:
    """All of a worker's slots start at once and find Redis without the scripts: it loads each
    once (SCRIPT LOAD) instead of sending a script's text with every slot's first call (EVAL)."""
    import redis.asyncio as aioredis

    from tests._redis_server import RedisServer

    server = RedisServer().start()
    admin = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        async with Queue("fresh", connection=server.url) as queue:
            await queue.add_bulk([{"name": "j", "data": {"i": i}} for i in range(60)])
            await admin.script_flush()
            await admin.config_resetstat()
            done: list[str] = []

            async def process(job: Job) -> None:
                done.append(job.id)

            worker = Worker("fresh", process, connection=server.url, concurrency=20)
            async with worker:
                await wait_until(lambda: len(done) == 60, 15, "60 jobs")
            stats = await admin.info("commandstats")
            assert "cmdstat_eval" not in stats, stats.get("cmdstat_eval")
            assert 1 <= stats["cmdstat_script|load"]["calls"] <= 4, stats["cmdstat_script|load"]
    finally:
        await admin.aclose()
        server.stop()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "redis-py"])
async def test_a_worker_busy_from_its_first_job_is_listed_by_get_workers(redis_url: str, queue_name: str,
                                                                         queue: Queue, fast_path: bool) -> None:
    """Node's worker names its blocking connection when it starts; ours too, so a worker that has never
    had to wait for a job (a backlog, concurrency 1) is in CLIENT LIST, getWorkers and Bull-Board."""
    await queue.add_bulk([{"name": "long", "data": {}} for _ in range(3)])
    started, release = asyncio.Event(), asyncio.Event()

    async def process(job: Any) -> None:
        started.set()
        await release.wait()

    worker = Worker(queue_name, process, redis_url, fast_path=fast_path, name="busy-one")
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await asyncio.wait_for(started.wait(), 30)
        workers = await wait_until(queue.get_workers, 30, "the busy worker in getWorkers")
        assert len(workers) == 1 and workers[0]["rawname"].endswith("busy-one")
        assert await queue.get_workers_count() == 1
    finally:
        release.set()
        await worker.close()
        await task
    assert await wait_until(lambda: _no_workers(queue), 30, "the worker gone from getWorkers")


async def _no_workers(queue: Queue) -> bool:
    return await queue.get_workers() == []
