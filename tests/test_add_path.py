"""The add path that writes before it waits: `add` and `add_bulk` send their scripts, build their Job
objects while Redis runs them, then read the replies (docs/performance.md). What each returns must
be what Redis stored, whichever way a reply comes: an id, a script's refusal, a script Redis has
forgotten, or a connection that dies under the call."""
from __future__ import annotations

from typing import Any

import pytest

from bullmq_compat import Queue
from bullmq_compat._errors import BullMQCompatError
from bullmq_compat._wire import codec


async def _fast_open(queue: Queue) -> None:
    """The first add opens the fast channel; later ones take the write-first path."""
    await queue.add("warm", {})
    pending = queue.backend.submit_prepared([])
    assert pending is not None and await pending == []


async def test_add_and_add_bulk_return_what_redis_stored(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        one = await queue.add("one", {"n": 1}, attempts=3)
        many = await queue.add_bulk([{"name": f"b{i}", "data": {"n": i}, "opts": {"job_id": f"id-{i}"} if i % 2 else {}}
                                     for i in range(300)])
        assert one.id is not None and (await redis.hget(f"bull:{queue_name}:{one.id}", "name")) == "one"
        assert [j.id for j in many][1::2] == [f"id-{i}" for i in range(1, 300, 2)]
        for job in many:
            stored = await redis.hgetall(f"bull:{queue_name}:{job.id}")
            assert stored["name"] == job.name and codec.loads(stored["data"]) == job.data
        assert len({j.id for j in many}) == 300
        assert await queue.get_job_counts("waiting") == {"waiting": 302}


async def test_an_existing_job_id_gives_the_stored_job(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        first = await queue.add("a", {"v": 1}, job_id="same")
        again = await queue.add_bulk([{"name": "a", "data": {"v": 2}, "opts": {"job_id": "same"}},
                                      {"name": "b", "data": {}}])
        assert first.id == again[0].id == "same" and again[1].id not in (None, "same")
        assert (await queue.get_job("same")).data == {"v": 1}  # type: ignore[union-attr]


async def test_scripts_redis_has_forgotten_are_run_with_their_text(redis_url: str, queue_name: str,
                                                                   redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        await redis.script_flush()
        job = await queue.add("after-flush", {})
        await redis.script_flush()
        bulk = await queue.add_bulk([{"name": "x", "data": {"i": i}} for i in range(50)])
        assert job.id is not None and all(j.id is not None for j in bulk)
        assert await queue.get_job_counts("waiting") == {"waiting": 52}


async def test_a_refused_add_raises_and_its_job_is_not_returned(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        missing_parent = {"id": "nope", "queue": f"bull:{queue_name}-parents"}
        with pytest.raises(BullMQCompatError, match="nope"):
            await queue.add("child", {}, parent=missing_parent)
        with pytest.raises(BullMQCompatError, match="nope"):
            await queue.add_bulk([{"name": "ok", "data": {}}, {"name": "child", "data": {}, "opts": {"parent": missing_parent}}])
        assert (await queue.add("later", {})).id is not None  # the connection carries on


async def test_a_lost_connection_fails_the_pending_add(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        channel = queue.backend._fast
        channel._conn._transport.abort()  # the socket dies (seen on the next loop turn): no reply comes
        pending = queue.backend.submit_prepared([queue._prepare("x", {}, {})])
        assert pending is not None
        results = await pending
        assert isinstance(results[0], ConnectionError)
        assert (await queue.add("after", {})).id is not None  # a new connection


def test_pack_after_a_refusal_holds_nothing_of_it() -> None:
    with pytest.raises(TypeError):
        codec.pack([1, object()])
    assert codec.pack([1, 2]) == b"\x92\x01\x02"


@pytest.mark.parametrize("bad", [{"name": "x", "data": {"o": object()}}, {"name": 5, "data": {}},
                                 {"name": "x", "data": {"big": "y" * 100}, "opts": {"size_limit": 10}},
                                 {"name": "x", "data": {"s": "\ud800"}}])
async def test_add_bulk_refuses_a_bad_job_anywhere_with_nothing_written(redis_url: str, queue_name: str,
                                                                        bad: dict[str, Any]) -> None:
    """Each job of an add_bulk is sent as soon as it is encoded, but only once every job has passed
    its checks: a bad one at the end still leaves nothing written."""
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        items = [{"name": "ok", "data": {"i": i}} for i in range(400)] + [bad]
        with pytest.raises(BullMQCompatError):
            await queue.add_bulk(items)
        assert await queue.get_job_counts("waiting") == {"waiting": 1}  # the warm-up job only
        assert len(await queue.add_bulk(items[:-1])) == 400


async def test_add_bulk_of_group_and_delayed_jobs_goes_the_same_way(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        jobs = await queue.add_bulk([{"name": "g", "data": {}, "opts": {"group": {"id": "a"}}},
                                     {"name": "d", "data": {}, "opts": {"delay": 60_000}},
                                     {"name": "p", "data": {}, "opts": {"priority": 3}}])
        assert [await j.get_state() for j in jobs][1:] == ["delayed", "prioritized"]
        assert all(j.id for j in jobs)
