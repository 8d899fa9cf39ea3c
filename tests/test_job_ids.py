"""Job id generators (issue #16 part 3): ``Queue(..., job_id_generator=fn)`` and on
``FlowProducer``, the ready `uuid7_ids`, the check of what a generator returns, a repeated id
(the add is ignored, ``duplicated`` is emitted) making a producer's retry after a lost reply
safe, on Redis and PostgreSQL, and Node BullMQ reading and working the generated ids.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import threading
import time
import urllib.parse
import uuid
from typing import Any, Callable, Optional

import pytest
import redis.asyncio as aioredis

from bullmq_compat import (
    FlowProducer,
    InvalidArgument,
    InvalidJobId,
    Job,
    Queue,
    QueueEvents,
    sync,
    uuid7_ids,
)
from bullmq_compat._job_ids import _UUID7
from bullmq_compat._wire.options import check_job_id
from tests.helpers import EventRecorder, wait_until
from tests.node import NodeProcess, node


def counting(prefix: str = "auto") -> tuple[Callable[[], str], list[str]]:
    """A generator of ``auto-1``, ``auto-2``...; the list holds what it returned."""
    made: list[str] = []
    numbers = itertools.count(1)

    def generate() -> str:
        made.append(f"{prefix}-{next(numbers)}")
        return made[-1]
    return generate, made


def uuid7_ms(text: str) -> int:
    return uuid.UUID(text).int >> 80


# -- uuid7_ids --------------------------------------------------------------------------------------
def test_uuid7_ids_are_version_7_unique_and_in_the_order_made() -> None:
    before = time.time_ns() // 1_000_000  # the clock both implementations read
    ids = [uuid7_ids() for _ in range(20000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # the text sorts as the ids were made (lower-case hex, fixed width)
    for text in (ids[0], ids[-1], ids[len(ids) // 2]):
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert check_job_id(text) == text  # a good custom id as it is
    # the ms timestamp is the clock's (the counter may borrow a ms or two at most here)
    assert before <= uuid7_ms(ids[0]) <= uuid7_ms(ids[-1]) <= after + 2


def test_own_uuid7_counts_up_when_the_clock_stands_still_goes_back_or_the_counter_overflows() -> None:
    now_ns = [1_700_000_000_000 * 1_000_000]
    make = _UUID7(clock=lambda: now_ns[0])
    still = [make() for _ in range(1000)]
    assert still == sorted(still) and len(set(still)) == 1000
    assert {uuid7_ms(t) for t in still} == {1_700_000_000_000}
    now_ns[0] -= 5_000 * 1_000_000  # the clock steps back 5 s: the ids still grow, on the last ms
    back = [make() for _ in range(10)]
    assert still[-1] < back[0] and back == sorted(back)
    assert {uuid7_ms(t) for t in back} == {1_700_000_000_000}
    make._counter = make._COUNTER_MAX  # the 42-bit counter is full: the next id borrows the next ms
    borrowed = make()
    assert borrowed > back[-1] and uuid7_ms(borrowed) == 1_700_000_000_001
    for text in still[:3] + back[:3] + [borrowed]:
        assert uuid.UUID(text).version == 7 and uuid.UUID(text).variant == uuid.RFC_4122
    now_ns[0] = 1_700_000_000_050 * 1_000_000  # a later ms: a fresh random counter, top bit clear
    fresh = make()
    assert uuid7_ms(fresh) == 1_700_000_000_050 and make._counter < 1 << 41


def test_uuid7_ids_from_many_threads_are_unique_and_ours_ordered_per_thread() -> None:
    for make, ordered in ((uuid7_ids, False), (_UUID7(), True)):
        per_thread: list[list[str]] = []

        def run() -> None:
            mine = [make() for _ in range(3000)]
            per_thread.append(mine)
        threads = [threading.Thread(target=run) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        every = [text for mine in per_thread for text in mine]
        assert len(every) == 18000 and len(set(every)) == 18000
        if ordered:  # ours holds a lock; the standard library's (3.14+) takes none, so racing threads may cross
            assert all(mine == sorted(mine) for mine in per_thread)


# -- Queue.add / add_bulk with a generator (Redis) ------------------------------------------------
async def test_add_and_add_bulk_take_ids_from_the_generator_and_an_explicit_id_wins(
        redis_url: str, queue_name: str, redis: aioredis.Redis) -> None:
    generate, made = counting()
    async with Queue(queue_name, connection=redis_url, job_id_generator=generate,
                     default_job_options={"attempts": 2}) as queue:
        assert queue.job_id_generator is generate
        first = await queue.add("report", {"n": 1})
        own = await queue.add("invoice", {"n": 2}, job_id="invoice-7")
        node_named = await queue.add("invoice", {"n": 3}, **{"jobId": "invoice-8"})
        unset = await queue.add("report", {"n": 4}, job_id=None)  # None is no id: the generator's
        bulk = await queue.add_bulk([
            {"name": "a", "data": {"n": 5}, "opts": {"job_id": "item-a"}},
            {"name": "b", "data": {"n": 6}},
            {"name": "c", "data": {"n": 7}, "opts": {"delay": 60000}},
        ])
        assert made == ["auto-1", "auto-2", "auto-3", "auto-4"]  # called only for adds with no id
        assert [first.id, own.id, node_named.id, unset.id] == ["auto-1", "invoice-7", "invoice-8", "auto-2"]
        assert [job.id for job in bulk] == ["item-a", "auto-3", "auto-4"]
        assert first.opts["job_id"] == "auto-1" and first.opts["attempts"] == 2
        stored = await queue.get_job("auto-4")
        assert stored is not None and stored.name == "c" and stored.data == {"n": 7}
        assert await stored.get_state() == "delayed"
        waiting = [job.id for job in await queue.get_waiting()]
        assert waiting == ["auto-1", "invoice-7", "invoice-8", "auto-2", "item-a", "auto-3"]
    async with Queue(queue_name, connection=redis_url) as plain:
        assert plain.job_id_generator is None
        counted = await plain.add("counted", {})  # no generator: the queue's counter (which upstream's
        assert counted.id == str(int(await redis.get(f"bull:{queue_name}:id")))  # scripts draw for every add)


async def test_the_generator_gets_name_and_data_when_its_signature_takes_them(redis_url: str,
                                                                             queue_name: str) -> None:
    seen: list[tuple[Any, Any]] = []

    def from_job(name: str, data: Any) -> str:
        seen.append((name, data))
        return f"{name}-{data['order']}" if data else f"{name}-none"

    def with_default(prefix: str = "d") -> str:  # callable with no arguments: called so
        return f"{prefix}-{uuid.uuid4().hex}"

    def star(*args: Any) -> str:  # takes (name, data) as well: given them
        return "star-" + "-".join(str(a) for a in args)

    async with Queue(queue_name, connection=redis_url, job_id_generator=from_job) as queue:
        assert (await queue.add("ship", {"order": 17})).id == "ship-17"
        assert (await queue.add("ship")).id == "ship-none"
        assert [j.id for j in await queue.add_bulk([{"name": "bill", "data": {"order": 3}}])] == ["bill-3"]
        assert seen == [("ship", {"order": 17}), ("ship", None), ("bill", {"order": 3})]
    async with Queue(queue_name, connection=redis_url, job_id_generator=with_default) as queue:
        assert (await queue.add("x", {})).id.startswith("d-")
    async with Queue(queue_name, connection=redis_url, job_id_generator=star) as queue:
        assert (await queue.add("y", "payload")).id == "star-y-payload"
    async with Queue(queue_name, connection=redis_url, job_id_generator=uuid7_ids) as queue:
        job = await queue.add("z", {})
        assert uuid.UUID(str(job.id)).version == 7
    # a builtin without a signature (next) is called bare, as such callables usually are
    handed = functools.partial(next, iter(["from-a-list-1", "from-a-list-2"]))
    async with Queue(queue_name, connection=redis_url, job_id_generator=handed) as queue:
        assert [(await queue.add("w")).id for _ in range(2)] == ["from-a-list-1", "from-a-list-2"]


async def _not_plain() -> str:
    return "never"


def _one_argument(name: str) -> str:
    return name


def _a_generator() -> Any:
    yield "x"


@pytest.mark.parametrize("bad, rule", [
    ("uuid", "must be a function returning a str job id, or None"),
    (_not_plain, "must be a plain function returning a str (not async, not a generator): it is called inside add"),
    (_a_generator, "must be a plain function returning a str (not async, not a generator): it is called inside add"),
    (_one_argument, "must take no arguments or (name, data); its signature is (name: 'str') -> 'str'"),
], ids=["not-callable", "async", "generator-function", "one-argument"])
def test_a_generator_that_cannot_be_called_so_is_refused_when_the_queue_is_made(bad: Any, rule: str) -> None:
    for make in (lambda: Queue("q", "redis://127.0.0.1:1/0", job_id_generator=bad),
                 lambda: FlowProducer("redis://127.0.0.1:1/0", job_id_generator=bad),
                 lambda: sync.Queue("q", "redis://127.0.0.1:1/0", job_id_generator=bad)):
        with pytest.raises(InvalidArgument) as caught:
            make()
        assert str(caught.value) == f"job_id_generator={bad!r} {rule}"


@pytest.mark.parametrize("value, message", [
    ("12", "job_id_generator returned '12': a custom job id cannot be an integer string: "
           "integer ids are the queue's own"),
    ("a:b", "job_id_generator returned 'a:b': a custom job id cannot contain ':' (it separates key parts in Redis)"),
    ("", "job_id_generator returned '': a custom job id must not be empty"),
    ("0", "job_id_generator returned '0': a custom job id cannot be '0' or start with '0:'"),
    (12, "job_id_generator returned 12: a custom job id must be a str (numeric ids are generated by the "
         "queue); return str(...) of it, not a int"),
    (uuid.UUID(int=7), "job_id_generator returned UUID('00000000-0000-0000-0000-000000000007'): a custom job id "
                       "must be a str (numeric ids are generated by the queue); return str(...) of it, not a UUID"),
], ids=["integer-text", "colon", "empty", "zero", "int", "uuid-object"])
async def test_a_generated_id_is_checked_as_a_custom_id_and_a_bad_one_writes_nothing(
        redis_url: str, queue_name: str, redis: aioredis.Redis, value: Any, message: str) -> None:
    handed = iter(["good-1", "good-2", value])
    async with Queue(queue_name, connection=redis_url, job_id_generator=lambda: next(handed)) as queue:
        with pytest.raises(InvalidJobId) as caught:
            await queue.add_bulk([{"name": "n", "data": {}} for _ in range(3)])
        assert str(caught.value) == message
        assert [key for key in await redis.keys(f"bull:{queue_name}:*") if not key.endswith(":meta")] == []
        assert await queue.get_job("good-1") is None and await queue.get_job("good-2") is None
        assert sum((await queue.get_job_counts()).values()) == 0
        handed = iter([value])
        with pytest.raises(InvalidJobId, match="^job_id_generator returned "):
            await queue.add("n", {})
        assert sum((await queue.get_job_counts()).values()) == 0


async def test_an_async_callable_in_disguise_is_refused_and_its_coroutine_closed(redis_url: str,
                                                                                 queue_name: str) -> None:
    made: list[Any] = []

    def disguised() -> Any:  # looks plain, returns a coroutine
        made.append(_not_plain())
        return made[-1]

    async with Queue(queue_name, connection=redis_url, job_id_generator=functools.partial(disguised)) as queue:
        with pytest.raises(InvalidJobId, match=r"^job_id_generator returned an awaitable \(<coroutine .*\): it must "
                                               r"be a plain function returning a str$"):
            await queue.add("n", {})
        assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED  # no 'never awaited' warning
        assert sum((await queue.get_job_counts()).values()) == 0


async def test_an_error_of_the_generator_itself_propagates_and_nothing_is_written(redis_url: str,
                                                                                  queue_name: str) -> None:
    calls = itertools.count()

    def flaky() -> str:
        if next(calls) == 1:
            raise LookupError("id service down")
        return str(uuid.uuid4())

    async with Queue(queue_name, connection=redis_url, job_id_generator=flaky) as queue:
        with pytest.raises(LookupError, match="id service down"):
            await queue.add_bulk([{"name": "n"}, {"name": "n"}, {"name": "n"}])
        assert sum((await queue.get_job_counts()).values()) == 0


async def test_options_are_checked_before_the_generator_is_called(redis_url: str, queue_name: str) -> None:
    generate, made = counting()
    async with Queue(queue_name, connection=redis_url, job_id_generator=generate) as queue:
        with pytest.raises(InvalidArgument, match="delay"):
            await queue.add("n", {}, delay=-1)
        assert made == []
        assert (await queue.add("n", {})).id == "auto-1"


async def test_group_jobs_take_generated_ids_too(redis_url: str, queue_name: str) -> None:
    generate, made = counting("g")
    async with Queue(queue_name, connection=redis_url, job_id_generator=generate) as queue:
        first = await queue.add("sync", {"step": 1}, group="user:42")
        bulk = await queue.add_bulk([{"name": "sync", "data": {"step": 2}, "opts": {"group": "user:42"}}])
        assert [first.id, bulk[0].id] == made == ["g-1", "g-2"]
        for job_id, step in (("g-1", 1), ("g-2", 2)):
            stored = await queue.get_job(job_id)
            assert stored is not None and stored.data == {"step": step}
            assert stored.opts["group"] == {"id": "user:42"}


# -- FlowProducer ----------------------------------------------------------------------------------
async def test_flow_producer_generates_the_id_of_every_node_without_one(redis_url: str, queue_name: str) -> None:
    seen: list[str] = []

    def generate(name: str, data: Any) -> str:
        seen.append(name)
        return f"{name}-{len(seen)}"

    async with FlowProducer(connection=redis_url, job_id_generator=generate) as flows:
        assert flows.job_id_generator is generate
        tree = await flows.add({
            "name": "render", "queue_name": queue_name, "data": {"movie": 7},
            "children": [
                {"name": "frame", "queue_name": f"{queue_name}-frames", "data": {"n": 1}},
                {"name": "frame", "queue_name": f"{queue_name}-frames", "data": {"n": 2},
                 "opts": {"job_id": "frame-own"}},
                {"name": "audio", "queue_name": queue_name, "data": {},
                 "children": [{"name": "track", "queue_name": queue_name, "data": {}}]},
            ],
        })
        assert seen == ["render", "frame", "audio", "track"]  # Node's order: level by level
        assert tree.job.id == "render-1"
        assert [child.job.id for child in tree.children] == ["frame-2", "frame-own", "audio-3"]
        assert tree.children[2].children[0].job.id == "track-4"
        assert await tree.job.get_state() == "waiting-children"
        track = await flows.queue(queue_name).get_job("track-4")
        assert track is not None and track.parent_key == f"bull:{queue_name}:audio-3"
    async with FlowProducer(connection=redis_url) as flows:  # no generator: UUIDv4, as Node's
        plain = await flows.add({"name": "p", "queue_name": queue_name, "data": {}})
        assert uuid.UUID(str(plain.job.id)).version == 4


async def test_a_bad_generated_id_in_a_flow_writes_none_of_its_nodes(redis_url: str, queue_name: str,
                                                                    redis: aioredis.Redis) -> None:
    handed = iter(["root-ok", "child-ok", "7"])
    async with FlowProducer(connection=redis_url, job_id_generator=lambda: next(handed)) as flows:
        with pytest.raises(InvalidJobId) as caught:
            await flows.add_bulk([
                {"name": "root", "queue_name": queue_name, "data": {},
                 "children": [{"name": "child", "queue_name": queue_name, "data": {}}]},
                {"name": "other", "queue_name": queue_name, "data": {}},
            ])
        # nodes are made level by level across the trees: the roots, then flow[0]'s child
        assert str(caught.value) == (f"flow[0].children[0] ('child' in queue '{queue_name}'): job_id_generator "
                                     "returned '7': a custom job id cannot be an integer string: integer ids are "
                                     "the queue's own")
        assert [key for key in await redis.keys(f"bull:{queue_name}*") if not key.endswith(":meta")] == []


# -- the sync API ----------------------------------------------------------------------------------
def test_the_sync_queue_and_flow_producer_take_a_generator(redis_url: str, queue_name: str) -> None:
    with sync.Queue(queue_name, redis_url, job_id_generator=uuid7_ids) as queue:
        assert queue.job_id_generator is uuid7_ids
        one = queue.add("n", {"k": 1})
        bulk = queue.add_bulk([{"name": "n", "data": {"k": 2}}, {"name": "n", "data": {"k": 3}}])
        ids = [str(one.id)] + [str(job.id) for job in bulk]
        assert all(uuid.UUID(i).version == 7 for i in ids) and ids == sorted(ids)
        assert [str(job.id) for job in queue.get_waiting()] == ids
        assert queue.get_job(ids[1]).data == {"k": 2}
    generate, made = counting("flow")
    with sync.FlowProducer(redis_url, job_id_generator=generate) as flows:
        tree = flows.add({"name": "p", "queue_name": queue_name, "data": {},
                          "children": [{"name": "c", "queue_name": queue_name, "data": {}}]})
        assert (tree.job.id, tree.children[0].job.id) == ("flow-1", "flow-2") and made == ["flow-1", "flow-2"]


# -- a repeated id: the retry after a lost reply ----------------------------------------------------
class LossyProxy:
    """A TCP proxy in front of a server that, once `arm`-ed, loses one reply: the first
    connection to send a request after arming has that request reach the server, which runs it
    and answers; the answer is dropped and both sides of that connection are cut, so the client
    sees its connection fail with no reply. Every other byte passes as it is."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: Optional[asyncio.AbstractServer] = None
        self._armed = False
        self._victim: Optional[object] = None
        self.dropped = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> "LossyProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def arm(self) -> None:
        self._armed, self._victim = True, None
        self.dropped.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.target)
        me = object()

        def cut() -> None:
            client_writer.transport.abort()
            server_writer.transport.abort()

        async def upstream() -> None:
            while data := await client_reader.read(65536):
                if self._armed and self._victim is None:
                    self._victim = me  # this request's answer is the one lost
                server_writer.write(data)
                await server_writer.drain()
            server_writer.close()

        async def downstream() -> None:
            while data := await server_reader.read(65536):
                if self._armed and self._victim is me:
                    self._armed = False
                    cut()
                    self.dropped.set()
                    return
                client_writer.write(data)
                await client_writer.drain()
            client_writer.close()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            cut()
            self._tasks.difference_update(tasks)


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's (user and password kept)."""
    parts = urllib.parse.urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"))


async def add_with_retry(queue: Queue, name: str, data: Any, tries: int = 5, **opts: Any) -> Job:
    """The producer's retry loop of docs/queue.md ("Job ids"), as the page writes it: the id is
    fixed once, before the first try, and every try sends it again."""
    opts.setdefault("job_id", uuid7_ids())      # one id for every try
    for attempt in range(tries):
        try:
            return await queue.add(name, data, **opts)
        except Exception as err:
            if attempt == tries - 1 or not queue.backend.is_transient(err):
                raise                           # not connection trouble, or out of tries
            await asyncio.sleep(0.1 * 2 ** attempt)
    raise AssertionError("unreachable")


async def _lost_reply_then_retry(queue: Queue, events: QueueEvents, proxy: LossyProxy) -> None:
    recorder = EventRecorder(events, "duplicated", "added")  # listeners get (fields, event id)
    warm = await queue.add("warm-up", {})  # connections open, scripts/statements ready: the next
    await wait_until(lambda: any(a[0]["jobId"] == warm.id for a in recorder.of("added")), 30, "warm-up added")
    errors: list[BaseException] = []  # what the retry loop took for connection trouble
    is_transient = queue.backend.is_transient
    queue.backend.is_transient = lambda err: errors.append(err) or is_transient(err)  # type: ignore[method-assign]
    proxy.arm()                            # request to go through the proxy is the add
    job = await add_with_retry(queue, "charge", {"order": 42})
    assert proxy.dropped.is_set() and len(errors) == 1, errors  # the first try reached the server, lost its reply
    assert job.name == "charge" and job.data == {"order": 42}
    assert await queue.get_job_counts("waiting") == {"waiting": 2}  # warm-up and charge: one charge
    stored = await queue.get_job(str(job.id))
    assert stored is not None and stored.data == {"order": 42}
    await wait_until(lambda: recorder.of("duplicated"), 30, "the duplicated event")
    assert [e[0] for e in recorder.of("added") if e[0]["jobId"] == job.id] == [{"jobId": job.id, "name": "charge"}]
    assert [e[0] for e in recorder.of("duplicated")] == [{"jobId": job.id}]  # the retry's add: ignored, announced


async def test_a_retry_after_a_lost_reply_leaves_one_job_and_a_duplicated_event_on_redis(
        redis_url: str, queue_name: str) -> None:
    parts = urllib.parse.urlsplit(redis_url)
    async with LossyProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy, \
            QueueEvents(queue_name, connection=redis_url) as events, \
            Queue(queue_name, connection=through(redis_url, proxy.port)) as queue:
        await _lost_reply_then_retry(queue, events, proxy)


async def test_a_retry_after_a_lost_reply_leaves_one_job_and_a_duplicated_event_on_postgres(
        postgres_url: str, pg_migrated: str, queue_name: str) -> None:
    parts = urllib.parse.urlsplit(postgres_url)
    async with LossyProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy, \
            QueueEvents(queue_name, postgres_url, schema=pg_migrated) as events, \
            Queue(queue_name, connection=through(postgres_url, proxy.port), schema=pg_migrated) as queue:
        await _lost_reply_then_retry(queue, events, proxy)


async def test_a_repeated_id_returns_the_first_job_untouched(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        first = await queue.add("n", {"v": 1}, job_id="same")
        again = await queue.add("n", {"v": 2}, job_id="same", delay=60000)
        assert again.id == first.id == "same"
        assert again.data == {"v": 2}  # the Job returned is built from the call, as Node's Queue.add
        stored = await queue.get_job("same")
        assert stored is not None and stored.data == {"v": 1} and await stored.get_state() == "waiting"
        assert sum((await queue.get_job_counts()).values()) == 1


# -- PostgreSQL ------------------------------------------------------------------------------------
async def test_generated_ids_on_postgres(postgres_url: str, pg_migrated: str, queue_name: str) -> None:
    generate, made = counting()
    async with Queue(queue_name, connection=postgres_url, schema=pg_migrated, job_id_generator=generate) as queue:
        one = await queue.add("a", {"n": 1})
        own = await queue.add("b", {"n": 2}, job_id="own-1")
        bulk = await queue.add_bulk([{"name": "c", "data": {"n": 3}}, {"name": "d", "data": {"n": 4},
                                                                       "opts": {"priority": 2}}])
        assert [one.id, own.id, *[j.id for j in bulk]] == ["auto-1", "own-1", "auto-2", "auto-3"]
        assert await queue.get_job_state("auto-3") == "prioritized"
        assert [j.id for j in await queue.get_waiting()] == ["auto-1", "own-1", "auto-2"]
        stored = await queue.get_job("auto-2")
        assert stored is not None and stored.name == "c" and stored.data == {"n": 3}
        handed = iter(["fine", "no:colons"])
        bad = Queue(queue_name, connection=postgres_url, schema=pg_migrated, job_id_generator=lambda: next(handed))
        try:
            with pytest.raises(InvalidJobId, match="^job_id_generator returned 'no:colons': a custom job id cannot"):
                await bad.add_bulk([{"name": "x"}, {"name": "y"}])
            assert await bad.get_job("fine") is None
        finally:
            await bad.close()
        assert sum((await queue.get_job_counts()).values()) == 4
    async with FlowProducer(postgres_url, schema=pg_migrated, job_id_generator=uuid7_ids) as flows:
        tree = await flows.add({"name": "p", "queue_name": queue_name, "data": {},
                                "children": [{"name": "c", "queue_name": queue_name, "data": {}}]})
        ids = [str(tree.job.id), str(tree.children[0].job.id)]
        assert all(uuid.UUID(i).version == 7 for i in ids) and ids == sorted(ids)
        assert await tree.job.get_state() == "waiting-children"
        child = await flows.queue(queue_name).get_job(ids[1])
        assert child is not None and child.parent_key is not None and child.parent_key.endswith(ids[0])


# -- Node BullMQ reads and works the generated ids ----------------------------------------------
async def _python_adds_node_reads(queue: Queue, args: dict[str, Any], queue_name: str) -> None:
    one = await queue.add("first", {"k": 1})
    bulk = await queue.add_bulk([{"name": "second", "data": {"k": 2}}, {"name": "third", "data": {"k": 3}}])
    ids = [str(one.id)] + [str(job.id) for job in bulk]
    assert all(uuid.UUID(i).version == 7 for i in ids) and ids == sorted(ids)
    for job_id, name, k in zip(ids, ("first", "second", "third"), (1, 2, 3)):
        seen = await node("getJob", **args, queue=queue_name, id=job_id)
        assert seen["id"] == job_id and seen["name"] == name and seen["data"] == {"k": k}
        assert seen["state"] == "waiting" and seen["opts"]["jobId"] == job_id
    assert await node("getJobs", **args, queue=queue_name, types=["waiting"], asc=True) == ids
    async with NodeProcess.work(**args, queue=queue_name, count=3, timeoutMs=90000) as worker:
        outcome = await worker.result()
    assert outcome["completed"] == ids and outcome["failed"] == [] and not outcome["timedOut"]
    for job_id, k in zip(ids, (1, 2, 3)):
        done = await queue.get_job(job_id)
        assert done is not None and await done.get_state() == "completed"
        assert done.returnvalue == {"echo": {"k": k}}


@pytest.mark.node
async def test_node_reads_lists_and_works_generated_ids_on_redis(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url, job_id_generator=uuid7_ids) as queue:
        await _python_adds_node_reads(queue, {"redis": redis_url}, queue_name)


@pytest.mark.node
async def test_node_reads_lists_and_works_generated_ids_on_postgres(postgres_url: str, pg_migrated: str,
                                                                    queue_name: str) -> None:
    async with Queue(queue_name, connection=postgres_url, schema=pg_migrated, job_id_generator=uuid7_ids) as queue:
        await _python_adds_node_reads(queue, {"postgres": postgres_url, "schema": pg_migrated, "migrate": False},
                                      queue_name)
