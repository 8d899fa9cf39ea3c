"""The hot path's shortcuts give what the general code gives: JSON in and out, a job read from its
hash (the stored options decoded once per distinct text), moveToFinished's packed options (kept
per token), the moveToActive reply, the script argv. No Redis needed."""
from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest

from bullmq_compat._backends.redis.keys import QueueKeys
from bullmq_compat._backends.redis.runner import _argv
from bullmq_compat._backends.redis.worker_calls import WorkerCalls, WorkerWireOptions, keep_jobs, parse_next_job
from bullmq_compat._errors import InvalidJobData
from bullmq_compat._job import Job
from bullmq_compat._wire import codec
from bullmq_compat._wire.options import attempts_of


class _Queue:
    """What Job.from_raw needs of its queue: nothing."""


@pytest.mark.parametrize("text", ['{"a":1}', ' {"a":1}', '{"a":1} ', "\n[1, 2]\t", "1", '"x"', "null", "true",
                                  '{"a":{"b":[1,2,{"c":null}]},"d":"é"}', "-0.5e3", '""'])
def test_loads_as_json_parse(text: str) -> None:
    assert codec.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", " ", "x", '{"a":1} x', "1 2", "{", '{"a":1,}', "NaN", "Infinity", "-Infinity",
                                  '{"a":NaN}'])
def test_loads_refuses_what_json_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        codec.loads(text)


@pytest.mark.parametrize("value", [None, {"i": 1}, [1, "é", None, True, 1.5], "x", 3, 1.0, -0.0, 1e300,
                                   {"a": {"b": [1, {"c": "d\"e\\f\n"}]}}, {1: 2, "k": [None]}, [], {}, "\u2028"])
def test_dumps_as_json_stringify(value: Any) -> None:
    assert codec.dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def test_dumps_refusals_name_the_reason() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    for bad, reason in ((math.nan, "Out of range float"), (math.inf, "Out of range float"),
                        ({"x": object()}, "not JSON serializable"), (cycle, "Circular reference"),
                        ({(1, 2): 3}, "keys must be"), ("\ud800", "not valid UTF-8")):
        with pytest.raises(InvalidJobData, match=reason):
            codec.dumps(bad)
    assert codec.dumps({"ok": 1}) == '{"ok":1}'  # nothing left over from the refusals


def test_from_raw_reads_numbers_as_node_does() -> None:
    """parseInt, as Node's rawToJobJson (tests/test_interop_parity.py compares the same hashes with
    Node's getJob): a number's leading digits only; NaN reads 0 (None for processedOn/finishedOn);
    attemptsMade "0" is kept, not replaced by atm (JavaScript's ||: a non-empty string is true)."""
    raw = {"name": "n", "data": '{"i":1}', "opts": '{"attempts":3}', "timestamp": "1.5e3", "delay": "NaN",
           "priority": "", "ats": "2", "atm": "1", "processedOn": "7.9", "finishedOn": "x", "stc": "1e999"}
    job = Job.from_raw(_Queue(), "9", raw)  # type: ignore[arg-type]
    assert (job.timestamp, job.delay, job.priority, job.attempts_started, job.attempts_made) == (1, 0, 0, 2, 1)
    assert (job.processed_on, job.finished_on, job.stalled_counter) == (7, None, 1)
    assert job.data == {"i": 1} and job.opts == {"attempts": 3} and job.parse_error is None
    plain = Job.from_raw(_Queue(), "10", {"name": "n", "data": "{}", "opts": "{}", "timestamp": "5",  # type: ignore[arg-type]
                                          "attemptsMade": "0", "atm": "4", "processedOn": "6"})
    assert (plain.timestamp, plain.attempts_made, plain.processed_on, plain.finished_on) == (5, 0, 6, None)
    assert (plain.progress, plain.returnvalue, plain.stacktrace, plain.parent) == (0, None, [], None)
    odd = Job.from_raw(_Queue(), "11", {"name": "n", "data": "{}", "opts": "{}",  # type: ignore[arg-type]
                                        "timestamp": " 0x1A", "delay": "1_000", "priority": "\u0661",
                                        "processedOn": "0", "finishedOn": "9007199254740993"})
    assert (odd.timestamp, odd.delay, odd.priority, odd.processed_on, odd.finished_on) == (
        26, 1, 0, None, 9007199254740992)


def test_from_raw_gives_each_job_its_own_options() -> None:
    text = '{"attempts":2,"tm":"ctx","rdof":true}'
    one = Job.from_raw(_Queue(), "1", {"name": "n", "data": "{}", "opts": text})  # type: ignore[arg-type]
    two = Job.from_raw(_Queue(), "2", {"name": "n", "data": "{}", "opts": text})  # type: ignore[arg-type]
    assert one.opts == two.opts == {"attempts": 2, "telemetry": {"metadata": "ctx"},
                                    "remove_dependency_on_failure": True}
    one.opts["attempts"] = 9
    one.opts["telemetry"]["metadata"] = "changed"
    assert two.opts["attempts"] == 2 and two.opts["telemetry"] == {"metadata": "ctx"}
    three = Job.from_raw(_Queue(), "3", {"name": "n", "data": "{}", "opts": text})  # type: ignore[arg-type]
    assert three.opts == {"attempts": 2, "telemetry": {"metadata": "ctx"}, "remove_dependency_on_failure": True}


def test_from_raw_reports_bad_payloads_every_time() -> None:
    for _ in range(2):  # the second read of the same texts comes from the cache of stored options
        job = Job.from_raw(_Queue(), "1", {"data": "{", "opts": "[1]"})  # type: ignore[arg-type]
        assert job.parse_error is not None
        assert "data is not JSON" in job.parse_error and "opts is not a JSON object" in job.parse_error
        assert "has no name" in job.parse_error
        bad = Job.from_raw(_Queue(), "2", {"name": "n", "data": "{}", "opts": '{"attempts":"x"}'})  # type: ignore[arg-type]
        assert bad.parse_error == "opts.attempts='x' is not a finite number"


def test_from_raw_sets_what_the_constructor_sets_in_its_order() -> None:
    """from_raw builds its Job without the constructor: every attribute is there, in the same order
    (the order keeps CPython's shared attribute keys, one layout for all Jobs)."""
    made = Job(_Queue(), "n", {"i": 1}, {"attempts": 1}, "1")  # type: ignore[arg-type]
    read = Job.from_raw(_Queue(), "1", {"name": "n", "data": '{"i":1}', "opts": '{"attempts":1}'})  # type: ignore[arg-type]
    assert list(vars(read)) == list(vars(made))
    assert {k: v for k, v in vars(read).items() if k != "queue"} == {k: v for k, v in vars(made).items() if k != "queue"}
    grouped = Job.from_raw(_Queue(), "2", {"name": "n", "data": "{}", "opts": '{"group":{"id":"g1"}}'})  # type: ignore[arg-type]
    assert grouped.group_id == "g1"
    assert Job.from_raw(_Queue(), "3", {"name": "n", "data": "{}", "opts": '{"group":{"id":"g1"}}',  # type: ignore[arg-type]
                                        "gid": "g2"}).group_id == "g2"
    full = Job.from_raw(_Queue(), "4", {"name": "n", "data": "{}", "opts": "{}", "progress": '{"p":1}',  # type: ignore[arg-type]
                                        "returnvalue": "[1]", "stacktrace": '["a"]', "parent": '{"id":"p"}',
                                        "parentKey": "bull:p:1", "failedReason": "r", "rjk": "k", "deid": "d",
                                        "pb": "w", "defa": "stalled"})
    assert (full.progress, full.returnvalue, full.stacktrace, full.parent, full.parent_key) == (
        {"p": 1}, [1], ["a"], {"id": "p"}, "bull:p:1")
    assert (full.failed_reason, full.repeat_job_key, full.deduplication_id, full.processed_by,
            full.deferred_failure) == ("r", "k", "d", "w", "stalled")


def _calls(**wire: Any) -> WorkerCalls:
    return WorkerCalls(QueueKeys("bull", "q"), WorkerWireOptions(**wire))


def _uncached_pack(calls: WorkerCalls, job_opts: dict[str, Any], completed: bool, token: str) -> dict[str, Any]:
    worker_keep = calls.opts.remove_on_complete if completed else calls.opts.remove_on_fail
    job_keep = job_opts.get("remove_on_complete" if completed else "remove_on_fail")
    return {"token": token, "name": calls.opts.name, "keepJobs": keep_jobs(job_keep, worker_keep),
            "limiter": calls.opts.limiter, "lockDuration": calls.opts.lock_duration,
            "attempts": attempts_of(job_opts), "maxMetricsSize": calls.opts.max_metrics_size,
            "fpof": bool(job_opts.get("fail_parent_on_failure")),
            "cpof": bool(job_opts.get("continue_parent_on_failure")),
            "idof": bool(job_opts.get("ignore_dependency_on_failure")),
            "rdof": bool(job_opts.get("remove_dependency_on_failure"))}


@pytest.mark.parametrize("job_opts", [{}, {"attempts": 0}, {"attempts": 3}, {"attempts": 2.0},
                                      {"remove_on_complete": True}, {"remove_on_fail": {"count": 5}},
                                      {"attempts": 1, "fail_parent_on_failure": True}, {"attempts": [1]}])
def test_finish_opts_are_what_the_job_says(job_opts: dict[str, Any]) -> None:
    calls = _calls(name="w", remove_on_complete={"count": 0}, remove_on_fail=None)
    for _ in range(2):  # the second time from the cache, where the job's options allow it
        for target in ("completed", "failed"):
            for token in ("t:1", "t:2"):
                _, _, args = calls.move_to_finished("7", job_opts, target, "v", token, 1, True)
                assert msgpack.unpackb(args[7]) == _uncached_pack(calls, job_opts, target == "completed", token)


def test_finish_opts_cache_is_bounded() -> None:
    calls = _calls()
    for i in range(3000):
        calls.move_to_finished("7", {"attempts": 1}, "completed", "null", f"t:{i}", 1, True)
    assert 0 < len(calls._packed_finish) <= 1024


def test_parse_next_job_bytes_and_str() -> None:
    reply = [["name", "n", "data", "{}"], "5", 0, 1234]
    assert parse_next_job(reply) == ({"name": "n", "data": "{}"}, "5", 0, 1234)
    assert parse_next_job([[b"name", b"n"], b"6", b"10", None]) == ({"name": "n"}, "6", 10, 0)
    assert parse_next_job([[], None, 0, 99]) == (None, None, 0, 99)
    assert parse_next_job([[], "", 5]) == (None, None, 5, 0)
    assert parse_next_job(None) == (None, None, 0, 0)
    assert parse_next_job([]) == (None, None, 0, 0)


def test_argv_sends_none_as_empty() -> None:
    assert _argv(["k1", "k2"], ["a", 1, b"x"]) == ["k1", "k2", "a", 1, b"x"]
    assert _argv(["k1"], [None, "a", None]) == ["k1", "", "a", ""]
