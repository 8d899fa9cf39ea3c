"""PostgresBackend, reading, changing and managing jobs and queues, against a real PostgreSQL
(a migrated schema per test)."""
from __future__ import annotations

from typing import Any

import pytest

from bullmq_compat import InvalidJobData, InvalidQueueName, JobNotFound, JobNotInState
from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._errors import InvalidArgument, NotSupportedOnBackend
from bullmq_compat._job import Job
from tests.postgres_helpers import add, add_one, complete, count_jobs, fail, new, now, stored, take

# -- reading ----------------------------------------------------------------------------------------

async def test_is_finished_tells_completed_failed_pending_and_missing(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new("a"), new("b"), new("c"))
    done = await complete(pg_backend, '"r"')
    failed = await fail(pg_backend, "why")
    assert await pg_backend.is_finished(done) == (1, '"r"')
    assert await pg_backend.is_finished(failed) == (2, "why")
    assert await pg_backend.is_finished("3") == (0, "")
    assert await pg_backend.is_finished("nope") == (-1, "Missing key for job q:nope. isFinished")


async def test_is_maxed_follows_the_global_concurrency(pg_backend: PostgresBackend) -> None:
    assert await pg_backend.is_maxed() is False
    await pg_backend.set_meta({"concurrency": 1})
    await add_one(pg_backend, new())
    await take(pg_backend)
    assert await pg_backend.is_maxed() is True


async def test_get_state_of_a_missing_job_is_unknown(pg_backend: PostgresBackend) -> None:
    assert await pg_backend.get_state("nope") == "unknown"
    assert await pg_backend.get_job("nope") is None


async def test_get_jobs_lists_waiting_jobs_in_fifo_order_when_ascending(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new("a"), new("b"), new("c"))
    assert [jid for jid, _ in await pg_backend.get_jobs(["waiting"], 0, -1, True)] == ["1", "2", "3"]
    assert [jid for jid, _ in await pg_backend.get_jobs(["waiting"], 0, -1, False)] == ["3", "2", "1"]
    assert [f["name"] for _, f in await pg_backend.get_jobs(["waiting"], 0, 1, True)] == ["b", "c"]


async def test_get_jobs_over_several_states_lists_each_job_once(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new("a"), new("b", delay=60000), new("c", priority=2))
    jobs = await pg_backend.get_jobs(["waiting", "delayed", "prioritized", "waiting"], 0, -1, True)
    assert [jid for jid, _ in jobs] == ["1", "2", "3"]


async def test_delayed_counts_can_be_limited_to_jobs_due_before_a_time(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new(delay=1000), new(delay=600000), new())
    assert await pg_backend.get_counts(["waiting", "delayed"], delayed_timestamp=now() + 60000) == [1, 1]
    assert await pg_backend.get_counts(["delayed"]) == [2]


@pytest.mark.parametrize("job_id", [42, None, b"42"])
async def test_a_job_id_that_is_not_a_str_is_refused_naming_it(pg_backend: PostgresBackend, job_id: Any) -> None:
    with pytest.raises(InvalidArgument, match=f"job_id={job_id!r}"):
        await pg_backend.get_job(job_id)


async def test_get_counts_report_waiting_jobs_as_paused_while_paused(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new(), new())
    await pg_backend.pause(True)
    assert await pg_backend.get_counts(["waiting", "wait", "paused"]) == [0, 0, 2]
    assert await pg_backend.get_meta_field("paused") == "1"
    await pg_backend.pause(False)
    assert await pg_backend.get_counts(["waiting", "paused"]) == [2, 0]


async def test_job_logs_page_like_lrange_and_keep_logs_trims(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new())
    assert [await pg_backend.add_log(job_id, f"line {i}", None) for i in range(3)] == [1, 2, 3]
    assert await pg_backend.get_job_logs(job_id, 0, -1, True) == (["line 0", "line 1", "line 2"], 3)
    assert await pg_backend.get_job_logs(job_id, 0, 0, False) == (["line 2"], 3)
    assert await pg_backend.get_job_logs(job_id, -2, -1, True) == (["line 1", "line 2"], 3)
    assert await pg_backend.add_log(job_id, "line 3", 2) == 2
    assert await pg_backend.get_job_logs(job_id, 0, -1, True) == (["line 2", "line 3"], 2)


async def test_a_log_for_a_missing_job_raises_job_not_found(pg_backend: PostgresBackend) -> None:
    with pytest.raises(JobNotFound):
        await pg_backend.add_log("nope", "x", None)


async def test_counts_per_priority_follow_the_requested_order(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new(), new(priority=2), new(priority=2), new(priority=5))
    assert await pg_backend.get_counts_per_priority([5, 0, 2, 9]) == [1, 1, 2, 0]


async def test_metrics_of_a_queue_without_any(pg_backend: PostgresBackend) -> None:
    assert await pg_backend.get_metrics("completed", 0, -1) == (["0", "0", "0"], [], 0)


async def test_rate_limit_ttl_without_a_window_is_minus_2_or_0_against_a_max(pg_backend: PostgresBackend) -> None:
    assert await pg_backend.get_rate_limit_ttl(None) == -2
    assert await pg_backend.get_rate_limit_ttl(5) == 0


async def test_rate_limit_ttl_of_a_held_window(pg_backend: PostgresBackend) -> None:
    await pg_backend.set_rate_limit(60000)
    assert 0 < await pg_backend.get_rate_limit_ttl(None) <= 60000
    assert await pg_backend.remove_rate_limit_key() == 1
    assert await pg_backend.get_rate_limit_ttl(None) == -2


async def test_the_client_list_names_listen_sessions_of_the_database(pg_backend: PostgresBackend) -> None:
    listen = await pg_backend.connection.open_listen_session("q:w:worker-1")
    try:
        assert {"name": "q:w:worker-1"} in await pg_backend.get_client_list()
    finally:
        await pg_backend.connection.close_listen_session(listen)


# -- meta -------------------------------------------------------------------------------------------

async def test_meta_values_are_stored_as_node_stringifies_them(pg_backend: PostgresBackend) -> None:
    await pg_backend.set_meta({"concurrency": 3, "flag": True, "opts.maxLenEvents": 10000})
    assert await pg_backend.get_meta_field("concurrency") == "3"
    assert await pg_backend.get_meta_field("flag") == "true"
    assert await pg_backend.get_meta() == {"concurrency": "3", "flag": "true", "opts.maxLenEvents": "10000"}
    assert await pg_backend.remove_meta_fields(["concurrency", "flag", "absent"]) == 2
    assert await pg_backend.get_meta_field("flag") is None


# -- changing one job -------------------------------------------------------------------------------

async def test_update_data_replaces_the_data(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new(data={"a": 1}))
    await pg_backend.update_data(job_id, '"now a string"')
    assert await stored(pg_backend, "data", job_id) == "now a string"


async def test_update_data_with_u0000_is_refused_and_leaves_the_data(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new(data={"a": 1}))
    with pytest.raises(InvalidJobData):
        await pg_backend.update_data(job_id, '{"a": "\\u0000"}')
    assert await stored(pg_backend, "data", job_id) == {"a": 1}


async def test_updating_a_missing_job_raises_job_not_found(pg_backend: PostgresBackend) -> None:
    with pytest.raises(JobNotFound):
        await pg_backend.update_data("nope", "{}")
    with pytest.raises(JobNotFound):
        await pg_backend.update_progress("nope", "50")


async def test_progress_reads_back_and_is_announced(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new())
    await pg_backend.update_progress(job_id, '{"pct": 50}')
    fields = await pg_backend.get_job(job_id)
    assert fields is not None and fields["progress"] == '{"pct":50}'
    events = (await pg_backend.connection.run("read_events", [pg_backend.name, 0, 100])).rows
    assert {"event": "progress", "data": {"jobId": job_id, "data": '{"pct": 50}'}} in \
        [{"event": e["event"], "data": e["data"]} for e in events]


async def test_remove_deletes_the_job_and_a_missing_job_gives_0(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new())
    assert await pg_backend.remove(job_id, True) == 1
    assert await pg_backend.remove(job_id, True) == 0


async def test_a_finished_job_is_reprocessed_to_waiting(pg_backend: PostgresBackend) -> None:
    await add_one(pg_backend, new())
    job_id = await fail(pg_backend)
    fields = await pg_backend.get_job(job_id)
    assert fields is not None and fields["failedReason"] == "boom" and fields["stacktrace"] == '["at x"]'
    await pg_backend.reprocess_job(job_id, "failed", False, True, True)
    assert await pg_backend.get_state(job_id) == "waiting"


async def test_reprocessing_a_job_not_in_that_state_raises_job_not_in_state(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new())
    with pytest.raises(JobNotInState, match="failed"):
        await pg_backend.reprocess_job(job_id, "failed", False, False, False)
    with pytest.raises(JobNotFound):
        await pg_backend.reprocess_job("nope", "failed", False, False, False)


async def test_a_completed_jobs_return_value_reads_back_as_json_text(pg_backend: PostgresBackend) -> None:
    await add_one(pg_backend, new())
    job_id = await complete(pg_backend, '"42"')
    fields = await pg_backend.get_job(job_id)
    assert fields is not None
    assert Job.from_raw(None, job_id, fields).returnvalue == "42"  # type: ignore[arg-type]
    assert "finishedOn" in fields and "processedOn" in fields and fields["ats"] == "1"


async def test_promote_moves_a_delayed_job_to_waiting(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new(delay=60000))
    await pg_backend.promote(job_id)
    assert await pg_backend.get_state(job_id) == "waiting"
    with pytest.raises(JobNotInState, match="delayed"):
        await pg_backend.promote(job_id)


async def test_change_delay_reschedules_a_delayed_job_only(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new(delay=60000))
    at = now()
    await pg_backend.change_delay(job_id, 120000, at)
    assert await stored(pg_backend, "process_at_ms", job_id) == at + 120000
    waiting = await add_one(pg_backend, new())
    with pytest.raises(JobNotInState):
        await pg_backend.change_delay(waiting, 10, now())


async def test_change_priority_makes_a_job_prioritized(pg_backend: PostgresBackend) -> None:
    job_id = await add_one(pg_backend, new())
    await pg_backend.change_priority(job_id, 4, False)
    assert await pg_backend.get_state(job_id) == "prioritized"
    with pytest.raises(JobNotFound):
        await pg_backend.change_priority("nope", 1, False)


# -- managing the queue -----------------------------------------------------------------------------

async def test_drain_removes_waiting_and_optionally_delayed_jobs(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new(), new(delay=60000))
    await pg_backend.drain(False)
    assert await pg_backend.get_counts(["waiting", "delayed"]) == [0, 1]
    await pg_backend.drain(True)
    assert await pg_backend.get_counts(["delayed"]) == [0]


async def test_clean_removes_finished_jobs_older_than_the_timestamp(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new(), new())
    first = await complete(pg_backend)
    assert await pg_backend.clean("completed", now() + 1000, 0) == [first]
    assert await pg_backend.get_job(first) is None
    assert await pg_backend.clean("completed", 0, 0) == []


async def test_obliterate_refuses_a_running_queue_then_deletes_everything(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, *[new() for _ in range(5)])
    with pytest.raises(InvalidArgument, match="non-paused"):
        await pg_backend.obliterate(False, 2)
    await pg_backend.pause(True)
    await pg_backend.obliterate(False, 2)
    assert await count_jobs(pg_backend) == 0


async def test_obliterate_without_force_refuses_active_jobs(pg_backend: PostgresBackend) -> None:
    await add_one(pg_backend, new())
    await take(pg_backend)
    await pg_backend.pause(True)
    with pytest.raises(InvalidArgument, match="active jobs"):
        await pg_backend.obliterate(False, 100)
    await pg_backend.obliterate(True, 100)
    assert await count_jobs(pg_backend) == 0


async def test_retry_jobs_moves_failed_jobs_back_to_waiting(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, new(), new())
    await fail(pg_backend)
    await fail(pg_backend)
    await pg_backend.retry_jobs("failed", 1, now() + 1000)
    assert await pg_backend.get_counts(["failed", "waiting"]) == [0, 2]


async def test_promote_jobs_moves_every_delayed_job(pg_backend: PostgresBackend) -> None:
    await add(pg_backend, *[new(delay=60000) for _ in range(3)])
    await pg_backend.promote_jobs(2)
    assert await pg_backend.get_counts(["delayed", "waiting"]) == [0, 3]


async def test_trim_events_is_not_supported_as_in_node(pg_backend: PostgresBackend) -> None:
    with pytest.raises(NotSupportedOnBackend, match="trim_events.*postgres"):
        await pg_backend.trim_events(10)


async def test_publish_event_appends_to_the_stream(pg_backend: PostgresBackend) -> None:
    event_id = await pg_backend.publish_event({"event": "custom", "n": 3, "text": "x"}, 10000)
    rows = (await pg_backend.connection.run("read_events", [pg_backend.name, int(event_id) - 1, 10])).rows
    assert [(str(r["id"]), r["event"], r["data"]) for r in rows] == [(event_id, "custom", {"n": 3, "text": "x"})]


# -- the backend object -----------------------------------------------------------------------------

async def test_a_sibling_for_another_queue_shares_the_connection_and_does_not_close_it(
        pg_backend: PostgresBackend) -> None:
    sibling = pg_backend.for_queue("other")
    assert sibling.connection is pg_backend.connection and sibling.qualified_name == "other"
    await sibling.close()
    assert await add_one(pg_backend, new()) == "1"


@pytest.mark.parametrize("name", ["", "a:b", "nul\x00", 7])
def test_bad_queue_names_are_refused(pg_backend: PostgresBackend, name: Any) -> None:
    with pytest.raises(InvalidQueueName):
        pg_backend.for_queue(name)


def test_the_description_names_queue_schema_and_address_without_password(pg_backend: PostgresBackend) -> None:
    assert "queue 'q'" in pg_backend.description and "schema t_" in pg_backend.description


async def test_open_postgres_backend_owns_its_connection(postgres_url: str, pg_migrated: str) -> None:
    from bullmq_compat._backends.postgres.backend import open_postgres_backend

    backend = open_postgres_backend(postgres_url, "q", schema=pg_migrated)
    await backend.connect()
    assert await add_one(backend, new()) == "1"
    await backend.close()
    assert backend.connection.closed
