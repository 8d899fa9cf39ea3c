"""Per-group FIFO on PostgreSQL with Python workers (docs/groups.md, "On PostgreSQL"; the
invariants of ../shared/design/groups.md): our migration's triggers hold a group job in
upstream's ``waiting-children`` state while its group has no free slot and release the next one in
the transaction that finishes, fails or removes a job. No keeper runs in any of these tests
(``group_keeper=False``): the database releases.

Each test has a schema of its own, migrated with ``groups=True``. Handlers of the test's own event
loop record their runs in `tests.pg_group_helpers.Runs` (exact happens-before by a counter); the
many-worker test adds a worker process (tests/pg_chaos_worker_proc.py) and checks every run with
tests/chaos_helpers.py's `check_runs`. Crashes and a PostgreSQL restart with group jobs are in
tests/test_postgres_reliability.py. Node workers and producers: tests/test_interop_pg_groups.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import (
    GroupsNotInstalled,
    InvalidArgument,
    Queue,
    QueueEvents,
    SchemaMigrationRequired,
    Worker,
    drop_postgres_groups,
    migrate_postgres,
)
from tests.chaos_helpers import Plan, check_runs, now_ms
from tests.pg_chaos_worker_proc import make_handler
from tests.pg_group_helpers import (
    Runs,
    all_objects,
    by_group,
    final_states,
    finish_events,
    group_items,
    our_objects,
    pg_worker_proc,
    read_run_files,
    sql_rows,
    wait_for,
)


# -- fixtures and small helpers -------------------------------------------------------------------
@pytest.fixture
async def gschema(postgres_url: str, pg_schema: str) -> str:
    """`pg_schema` with Node's migrations and our group objects."""
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    return pg_schema


@pytest.fixture
async def queue(postgres_url: str, gschema: str, queue_name: str) -> AsyncIterator[Queue]:
    q = Queue(queue_name, connection=postgres_url, schema=gschema)
    try:
        yield q
    finally:
        await q.close()


@pytest.fixture
def pg(postgres_url: str, gschema: str) -> dict[str, Any]:
    """Queue/Worker connection keywords of the test's schema."""
    return {"connection": postgres_url, "schema": gschema}


@contextlib.asynccontextmanager
async def workers(pg: dict[str, Any], queue: Queue, process: Any, count: int = 1, **kwargs: Any
                  ) -> AsyncIterator[list[Worker]]:
    """``count`` Workers of ``queue`` (no keeper), closed on the way out."""
    kwargs.setdefault("drain_delay", 1)
    made = [Worker(queue.name, process, **pg, group_keeper=False, name=f"w{i}", **kwargs) for i in range(count)]
    tasks = [asyncio.ensure_future(w.run(handle_signals=False)) for w in made]
    try:
        await asyncio.sleep(0.05)
        for task in tasks:
            assert not task.done(), f"worker.run() ended at once: {task.exception() if task.done() else ''}"
        yield made
    finally:
        runs = getattr(process, "__self__", None)
        if isinstance(runs, Runs):  # a test that failed early: let held handlers end, so close() does not wait
            for gate in runs.gates.values():
                gate.set()
        for worker in made:
            await worker.close()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def state_of(queue: Queue, job_id: Any) -> str:
    return str(await queue.get_job_state(str(job_id)))


async def states(queue: Queue, jobs: list[Any]) -> list[str]:
    return [await state_of(queue, job.id) for job in jobs]


def all_in(queue: Queue, jobs: list[Any], *wanted: str) -> Any:
    async def check() -> bool:
        return all(s in wanted for s in await states(queue, jobs))
    return check


async def held(queue: Queue, gid: str) -> list[str]:
    return [str(job.id) for job in await queue.get_group_jobs(gid)]


def add(queue: Queue, gid: str, s: Any, **opts: Any) -> Any:
    """Add job ``s`` of group ``gid`` (data {"g", "s"} plus ``data=`` extras)."""
    extra = opts.pop("data", {})
    return queue.add(f"{gid}-{s}", {"g": gid, "s": s, **extra}, group=gid, **opts)


# -- invariants 1 and 2: one job of a group at a time, in add order, whoever runs it ----------------
async def test_three_workers_and_a_worker_process_run_each_group_one_at_a_time_in_add_order(
        postgres_url: str, gschema: str, pg: dict[str, Any], queue_name: str, tmp_path: Path) -> None:
    """620 jobs over 31 groups (20 each, interleaved; a tenth fail their first attempt), three
    in-process Workers at concurrency 4 and one in a process of its own, no keeper: no two jobs of
    a group overlap (a retry keeps its slot), each group starts in add order, every job completes
    once, and the process took part."""
    items = group_items(31, 20, ms=(2, 10), retry=0.1)
    plan = Plan(items, by_group(items))
    queue = Queue(queue_name, connection=postgres_url, schema=gschema)
    handler = make_handler(str(tmp_path))  # one record file for this process's three Workers
    proc = pg_worker_proc(postgres_url, gschema, queue_name, tmp_path, name="wp", concurrency=4)
    try:
        async with proc:
            t0 = time.monotonic()
            # one statement, before the in-process Workers start: concurrent bulk adds and finishes
            # of group jobs can deadlock (test_bulk_adds_of_group_jobs_do_not_deadlock_...)
            plan.ids = [str(j.id) for j in await queue.add_bulk(items)]
            async with workers(pg, queue, handler, 3, concurrency=4):

                async def all_done() -> bool:
                    return (await queue.get_job_counts("completed"))["completed"] >= len(items)

                async def progress() -> str:
                    return f"counts {await queue.get_job_counts()}, groups {(await queue.get_groups())[:3]}"
                await wait_for(all_done, 90, "every job to complete", progress)
                took = time.monotonic() - t0
        code = proc.proc.returncode if proc.proc is not None else None
        assert code == 0, f"the worker process ended with {code}: {await proc.stderr()}"
        starts, ends = read_run_files(tmp_path)
        states_ = await final_states(postgres_url, gschema, queue_name, plan.ids)
        events = await finish_events(postgres_url, gschema, queue_name)
        figures = check_runs(plan, states_, starts, ends, {}, events)
        print(f"postgres groups, 3 workers x 4 + a process x 4: {figures.short()} in {took:.1f}s; "
              f"by the process: {sum(1 for st in starts if st['pid'] == proc.pid)}")
        assert figures.completed == len(items) and figures.duplicates == 0
        assert figures.starts > len(items)  # the retries ran (and kept their group's slot: check_runs)
        by_pid = {st["pid"] for st in starts}
        assert proc.pid in by_pid and len(by_pid) == 2, f"runs by pids {by_pid}; the process is {proc.pid}"
        counts = await queue.get_job_counts()
        assert counts == {**{k: 0 for k in counts}, "completed": len(items)}
        assert await queue.get_groups() == []
    finally:
        await queue.close()


async def test_group_concurrency_three_runs_at_most_three_at_once_and_does_run_several(
        queue: Queue, pg: dict[str, Any]) -> None:
    """set_group_concurrency("g", 3) on a group with 12 jobs (11 of them held): three are released
    at once; under two Workers at concurrency 4 never more than 3 of the group run, at least two do
    at once, and the k-th start is one of the first k+2 jobs. A concurrency-1 group beside it still
    runs one at a time."""
    runs = Runs()
    jobs = [await add(queue, "g", s, data={"peers": 3, "total": 12, "ms": 20}) for s in range(12)]
    ones = [await add(queue, "one", s, data={"ms": 5}) for s in range(4)]
    assert await states(queue, jobs[:4]) == ["waiting"] + ["waiting-children"] * 3
    await queue.set_group_concurrency("g", 3)
    assert await queue.get_group_concurrency("g") == 3 and await queue.get_group_concurrency("one") == 1
    assert await states(queue, jobs[:4]) == ["waiting"] * 3 + ["waiting-children"]
    assert await queue.get_group_job_count("g") == 9
    async with workers(pg, queue, runs.process, 2, concurrency=4):
        await wait_for(all_in(queue, jobs + ones, "completed"), 60, "every job to complete")
    runs.check_group("g", k=3)
    runs.check_group("one", k=1)
    assert 2 <= runs.peak["g"] <= 3, runs.peak
    order = runs.started("g")
    assert sorted(order) == list(range(12))
    assert all(s <= i + 2 for i, s in enumerate(order)), order
    assert runs.started("one") == [0, 1, 2, 3]
    assert await queue.get_groups() == []


async def _gate_session(postgres_url: str, schema: str, mode: str = "") -> Any:
    """A session in a transaction on ``schema``, in gate mode ``mode`` ("group", "queue"; "": as its
    statements decide)."""
    import psycopg

    conn = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    await conn.execute(f'SET search_path TO "{schema}"')
    await conn.execute("BEGIN")
    if mode:
        await conn.execute("SELECT set_config('bullmq_compat.gate_mode', %s, true)", [mode])
    return conn


async def _waiting_for_a_lock(postgres_url: str, conn: Any) -> bool:
    pid = conn.info.backend_pid
    rows = await sql_rows(postgres_url, "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
    return bool(rows[0][0])


async def _blocked(postgres_url: str, conn: Any, statement: str, what: str) -> "asyncio.Future[Any]":
    """``statement`` started on ``conn``, once PostgreSQL shows it waiting for a lock."""
    running = asyncio.ensure_future(conn.execute(statement))
    await wait_for(lambda: _waiting_for_a_lock(postgres_url, conn), 30, what)
    assert not running.done()
    return running


async def test_group_locks_are_waited_for_in_one_order_and_a_lock_out_of_order_fails_at_once(
        postgres_url: str, gschema: str) -> None:
    """Finishes of different groups take per-group locks (they commit in parallel); a transaction
    waits only for a group after every group it holds, in (queue, group id) byte order; one out of
    order is only tried, and a busy one fails at once with SQLSTATE 40P01 rather than waiting (our
    client then runs its batch's calls one by one), so no cycle of waits can form."""
    import psycopg

    one = await _gate_session(postgres_url, gschema, "group")
    two = await _gate_session(postgres_url, gschema, "group")
    try:
        await one.execute("SELECT bullmq_compat_lock_group('q', 'b')")
        await asyncio.wait_for(two.execute("SELECT bullmq_compat_lock_group('q', 'a')"), 10)  # another group: no wait
        waiter = await _blocked(postgres_url, two, "SELECT bullmq_compat_lock_group('q', 'b')",  # in order: waits
                                "the in-order lock to wait")
        # out of order, busy: fails at once with our message (a wait would end in PostgreSQL's own
        # deadlock error, whose message is not this one)
        with pytest.raises(psycopg.errors.DeadlockDetected, match="'a' of queue 'q' is busy and comes before"):
            await one.execute("SELECT bullmq_compat_lock_group('q', 'a')")
        await one.execute("ROLLBACK")
        await asyncio.wait_for(waiter, 30)  # the waiter goes on
        await two.execute("SELECT bullmq_compat_lock_group('q', 'a')")  # held already: out of order is fine
    finally:
        await one.close()
        await two.close()


async def test_a_finish_whose_flow_parent_is_of_an_earlier_group_locks_the_parents_group_first(
        postgres_url: str, gschema: str) -> None:
    """A group job (group 'b') with a flow parent of group 'a' (as a Node producer can make): its
    finish takes 'a' before 'b', so upstream's move of the parent, in the same transaction, takes no
    lock out of order: with 'a' busy the finish waits for it instead of failing."""
    rows = [("P", "a", "waiting-children", 1, None), ("C", "b", "active", 0, "P")]
    for job_id, gid, state, deps, parent in rows:
        await sql_rows(postgres_url, f'INSERT INTO "{gschema}".job (queue, id, seq, name, state, opts, added_at_ms, '
                                     "pending_deps, parent_queue, parent_id) VALUES ('q', %s, nextval(%s), 'n', %s, "
                                     "%s::jsonb, 0, %s, %s, %s)",
                       [job_id, f"{gschema}.job_seq", state, f'{{"group": {{"id": "{gid}"}}}}', deps,
                        "q" if parent else None, parent])
    holder = await _gate_session(postgres_url, gschema, "group")
    finisher = await _gate_session(postgres_url, gschema, "group")
    try:
        await holder.execute("SELECT bullmq_compat_lock_group('q', 'a')")
        finish = await _blocked(postgres_url, finisher, "UPDATE job SET state = 'completed' WHERE queue = 'q' AND id = 'C'",
                                "the finish to wait for 'a'")
        await holder.execute("COMMIT")
        await asyncio.wait_for(finish, 30)
        # upstream's move of the parent: its group's lock is held already
        await finisher.execute("UPDATE job SET state = 'waiting', pending_deps = 0 WHERE queue = 'q' AND id = 'P'")
        await finisher.execute("COMMIT")
    finally:
        await holder.close()
        await finisher.close()
    assert await sql_rows(postgres_url, f'SELECT id, state FROM "{gschema}".job ORDER BY id') == [
        ("C", "completed"), ("P", "waiting")]


async def test_a_statement_of_several_jobs_takes_the_queues_whole_gate(postgres_url: str, gschema: str) -> None:
    """A statement that is not one of upstream's one-job calls (add_jobs_bulk, retry_jobs, drain, ours)
    waits for every group decision of the queue to commit, and then holds the queue's gate."""
    assert (await sql_rows(postgres_url, f'SELECT "{gschema}".bullmq_compat_one_job_statement()'))[0][0] is False
    assert (await sql_rows(postgres_url, f'SELECT "{gschema}".bullmq_compat_one_job_statement() '
                                         "-- as if it were SELECT add_job(...)"))[0][0] is True
    finisher = await _gate_session(postgres_url, gschema, "group")
    bulk = await _gate_session(postgres_url, gschema)
    other = await _gate_session(postgres_url, gschema, "group")
    try:
        await finisher.execute("SELECT bullmq_compat_lock_group('q', 'a')")
        waiter = await _blocked(postgres_url, bulk, "SELECT bullmq_compat_lock_group('q', 'z')", "the whole gate to wait")
        await finisher.execute("COMMIT")
        await asyncio.wait_for(waiter, 30)
        assert (await (await bulk.execute("SELECT current_setting('bullmq_compat.gate_mode')")).fetchone()) == (
            "queue",)
        blocked = await _blocked(postgres_url, other, "SELECT bullmq_compat_lock_group('q', 'b')",
                                 "a group decision to wait")
        await bulk.execute("COMMIT")
        await asyncio.wait_for(blocked, 30)
    finally:
        for conn in (finisher, bulk, other):
            await conn.close()


async def test_bulk_adds_of_group_jobs_do_not_deadlock_with_each_other(pg: dict[str, Any], queue_name: str) -> None:
    """Two producers add_bulk jobs of the same two groups at the same moment, in opposite orders
    (two services adding for the same users): both adds go through, and each group has one job
    released and the rest held. (Our insert trigger takes each group's lock row by row, in the
    batch's order, until the commit: two batches that meet two groups in opposite orders wait for
    each other, and PostgreSQL aborts one with "deadlock detected".)"""
    producers = [Queue(queue_name, **pg) for _ in range(2)]
    try:
        for q in producers:  # (each connected, and the queue's id sequence made, before the race)
            await q.add("warm-up", {})
        failures: list[str] = []
        rounds, size = 6, 1000  # (the first lock is held while the other 999 rows go in: the race is wide)
        for r in range(rounds):
            a, b = f"A{r}", f"B{r}"
            batches = [[{"name": "n", "data": {}, "opts": {"group": first}} for _ in range(size)]
                       + [{"name": "n", "data": {}, "opts": {"group": second}}] for first, second in ((a, b), (b, a))]
            results = await asyncio.gather(*(q.add_bulk(batch) for q, batch in zip(producers, batches)),
                                           return_exceptions=True)
            failures += [f"round {r}: {type(x).__name__}: {str(x).splitlines()[0]}" for x in results
                         if isinstance(x, BaseException)]
            if failures:
                break
        assert not failures, f"bulk adds failed: {failures}"
        groups = await producers[0].get_groups()
        assert groups == [{"id": g, "waiting": size, "running": 1, "paused": False, "concurrency": 1}
                          for g in sorted(f"{x}{r}" for r in range(rounds) for x in "AB")]
    finally:
        for q in producers:
            await q.close()


# -- order_ms and the ordering delay ----------------------------------------------------------------
async def test_held_jobs_run_in_order_ms_order_and_ties_keep_add_order(
        queue: Queue, pg: dict[str, Any]) -> None:
    runs = Runs()
    head = await add(queue, "G", "head")
    late = [await add(queue, "G", f"o{o}", order_ms=o) for o in (300, 200, 100)]
    tie = [await add(queue, "G", f"t{i}", order_ms=150) for i in range(2)]
    plain = await add(queue, "G", "plain")  # no order_ms: its place is its add time, after all of those
    want = [late[2].id, tie[0].id, tie[1].id, late[1].id, late[0].id, plain.id]
    assert await held(queue, "G") == [str(i) for i in want]
    assert await state_of(queue, head.id) == "waiting"
    stored = await queue.get_job(str(late[0].id))
    assert stored is not None and stored.opts["group"] == {"id": "G", "orderMs": 300}
    async with workers(pg, queue, runs.process, 1, concurrency=3):
        await wait_for(all_in(queue, [head, plain], "completed"), 30, "the group to drain")
    assert runs.started("G") == ["head", "o100", "t0", "t1", "o200", "o300", "plain"]
    runs.check_group("G")


async def test_the_ordering_delay_waits_out_a_window_and_a_late_earlier_job_takes_the_place_of_a_delayed_one(
        queue: Queue, pg: dict[str, Any]) -> None:
    """Ordering delay 1.5 s: job A (order_ms = now) waits in delayed until order_ms + 1.5 s; B, added
    later with an earlier order_ms, takes A's place (A goes back to held) and runs first; each
    starts no earlier than its order_ms + the delay. A job whose window has passed runs at once."""
    runs = Runs()
    delay = 1500
    await queue.set_group_ordering_delay(delay)
    assert await queue.get_group_ordering_delay() == delay and await queue.get_group_ordering_delay("G") == delay
    base = now_ms()
    a = await add(queue, "G", "A", order_ms=base)
    assert await state_of(queue, a.id) == "delayed"
    b = await add(queue, "G", "B", order_ms=base - 500)
    assert await state_of(queue, a.id) == "waiting-children"
    assert await state_of(queue, b.id) == "delayed"
    assert await held(queue, "G") == [str(a.id)]
    c = await add(queue, "G", "C", order_ms=base + 100)  # after both: held behind them
    assert await held(queue, "G") == [str(a.id), str(c.id)]
    # a group of its own delay, and one whose window has long passed
    await queue.set_group_options("H", ordering_delay_ms=0)
    assert await queue.get_group_ordering_delay("H") == 0
    h = await add(queue, "H", 0, order_ms=base)
    assert await state_of(queue, h.id) == "waiting"
    old = await add(queue, "I", 0, order_ms=base - 10 * delay)
    assert await state_of(queue, old.id) == "waiting"
    starts: dict[str, int] = {}

    async def process(job: Any) -> Any:
        starts[job.data["s"]] = now_ms()
        return await runs.process(job)

    async with workers(pg, queue, process, 1, concurrency=3):
        await wait_for(all_in(queue, [a, b, c, h, old], "completed"), 30, "every job to complete")
    assert runs.started("G") == ["B", "A", "C"]
    assert starts["B"] >= base - 500 + delay and starts["A"] >= base + delay and starts["C"] >= base + 100 + delay
    runs.check_group("G")


async def test_with_concurrency_two_an_earlier_job_takes_back_only_the_latest_delayed_job(queue: Queue) -> None:
    """Concurrency 2, a long ordering window: j30 and j20 wait out their windows in delayed (both
    slots); j10 arrives with an earlier order_ms: it takes the place of the latest one (j30, back
    to held), and j20 keeps its slot -- as the Redis gate does
    (tests/test_group_ordering.py::test_with_concurrency_two_an_earlier_job_takes_back_only_the_latest_delayed_job),
    so the group keeps running two at a time."""
    base = now_ms()
    await queue.set_group_options("K", ordering_delay_ms=60_000, concurrency=2)
    j30 = await add(queue, "K", 30, order_ms=base + 30)
    j20 = await add(queue, "K", 20, order_ms=base + 20)
    assert await states(queue, [j30, j20]) == ["delayed", "delayed"]
    j10 = await add(queue, "K", 10, order_ms=base + 10)
    assert await states(queue, [j10, j20, j30]) == ["delayed", "delayed", "waiting-children"]
    assert await held(queue, "K") == [str(j30.id)]
    assert await queue.get_groups() == [{"id": "K", "waiting": 1, "running": 2, "paused": False, "concurrency": 2}]


async def test_re_adding_an_existing_custom_id_changes_nothing_in_its_group(queue: Queue, pg: dict[str, Any]) -> None:
    """An add with the custom id of a job that exists returns that id and changes nothing (upstream's
    add skips it): not for a held job, and not for a released job waiting out its ordering window
    when the new add carries an earlier order_ms -- that one must stay released, or its group has
    no running job left to release it and is wedged (only sweep_groups() would free it)."""
    head = await add(queue, "G", 0, job_id="g-head")
    tail = await add(queue, "G", 1, job_id="g-tail")
    assert (await add(queue, "G", 9, job_id="g-tail")).id == "g-tail"
    assert (await add(queue, "G", 9, job_id="g-head", order_ms=0)).id == "g-head"
    assert await states(queue, [head, tail]) == ["waiting", "waiting-children"]
    assert await held(queue, "G") == ["g-tail"]

    await queue.set_group_options("W", ordering_delay_ms=1000)
    base = now_ms()
    a = await add(queue, "W", 0, job_id="w-a", order_ms=base)
    assert await state_of(queue, a.id) == "delayed"
    again = await add(queue, "W", 1, job_id="w-a", order_ms=base - 500)  # (its id is taken: not added)
    assert again.id == "w-a"
    again = (await queue.add_bulk([{"name": "W-1", "data": {"g": "W", "s": 1},
                                    "opts": {"group": "W", "jobId": "w-a", "order_ms": base - 500}}]))[0]
    assert again.id == "w-a"
    stored = await queue.get_job("w-a")
    assert stored is not None and stored.data["s"] == 0
    assert await state_of(queue, a.id) == "delayed", "the released job was taken back behind its gate by an add " \
        "that was not made: its group has nothing running to release it"
    runs = Runs()
    async with workers(pg, queue, runs.process, 1, concurrency=2):
        await wait_for(all_in(queue, [head, tail, a], "completed"), 30, "every job to complete")
    assert runs.started("W") == [0]


async def test_group_jobs_removed_on_complete_or_fail_release_their_group(queue: Queue, pg: dict[str, Any]) -> None:
    """A finish that deletes the job (removeOnComplete / removeOnFail) releases the next one as a
    finish that keeps it does."""
    runs = Runs()
    jobs = [await add(queue, "G", 0, remove_on_complete=True),
            await add(queue, "G", 1, remove_on_fail=True, data={"fail": "always"}),
            await add(queue, "G", 2, remove_on_complete=True),
            await add(queue, "G", 3)]
    async with workers(pg, queue, runs.process, 1, concurrency=3):
        await wait_for(lambda: _is(state_of(queue, jobs[3].id), "completed"), 30, "the group's last job")
    assert runs.started("G") == [0, 1, 2, 3]
    runs.check_group("G")
    assert [await queue.get_job(str(j.id)) for j in jobs[:3]] == [None, None, None]
    assert await queue.get_groups() == []


# -- pausing, listing, deleting ---------------------------------------------------------------------
async def test_pause_group_holds_its_jobs_while_others_run_and_resume_releases_them(
        queue: Queue, pg: dict[str, Any]) -> None:
    runs = Runs()
    p = [await add(queue, "P", s) for s in range(4)]
    q = [await add(queue, "Q", s) for s in range(3)]
    await queue.pause_group("P")  # P's s0 is released already: it still runs
    assert await queue.is_group_paused("P") and not await queue.is_group_paused("Q")
    async with workers(pg, queue, runs.process, 1, concurrency=4):
        await wait_for(all_in(queue, [p[0], *q], "completed"), 30, "P's first job and Q's jobs")
        await asyncio.sleep(1.0)  # (time for anything released to start: nothing of P may)
        assert sorted(runs.ids()) == sorted(str(j.id) for j in [p[0], *q])
        assert await states(queue, p[1:]) == ["waiting-children"] * 3
        assert await queue.get_groups("paused") == [
            {"id": "P", "waiting": 3, "running": 0, "paused": True, "concurrency": 1}]
        assert await queue.get_groups("running") == []
        await queue.resume_group("P")
        assert not await queue.is_group_paused("P")
        await wait_for(all_in(queue, p, "completed"), 30, "P's jobs after resume")
    assert runs.started("P") == [0, 1, 2, 3] and runs.started("Q") == [0, 1, 2]
    runs.check_group("P")
    assert await queue.get_groups() == []
    # paused before its first add: even that one is held, until resume
    await queue.pause_group("Z")
    z = await add(queue, "Z", 0)
    assert await state_of(queue, z.id) == "waiting-children"
    await queue.resume_group("Z")
    assert await state_of(queue, z.id) == "waiting"


async def test_groups_listing_counts_and_states_of_held_jobs(queue: Queue) -> None:
    x = [await add(queue, "X", s) for s in range(3)]
    await add(queue, "Y", 0)
    await queue.set_group_concurrency("W", 2)
    w = [await add(queue, "W", s) for s in range(3)]
    await queue.pause_group("V")
    await queue.add("plain", {})
    assert await queue.get_groups() == [
        {"id": "V", "waiting": 0, "running": 0, "paused": True, "concurrency": 1},
        {"id": "W", "waiting": 1, "running": 2, "paused": False, "concurrency": 2},
        {"id": "X", "waiting": 2, "running": 1, "paused": False, "concurrency": 1},
        {"id": "Y", "waiting": 0, "running": 1, "paused": False, "concurrency": 1},
    ]
    assert [g["id"] for g in await queue.get_groups("waiting")] == ["W", "X"]
    assert [g["id"] for g in await queue.get_groups("running")] == ["W", "X", "Y"]
    assert [g["id"] for g in await queue.get_groups("paused")] == ["V"]
    with pytest.raises(InvalidArgument, match="status"):
        await queue.get_groups("bogus")
    assert await held(queue, "X") == [str(x[1].id), str(x[2].id)]
    assert [str(j.id) for j in await queue.get_group_jobs("X", 1, 1)] == [str(x[2].id)]
    assert await held(queue, "W") == [str(w[2].id)]
    assert await queue.get_group_job_count("X") == 2 and await queue.get_group_job_count("Y") == 0
    counts = await queue.get_job_counts()
    assert counts == {**{k: 0 for k in counts}, "waiting": 5, "waiting-children": 3}
    job = await queue.get_job(str(x[1].id))
    assert job is not None and await job.get_state() == "waiting-children"
    assert job.opts["group"] == {"id": "X"}
    assert sorted(str(j.id) for j in await queue.get_jobs(["waiting-children"])) == sorted(
        str(j.id) for j in (x[1], x[2], w[2]))


async def test_delete_group_jobs_removes_the_held_ones_the_running_job_finishes_and_the_group_goes_on(
        queue: Queue, pg: dict[str, Any]) -> None:
    runs = Runs()
    d = [await add(queue, "D", s, data={"hold": "d0"} if s == 0 else {}) for s in range(4)]
    e = [await add(queue, "E", s) for s in range(3)]
    await queue.pause_group("E")  # E's released head runs; its held ones stay
    async with workers(pg, queue, runs.process, 1, concurrency=3):
        await wait_for(lambda: _is(state_of(queue, d[0].id), "active"), 30, "D's first job to run")
        assert await queue.delete_group_jobs("D") == 3
        for job in d[1:]:
            assert await queue.get_job(str(job.id)) is None
        assert await state_of(queue, d[0].id) == "active"
        assert await queue.get_group_job_count("E") == 2  # another group's held jobs are left
        assert await queue.delete_group_jobs("D") == 0
        later = await add(queue, "D", 4)
        assert await state_of(queue, later.id) == "waiting-children"  # D's running job still holds the slot
        runs.gate("d0").set()
        await wait_for(all_in(queue, [d[0], later, e[0]], "completed"), 30, "D's running and later jobs")
    assert runs.started("D") == [0, 4]
    runs.check_group("D")
    assert await held(queue, "E") == [str(j.id) for j in e[1:]]


async def _is(value: Any, wanted: Any) -> bool:
    return bool(await value == wanted)


async def test_drain_and_clean_of_waiting_heads_release_each_groups_next_job(
        queue: Queue, pg: dict[str, Any]) -> None:
    """drain() and clean(type="wait") remove the groups' waiting heads: the next job of each group
    is released in the same statement (none is stranded, the groups go on in order). (Upstream's
    PostgreSQL clean knows no "waiting-children": held jobs are not cleaned.)"""
    runs = Runs()
    a = [await add(queue, "A", s) for s in range(3)]
    b = [await add(queue, "B", s) for s in range(2)]
    await queue.drain()
    assert await queue.get_job(str(a[0].id)) is None and await queue.get_job(str(b[0].id)) is None
    assert await states(queue, [a[1], a[2], b[1]]) == ["waiting", "waiting-children", "waiting"]
    c = [await add(queue, "C", s) for s in range(3)]
    assert await queue.clean(0, 0, "waiting-children") == []
    assert await states(queue, c) == ["waiting", "waiting-children", "waiting-children"]
    cleaned = await queue.clean(0, 0, "wait")
    assert sorted(cleaned) == sorted(str(j.id) for j in (a[1], b[1], c[0]))
    assert await states(queue, [a[2], c[1], c[2]]) == ["waiting", "waiting", "waiting-children"]
    assert await queue.get_groups() == [
        {"id": "A", "waiting": 0, "running": 1, "paused": False, "concurrency": 1},
        {"id": "C", "waiting": 1, "running": 1, "paused": False, "concurrency": 1}]
    async with workers(pg, queue, runs.process, 1, concurrency=3):
        await wait_for(all_in(queue, [a[2], c[1], c[2]], "completed"), 30, "what is left to run")
    assert runs.started("A") == [2] and runs.started("C") == [1, 2]
    runs.check_group("C")


# -- invariant 3: failures and removals do not block a group; retries go back behind the gate ---------
async def test_a_job_failing_for_good_does_not_block_its_group_and_its_retries_keep_the_slot(
        queue: Queue, pg: dict[str, Any]) -> None:
    runs = Runs()
    f = [await add(queue, "F", 0, data={"fail": "always"}),
         await add(queue, "F", 1, data={"fail": "retry"}, attempts=3, backoff={"type": "fixed", "delay": 200}),
         await add(queue, "F", 2), await add(queue, "F", 3)]
    async with workers(pg, queue, runs.process, 2, concurrency=3):
        await wait_for(all_in(queue, f[1:], "completed"), 30, "the group to go on")
    assert await state_of(queue, f[0].id) == "failed"
    assert runs.started("F") == [0, 1, 1, 2, 3]  # s2 waited for s1's retry (the slot is kept)
    runs.check_group("F")
    assert await queue.get_groups() == []


async def test_removing_a_held_or_a_released_job_removes_only_it_and_the_group_goes_on(
        queue: Queue, pg: dict[str, Any]) -> None:
    runs = Runs()
    r = [await add(queue, "R", s) for s in range(4)]
    other = await add(queue, "S", 0)
    assert await queue.remove(str(r[1].id)) == 1  # a held one
    assert await queue.get_job(str(r[1].id)) is None
    assert await held(queue, "R") == [str(r[2].id), str(r[3].id)]
    assert await states(queue, [r[0], r[2], r[3], other]) == ["waiting", "waiting-children", "waiting-children",
                                                             "waiting"]
    assert await queue.remove(str(r[0].id)) == 1  # the released head: the next one is released at once
    assert await queue.get_job(str(r[0].id)) is None
    assert await states(queue, [r[2], r[3]]) == ["waiting", "waiting-children"]
    assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 2, "waiting-children": 1}
    async with workers(pg, queue, runs.process, 1, concurrency=2):
        await wait_for(all_in(queue, [r[2], r[3], other], "completed"), 30, "the rest to run")
    assert runs.started("R") == [2, 3]
    runs.check_group("R")


async def test_retrying_a_failed_group_job_while_its_group_runs_holds_it_and_it_runs_in_its_place(
        queue: Queue, pg: dict[str, Any]) -> None:
    """s0 fails for good and s1 starts; job.retry() on s0 meanwhile: s0 is held (waiting-children),
    not beside s1; when s1 ends s0 runs before s2 (its place is its add order); queue.retry_jobs()
    on a failed job of a busy group holds it too."""
    runs = Runs()
    r = [await add(queue, "R", 0, data={"fail": "once"}), await add(queue, "R", 1, data={"hold": "r1"}),
         await add(queue, "R", 2)]
    async with workers(pg, queue, runs.process, 1, concurrency=3):
        await wait_for(lambda: _is(state_of(queue, r[1].id), "active"), 30, "s1 to start")
        assert await state_of(queue, r[0].id) == "failed"
        failed = await queue.get_job(str(r[0].id))
        assert failed is not None
        await failed.retry()
        assert await state_of(queue, r[0].id) == "waiting-children"
        assert await held(queue, "R") == [str(r[0].id), str(r[2].id)]
        runs.gate("r1").set()
        await wait_for(all_in(queue, r, "completed"), 30, "the group to drain")
    assert runs.started("R") == [0, 1, 0, 2]
    runs.check_group("R")

    # queue.retry_jobs() of a failed job while its group runs another one
    t = [await add(queue, "T", 0, data={"fail": "once"}), await add(queue, "T", 1, data={"hold": "t1"})]
    async with workers(pg, queue, runs.process, 1, concurrency=2):
        await wait_for(lambda: _is(state_of(queue, t[1].id), "active"), 30, "T's s1 to start")
        await queue.retry_jobs(state="failed")
        assert await state_of(queue, t[0].id) == "waiting-children"
        runs.gate("t1").set()
        async def progress() -> str:
            return f"runs {[(r.s, r.attempt) for r in runs.runs if r.g == 'T']} states {await states(queue, t)}"
        await wait_for(all_in(queue, t, "completed"), 30, "T to drain", progress)
    assert runs.started("T") == [0, 1, 0]
    runs.check_group("T")


# -- deduplication ----------------------------------------------------------------------------------
async def test_a_deduplicated_group_add_returns_the_first_job_and_adds_nothing(queue: Queue) -> None:
    head = await add(queue, "G", 0, deduplication={"id": "h"})
    first = await add(queue, "G", 1, deduplication={"id": "k"})
    again = await add(queue, "G", 2, deduplication={"id": "k"})
    assert again.id == first.id
    assert (await add(queue, "G", 3, deduplication={"id": "h"})).id == head.id  # the released one's id
    assert await held(queue, "G") == [str(first.id)]
    stored = await queue.get_job(str(first.id))
    assert stored is not None and stored.data["s"] == 1
    assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 1}
    assert await queue.get_deduplication_job_id("k") == str(first.id)


async def test_keep_last_if_active_creates_the_kept_job_behind_the_gate_after_the_active_one(
        queue: Queue, pg: dict[str, Any]) -> None:
    """Five keepLastIfActive adds while the id's job runs: each returns the active job's id; when it
    ends, upstream's finish creates one job with the last add's data, and our insert trigger holds
    it behind the group's job added in between (never beside another job of the group)."""
    keep = {"id": "k", "keep_last_if_active": True}
    runs = Runs()
    first = await add(queue, "G", 0, deduplication=keep, data={"hold": "first"})
    async with workers(pg, queue, runs.process, 1, concurrency=4):
        await wait_for(lambda: _is(state_of(queue, first.id), "active"), 30, "the first job to start")
        mid = await add(queue, "G", 1, data={"hold": "mid"})
        ids = [str((await add(queue, "G", 2, deduplication=keep, data={"v": v})).id) for v in range(1, 6)]
        assert ids == [str(first.id)] * 5
        assert await state_of(queue, first.id) == "active"  # (the bound of this test)
        assert await queue.get_job_counts("waiting-children") == {"waiting-children": 1}
        assert await state_of(queue, mid.id) == "waiting-children"  # the only held one
        assert await queue.get_deduplication_job_id("k") == str(first.id)
        runs.gate("first").set()
        await wait_for(lambda: _is(state_of(queue, mid.id), "active"), 30, "the job added in between to start")
        kept_id = await queue.get_deduplication_job_id("k")  # the kept job, made by the finish
        assert kept_id not in (None, str(first.id)), kept_id
        assert await state_of(queue, kept_id) == "waiting-children"  # behind the gate, not beside mid
        assert await held(queue, "G") == [kept_id]
        runs.gate("mid").set()
        await wait_for(lambda: _count_is(queue, "completed", 3), 30, "three jobs to complete")
        await wait_for(lambda: _groups_empty(queue), 30, "the group to drain")
    assert runs.started("G") == [0, 1, 2]
    runs.check_group("G")
    kept = [r for r in runs.runs if r.s == 2]
    assert len(kept) == 1 and kept[0].data["v"] == 5
    job = await queue.get_job(kept[0].id)
    assert job is not None and job.opts["group"] == {"id": "G"}
    counts = await queue.get_job_counts()
    assert counts == {**{k: 0 for k in counts}, "completed": 3}


async def _count_is(queue: Queue, state: str, n: int) -> bool:
    return bool((await queue.get_job_counts(state))[state] >= n)


async def _groups_empty(queue: Queue) -> bool:
    return await queue.get_groups() == []


# -- batches ------------------------------------------------------------------------------------------
async def test_a_batch_worker_with_group_affinity_takes_a_groups_held_jobs_in_order(
        queue: Queue, pg: dict[str, Any]) -> None:
    """Three groups of six: a batch (size 4, group_affinity) whose first job is a group's takes that
    group's next held jobs, in group order, and nothing else of the group runs meanwhile; a plain
    worker that joins later never runs a job of a group beside its batch."""
    runs = Runs()
    jobs = [await add(queue, gid, s, data={"ms": 5}) for s in range(6) for gid in "ABC"]
    async with workers(pg, queue, runs.process_batch, 1, batch={"size": 4, "group_affinity": True}):
        await wait_for(lambda: _true(len(runs.batches) >= 1), 30, "a first batch")
        async with workers(pg, queue, runs.process, 1, concurrency=3):
            await wait_for(all_in(queue, jobs, "completed"), 60, "every job to complete")
    first = runs.batches[0]
    assert len(first) == 4 and [s for _, s in first] == [0, 1, 2, 3], runs.batches
    for batch in runs.batches:
        assert len({g for g, _ in batch}) == 1, batch
        steps = [s for _, s in batch]
        assert steps == list(range(steps[0], steps[0] + len(steps))), batch
    for gid in "ABC":
        assert runs.started(gid) == list(range(6))
        runs.check_group(gid)
    assert await queue.get_groups() == []


async def _true(value: bool) -> bool:
    return value


# -- events -------------------------------------------------------------------------------------------
async def test_queue_events_report_a_held_add_as_waiting_children_and_its_release_as_waiting(
        queue: Queue, pg: dict[str, Any], postgres_url: str, gschema: str) -> None:
    seen: list[tuple[str, str, Any]] = []
    events = QueueEvents(queue.name, postgres_url, schema=gschema, blocking_timeout=5000)
    for name in ("waiting", "waiting-children", "active", "completed"):
        events.on(name, lambda args, *_, name=name: seen.append((name, args["jobId"], args.get("prev"))))
    runs = Runs()
    try:
        await events.wait_until_ready()
        head = await add(queue, "G", 0, data={"hold": "head"})
        tail = await add(queue, "G", 1)
        plain = await queue.add("plain", {})

        def kinds(job: Any) -> list[str]:
            return [k for k, job_id, _ in seen if job_id == str(job.id)]
        await wait_for(lambda: _true(len(kinds(tail)) >= 1 and len(kinds(plain)) >= 1), 30, "the add events")
        assert kinds(head) == ["waiting"] and kinds(tail) == ["waiting-children"] and kinds(plain) == ["waiting"]
        async with workers(pg, queue, runs.process, 1, concurrency=2):
            await wait_for(lambda: _is(state_of(queue, head.id), "active"), 30, "the head to start")
            runs.gate("head").set()
            await wait_for(lambda: _true("completed" in kinds(tail)), 30, "the tail's completed event")
        assert kinds(tail) == ["waiting-children", "waiting", "active", "completed"], seen
        release = next(prev for k, job_id, prev in seen if job_id == str(tail.id) and k == "waiting")
        assert release == "waiting-children"
    finally:
        await events.close()


async def test_plain_jobs_pay_one_key_test_per_trigger_and_held_adds_events_are_rewritten_at_commit(
        queue: Queue, postgres_url: str, gschema: str) -> None:
    """Our triggers on `job` test only the group key (a longer WHEN is compiled again on every
    statement, a plain job's too), none is on `event`; the 'waiting' event of an add the gate held
    or sent to its ordering window reads 'waiting-children' / 'delayed' (with the due time) once
    committed, and the note of it is gone."""
    whens = await sql_rows(postgres_url, """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %s AND t.tgname LIKE 'bullmq_compat%%' ORDER BY 2""", [gschema])
    on_job = [(name, definition) for rel, name, definition in whens if rel == "job"]
    assert len(on_job) == 3 and all(rel in ("job", "bullmq_compat_gated") for rel, _, _ in whens), whens
    for name, definition in on_job:
        assert definition.split(" WHEN ")[1].split(" EXECUTE ")[0] in (
            "((new.opts ? 'group'::text))", "((old.opts ? 'group'::text))"), definition
    await queue.set_group_options("W", ordering_delay_ms=60_000)
    head = await add(queue, "G", 0)
    tail = await add(queue, "G", 1)
    windowed = await add(queue, "W", 0, order_ms=now_ms())
    plain = await queue.add("plain", {})
    events = await sql_rows(postgres_url, f'SELECT event, data FROM "{gschema}".event WHERE queue = %s '
                                          "AND event IN ('waiting', 'waiting-children', 'delayed') ORDER BY id",
                            [queue.name])
    by_job = {str(data["jobId"]): (event, data) for event, data in events}
    assert [by_job[str(j.id)][0] for j in (head, tail, windowed, plain)] == [
        "waiting", "waiting-children", "delayed", "waiting"], events
    assert len(events) == 4, events
    assert "delay" not in by_job[str(tail.id)][1]
    due = await sql_rows(postgres_url, f'SELECT process_at_ms FROM "{gschema}".job WHERE queue = %s AND id = %s',
                         [queue.name, str(windowed.id)])
    assert by_job[str(windowed.id)][1]["delay"] == due[0][0] >= now_ms() + 50_000
    assert await sql_rows(postgres_url, f'SELECT * FROM "{gschema}".bullmq_compat_gated') == []


async def test_a_schema_missing_one_of_our_triggers_is_installed_again(postgres_url: str, gschema: str) -> None:
    """(an early build's schema had a trigger on `event` where the deferred one now is)"""
    await sql_rows(postgres_url, f'DROP TRIGGER bullmq_compat_gated_events ON "{gschema}".bullmq_compat_gated')
    assert len((await our_objects(postgres_url, gschema))["triggers"]) == 3
    await migrate_postgres(postgres_url, gschema, groups=True)
    assert "bullmq_compat_gated_events" in (await our_objects(postgres_url, gschema))["triggers"]


# -- the migration ------------------------------------------------------------------------------------
async def test_installing_twice_is_a_no_op_and_install_refuses_a_schema_node_has_not_migrated(
        postgres_url: str, pg_schema: str) -> None:
    from bullmq_compat._backends.postgres.connection import session
    from bullmq_compat._backends.postgres.groups import install_groups

    # not migrated by Node: no migration ledger (a schema that is not there, then an empty one)
    for create in (False, True):
        if create:
            await sql_rows(postgres_url, f'CREATE SCHEMA "{pg_schema}"')  # (a DDL answers no rows)
        async with session(postgres_url) as conn:
            with pytest.raises(SchemaMigrationRequired, match="migrate it first") as info:
                await install_groups(conn, pg_schema)
        assert pg_schema in str(info.value) and "groups=True" in str(info.value)
        assert (await our_objects(postgres_url, pg_schema)) == {"functions": [], "relations": [], "triggers": []}

    assert await migrate_postgres(postgres_url, pg_schema, groups=True) == 11
    ours = await our_objects(postgres_url, pg_schema)
    assert len(ours["triggers"]) == 4 and "bullmq_compat_group" in ours["relations"]
    assert "bullmq_compat_take_group_jobs" in ours["functions"]
    before = await all_objects(postgres_url, pg_schema)
    ledger = await sql_rows(postgres_url, f'SELECT version, name, applied_at FROM "{pg_schema}".bullmq_compat_migration')
    assert [(v, n) for v, n, _ in ledger] == [(1, "0001_group_gate"), (2, "0002_group_max_size"), (3, "0003_group_priority"),
        (4, "0004_group_rate_limit"), (5, "0005_group_start_clock"), (6, "0006_group_release_statement")]
    assert await migrate_postgres(postgres_url, pg_schema, groups=True) == 11
    assert await all_objects(postgres_url, pg_schema) == before  # nothing dropped and made again
    assert await sql_rows(postgres_url, f'SELECT version, name, applied_at FROM "{pg_schema}".bullmq_compat_migration'
                          ) == ledger


async def test_drop_releases_held_jobs_and_leaves_upstreams_objects_as_node_made_them(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    await migrate_postgres(postgres_url, pg_schema)
    node_only = await all_objects(postgres_url, pg_schema)
    node_ledger = await sql_rows(postgres_url, f'SELECT * FROM "{pg_schema}".migration ORDER BY 1')
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    async with contextlib.AsyncExitStack() as stack:
        queue = Queue(queue_name, connection=postgres_url, schema=pg_schema)
        stack.push_async_callback(queue.close)
        jobs = [await add(queue, "G", s) for s in range(3)]
        await queue.set_group_concurrency("H", 2)
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 2}
    assert await drop_postgres_groups(postgres_url, pg_schema) == 2
    assert await our_objects(postgres_url, pg_schema) == {"functions": [], "relations": [], "triggers": []}
    assert await all_objects(postgres_url, pg_schema) == node_only
    assert await sql_rows(postgres_url, f'SELECT * FROM "{pg_schema}".migration ORDER BY 1') == node_ledger
    assert await drop_postgres_groups(postgres_url, pg_schema) == 0  # nothing left to drop
    runs = Runs()
    queue = Queue(queue_name, connection=postgres_url, schema=pg_schema)  # (a fresh one: nothing cached)
    try:
        assert await states(queue, jobs) == ["waiting"] * 3
        plain = await queue.add("plain", {"g": None, "s": "plain"})
        with pytest.raises(GroupsNotInstalled, match="groups=True"):
            await add(queue, "G", 9)
        with pytest.raises(GroupsNotInstalled):
            await queue.get_groups()
        pg = {"connection": postgres_url, "schema": pg_schema}
        async with workers(pg, queue, runs.process, 1, concurrency=2):
            await wait_for(all_in(queue, [*jobs, plain], "completed"), 30, "the jobs without the gate")
        assert sorted(runs.started("G")) == [0, 1, 2]
    finally:
        await queue.close()


async def test_obliterating_a_queue_with_held_jobs_removes_them_and_our_settings_of_that_queue_only(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    other_name = f"{queue_name}-other"
    async with contextlib.AsyncExitStack() as stack:
        queue = Queue(queue_name, connection=postgres_url, schema=gschema)
        other = Queue(other_name, connection=postgres_url, schema=gschema)
        stack.push_async_callback(queue.close)
        stack.push_async_callback(other.close)
        for q in (queue, other):
            for s in range(3):
                await add(q, "G", s)
            await q.set_group_concurrency("G", 1)
            await q.set_group_concurrency("H", 2)
            await q.set_default_group_concurrency(1)
            await q.set_group_ordering_delay(10)
            await q.pause_group("P")

        async def settings(name: str) -> tuple[int, int]:
            groups = await sql_rows(postgres_url, f'SELECT count(*) FROM "{gschema}".bullmq_compat_group '
                                                  "WHERE queue = %s", [name])
            queues = await sql_rows(postgres_url, f'SELECT count(*) FROM "{gschema}".bullmq_compat_group_queue '
                                                  "WHERE queue = %s", [name])
            return int(groups[0][0]), int(queues[0][0])
        assert await settings(queue_name) == (3, 1) and await settings(other_name) == (3, 1)
        await queue.obliterate()
        assert await sql_rows(postgres_url, f'SELECT count(*) FROM "{gschema}".job WHERE queue = %s',
                              [queue_name]) == [(0,)]
        assert await settings(queue_name) == (0, 0)
        assert await settings(other_name) == (3, 1)
        assert await other.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 2}
        # the obliterated queue starts afresh: default settings, its first job released
        await queue.resume()
        fresh = await add(queue, "G", 0)
        assert await state_of(queue, fresh.id) == "waiting"
        assert await queue.get_group_concurrency("H") == 1 and not await queue.is_group_paused("P")
