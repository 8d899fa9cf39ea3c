"""Worker parity with Node BullMQ 6.7: autorun (and run() on an autorun instance, Worker and
QueueEvents), the concurrency setter, run_retry_delay, maximum_rate_limit_delay, locksRenewed and
one lockRenewalFailed per renewal batch, LockManager's public methods, WaitingError, and the
sandboxed job's calls to the parent (use_processes=True)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bullmq_compat import FlowProducer, InvalidArgument, Job, LockManager, Queue, QueueEvents, WaitingError, Worker
from bullmq_compat._lock_manager import LockManager as _LM
from tests.helpers import a_queue, running, wait_until


async def _state(queue: Queue, job_id: Any) -> str:
    job = await queue.get_job(job_id)
    return await job.get_state() if job is not None else "missing"


async def _in(queue: Queue, job_id: Any, *states: str) -> bool:
    return await _state(queue, job_id) in states


# -- autorun ----------------------------------------------------------------------------------------
async def test_autorun_default_off_and_on_and_run_waits(redis_url: str, queue_name: str) -> None:
    async def process(job: Job) -> str:
        return "ok"

    async with a_queue(queue_name, redis_url) as queue:
        job = await queue.add("n", {})
        idle = Worker(queue_name, process, connection=redis_url, drain_delay=0.5)  # autorun=False by default
        await asyncio.sleep(0.5)
        assert not idle.is_running() and await _state(queue, job.id) == "waiting"
        await idle.close()

        worker = Worker(queue_name, process, connection=redis_url, drain_delay=0.5, autorun=True)
        ready: list[bool] = []
        worker.on("ready", lambda: ready.append(True))  # added right after the constructor: still heard
        await wait_until(lambda: _in(queue, job.id, "completed"), 20, "autorun to process the job")
        assert worker.is_running() and ready == [True]
        second = asyncio.ensure_future(worker.run())  # waits for the autorun run instead of raising
        await asyncio.sleep(0.2)
        assert not second.done()
        await worker.close()
        await asyncio.wait_for(second, 15)
        assert not worker.is_running()

    with pytest.raises(InvalidArgument, match="autorun=True needs a processor"):
        Worker(queue_name, connection=redis_url, autorun=True)

    # closed before autorun got to start: it never starts (and run() does nothing)
    async with a_queue(queue_name, redis_url) as queue:
        job = await queue.add("n", {})
        early = Worker(queue_name, process, connection=redis_url, drain_delay=0.5, autorun=True)
        await early.close()
        await early.run()
        await asyncio.sleep(0.3)
        assert not early.is_running() and await _state(queue, job.id) == "waiting"


async def test_queue_events_run_waits_for_autorun(redis_url: str, queue_name: str) -> None:
    qe = QueueEvents(queue_name, connection=redis_url, blocking_timeout=200)  # autorun=True (Node's default)
    await qe.wait_until_ready()
    runner = asyncio.ensure_future(qe.run())
    await asyncio.sleep(0.3)
    assert not runner.done(), runner.exception() if runner.done() else None
    await qe.close()
    await asyncio.wait_for(runner, 15)


# -- concurrency setter -------------------------------------------------------------------------------
async def test_concurrency_setter_while_running(redis_url: str, queue_name: str) -> None:
    gate = asyncio.Event()
    now_active = 0
    most_after_lowering: list[int] = []

    async def process(job: Job) -> str:
        nonlocal now_active
        now_active += 1
        try:
            if job.data.get("late"):
                most_after_lowering.append(now_active)
                await asyncio.sleep(0.05)
            else:
                await asyncio.wait_for(gate.wait(), 30)
            return "ok"
        finally:
            now_active -= 1

    async with a_queue(queue_name, redis_url) as queue:
        early = [await queue.add("n", {"i": i}) for i in range(4)]
        worker = Worker(queue_name, process, connection=redis_url, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: worker.lock_manager.get_active_job_count() == 1, 20, "one active job")
            worker.concurrency = 3
            assert worker.concurrency == 3
            await wait_until(lambda: worker.lock_manager.get_active_job_count() == 3, 20, "three active jobs")
            worker.concurrency = 1
            gate.set()
            for job in early:
                await wait_until(lambda: _in(queue, job.id, "completed"), 20, "the first jobs to complete")
            late = [await queue.add("n", {"late": True}) for _ in range(4)]
            for job in late:
                await wait_until(lambda: _in(queue, job.id, "completed"), 20, "the later jobs to complete")
        assert most_after_lowering and max(most_after_lowering) == 1
        for bad in (0, -1, 1.5, "2", True):
            with pytest.raises(InvalidArgument, match="concurrency="):
                worker.concurrency = bad  # type: ignore[assignment]


# -- run_retry_delay, maximum_rate_limit_delay ---------------------------------------------------------
async def test_run_retry_delay_caps_the_back_off(redis_url: str) -> None:
    worker = Worker("q", lambda job: None, connection=redis_url, run_retry_delay=250)
    worker.on("error", lambda err: None)
    pauses = [worker._connection_trouble(ConnectionError("down")) for _ in range(8)]
    assert pauses[0] == 0.1 and max(pauses) == 0.25  # 0.1, 0.2, then never more than 250 ms
    default = Worker("q", lambda job: None, connection=redis_url)
    default.on("error", lambda err: None)
    assert max(default._connection_trouble(ConnectionError("down")) for _ in range(12)) <= 15.0
    for bad in (0, -5, "15000", None):
        with pytest.raises(InvalidArgument, match="run_retry_delay="):
            Worker("q", lambda job: None, connection=redis_url, run_retry_delay=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="maximum_rate_limit_delay="):
        Worker("q", lambda job: None, connection=redis_url, maximum_rate_limit_delay=0)
    await worker.close()
    await default.close()


async def test_maximum_rate_limit_delay(redis_url: str, queue_name: str, redis: Any) -> None:
    """Rate-limited for 60 s, a worker looks again every maximum_rate_limit_delay ms: once the limit
    is lifted it takes the job at once, not after the 60 s."""
    from bullmq_compat import RateLimitError

    runs: list[float] = []

    async def process(job: Job) -> str:
        runs.append(time.monotonic())
        if len(runs) == 1:
            await worker.rate_limit(60_000)
            raise RateLimitError()
        return "ok"

    async with a_queue(queue_name, redis_url) as queue:
        worker = Worker(queue_name, process, connection=redis_url, drain_delay=0.5, maximum_rate_limit_delay=300,
                        limiter={"max": 10, "duration": 1000})  # a manual rate limit needs a limiter, as Node
        job = await queue.add("n", {})
        async with running(worker):
            await wait_until(lambda: runs, 20, "the first run")
            await asyncio.sleep(0.5)
            assert len(runs) == 1 and await queue.get_rate_limit_ttl() > 50_000
            await redis.delete(f"bull:{queue_name}:limiter")
            await wait_until(lambda: _in(queue, job.id, "completed"), 20, "the job once the limit is gone")


# -- locksRenewed, lockRenewalFailed ------------------------------------------------------------------
async def test_locks_renewed_and_lock_renewal_failed(redis_url: str, queue_name: str, redis: Any) -> None:
    gate = asyncio.Event()

    async def process(job: Job) -> str:
        await asyncio.wait_for(gate.wait(), 30)
        return "ok"

    async with a_queue(queue_name, redis_url) as queue:
        jobs = [await queue.add("n", {}) for _ in range(2)]
        ids = sorted(str(j.id) for j in jobs)
        worker = Worker(queue_name, process, connection=redis_url, concurrency=2, lock_duration=3000,
                        drain_delay=0.5, skip_stalled_check=True)
        renewed: list[Any] = []
        failed: list[Any] = []
        errors: list[str] = []
        worker.on("locksRenewed", lambda info: renewed.append(info))
        worker.on("lockRenewalFailed", lambda job_ids: failed.append(job_ids))
        worker.on("error", lambda err: errors.append(str(err)))
        async with running(worker, force_close=True):
            await wait_until(lambda: sorted({i for r in renewed for i in r["jobIds"]}) == ids, 20, "both locks renewed")
            assert all(r["count"] == len(r["jobIds"]) for r in renewed)
            for job_id in ids:
                await redis.delete(f"bull:{queue_name}:{job_id}:lock")
            # still tracked, they fail again at each renewal: every batch is one event with its ids
            await wait_until(lambda: sorted({i for batch in failed for i in batch}) == ids, 20, "both renewals failed")
            assert all(isinstance(batch, list) and batch and len(set(batch)) == len(batch) for batch in failed)
            assert {e for e in errors if "could not renew" in e} == {f"could not renew lock for job {i}" for i in ids}
            gate.set()


async def test_lock_manager_public_methods_and_one_event_per_batch() -> None:
    events: list[tuple[str, Any]] = []

    class FakeWorker:
        def emit(self, event: str, *args: Any) -> bool:
            events.append((event, args[0] if args else None))
            return True

        async def extend_job_locks(self, job_ids: Any, tokens: Any, duration: int) -> list[str]:
            assert duration == 800 and list(tokens) == [f"t{i}" for i in job_ids]
            return [i for i in job_ids if i in ("2", "3")]

    assert LockManager is _LM
    manager = LockManager(FakeWorker(), lock_renew_time=400, lock_duration=800, worker_id="w1", worker_name="n")
    assert manager.track_job("1", "t1", 1) is None  # no controller unless asked
    controller = manager.track_job("2", "t2", 1, True)
    manager.track_job("3", "t3", 1, should_create_controller=True)
    assert manager.get_tracked_job_ids() == ["1", "2", "3"] and manager.get_active_job_count() == 3
    assert manager.cancel_job("1") is False and manager.cancel_job("nope") is False
    assert manager.cancel_job("2", "why") is True and controller is not None and controller.signal.reason == "why"
    manager.cancel_all_jobs("all")
    assert manager.tracked_jobs["3"][2].signal.reason == "all" and controller.signal.reason == "why"
    await manager.extend_locks(["1", "2", "3"])
    assert events[0] == ("lockRenewalFailed", ["2", "3"])  # one event for the batch, first, as Node
    assert events[1:3] == [("error", events[1][1]), ("error", events[2][1])]
    assert [str(e[1]) for e in events[1:3]] == ["could not renew lock for job 2", "could not renew lock for job 3"]
    assert events[3] == ("locksRenewed", {"count": 1, "jobIds": ["1"]}) and len(events) == 4
    assert not manager.is_running()
    manager.start()
    assert manager.is_running()
    events.clear()
    await wait_until(lambda: [e for e in events if e[0] == "locksRenewed"], 10, "the timer's renewal")
    manager.untrack_job("1")
    assert manager.get_tracked_job_ids() == ["2", "3"]
    await manager.close()
    assert not manager.is_running() and manager.get_active_job_count() == 0
    assert manager.track_job("4", "t4", 1) is None and manager.get_active_job_count() == 0  # closed
    with pytest.raises(InvalidArgument, match="lock_duration=0"):
        LockManager(FakeWorker(), lock_renew_time=1, lock_duration=0, worker_id="w")


# -- WaitingError ---------------------------------------------------------------------------------------
async def test_waiting_error(redis_url: str, queue_name: str) -> None:
    runs: list[int] = []

    async def process(job: Job, token: str) -> str:
        runs.append(job.attempts_made)
        if len(runs) == 1:
            await job.move_to_wait(token)
            raise WaitingError()
        return "second time"

    async with a_queue(queue_name, redis_url) as queue:
        job = await queue.add("n", {}, attempts=1)
        worker = Worker(queue_name, process, connection=redis_url, drain_delay=0.5)
        failed: list[Any] = []
        worker.on("failed", lambda job, err: failed.append(err))
        async with running(worker):
            await wait_until(lambda: _in(queue, job.id, "completed"), 20, "the job to run again and complete")
        stored = await queue.get_job(job.id)
        assert stored is not None and stored.returnvalue == "second time" and not failed and len(runs) == 2
    assert str(WaitingError()) == "bullmq:movedToWait"


# -- the sandboxed job's calls ----------------------------------------------------------------------------
async def test_sandboxed_job_calls(redis_url: str, queue_name: str) -> None:
    async with a_queue(queue_name, redis_url) as queue:
        job = await queue.add("n", {"a": 1})
        worker = Worker(queue_name, "tests.sandbox_processors:job_calls", connection=redis_url,
                        use_processes=True, drain_delay=0.5)
        progress: list[Any] = []
        worker.on("progress", lambda job, value: progress.append(value))
        async with running(worker):
            await wait_until(lambda: _in(queue, job.id, "completed", "failed"), 30, "the child's job")
        stored = await queue.get_job(job.id)
        assert stored is not None, "job missing"
        assert stored.returnvalue == {"data": {"a": 1, "seen": True}, "progress": 42, "token": True}, stored.failed_reason
        assert stored.progress == 42 and stored.data == {"a": 1, "seen": True} and progress == [42]
        assert (await stored.get_logs())["logs"] == ["first row"]

    name = f"{queue_name}-sync"
    async with a_queue(name, redis_url) as queue:
        job = await queue.add("n", {})
        worker = Worker(name, "tests.sandbox_processors:job_calls_sync", connection=redis_url,
                        use_processes=True, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: _in(queue, job.id, "completed", "failed"), 30, "the child's job")
        stored = await queue.get_job(job.id)
        assert stored is not None and stored.returnvalue == {"log_count": 1, "data": {"sync": True}}, stored.failed_reason
        assert stored.progress == {"step": 1}


async def test_sandboxed_flow_calls_delay_and_errors(redis_url: str, queue_name: str) -> None:
    parents, children = f"{queue_name}-p", f"{queue_name}-c"
    async with FlowProducer(connection=redis_url) as flows, a_queue(parents, redis_url) as pq:
        node = await flows.add({"name": "parent", "queue_name": parents, "data": {}, "children": [
            {"name": "c1", "queue_name": children, "data": {"v": 1}},
            {"name": "c2", "queue_name": children, "data": {"v": 2}}]})
        child_worker = Worker(children, lambda job: job.data["v"] * 10, connection=redis_url, drain_delay=0.5)
        parent_worker = Worker(parents, "tests.sandbox_processors:parent_calls", connection=redis_url,
                               use_processes=True, drain_delay=0.5)
        async with running(child_worker), running(parent_worker):
            await wait_until(lambda: _in(pq, node.job.id, "completed", "failed"), 30, "the parent job")
        stored = await pq.get_job(node.job.id)
        assert stored is not None, "parent missing"
        result = stored.returnvalue
        assert isinstance(result, dict), stored.failed_reason
        assert sorted(result["values"].values()) == [10, 20] and result["ignored"] == {}
        assert sorted(result["deps"]["processed"].values()) == [10, 20]
        assert result["count"]["processed"] == 2, result["count"]

    async with a_queue(queue_name, redis_url) as queue:
        alone = await queue.add("alone", {})
        w1 = Worker(queue_name, "tests.sandbox_processors:waits_for_children", connection=redis_url,
                    use_processes=True, drain_delay=0.5)
        async with running(w1):
            await wait_until(lambda: _in(queue, alone.id, "completed", "failed"), 30, "the job without children")
        stored_alone = await queue.get_job(alone.id)
        assert stored_alone is not None and stored_alone.returnvalue == {"children": {}}  # no pending children: False

    name = f"{queue_name}-d"
    async with a_queue(name, redis_url) as queue:
        delayed = await queue.add("delay", {})
        w2 = Worker(name, "tests.sandbox_processors:delays_once", connection=redis_url, use_processes=True,
                    drain_delay=0.5)
        async with running(w2):
            await wait_until(lambda: _in(queue, delayed.id, "delayed", "completed"), 30, "the job delayed")
            await wait_until(lambda: _in(queue, delayed.id, "completed", "failed"), 30, "the delayed job to run again")
        stored = await queue.get_job(delayed.id)
        assert stored is not None and stored.returnvalue == "after the delay", stored.failed_reason
        assert stored.attempts_made <= 1  # moving to delayed used no attempt

    name = f"{queue_name}-bad"
    async with a_queue(name, redis_url) as queue:
        bad = await queue.add("bad", {})
        w3 = Worker(name, "tests.sandbox_processors:bad_call", connection=redis_url, use_processes=True,
                    drain_delay=0.5)
        async with running(w3):
            await wait_until(lambda: _in(queue, bad.id, "failed"), 30, "the job whose call the parent refused")
        stored = await queue.get_job(bad.id)
        assert stored is not None and stored.failed_reason and "RemoteTraceback" not in stored.failed_reason


async def test_sandboxed_move_to_waiting_children(redis_url: str, queue_name: str) -> None:
    kids = f"{queue_name}-kids"
    async with a_queue(queue_name, redis_url) as parents:
        job = await parents.add("parent", {"kids": kids, "redis": redis_url})
        worker = Worker(queue_name, "tests.sandbox_processors:adds_a_child_then_waits", connection=redis_url,
                        use_processes=True, drain_delay=0.5)
        async with running(worker):
            await wait_until(lambda: _in(parents, job.id, "waiting-children"), 30, "the parent to wait for its child")
            kid_worker = Worker(kids, lambda kid: kid.data["v"], connection=redis_url, drain_delay=0.5)
            async with running(kid_worker):
                await wait_until(lambda: _in(parents, job.id, "completed", "failed"), 30, "the parent to finish")
        done = await parents.get_job(job.id)
        assert done is not None and list(done.returnvalue.values()) == [5], done and done.failed_reason
