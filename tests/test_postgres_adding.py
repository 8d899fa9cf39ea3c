"""PostgresBackend, adding jobs and flows, against a real PostgreSQL (a migrated schema per test)."""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from bullmq_compat import InvalidJobData, ParentJobNotFound
from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._job import Job
from tests.postgres_helpers import add, add_one, complete, count_jobs, flow, new, stored, take

# -- adding ---------------------------------------------------------------------------------------

async def test_a_job_without_id_gets_the_queues_next_sequence_id(pg_backend: PostgresBackend) -> None:
    assert [await add_one(pg_backend, new()) for _ in range(3)] == ["1", "2", "3"]


async def test_an_added_job_reads_back_in_the_redis_hash_shape_job_from_raw_reads(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new("send", {"to": "a@b", "n": [1, 2]}, attempts=3, keep_logs=5))
    fields = await pg_backend.get_job(job_id)
    assert fields is not None
    assert set(fields) == {"name", "data", "opts", "timestamp", "delay", "priority", "atm", "ats", "stc"}
    job = Job.from_raw(None, job_id, fields)  # type: ignore[arg-type]
    assert (job.name, job.data, job.attempts_made, job.parse_error) == ("send", {"to": "a@b", "n": [1, 2]}, 0, None)
    assert job.opts["attempts"] == 3 and job.opts["keep_logs"] == 5
    assert job.timestamp > 0


async def test_options_are_stored_with_node_long_names_and_read_with_short_keys(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new(keep_logs=5, remove_on_complete=True, deduplication={"id": "d1"}))
    assert await stored(pg_backend, "opts", job_id) == {"attempts": 0, "keepLogs": 5, "removeOnComplete": True,
                                                     "deduplication": {"id": "d1"}}
    fields = await pg_backend.get_job(job_id)
    assert fields is not None
    import json
    assert json.loads(fields["opts"]) == {"attempts": 0, "kl": 5, "removeOnComplete": True, "de": {"id": "d1"}}
    assert fields["deid"] == "d1"


@pytest.mark.parametrize("data", ["plain", 7, 1.5, True, [1, "x"], {"nested": {"k": None}}])
async def test_scalar_and_structured_data_survive_a_bulk_add(pg_backend: PostgresBackend, data: Any) -> None:
    ids = await add(pg_backend, new(data=data), new(data={"other": 1}))
    fields = await pg_backend.get_job(ids[0])
    assert fields is not None
    assert Job.from_raw(None, ids[0], fields).data == data  # type: ignore[arg-type]
    assert await stored(pg_backend, "data", ids[0]) == data


@pytest.mark.parametrize("data", ["plain", 7])
async def test_scalar_data_survives_a_single_add(pg_backend: PostgresBackend, data: Any) -> None:
    job_id = await add_one(pg_backend, new(data=data))
    assert await stored(pg_backend, "data", job_id) == data


@pytest.mark.parametrize("data", ["a\x00b", {"k": "\x00"}, {"\x00": 1}, ["x", ["\x00"]]])
async def test_data_holding_u0000_is_refused_before_anything_is_written(pg_backend: PostgresBackend, data: Any) -> None:
    [result] = await add(pg_backend, new(data=data))
    assert isinstance(result, InvalidJobData) and "U+0000" in str(result)
    assert await count_jobs(pg_backend) == 0


async def test_in_a_bulk_only_the_job_holding_u0000_is_refused(pg_backend: PostgresBackend) -> None:
    results = await add(pg_backend, new(data="ok"), new(data="bad\x00"), new(data="ok too"))
    assert isinstance(results[1], InvalidJobData)
    assert results[0] == "1" and results[2] == "2"
    assert await count_jobs(pg_backend) == 2


async def test_an_escaped_backslash_before_u0000_is_ordinary_text(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new(data="C:\\u0000dir"))
    assert await stored(pg_backend, "data", job_id) == "C:\\u0000dir"


async def test_a_numeric_looking_custom_id_is_bound_as_text(pg_backend: PostgresBackend) -> None:
    assert await add_one(pg_backend, new(job_id="42")) == "42"
    assert (await pg_backend.get_job("42") or {}).get("name") == "n"
    assert await pg_backend.get_state("42") == "waiting"
    assert await pg_backend.remove("42", False) == 1
    assert await pg_backend.get_job("42") is None


async def test_a_numeric_looking_queue_name_is_bound_as_text(pg_backend: PostgresBackend) -> None:
    seven = pg_backend.for_queue("7")
    job_id = await add_one(seven, new())
    assert await seven.get_state(job_id) == "waiting"
    assert await pg_backend.get_state(job_id) == "unknown"


async def test_bulk_add_returns_the_ids_in_order(pg_backend: PostgresBackend) -> None:
    assert await add(pg_backend, new("a"), new("b", job_id="custom"), new("c")) == ["1", "custom", "2"]
    assert await pg_backend.get_counts(["waiting"]) == [3]


async def test_bulk_add_with_a_missing_parent_refuses_that_job_only(pg_backend: PostgresBackend) -> None:
    results = await add(pg_backend, new("a"), new("b", parent={"id": "nope", "queue": "q"}))
    assert results[0] == "1"
    assert isinstance(results[1], ParentJobNotFound)


async def test_a_single_add_with_a_missing_parent_raises_parent_job_not_found(pg_backend: PostgresBackend) -> None:
    [result] = await add(pg_backend, new(parent={"id": "nope", "queue": "q"}))
    assert isinstance(result, ParentJobNotFound) and "q:nope" in str(result)
    assert await count_jobs(pg_backend) == 0


async def test_delay_and_priority_route_the_job(pg_backend: PostgresBackend) -> None:
    delayed = await add_one(pg_backend, new(delay=60000))
    prioritized = await add_one(pg_backend, new(priority=3))
    assert await pg_backend.get_state(delayed) == "delayed"
    assert await pg_backend.get_state(prioritized) == "prioritized"
    assert await pg_backend.get_counts(["delayed", "prioritized", "waiting"]) == [1, 1, 0]
    fields = await pg_backend.get_job(delayed)
    assert fields is not None and fields["delay"] == "60000"


async def test_lifo_jobs_are_taken_first(pg_backend: PostgresBackend) -> None:
    await add_one(pg_backend, new("first"))
    lifo = await add_one(pg_backend, new("last", lifo=True))
    assert await take(pg_backend) == lifo


async def test_a_deduplicated_add_returns_the_existing_job(pg_backend: PostgresBackend) -> None:
    first = await add_one(pg_backend, new(deduplication={"id": "d"}))
    assert await add_one(pg_backend, new(deduplication={"id": "d"})) == first
    assert await pg_backend.get_deduplication_job_id("d") == first
    assert await pg_backend.remove_deduplication_key("d") == 1
    assert await pg_backend.get_deduplication_job_id("d") is None
    assert await add_one(pg_backend, new(deduplication={"id": "d"})) != first


async def test_removing_a_dedup_key_for_another_job_leaves_it(pg_backend: PostgresBackend) -> None:
    first = await add_one(pg_backend, new(deduplication={"id": "d"}))
    assert await pg_backend.remove_deduplication_key("d", job_id="other") == 0
    assert await pg_backend.remove_deduplication_key("d", job_id=first) == 1


# -- flows ------------------------------------------------------------------------------------------

async def test_a_flow_parent_waits_for_its_children(pg_backend: PostgresBackend) -> None:
    parent, children = await flow(pg_backend)
    assert children == ["c0", "c1"]
    assert await pg_backend.get_state(parent) == "waiting-children"
    assert [await pg_backend.get_state(c) for c in children] == ["waiting", "waiting"]
    assert await pg_backend.get_dependency_counts(parent, ["unprocessed", "processed", "bogus"]) == [2, 0, 0]
    fields = await pg_backend.get_job("c0")
    assert fields is not None and fields["parentKey"] == f"q:{parent}"
    import json
    assert json.loads(fields["parent"]) == {"id": parent, "queueKey": "q"}


async def test_a_flow_across_queues_puts_each_node_in_its_queue(pg_backend: PostgresBackend) -> None:
    child = new("child", job_id="k", queue_name="other", parent={"id": "p", "queue": "q"})
    ids = await pg_backend.add_flow([(new("parent", job_id="p"), {"addToWaitingChildren": True}),
                                  (child, {"parentKey": "q:p"})])
    assert ids == ["p", "k"]
    assert await pg_backend.for_queue("other").get_state("k") == "waiting"


async def test_a_flow_node_without_id_gets_a_uuid(pg_backend: PostgresBackend) -> None:
    [job_id] = await pg_backend.add_flow([(new("solo"), None)])
    assert uuid.UUID(job_id)


async def test_a_flow_under_a_missing_parent_raises_parent_job_not_found(pg_backend: PostgresBackend) -> None:
    with pytest.raises(ParentJobNotFound):
        await pg_backend.add_flow([(new("x", job_id="x", parent={"id": "gone", "queue": "q"}),
                                    {"parentKey": "q:gone"})])


async def test_completed_children_values_are_json_text_for_the_parent(pg_backend: PostgresBackend) -> None:
    parent, _ = await flow(pg_backend)
    child = await complete(pg_backend, '"42"')
    assert await pg_backend.get_processed_children_values(parent) == {f"q:{child}": '"42"'}
    assert await pg_backend.get_dependency_counts(parent, ["processed", "unprocessed"]) == [1, 1]


async def test_get_dependencies_lists_children_by_category(pg_backend: PostgresBackend) -> None:
    parent, _ = await flow(pg_backend)
    done = await complete(pg_backend, '{"v": 1}')
    pending = "c1" if done == "c0" else "c0"
    assert await pg_backend.get_dependencies(parent) == {
        "processed": {f"q:{done}": '{"v":1}'}, "unprocessed": [f"q:{pending}"], "ignored": {}, "failed": []}


async def test_removing_a_child_dependency_releases_it(pg_backend: PostgresBackend) -> None:
    parent, _ = await flow(pg_backend)
    assert await pg_backend.remove_child_dependency("c0", f"q:{parent}") is True
    assert await pg_backend.remove_child_dependency("c0", f"q:{parent}") is False
    assert await pg_backend.get_dependency_counts(parent, ["unprocessed"]) == [1]


async def test_removing_unprocessed_children_removes_them(pg_backend: PostgresBackend) -> None:
    parent, children = await flow(pg_backend)
    await pg_backend.remove_unprocessed_children(parent)
    assert [await pg_backend.get_job(c) for c in children] == [None, None]


async def test_no_ignored_children_failures_when_none_ignored(pg_backend: PostgresBackend) -> None:
    parent, _ = await flow(pg_backend)
    assert await pg_backend.get_ignored_children_failures(parent) == {}
