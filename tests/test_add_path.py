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


# -- an add with no options of its own (`queue.add(name, data)`): its script call is made from the
#    queue's PlainAdd, made once per defaults by prepare_add itself

_DEFAULTS = [
    {},
    {"attempts": 3, "backoff": {"type": "exponential", "delay": 100}},
    {"delay": 60_000},
    {"priority": 4, "remove_on_complete": {"count": 5}},
    {"lifo": True, "remove_on_fail": True, "keep_logs": 3, "stack_trace_limit": 2},
    {"size_limit": 1000},
]


@pytest.mark.parametrize("defaults", _DEFAULTS)
async def test_a_plain_add_sends_what_prepare_add_makes_of_it(redis_url: str, queue_name: str,
                                                              defaults: dict[str, Any]) -> None:
    from bullmq_compat._backends.redis.adding import prepare_add

    async with Queue(queue_name, connection=redis_url, default_job_options=defaults) as queue:
        plain = queue._plain_add()
        assert plain is not None
        timestamp, data_json, (script, keys, args) = plain.call("n", {"i": [1, "é"]})
        general = prepare_add(queue.backend.keys, "n", {"i": [1, "é"]},
                              queue._new_job("n", None, {}).opts, timestamp=timestamp)
        assert (script.sha, keys, args) == (general.script.sha, general.keys, general.args)
        assert data_json == general.data_json


@pytest.mark.parametrize("defaults", _DEFAULTS)
async def test_a_plain_add_stores_and_returns_what_the_general_add_does(
        redis_url: str, queue_name: str, redis: Any, defaults: dict[str, Any]) -> None:
    async with Queue(queue_name, connection=redis_url, default_job_options=defaults) as queue:
        await _fast_open(queue)
        plain = await queue.add("p", {"v": 1})
        general = await queue._add_one("p", {"v": 1}, {"attempts": queue._plain.merged["attempts"]})
        assert queue._plain is not None and plain.id != general.id
        for attribute in ("name", "data", "opts", "delay", "priority", "group_id", "parent_key"):
            assert getattr(plain, attribute) == getattr(general, attribute), attribute
        assert abs(plain.timestamp - general.timestamp) < 60_000
        stored = [await redis.hgetall(f"bull:{queue_name}:{job.id}") for job in (plain, general)]
        for fields in stored:
            fields.pop("timestamp")
        assert stored[0] == stored[1]
        assert await plain.get_state() == await general.get_state()
        fetched = await queue.get_job(plain.id)
        assert fetched is not None and fetched.opts == plain.opts and fetched.data == {"v": 1}


async def test_a_plain_add_follows_the_defaults_when_they_change(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url, default_job_options={"attempts": 2}) as queue:
        await _fast_open(queue)
        assert (await queue.add("a", {})).opts["attempts"] == 2
        queue.default_job_options["attempts"] = 5  # changed in place
        assert (await (await queue.add("b", {})).get_state()) == "waiting"
        assert (await queue.get_job((await queue.add("b", {})).id)).opts["attempts"] == 5  # type: ignore[union-attr]
        queue.default_job_options = {"delay": 60_000}  # replaced
        job = await queue.add("c", {})
        assert job.delay == 60_000 and await job.get_state() == "delayed"


@pytest.mark.parametrize("defaults", [{"timestamp": 1_000}, {"group": {"id": "g"}},
                                      {"deduplication": {"id": "d"}}])
async def test_defaults_that_make_each_add_its_own_take_the_general_path(
        redis_url: str, queue_name: str, defaults: dict[str, Any]) -> None:
    async with Queue(queue_name, connection=redis_url, default_job_options=defaults) as queue:
        await _fast_open(queue)
        assert queue._plain_add() is None
        job = await queue.add("x", {"i": 1})
        stored = await queue.get_job(job.id)
        assert stored is not None
        # deduplicated by its default id: the warm-up job's id, nothing new written
        assert stored.data == ({} if "deduplication" in defaults else {"i": 1})
        if "timestamp" in defaults:
            assert job.timestamp == stored.timestamp == 1_000
        if "group" in defaults:
            assert job.group_id == "g"


@pytest.mark.parametrize("name,data", [(5, {}), ("x", {"o": object()}), ("x", {"s": "\ud800"}),
                                       ("\ud800", {}), ("x", {"big": "y" * 2000})])
async def test_a_plain_add_refuses_bad_input_with_nothing_written(redis_url: str, queue_name: str,
                                                                  name: Any, data: Any) -> None:
    async with Queue(queue_name, connection=redis_url, default_job_options={"size_limit": 1000}) as queue:
        await _fast_open(queue)
        with pytest.raises(BullMQCompatError):
            await queue.add(name, data)
        assert await queue.get_job_counts("waiting") == {"waiting": 1}  # the warm-up job only
        assert (await queue.add("ok", {"i": 1})).id is not None


async def test_a_plain_add_after_redis_forgot_its_script_and_after_a_lost_connection(
        redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await _fast_open(queue)
        await redis.script_flush()
        assert (await queue.add("after-flush", {})).id is not None
        queue.backend._fast._conn._transport.abort()
        with pytest.raises(ConnectionError):
            await queue.add("lost", {})
        assert (await queue.add("after", {})).id is not None
        assert await queue.get_job_counts("waiting") == {"waiting": 3}
