"""Busy-polling: the event loop polls its sockets while a fast connection's reply is due, and only then."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import deque
from typing import Any, Iterator, Optional

import pytest
import redis.asyncio as aioredis

import bullmq_compat
from bullmq_compat import Queue, Worker
from bullmq_compat._backends.redis.channel import FastChannel
from bullmq_compat._backends.redis.fastconn import FastConnection
from bullmq_compat._busy_poll import BusyPollSelector, attach, detach
from tests.test_fastconn import _host_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeSelector:
    """An epoll-like selector: ``_selector.poll`` answers from ``answers`` (then nothing); ``select``
    records its timeouts and returns the ready list it is given."""

    def __init__(self, answers: Optional[list[list[Any]]] = None) -> None:
        self.answers = deque(answers or [])
        self.polls = 0
        self.selects: list[Optional[float]] = []
        self.ready = [("key", 1)]
        outer = self

        class Raw:
            def poll(self, timeout: float) -> list[Any]:
                assert timeout == 0
                outer.polls += 1
                return outer.answers.popleft() if outer.answers else []

        self._selector = Raw()

    def select(self, timeout: Optional[float] = None) -> list[Any]:
        self.selects.append(timeout)
        return self.ready if timeout == 0 else []

    def register(self, *a: Any) -> None: ...
    def unregister(self, *a: Any) -> None: ...
    def modify(self, *a: Any) -> None: ...
    def get_key(self, *a: Any) -> None: ...
    def get_map(self) -> dict[Any, Any]: return {}
    def close(self) -> None: ...


@pytest.fixture
def budget() -> Iterator[None]:
    """Each test sets the budget it needs; the process's own comes back after."""
    before = bullmq_compat.busy_poll_budget()
    yield
    bullmq_compat.set_busy_poll(before)


def _selector_with_a_due_reply(answers: Optional[list[list[Any]]] = None) -> tuple[BusyPollSelector, FakeSelector]:
    inner = FakeSelector(answers)
    selector = BusyPollSelector(inner)
    selector.due.append(deque(["a reply is due"]))
    return selector, inner


def _sleeps_that_polled(selector: BusyPollSelector, inner: FakeSelector, sleeps: int) -> list[int]:
    """Which of the next ``sleeps`` selects (with a timeout) polled before sleeping, by number."""
    polled = []
    for i in range(sleeps):
        before = inner.polls
        selector.select(1.0)
        if inner.polls > before:
            polled.append(i)
    return polled


def test_the_loop_sleeps_at_once_when_no_reply_is_due(budget: None) -> None:
    bullmq_compat.set_busy_poll(100_000)
    inner = FakeSelector([[(5, 1)]])
    selector = BusyPollSelector(inner)
    selector.due.append(deque())  # a connection with nothing pending
    assert selector.select(2.0) == []
    assert inner.polls == 0 and inner.selects == [2.0]


def test_a_due_reply_is_polled_for_and_what_arrives_is_returned(budget: None) -> None:
    bullmq_compat.set_busy_poll(1_000_000)  # the fake's third poll answers long before a second passes
    selector, inner = _selector_with_a_due_reply([[], [], [(5, 1)]])
    assert selector.select(30.0) == inner.ready
    assert inner.polls == 3
    assert inner.selects == [0]  # the ready list read without waiting: the loop never slept
    assert (selector.caught, selector.missed) == (1, 0)


def test_a_loop_with_work_ready_never_polls(budget: None) -> None:
    bullmq_compat.set_busy_poll(1_000_000)
    selector, inner = _selector_with_a_due_reply([[(5, 1)]])
    selector.select(0)
    assert inner.polls == 0 and inner.selects == [0]


def test_a_budget_of_zero_turns_polling_off(budget: None) -> None:
    bullmq_compat.set_busy_poll(0)
    selector, inner = _selector_with_a_due_reply([[(5, 1)]])
    selector.select(1.0)
    assert inner.polls == 0 and inner.selects == [1.0]
    assert bullmq_compat.busy_poll_budget() == 0


def test_a_poll_without_a_reply_sleeps_for_the_rest_of_the_timeout(budget: None) -> None:
    bullmq_compat.set_busy_poll(1)  # 1 µs: over after the first poll or so
    selector, inner = _selector_with_a_due_reply()
    selector.select(5.0)
    assert inner.polls >= 1
    assert len(inner.selects) == 1 and 4.0 < inner.selects[0] <= 5.0  # type: ignore[operator]
    assert (selector.caught, selector.missed) == (0, 1)
    selector.select(None)  # no timer: the rest is forever (skipped poll: the back-off)
    assert inner.selects[-1] is None


def test_polls_that_miss_become_rarer_and_a_caught_reply_restores_them(budget: None) -> None:
    bullmq_compat.set_busy_poll(1)
    selector, inner = _selector_with_a_due_reply()
    # after each miss the next 1, 3, 7, 15 sleeps come without a poll
    assert _sleeps_that_polled(selector, inner, 40) == [0, 2, 6, 14, 30]
    bullmq_compat.set_busy_poll(1_000_000)
    inner.answers.append([(5, 1)])  # the next poll sees a reply
    sleeps = 0
    while not selector.caught:
        selector.select(1.0)
        sleeps += 1
    assert sleeps == 32 - 9  # the rest of the last miss's back-off (31 sleeps, 9 of them above), then the poll
    polls = inner.polls
    inner.answers.append([(5, 1)])
    selector.select(1.0)  # the next sleep polls again at once
    assert inner.polls == polls + 1 and selector.caught == 2


def test_the_back_off_stops_at_one_poll_in_256_sleeps(budget: None) -> None:
    bullmq_compat.set_busy_poll(1)
    selector, inner = _selector_with_a_due_reply()
    polled_at = _sleeps_that_polled(selector, inner, 2_000)
    gaps = [b - a for a, b in zip(polled_at, polled_at[1:])]
    assert gaps[:8] == [2, 4, 8, 16, 32, 64, 128, 256] and set(gaps[8:]) == {256}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "200", None, 1_000_001])
def test_a_bad_budget_is_refused_naming_the_value_and_the_rule(bad: Any, budget: None) -> None:
    with pytest.raises(ValueError) as err:
        bullmq_compat.set_busy_poll(bad)
    assert repr(bad) in str(err.value) and "microseconds from 0 to 1,000,000" in str(err.value)


def _import_with_budget(text: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BULLMQ_COMPAT_BUSY_POLL_US": text}
    return subprocess.run([sys.executable, "-c", "import bullmq_compat; print(bullmq_compat.busy_poll_budget())"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_environment_sets_the_budget() -> None:
    run = _import_with_budget("50")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "50"


def test_a_bad_budget_in_the_environment_is_refused_at_import() -> None:
    run = _import_with_budget("fast")
    assert run.returncode != 0
    assert "BULLMQ_COMPAT_BUSY_POLL_US must be a whole number of microseconds" in run.stderr
    assert "'fast'" in run.stderr


def test_a_loop_without_asyncio_selector_is_left_alone() -> None:
    class OtherLoop:  # uvloop, the proactor: nothing of asyncio's selector loop to wrap
        pass

    assert attach(OtherLoop(), deque()) is None  # type: ignore[arg-type]
    detach(None, deque())


# ---------------------------------------------------------------- on a real loop, with a real Redis

def _poller(conn: FastConnection) -> Optional[BusyPollSelector]:
    return conn._poller


async def test_a_fast_connection_makes_its_loop_poll_while_its_replies_are_due(redis_url: str) -> None:
    host, port = _host_port(redis_url)
    loop = asyncio.get_running_loop()
    conn = await FastConnection.open(host, port)
    try:
        selector = _poller(conn)
        assert selector is not None and loop._selector is selector  # type: ignore[attr-defined]
        mine = [queue for queue in selector.due if queue is conn._pending]
        assert len(mine) == 1
        future = conn.execute("PING")
        assert mine[0]  # the PING's reply is due: the loop polls for it
        assert await future == b"PONG"
        assert not mine[0]
    finally:
        await conn.close()
    assert not any(queue is conn._pending for queue in selector.due)
    again = await FastConnection.open(host, port)
    try:
        assert _poller(again) is selector  # one wrapper a loop, however many connections
    finally:
        await again.close()


async def test_a_blocking_wait_does_not_make_the_loop_poll(redis_url: str, redis: aioredis.Redis) -> None:
    host, port = _host_port(redis_url)
    blocking = await FastConnection.open(host, port, busy_poll=False)
    try:
        assert _poller(blocking) is None
        waiting = blocking.execute("BZPOPMIN", f"busy-poll-{os.getpid()}-marker", 30)
        await asyncio.sleep(0.05)
        assert blocking._pending  # the wait is in flight, and the loop does not poll for it
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        assert not isinstance(selector, BusyPollSelector) or all(q is not blocking._pending for q in selector.due)
        await redis.zadd(f"busy-poll-{os.getpid()}-marker", {"m": 1})
        assert (await waiting)[1] == b"m"
    finally:
        await blocking.close()


async def test_a_workers_marker_wait_is_on_a_connection_that_does_not_poll(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    channel = await FastChannel.open(client, "bull:busy-poll-test:w1")
    try:
        assert channel._conn is not None and _poller(channel._conn) is not None
        assert channel._blocking is not None and _poller(channel._blocking) is None
    finally:
        await channel.close()
        await client.aclose()


async def test_replies_are_caught_by_polling_and_jobs_are_processed(redis_url: str, budget: None) -> None:
    """With a budget far above any reply's time, a worker at concurrency 1 finds its replies by
    polling (the count is a floor: the machine may be slow, not the replies late)."""
    bullmq_compat.set_busy_poll(200_000)
    name = f"busy-poll-{os.getpid()}-{id(redis_url)}"
    queue = Queue(name, connection=redis_url)
    done: list[str] = []
    finished = asyncio.get_running_loop().create_future()

    async def process(job: Any) -> int:
        return int(job.data["i"])

    worker = Worker(name, process, connection=redis_url, autorun=False)

    def on_completed(job: Any, result: Any, *_: Any) -> None:
        done.append(job.id)
        if len(done) == 50 and not finished.done():
            finished.set_result(None)

    worker.on("completed", on_completed)
    try:
        await queue.add_bulk([{"name": "n", "data": {"i": i}} for i in range(50)])
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        caught = selector.caught if isinstance(selector, BusyPollSelector) else 0
        asyncio.ensure_future(worker.run(handle_signals=False))
        await asyncio.wait_for(finished, 60)
        assert isinstance(selector, BusyPollSelector)
        assert selector.caught - caught >= 10
        assert await queue.get_job_counts("completed") == {"completed": 50}
    finally:
        await worker.close()
        await queue.obliterate(force=True)
        await queue.close()
