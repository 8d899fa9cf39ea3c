"""Job schedulers shared by Python and Node (issue #5): a scheduler created from Node runs under
the Python Worker and one created from Python runs under Node workers (each iteration once, on
time, none lost across a worker restart), both languages read the same scheduler and next job,
limit / end_date / remove work across languages, and cron next times equal Node's cron-parser."""
from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import datetime
from typing import Any

import pytest

from bullmq_compat import InvalidArgument, Queue
from bullmq_compat._cron import KNOWN_DIFFERENCES, next_cron_millis
from bullmq_compat._wire.options import JOB_OPTIONS
from tests.helpers import KnownGap, known_gap
from tests.node import INTEROP, ROOT, NodeProcess, node
from tests.test_schedulers import Recorder, check_on_time, check_run, millis_of, now_ms, run_worker, scheduler_jobs

pytestmark = pytest.mark.node

_PY = {opt.node: opt.python for opt in JOB_OPTIONS}
_SCHEDULER_KEYS = {"iterationCount": "iteration_count", "startDate": "start_date", "endDate": "end_date"}


def python_form(node_scheduler: dict[str, Any]) -> dict[str, Any]:
    """Node's getJobScheduler result with the Python key names of `Queue.get_job_scheduler`."""
    out = {_SCHEDULER_KEYS.get(k, k): v for k, v in node_scheduler.items()}
    template = out.get("template")
    if template and "opts" in template:
        template = dict(template)
        template["opts"] = {_PY.get(k, k): v for k, v in template["opts"].items()}
        out["template"] = template
    return out


async def node_call(redis_url: str, queue_name: str, method: str, *args: Any) -> Any:
    return await node("queueCall", redis=redis_url, queue=queue_name, method=method, args=list(args))


async def completed_runs(redis: Any, queue_name: str, scheduler_id: str) -> list[tuple[str, int]]:
    """(job id, processedOn) of a scheduler's completed jobs, from Redis (whoever ran them)."""
    runs = []
    for job_id, raw in (await scheduler_jobs(redis, queue_name, scheduler_id)).items():
        if raw.get("finishedOn") and "failedReason" not in raw:
            runs.append((job_id, int(raw["processedOn"])))
    return runs


@pytest.fixture
async def queue(redis_url: str, queue_name: str) -> Any:
    q = Queue(queue_name, connection=redis_url)
    yield q
    await q.close()


# -- running across languages ---------------------------------------------------------------------
async def test_node_scheduler_runs_under_the_python_worker(redis_url: str, queue_name: str, queue: Queue,
                                                           redis: Any) -> None:
    await node_call(redis_url, queue_name, "upsertJobScheduler", "node-beat", {"every": 300},
                    {"name": "beat", "data": {"from": "node"}, "opts": {"attempts": 2}})
    recorder = Recorder()
    await run_worker(redis_url, queue_name, recorder, 1.1, until=lambda: len(recorder.processed) >= 2)
    restart_after = millis_of(recorder.processed[-1][0])
    await run_worker(redis_url, queue_name, recorder, 1.1, until=lambda: len(recorder.processed) >= 5)
    check_run(recorder.processed, 300, allow_gap_at={restart_after})
    check_on_time([p for p in recorder.processed if millis_of(p[0]) != restart_after + 300])
    assert len(recorder.processed) >= 5

    jobs = await scheduler_jobs(redis, queue_name, "node-beat")
    assert len(jobs) == len(recorder.processed) + 1  # and the next one, waiting for its time
    last = list(jobs)[-1]
    # the iteration made by the Python worker is read by Node as one of its own
    node_job = await node("getJob", redis=redis_url, queue=queue_name, id=last)
    assert node_job["name"] == "beat" and node_job["data"] == {"from": "node"}
    assert node_job["opts"]["repeat"] == {"every": 300, "count": len(jobs)}
    assert node_job["opts"]["attempts"] == 2 and node_job["opts"]["jobId"] == last
    assert python_form(await node_call(redis_url, queue_name, "getJobScheduler", "node-beat")) == \
        await queue.get_job_scheduler("node-beat")


async def test_python_scheduler_runs_under_node_workers(redis_url: str, queue_name: str, queue: Queue,
                                                        redis: Any) -> None:
    async with NodeProcess.work(redis=redis_url, queue=queue_name, count=4, timeoutMs=8000) as first:
        await queue.upsert_job_scheduler("py-beat", {"every": 300}, template={"name": "beat", "data": {"n": 1}})
        assert len((await first.result())["completed"]) == 4
    # a second Node worker carries on where the first stopped
    async with NodeProcess.work(redis=redis_url, queue=queue_name, count=3, timeoutMs=8000) as second:
        assert len((await second.result())["completed"]) == 3
    runs = await completed_runs(redis, queue_name, "py-beat")
    assert len(runs) == 7
    # the first worker took iterations 1-4 (taking the 4th made the 5th); the 5th waits for the
    # second worker to start, which takes it late and makes the 6th at the next slot from then: on
    # a busy machine that start takes more than one interval, so a gap may follow the 5th
    fifth = millis_of(runs[4][0])
    check_run(runs, 300, allow_gap_at={millis_of(runs[3][0]), fifth})
    check_on_time([r for r in runs if millis_of(r[0]) != fifth])
    scheduler = await queue.get_job_scheduler("py-beat")
    assert scheduler["iteration_count"] == 8 and scheduler["next"] > millis_of(runs[-1][0])
    assert python_form(await node_call(redis_url, queue_name, "getJobScheduler", "py-beat")) == scheduler


async def test_python_and_node_workers_share_one_scheduler(redis_url: str, queue_name: str, queue: Queue,
                                                           redis: Any) -> None:
    recorder = Recorder()
    async with NodeProcess.work(redis=redis_url, queue=queue_name, count=100, timeoutMs=60000,
                                concurrency=2):
        async def upsert_once_running() -> None:
            await asyncio.sleep(0.3)  # both workers are waiting for jobs
            await queue.upsert_job_scheduler("shared", {"every": 300})
        async def six_ran() -> bool:
            return len(await completed_runs(redis, queue_name, "shared")) >= 6

        await asyncio.gather(upsert_once_running(),
                             run_worker(redis_url, queue_name, recorder, 2.3, until=six_ran, concurrency=2))
    runs = await completed_runs(redis, queue_name, "shared")
    assert len(runs) >= 6
    check_run(runs, 300)  # each slot once, none lost, whoever took it
    check_on_time(runs, skip_first=False)
    python_ran = {job_id for job_id, _ in recorder.processed}
    assert python_ran <= {job_id for job_id, _ in runs}


# -- one scheduler, read by both languages ----------------------------------------------------------
def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


async def test_same_scheduler_and_next_job_from_both_languages(redis_url: str, queue_name: str,
                                                               redis: Any) -> None:
    py_name, node_name = f"{queue_name}-py", f"{queue_name}-node"
    py_queue = Queue(py_name, connection=redis_url)
    try:
        end, start = now_ms() + 86400_000, now_ms() + 60_000
        cron = {"pattern": "0 */15 9-17 * * 1-5", "tz": "America/New_York", "limit": 10, "endDate": end,
                "startDate": start}
        every = {"every": 5000, "offset": 1200, "limit": 4, "startDate": start + 777}
        template = {"name": "report", "data": {"to": ["ops"], "n": 1.5},
                    "opts": {"attempts": 3, "backoff": 1000, "removeOnComplete": {"count": 5}, "keepLogs": 7,
                             "priority": 4}}
        py_jobs = [await py_queue.upsert_job_scheduler("cron", cron, template=template),
                   await py_queue.upsert_job_scheduler("every", every, template=template)]
        node_jobs = [await node_call(redis_url, node_name, "upsertJobScheduler", "cron", cron, template),
                     await node_call(redis_url, node_name, "upsertJobScheduler", "every", every, template)]
        # the same job ids: the cron time, and the 'every' slot with its offset
        assert [j.id for j in py_jobs] == [j["id"] for j in node_jobs]

        for scheduler_id in ("cron", "every"):
            py_hash = await redis.hgetall(f"bull:{py_name}:repeat:{scheduler_id}")
            node_hash = await redis.hgetall(f"bull:{node_name}:repeat:{scheduler_id}")
            assert json.loads(py_hash.pop("opts")) == json.loads(node_hash.pop("opts"))
            assert py_hash == node_hash
            assert await redis.zscore(f"bull:{py_name}:repeat", scheduler_id) == \
                await redis.zscore(f"bull:{node_name}:repeat", scheduler_id)
            # each language reads the other's scheduler as its own
            from_node = await node_call(redis_url, py_name, "getJobScheduler", scheduler_id)
            assert from_node == await node_call(redis_url, node_name, "getJobScheduler", scheduler_id)
            assert python_form(from_node) == await py_queue.get_job_scheduler(scheduler_id)

        for py_job, node_job in zip(py_jobs, node_jobs):
            py_raw = await redis.hgetall(f"bull:{py_name}:{py_job.id}")
            node_raw = await redis.hgetall(f"bull:{node_name}:{node_job['id']}")
            py_opts, node_opts = json.loads(py_raw.pop("opts")), json.loads(node_raw.pop("opts"))
            assert _without(py_opts, "timestamp", "delay") == _without(node_opts, "timestamp", "delay")
            assert _without(py_raw, "timestamp", "delay") == _without(node_raw, "timestamp", "delay")
            # (the delays count from each add, seconds apart on a loaded machine: the due times agree)
            assert abs((int(py_raw["timestamp"]) + int(py_raw["delay"]))
                       - (int(node_raw["timestamp"]) + int(node_raw["delay"]))) < 5000
            read_by_node = await node("getJob", redis=redis_url, queue=py_name, id=py_job.id)
            own = await node("getJob", redis=redis_url, queue=node_name, id=node_job["id"])
            assert _without(read_by_node["opts"], "timestamp", "delay") == _without(own["opts"], "timestamp", "delay")
            assert read_by_node["state"] == own["state"] == "delayed"
            assert (read_by_node["name"], read_by_node["data"]) == (own["name"], own["data"])
        assert [s["key"] for s in await py_queue.get_job_schedulers()] == \
            [s["key"] for s in await node_call(redis_url, node_name, "getJobSchedulers")]
        assert await node_call(redis_url, py_name, "getJobSchedulersCount") == 2
    finally:
        await py_queue.close()


# -- limit, end date, remove ------------------------------------------------------------------------
async def test_node_limit_honoured_by_the_python_worker(redis_url: str, queue_name: str, queue: Queue,
                                                        redis: Any) -> None:
    await node_call(redis_url, queue_name, "upsertJobScheduler", "three", {"every": 150, "limit": 3})
    recorder = Recorder()
    await run_worker(redis_url, queue_name, recorder, 1.2, until=lambda: len(recorder.processed) >= 3)
    # three iterations on the 150 ms grid (a loaded machine may take one late, and the next slot
    # then counts from that moment, as in Node: a gap, never a fourth)
    slots = sorted(millis_of(j) for j, _ in recorder.processed)
    assert len(slots) == 3 and all(b > a and (b - a) % 150 == 0 for a, b in zip(slots, slots[1:])), slots
    assert (await node_call(redis_url, queue_name, "getJobScheduler", "three"))["iterationCount"] == 3
    assert await queue.get_job_counts("waiting", "delayed") == {"waiting": 0, "delayed": 0}


async def test_python_end_date_honoured_by_a_node_worker(redis_url: str, queue_name: str, queue: Queue,
                                                         redis: Any) -> None:
    async with NodeProcess.work(redis=redis_url, queue=queue_name, count=100, timeoutMs=2800) as worker:
        end = now_ms() + 1700
        first = await queue.upsert_job_scheduler("until", {"pattern": "*/1 * * * * *", "end_date": end})
        assert first is not None
        result = await worker.result()
    assert result["timedOut"] and 1 <= len(result["completed"]) <= 2
    assert all(millis_of(j) <= end for j in result["completed"])
    assert await queue.get_job_counts("waiting", "delayed", "active") == {"waiting": 0, "delayed": 0,
                                                                         "active": 0}
    check_on_time(await completed_runs(redis, queue_name, "until"), skip_first=False)


async def test_remove_across_languages(redis_url: str, queue_name: str, queue: Queue) -> None:
    await node_call(redis_url, queue_name, "upsertJobScheduler", "from-node", {"pattern": "0 0 * * * *"})
    made = await queue.upsert_job_scheduler("from-python", {"every": 3600_000, "start_date": now_ms() + 60_000})
    assert made is not None
    assert await queue.remove_job_scheduler("from-node") is True
    assert await node_call(redis_url, queue_name, "getJobScheduler", "from-node") is None
    assert await node_call(redis_url, queue_name, "removeJobScheduler", "from-python") is True
    assert await queue.get_job_scheduler("from-python") is None
    assert await queue.get_job(made.id) is None
    assert await queue.get_job_schedulers_count() == 0
    assert await node_call(redis_url, queue_name, "removeJobScheduler", "from-python") is False


# -- cron next times: croniter (with cron-parser's rules) against Node's cron-parser ---------------
def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


CRON_PATTERNS = [
    # seconds fields (6-field crons) and plain 5-field ones
    "*/5 * * * * *", "30 * * * * *", "10,40 * 2 * * *", "15 45 */2 * * *", "0 */15 * * * *", "*/20 * * * *",
    "0 0 * * *", "0 5/15 * * * *", "0 0 1-3 * * *", "0 0 0-23 * * *",
    # L and #
    "0 0 0 L * *", "0 0 12 15,L * *", "0 0 12 * * 5L", "0 0 12 * * 1,5L", "0 0 9 * * 1#2", "0 0 12 * * 0#5",
    # day-of-month OR day-of-week, names, predefined
    "0 0 12 */2 * 1", "0 0 12 1-31 * 1", "0 0 12 L * 1", "0 0 0 * * 7", "0 0 12 ? * MON-FRI",
    "0 0 0 1 JAN,jul *", "0 0 12 29 2 *", "0 59 23 31 12 *", "@daily", "@weekdays", "@hourly",
    # around daylight-saving changes
    "0 30 2 * * *", "0 0 2 * * *", "0 15 2,3 * * *", "0 0,30 1,2 * * *", "0 */30 2 * * *", "0 0 * * * *",
    "0 0 3 * * *", "0 30 1 * * *", "0 0 0,23 * * *", "0 30 0,23 * * *", "0 0 0 * * *", "0 30 0 * * *",
    "0 0 2 * * 0",
]
CRON_STARTS = [
    ("UTC", "2024-01-01T00:00:00+00:00"),
    ("Asia/Kolkata", "2024-02-28T10:00:00+05:30"),
    ("Europe/Paris", "2024-03-30T22:00:00+01:00"),      # clocks forward 02:00 -> 03:00
    ("Europe/Paris", "2024-10-26T23:30:00+02:00"),      # clocks back 03:00 -> 02:00
    ("Europe/Paris", "2024-10-27T02:40:00+02:00"),      # inside the repeated hour, first pass
    ("Europe/Paris", "2024-10-27T02:10:00+01:00"),      # inside the repeated hour, second pass
    ("America/New_York", "2024-03-09T23:00:00-05:00"),
    ("America/New_York", "2024-11-02T23:10:00-04:00"),
    ("Australia/Sydney", "2024-10-05T22:00:00+10:00"),  # southern hemisphere
    ("America/Santiago", "2024-09-07T21:30:00-04:00"),  # clocks forward at midnight
    ("America/Havana", "2024-03-09T22:00:00-05:00"),    # clocks forward at midnight
    ("Europe/London", "2024-10-27T00:59:59.500+01:00"),
]
# Lord Howe's clocks move by 30 minutes; cron-parser is slow there (it runs into its loop limit),
# so only a few patterns are compared
LORD_HOWE_STARTS = [
    ("Australia/Lord_Howe", "2024-10-05T23:00:00+10:30"),  # forward 02:00 -> 02:30
    ("Australia/Lord_Howe", "2024-04-06T23:00:00+11:00"),  # back 02:00 -> 01:30
]
LORD_HOWE_PATTERNS = ["0 0 * * * *", "0 0 2 * * *", "15 45 */2 * * *", "0 0,30 1,2 * * *", "0 30 2 * * *",
                      "0 0 12 * * 5L", "*/20 * * * *", "0 0 0 * * *"]
# each computed from the previous one plus this much, as a worker computes the next iteration
STEP_MS = 37
N_TIMES = 6

# Cases where croniter with cron-parser's rules cannot give cron-parser's answer (see
# bullmq_compat._cron.KNOWN_DIFFERENCES): Lord Howe's 30-minute changes. There cron-parser
# returns 03:45:15 for an existing 02:45:15 (clocks forward), and on the day clocks go back it
# finds nothing (loop limit) or keeps returning a time before the start.
LORD_HOWE_FORWARD = {"15 45 */2 * * *", "0 0,30 1,2 * * *"}
LORD_HOWE_BACK = {"0 0 * * * *", "0 0 2 * * *"}


def _known_difference(tz: str, start: str, pattern: str) -> bool:
    if tz != "Australia/Lord_Howe":
        return False
    return pattern in (LORD_HOWE_FORWARD if start.startswith("2024-10") else LORD_HOWE_BACK)


CRON_CASES = [(tz, start, pattern) for tz, start in CRON_STARTS for pattern in CRON_PATTERNS] + [
    (tz, start, pattern) for tz, start in LORD_HOWE_STARTS for pattern in LORD_HOWE_PATTERNS]


@pytest.fixture(scope="module")
def node_cron_times() -> dict[tuple[str, str, str], Any]:
    """Node's answers for the whole table, from one run of interop/cron_next.js."""
    request = {"cases": [{"pattern": p, "from": _ms(start), "n": N_TIMES, "tz": tz, "stepMs": STEP_MS}
                         for tz, start, p in CRON_CASES]}
    proc = subprocess.run(["node", str(INTEROP / "cron_next.js")], input=json.dumps(request).encode(),
                          cwd=str(ROOT), capture_output=True, timeout=120, check=True)
    results = json.loads(proc.stdout.decode().splitlines()[-1])["results"]
    return dict(zip(CRON_CASES, results))


def python_cron_times(pattern: str, tz: str, start: str) -> list[int]:
    times: list[int] = []
    millis = _ms(start)
    for _ in range(N_TIMES):
        nxt = next_cron_millis(pattern, millis, tz=tz)
        if nxt is None:
            break
        times.append(nxt)
        millis = nxt + STEP_MS
    return times


def _cron_param(tz: str, start: str, pattern: str) -> Any:
    marks = []
    if _known_difference(tz, start, pattern):
        marks.append(pytest.mark.xfail(strict=True, raises=KnownGap, reason=KNOWN_DIFFERENCES["30-minute DST"]))
    return pytest.param(tz, start, pattern, marks=marks, id=f"{tz}|{start[:16]}|{pattern}")


@pytest.mark.parametrize("tz,start,pattern", [_cron_param(*case) for case in CRON_CASES])
def test_cron_next_times_equal_node(node_cron_times: dict[tuple[str, str, str], Any], tz: str, start: str,
                                    pattern: str) -> None:
    expected = node_cron_times[(tz, start, pattern)]
    ours = python_cron_times(pattern, tz, start)
    if _known_difference(tz, start, pattern):  # the strict xfail expects exactly this to differ
        known_gap(ours == expected, f"cron times differ from Node's: {ours} != {expected}")
    assert ours == expected


def test_cron_refused_where_node_refuses() -> None:
    """Patterns cron-parser cannot parse are refused by Python too (Node: upsertJobScheduler throws)."""
    bad = ["61 * * * *", "* * * * * * *", "0 0 12 * * 1#2,3", "0 0 12 * * L", "0 0 12 * * 5-3", "0 0 0 1 FOO *",
           "0 0 12 * * 1#6", "*/0 * * * *"]
    request = {"cases": [{"pattern": p, "from": 0, "n": 1} for p in bad]}
    proc = subprocess.run(["node", str(INTEROP / "cron_next.js"), json.dumps(request)], cwd=str(ROOT),
                          capture_output=True, timeout=60, check=True)
    results = json.loads(proc.stdout.decode().splitlines()[-1])["results"]
    for pattern, result in zip(bad, results):
        assert isinstance(result, dict) and "error" in result, (pattern, result)
        with pytest.raises(InvalidArgument):
            next_cron_millis(pattern, 0)
