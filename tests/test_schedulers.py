"""Job schedulers from Python (issue #5): upsert/get/list/count/remove on the upstream scripts,
the Python Worker making each next iteration as Node's does, limit/end_date, restarts, and
cron next times (the Node comparison is in test_interop_schedulers.py)."""
from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import pytest

from bullmq_compat import InvalidArgument, InvalidJobOptions, Job, Queue, Worker
from bullmq_compat._cron import next_cron_millis, parse_cron
from bullmq_compat._scheduler import advance_job_scheduler, is_legacy_repeat_key
from tests.helpers import wait_until

# a worker's timer precision, for "on time" (ms)
LATE_BOUND_MS = 3000  # see check_on_time


def millis_of(job_id: str) -> int:
    """The scheduled time in a scheduler job id ``repeat:<id>:<millis>``."""
    return int(str(job_id).rsplit(":", 1)[1])


def now_ms() -> int:
    return int(time.time() * 1000)


async def scheduler_jobs(redis: Any, queue_name: str, scheduler_id: str) -> dict[str, dict[str, str]]:
    """Every job hash of one scheduler, by job id, oldest first."""
    prefix = f"bull:{queue_name}:repeat:{scheduler_id}:"
    keys = [k async for k in redis.scan_iter(match=f"{prefix}*")]
    keys = [k for k in keys if k[len(prefix):].isdigit()]
    out = {}
    for key in sorted(keys, key=lambda k: int(k[len(prefix):])):
        out[f"repeat:{scheduler_id}:{key[len(prefix):]}"] = await redis.hgetall(key)
    return out


def check_run(processed: list[tuple[str, int]], every: int, *, allow_gap_at: Any = ()) -> None:
    """Processed (job id, processed-on ms) of an every-``every`` scheduler: each iteration once,
    on time, consecutive slots (a gap only where a worker restart may have skipped slots)."""
    ids = [job_id for job_id, _ in processed]
    assert len(ids) == len(set(ids)), f"an iteration ran twice: {ids}"
    slots = sorted(millis_of(i) for i in ids)
    # an iteration taken a whole interval late (a loaded machine) makes the next one from that
    # moment, as Node does: the slots in between are skipped, not lost
    late = {millis_of(job_id) for job_id, at in processed if at - millis_of(job_id) >= every}
    for before, after in zip(slots, slots[1:]):
        gap = after - before
        if before in allow_gap_at or before in late:
            assert gap % every == 0, f"slots {before} -> {after} are not aligned on {every} ms"
        else:
            assert gap == every, f"slots {before} -> {after}: an iteration is missing; (id, processed) {processed}"


def check_on_time(processed: list[tuple[str, int]], *, skip_first: bool = True) -> None:
    """No iteration ran before its time, and none was left waiting: each ran within a generous
    bound of its time (a busy machine delays timers by hundreds of ms; a scheduler that stopped
    advancing, or waited for a block timeout, misses it by seconds). That no slot was skipped or
    run twice is `check_run`'s."""
    late = [(job_id, at - millis_of(job_id)) for job_id, at in processed]
    if skip_first:
        late = late[1:]
    assert all(ms >= 0 for _, ms in late), f"an iteration ran early (id, ms late): {late}"
    slow = [(job_id, ms) for job_id, ms in late if ms > LATE_BOUND_MS]
    assert not slow, f"iterations left waiting (id, ms late): {late}"


class Recorder:
    """A processor recording (job id, processedOn) of each job it runs."""

    def __init__(self) -> None:
        self.processed: list[tuple[str, int]] = []

    async def __call__(self, job: Job) -> Any:
        self.processed.append((str(job.id), int(job.processed_on or now_ms())))
        return {"ok": job.id}


async def run_worker(redis_url: str, queue_name: str, processor: Any, seconds: float, *,
                     until: Optional[Callable[[], Any]] = None, timeout: float = 60.0, **kwargs: Any) -> None:
    """Run a Worker for ``seconds``, then (with ``until``) on until ``until()`` is true (sync or async;
    `AssertionError` after ``timeout`` s): what must have happened, however slow the machine."""
    worker = Worker(queue_name, processor, connection=redis_url, drain_delay=0.5, **kwargs)
    errors: list[Any] = []
    worker.on("error", errors.append)
    task = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        await asyncio.sleep(seconds)
        if until is not None:
            await wait_until(until, timeout, "the worker's work")
    finally:
        await worker.close()
        await task
    assert not errors, errors


@pytest.fixture
async def queue(redis_url: str, queue_name: str) -> Any:
    q = Queue(queue_name, connection=redis_url)
    yield q
    await q.close()


# -- upsert, read back, remove ------------------------------------------------------------------
async def test_upsert_every_stores_the_node_wire_format(queue: Queue, queue_name: str, redis: Any) -> None:
    before = now_ms()
    job = await queue.upsert_job_scheduler(
        "tick", {"every": 60000}, template={"name": "tock", "data": {"a": 1},
                                           "opts": {"attempts": 3, "remove_on_complete": 10}})
    assert job is not None and job.name == "tock" and job.data == {"a": 1}
    millis = millis_of(job.id)
    assert job.id == f"repeat:tick:{millis}" and before <= millis <= now_ms()
    assert job.repeat_job_key == "tick" and job.delay == 0
    assert await job.get_state() == "waiting"  # 'every' runs the first iteration at once

    scheduler = await redis.hgetall(f"bull:{queue_name}:repeat:tick")
    assert json.loads(scheduler.pop("opts")) == {"removeOnComplete": 10, "attempts": 3}
    assert scheduler == {"name": "tock", "every": "60000", "offset": str(millis % 60000),
                         "data": '{"a":1}', "ic": "1"}
    assert await redis.zscore(f"bull:{queue_name}:repeat", "tick") == millis

    stored = await redis.hgetall(f"bull:{queue_name}:{job.id}")
    assert stored["rjk"] == "tick" and stored["name"] == "tock"
    opts = json.loads(stored["opts"])
    assert opts.pop("timestamp") >= before
    assert opts == {"removeOnComplete": 10, "attempts": 3, "repeatJobKey": "tick", "jobId": job.id,
                    "repeat": {"every": 60000, "count": 1}, "delay": 0}

    assert await queue.get_job_scheduler("tick") == {
        "key": "tick", "name": "tock", "next": millis, "iteration_count": 1, "every": 60000,
        "offset": millis % 60000, "template": {"data": {"a": 1},
                                               "opts": {"remove_on_complete": 10, "attempts": 3}}}


async def test_upsert_pattern_makes_a_delayed_job_at_the_cron_time(queue: Queue, queue_name: str,
                                                                    redis: Any) -> None:
    end = now_ms() + 3600_000
    job = await queue.upsert_job_scheduler(
        "cron", {"pattern": "0 */5 * * * *", "tz": "Europe/Paris", "limit": 5, "end_date": end},
        template={"data": {"b": 2}, "opts": {"backoff": 5}})
    assert job is not None and job.name == "cron"  # the name defaults to the scheduler id
    millis = millis_of(job.id)
    assert millis == next_cron_millis("0 */5 * * * *", millis - 1, tz="Europe/Paris")
    assert millis % 300_000 == 0 and 0 < millis - now_ms() <= 300_000
    assert await job.get_state() == "delayed"
    assert job.opts["prev_millis"] == millis
    assert job.opts["repeat"] == {"pattern": "0 */5 * * * *", "tz": "Europe/Paris", "limit": 5,
                                  "endDate": end, "count": 1}
    scheduler = await redis.hgetall(f"bull:{queue_name}:repeat:cron")
    # a template's number backoff is stored as given, as Node stores it
    assert scheduler == {"name": "cron", "tz": "Europe/Paris", "limit": "5", "pattern": "0 */5 * * * *",
                         "endDate": str(end), "offset": "0", "opts": '{"backoff":5}', "data": '{"b":2}',
                         "ic": "1"}
    got = await queue.get_job_scheduler("cron")
    assert got == {"key": "cron", "name": "cron", "next": millis, "iteration_count": 1, "limit": 5,
                   "end_date": end, "tz": "Europe/Paris", "pattern": "0 */5 * * * *", "offset": 0,
                   "template": {"data": {"b": 2}, "opts": {"backoff": 5}}}


async def test_upsert_again_replaces_the_next_job(queue: Queue, queue_name: str, redis: Any) -> None:
    first = await queue.upsert_job_scheduler("s", {"pattern": "0 0 * * * *"}, template={"data": {"v": 1}})
    second = await queue.upsert_job_scheduler("s", {"pattern": "0 0 * * * *"}, template={"data": {"v": 2}})
    assert first is not None and second is not None and first.id == second.id
    assert (await queue.get_job(second.id)).data == {"v": 2}
    third = await queue.upsert_job_scheduler("s", {"pattern": "0 30 * * * *"}, template={"data": {"v": 3}})
    assert third is not None and third.id != first.id
    assert await queue.get_job(first.id) is None
    assert await queue.get_job_counts("delayed") == {"delayed": 1}
    assert await queue.get_job_schedulers_count() == 1
    assert (await queue.get_job_scheduler("s"))["pattern"] == "0 30 * * * *"


async def test_list_count_and_remove(queue: Queue, queue_name: str, redis: Any) -> None:
    assert await queue.get_job_schedulers() == [] and await queue.get_job_schedulers_count() == 0
    await queue.upsert_job_scheduler("hourly", {"pattern": "0 0 * * * *"})
    await queue.upsert_job_scheduler("daily", {"pattern": "0 0 0 * * *", "tz": "UTC"})
    await queue.upsert_job_scheduler("later", {"every": 3600_000, "start_date": now_ms() + 2 * 86400_000})
    assert await queue.get_job_schedulers_count() == 3
    by_next = [s["key"] for s in await queue.get_job_schedulers(asc=True)]
    assert by_next[-1] == "later" and set(by_next) == {"hourly", "daily", "later"}
    assert [s["key"] for s in await queue.get_job_schedulers()] == list(reversed(by_next))
    assert [s["key"] for s in await queue.get_job_schedulers(0, 0, asc=True)] == by_next[:1]

    daily = await queue.get_job_scheduler("daily")
    assert daily is not None
    assert await queue.remove_job_scheduler("daily") is True
    assert await queue.remove_job_scheduler("daily") is False
    assert await queue.get_job_scheduler("daily") is None
    assert await queue.get_job(f"repeat:daily:{daily['next']}") is None
    assert not await redis.exists(f"bull:{queue_name}:repeat:daily")
    assert await queue.get_job_schedulers_count() == 2
    # like Node, listing drops an entry whose hash is gone
    await redis.delete(f"bull:{queue_name}:repeat:hourly")
    assert [s["key"] for s in await queue.get_job_schedulers()] == ["later"]
    assert await queue.get_job_schedulers_count() == 1


async def test_start_date_and_immediately(queue: Queue) -> None:
    start = now_ms() + 5000
    job = await queue.upsert_job_scheduler("e", {"every": 1000, "start_date": start})
    assert job is not None and millis_of(job.id) == start and await job.get_state() == "delayed"
    iso = datetime.fromtimestamp((start + 60_000) / 1000, timezone.utc).isoformat()
    job = await queue.upsert_job_scheduler("c", {"pattern": "*/10 * * * * *", "startDate": iso})
    assert job is not None and millis_of(job.id) >= start + 60_000 and millis_of(job.id) % 10_000 == 0
    before = now_ms()
    job = await queue.upsert_job_scheduler("i", {"pattern": "0 0 0 1 1 *", "immediately": True})
    assert job is not None and before <= millis_of(job.id) <= now_ms()
    assert "immediately" not in job.opts["repeat"]


async def test_bad_input_is_refused_before_anything_is_written(queue: Queue) -> None:
    bad: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {}),
        ({"every": 1000, "pattern": "* * * * *"}, {}),
        ({"every": 0}, {}),
        ({"every": "1000"}, {}),
        ({"pattern": "61 * * * *"}, {}),
        ({"pattern": "* * * * * * *"}, {}),
        ({"pattern": "0 0 12 * * 1#2,3"}, {}),
        ({"pattern": "H * * * *"}, {}),
        ({"pattern": "* * * * *", "tz": "Mars/Olympus"}, {}),
        ({"pattern": "* * * * *", "immediately": True, "start_date": now_ms()}, {}),
        ({"every": 1000, "end_date": now_ms() - 1000}, {}),
        ({"every": 1000, "start_date": "yesterday"}, {}),
        ({"every": 1000, "key": "x"}, {}),
        ({"every": 1000}, {"opts": {"job_id": "mine"}}),
        ({"every": 1000}, {"opts": {"delay": 5}}),
        ({"every": 1000}, {"opts": {"deduplication": {"id": "d"}}}),
        ({"every": 1000}, {"opts": {"no_such_option": 1}}),
        ({"every": 1000}, {"nmae": "typo"}),
    ]
    for repeat, template in bad:
        with pytest.raises((InvalidArgument, InvalidJobOptions)):
            await queue.upsert_job_scheduler("bad", repeat, template=template)
    assert await queue.get_job_schedulers_count() == 0
    assert await queue.get_job_counts("waiting", "delayed") == {"waiting": 0, "delayed": 0}


async def test_limit_zero_and_no_cron_time_before_end_date_make_nothing(queue: Queue) -> None:
    assert await queue.upsert_job_scheduler("none", {"every": 1000, "limit": 0}) is None
    # Feb 30th never comes: Node's cron-parser finds no time, and upsertJobScheduler returns undefined
    assert await queue.upsert_job_scheduler("never", {"pattern": "0 0 0 30 2 *"}) is None
    assert await queue.get_job_schedulers_count() == 0


# -- the Python worker makes each next iteration ------------------------------------------------
async def test_python_worker_runs_iterations_once_and_on_time_across_a_restart(
        redis_url: str, queue: Queue, queue_name: str, redis: Any) -> None:
    every = 300
    await queue.upsert_job_scheduler("beat", {"every": every}, template={"data": {"n": 1}})
    recorder = Recorder()
    await run_worker(redis_url, queue_name, recorder, 1.3, until=lambda: len(recorder.processed) >= 3)
    restart_after = millis_of(recorder.processed[-1][0])
    # a new worker carries on
    await run_worker(redis_url, queue_name, recorder, 1.3, until=lambda: len(recorder.processed) >= 6)
    assert len(recorder.processed) >= 6
    check_run(recorder.processed, every, allow_gap_at={restart_after})
    check_on_time([p for p in recorder.processed if millis_of(p[0]) != restart_after + every])

    jobs = await scheduler_jobs(redis, queue_name, "beat")
    processed = {job_id for job_id, _ in recorder.processed}
    pending = [job_id for job_id in jobs if job_id not in processed]
    assert len(pending) == 1 and millis_of(pending[0]) > max(millis_of(i) for i in processed)
    assert await queue.get_job_state(pending[0]) in ("delayed", "waiting")
    scheduler = await queue.get_job_scheduler("beat")
    assert scheduler["next"] == millis_of(pending[0]) and scheduler["iteration_count"] == len(jobs)
    counts = [json.loads(h["opts"])["repeat"]["count"] for h in jobs.values()]
    assert counts == list(range(1, len(jobs) + 1))


async def test_limit_and_end_date_stop_the_scheduler(redis_url: str, queue: Queue, queue_name: str,
                                                     redis: Any) -> None:
    await queue.upsert_job_scheduler("three", {"every": 200, "limit": 3})
    end = now_ms() + 1500
    await queue.upsert_job_scheduler("until", {"pattern": "*/1 * * * * *", "end_date": end})
    recorder = Recorder()
    def done() -> bool:
        ran = [job_id for job_id, _ in recorder.processed]
        return sum(j.startswith("repeat:three:") for j in ran) >= 3 and any(j.startswith("repeat:until:") for j in ran)

    await run_worker(redis_url, queue_name, recorder, 2.6, until=done)
    three = [job_id for job_id, _ in recorder.processed if job_id.startswith("repeat:three:")]
    until = [job_id for job_id, _ in recorder.processed if job_id.startswith("repeat:until:")]
    assert len(three) == 3 and len(until) >= 1
    assert all(millis_of(j) <= end for j in until)
    assert not (await queue.get_job_counts("waiting", "delayed"))["delayed"]
    assert len(await scheduler_jobs(redis, queue_name, "three")) == 3
    # like Node, a finished scheduler stays listed until removed
    assert (await queue.get_job_scheduler("three"))["iteration_count"] == 3


async def test_next_iteration_is_made_once_per_taken_job(redis_url: str, queue: Queue, queue_name: str,
                                                         redis: Any) -> None:
    first = await queue.upsert_job_scheduler("once", {"pattern": "*/2 * * * * *"})
    assert first is not None
    taker = Worker(queue_name, connection=redis_url)
    try:
        await asyncio.sleep(max(0, millis_of(first.id) - now_ms()) / 1000 + 0.05)
        taken = await taker.get_next_job("tok", block=False)  # promotes the due job and takes it
        assert taken is not None and taken.id == first.id
        nxt = await queue.get_job_scheduler("once")
        assert nxt["next"] == millis_of(first.id) + 2000 and nxt["iteration_count"] == 2
        # the same job taken again (a stalled job re-run, or another worker): no second iteration
        assert await advance_job_scheduler(taker, taken) is None
        assert len(await scheduler_jobs(redis, queue_name, "once")) == 2
        await taken.move_to_completed("done", "tok")
    finally:
        await taker.close()


# -- cron times -------------------------------------------------------------------------------------
def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


@pytest.mark.parametrize("pattern,tz,start,expected", [
    ("*/5 * * * * *", "UTC", "2024-01-01T00:00:00.123+00:00", "2024-01-01T00:00:05+00:00"),
    ("0 0 0 L * *", "UTC", "2024-02-01T00:00:00+00:00", "2024-02-29T00:00:00+00:00"),
    ("0 0 12 * * 5L", "UTC", "2024-01-01T00:00:00+00:00", "2024-01-26T12:00:00+00:00"),
    ("0 0 9 * * 1#2", "UTC", "2024-01-01T00:00:00+00:00", "2024-01-08T09:00:00+00:00"),
    ("0 9 * * MON-FRI", "America/New_York", "2024-01-06T00:00:00-05:00", "2024-01-08T09:00:00-05:00"),
    # the skipped 02:30 (clocks forward) runs at 03:30, as cron-parser does
    ("0 30 2 * * *", "Europe/Paris", "2024-03-31T00:00:00+01:00", "2024-03-31T03:30:00+02:00"),
    # the repeated 02:30 (clocks back) runs once
    ("0 30 2 * * *", "Europe/Paris", "2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"),
    # ... but an hourly pattern runs at both 02:00
    ("0 0 * * * *", "Europe/Paris", "2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00"),
])
def test_cron_next_times(pattern: str, tz: str, start: str, expected: str) -> None:
    assert next_cron_millis(pattern, _ms(start), tz=tz) == _ms(expected)


def test_cron_start_and_end_dates() -> None:
    start = _ms("2024-01-01T00:00:00+00:00")
    assert next_cron_millis("0 0 * * * *", start, tz="UTC", start_date=start + 90 * 60_000) == \
        _ms("2024-01-01T02:00:00+00:00")
    assert next_cron_millis("0 0 * * * *", start, tz="UTC", end_date=start + 30 * 60_000) is None
    assert next_cron_millis("0 0 * * * *", start, tz="UTC", end_date=start + 60 * 60_000) == start + 3600_000


def test_cron_parse_is_node_shaped() -> None:
    assert parse_cron("@daily").alternatives == ("0 0 0 * 1,2,3,4,5,6,7,8,9,10,11,12 *",)
    both = parse_cron("0 0 12 1 * MON")
    assert len(both.alternatives) == 2  # day-of-month OR day-of-week, as cron-parser
    assert parse_cron("*/20 * * * *").hours_count == 24
    with pytest.raises(InvalidArgument):
        parse_cron("0 0 12 * * L")  # cron-parser: a standalone L in day-of-week


def test_legacy_repeat_key_shape() -> None:
    assert is_legacy_repeat_key("name:id::Europe/Paris:0 * * * *")
    assert is_legacy_repeat_key("name:id:1700000000000::5000")
    assert not is_legacy_repeat_key("my-scheduler")
    assert not is_legacy_repeat_key("a:b:c:d:e")
    assert not is_legacy_repeat_key("a:b:x1:d:5000")
