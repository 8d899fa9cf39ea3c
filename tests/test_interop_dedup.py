"""Deduplication parity (issue #5): the same sequence of adds, takes and completions, made from
Python and from Node against two fresh queues, gives the same decisions: the same returned job
ids, the same 'deduplicated' (and other) events, the same job states and data, and the same
deduplication keys with the same TTLs (within timing tolerance)."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bullmq_compat import Queue, Worker
from tests.node import node
from tests.node_scripts import run_script

pytestmark = pytest.mark.node

# the two runs' TTLs are read at different moments of two runs: a busy machine puts hundreds of ms
# between their steps, so the TTLs may differ by that much, or by a quarter of the TTL when larger
TTL_TOLERANCE_MS = 1000

# the throttle and extend scenarios' TTL and sleeps, in ms: each decision has a margin of a quarter
# of the TTL (750 ms) against the time the steps themselves take on a loaded machine
TTL = 3000


def add(data: Any, delay: int = 0, **dedup: Any) -> dict[str, Any]:
    """An add step with deduplication id 'k' (Node's option names)."""
    opts: dict[str, Any] = {"deduplication": {"id": "k", **dedup}}
    if delay:
        opts["delay"] = delay
    return {"add": {"name": "job", "data": data, "opts": opts}}


def sleep(fraction: float) -> dict[str, Any]:
    return {"sleep": int(TTL * fraction)}


PROBE = {"probe": "k"}

SCENARIOS: dict[str, list[dict[str, Any]]] = {
    # simple: deduplicated while the job exists, until it finishes
    "simple": [
        add({"v": 1}), add({"v": 2}), PROBE,
        {"take": "t1"}, add({"v": 3}), PROBE,
        {"complete": "t1"}, PROBE,
        add({"v": 4}), PROBE,
    ],
    # throttle: deduplicated for ttl ms, whatever happens to the job (v3 at 0.25 ttl, v4 at 1.25)
    "throttle": [
        add({"v": 1}, ttl=TTL), PROBE, add({"v": 2}, ttl=TTL),
        sleep(0.25), add({"v": 3}, ttl=TTL), PROBE,
        sleep(1.0), add({"v": 4}, ttl=TTL), PROBE,
    ],
    # extend: every deduplicated add restarts the ttl (v2 at 0.5 ttl, v3 at 1.0: each within the
    # extended ttl; v4 at 2.25: 1.25 ttl after the last extension)
    "extend": [
        add({"v": 1}, ttl=TTL, extend=True),
        sleep(0.5), add({"v": 2}, ttl=TTL, extend=True), PROBE,
        sleep(0.5), add({"v": 3}, ttl=TTL, extend=True), PROBE,
        sleep(1.25), add({"v": 4}, ttl=TTL, extend=True), PROBE,
    ],
    # replace: a delayed job is replaced by the newer add; a waiting one is kept
    "replace": [
        add({"v": 1}, ttl=5000, extend=True, replace=True, delay=3000),
        add({"v": 2}, ttl=5000, extend=True, replace=True, delay=3000), PROBE,
        add({"v": 3}, ttl=5000, extend=True, replace=True), PROBE,
        add({"v": 4}, ttl=5000, extend=True, replace=True, delay=3000), PROBE,
    ],
    # keep_last_if_active: adds while the job is active keep the last one, added when it finishes
    "keep_last_if_active": [
        add({"v": 1}, keepLastIfActive=True), {"take": "t1"},
        add({"v": 2}, keepLastIfActive=True), PROBE,
        add({"v": 3}, keepLastIfActive=True), PROBE,
        {"complete": "t1"}, PROBE,
        {"take": "t2"}, add({"v": 4}, keepLastIfActive=True),
        {"complete": "t2"}, PROBE,
        {"take": "t3"}, {"complete": "t3"}, PROBE,
        add({"v": 5}, keepLastIfActive=True), PROBE,
    ],
}


def _python_opts(opts: dict[str, Any]) -> dict[str, Any]:
    """The same options by their Python names (Node's names work too; this checks both)."""
    out = dict(opts)
    dedup = dict(out.pop("deduplication"))
    if "keepLastIfActive" in dedup:
        dedup["keep_last_if_active"] = dedup.pop("keepLastIfActive")
    out["deduplication"] = dedup
    return out


async def run_python(redis_url: str, queue_name: str, redis: Any, steps: list[dict[str, Any]]) -> list[Any]:
    queue = Queue(queue_name, connection=redis_url)
    worker = Worker(queue_name, connection=redis_url)
    held: dict[str, Any] = {}
    results: list[Any] = []
    try:
        for step in steps:
            if "add" in step:
                spec = step["add"]
                job = await queue.add(spec["name"], spec["data"], **_python_opts(spec["opts"]))
                results.append({"id": job.id})
            elif "sleep" in step:
                await asyncio.sleep(step["sleep"] / 1000)
                results.append({})
            elif "take" in step:
                job = await worker.get_next_job(step["take"], block=False)
                if job is not None:
                    held[step["take"]] = job
                results.append({"id": job.id if job else None})
            elif "complete" in step:
                job = held.pop(step["complete"])
                await job.move_to_completed("done", step["complete"])
                results.append({"id": job.id})
            elif "probe" in step:
                key = f"bull:{queue_name}:de:{step['probe']}"
                value, pttl, nxt = await asyncio.gather(
                    redis.get(key), redis.pttl(key), redis.exists(f"bull:{queue_name}:dn:{step['probe']}"))
                results.append({"value": value, "pttl": pttl, "next": nxt})
    finally:
        await worker.close()
        await queue.close()
    return results


async def final_state(redis: Any, queue_name: str) -> dict[str, Any]:
    """Language-neutral: what Redis holds once the sequence is done."""
    prefix = f"bull:{queue_name}:"
    jobs = {}
    async for key in redis.scan_iter(match=f"{prefix}*"):
        job_id = key[len(prefix):]
        if job_id.isdigit():
            raw = await redis.hgetall(key)
            jobs[job_id] = {"data": json.loads(raw["data"]), "de": json.loads(raw["opts"]).get("de"),
                            "deid": raw.get("deid")}
    for state in ("wait", "active", "delayed", "completed", "failed"):
        key = prefix + state
        members = await (redis.lrange(key, 0, -1) if await redis.type(key) == "list"
                         else redis.zrange(key, 0, -1))
        for job_id in members:
            jobs.setdefault(job_id, {})["state"] = state
    events = []
    for _, fields in await redis.xrange(prefix + "events"):
        keep = {k: v for k, v in fields.items()
                if k in ("event", "jobId", "deduplicationId", "deduplicatedJobId", "prev")}
        events.append(keep)
    return {"jobs": jobs, "events": events}


def same_results(py: list[Any], nd: list[Any]) -> None:
    assert len(py) == len(nd)
    for i, (a, b) in enumerate(zip(py, nd)):
        if "pttl" in a:
            assert (a["value"], a["next"]) == (b["value"], b["next"]), f"step {i}: {a} vs {b}"
            if a["pttl"] < 0 or b["pttl"] < 0:
                assert a["pttl"] == b["pttl"], f"step {i}: {a} vs {b}"
            else:
                tolerance = max(TTL_TOLERANCE_MS, max(a["pttl"], b["pttl"]) // 4)
                assert abs(a["pttl"] - b["pttl"]) <= tolerance, f"step {i}: {a} vs {b}"
        else:
            assert a == b, f"step {i}: python {a} vs node {b}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_same_decisions_from_python_and_node(redis_url: str, queue_name: str, redis: Any,
                                                   scenario: str) -> None:
    steps = SCENARIOS[scenario]
    py_queue, node_queue = f"{queue_name}-py", f"{queue_name}-node"
    py, nd = await asyncio.gather(
        run_python(redis_url, py_queue, redis, steps),
        run_script("dedup.js", {"redis": redis_url, "queue": node_queue, "steps": steps}))
    same_results(py, nd["results"])
    py_state, node_state = await final_state(redis, py_queue), await final_state(redis, node_queue)
    assert py_state["jobs"] == node_state["jobs"]
    assert py_state["events"] == node_state["events"]
    assert any(e["event"] == "deduplicated" for e in py_state["events"])
    # the decisions themselves, so that a change on both sides is noticed too
    ids = [r["id"] for r, s in zip(py, steps) if "add" in s]
    assert ids == EXPECTED_IDS[scenario]


# ids returned by the adds (a deduplicated add still takes a number from the id counter, and
# re-adding the kept job of keep_last_if_active takes one more)
EXPECTED_IDS = {
    "simple": ["1", "1", "1", "4"],
    "throttle": ["1", "1", "1", "4"],
    "extend": ["1", "1", "1", "4"],
    "replace": ["1", "2", "3", "3"],
    "keep_last_if_active": ["1", "1", "1", "3", "7"],
}


async def test_deduplication_key_helpers_match_node(redis_url: str, queue_name: str) -> None:
    queue = Queue(queue_name, connection=redis_url)
    try:
        job = await queue.add("j", {}, deduplication={"id": "dd", "ttl": 60000})
        assert await queue.get_deduplication_job_id("dd") == job.id
        assert await node("queueCall", redis=redis_url, queue=queue_name, method="getDeduplicationJobId",
                          args=["dd"]) == job.id
        assert await queue.remove_deduplication_key("dd") == 1
        assert await queue.get_deduplication_job_id("dd") is None
        again = await queue.add("j", {}, deduplication={"id": "dd", "ttl": 60000})
        assert again.id != job.id
    finally:
        await queue.close()
