"""bullmq_compat.sync: the same methods, blocking, from threads and from code with its own loop."""
from __future__ import annotations

import asyncio
import threading

import pytest

from bullmq_compat import BullMQCompatError, InvalidJobId, sync


@pytest.fixture
def squeue(redis_url, queue_name):
    queue = sync.Queue(queue_name, connection=redis_url)
    yield queue
    queue.close()


def test_sync_add_returns_a_job_with_blocking_methods(squeue):
    job = squeue.add("send", {"to": "a@b"}, attempts=3)
    assert job.name == "send" and job.data == {"to": "a@b"} and job.opts["attempts"] == 3
    assert job.get_state() == "waiting"
    assert squeue.get_job_counts("waiting") == {"waiting": 1}
    assert squeue.get_job(job.id).data == {"to": "a@b"}


def test_sync_calls_from_many_threads_at_once(squeue):
    ids: list[str] = []
    lock = threading.Lock()

    def add(i: int) -> None:
        job = squeue.add("x", {"i": i})
        with lock:
            ids.append(job.id)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(25)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids, key=int) == [str(i) for i in range(1, 26)]
    assert squeue.get_job_counts("waiting")["waiting"] == 25


def test_sync_api_works_from_code_running_its_own_event_loop(squeue):
    async def inside_a_loop() -> str:
        job = squeue.add("from-async-code", {})  # blocking call from a thread that runs a loop
        return job.get_state()

    assert asyncio.run(inside_a_loop()) == "waiting"


def test_sync_api_uses_one_event_loop_for_every_call(squeue):
    first = sync.loop()
    squeue.add("a", {})
    squeue.get_job_counts()
    assert sync.loop() is first and first.is_running()


def test_sync_errors_are_the_async_errors(squeue):
    with pytest.raises(InvalidJobId, match="'12'"):
        squeue.add("x", {}, job_id="12")


def test_sync_wait_until_finished_returns_the_return_value(redis_url, queue_name, squeue):
    import bullmq_compat

    events = sync.QueueEvents(queue_name, connection=redis_url)
    waited = threading.Event()  # the worker runs until the sync wait has returned (or 60 s)
    try:
        job = squeue.add("double", {"i": 21})

        async def process(j):
            return {"double": j.data["i"] * 2}

        async def run_worker() -> None:
            worker = bullmq_compat.Worker(queue_name, process, redis_url, group_keeper=False)
            task = asyncio.ensure_future(worker.run(handle_signals=False))
            await asyncio.to_thread(waited.wait, 60)
            await worker.close()
            await task

        thread = threading.Thread(target=lambda: asyncio.run(run_worker()))
        thread.start()
        try:
            assert job.wait_until_finished(events, 60_000) == {"double": 42}
        finally:
            waited.set()
            thread.join(60)
    finally:
        events.close()


def test_calling_sync_from_its_own_loop_thread_is_refused(squeue):
    async def on_the_sync_loop() -> None:
        squeue.get_job_counts()

    with pytest.raises(BullMQCompatError, match="own event loop"):
        asyncio.run_coroutine_threadsafe(on_the_sync_loop(), sync.loop()).result(5)


def test_sync_flow_producer_returns_sync_jobs_in_its_nodes(redis_url, queue_name):
    flow = sync.FlowProducer(connection=redis_url)
    try:
        node = flow.add({"name": "parent", "queue_name": queue_name, "data": {},
                         "children": [{"name": "child", "queue_name": queue_name, "data": {"c": 1}}]})
        assert isinstance(node.job, sync.Job) and node.job.get_state() == "waiting-children"
        assert isinstance(node.children[0].job, sync.Job) and node.children[0].job.get_state() == "waiting"
    finally:
        flow.close()
