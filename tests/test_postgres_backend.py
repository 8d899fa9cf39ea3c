"""PostgresBackend, queue side, against a real PostgreSQL: each test in a migrated schema of its own.

Jobs are finished with upstream's own worker commands (move_to_active, move_to_completed,
move_to_failed) run directly, as a Node worker would run them.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import (
    InvalidJobData,
    InvalidQueueName,
    JobNotFound,
    JobNotInState,
    ParentJobNotFound,
)
from bullmq_compat._backends.base import NewJob
from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._errors import InvalidArgument, JobBelongsToJobScheduler, NotSupportedOnBackend
from bullmq_compat._job import Job
from bullmq_compat._wire.options import merge_defaults, normalize_job_options


def now() -> int:
    return int(time.time() * 1000)


def new(name: str = "n", data: Any = None, job_id: str = "", queue_name: str = "", **opts: Any) -> NewJob:
    return NewJob(name, {} if data is None else data, merge_defaults(None, normalize_job_options(opts)), now(),
                  job_id, queue_name)


@pytest.fixture
async def backend(postgres_url: str, pg_migrated: str) -> AsyncIterator[PostgresBackend]:
    b = PostgresBackend(PostgresConnection(postgres_url, schema=pg_migrated), "q")
    await b.connect()
    try:
        yield b
    finally:
        await b.close()


async def add(backend: PostgresBackend, *jobs: NewJob) -> list[Any]:
    return await backend.add_jobs(list(jobs))


async def add_one(backend: PostgresBackend, job: NewJob) -> str:
    [job_id] = await backend.add_jobs([job])
    assert isinstance(job_id, str), job_id
    return job_id


async def take(backend: PostgresBackend, token: str = "tok") -> str:
    """Claim the next job as a Node worker does; returns its id."""
    rows = (await backend.connection.run("move_to_active", [backend.name, token, 30000, now(), None, None, None])).rows
    assert rows, "nothing to claim"
    return str(rows[0]["id"])


async def complete(backend: PostgresBackend, value_json: str = '"ok"') -> str:
    job_id = await take(backend)
    await backend.connection.run("move_to_completed", [backend.name, job_id, "tok", value_json, now(), False,
                                                       None, None])
    return job_id


async def fail(backend: PostgresBackend, reason: str = "boom") -> str:
    job_id = await take(backend)
    await backend.connection.run("move_to_failed", [backend.name, job_id, "tok", reason, '["at x"]', now(), False,
                                                    None, None])
    return job_id


async def stored(backend: PostgresBackend, column: str, job_id: str) -> Any:
    rows = (await backend.connection.execute(f"SELECT {column} AS v FROM job WHERE queue = $1 AND id = $2",
                                             [backend.name, job_id])).rows
    return rows[0]["v"] if rows else None


async def count_jobs(backend: PostgresBackend) -> int:
    rows = (await backend.connection.execute("SELECT count(*)::int AS n FROM job WHERE queue = $1",
                                             [backend.name])).rows
    return int(rows[0]["n"])


# -- adding ---------------------------------------------------------------------------------------

async def test_a_job_without_id_gets_the_queues_next_sequence_id(backend: PostgresBackend) -> None:
    assert [await add_one(backend, new()) for _ in range(3)] == ["1", "2", "3"]


async def test_an_added_job_reads_back_in_the_redis_hash_shape_job_from_raw_reads(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new("send", {"to": "a@b", "n": [1, 2]}, attempts=3, keep_logs=5))
    fields = await backend.get_job(job_id)
    assert fields is not None
    assert set(fields) == {"name", "data", "opts", "timestamp", "delay", "priority", "atm", "ats", "stc"}
    job = Job.from_raw(None, job_id, fields)  # type: ignore[arg-type]
    assert (job.name, job.data, job.attempts_made, job.parse_error) == ("send", {"to": "a@b", "n": [1, 2]}, 0, None)
    assert job.opts["attempts"] == 3 and job.opts["keep_logs"] == 5
    assert job.timestamp > 0


async def test_options_are_stored_with_node_long_names_and_read_with_short_keys(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new(keep_logs=5, remove_on_complete=True, deduplication={"id": "d1"}))
    assert await stored(backend, "opts", job_id) == {"attempts": 0, "keepLogs": 5, "removeOnComplete": True,
                                                     "deduplication": {"id": "d1"}}
    fields = await backend.get_job(job_id)
    assert fields is not None
    import json
    assert json.loads(fields["opts"]) == {"attempts": 0, "kl": 5, "removeOnComplete": True, "de": {"id": "d1"}}
    assert fields["deid"] == "d1"


@pytest.mark.parametrize("data", ["plain", 7, 1.5, True, [1, "x"], {"nested": {"k": None}}])
async def test_scalar_and_structured_data_survive_a_bulk_add(backend: PostgresBackend, data: Any) -> None:
    ids = await add(backend, new(data=data), new(data={"other": 1}))
    fields = await backend.get_job(ids[0])
    assert fields is not None
    assert Job.from_raw(None, ids[0], fields).data == data  # type: ignore[arg-type]
    assert await stored(backend, "data", ids[0]) == data


@pytest.mark.parametrize("data", ["plain", 7])
async def test_scalar_data_survives_a_single_add(backend: PostgresBackend, data: Any) -> None:
    job_id = await add_one(backend, new(data=data))
    assert await stored(backend, "data", job_id) == data


@pytest.mark.parametrize("data", ["a\x00b", {"k": "\x00"}, {"\x00": 1}, ["x", ["\x00"]]])
async def test_data_holding_u0000_is_refused_before_anything_is_written(backend: PostgresBackend, data: Any) -> None:
    [result] = await add(backend, new(data=data))
    assert isinstance(result, InvalidJobData) and "U+0000" in str(result)
    assert await count_jobs(backend) == 0


async def test_in_a_bulk_only_the_job_holding_u0000_is_refused(backend: PostgresBackend) -> None:
    results = await add(backend, new(data="ok"), new(data="bad\x00"), new(data="ok too"))
    assert isinstance(results[1], InvalidJobData)
    assert results[0] == "1" and results[2] == "2"
    assert await count_jobs(backend) == 2


async def test_an_escaped_backslash_before_u0000_is_ordinary_text(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new(data="C:\\u0000dir"))
    assert await stored(backend, "data", job_id) == "C:\\u0000dir"


async def test_a_numeric_looking_custom_id_is_bound_as_text(backend: PostgresBackend) -> None:
    assert await add_one(backend, new(job_id="42")) == "42"
    assert (await backend.get_job("42") or {}).get("name") == "n"
    assert await backend.get_state("42") == "waiting"
    assert await backend.remove("42", False) == 1
    assert await backend.get_job("42") is None


async def test_a_numeric_looking_queue_name_is_bound_as_text(backend: PostgresBackend) -> None:
    seven = backend.for_queue("7")
    job_id = await add_one(seven, new())
    assert await seven.get_state(job_id) == "waiting"
    assert await backend.get_state(job_id) == "unknown"


async def test_bulk_add_returns_the_ids_in_order(backend: PostgresBackend) -> None:
    assert await add(backend, new("a"), new("b", job_id="custom"), new("c")) == ["1", "custom", "2"]
    assert await backend.get_counts(["waiting"]) == [3]


async def test_bulk_add_with_a_missing_parent_refuses_that_job_only(backend: PostgresBackend) -> None:
    results = await add(backend, new("a"), new("b", parent={"id": "nope", "queue": "q"}))
    assert results[0] == "1"
    assert isinstance(results[1], ParentJobNotFound)


async def test_a_single_add_with_a_missing_parent_raises_parent_job_not_found(backend: PostgresBackend) -> None:
    [result] = await add(backend, new(parent={"id": "nope", "queue": "q"}))
    assert isinstance(result, ParentJobNotFound) and "q:nope" in str(result)
    assert await count_jobs(backend) == 0


async def test_delay_and_priority_route_the_job(backend: PostgresBackend) -> None:
    delayed = await add_one(backend, new(delay=60000))
    prioritized = await add_one(backend, new(priority=3))
    assert await backend.get_state(delayed) == "delayed"
    assert await backend.get_state(prioritized) == "prioritized"
    assert await backend.get_counts(["delayed", "prioritized", "waiting"]) == [1, 1, 0]
    fields = await backend.get_job(delayed)
    assert fields is not None and fields["delay"] == "60000"


async def test_lifo_jobs_are_taken_first(backend: PostgresBackend) -> None:
    await add_one(backend, new("first"))
    lifo = await add_one(backend, new("last", lifo=True))
    assert await take(backend) == lifo


async def test_a_deduplicated_add_returns_the_existing_job(backend: PostgresBackend) -> None:
    first = await add_one(backend, new(deduplication={"id": "d"}))
    assert await add_one(backend, new(deduplication={"id": "d"})) == first
    assert await backend.get_deduplication_job_id("d") == first
    assert await backend.remove_deduplication_key("d") == 1
    assert await backend.get_deduplication_job_id("d") is None
    assert await add_one(backend, new(deduplication={"id": "d"})) != first


async def test_removing_a_dedup_key_for_another_job_leaves_it(backend: PostgresBackend) -> None:
    first = await add_one(backend, new(deduplication={"id": "d"}))
    assert await backend.remove_deduplication_key("d", job_id="other") == 0
    assert await backend.remove_deduplication_key("d", job_id=first) == 1


# -- flows ------------------------------------------------------------------------------------------

async def flow(backend: PostgresBackend) -> tuple[str, list[str]]:
    parent_id = str(uuid.uuid4())
    children = [new("child", {"i": i}, job_id=f"c{i}", parent={"id": parent_id, "queue": "q"}) for i in range(2)]
    nodes: list[tuple[NewJob, dict[str, Any] | None]] = [(c, {"parentKey": f"q:{parent_id}"}) for c in children]
    nodes.append((new("parent", job_id=parent_id), {"addToWaitingChildren": True}))
    ids = await backend.add_flow(nodes)  # children first: sent parents first
    return ids[-1], ids[:-1]


async def test_a_flow_parent_waits_for_its_children(backend: PostgresBackend) -> None:
    parent, children = await flow(backend)
    assert children == ["c0", "c1"]
    assert await backend.get_state(parent) == "waiting-children"
    assert [await backend.get_state(c) for c in children] == ["waiting", "waiting"]
    assert await backend.get_dependency_counts(parent, ["unprocessed", "processed", "bogus"]) == [2, 0, 0]
    fields = await backend.get_job("c0")
    assert fields is not None and fields["parentKey"] == f"q:{parent}"
    import json
    assert json.loads(fields["parent"]) == {"id": parent, "queueKey": "q"}


async def test_a_flow_across_queues_puts_each_node_in_its_queue(backend: PostgresBackend) -> None:
    child = new("child", job_id="k", queue_name="other", parent={"id": "p", "queue": "q"})
    ids = await backend.add_flow([(new("parent", job_id="p"), {"addToWaitingChildren": True}),
                                  (child, {"parentKey": "q:p"})])
    assert ids == ["p", "k"]
    assert await backend.for_queue("other").get_state("k") == "waiting"


async def test_a_flow_node_without_id_gets_a_uuid(backend: PostgresBackend) -> None:
    [job_id] = await backend.add_flow([(new("solo"), None)])
    assert uuid.UUID(job_id)


async def test_a_flow_under_a_missing_parent_raises_parent_job_not_found(backend: PostgresBackend) -> None:
    with pytest.raises(ParentJobNotFound):
        await backend.add_flow([(new("x", job_id="x", parent={"id": "gone", "queue": "q"}), {"parentKey": "q:gone"})])


async def test_completed_children_values_are_json_text_for_the_parent(backend: PostgresBackend) -> None:
    parent, _ = await flow(backend)
    child = await complete(backend, '"42"')
    assert await backend.get_processed_children_values(parent) == {f"q:{child}": '"42"'}
    assert await backend.get_dependency_counts(parent, ["processed", "unprocessed"]) == [1, 1]


async def test_get_dependencies_lists_children_by_category(backend: PostgresBackend) -> None:
    parent, _ = await flow(backend)
    done = await complete(backend, '{"v": 1}')
    pending = "c1" if done == "c0" else "c0"
    assert await backend.get_dependencies(parent) == {
        "processed": {f"q:{done}": '{"v":1}'}, "unprocessed": [f"q:{pending}"], "ignored": {}, "failed": []}


async def test_is_finished_tells_completed_failed_pending_and_missing(backend: PostgresBackend) -> None:
    await add(backend, new("a"), new("b"), new("c"))
    done = await complete(backend, '"r"')
    failed = await fail(backend, "why")
    assert await backend.is_finished(done) == (1, '"r"')
    assert await backend.is_finished(failed) == (2, "why")
    assert await backend.is_finished("3") == (0, "")
    assert await backend.is_finished("nope") == (-1, "Missing key for job q:nope. isFinished")


async def test_is_maxed_follows_the_global_concurrency(backend: PostgresBackend) -> None:
    assert await backend.is_maxed() is False
    await backend.set_meta({"concurrency": 1})
    await add_one(backend, new())
    await take(backend)
    assert await backend.is_maxed() is True


async def test_removing_a_child_dependency_releases_it(backend: PostgresBackend) -> None:
    parent, _ = await flow(backend)
    assert await backend.remove_child_dependency("c0", f"q:{parent}") is True
    assert await backend.remove_child_dependency("c0", f"q:{parent}") is False
    assert await backend.get_dependency_counts(parent, ["unprocessed"]) == [1]


async def test_removing_unprocessed_children_removes_them(backend: PostgresBackend) -> None:
    parent, children = await flow(backend)
    await backend.remove_unprocessed_children(parent)
    assert [await backend.get_job(c) for c in children] == [None, None]


async def test_no_ignored_children_failures_when_none_ignored(backend: PostgresBackend) -> None:
    parent, _ = await flow(backend)
    assert await backend.get_ignored_children_failures(parent) == {}


# -- reading ----------------------------------------------------------------------------------------

async def test_get_state_of_a_missing_job_is_unknown(backend: PostgresBackend) -> None:
    assert await backend.get_state("nope") == "unknown"
    assert await backend.get_job("nope") is None


async def test_get_jobs_lists_waiting_jobs_in_fifo_order_when_ascending(backend: PostgresBackend) -> None:
    await add(backend, new("a"), new("b"), new("c"))
    assert [jid for jid, _ in await backend.get_jobs(["waiting"], 0, -1, True)] == ["1", "2", "3"]
    assert [jid for jid, _ in await backend.get_jobs(["waiting"], 0, -1, False)] == ["3", "2", "1"]
    assert [f["name"] for _, f in await backend.get_jobs(["waiting"], 0, 1, True)] == ["b", "c"]


async def test_get_jobs_over_several_states_lists_each_job_once(backend: PostgresBackend) -> None:
    await add(backend, new("a"), new("b", delay=60000), new("c", priority=2))
    jobs = await backend.get_jobs(["waiting", "delayed", "prioritized", "waiting"], 0, -1, True)
    assert [jid for jid, _ in jobs] == ["1", "2", "3"]


async def test_delayed_counts_can_be_limited_to_jobs_due_before_a_time(backend: PostgresBackend) -> None:
    await add(backend, new(delay=1000), new(delay=600000), new())
    assert await backend.get_counts(["waiting", "delayed"], delayed_timestamp=now() + 60000) == [1, 1]
    assert await backend.get_counts(["delayed"]) == [2]


@pytest.mark.parametrize("job_id", [42, None, b"42"])
async def test_a_job_id_that_is_not_a_str_is_refused_naming_it(backend: PostgresBackend, job_id: Any) -> None:
    with pytest.raises(InvalidArgument, match=f"job_id={job_id!r}"):
        await backend.get_job(job_id)


async def test_get_counts_report_waiting_jobs_as_paused_while_paused(backend: PostgresBackend) -> None:
    await add(backend, new(), new())
    await backend.pause(True)
    assert await backend.get_counts(["waiting", "wait", "paused"]) == [0, 0, 2]
    assert await backend.get_meta_field("paused") == "1"
    await backend.pause(False)
    assert await backend.get_counts(["waiting", "paused"]) == [2, 0]


async def test_job_logs_page_like_lrange_and_keep_logs_trims(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new())
    assert [await backend.add_log(job_id, f"line {i}", None) for i in range(3)] == [1, 2, 3]
    assert await backend.get_job_logs(job_id, 0, -1, True) == (["line 0", "line 1", "line 2"], 3)
    assert await backend.get_job_logs(job_id, 0, 0, False) == (["line 2"], 3)
    assert await backend.get_job_logs(job_id, -2, -1, True) == (["line 1", "line 2"], 3)
    assert await backend.add_log(job_id, "line 3", 2) == 2
    assert await backend.get_job_logs(job_id, 0, -1, True) == (["line 2", "line 3"], 2)


async def test_a_log_for_a_missing_job_raises_job_not_found(backend: PostgresBackend) -> None:
    with pytest.raises(JobNotFound):
        await backend.add_log("nope", "x", None)


async def test_counts_per_priority_follow_the_requested_order(backend: PostgresBackend) -> None:
    await add(backend, new(), new(priority=2), new(priority=2), new(priority=5))
    assert await backend.get_counts_per_priority([5, 0, 2, 9]) == [1, 1, 2, 0]


async def test_metrics_of_a_queue_without_any(backend: PostgresBackend) -> None:
    assert await backend.get_metrics("completed", 0, -1) == (["0", "0", "0"], [], 0)


async def test_rate_limit_ttl_without_a_window_is_minus_2_or_0_against_a_max(backend: PostgresBackend) -> None:
    assert await backend.get_rate_limit_ttl(None) == -2
    assert await backend.get_rate_limit_ttl(5) == 0


async def test_rate_limit_ttl_of_a_held_window(backend: PostgresBackend) -> None:
    await backend.set_rate_limit(60000)
    assert 0 < await backend.get_rate_limit_ttl(None) <= 60000
    assert await backend.remove_rate_limit_key() == 1
    assert await backend.get_rate_limit_ttl(None) == -2


async def test_the_client_list_names_listen_sessions_of_the_database(backend: PostgresBackend) -> None:
    listen = await backend.connection.open_listen_session("q:w:worker-1")
    try:
        assert {"name": "q:w:worker-1"} in await backend.get_client_list()
    finally:
        await backend.connection.close_listen_session(listen)


# -- meta -------------------------------------------------------------------------------------------

async def test_meta_values_are_stored_as_node_stringifies_them(backend: PostgresBackend) -> None:
    await backend.set_meta({"concurrency": 3, "flag": True, "opts.maxLenEvents": 10000})
    assert await backend.get_meta_field("concurrency") == "3"
    assert await backend.get_meta_field("flag") == "true"
    assert await backend.get_meta() == {"concurrency": "3", "flag": "true", "opts.maxLenEvents": "10000"}
    assert await backend.remove_meta_fields(["concurrency", "flag", "absent"]) == 2
    assert await backend.get_meta_field("flag") is None


# -- changing one job -------------------------------------------------------------------------------

async def test_update_data_replaces_the_data(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new(data={"a": 1}))
    await backend.update_data(job_id, '"now a string"')
    assert await stored(backend, "data", job_id) == "now a string"


async def test_update_data_with_u0000_is_refused_and_leaves_the_data(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new(data={"a": 1}))
    with pytest.raises(InvalidJobData):
        await backend.update_data(job_id, '{"a": "\\u0000"}')
    assert await stored(backend, "data", job_id) == {"a": 1}


async def test_updating_a_missing_job_raises_job_not_found(backend: PostgresBackend) -> None:
    with pytest.raises(JobNotFound):
        await backend.update_data("nope", "{}")
    with pytest.raises(JobNotFound):
        await backend.update_progress("nope", "50")


async def test_progress_reads_back_and_is_announced(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new())
    await backend.update_progress(job_id, '{"pct": 50}')
    fields = await backend.get_job(job_id)
    assert fields is not None and fields["progress"] == '{"pct":50}'
    events = (await backend.connection.run("read_events", [backend.name, 0, 100])).rows
    assert {"event": "progress", "data": {"jobId": job_id, "data": '{"pct": 50}'}} in \
        [{"event": e["event"], "data": e["data"]} for e in events]


async def test_remove_deletes_the_job_and_a_missing_job_gives_0(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new())
    assert await backend.remove(job_id, True) == 1
    assert await backend.remove(job_id, True) == 0


async def test_a_finished_job_is_reprocessed_to_waiting(backend: PostgresBackend) -> None:
    await add_one(backend, new())
    job_id = await fail(backend)
    fields = await backend.get_job(job_id)
    assert fields is not None and fields["failedReason"] == "boom" and fields["stacktrace"] == '["at x"]'
    await backend.reprocess_job(job_id, "failed", False, True, True)
    assert await backend.get_state(job_id) == "waiting"


async def test_reprocessing_a_job_not_in_that_state_raises_job_not_in_state(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new())
    with pytest.raises(JobNotInState, match="failed"):
        await backend.reprocess_job(job_id, "failed", False, False, False)
    with pytest.raises(JobNotFound):
        await backend.reprocess_job("nope", "failed", False, False, False)


async def test_a_completed_jobs_return_value_reads_back_as_json_text(backend: PostgresBackend) -> None:
    await add_one(backend, new())
    job_id = await complete(backend, '"42"')
    fields = await backend.get_job(job_id)
    assert fields is not None
    assert Job.from_raw(None, job_id, fields).returnvalue == "42"  # type: ignore[arg-type]
    assert "finishedOn" in fields and "processedOn" in fields and fields["ats"] == "1"


async def test_promote_moves_a_delayed_job_to_waiting(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new(delay=60000))
    await backend.promote(job_id)
    assert await backend.get_state(job_id) == "waiting"
    with pytest.raises(JobNotInState, match="delayed"):
        await backend.promote(job_id)


async def test_change_delay_reschedules_a_delayed_job_only(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new(delay=60000))
    at = now()
    await backend.change_delay(job_id, 120000, at)
    assert await stored(backend, "process_at_ms", job_id) == at + 120000
    waiting = await add_one(backend, new())
    with pytest.raises(JobNotInState):
        await backend.change_delay(waiting, 10, now())


async def test_change_priority_makes_a_job_prioritized(backend: PostgresBackend) -> None:
    job_id = await add_one(backend, new())
    await backend.change_priority(job_id, 4, False)
    assert await backend.get_state(job_id) == "prioritized"
    with pytest.raises(JobNotFound):
        await backend.change_priority("nope", 1, False)


# -- managing the queue -----------------------------------------------------------------------------

async def test_drain_removes_waiting_and_optionally_delayed_jobs(backend: PostgresBackend) -> None:
    await add(backend, new(), new(delay=60000))
    await backend.drain(False)
    assert await backend.get_counts(["waiting", "delayed"]) == [0, 1]
    await backend.drain(True)
    assert await backend.get_counts(["delayed"]) == [0]


async def test_clean_removes_finished_jobs_older_than_the_timestamp(backend: PostgresBackend) -> None:
    await add(backend, new(), new())
    first = await complete(backend)
    assert await backend.clean("completed", now() + 1000, 0) == [first]
    assert await backend.get_job(first) is None
    assert await backend.clean("completed", 0, 0) == []


async def test_obliterate_refuses_a_running_queue_then_deletes_everything(backend: PostgresBackend) -> None:
    await add(backend, *[new() for _ in range(5)])
    with pytest.raises(InvalidArgument, match="non-paused"):
        await backend.obliterate(False, 2)
    await backend.pause(True)
    await backend.obliterate(False, 2)
    assert await count_jobs(backend) == 0


async def test_obliterate_without_force_refuses_active_jobs(backend: PostgresBackend) -> None:
    await add_one(backend, new())
    await take(backend)
    await backend.pause(True)
    with pytest.raises(InvalidArgument, match="active jobs"):
        await backend.obliterate(False, 100)
    await backend.obliterate(True, 100)
    assert await count_jobs(backend) == 0


async def test_retry_jobs_moves_failed_jobs_back_to_waiting(backend: PostgresBackend) -> None:
    await add(backend, new(), new())
    await fail(backend)
    await fail(backend)
    await backend.retry_jobs("failed", 1, now() + 1000)
    assert await backend.get_counts(["failed", "waiting"]) == [0, 2]


async def test_promote_jobs_moves_every_delayed_job(backend: PostgresBackend) -> None:
    await add(backend, *[new(delay=60000) for _ in range(3)])
    await backend.promote_jobs(2)
    assert await backend.get_counts(["delayed", "waiting"]) == [0, 3]


async def test_trim_events_is_not_supported_as_in_node(backend: PostgresBackend) -> None:
    with pytest.raises(NotSupportedOnBackend, match="trim_events.*postgres"):
        await backend.trim_events(10)


async def test_publish_event_appends_to_the_stream(backend: PostgresBackend) -> None:
    event_id = await backend.publish_event({"event": "custom", "n": 3, "text": "x"}, 10000)
    rows = (await backend.connection.run("read_events", [backend.name, int(event_id) - 1, 10])).rows
    assert [(str(r["id"]), r["event"], r["data"]) for r in rows] == [(event_id, "custom", {"n": 3, "text": "x"})]


# -- job schedulers ---------------------------------------------------------------------------------

async def test_a_job_scheduler_enqueues_its_next_iteration(backend: PostgresBackend) -> None:
    next_millis = now() + 5000
    job_id, delay = await backend.add_job_scheduler(
        "every-5s", next_millis, '{"x": 1}', {"attempts": 2}, {"name": "tick", "every": 5000},
        {"jobId": f"repeat:every-5s:{next_millis}", "delay": 5000, "repeatJobKey": "every-5s",
         "prevMillis": next_millis})
    fields, next_run = await backend.get_job_scheduler("every-5s")
    assert fields is not None and next_run is not None
    assert job_id == f"repeat:every-5s:{next_run}"  # for `every`, upstream picks the slot itself
    assert 0 <= delay <= 5000
    assert await backend.get_state(job_id) in ("delayed", "waiting")
    assert (fields["name"], fields["every"], fields["data"]) == ("tick", "5000", '{"x":1}')
    assert await backend.get_job_schedulers_count() == 1
    assert await backend.get_job_schedulers_range(0, -1, True) == [("every-5s", next_run)]
    assert await backend.is_job_scheduler("every-5s") is True
    with pytest.raises(JobBelongsToJobScheduler):
        await backend.remove(job_id, False)
    assert await backend.remove_job_scheduler("every-5s") == 0  # upstream: 0 = removed
    assert await backend.get_job_scheduler("every-5s") == (None, None)
    assert await backend.get_job_schedulers_count() == 0


async def test_only_the_current_iterations_producer_advances_a_scheduler(backend: PostgresBackend) -> None:
    first = now() + 60000
    job_id, _ = await backend.add_job_scheduler("cron", first, "{}", {}, {"name": "c", "pattern": "* * * * *"},
                                                {"jobId": f"repeat:cron:{first}", "delay": 60000})
    assert job_id == f"repeat:cron:{first}"
    second = first + 60000
    assert await backend.update_job_scheduler_next_millis("cron", second, "{}", {"delay": 120000}) is None
    assert await backend.update_job_scheduler_next_millis("cron", second, "{}", {"delay": 120000},
                                                          producer_id=job_id) == f"repeat:cron:{second}"
    assert (await backend.get_job_scheduler("cron"))[1] == str(second)
    assert await backend.update_job_scheduler_next_millis("gone", second, "{}", {}) is None


async def test_removing_a_missing_scheduler_answers_1_as_upstream(backend: PostgresBackend) -> None:
    assert await backend.remove_job_scheduler("nope") == 1


# -- the backend object -----------------------------------------------------------------------------

async def test_a_sibling_for_another_queue_shares_the_connection_and_does_not_close_it(
        backend: PostgresBackend) -> None:
    sibling = backend.for_queue("other")
    assert sibling.connection is backend.connection and sibling.qualified_name == "other"
    await sibling.close()
    assert await add_one(backend, new()) == "1"


@pytest.mark.parametrize("name", ["", "a:b", "nul\x00", 7])
def test_bad_queue_names_are_refused(backend: PostgresBackend, name: Any) -> None:
    with pytest.raises(InvalidQueueName):
        backend.for_queue(name)


def test_the_description_names_queue_schema_and_address_without_password(backend: PostgresBackend) -> None:
    assert "queue 'q'" in backend.description and "schema t_" in backend.description
