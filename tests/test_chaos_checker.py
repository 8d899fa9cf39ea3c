"""`tests.chaos_helpers.check_runs` itself (issue #31 §1): what explains a repeated run.

The soaks (tests/test_chaos.py, tests/test_postgres_reliability.py, and through `judge_repeats`
the group SIGKILL tests) trust this checker, so it is tested on hand-made records of one job whose
second run repeats its first: a repeat is explained by a kill only if the first run's process was
killed after the run started, before the repeat started, before the run's finish was acknowledged
and before the job stalled (no stalled event between the run's start and the kill); any other
repeat with a ``stalled`` event is a lock lost by a live worker (counted, printed, the only
overlap permitted, failed in ``make chaos``); one without is unexplained and fails at once. The
crash soak used to pass every job with a ``stalled`` event as ``may_repeat``, which waived these
checks for every job recovered after a kill.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Optional

import pytest

from tests import chaos_helpers
from tests.chaos_helpers import Figures, Plan, check_group_kills, check_runs, judge_lock_lost

JOB = "1"
PID_A, PID_B = 100, 200


def one_job() -> Plan:
    return Plan([{"name": "ok", "data": {"i": 0, "plan": "ok", "ms": 10}, "opts": {}}], {}, [JOB])


def check(runs: list[tuple[int, int, int, bool]], *, kills: Optional[dict[int, int]] = None,
          stalled_at: tuple[int, ...] = (), fins: tuple[tuple[int, int, int], ...] = (),
          lags: tuple[dict[str, Any], ...] = ()) -> Figures:
    """``runs``: (pid, t0, t1, ended) of attempt 1, the last one finishing the job; ``fins``: (pid,
    t0, t) of runs whose finish was acknowledged."""
    starts = [{"id": JOB, "a": 1, "t0": t0, "pid": pid, "g": None, "s": None} for pid, t0, _, _ in runs]
    ends = [{"id": JOB, "a": 1, "t0": t0, "t1": t1, "pid": pid, "out": "completed"}
            for pid, t0, t1, ended in runs if ended]
    states = {JOB: {"state": "completed", "atm": 1, "returnvalue": {"i": 0, "a": 1}, "failedReason": None,
                    "stc": len(stalled_at), "ats": len(runs)}}
    at: dict[str, list[int]] = defaultdict(list)
    at[JOB] += stalled_at
    events: dict[str, Any] = {"completed": Counter({JOB: 1}), "failed": Counter(),
                              "stalled": Counter({JOB: len(stalled_at)}), "stalled_at": at}
    fin_records = [{"id": JOB, "a": 1, "t0": t0, "pid": pid, "t": t} for pid, t0, t in fins]
    return check_runs(one_job(), states, starts, ends, kills or {}, events, fins=fin_records, lags=list(lags))


def test_a_run_cut_short_by_a_kill_explains_its_repeat() -> None:
    figures = check([(PID_A, 1000, 0, False), (PID_B, 3000, 3050, True)], kills={PID_A: 1200},
                    stalled_at=(2600,), fins=((PID_B, 3000, 3060),))
    assert (figures.duplicates, figures.killed_runs, figures.lock_lost, figures.unexplained) == (1, 1, 0, 0)


def test_a_run_whose_finish_was_not_yet_acknowledged_at_the_kill_explains_its_repeat() -> None:
    figures = check([(PID_A, 1000, 1050, True), (PID_B, 3000, 3050, True)], kills={PID_A: 1060},
                    stalled_at=(2600,), fins=((PID_B, 3000, 3060),))
    assert (figures.duplicates, figures.lock_lost) == (1, 0)


def test_a_run_started_in_the_moment_before_the_kill_landed_is_cut_by_it() -> None:
    """The kill's time is read just before the signal is sent: the process may start a run and
    record it a few ms later (a make chaos run: 2 ms). Never ended, it was cut by that kill; a run
    recorded as ended then, or started well after, is not explained by it."""
    figures = check([(PID_A, 1202, 0, False), (PID_B, 3000, 3050, True)], kills={PID_A: 1200},
                    stalled_at=(2600,), fins=((PID_B, 3000, 3060),))
    assert (figures.duplicates, figures.killed_runs, figures.lock_lost, figures.unexplained) == (1, 1, 0, 0)
    late = chaos_helpers.KILL_SLACK_MS + 1
    figures = check([(PID_A, 1200 + late, 0, False), (PID_B, 3000, 3050, True)], kills={PID_A: 1200},
                    stalled_at=(2600,), fins=((PID_B, 3000, 3060),))
    assert figures.lock_lost == 1
    figures = check([(PID_A, 1202, 1203, True), (PID_B, 3000, 3050, True)], kills={PID_A: 1200},
                    stalled_at=(2600,), fins=((PID_B, 3000, 3060),))
    assert figures.lock_lost == 1


def test_a_repeat_of_a_live_workers_run_is_a_lost_lock_with_its_lag() -> None:
    """No kill: the first run's worker was alive and lost its lock (here its loop lagged 1.8 s); the
    two runs overlap, which only a lost lock permits."""
    figures = check([(PID_A, 1000, 4000, True), (PID_B, 3000, 3050, True)], stalled_at=(2600,),
                    fins=((PID_B, 3000, 3060),), lags=({"pid": PID_A, "t": 2900, "lag": 1800},))
    assert (figures.duplicates, figures.lock_lost, figures.unexplained) == (1, 1, 0)
    assert "pid 100 (not killed)" in figures.lock_lost_runs[0]
    assert "stalled events at [2600]" in figures.lock_lost_runs[0]
    assert "max event-loop lag 1800 ms" in figures.lock_lost_runs[0]


def test_a_kill_after_the_repeat_started_does_not_explain_it() -> None:
    """The first run's process was killed, but only after the job had started again elsewhere: the
    lock was lost while that process lived."""
    figures = check([(PID_A, 1000, 0, False), (PID_B, 3000, 3050, True)], kills={PID_A: 3500},
                    stalled_at=(2600,), fins=((PID_B, 3000, 3060),))
    assert (figures.killed_runs, figures.lock_lost) == (1, 1)
    assert "killed at 3500" in figures.lock_lost_runs[0]


def test_a_kill_after_the_job_had_stalled_does_not_explain_its_repeat() -> None:
    """The job's stalled event (1100) came before its process was killed (1200): the lock was
    already lost while that process lived, so the repeat (1300, after the kill) is a lost lock,
    not a kill's. The same records with the stalled event after the kill are a kill's."""
    figures = check([(PID_A, 1000, 0, False), (PID_B, 1300, 1350, True)], kills={PID_A: 1200},
                    stalled_at=(1100,), fins=((PID_B, 1300, 1360),))
    assert (figures.duplicates, figures.killed_runs, figures.lock_lost, figures.unexplained) == (1, 1, 1, 0)
    assert "killed at 1200" in figures.lock_lost_runs[0]
    assert "stalled events at [1100]" in figures.lock_lost_runs[0]
    figures = check([(PID_A, 1000, 0, False), (PID_B, 1300, 1350, True)], kills={PID_A: 1200},
                    stalled_at=(1250,), fins=((PID_B, 1300, 1360),))
    assert (figures.duplicates, figures.killed_runs, figures.lock_lost) == (1, 1, 0)


def test_a_kill_after_the_finish_was_acknowledged_does_not_explain_a_repeat() -> None:
    figures = check([(PID_A, 1000, 1050, True), (PID_B, 3000, 3050, True)], kills={PID_A: 1500},
                    stalled_at=(2600,), fins=((PID_A, 1000, 1060), (PID_B, 3000, 3060)))
    assert figures.lock_lost == 1


def test_a_repeat_with_no_kill_and_no_stalled_event_fails() -> None:
    with pytest.raises(AssertionError, match="1 repeated runs not explained"):
        check([(PID_A, 1000, 1050, True), (PID_B, 3000, 3050, True)], fins=((PID_B, 3000, 3060),))


def test_an_overlap_that_no_lost_lock_explains_fails() -> None:
    """Two runs of the job at once, with no stalled event: nothing permits that."""
    with pytest.raises(AssertionError, match="ran twice at once"):
        check([(PID_A, 1000, 2000, True), (PID_B, 1500, 1600, True)], fins=((PID_B, 1500, 1610),))


def test_a_lost_lock_fails_make_chaos_and_is_reported_in_make_test(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = check([(PID_A, 1000, 4000, True), (PID_B, 3000, 3050, True)], stalled_at=(2600,),
                    fins=((PID_B, 3000, 3060),))
    reported: list[str] = []
    monkeypatch.setattr(chaos_helpers, "report", reported.append)
    monkeypatch.setattr(chaos_helpers, "CHAOS", False)
    judge_lock_lost(figures, "soak")
    assert reported and "lock lost by a live worker" in reported[0]
    monkeypatch.setattr(chaos_helpers, "CHAOS", True)
    with pytest.raises(AssertionError, match="1 locks lost by live workers"):
        judge_lock_lost(figures, "soak")


def test_the_group_kill_check_accepts_a_repeat_only_where_a_kill_explains_it() -> None:
    """`check_group_kills` (the group SIGKILL tests) judges tests/group_helpers.py's records the
    same way: a killed run's repeat passes; the same repeat of a run whose process lived fails."""
    def records(ended: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        starts = [{"g": "G", "s": 0, "id": JOB, "a": 1, "t0": t0, "pid": pid} for pid, t0 in ((PID_A, 1000),
                                                                                            (PID_B, 3000))]
        ends = [{"g": "G", "s": 0, "id": JOB, "a": 1, "t0": 3000, "t1": 3050, "pid": PID_B, "n": 1}]
        if ended:
            ends.insert(0, {"g": "G", "s": 0, "id": JOB, "a": 1, "t0": 1000, "t1": 1050, "pid": PID_A, "n": 1})
        return ends, starts

    def events(*stalled_at: int) -> dict[str, Any]:
        return {"stalled": Counter({JOB: len(stalled_at)}), "stalled_at": {JOB: list(stalled_at)}}

    figures = check_group_kills(*records(False), {"G": 1}, {PID_A: 1200}, events(2600))
    assert (figures.killed_runs, figures.duplicates, figures.lock_lost) == (1, 1, 0)
    figures = check_group_kills(*records(False), {"G": 1}, {PID_A: 1200}, events(1100))
    assert figures.lock_lost == 1
    with pytest.raises(AssertionError, match="1 repeated runs not explained"):
        check_group_kills(*records(True), {"G": 1}, {}, events())
