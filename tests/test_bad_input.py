"""Bad input is refused at the edge with a named error, and nothing reaches Redis.

Every refusal must say both what was wrong (the offending value) and the rule it broke, and
must leave the queue's keys untouched. Negative codes of the upstream scripts become the
named `ScriptError` subclasses with the messages Node BullMQ gives.
"""
from __future__ import annotations

import math
from typing import Any

import pytest

from bullmq_compat import (
    InvalidArgument,
    InvalidJobData,
    InvalidJobId,
    InvalidJobOptions,
    InvalidQueueName,
    JobNotInState,
    ParentJobNotFound,
    Queue,
    RedisUnavailable,
    _errors,
)

PRIORITY_LIMIT = 2_097_151  # Node BullMQ's PRIORITY_LIMIT (2**21 - 1)


async def keys_of(redis: Any, queue_name: str) -> list[str]:
    return sorted(await redis.keys(f"bull:{queue_name}:*"))


async def assert_nothing_written(redis: Any, queue_name: str) -> None:
    """A fresh queue that was refused has no keys at all (not even `meta`)."""
    assert await keys_of(redis, queue_name) == []


# -- queue names ------------------------------------------------------------------------------
@pytest.mark.parametrize("name, fragments", [
    ("", ["''", "non-empty"]),
    ("emails:eu", ["'emails:eu'", "cannot contain ':'"]),
    (123, ["123", "must be a non-empty str"]),
    (None, ["None", "must be a non-empty str"]),
])
async def test_bad_queue_name(redis_url: str, redis: Any, name: Any, fragments: list[str]) -> None:
    before = await redis.dbsize()
    with pytest.raises(InvalidQueueName) as info:
        Queue(name, connection=redis_url)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert await redis.dbsize() == before


async def test_non_str_job_name(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url, skip_meta_update=True) as queue:
        with pytest.raises(InvalidArgument) as info:
            await queue.add(42, {"x": 1})  # type: ignore[arg-type]
    assert "42" in str(info.value) and "must be a str" in str(info.value)
    await assert_nothing_written(redis, queue_name)


# -- job ids ----------------------------------------------------------------------------------
@pytest.mark.parametrize("job_id, fragments", [
    ("123", ["'123'", "integer string"]),
    ("-7", ["'-7'", "integer string"]),
    ("a:b", ["'a:b'", "cannot contain ':'"]),
    ("0", ["'0'", "cannot be '0'"]),
    ("", ["''", "must not be empty"]),
    (5, ["5", "must be a str"]),
    (5.5, ["5.5", "must be a str"]),
])
async def test_bad_job_id(redis_url: str, queue_name: str, redis: Any, job_id: Any,
                          fragments: list[str]) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        with pytest.raises(InvalidJobId) as info:
            await queue.add("n", {"x": 1}, job_id=job_id)
    finally:
        await queue.close()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    await assert_nothing_written(redis, queue_name)


async def test_job_id_by_node_name_is_checked_too(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        with pytest.raises(InvalidJobId, match=r"'9'.*integer"):
            await queue.add("n", {}, jobId="9")
        assert await redis.exists(f"bull:{queue_name}:id", f"bull:{queue_name}:9") == 0


async def test_ids_node_accepts_are_accepted(redis_url: str, queue_name: str, redis: Any) -> None:
    """The id rule is Node's: '007' and '+5' are not the canonical text of an integer."""
    async with Queue(queue_name, connection=redis_url) as queue:
        for job_id in ("007", "+5", "order-1"):
            job = await queue.add("n", {}, job_id=job_id)
            assert job.id == job_id
            assert await redis.exists(f"bull:{queue_name}:{job_id}") == 1


# -- data ---------------------------------------------------------------------------------------
class Opaque:
    def __repr__(self) -> str:
        return "<Opaque thing>"


@pytest.mark.parametrize("data, fragment", [
    ({1, 2}, "{1, 2}"),
    (Opaque(), "<Opaque thing>"),
    ({"x": math.nan}, "nan"),
    ({"x": math.inf}, "inf"),
    ({"when": b"bytes"}, "b'bytes'"),
])
async def test_data_not_json(redis_url: str, queue_name: str, redis: Any, data: Any, fragment: str) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        with pytest.raises(InvalidJobData) as info:
            await queue.add("n", data)
    finally:
        await queue.close()
    message = str(info.value)
    assert fragment in message and "not JSON-serialisable" in message, message
    await assert_nothing_written(redis, queue_name)


async def test_update_data_not_json_keeps_old_data(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {"v": 1})
        with pytest.raises(InvalidJobData, match="not JSON-serialisable"):
            await job.update_data({"v": {1, 2}})
        assert await redis.hget(f"bull:{queue_name}:{job.id}", "data") == '{"v":1}'
        assert job.data == {"v": 1}


# -- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize("opts, fragments", [
    ({"retries": 3}, ["'retries'", "unknown job option"]),
    ({"removeOnCompleted": True}, ["'removeOnCompleted'", "unknown job option"]),
    ({"delay": -1}, ["delay=-1", ">= 0"]),
    ({"delay": "soon"}, ["delay='soon'", "finite number"]),
    ({"priority": -1}, ["priority=-1", ">= 0"]),
    ({"priority": PRIORITY_LIMIT + 1}, ["priority=2097152", f"between 0 and {PRIORITY_LIMIT}"]),
    ({"priority": 1.5}, ["priority=1.5", "integer"]),
    ({"priority": True}, ["priority=True", "finite number"]),
    ({"attempts": -2}, ["attempts=-2", ">= 0"]),
    ({"attempts": 2.5}, ["attempts=2.5", "integer"]),
    ({"lifo": "yes"}, ["lifo='yes'", "True or False"]),
    ({"backoff": {"type": "fixed", "delay": 10, "jitter": 1.5}}, ["jitter=1.5", "between 0 and 1"]),
    ({"backoff": {"type": "fixed", "delay": 10, "jitter": -0.1}}, ["jitter=-0.1", ">= 0"]),
    ({"backoff": {"delay": 10}}, ["{'delay': 10}", "needs a 'type'"]),
    ({"backoff": {"type": "fixed", "wait": 10}}, ["'wait'", "unknown key"]),
    ({"remove_on_complete": -1}, ["remove_on_complete=-1", ">= 0"]),
    ({"remove_on_fail": {"age": 10, "cnt": 3}}, ["'cnt'", "unknown key"]),
    ({"fail_parent_on_failure": True, "ignore_dependency_on_failure": True},
     ["failParentOnFailure", "ignoreDependencyOnFailure", "cannot be used together"]),
    ({"removeDependencyOnFailure": True, "continueParentOnFailure": True},
     ["removeDependencyOnFailure", "continueParentOnFailure", "cannot be used together"]),
    ({"deduplication": {"ttl": 100}}, ["{'ttl': 100}", "needs a non-empty 'id'"]),
    ({"deduplication": {"id": ""}}, ["{'id': ''}", "needs a non-empty 'id'"]),
    ({"deduplication": {"id": "d", "ttl": -5}}, ["ttl=-5", ">= 0"]),
    ({"deduplication": {"id": "d"}, "parent": {"id": "p", "queue": "bull:other"}},
     ["deduplication", "parent", "cannot be used together"]),
    ({"parent": {"id": "p"}}, ["{'id': 'p'}", "needs 'id' and 'queue'"]),
])
async def test_bad_option(redis_url: str, queue_name: str, redis: Any, opts: dict[str, Any],
                          fragments: list[str]) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        with pytest.raises(InvalidJobOptions) as info:
            await queue.add("n", {"x": 1}, **opts)
    finally:
        await queue.close()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    await assert_nothing_written(redis, queue_name)


async def test_priority_limit_itself_is_accepted(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {}, priority=PRIORITY_LIMIT)
        assert await redis.hget(f"bull:{queue_name}:{job.id}", "priority") == str(PRIORITY_LIMIT)
        assert await job.get_state() == "prioritized"


async def test_size_limit_names_size_and_limit(redis_url: str, queue_name: str, redis: Any) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        with pytest.raises(InvalidJobOptions) as info:
            await queue.add("big", {"s": "x" * 50}, size_limit=20)
    finally:
        await queue.close()
    assert "58 bytes" in str(info.value) and "size_limit=20" in str(info.value)
    await assert_nothing_written(redis, queue_name)


async def test_bad_default_job_options_refused_at_construction(redis_url: str) -> None:
    with pytest.raises(InvalidJobOptions, match=r"priority=-3.*>= 0"):
        Queue("q", connection=redis_url, default_job_options={"priority": -3})


# -- add_bulk is all or nothing ----------------------------------------------------------------
async def test_add_bulk_with_one_bad_item_writes_nothing(redis_url: str, queue_name: str, redis: Any) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        with pytest.raises(InvalidJobOptions, match=r"delay=-5"):
            await queue.add_bulk([
                {"name": "a", "data": {"i": 0}},
                {"name": "b", "data": {"i": 1}, "opts": {"delay": -5}},
                {"name": "c", "data": {"i": 2}},
            ])
    finally:
        await queue.close()
    await assert_nothing_written(redis, queue_name)


async def test_add_bulk_bad_item_on_a_used_queue_leaves_it_as_it_was(
        redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        first = await queue.add("first", {})
        before = await keys_of(redis, queue_name)
        with pytest.raises(InvalidJobData, match=r"\{3\}"):
            await queue.add_bulk([
                {"name": "a", "data": {"i": 0}},
                {"name": "b", "data": {3}},
            ])
        with pytest.raises(InvalidArgument, match=r"item 1 .*unknown keys \['option'\]"):
            await queue.add_bulk([{"name": "a"}, {"name": "b", "option": {}}])
        assert await keys_of(redis, queue_name) == before
        assert await redis.get(f"bull:{queue_name}:id") == first.id == "1"
        assert await redis.lrange(f"bull:{queue_name}:wait", 0, -1) == ["1"]


# -- connection ---------------------------------------------------------------------------------
async def test_unreachable_redis_names_the_url() -> None:
    url = "redis://127.0.0.1:1/0"
    queue = Queue("q", connection=url)
    try:
        with pytest.raises(RedisUnavailable) as info:
            await queue.add("n", {})
    finally:
        await queue.close()
    assert url in str(info.value)
    assert isinstance(info.value, ConnectionError)


async def test_connection_that_is_not_a_url() -> None:
    with pytest.raises(InvalidArgument, match=r"'localhost:6379' is not a Redis URL"):
        Queue("q", connection="localhost:6379")


# -- negative script codes -> named exceptions ---------------------------------------------------
async def test_promote_non_delayed_job_is_job_not_in_state(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {})
        with pytest.raises(JobNotInState) as info:
            await job.promote()
        # Node: `Job ${jobId} is not in the ${state} state. ${command}`
        assert str(info.value) == f"Job {job.id} is not in the delayed state. promote"
        assert info.value.code == -3 and info.value.job_id == job.id
        assert await job.get_state() == "waiting"


async def test_change_delay_of_waiting_job_is_job_not_in_state(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {})
        with pytest.raises(JobNotInState, match=rf"^Job {job.id} is not in the delayed state\. changeDelay$"):
            await job.change_delay(1000)


async def test_retry_of_waiting_job_is_job_not_in_state(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        job = await queue.add("n", {})
        with pytest.raises(JobNotInState, match=rf"^Job {job.id} is not in the failed state\. reprocessJob$"):
            await job.retry()


async def test_missing_parent_is_parent_job_not_found(redis_url: str, queue_name: str, redis: Any) -> None:
    parent_queue = f"bull:{queue_name}-parent"
    async with Queue(queue_name, connection=redis_url) as queue:
        with pytest.raises(ParentJobNotFound) as info:
            await queue.add("child", {}, parent={"id": "nope", "queue": parent_queue})
        # Node: `Missing key for parent job ${parentKey}. ${command}`, parentKey = `${queue}:${id}`
        assert str(info.value) == f"Missing key for parent job {parent_queue}:nope. addJob"
        assert info.value.code == -5
        assert await redis.exists(f"bull:{queue_name}:id", f"bull:{queue_name}:1",
                                  f"bull:{queue_name}:wait") == 0


async def test_existing_parent_gets_the_child_as_dependency(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(f"{queue_name}-parent", connection=redis_url) as parents, \
            Queue(queue_name, connection=redis_url) as queue:
        parent = await parents.add("parent", {})
        child = await queue.add("child", {}, parent={"id": parent.id, "queue": parents.qualified_name})
        assert child.parent_key == f"{parents.qualified_name}:{parent.id}"
        assert await redis.smembers(f"{parents.qualified_name}:{parent.id}:dependencies") == {
            f"bull:{queue_name}:{child.id}"}
        stored = await queue.get_job(child.id)
        assert stored is not None and stored.parent_key == child.parent_key


@pytest.mark.parametrize("code, cls, message", [
    # the messages of Node BullMQ's finishedErrors(), for jobId 7, parentKey bull:p:1, command cmd
    (-1, _errors.JobNotFound, "Missing key for job 7. cmd"),
    (-2, _errors.JobLockNotFound, "Missing lock for job 7. cmd"),
    (-3, _errors.JobNotInState, "Job 7 is not in the active state. cmd"),
    (-4, _errors.JobPendingChildren, "Job 7 has pending dependencies. cmd"),
    (-5, _errors.ParentJobNotFound, "Missing key for parent job bull:p:1. cmd"),
    (-6, _errors.JobLockMismatch, "Lock mismatch for job 7. Cmd cmd from active"),
    (-7, _errors.ParentJobCannotBeReplaced, "The parent job bull:p:1 cannot be replaced. cmd"),
    (-8, _errors.JobBelongsToJobScheduler,
     "Job 7 belongs to a job scheduler and cannot be removed directly. cmd"),
    (-9, _errors.JobHasFailedChildren, "Cannot complete job 7 because it has at least one failed child. cmd"),
    (-10, _errors.SchedulerJobIdCollision, "Cannot create job scheduler iteration - job ID already exists. cmd"),
    (-11, _errors.SchedulerJobSlotsBusy,
     "Cannot create job scheduler iteration - current and next time slots already have jobs. cmd"),
])
def test_every_negative_code_has_its_exception(code: int, cls: type, message: str) -> None:
    err = _errors.script_error(code, job_id="7", command="cmd", state="active", parent_key="bull:p:1")
    assert type(err) is cls and err.code == code
    assert isinstance(err, _errors.ScriptError) and not isinstance(err, InvalidArgument)
    assert str(err) == message


def test_unknown_negative_code_keeps_its_number() -> None:
    err = _errors.script_error(-99, job_id="7", command="cmd")
    assert type(err) is _errors.ScriptError and err.code == -99
    assert str(err) == "Unknown code -99 error for 7. cmd"


def test_invalid_argument_hierarchy() -> None:
    for cls in (InvalidQueueName, InvalidJobId, InvalidJobData, InvalidJobOptions):
        assert issubclass(cls, InvalidArgument) and issubclass(cls, ValueError)
    assert not issubclass(RedisUnavailable, InvalidArgument)
