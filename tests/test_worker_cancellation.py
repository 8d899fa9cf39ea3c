"""Job cancellation as Node BullMQ 6 has it: processors of (job), (job, token), (job, token, signal);
AbortSignal/AbortController/AbortError; worker.cancel_job / cancel_all_jobs; what happens to the
job afterwards (Node's: failed, retried while attempts remain, not after UnrecoverableError),
in-process, in threads and with use_processes=True; and the same cancellations run by Node's
Worker (interop/cancel.js), read back by Node."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from bullmq_compat import (
    AbortController,
    AbortError,
    AbortSignal,
    InvalidArgument,
    Job,
    Queue,
    UnrecoverableError,
    Worker,
)
from tests.helpers import a_queue, running, wait_until
from tests.node_scripts import run_script


# -- the signal itself ------------------------------------------------------------------------------
def test_abort_signal_reason_listeners_and_throw() -> None:
    controller = AbortController()
    signal = controller.signal
    assert isinstance(signal, AbortSignal) and not signal.aborted and signal.reason is None
    signal.throw_if_aborted()  # nothing while not aborted
    calls: list[str] = []
    keep = lambda: calls.append("keep")  # noqa: E731
    removed = lambda: calls.append("removed")  # noqa: E731
    signal.add_listener(keep)
    signal.add_listener(keep)  # the same function once, as addEventListener
    signal.add_listener(removed)
    signal.remove_listener(removed)
    controller.abort("user asked")
    controller.abort("second abort is ignored")
    assert signal.aborted and signal.reason == "user asked" and calls == ["keep"]
    with pytest.raises(AbortError, match="user asked") as info:
        signal.throw_if_aborted()
    assert info.value.reason == "user asked"
    # no reason: Node's DOMException AbortError "This operation was aborted"
    other = AbortController()
    other.abort()
    assert isinstance(other.signal.reason, AbortError) and str(other.signal.reason) == "This operation was aborted"
    with pytest.raises(AbortError, match="This operation was aborted"):
        other.signal.throw_if_aborted()
    # an exception as the reason is raised as is
    third = AbortController()
    third.abort(UnrecoverableError("stop"))
    with pytest.raises(UnrecoverableError, match="stop"):
        third.signal.throw_if_aborted()
    with pytest.raises(TypeError, match="must be callable"):
        signal.add_listener("not a function")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only emits 'abort'"):
        signal.add_event_listener("close", keep)


async def test_abort_signal_wait_async_listener_and_thread() -> None:
    controller = AbortController()
    waiter = asyncio.ensure_future(controller.signal.wait())
    cleaned = asyncio.Event()

    async def cleanup() -> None:
        cleaned.set()

    controller.signal.add_listener(cleanup, once=True)
    await asyncio.sleep(0.01)
    assert not waiter.done()
    controller.abort("now")
    assert await asyncio.wait_for(waiter, 5) == "now"
    await asyncio.wait_for(cleaned.wait(), 5)
    assert await controller.signal.wait() == "now"  # already aborted: at once
    # aborted from another thread: the loop's waiter still wakes
    other = AbortController()
    waiting = asyncio.ensure_future(other.signal.wait())
    await asyncio.sleep(0.01)
    threading.Thread(target=other.abort, args=("from a thread",)).start()
    assert await asyncio.wait_for(waiting, 5) == "from a thread"


# -- processors of one, two and three arguments ------------------------------------------------------
async def test_processors_of_one_two_and_three_arguments(redis_url: str, queue_name: str) -> None:
    seen: dict[str, Any] = {}

    async def one(job: Job) -> str:
        return "one"

    async def two(job: Job, token: str) -> str:
        seen["two"] = token
        return "two"

    async def three(job: Job, token: str, signal: AbortSignal) -> str:  # Node's (job, token, signal)
        seen["three"] = (token, signal)
        return "three"

    def three_sync(job: Job, token: str, signal: AbortSignal) -> str:
        seen["three_sync"] = (token, signal.aborted)
        return "three_sync"

    async def star(*args: Any) -> str:
        seen["star"] = len(args)
        return "star"

    for i, fn in enumerate((one, two, three, three_sync, star)):
        name = f"{queue_name}-{i}"
        async with a_queue(name, redis_url) as queue:
            job = await queue.add("n", {})
            worker = Worker(name, fn, connection=redis_url, drain_delay=0.5)
            async with running(worker):
                await wait_until(lambda: _finished(queue, job.id), 20, f"the job of {fn.__name__} to finish")
            stored = await queue.get_job(job.id)
            assert stored is not None and stored.returnvalue == fn.__name__, stored and stored.failed_reason
    assert isinstance(seen["two"], str) and seen["two"]
    assert isinstance(seen["three"][1], AbortSignal) and not seen["three"][1].aborted
    assert seen["three_sync"][1] is False and seen["star"] == 3


async def _finished(queue: Queue, job_id: Any) -> bool:
    job = await queue.get_job(job_id)
    return job is not None and await job.get_state() in ("completed", "failed")


async def _state(queue: Queue, job_id: Any, state: str) -> bool:
    job = await queue.get_job(job_id)
    return job is not None and await job.get_state() == state


# -- cancel_job / cancel_all_jobs: what happens to the job ---------------------------------------------
async def test_cancel_job_fails_retries_and_unrecoverable_stops(redis_url: str, queue_name: str) -> None:
    started: dict[str, int] = {}

    async def process(job: Job, token: str, signal: AbortSignal) -> Any:
        started[str(job.id)] = started.get(str(job.id), 0) + 1
        if job.attempts_made > 0:
            return "done"
        reason = await asyncio.wait_for(signal.wait(), 30)
        if job.data.get("unrecoverable"):
            raise UnrecoverableError(str(reason))
        signal.throw_if_aborted()  # AbortError(reason)

    async with a_queue(queue_name, redis_url) as queue:
        retried = await queue.add("retry", {}, attempts=2)
        stopped = await queue.add("stop", {"unrecoverable": True}, attempts=3)
        once = await queue.add("once", {}, attempts=1)
        worker = Worker(queue_name, process, connection=redis_url, concurrency=3, drain_delay=0.5)
        failed: list[tuple[str, str]] = []
        worker.on("failed", lambda job, err: failed.append((str(job.id), type(err).__name__)))
        async with running(worker):
            await wait_until(lambda: len(worker.lock_manager.get_tracked_job_ids()) == 3, 20, "three active jobs")
            assert worker.cancel_job("no-such-job") is False
            assert worker.cancel_job(retried.id, "user asked") is True
            assert worker.cancel_job(stopped.id, "for good") is True
            assert worker.cancel_job(once.id) is True  # no reason: Node's "This operation was aborted"
            await wait_until(lambda: _state(queue, retried.id, "completed"), 20, "the retried job to complete")
            await wait_until(lambda: _state(queue, stopped.id, "failed"), 20, "the unrecoverable job to fail")
            await wait_until(lambda: _state(queue, once.id, "failed"), 20, "the one-attempt job to fail")
        r, s, o = [await queue.get_job(j.id) for j in (retried, stopped, once)]
        assert r is not None and s is not None and o is not None
        assert (r.returnvalue, r.attempts_made, r.failed_reason) == ("done", 2, "user asked")
        assert (s.attempts_made, s.failed_reason) == (1, "for good")
        assert (o.attempts_made, o.failed_reason) == (1, "This operation was aborted")
        assert started == {str(retried.id): 2, str(stopped.id): 1, str(once.id): 1}
        assert sorted(failed) == sorted([(str(retried.id), "AbortError"), (str(stopped.id), "UnrecoverableError"),
                                         (str(once.id), "AbortError")])


async def test_cancel_all_jobs_and_processors_without_a_signal(redis_url: str, queue_name: str) -> None:
    def process(job: Job, token: str, signal: AbortSignal) -> str:  # a plain def in the thread pool
        deadline = time.time() + 30
        while not signal.aborted and time.time() < deadline:
            time.sleep(0.01)
        raise UnrecoverableError(f"cancelled: {signal.reason}")

    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("n", {"i": i}, attempts=2) for i in range(3)]
        worker = Worker(queue_name, process, connection=redis_url, concurrency=3, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: worker.lock_manager.get_active_job_count() == 3, 20, "three active jobs")
            worker.cancel_all_jobs("shutting down")
            for job in jobs:
                await wait_until(lambda: _state(queue, job.id, "failed"), 20, "every job to fail")
        for job in jobs:
            stored = await queue.get_job(job.id)
            assert stored is not None and stored.failed_reason == "cancelled: shutting down"

    # a processor of (job) gets no signal: cancel_job answers False and the job goes on (as Node)
    name = f"{queue_name}-plain"
    gate = asyncio.Event()

    async def plain(job: Job) -> str:
        await asyncio.wait_for(gate.wait(), 30)
        return "finished"

    async with a_queue(name, redis_url) as queue:
        job = await queue.add("n", {})
        worker = Worker(name, plain, connection=redis_url, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: worker.lock_manager.get_tracked_job_ids() == [str(job.id)], 20, "the job active")
            assert worker.cancel_job(job.id, "ignored") is False
            assert worker.lock_manager.tracked_jobs[str(job.id)][2] is None  # no controller made per job
            gate.set()
            await wait_until(lambda: _state(queue, job.id, "completed"), 20, "the job to complete")


async def test_cancel_job_with_use_processes(redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        plain_def = await queue.add("sync", {"unrecoverable": True}, attempts=3)
        worker = Worker(queue_name, "tests.sandbox_processors:cancellable", connection=redis_url,
                        use_processes=True, concurrency=2, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: worker.lock_manager.get_tracked_job_ids(), 30, "the job active")
            await asyncio.sleep(0.5)  # let the child start the processor (cancel before is fine too)
            assert worker.cancel_job(plain_def.id, "stop the child") is True
            await wait_until(lambda: _state(queue, plain_def.id, "failed"), 30, "the child's job to fail")
        stored = await queue.get_job(plain_def.id)
        assert stored is not None and (stored.failed_reason, stored.attempts_made) == ("stop the child", 1)
        assert "UnrecoverableError" in stored.stacktrace[-1]  # the child's traceback is kept

    name = f"{queue_name}-async"
    async with a_queue(name, redis_url) as queue:
        job = await queue.add("async", {}, attempts=2)
        worker = Worker(name, "tests.sandbox_processors:cancellable_async", connection=redis_url,
                        use_processes=True, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: worker.lock_manager.get_tracked_job_ids(), 30, "the job active")
            await asyncio.sleep(0.5)
            assert worker.cancel_job(job.id) is True
            await wait_until(lambda: _state(queue, job.id, "completed"), 30, "the retry to complete")
        stored = await queue.get_job(job.id)
        assert stored is not None and stored.failed_reason == "This operation was aborted"
        assert stored.returnvalue["attempt"] == 2


# -- against Node: the same cancellations, the same jobs as Node reads them ----------------------------
JOBS = [
    {"name": "retry", "data": {}, "opts": {"attempts": 2}},
    {"name": "stop", "data": {"unrecoverable": True}, "opts": {"attempts": 3}},
    {"name": "once", "data": {}, "opts": {"attempts": 1}},
    {"name": "ignore", "data": {"ignore": True}, "opts": {"attempts": 2}},
]


async def _py_twin(job: Job, token: str, signal: AbortSignal) -> Any:
    """interop/cancel_processor.js in Python."""
    if job.attempts_made > 0:
        return "done"
    await job.update_progress(1)  # the test cancels on this event: never before the attempt started
    if job.data.get("ignore"):
        await asyncio.wait_for(signal.wait(), 20)  # ignores the signal: completes all the same
        return "ignored"
    got = await asyncio.wait_for(signal.wait(), 20)
    if job.data.get("unrecoverable"):
        raise UnrecoverableError(str(got))
    raise RuntimeError(str(got))


@pytest.mark.node
@pytest.mark.parametrize("sandboxed", [False, True], ids=["in-process", "sandboxed"])
async def test_cancellation_as_node_sees_it(redis_url: str, queue_name: str, sandboxed: bool) -> None:
    """The same four jobs, each cancelled once its first attempt has started (on the processor's progress
    event), by Node's Worker and by ours (in-process, or both sandboxed: Node's child processes, our
    use_processes=True): Node reads back the same state, attemptsMade, attemptsStarted, failedReason, returnvalue
    and stack trace count."""
    reason = "cancelled by the operator"
    node_run = await run_script("cancel.js", {"redis": redis_url, "queue": f"{queue_name}-node", "op": "work",
                                              "jobs": JOBS, "reason": reason, "sandboxed": sandboxed})
    processor: Any = "tests.sandbox_processors:cancel_twin" if sandboxed else _py_twin
    worker = Worker(queue_name, processor, connection=redis_url, concurrency=4, drain_delay=0.5,
                    use_processes=sandboxed)
    cancelled: dict[str, bool] = {}

    def on_progress(job: Job, _progress: Any) -> None:
        if job.attempts_made == 0 and str(job.id) not in cancelled:
            cancelled[str(job.id)] = worker.cancel_job(str(job.id), reason)

    worker.on("progress", on_progress)
    async with Queue(queue_name, connection=redis_url) as queue:
        ids = [(await queue.add(j["name"], j["data"], **j["opts"])).id for j in JOBS]
        async with running(worker):
            for job_id in ids:
                await wait_until(lambda: _finished(queue, job_id), 40, "the jobs to finish")
                await wait_until(lambda: _state(queue, job_id, "completed") if JOBS[ids.index(job_id)]["name"] in
                                 ("retry", "ignore") else _state(queue, job_id, "failed"), 40, "the jobs' last attempts")
    py_read = await run_script("cancel.js", {"redis": redis_url, "queue": queue_name, "op": "read", "ids": ids})

    def comparable(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in job.items() if k != "id"} for job in jobs]

    assert comparable(py_read["jobs"]) == comparable(node_run["jobs"])
    assert [cancelled[str(i)] for i in ids] == [node_run["cancelled"][str(i)] for i in node_run["ids"]]
    by_name = dict(zip([j["name"] for j in JOBS], py_read["jobs"]))
    assert by_name["retry"]["state"] == "completed" and by_name["retry"]["failedReason"] == reason
    assert by_name["stop"]["state"] == "failed" and by_name["stop"]["attemptsMade"] == 1
    assert by_name["ignore"]["returnvalue"] == "ignored"  # cooperative: a processor may ignore the signal


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgument, match="autorun=True needs a running event loop"):
        Worker("q", lambda job: None, connection="redis://127.0.0.1:1/0", autorun=True)
