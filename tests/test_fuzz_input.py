"""Bad input with hypothesis (issue #7): random queue names, job names, data, options and job ids.

Every ``Queue.add`` is either

- accepted, and then Node BullMQ's ``getJob`` reads back the same name, data and options (as Node
  shows them; all accepted jobs are read in one ``cli.js getJobsMany`` run at the end), or
- refused with an `InvalidArgument` subclass whose message names the offending value (its repr or
  the option's name), with nothing written (no job hash, no id counter, no meta).

And random corrupt job hashes pushed to ``wait`` are each failed by a worker with a reason, while
the worker keeps running (and processes a healthy job afterwards).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
import uuid
from typing import Any, Iterator, Optional

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bullmq_compat import (
    InvalidArgument,
    InvalidJobData,
    InvalidJobId,
    InvalidJobOptions,
    InvalidQueueName,
    Queue,
    Worker,
)
from tests.node import node

RUN = uuid.uuid4().hex[:6]
_counter = itertools.count()
MAX_SAFE = 2**53 - 1

# Python name -> Node name, written out here (not taken from the library under test)
PY_TO_NODE = {
    "timestamp": "timestamp", "priority": "priority", "delay": "delay", "attempts": "attempts",
    "backoff": "backoff", "lifo": "lifo", "remove_on_complete": "removeOnComplete",
    "remove_on_fail": "removeOnFail", "keep_logs": "keepLogs", "stack_trace_limit": "stackTraceLimit",
    "size_limit": "sizeLimit", "job_id": "jobId", "prev_millis": "prevMillis",
    "fail_parent_on_failure": "failParentOnFailure", "continue_parent_on_failure": "continueParentOnFailure",
    "ignore_dependency_on_failure": "ignoreDependencyOnFailure",
    "remove_dependency_on_failure": "removeDependencyOnFailure", "deduplication": "deduplication",
    "telemetry": "telemetry", "repeat_job_key": "repeatJobKey", "group": "group", "order_ms": "orderMs",
}
NESTED_TO_NODE = {"keep_last_if_active": "keepLastIfActive", "omit_context": "omitContext"}
# 'parent' is left out: a missing parent is refused by the script (ParentJobNotFound), not the edge
OPTION_NAMES = sorted(set(PY_TO_NODE) | set(PY_TO_NODE.values()))


# -- strategies --------------------------------------------------------------------------------------
def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], bad_in: int = 6) -> st.SearchStrategy[Any]:
    """``good``, but ``bad`` about once in ``bad_in`` draws (so that about half the adds are accepted)."""
    return st.integers(0, bad_in - 1).flatmap(lambda i: bad if i == 0 else good)


SURROGATES = st.sampled_from(["\ud800", "\udfff", "x\udc80y"])
odd_texts = st.one_of(
    st.text(max_size=3).map(lambda s: s + "\ud83d"),  # a lone high surrogate
    st.sampled_from(["", ":", "a:b", "0", "0:x", "12", "-3", "007", " 1", "\x00", "*?[]", "é", "١٢"]))
texts = mostly(st.text(max_size=12), odd_texts, 4)  # st.text() itself never draws surrogates
safe_ints = st.integers(min_value=-MAX_SAFE, max_value=MAX_SAFE)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), safe_ints, finite_floats, st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=12)


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


not_json_leaves = st.one_of(
    st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.binary(max_size=4),
    st.frozensets(st.integers(0, 3), max_size=2), st.builds(Opaque), SURROGATES)
not_json = st.one_of(
    not_json_leaves,
    st.tuples(st.text(max_size=4), not_json_leaves).map(lambda kv: {kv[0]: kv[1]}),
    st.tuples(json_values, not_json_leaves).map(lambda pair: [pair[0], pair[1]]),
    st.just({(1, 2): "tuple key"}))
# keys json turns into strings: {1: x} is stored as {"1": x}
odd_keys = st.dictionaries(st.one_of(st.integers(-5, 5), st.booleans(), st.none()), json_values, max_size=3)
datas = mostly(st.one_of(json_values, odd_keys), not_json)

random_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10), st.integers(), st.floats(), texts,
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["type", "delay", "jitter", "age", "count", "limit", "id", "ttl", "extend",
                                     "replace", "keep_last_if_active", "keepLastIfActive", "metadata",
                                     "omit_context", "omitContext", "queue", "nope"]),
                    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), texts), max_size=3))
job_ids = mostly(st.text(st.characters(codec="utf-8", exclude_characters=":"), min_size=1, max_size=10).filter(
    lambda s: s.lstrip("+-") == "" or not s.lstrip("+-").isdigit()), odd_texts, 4)


def plausible(option: str) -> st.SearchStrategy[Any]:
    """Values an option would take in real use (so that many adds are accepted)."""
    node_name = PY_TO_NODE.get(option, option)
    small = st.integers(0, 10_000)
    return {
        "timestamp": st.integers(1, 2_000_000_000_000), "priority": st.integers(0, 2**21 - 1), "delay": small,
        "attempts": st.integers(0, 20), "lifo": st.booleans(), "keepLogs": small, "stackTraceLimit": small,
        "sizeLimit": st.integers(0, 400), "prevMillis": small,
        "backoff": st.one_of(small, st.fixed_dictionaries(
            {"type": st.sampled_from(["fixed", "exponential", "custom"])},
            optional={"delay": small, "jitter": st.floats(0, 1)})),
        "removeOnComplete": st.one_of(st.booleans(), small, st.fixed_dictionaries(
            {}, optional={"age": small, "count": small, "limit": small})),
        "removeOnFail": st.one_of(st.booleans(), small),
        "jobId": job_ids, "repeatJobKey": st.text(max_size=8),
        "failParentOnFailure": st.booleans(), "continueParentOnFailure": st.booleans(),
        "ignoreDependencyOnFailure": st.booleans(), "removeDependencyOnFailure": st.booleans(),
        "deduplication": st.fixed_dictionaries({"id": st.text(min_size=1, max_size=8)}, optional={
            "ttl": small, "extend": st.booleans(), "replace": st.booleans(), "keep_last_if_active": st.booleans()}),
        "telemetry": st.fixed_dictionaries({}, optional={"metadata": st.text(max_size=10),
                                                          "omit_context": st.booleans()}),
        "group": st.one_of(st.text(min_size=1, max_size=8), st.fixed_dictionaries({"id": texts})),
        "orderMs": small,
    }.get(node_name, random_values)


unknown_names = st.text(min_size=1, max_size=10).filter(
    lambda s: s not in PY_TO_NODE and s not in PY_TO_NODE.values() and s not in ("name", "data", "parent"))


@st.composite
def option_dicts(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(OPTION_NAMES), max_size=3, unique=True))
    opts = {n: draw(mostly(plausible(n), random_values, 8)) for n in names}
    if draw(st.integers(0, 11)) == 0:
        opts[draw(unknown_names)] = draw(random_values)
    return opts


queue_names = mostly(
    st.tuples(st.just("fresh"), st.text(st.characters(codec="utf-8", exclude_characters=":"), max_size=10)),
    st.tuples(st.just("raw"), st.one_of(st.just(""), st.integers(), st.none(), texts.map(lambda s: s + ":q"),
                                        SURROGATES)), 10)
job_names = mostly(st.text(max_size=12), st.one_of(st.integers(), st.none(), st.binary(max_size=3), SURROGATES), 8)


# -- the checks ----------------------------------------------------------------------------------------
def roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def as_node(value: Any, cjson: bool = False) -> Any:
    """Numbers as the doubles Node holds: JSON.stringify writes an integral double beyond 2**53 as
    an integer literal of its shortest digits (-6.586357536535775e16 as -65863575365357750).

    ``cjson``: options pass through the upstream scripts (msgpack in, Lua cjson out), and cjson
    writes numbers with 14 significant digits, for Node's adds just the same (a jitter of
    0.3849184330845953 is stored as 0.3849184330846)."""
    if isinstance(value, dict):
        return {k: as_node(v, cjson) for k, v in value.items()}
    if isinstance(value, list):
        return [as_node(v, cjson) for v in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > MAX_SAFE:
        value = float(value)
    if cjson and isinstance(value, (int, float)):
        return float(f"{value:.14g}")
    return value


def expected_data(data: Any) -> Any:
    return {} if data is None else roundtrip(data)  # data=None is "no data", stored as Node's default {}


def expected_node_opts(opts: dict[str, Any]) -> dict[str, Any]:
    """How Node's job.opts shows what the caller asked for."""
    out: dict[str, Any] = {"attempts": 0}
    for key, value in opts.items():
        if value is None:
            continue
        node_name = PY_TO_NODE.get(key, key)
        if node_name in ("orderMs", "repeatJobKey"):  # not job options on the wire
            continue
        if node_name == "group" and isinstance(value, str):
            value = {"id": value}
        elif node_name == "backoff" and isinstance(value, (int, float)):
            value = {"type": "fixed", "delay": value}
        elif isinstance(value, dict):
            value = {NESTED_TO_NODE.get(k, k): v for k, v in value.items() if v is not None}
            if node_name == "telemetry" and not value:
                continue
        out[node_name] = value
    return roundtrip(out)


def leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from leaves(v)
    else:
        yield value


def names_the_culprit(err: InvalidArgument, queue_name: Any, name: Any, data: Any, opts: dict[str, Any]) -> bool:
    """The message holds the offending value's repr, or the offending option's name."""
    message = str(err)
    if isinstance(err, InvalidQueueName):
        return repr(queue_name) in message
    if isinstance(err, InvalidJobData):
        return repr(data)[:60] in message or any(repr(leaf) in message or type(leaf).__name__ in message
                                                 for leaf in leaves(data))
    if isinstance(err, (InvalidJobId, InvalidJobOptions)):
        for key, value in opts.items():
            node_name = PY_TO_NODE.get(key, key)
            python = {v: k for k, v in PY_TO_NODE.items()}.get(key, key)
            if any(n in message for n in (repr(key), key, node_name, python)) or repr(value) in message:
                return True
        return False
    return repr(name) in message  # the job name


class Harness:
    """One event loop and one Redis client for all examples of a hypothesis run."""

    def __init__(self, redis_url: str) -> None:
        self.url = redis_url
        self.loop = asyncio.new_event_loop()
        self.redis: aioredis.Redis = self.run(self._client())
        self.accepted: list[dict[str, Any]] = []
        self.refused = 0

    async def _client(self) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url, decode_responses=True)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.redis.aclose())
        self.loop.close()

    async def nothing_written(self, queue_name: str, opts: dict[str, Any]) -> bool:
        base = f"bull:{queue_name}"
        keys = [f"{base}:id", f"{base}:meta", f"{base}:1", f"{base}:wait", f"{base}:events"]
        job_id = opts.get("job_id", opts.get("jobId"))
        if isinstance(job_id, str) and not any("\ud800" <= c <= "\udfff" for c in job_id):
            keys.append(f"{base}:{job_id}")
        return await self.redis.exists(*keys) == 0

    async def one(self, queue_spec: tuple[str, Any], name: Any, data: Any, opts: dict[str, Any]) -> None:
        kind, raw = queue_spec
        queue_name = f"{raw}~{RUN}{next(_counter)}" if kind == "fresh" and isinstance(raw, str) else raw
        case = f"queue={queue_name!r} name={name!r} data={data!r} opts={opts!r}"
        try:
            queue = Queue(queue_name, connection=self.redis)
        except InvalidArgument as err:
            assert names_the_culprit(err, queue_name, name, data, opts), f"{err} -- {case}"
            self.refused += 1
            return
        try:
            try:
                job = await queue.add(name, data, **opts)
            except InvalidArgument as err:
                assert names_the_culprit(err, queue_name, name, data, opts), f"unclear message: {err} -- {case}"
                assert await self.nothing_written(queue_name, opts), f"refused but written: {err} -- {case}"
                self.refused += 1
                return
            except Exception as err:  # anything else is a bug: bad input must be refused at the edge
                raise AssertionError(f"{type(err).__name__}: {err} -- {case}") from err
            stored = await queue.get_job(str(job.id))
            assert stored is not None and stored.name == name and stored.data == expected_data(data), case
            self.accepted.append({"queue": queue_name, "id": str(job.id), "name": name, "data": data,
                                  "opts": opts, "case": case})
        finally:
            await queue.close()


@pytest.mark.node
def test_add_accepts_or_refuses_cleanly(redis_url: str) -> None:
    harness = Harness(redis_url)
    try:
        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(queue_spec=queue_names, name=job_names, data=datas, opts=option_dicts())
        def add_one(queue_spec: tuple[str, Any], name: Any, data: Any, opts: dict[str, Any]) -> None:
            harness.run(harness.one(queue_spec, name, data, opts))

        add_one()
        assert len(harness.accepted) >= 20 and harness.refused >= 20, (len(harness.accepted), harness.refused)

        # every accepted job, as Node BullMQ reads it, in one node process
        items = [{"queue": a["queue"], "id": a["id"]} for a in harness.accepted]
        reply = harness.run(node("getJobsMany", redis=redis_url, queue=f"fuzz-probe-{RUN}", items=items))
        seen = json.loads(reply["json"])
        assert len(seen) == len(items)
        for accepted, job in zip(harness.accepted, seen):
            case = accepted["case"]
            assert job is not None, f"Node cannot find the job -- {case}"
            assert job["id"] == accepted["id"], case
            assert job["name"] == accepted["name"], case
            assert as_node(job["data"]) == as_node(expected_data(accepted["data"])), case
            assert as_node(job["opts"], cjson=True) == as_node(expected_node_opts(accepted["opts"]), cjson=True), \
                f"{job['opts']} -- {case}"
    finally:
        harness.close()


# -- corrupt job hashes ----------------------------------------------------------------------------------
# What a producer writes (name, data, opts) and what only describes the job: a worker reads these
# itself, so each corrupt job must end failed with a reason (or completed, if still readable).
PAYLOAD_FIELDS = ["name", "data", "opts", "timestamp", "delay", "priority", "stacktrace", "progress",
                  "returnvalue", "failedReason", "processedOn", "finishedOn", "attemptsMade", "deid", "rjk",
                  "gid", "defa", "pb"]
# Fields the upstream Lua scripts do arithmetic on or decode themselves: corrupt, they make
# moveToActive/moveToFinished raise a Lua error (for Node workers just the same), so such a job
# cannot be finished at all; the worker must only keep going.
SCRIPT_STATE_FIELDS = ["ats", "atm", "stc", "parent", "parentKey"]
junk = st.one_of(st.text(max_size=12), st.binary(max_size=12), st.sampled_from(
    ["", "{", "[1,", "null", "[]", "\"str\"", "-1", "1e999", "NaN", "{\"attempts\": \"x\"}",
     "{\"backoff\": 5, \"attempts\": 3}", "{\"removeOnComplete\": \"yes\"}", "{\"parent\": 1}",
     "{\"de\": {\"id\": 5}}", "{\"group\": {\"id\": []}}", "{\"kl\": -1, \"attempts\": 1e400}",
     "{\"id\":\"x\",\"queueKey\":\"bull:nope\"}", "bull:nope:1"]))
corrupt_hashes = st.dictionaries(st.sampled_from(PAYLOAD_FIELDS), junk, max_size=8)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def must_fail(fields: dict[str, Any]) -> bool:
    """A hash no worker can read as a job: no name, data not JSON, opts not a JSON object, or a
    deferred failure (``defa``) set."""
    if "name" not in fields or _text(fields.get("defa") or ""):
        return True
    def no_constants(name: str) -> Any:  # JSON.parse refuses NaN and Infinity
        raise ValueError(name)
    try:
        json.loads(_text(fields.get("data", "{}")), parse_constant=no_constants)
        opts = json.loads(_text(fields.get("opts") or "{}"), parse_constant=no_constants)
    except ValueError:
        return True
    return not isinstance(opts, dict)


async def _where(redis: aioredis.Redis, queue_name: str, job_id: str) -> list[str]:
    """The upstream states that list ``job_id`` (for failure messages)."""
    base = f"bull:{queue_name}:"
    found = [name for name in ("delayed", "prioritized", "waiting-children", "completed", "failed")
             if await redis.zscore(base + name, job_id) is not None]
    found += [name for name in ("wait", "active", "paused")
              if job_id.encode() in await redis.lrange(base + name, 0, -1)]
    return found


async def _finished(redis: aioredis.Redis, queue_name: str, ids: list[str]) -> Optional[dict[str, str]]:
    """{id: state} once every id is completed or failed, else None."""
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.zscore(f"bull:{queue_name}:completed", job_id)
        pipe.zscore(f"bull:{queue_name}:failed", job_id)
    replies = await pipe.execute()
    states: dict[str, str] = {}
    for i, job_id in enumerate(ids):
        done, failed = replies[2 * i], replies[2 * i + 1]
        if done is None and failed is None:
            return None
        states[job_id] = "completed" if done is not None else "failed"
    return states


def test_worker_fails_corrupt_jobs_and_keeps_running(redis_url: str) -> None:
    loop = asyncio.new_event_loop()
    queue_name = f"fuzz-corrupt-{RUN}"
    redis = loop.run_until_complete(_bytes_client(redis_url))
    ran: list[str] = []
    errors: list[BaseException] = []

    async def process(job: Any) -> str:
        ran.append(str(job.id))
        return "ok"

    worker = Worker(queue_name, process, connection=redis_url, drain_delay=0.5, lock_duration=2000,
                    stalled_interval=1000)
    worker.on("error", lambda err, *_: errors.append(err))
    run_task = loop.create_task(worker.run(handle_signals=False))
    batch_no = itertools.count()
    total = 0
    try:
        @settings(max_examples=6, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(batch=st.lists(corrupt_hashes, min_size=5, max_size=15))
        def push_batch(batch: list[dict[str, Any]]) -> None:
            nonlocal total
            ids = [f"bad{next(batch_no)}-{i}" for i in range(len(batch))]
            total += len(ids)

            async def go() -> None:
                for job_id, fields in zip(ids, batch):
                    key = f"bull:{queue_name}:{job_id}"
                    if fields:
                        await redis.hset(key, mapping=fields)
                    await redis.lpush(f"bull:{queue_name}:wait", job_id)
                await redis.zadd(f"bull:{queue_name}:marker", {"0": 0})
                deadline = time.monotonic() + 10
                states = None
                while states is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    states = await _finished(redis, queue_name, ids)
                if states is None:  # say which jobs are stuck, where, and what the worker reported
                    stuck = {}
                    for job_id, fields in zip(ids, batch):
                        if await _finished(redis, queue_name, [job_id]) is None:
                            stuck[job_id] = (fields, await _where(redis, queue_name, job_id))
                    raise AssertionError(f"not all finished in 10 s: {stuck}; worker errors: {errors[-3:]!r}")
                assert not run_task.done(), "the worker stopped"
                for job_id, fields in zip(ids, batch):
                    if must_fail(fields):
                        assert states[job_id] == "failed", f"an unreadable job completed: {fields}"
                    if states[job_id] == "failed":
                        reason = await redis.hget(f"bull:{queue_name}:{job_id}", "failedReason")
                        assert reason, f"failed without a reason: {fields}"
                    elif job_id not in ran:
                        raise AssertionError(f"completed without being processed: {fields}")
            loop.run_until_complete(go())

        push_batch()

        async def healthy() -> None:
            async with Queue(queue_name, connection=redis_url) as queue:
                job = await queue.add("healthy", {"ok": True})
                deadline = time.monotonic() + 10
                while str(job.id) not in ran:
                    assert time.monotonic() < deadline, "the worker no longer processes jobs"
                    await asyncio.sleep(0.05)
        loop.run_until_complete(healthy())
        assert total > 0
    finally:
        loop.run_until_complete(worker.close())
        loop.run_until_complete(asyncio.wait_for(run_task, 10))
        loop.run_until_complete(redis.aclose())
        loop.close()


@pytest.mark.parametrize("opts", [
    '{"attempts": 1e400}', '{"delay": 1e400, "priority": "x"}', '{"attempts": -1e400, "backoff": 5}',
], ids=["attempts-inf", "delay-inf", "attempts-minus-inf"])
@pytest.mark.parametrize("data", ["{}", "not json"], ids=["data-ok", "data-corrupt"])
async def test_non_finite_numbers_in_stored_opts_end_the_job_with_a_reason(
        redis_url: str, opts: str, data: str) -> None:
    """JSON numbers too big for a double (1e400) read back as infinity; a job holding one in its opts
    must still end (failed with a reason, or completed if still readable) instead of making every
    finish attempt raise. Found by the corrupt-hash fuzz test above."""
    queue_name = f"fuzz-inf-{RUN}-{abs(hash((opts, data)))}"
    redis = await _bytes_client(redis_url)
    try:
        await redis.hset(f"bull:{queue_name}:bad", mapping={"name": "n", "data": data, "opts": opts})
        await redis.lpush(f"bull:{queue_name}:wait", "bad")
        async with Worker(queue_name, lambda job: "ok", connection=redis_url, drain_delay=0.5):
            states = None
            deadline = time.monotonic() + 10
            while states is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                states = await _finished(redis, queue_name, ["bad"])
        assert states is not None, "the job never ended"
        if data == "not json" or "attempts" in opts:  # unreadable: failed with a reason
            assert states == {"bad": "failed"}
            assert await redis.hget(f"bull:{queue_name}:bad", "failedReason")
        # else still readable (a delay or priority that is not a number counts as none): it may complete
    finally:
        await redis.aclose()


@pytest.mark.parametrize("field", SCRIPT_STATE_FIELDS)
async def test_worker_keeps_going_past_jobs_the_scripts_cannot_move(redis_url: str, field: str) -> None:
    queue_name = f"fuzz-state-{field}-{RUN}"
    redis = await _bytes_client(redis_url)
    ran: list[str] = []

    async def process(job: Any) -> str:
        ran.append(str(job.id))
        return "ok"

    try:
        for i, value in enumerate(["x\xff", b"\xfe", "1e999"]):
            await redis.hset(f"bull:{queue_name}:bad{i}", mapping={"name": "n", "data": "{}", field: value})
            await redis.lpush(f"bull:{queue_name}:wait", f"bad{i}")
        async with Queue(queue_name, connection=redis_url) as queue, \
                Worker(queue_name, process, connection=redis_url, concurrency=6, drain_delay=0.5,
                       lock_duration=1000, stalled_interval=500) as worker:
            # (a slot whose call fails waits 1 s before its next one, and the stuck jobs keep coming
            # back to the front of the line: with more slots than stuck jobs, some slot is always
            # free for the healthy ones, however the timing of a busy machine falls)
            errors: list[BaseException] = []
            worker.on("error", lambda err, *_: errors.append(err))
            healthy = [await queue.add("healthy", {"i": i}) for i in range(3)]
            deadline = time.monotonic() + 15
            while not all(str(j.id) in ran for j in healthy):
                assert time.monotonic() < deadline, f"healthy jobs not processed; errors: {errors[:3]}"
                await asyncio.sleep(0.05)
            assert worker.running
            await asyncio.sleep(1.2)  # a stalled-check round with the stuck jobs: still running
            late = await queue.add("late", {})
            # the stuck jobs cycle (stalled, back to the front of wait, fetched, refused again), so the
            # late job's turn depends on timing: the deadline is generous, only a stopped worker fails it
            deadline = time.monotonic() + 30
            while str(late.id) not in ran:
                assert time.monotonic() < deadline, "the worker stopped processing"
                await asyncio.sleep(0.05)
    finally:
        await redis.aclose()


async def _bytes_client(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(url)  # bytes in and out: corrupt fields may not be UTF-8
