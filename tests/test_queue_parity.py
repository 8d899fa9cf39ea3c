"""Queue and Job calls Node BullMQ 6.7 has (issue: parity, Queue/Job half), against a real Redis.

Each test shows one call behaving as Node's does; tests/test_interop_parity.py compares the
ones whose answer crosses languages (the Prometheus text, deduplication decisions) with Node.
"""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import (
    ErrorCode,
    FlowProducer,
    InvalidArgument,
    InvalidJobOptions,
    Job,
    JobScheduler,
    MetricsTime,
    ParentJobNotFound,
    Queue,
    QueueEvents,
    Worker,
    default_repeat_strategy,
)
from bullmq_compat._backends.base import QueueBackend
from bullmq_compat._errors import script_error
from tests.helpers import EventRecorder, wait_until


@pytest.fixture
async def queue(redis_url: str, queue_name: str) -> AsyncIterator[Queue]:
    async with Queue(queue_name, connection=redis_url) as q:
        yield q


def now_ms() -> int:
    return int(time.time() * 1000)


# -- counts and lists ---------------------------------------------------------------------------
async def test_count_getters_match_get_job_counts(queue: Queue, redis_url: str) -> None:
    await queue.add("w", {})
    await queue.add("p", {}, priority=3)
    await queue.add("d", {}, delay=60_000)
    await queue.add("d2", {}, delay=120_000)
    async with FlowProducer(connection=redis_url) as flows:
        await flows.add({"name": "parent", "queue_name": queue.name,
                         "children": [{"name": "c", "queue_name": queue.name}]})
    worker = Worker(queue.name, connection=redis_url)
    try:
        taken = await worker.get_next_job("tok", block=False)
        assert taken is not None
        counts = await queue.get_job_counts()
        assert await queue.get_waiting_count() == counts["waiting"]
        assert await queue.get_active_count() == counts["active"] == 1
        assert await queue.get_delayed_count() == counts["delayed"] == 2
        assert await queue.get_prioritized_count() == counts["prioritized"] == 1
        assert await queue.get_waiting_children_count() == counts["waiting-children"] == 1
        assert await queue.get_completed_count() == 0
        assert await queue.get_failed_count() == 0
        # Node 6.6+: only the delayed jobs due strictly before the timestamp
        assert await queue.get_delayed_count(now_ms() + 90_000) == 1
        assert await queue.get_delayed_count(now_ms()) == 0
        [prioritized] = await queue.get_prioritized()
        assert prioritized.name == "p"
        [parent] = await queue.get_waiting_children()
        assert parent.name == "parent"
        await taken.move_to_completed("ok", "tok")
        assert await queue.get_completed_count() == 1
    finally:
        await worker.close()


async def test_get_delayed_count_refuses_a_timestamp_that_is_not_a_safe_integer(queue: Queue) -> None:
    for bad in (1.5, "1", 2**53, True):
        with pytest.raises(InvalidArgument, match="safe integer"):
            await queue.get_delayed_count(bad)  # type: ignore[arg-type]


# -- meta, version, limits ----------------------------------------------------------------------
async def test_meta_version_and_limits(queue: Queue) -> None:
    assert await queue.get_version() == "bullmq-compat:0.1.0"
    meta = await queue.get_meta()
    assert meta == {"version": "bullmq-compat:0.1.0", "maxLenEvents": 10000, "paused": False}
    assert await queue.get_global_rate_limit() is None
    await queue.set_global_rate_limit(5, 1000)
    await queue.set_global_concurrency(2)
    await queue.pause()
    meta = await queue.get_meta()
    assert (meta["max"], meta["duration"], meta["concurrency"], meta["paused"]) == (5, 1000, 2, True)
    assert await queue.get_global_rate_limit() == {"max": 5, "duration": 1000}
    # Node returns the number of fields HDEL removed
    assert await queue.remove_global_rate_limit() == 2
    assert await queue.remove_global_rate_limit() == 0
    assert await queue.remove_global_concurrency() == 1
    assert await queue.remove_global_concurrency() == 0
    assert await queue.get_global_rate_limit() is None


async def test_is_maxed_follows_global_concurrency(queue: Queue, redis_url: str) -> None:
    await queue.add("a", {})
    await queue.add("b", {})
    assert await queue.is_maxed() is False
    await queue.set_global_concurrency(1)
    worker = Worker(queue.name, connection=redis_url)
    try:
        job = await worker.get_next_job("t1", block=False)
        assert job is not None
        assert await queue.is_maxed() is True
        await job.move_to_completed(None, "t1")
        assert await queue.is_maxed() is False
    finally:
        await worker.close()


async def test_rate_limit_and_remove_rate_limit_key(queue: Queue, redis: Any) -> None:
    await queue.rate_limit(60_000)
    ttl = await queue.get_rate_limit_ttl()
    assert 55_000 < ttl <= 60_000
    assert await redis.get(queue.keys.limiter) == str(2**53 - 1)
    assert await queue.remove_rate_limit_key() == 1
    assert await queue.remove_rate_limit_key() == 0
    assert await queue.get_rate_limit_ttl() <= 0
    for bad in (0, -5, 1.5, True):
        with pytest.raises(InvalidArgument, match="expire_ms"):
            await queue.rate_limit(bad)  # type: ignore[arg-type]


# -- workers and QueueEvents ----------------------------------------------------------------------
async def test_workers_count_and_queue_events(queue: Queue, redis_url: str) -> None:
    assert await queue.get_workers_count() == 0
    assert await queue.get_queue_events() == []
    events = QueueEvents(queue.name, connection=redis_url)
    async with Worker(queue.name, lambda job: None, connection=redis_url, name="w1"):
        try:
            await wait_until(lambda: queue.get_workers_count(), what="the worker listed")
            assert await queue.get_workers_count() == len(await queue.get_workers()) == 1
            await events.wait_until_ready()  # QueueEvents runs on its own (Node's autorun)
            listed = await wait_until(lambda: queue.get_queue_events(), what="QueueEvents listed")
            assert [(entry["name"], entry["rawname"]) for entry in listed] == [
                (queue.name, queue.client_name(":qe"))]
        finally:
            await events.close()


# -- per-job helpers on the Queue -----------------------------------------------------------------
async def test_update_job_progress_and_add_job_log(queue: Queue, redis: Any) -> None:
    job = await queue.add("j", {})
    seen = EventRecorder(queue, "progress")
    await queue.update_job_progress(str(job.id), {"pct": 40})
    fetched = await queue.get_job(str(job.id))
    assert fetched is not None and fetched.progress == {"pct": 40}
    assert seen.of("progress") == [(str(job.id), {"pct": 40})]
    assert await queue.add_job_log(str(job.id), "one") == 1
    assert await queue.add_job_log(str(job.id), "two") == 2
    assert await queue.add_job_log(str(job.id), "three", keep_logs=2) == 2
    assert (await queue.get_job_logs(str(job.id)))["logs"] == ["two", "three"]
    with pytest.raises(InvalidArgument, match="keep_logs"):
        await queue.add_job_log(str(job.id), "x", keep_logs=-1)
    with pytest.raises(InvalidArgument):
        await queue.update_job_progress(str(job.id), {1, 2})
    events = [fields for _, fields in await redis.xrange(queue.keys.events)]
    assert {"event": "progress", "jobId": str(job.id), "data": '{"pct":40}'} in events


async def test_get_dependencies_pages_processed_and_pending(queue: Queue, redis_url: str) -> None:
    async with FlowProducer(connection=redis_url) as flows:
        tree = await flows.add({"name": "parent", "queue_name": queue.name, "children": [
            {"name": f"c{i}", "queue_name": queue.name, "data": {"i": i}} for i in range(5)]})
    parent_id = str(tree.job.id)
    pending = await queue.get_dependencies(parent_id, "pending", 0, -1)
    assert pending["total"] == 5 and len(pending["items"]) == 5
    assert {item["id"] for item in pending["items"]} == {c.job.full_key for c in tree.children}
    assert sorted(j["name"] for j in pending["jobs"]) == [f"c{i}" for i in range(5)]
    assert all(isinstance(j["data"], str) for j in pending["jobs"])  # Node's JobJson: data as text
    page = await queue.get_dependencies(parent_id, "pending", 1, 2)
    assert page["total"] == 5 and len(page["items"]) == 2
    worker = Worker(queue.name, connection=redis_url)
    try:
        for _ in range(2):
            job = await worker.get_next_job("t", block=False)
            assert job is not None
            await job.move_to_completed({"from": job.name}, "t")
    finally:
        await worker.close()
    done = await queue.get_dependencies(parent_id, "processed", 0, -1)
    assert done["total"] == 2
    assert sorted(item["v"]["from"] for item in done["items"]) == ["c0", "c1"]
    restored = Job.from_json(queue, done["jobs"][0])
    assert restored.name in ("c0", "c1") and restored.returnvalue == {"from": restored.name}
    with pytest.raises(InvalidArgument, match="'processed' or 'pending'"):
        await queue.get_dependencies(parent_id, "unprocessed")


async def test_an_orphan_whose_keys_come_in_different_scan_batches_counts_once(queue: Queue, redis: Any) -> None:
    """Candidates are checked each ``count`` keys scanned, which need not fall between SCAN replies:
    an orphan's ``:logs`` and its hash can then be in different batches although one reply brought
    both, and upstream's script counts each id it is given, deleted or not, so the second batch
    counted the same orphan again (a fresh-clone run saw 3 for 2 orphans). Here one SCAN reply
    brings the three keys (scan_iter is replaced by one that yields them, in this order, from a real
    SCAN of the queue's keys) and ``count=1`` checks after each."""
    base = queue.keys.prefix_key
    await redis.hset(base + "orphan", mapping={"name": "x", "data": "{}"})
    await redis.rpush(base + "orphan:logs", "a")
    await redis.rpush(base + "orphan:dependencies", "b")
    client = queue.backend.client  # type: ignore[attr-defined]
    real_scan = client.scan_iter

    async def one_reply(match: str, count: int) -> Any:
        keys = sorted([k async for k in real_scan(match=match, count=1000)], reverse=True)  # sub-keys first
        assert [k.decode() if isinstance(k, bytes) else k for k in keys] == [
            base + "orphan:logs", base + "orphan:dependencies", base + "orphan", base + "meta"]
        for key in keys:
            yield key
    client.scan_iter = one_reply
    try:
        assert await queue.remove_orphaned_jobs(count=1) == 1
    finally:
        del client.scan_iter
    assert not await redis.exists(base + "orphan", base + "orphan:logs", base + "orphan:dependencies")


async def test_remove_orphaned_jobs_removes_only_unlisted_job_data(queue: Queue, redis: Any) -> None:
    kept = await queue.add("kept", {})
    await queue.add("dedup", {}, deduplication={"id": "logs"})
    base = queue.keys.prefix_key
    await redis.hset(base + "orphan1", mapping={"name": "x", "data": "{}"})
    await redis.rpush(base + "orphan1:logs", "a")
    await redis.hset(base + "orphan2", mapping={"name": "y"})
    assert await queue.remove_orphaned_jobs(count=10) == 2
    assert not await redis.exists(base + "orphan1", base + "orphan1:logs", base + "orphan2")
    assert await redis.exists(queue.keys.job(str(kept.id)))
    assert await redis.exists(queue.keys.meta, f"{queue.keys.de}:logs")
    assert await queue.remove_orphaned_jobs() == 0
    for i in range(3):
        await redis.hset(f"{base}o{i}", "name", "z")
    assert await queue.remove_orphaned_jobs(count=1000, limit=1) >= 1


# -- the Queue's events ---------------------------------------------------------------------------
async def test_queue_emits_nodes_events(queue: Queue) -> None:
    seen = EventRecorder(queue, "waiting", "paused", "resumed", "removed", "cleaned")
    job = await queue.add("j", {})
    assert [args[0].id for args in seen.of("waiting")] == [job.id]
    await queue.add_bulk([{"name": "b", "data": {}}])
    assert len(seen.of("waiting")) == 1  # Node's addBulk emits no 'waiting'
    await queue.pause()
    await queue.resume()
    assert seen.of("paused") == [()] and seen.of("resumed") == [()]
    assert await queue.remove(str(job.id)) == 1
    assert seen.of("removed") == [(str(job.id),)]
    other = await queue.add("k", {})
    await other.remove()
    assert seen.of("removed")[-1] == (other,)
    cleaned = await queue.clean(0, 0, "waiting")
    assert len(cleaned) == 1
    assert seen.of("cleaned") == [(cleaned, "wait")]


async def test_queue_emits_error_when_it_cannot_connect(queue_name: str) -> None:
    queue = Queue(queue_name, connection="redis://127.0.0.1:1/0")
    seen = EventRecorder(queue, "error")
    try:
        with pytest.raises(Exception):
            await queue.get_job_counts()
        assert len(seen.of("error")) == 1
    finally:
        await queue.close()


async def test_disconnect_keeps_the_queue_usable(queue: Queue) -> None:
    await queue.add("a", {})
    await queue.disconnect()
    assert await queue.get_waiting_count() == 1
    await queue.add("b", {})  # the fast channel is opened again
    await queue.add_bulk([{"name": "c"}])
    await queue.disconnect()
    await queue.disconnect()
    assert await queue.get_waiting_count() == 3


# -- Prometheus -----------------------------------------------------------------------------------
async def test_export_prometheus_metrics_shape(redis_url: str) -> None:
    name = 'we"ird\\q\nx'.replace(":", "")
    async with Queue(name + str(now_ms()), connection=redis_url) as queue:
        await queue.add("a", {})
        text = await queue.export_prometheus_metrics({"env": 'p"1', "n": 2})
    lines = text.split("\n")
    label = queue.name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    assert lines[0] == "# HELP bullmq_job_count Number of jobs in the queue by state"
    assert f'bullmq_job_count{{queue="{label}", state="waiting", env="p\\"1", n="2"}} 1' in lines
    assert lines[-1] == f'bullmq_job_failed_total{{queue="{label}", env="p\\"1", n="2"}} 0'
    assert not text.endswith("\n")


# -- Job ------------------------------------------------------------------------------------------
async def test_job_views_and_static_constructors(queue: Queue) -> None:
    job = await Job.create(queue, "j", {"x": 1}, {"keep_logs": 5, "attempts": 2})
    assert job.queue_name == queue.name and job.prefix == "bull"
    again = await Job.from_id(queue, str(job.id))
    assert again is not None and again.data == {"x": 1}
    assert await Job.from_id(queue, "") is None
    as_json = again.as_json()
    assert as_json["data"] == '{"x":1}' and as_json["opts"]["keepLogs"] == 5
    assert as_json["returnvalue"] == "null" and as_json["stacktrace"] == "[]"
    assert "failedReason" not in as_json
    copy = Job.from_json(queue, as_json)
    assert (copy.id, copy.name, copy.data, copy.opts["keep_logs"]) == (job.id, "j", {"x": 1}, 5)
    shown = again.to_json()
    assert shown["opts"] == {"attempts": 2, "keepLogs": 5}
    assert shown["queueQualifiedName"] == f"bull:{queue.name}" and shown["returnvalue"] is None
    json.dumps(shown)  # plain JSON, as JSON.stringify(job)
    bulk = await Job.create_bulk(queue, [{"name": "b1", "data": {}}, {"name": "b2"}])
    assert [b.name for b in bulk] == ["b1", "b2"]
    with pytest.raises(InvalidArgument):
        Job.from_json(queue, {"name": "x", "data": "{not json"})


async def test_job_is_waiting_children_and_clear_logs(queue: Queue, redis_url: str) -> None:
    async with FlowProducer(connection=redis_url) as flows:
        tree = await flows.add({"name": "p", "queue_name": queue.name,
                                "children": [{"name": "c", "queue_name": queue.name}]})
    # the tree's jobs belong to the closed producer's queues: read them again through an open one
    parent, job = await queue.get_job(str(tree.job.id)), await queue.get_job(str(tree.children[0].job.id))
    assert await parent.is_waiting_children() is True
    assert await job.is_waiting_children() is False
    for row in ("a", "b", "c", "d"):
        await job.log(row)
    await job.clear_logs(keep=2)
    assert (await job.get_logs())["logs"] == ["c", "d"]
    await job.clear_logs()
    assert await job.get_logs() == {"logs": [], "count": 0}
    with pytest.raises(InvalidArgument, match="keep"):
        await job.clear_logs(keep=-1)


async def test_job_remove_deduplication_key_only_while_it_points_at_the_job(queue: Queue) -> None:
    first = await queue.add("j", {}, deduplication={"id": "d1"})
    assert await first.remove_deduplication_key() is True
    assert await queue.get_deduplication_job_id("d1") is None
    second = await queue.add("j", {}, deduplication={"id": "d1"})
    assert second.id != first.id
    assert await first.remove_deduplication_key() is False  # the key is the second job's now
    assert await queue.get_deduplication_job_id("d1") == second.id
    plain = await queue.add("j", {})
    assert await plain.remove_deduplication_key() is False
    # Node's deprecated names
    assert await queue.get_debounce_job_id("d1") == second.id
    assert await queue.remove_debounce_key("d1") == 1
    assert await queue.get_debounce_job_id("d1") is None


async def test_job_move_to_wait_without_a_token(queue: Queue, redis_url: str) -> None:
    await queue.add("j", {})
    worker = Worker(queue.name, connection=redis_url)
    try:
        job = await worker.get_next_job("tok", block=False)
        assert job is not None
        assert await job.move_to_wait() <= 0  # token '0', as Node's default: the lock is not checked
        assert await job.get_state() == "waiting"
    finally:
        await worker.close()


# -- options ---------------------------------------------------------------------------------------
async def test_deduplication_reschedule_moves_the_delayed_job(queue: Queue, redis: Any) -> None:
    first = await queue.add("j", {"v": 1}, delay=60_000, deduplication={"id": "r", "reschedule": True})
    before = await redis.zscore(queue.keys.delayed, str(first.id))
    again = await queue.add("j", {"v": 2}, delay=120_000, deduplication={"id": "r", "reschedule": True})
    assert again.id == first.id
    after = await redis.zscore(queue.keys.delayed, str(first.id))
    assert after > before
    stored = await queue.get_job(str(first.id))
    assert stored is not None and stored.delay == 120_000 and stored.data == {"v": 1}
    assert stored.opts["deduplication"] == {"id": "r", "reschedule": True}
    with pytest.raises(InvalidJobOptions, match="reschedule"):
        await queue.add("j", {}, deduplication={"id": "r", "reschedule": "yes"})


# -- exports ---------------------------------------------------------------------------------------
def test_error_code_and_metrics_time_are_nodes() -> None:
    assert [(code.value, code.node_name) for code in ErrorCode][:2] == [(-1, "JobNotExist"), (-2, "JobLockNotExist")]
    assert ErrorCode(-11).node_name == "SchedulerJobSlotsBusy"
    for code in ErrorCode:
        assert script_error(code).code == code
    assert (MetricsTime.ONE_HOUR, MetricsTime.ONE_WEEK, MetricsTime.ONE_MONTH) == (60, 10080, 80640)


def test_default_repeat_strategy_is_nodes() -> None:
    start = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    assert default_repeat_strategy(start, {"pattern": "0 0 * * *", "tz": "UTC"}) == 1_700_006_400_000
    later = start + 10 * 86_400_000
    assert default_repeat_strategy(start, {"pattern": "0 0 * * *", "tz": "UTC", "start_date": later}) == \
        later + (1_700_006_400_000 - start)
    assert default_repeat_strategy(start, {"pattern": "0 0 * * *", "endDate": start + 1000}) is None
    with pytest.raises(InvalidArgument):
        default_repeat_strategy(start, {"every": 1000})


async def test_queue_repeat_strategy_computes_the_next_time(redis_url: str, queue_name: str) -> None:
    calls: list[tuple[int, dict[str, Any], Any]] = []

    async def in_an_hour(millis: int, opts: dict[str, Any], name: Any) -> int:
        calls.append((millis, opts, name))
        return millis + 3_600_000

    async with Queue(queue_name, connection=redis_url, repeat_strategy=in_an_hour) as queue:
        job = await queue.upsert_job_scheduler("s", {"pattern": "* * * * *"}, {"name": "tick"})
        assert job is not None
        assert calls and calls[0][1]["pattern"] == "* * * * *" and calls[0][2] == "tick"
        assert 3_500_000 < job.delay <= 3_600_000
        scheduler = await queue.get_job_scheduler("s")
        assert scheduler is not None and scheduler["next"] == calls[0][0] + 3_600_000
    with pytest.raises(InvalidArgument, match="repeat_strategy"):
        Queue(queue_name, connection=redis_url, repeat_strategy=5)


async def test_job_scheduler_class(redis_url: str, queue_name: str) -> None:
    async with JobScheduler(queue_name, connection=redis_url) as schedulers:
        job = await schedulers.upsert_job_scheduler("every", {"every": 60_000}, "tick", {"n": 1})
        assert job is not None and job.name == "tick" and job.data == {"n": 1}
        found = await schedulers.get_scheduler("every")
        assert found is not None and found["every"] == 60_000
        assert await schedulers.get_schedulers_count() == 1
        assert [s["key"] for s in await schedulers.get_job_schedulers()] == ["every"]
        assert await schedulers.remove_job_scheduler("every") is True
        assert await schedulers.get_schedulers_count() == 0
        with pytest.raises(InvalidArgument, match="producer_id"):
            await schedulers.upsert_job_scheduler("x", {"every": 1000}, "t", override=False)


def test_new_contract_methods_are_abstract() -> None:
    for name in ("is_maxed", "remove_rate_limit_key", "clear_logs", "paginate_dependencies",
                 "remove_orphaned_jobs", "get_queue_events_clients", "remove_deduplication_key"):
        assert name in QueueBackend.__abstractmethods__


# -- FlowProducer.add_bulk: all or nothing ------------------------------------------------------
async def _keys_of(redis: Any, queue_name: str) -> set[str]:
    return {key async for key in redis.scan_iter(match=f"bull:{queue_name}:*")}


async def test_add_bulk_with_a_missing_parent_writes_nothing(redis_url: str, queue_name: str, redis: Any) -> None:
    async with Queue(queue_name, connection=redis_url) as queue:
        await queue.add("warm-up", {})  # the queue's meta and id keys exist before
        before = await _keys_of(redis, queue_name)
        async with FlowProducer(connection=redis_url) as flows:
            good = {"name": "ok", "queue_name": queue_name, "children": [{"name": "c", "queue_name": queue_name}]}
            orphan = {"name": "orphan", "queue_name": queue_name,
                      "opts": {"parent": {"id": "nope", "queue": f"bull:{queue_name}"}},
                      "children": [{"name": "c2", "queue_name": queue_name}]}
            with pytest.raises(ParentJobNotFound, match=r"flow\[1\].*nothing was added") as caught:
                await flows.add_bulk([good, orphan, good])
            assert caught.value.parent_key == f"bull:{queue_name}:nope"
            assert await _keys_of(redis, queue_name) == before
            assert await queue.get_job_counts() == {**{s: 0 for s in (await queue.get_job_counts())}, "waiting": 1}
            # with the parent there, the same call adds every tree
            await queue.add("nope-parent", {}, job_id="nope")
            trees = await flows.add_bulk([good, orphan])
            assert [t.job.name for t in trees] == ["ok", "orphan"]
            assert await trees[1].job.get_state() == "waiting-children"
            deps = await queue.get_dependencies("nope", "pending")
            assert deps["items"] == [{"id": trees[1].job.full_key}]


async def test_add_bulk_checks_parents_again_when_one_changes_meanwhile(
        redis_url: str, queue_name: str, redis: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent removed between the check and EXEC drops the transaction (WATCH); the second check
    sees it gone and nothing is written."""
    async with Queue(queue_name, connection=redis_url) as queue:
        await queue.add("parent", {}, job_id="par")
        async with FlowProducer(connection=redis_url) as flows:
            backend: Any = flows._backend
            real = backend.client.pipeline
            removed = []

            def pipeline(*args: Any, **kwargs: Any) -> Any:
                pipe = real(*args, **kwargs)
                real_execute = pipe.execute

                async def execute(*a: Any, **k: Any) -> Any:
                    if not removed:  # another client removes the parent after our check, before EXEC
                        removed.append(True)
                        await redis.delete(queue.keys.job("par"))
                    return await real_execute(*a, **k)
                pipe.execute = execute
                return pipe

            monkeypatch.setattr(backend.client, "pipeline", pipeline)
            before = await _keys_of(redis, queue_name)
            with pytest.raises(ParentJobNotFound):
                await flows.add_bulk([
                    {"name": "a", "queue_name": queue_name},
                    {"name": "b", "queue_name": queue_name, "opts": {"parent": {"id": "par", "queue": f"bull:{queue_name}"}}},
                ])
            assert removed
            assert await _keys_of(redis, queue_name) == before - {queue.keys.job("par")}


async def test_queue_takes_nodes_queue_options(redis_url: str, queue_name: str) -> None:
    def every_hour(millis: int, opts: Any, name: Any) -> int:
        return millis + 3_600_000

    queue = Queue(queue_name, connection=redis_url, streams={"events": {"maxLen": 50}},
                  settings={"repeatStrategy": every_hour}, skip_metas_update=True,
                  skip_version_check=True, skip_waiting_for_ready=True, blocking_connection=False)
    try:
        assert (queue.max_len_events, queue.repeat_strategy, queue.skip_meta_update) == (50, every_hour, True)
        await queue.add("a", {})
        assert await queue.get_version() is None  # skip_metas_update: meta not written
    finally:
        await queue.close()
    with pytest.raises(InvalidArgument, match="legacy repeatable jobs"):
        Queue(queue_name, connection=redis_url, settings={"repeatKeyHashAlgorithm": "md5"})
    with pytest.raises(InvalidArgument, match="streams"):
        Queue(queue_name, connection=redis_url, streams={"events": {"max": 1}})


async def test_job_options_node_removed_are_refused_with_the_reason(queue: Queue) -> None:
    with pytest.raises(InvalidJobOptions, match="Use deduplication option instead"):
        await queue.add("j", {}, debounce={"id": "x"})
    with pytest.raises(InvalidJobOptions, match="upsert_job_scheduler"):
        await queue.add("j", {}, repeat={"every": 1000})
    assert await queue.count() == 0


async def test_add_bulk_all_or_nothing_on_redis_cluster() -> None:
    """The WATCH check also runs through a RedisCluster pipeline (a hash-tagged prefix: one slot)."""
    from redis.asyncio.cluster import RedisCluster

    from tests._cluster import local_cluster

    with local_cluster() as cluster:
        client = RedisCluster(host=cluster.host, port=cluster.port, decode_responses=True)
        try:
            name = f"t-{now_ms()}"
            async with FlowProducer(connection=client, prefix="{bull}") as flows:
                orphan = {"name": "o", "queue_name": name, "opts": {"parent": {"id": "nope", "queue": f"{{bull}}:{name}"}}}
                with pytest.raises(ParentJobNotFound):
                    await flows.add_bulk([{"name": "a", "queue_name": name}, orphan])
                assert [key async for key in client.scan_iter(match=f"{{bull}}:{name}:*")] == []
                async with Queue(name, connection=client, prefix="{bull}") as queue:
                    await queue.add("p", {}, job_id="nope")
                    trees = await flows.add_bulk([{"name": "a", "queue_name": name}, orphan])
                    assert await trees[1].job.get_state() == "waiting"
        finally:
            await client.aclose()
