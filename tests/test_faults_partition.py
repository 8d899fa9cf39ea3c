"""Issue #31 §4: a network partition between a worker and its datastore, longer than lock_duration.

Worker A runs in a network namespace of the test's own (tests/netns_helpers.py), reaching the
test's own redis-server / PostgreSQL through a veth pair; worker B runs on the host. A takes HELD
jobs whose handlers work HELD_MS (all its slots), then the link is cut -- silently: every packet
dropped, A's connections left half-open, no RST, no error -- for at least MIN_PARTITION_S, and
until B has finished the held jobs. Then:

- B's stalled check finds the held jobs' locks expired and B re-runs and completes them during
  the partition (the job's ``processedBy`` is B, its ``finishedOn`` B's, attemptsMade 1,
  attemptsStarted 2, stalledCounter 1, as Node sets them);
- after the heal, A's late moveToFinished of each held job is refused by the lock check
  (JobLockNotFound / JobLockMismatch naming the job, in A's 'error' events): its 'completed' is
  never emitted, the events show exactly one completion per job;
- A recovers: with B stopped, A alone runs the jobs added after the heal;
- nothing is lost over the small plan around it (`check_runs`): only the held jobs may have run
  twice (they were A's active jobs when the partition began); no other job is waived.

The Redis worker's record writes go over the cut link too (they wait for the heal: A's late
finish comes after it); the PostgreSQL worker records in files, so its late moveToFinished is
sent during the partition and waits in its socket. BULLMQ_COMPAT_CHAOS=1 holds more jobs and runs a
bigger plan.
"""
from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import pytest
import redis.asyncio as aioredis

from bullmq_compat import Queue, migrate_postgres
from tests._postgres_server import PostgresServer
from tests._redis_server import RedisServer
from tests.chaos_helpers import (
    CHAOS,
    Plan,
    check_runs,
    final_states,
    finish_events,
    judge_lock_lost,
    now_ms,
    plan_jobs,
    poll_until,
    proc_lines,
    read_list,
    report,
    stdout_of,
)
from tests.group_helpers import Proc
from tests.netns_helpers import NetnsLink, netns_link, pg_hba_for
from tests.pg_group_helpers import final_states as pg_final_states
from tests.pg_group_helpers import finish_events as pg_finish_events
from tests.pg_group_helpers import read_run_records

pytestmark = pytest.mark.xdist_group("heavy")  # lock expiry and stall timing: a quiet machine

LOCK_MS = 2000
STALLED_MS = 1000
HELD = 8 if CHAOS else 4          # A's concurrency: every slot holds a job when the link is cut
HELD_MS = 3000                    # A's run of a held job (shorter than the partition)
DONE_RERUN_MS = 200               # B's re-run of the first half of the held jobs: done before the heal
BUSY_RERUN_MS = 15000             # B's re-run of the other half: still running when A's late finish lands
MIN_PARTITION_S = 6.0             # > 2 x lock_duration
REST = 200 if CHAOS else 40       # the plan's other jobs: half during the partition, half after
#: after the heal TCP resends what the partition dropped only at its next retransmission (exponential
#: back-off: up to about the partition's length later); a busy job whose B run ended sooner than this
#: after the heal may have seen A's late finish only after B's
KEPT_UP_S = 10.0


def worker_argv(module: str, *args: str, name: str, concurrency: int) -> list[str]:
    return [sys.executable, "-m", module, *args, "--concurrency", str(concurrency), "--lock-duration", str(LOCK_MS),
            "--stalled-interval", str(STALLED_MS), "--max-stalled-count", "100", "--name", name]


def the_plan(seed: int) -> Plan:
    """HELD long "ok" jobs first (A's; half "done", half "busy" in B's re-run), then REST jobs of the
    usual mix."""
    plan = plan_jobs(HELD + REST, seed=seed, grouped=0, ms=(20, 80))
    for k, item in enumerate(plan.items[:HELD]):
        item["name"] = "ok"
        item["data"].update(plan="ok", ms=HELD_MS, rerun_ms=DONE_RERUN_MS if k < HELD // 2 else BUSY_RERUN_MS)
    return plan


class Side:
    """What differs between the backends: the workers' argv, where records and states are read, and
    how a finish of a job another worker already completed is refused: by Redis' moveToFinished-14.lua
    at its lock check (the lock is gone: -2 JobLockNotFound), by upstream's SQL move_to_completed at its
    state check, which comes first (-3 JobNotInState). A finish of a job another worker holds is
    refused by the lock check on both (-6 JobLockMismatch)."""

    refused_when_done = ""

    async def records(self) -> dict[str, list[dict[str, Any]]]: ...
    async def states(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...
    async def events(self) -> dict[str, Any]: ...
    def worker(self, *, inside: bool, name: str, concurrency: int) -> list[str]: ...


async def partition_longer_than_the_lock(side: Side, queue: Queue, link: NetnsLink, plan: Plan,
                                         what: str) -> None:
    held_items, rest = plan.items[:HELD], plan.items[HELD:]
    during, after = rest[:len(rest) // 2], rest[len(rest) // 2:]
    a: Optional[Proc] = None
    b: Optional[Proc] = None
    procs: list[Proc] = []

    async def runs_of(pid: int, kind: str = "start") -> list[dict[str, Any]]:
        return [r for r in (await side.records())[kind] if r["pid"] == pid]

    async def finished(n: int) -> bool:
        counts = await queue.get_job_counts("completed", "failed")
        return counts["completed"] + counts["failed"] >= n

    async def counts() -> str:
        return f"counts {await queue.get_job_counts()}"

    try:
        a = await Proc(*link.exec_argv(*side.worker(inside=True, name="A", concurrency=HELD))).__aenter__()
        procs.append(a)
        assert f'"ready": {a.pid}' in a.first_line, f"A is not the pid we started: {a.first_line}"
        held = [str(job.id) for job in await queue.add_bulk(held_items)]

        async def a_holds_all() -> bool:
            return {r["id"] for r in await runs_of(a.pid)} == set(held)

        await poll_until(a_holds_all, 30, f"A to start the {HELD} held jobs", counts)
        active = {str(job.id) for job in await queue.get_jobs(["active"])}
        assert active == set(held), f"active when the link is cut: {active}, held {held}"

        t_cut = now_ms()
        link.partition()
        b = await Proc(*side.worker(inside=False, name="B", concurrency=HELD)).__aenter__()
        procs.append(b)
        plan.ids = held + [str(job.id) for job in await queue.add_bulk(during)]

        done, busy = held[:HELD // 2], held[HELD // 2:]

        async def b_took_the_held() -> bool:
            jobs = [await queue.get_job(job_id) for job_id in done]
            b_runs = {r["id"] for r in await runs_of(b.pid)}
            return all(job is not None and job.finished_on and job.processed_by == "B" for job in jobs) \
                and b_runs >= set(busy)

        await poll_until(b_took_the_held, 40, "B to re-run the held jobs (and complete the done ones) during "
                         "the partition", counts)
        await asyncio.sleep(max(0.0, MIN_PARTITION_S - (now_ms() - t_cut) / 1000))
        dropped = link.dropped()
        link.heal()
        t_heal = now_ms()
        # A holds jobs through the cut, so its lock renewals are dropped on its own end; the server's end
        # drops something only if the server had something to send A (a NOTIFY, say), which it need not.
        assert dropped[link.ns_dev] > 0, f"the partition dropped none of A's packets: {dropped}"

        await poll_until(lambda: finished(len(plan.ids)), 60, "the jobs added during the partition", counts)
        # A's late finishes: its handlers' ends (Redis: written after the heal, just before moveToFinished)
        async def both_ended_the_held() -> bool:
            ended = [{r["id"] for r in await runs_of(w.pid, "end")} for w in (a, b)]
            return all(ids >= set(held) for ids in ended)

        await poll_until(both_ended_the_held, 60, "A's and B's runs of the held jobs to end", counts)
        await b.__aexit__(None, None, None)  # from now on A alone: does it work again?
        t_b_gone = now_ms()
        plan.ids += [str(job.id) for job in await queue.add_bulk(after)]
        took = await poll_until(lambda: finished(len(plan.ids)), 60, "A alone to run the jobs added after the heal",
                                counts)
        await a.__aexit__(None, None, None)
    finally:
        for proc in procs:
            await proc.__aexit__(None, None, None)
    assert a is not None and b is not None
    errors = {p.pid: [line["error"] for line in proc_lines(await stdout_of(p)) if "error" in line] for p in (a, b)}

    records = await side.records()
    states = await side.states(plan.ids)
    events = await side.events()
    fins = {(r["id"], r["pid"]) for r in records["fin"]}
    for job_id in held:
        is_done = job_id in done
        runs = sorted((r for r in records["start"] if r["id"] == job_id), key=lambda r: r["t0"])
        assert [(r["pid"], r["a"]) for r in runs] == [(a.pid, 1), (b.pid, 1)], \
            f"held job {job_id}: runs {runs} (want A's before the cut, then B's)"
        assert runs[0]["t0"] < t_cut < runs[1]["t0"] < t_heal, f"held job {job_id}: runs {runs}, cut {t_cut}, heal {t_heal}"
        b_end = next(r for r in records["end"] if r["id"] == job_id and r["pid"] == b.pid)
        job = await queue.get_job(job_id)
        assert job is not None
        assert (job.processed_by, job.attempts_made, job.attempts_started, job.stalled_counter) == ("B", 1, 2, 1), \
            f"held job {job_id}: processedBy {job.processed_by}, atm {job.attempts_made}, " \
            f"ats {job.attempts_started}, stc {job.stalled_counter}"
        assert job.returnvalue == {"i": plan.spec(held.index(job_id))["i"], "a": 1}
        assert job.finished_on is not None and b_end["t1"] <= job.finished_on \
            and (job.finished_on < t_heal) == is_done, \
            f"held job {job_id} ({'done' if is_done else 'busy'}): finishedOn {job.finished_on}, " \
            f"B's run ended {b_end['t1']}, heal {t_heal}"
        assert (job_id, b.pid) in fins and (job_id, a.pid) not in fins, \
            f"held job {job_id}: finish acknowledged to A {(job_id, a.pid) in fins}, to B {(job_id, b.pid) in fins}"
        assert events["completed"][job_id] == 1 and events["stalled"][job_id] == 1, \
            f"held job {job_id}: {events['completed'][job_id]} completed, {events['stalled'][job_id]} stalled events"
        # the refusal of A's late finish: while B still runs the job, by the lock check (on both)
        want = {side.refused_when_done} if is_done else {"JobLockMismatch"}
        if not is_done and b_end["t1"] - t_heal < KEPT_UP_S * 1000:  # A's finish may have come after B's
            want.add(side.refused_when_done)
        refused = [e.split(":")[0] for e in errors[a.pid] if "moveToFinished" in e
                   and re.search(rf"\bjob {re.escape(job_id)}\b", e, re.IGNORECASE)]
        assert len(refused) == 1 and set(refused) <= want, \
            f"A's late moveToFinished of held job {job_id} ({'done' if is_done else 'busy'}): refused by " \
            f"{refused}, want one of {want}; A's errors {errors[a.pid][:20]}"
    # A's other errors: only its lock renewals of the held jobs (refused, or cut off by the partition)
    refusals = ("JobLockNotFound", "JobLockMismatch", "JobNotInState")
    others = [e for e in errors[a.pid] if not (e.split(":")[0] in refusals or "could not renew lock" in e)]
    assert not others, f"A's unexpected 'error' events: {others[:10]}"
    assert errors[b.pid] == [], f"B's 'error' events: {errors[b.pid][:10]}"
    # A recovered after the heal: it alone ran (and finished) every job added once B was gone
    late = {r["id"] for r in records["start"] if r["pid"] == a.pid and r["t0"] > t_b_gone}
    assert late == set(plan.ids[HELD + len(during):]), "A did not run the jobs added after the heal"
    assert all((job_id, a.pid) in fins for job_id in late)
    figures = check_runs(plan, states, records["start"], records["end"], {}, events, may_repeat=held,
                         fins=records["fin"], lags=records["lag"])
    report(f"\n{what}: partition {(t_heal - t_cut) / 1000:.1f}s (lock {LOCK_MS} ms), dropped {dropped}: "
           f"{figures.short()}; A's errors {len(errors[a.pid])}, B's {len(errors[b.pid])}; "
           f"A alone finished the last {len(after)} jobs in {took:.1f}s; A's errors: {sorted(set(errors[a.pid]))}")
    judge_lock_lost(figures, what)


# -- Redis ----------------------------------------------------------------------------------------------
class RedisSide(Side):
    refused_when_done = "JobLockNotFound"

    def __init__(self, server: RedisServer, link: NetnsLink, queue_name: str) -> None:
        self.host_url = server.url
        self.ns_url = f"redis://{link.host_ip}:{server.port}/0"
        self.queue_name = queue_name
        self.rec = f"rec:{queue_name}"
        self.client = aioredis.Redis.from_url(server.url, decode_responses=True)

    async def records(self) -> dict[str, list[dict[str, Any]]]:
        return {kind: await read_list(self.client, f"{self.rec}:{kind}s") for kind in ("start", "end", "fin", "lag")}

    async def states(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return await final_states(self.client, f"bull:{self.queue_name}:", ids)

    async def events(self) -> dict[str, Any]:
        return await finish_events(self.client, f"bull:{self.queue_name}:events")

    def worker(self, *, inside: bool, name: str, concurrency: int) -> list[str]:
        return worker_argv("tests.chaos_worker_proc", self.ns_url if inside else self.host_url, self.queue_name,
                           "--rec", self.rec, name=name, concurrency=concurrency)


async def test_redis_partition_longer_than_the_lock(queue_name: str) -> None:
    """Redis: the held jobs are re-run by B, A's late finishes refused, one completion each; A recovers."""
    with netns_link() as link:
        server = RedisServer(extra_args=("--bind", "127.0.0.1", link.host_ip, "--protected-mode", "no")).start()
        side = RedisSide(server, link, queue_name)
        queue = Queue(queue_name, connection=server.url)
        try:
            await partition_longer_than_the_lock(side, queue, link, the_plan(31), "redis partition")
        finally:
            await queue.close()
            await side.client.aclose()
            server.stop()


# -- PostgreSQL -----------------------------------------------------------------------------------------
class PostgresSide(Side):
    refused_when_done = "JobNotInState"

    def __init__(self, server: PostgresServer, link: NetnsLink, schema: str, queue_name: str, rec_dir: Path) -> None:
        self.host_url = server.url
        self.ns_url = f"postgresql://postgres@{link.host_ip}:{server.port}/postgres"
        self.schema = schema
        self.queue_name = queue_name
        self.rec_dir = rec_dir

    async def records(self) -> dict[str, list[dict[str, Any]]]:
        return read_run_records(self.rec_dir)

    async def states(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return await pg_final_states(self.host_url, self.schema, self.queue_name, ids)

    async def events(self) -> dict[str, Any]:
        return await pg_finish_events(self.host_url, self.schema, self.queue_name)

    def worker(self, *, inside: bool, name: str, concurrency: int) -> list[str]:
        return worker_argv("tests.pg_chaos_worker_proc", self.ns_url if inside else self.host_url, self.schema,
                           self.queue_name, "--rec", str(self.rec_dir), "--drain-delay", "1", name=name,
                           concurrency=concurrency)


async def test_postgres_partition_longer_than_the_lock(queue_name: str, tmp_path: Path) -> None:
    """PostgreSQL: the same, with A's late moveToFinished waiting in its socket through the partition."""
    with netns_link() as link:
        server = PostgresServer(listen=[link.host_ip], hba=pg_hba_for([str(link.subnet)])).start()
        schema = "partition"
        try:
            await migrate_postgres(server.url, schema)
            side = PostgresSide(server, link, schema, queue_name, tmp_path)
            queue = Queue(queue_name, connection=server.url, schema=schema)
            try:
                await partition_longer_than_the_lock(side, queue, link, the_plan(32), "postgres partition")
            finally:
                await queue.close()
        finally:
            server.stop()
