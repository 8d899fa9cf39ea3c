"""Node BullMQ 6.7 as the oracle for values other tests hard-code (issue #31 §2): one state is set up
on a queue of the test's own, on Redis and on PostgreSQL (Node's createPostgresBackend), then our
API and Node's API are asked the same questions (interop/oracle.js, many questions in one Node
call) and their answers compared. A difference is reported with every question it touches, so one
run lists them all.

Normalisations, each where our API documents a Python form of Node's answer:
- `Queue.get_job_scheduler(s)` gives snake_case keys (iteration_count, end_date, start_date, and the
  template's job options by their Python names): compared through
  `tests.test_interop_schedulers.python_form`, the documented mapping.
- Node's `Queue` writes its own version into the meta hash when it opens (``bullmq:6.7.0``): the
  ``version`` field of `get_meta` is who wrote last, not an answer to compare.
- `Queue.get_jobs` gives our Jobs, Node's getJobs its Jobs: listings are compared by ids (order kept).
- A worker's CLIENT LIST entry: the fields that move between two reads (age, idle, buffers) are
  left out (`_MOVING`); a rate limit's TTL runs down between reads: both must lie in the window.
- A backoff delay: Node's NaN/undefined and our 0 both retry at once; ours is whole ms (`_as_retry`).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from bullmq_compat import FlowProducer, Queue, Worker
from bullmq_compat._backoff import builtin_delay
from tests.helpers import finish_by_hand
from tests.node import node
from tests.test_interop_schedulers import python_form

pytestmark = pytest.mark.node

BACKENDS = ["redis", "postgres"]


@dataclasses.dataclass
class Side:
    """One datastore: how our classes connect to it and the fields Node's scripts take for it."""

    kind: str
    connect: dict[str, Any]
    node: dict[str, Any]

    def queue(self, name: str) -> Queue:
        return Queue(name, **self.connect)


@pytest.fixture(params=BACKENDS)
def side(request: pytest.FixtureRequest, redis_url: str) -> Side:
    if request.param == "redis":
        return Side("redis", {"connection": redis_url}, {"redis": redis_url})
    postgres_url = request.getfixturevalue("postgres_url")
    schema = request.getfixturevalue("pg_migrated")
    return Side("postgres", {"connection": postgres_url, "schema": schema},
                {"postgres": postgres_url, "schema": schema, "migrate": True})


@pytest.fixture
async def queue(side: Side, queue_name: str) -> AsyncIterator[Queue]:
    async with side.queue(queue_name) as q:
        yield q


Question = tuple[str, Callable[[], Awaitable[Any]], dict[str, Any]]


async def node_answers(side: Side, queue_name: str, questions: list[dict[str, Any]]) -> list[Any]:
    """Node's answers (values) to ``questions``; a question Node could not answer fails the test."""
    answers = await node("oracle", **side.node, queue=queue_name, questions=questions)
    assert isinstance(answers, list) and len(answers) == len(questions), answers
    for question, answer in zip(questions, answers):
        assert "error" not in answer, (question, answer)
    return [answer["value"] for answer in answers]


async def differences(side: Side, queue_name: str, questions: list[Question],
                      normalise: Callable[[str, Any], Any] = lambda label, value: value) -> list[Any]:
    """(label, ours, Node's) for every question whose answers differ (Node asked first, then us)."""
    theirs = await node_answers(side, queue_name, [q for _, _, q in questions])
    out = []
    for (label, ours_of, _), their in zip(questions, theirs):
        ours = normalise(label, await ours_of())
        their = normalise(label, their)
        if ours != their:
            out.append((label, ours, their))
    return out


def none_of(diffs: list[Any]) -> None:
    """Fail with every difference in full (pytest's diff of a list would cut them short)."""
    assert not diffs, "answers differ from Node's:\n" + "\n".join(
        json.dumps(d, sort_keys=True, default=str) for d in diffs)


def q(method: str, *args: Any) -> dict[str, Any]:
    return {"queue": method, "args": list(args)}


def j(job_id: str, method: str, *args: Any) -> dict[str, Any]:
    return {"job": job_id, "method": method, "args": list(args)}


async def _mixed_state(side: Side, queue: Queue) -> dict[str, str]:
    """Jobs in every state Node lists, by a name of the state: the ids."""
    ids: dict[str, str] = {}
    for i in range(3):
        ids[f"waiting{i}"] = str((await queue.add("w", {"i": i})).id)
    ids["prio3"] = str((await queue.add("p3", {}, priority=3)).id)
    ids["prio1"] = str((await queue.add("p1", {}, priority=1)).id)
    ids["delayed_late"] = str((await queue.add("d2", {}, delay=900_000)).id)
    ids["delayed"] = str((await queue.add("d1", {}, delay=600_000)).id)
    async with FlowProducer(**side.connect) as flows:
        tree = await flows.add({"name": "parent", "queue_name": queue.name, "data": {"p": 1},
                                "children": [{"name": "child", "queue_name": queue.name, "data": {"c": 1},
                                              "opts": {"priority": 2}}]})
    ids["parent"], ids["child"] = str(tree.job.id), str(tree.children[0].job.id)
    worker = Worker(queue.name, **side.connect)
    try:
        # the wait list goes first: waiting0..2 end completed, failed and active
        outcomes = ["done", "fail", "active"]
        for outcome in outcomes:
            job = await worker.get_next_job("tok", block=False)
            assert job is not None
            ids[f"taken_{outcome}"] = str(job.id)
            if outcome == "done":
                await job.update_progress(40)
                await job.log("line one")
                await job.move_to_completed({"r": [1, "é"]}, "tok")
            elif outcome == "fail":
                await job.move_to_failed(ValueError("nope"), "tok")
    finally:
        await worker.close()
    for i in range(3, 6):
        ids[f"waiting{i}"] = str((await queue.add("w", {"i": i})).id)
    return ids


ALL_TYPES = ["active", "completed", "delayed", "failed", "paused", "prioritized", "waiting", "waiting-children"]


def _listing_questions(queue: Queue, ids: dict[str, str]) -> list[Question]:
    def ids_of(types: Any, start: int = 0, end: int = -1, asc: bool = False) -> Callable[[], Awaitable[Any]]:
        async def read() -> Any:
            return [job.id for job in await queue.get_jobs(types, start, end, asc=asc)]
        return read

    out: list[Question] = [
        ("get_job_counts()", lambda: queue.get_job_counts(), q("getJobCounts")),
        ("get_job_counts(subset)", lambda: queue.get_job_counts("delayed", "waiting", "paused", "wait"),
         q("getJobCounts", "delayed", "waiting", "paused", "wait")),
        ("count()", lambda: queue.count(), q("count")),
        ("get_job_count_by_types", lambda: queue.get_job_count_by_types("completed", "failed"),
         q("getJobCountByTypes", "completed", "failed")),
    ]
    listings = [(["waiting"], 0, -1, True), (["waiting"], 0, -1, False), (["waiting"], 1, 1, False),
                (["delayed"], 0, -1, True), (["delayed"], 0, 0, False), (["prioritized"], 0, -1, True),
                (["prioritized", "waiting"], 0, -1, True), (ALL_TYPES, 0, -1, False),
                (["completed", "failed"], 0, -1, False), (["waiting-children", "active"], 0, -1, True),
                (["paused"], 0, -1, True)]
    for types, start, end, asc in listings:
        # Node's getJobs returns Jobs: their ids are what a listing shows
        out.append((f"get_jobs({types}, {start}, {end}, asc={asc})", ids_of(types, start, end, asc),
                    q("getJobs", types, start, end, asc)))
    for label, job_id in [*ids.items(), ("missing", "no-such-job")]:
        out.append((f"get_job_state({label})", lambda job_id=job_id: queue.get_job_state(job_id),
                    q("getJobState", job_id)))
    return out


def _ids_only(label: str, value: Any) -> Any:
    """Node's getJobs answers are Jobs (their toJSON views): a listing is compared by ids."""
    if label.startswith("get_jobs(") and isinstance(value, list):
        return [v["id"] if isinstance(v, dict) else v for v in value]
    return value


async def test_counts_listings_and_states_are_nodes(side: Side, queue: Queue) -> None:
    ids = await _mixed_state(side, queue)
    assert await queue.get_job_state(ids["taken_active"]) == "active"  # the state is what we meant
    none_of(await differences(side, queue.name, _listing_questions(queue, ids), _ids_only))


async def test_counts_listings_and_states_of_a_paused_queue_are_nodes(side: Side, queue: Queue) -> None:
    ids = await _mixed_state(side, queue)
    await queue.pause()
    assert await queue.is_paused() is True
    questions = _listing_questions(queue, ids) + [("is_paused", lambda: queue.is_paused(), q("isPaused"))]
    none_of(await differences(side, queue.name, questions, _ids_only))


async def test_job_json_views_of_every_state_are_nodes(side: Side, queue: Queue) -> None:
    """What JSON.stringify(job) and job.asJSON() show (Bull-Board's reads), for a job in each state."""
    ids = await _mixed_state(side, queue)
    rich = await queue.add("rich", {"y": None, "n": 1.5}, attempts=3, backoff={"type": "exponential", "delay": 500},
                           keep_logs=5, remove_on_complete=10, remove_on_fail={"age": 60, "count": 5},
                           deduplication={"id": "dd", "ttl": 60_000}, job_id="custom-id")
    ids["rich"] = str(rich.id)
    questions: list[Question] = []
    for label, job_id in ids.items():
        async def ours(job_id: str = job_id, view: str = "to_json") -> Any:
            job = await queue.get_job(job_id)
            assert job is not None
            return getattr(job, view)()
        questions.append((f"to_json({label})", ours, j(job_id, "toJSON")))
        questions.append((f"as_json({label})", lambda job_id=job_id: ours(job_id, "as_json"), j(job_id, "asJSON")))
    none_of(await differences(side, queue.name, questions))


async def test_job_logs_pages_are_nodes(side: Side, queue: Queue) -> None:
    job = await queue.add("logs", {})
    trimmed = await queue.add("trimmed", {}, keep_logs=2)
    for row in ("a", "b", "c", "d"):
        await job.log(row)
        await trimmed.log(row)
    job_id, trimmed_id = str(job.id), str(trimmed.id)
    questions: list[Question] = []
    for start, end, asc in [(0, -1, True), (0, -1, False), (1, 2, True), (1, 2, False), (0, 0, False),
                            (-2, -1, True), (2, 10, True), (5, 9, True)]:
        questions.append((f"get_job_logs({start}, {end}, {asc})",
                          lambda s=start, e=end, a=asc: queue.get_job_logs(job_id, s, e, a),
                          q("getJobLogs", job_id, start, end, asc)))
    questions.append(("get_job_logs(keep_logs=2)", lambda: queue.get_job_logs(trimmed_id),
                      q("getJobLogs", trimmed_id)))
    questions.append(("get_job_logs(missing)", lambda: queue.get_job_logs("no-such-job"),
                      q("getJobLogs", "no-such-job")))
    assert (await queue.get_job_logs(trimmed_id))["count"] == 2  # keep_logs trimmed what we wrote
    none_of(await differences(side, queue.name, questions))


async def test_metrics_and_counts_per_priority_are_nodes(side: Side, queue: Queue) -> None:
    empty: list[Question] = [
        ("get_metrics(completed) before any", lambda: queue.get_metrics("completed"), q("getMetrics", "completed")),
        ("get_metrics(failed) before any", lambda: queue.get_metrics("failed"), q("getMetrics", "failed")),
    ]
    none_of(await differences(side, queue.name, empty))
    await queue.add_bulk([{"name": "m", "data": {}} for _ in range(3)])
    await queue.add("f", {}, attempts=1)
    worker = Worker(queue.name, **side.connect, metrics={"max_data_points": 60})
    await finish_by_hand(worker, ("ok", "ok", "ok", "fail"))
    await queue.add_bulk([{"name": "a", "data": {}}, {"name": "b", "data": {}, "opts": {"priority": 2}},
                          {"name": "c", "data": {}, "opts": {"priority": 2}},
                          {"name": "d", "data": {}, "opts": {"priority": 9}}])
    priorities = [0, 2, 9, 3, 2]
    assert await queue.get_counts_per_priority(priorities) == {"0": 1, "2": 2, "9": 1, "3": 0}
    questions: list[Question] = [
        ("get_metrics(completed)", lambda: queue.get_metrics("completed"), q("getMetrics", "completed")),
        ("get_metrics(completed, 0, 0)", lambda: queue.get_metrics("completed", 0, 0),
         q("getMetrics", "completed", 0, 0)),
        ("get_metrics(failed)", lambda: queue.get_metrics("failed"), q("getMetrics", "failed")),
        ("get_counts_per_priority", lambda: queue.get_counts_per_priority(priorities),
         q("getCountsPerPriority", priorities)),
    ]
    assert (await queue.get_metrics("completed"))["meta"]["count"] == 3
    none_of(await differences(side, queue.name, questions))


def _without_version(label: str, value: Any) -> Any:
    # the meta's version is whoever opened a Queue last (Node's Queue writes bullmq:6.7.0)
    if label.startswith("get_meta") and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "version"}
    return value


async def test_limits_meta_and_deduplication_reads_are_nodes(side: Side, queue: Queue) -> None:
    kept = await queue.add("d", {}, deduplication={"id": "key-1"})
    await queue.add("d", {}, deduplication={"id": "key-1"})  # deduplicated: the key still names `kept`

    def reads(tag: str) -> list[Question]:
        return [
            (f"get_meta {tag}", lambda: queue.get_meta(), q("getMeta")),
            (f"get_global_concurrency {tag}", lambda: queue.get_global_concurrency(), q("getGlobalConcurrency")),
            (f"get_global_rate_limit {tag}", lambda: queue.get_global_rate_limit(), q("getGlobalRateLimit")),
            (f"is_maxed {tag}", lambda: queue.is_maxed(), q("isMaxed")),
            (f"get_rate_limit_ttl {tag}", lambda: queue.get_rate_limit_ttl(), q("getRateLimitTtl")),
            (f"get_deduplication_job_id(key-1) {tag}", lambda: queue.get_deduplication_job_id("key-1"),
             q("getDeduplicationJobId", "key-1")),
            (f"get_deduplication_job_id(none) {tag}", lambda: queue.get_deduplication_job_id("none"),
             q("getDeduplicationJobId", "none")),
        ]

    assert await queue.get_deduplication_job_id("key-1") == kept.id
    none_of(await differences(side, queue.name, reads("at first"), _without_version))
    await queue.set_global_concurrency(3)
    await queue.set_global_rate_limit(7, 2000)
    await queue.pause()
    none_of(await differences(side, queue.name, reads("with limits"), _without_version))
    # a manual rate limit: the TTL runs down between the two reads, so both must lie in the window
    await queue.rate_limit(60_000)
    theirs = await node_answers(side, queue.name, [q("getRateLimitTtl"), q("getRateLimitTtl", 1)])
    ours = [await queue.get_rate_limit_ttl(), await queue.get_rate_limit_ttl(1)]
    assert all(30_000 < ttl <= 60_000 for ttl in ours + theirs), (ours, theirs)


def _scheduler_form(label: str, value: Any) -> Any:
    """Node's scheduler JSON by our documented key names (python_form); other answers as they are."""
    if label.startswith("get_job_scheduler(") and isinstance(value, dict) and "iterationCount" in value:
        return python_form(value)
    if label.startswith("get_job_schedulers") and isinstance(value, list):
        return [python_form(v) if "iterationCount" in v else v for v in value]
    return value


async def test_job_schedulers_read_as_node_reads_them(side: Side, queue: Queue) -> None:
    base = 4_102_444_800_000  # 2100-01-01T00:00:00Z: every next run is far, and known
    await queue.upsert_job_scheduler("every", {"every": 60_000, "start_date": base},
                                     template={"name": "tick", "data": {"a": 1},
                                               "opts": {"attempts": 3, "remove_on_complete": 10}})
    await queue.upsert_job_scheduler("cron", {"pattern": "0 */5 * * * *", "tz": "Europe/Paris", "limit": 5,
                                              "start_date": base, "end_date": base + 86_400_000},
                                     template={"data": {"b": 2}, "opts": {"backoff": 5}})
    await queue.upsert_job_scheduler("plain", {"pattern": "0 0 * * *", "start_date": base + 3_600_000})
    questions: list[Question] = [
        (f"get_job_scheduler({key})", lambda key=key: queue.get_job_scheduler(key), q("getJobScheduler", key))
        for key in ("every", "cron", "plain", "missing")
    ]
    questions += [
        ("get_job_schedulers()", lambda: queue.get_job_schedulers(), q("getJobSchedulers")),
        ("get_job_schedulers(0, 1, asc)", lambda: queue.get_job_schedulers(0, 1, True),
         q("getJobSchedulers", 0, 1, True)),
        ("get_job_schedulers_count", lambda: queue.get_job_schedulers_count(), q("getJobSchedulersCount")),
    ]
    found = await queue.get_job_scheduler("every")
    assert found is not None and found["next"] == base
    none_of(await differences(side, queue.name, questions, _scheduler_form))
    # and the job each scheduler made, as Node shows it
    jobs: list[Question] = []
    for job in await queue.get_delayed():
        jobs.append((f"to_json({job.id})", lambda job=job: _to_json(queue, str(job.id)), j(str(job.id), "toJSON")))
    assert len(jobs) == 3
    none_of(await differences(side, queue.name, jobs))


async def _to_json(queue: Queue, job_id: str) -> Any:
    job = await queue.get_job(job_id)
    assert job is not None
    return job.to_json()


#: backoff options and attempts: fixed, exponential, numbers given as they come (no jitter: random)
BACKOFFS = [({"type": "fixed", "delay": 1000}, 1), ({"type": "fixed", "delay": 1000}, 7),
            ({"type": "exponential", "delay": 100}, 1), ({"type": "exponential", "delay": 100}, 4),
            ({"type": "exponential", "delay": 100}, 11), ({"type": "exponential", "delay": 3}, 2),
            ({"type": "exponential", "delay": 1.5}, 2), ({"type": "exponential", "delay": 0.7}, 1),
            ({"type": "exponential", "delay": 0}, 3), ({"type": "exponential"}, 3), ({"type": "fixed"}, 1),
            ({"type": "exponential", "delay": 1000}, 0), ({"type": "fixed", "delay": 250.4}, 1),
            ({"type": "exponential", "delay": 1000, "jitter": 0}, 3), ({"type": "exponential", "delay": 0.5}, 1),
            ({"type": "exponential", "delay": 2.5}, 1), ({"type": "exponential", "delay": 1.25}, 2)]


def _as_retry(delay: Any) -> Any:
    """A delay as the retry it makes. Node's strategy may answer NaN or undefined (no delay given:
    JSON null) where ours answers 0: both retry at once (Node's `if (delay)` is false for them). A
    fixed delay Node returns as given (250.4); ours is whole milliseconds (its documented int)."""
    if delay is None:
        return 0
    return int(delay) if isinstance(delay, float) and delay > 0 else delay


async def test_builtin_backoff_delays_are_nodes(redis_url: str, queue_name: str) -> None:
    side = Side("redis", {"connection": redis_url}, {"redis": redis_url})
    theirs = await node_answers(side, queue_name, [{"backoff": [opts, n]} for opts, n in BACKOFFS])
    ours = [builtin_delay(opts, n) for opts, n in BACKOFFS]
    assert ours[3] == 800  # 2^3 * 100: the table reads what it should
    none_of([(case, o, t) for case, o, t in zip(BACKOFFS, ours, theirs) if _as_retry(o) != _as_retry(t)])


async def _outcome(call: Callable[[], Awaitable[Any]]) -> Any:
    """("value", v) or ("error", message): what a caller of our API meets."""
    try:
        return ("value", await call())
    except Exception as err:  # noqa: BLE001 - the message is the answer compared
        return ("error", str(err))


async def test_refusals_say_what_node_says(side: Side, queue: Queue) -> None:
    """Calls Node refuses (a job not in the state the call needs, a wrong lock token) are refused
    by us with Node's message, and the ones Node answers with a number we answer alike. Each is
    asked on a job it cannot change, so the question order does not matter."""
    ids = await _mixed_state(side, queue)
    active, waiting, done, delayed = ids["taken_active"], ids["waiting3"], ids["taken_done"], ids["delayed"]

    async def job(job_id: str) -> Any:
        found = await queue.get_job(job_id)
        assert found is not None
        return found

    cases: list[tuple[str, Callable[[], Awaitable[Any]], dict[str, Any]]] = [
        ("promote(waiting)", lambda: _call(job(waiting), "promote"), j(waiting, "promote")),
        ("retry(waiting)", lambda: _call(job(waiting), "retry"), j(waiting, "retry")),
        ("change_delay(waiting)", lambda: _call(job(waiting), "change_delay", 5000), j(waiting, "changeDelay", 5000)),
        ("move_to_completed(active, bad token)",
         lambda: _call(job(active), "move_to_completed", "x", "bad-token", False),
         j(active, "moveToCompleted", "x", "bad-token", False)),
        ("move_to_completed(completed)", lambda: _call(job(done), "move_to_completed", "x", "tok", False),
         j(done, "moveToCompleted", "x", "tok", False)),
        ("remove(active job)", lambda: _call(job(active), "remove"), j(active, "remove")),
        ("queue.remove(active)", lambda: queue.remove(active), q("remove", active)),
        ("retry(delayed, completed)", lambda: _call(job(delayed), "retry", "completed"),
         j(delayed, "retry", "completed")),
    ]
    answers = await node("oracle", **side.node, queue=queue.name, questions=[c[2] for c in cases])
    assert len(answers) == len(cases), answers
    diffs = []
    for (label, ours_of, _), answer in zip(cases, answers):
        theirs = ("error", answer["error"]) if "error" in answer else ("value", answer["value"])
        ours = await _outcome(ours_of)
        if ours != theirs:
            diffs.append((label, ours, theirs))
    assert await queue.get_job_state(active) == "active"  # nothing above took the job from its worker
    none_of(diffs)


async def _call(job: Awaitable[Any], method: str, *args: Any) -> Any:
    return await getattr(await job, method)(*args)


#: what a worker's entry says that changes from one read to the next (its connection's age, idle
#: time, buffers, the command it runs now): not an answer to compare
_MOVING = {"age", "idle", "qbuf", "qbuf-free", "obl", "oll", "omem", "tot-mem", "events", "cmd", "argv-mem",
           "multi-mem", "net-i", "net-o", "tot-net-in", "tot-net-out", "tot-cmds", "rbs", "rbp", "io-thread",
           "flags", "sub", "psub", "ssub", "watch", "multi", "lib-name", "lib-ver", "resp", "user", "redir",
           "backend_start", "state", "state_change", "query_start", "xact_start", "wait_event", "wait_event_type",
           "query", "backend_xid", "backend_xmin"}


def _steady(label: str, value: Any) -> Any:
    if label.startswith("get_workers") and isinstance(value, list):
        return sorted(({k: v for k, v in entry.items() if k not in _MOVING} for entry in value),
                      key=lambda e: str(e.get("name")))
    return value


async def test_workers_listed_as_node_lists_them(side: Side, queue: Queue) -> None:
    """A running Python Worker, as `get_workers` and Node's getWorkers (Bull-Board's list) show it."""
    from tests.helpers import wait_until

    async with Worker(queue.name, lambda job: None, **side.connect, name="py-w", drain_delay=1):
        await wait_until(lambda: queue.get_workers_count(), 30, what="the worker listed")
        questions: list[Question] = [("get_workers", lambda: queue.get_workers(), q("getWorkers")),
                                     ("get_workers_count", lambda: queue.get_workers_count(), q("getWorkersCount"))]
        none_of(await differences(side, queue.name, questions, _steady))
