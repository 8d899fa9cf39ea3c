"""Group rate limits on PostgreSQL (issue #28 section 1; docs/groups.md, "Group rate limits"):
our triggers release a rate-limited group's next job to 'delayed' with its due time, inside the
transaction that ends the turn of the one before, so Python workers and unmodified Node workers
(interop/pg_groups.js, no keeper) honour it alike.

Checked as on Redis (tests/test_group_rate_limit.py): per group, no window of `duration` ms holds
more than `max` starts, by each job's processed_at_ms (the start its worker wrote), and by the
recorder's database clock reading at the processor's start with a slack.
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

import pytest

from bullmq_compat import GroupsNotInstalled, InvalidArgument, Queue, Worker, drop_postgres_groups, migrate_postgres
from tests.group_helpers import check_groups, now_ms
from tests.pg_group_helpers import our_objects, wait_for
from tests.pg_group_interop_helpers import (
    create_recorder,
    finished_count,
    node_group_workers,
    python_workers,
    read_runs,
    sql,
)
from tests.test_group_rate_limit import assert_rate, items, t0_slack


@pytest.fixture
async def gschema(postgres_url: str, pg_schema: str) -> str:
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    await create_recorder(postgres_url, pg_schema)
    return pg_schema


async def processed_on(url: str, schema: str, queue: str) -> dict[str, int]:
    rows = await sql(url, schema, "SELECT id, processed_at_ms FROM job WHERE queue = %(q)s", {"q": queue})
    return {str(job_id): int(p) for job_id, p in rows if p is not None}


async def check_rates(url: str, schema: str, queue: str, starts: Sequence[Mapping[str, Any]],
                      limits: Mapping[str, tuple[int, int]]) -> dict[str, list[int]]:
    """Per limited group: the window rule on processed_at_ms and (with a slack) on the recorder's t0."""
    started = await processed_on(url, schema, queue)
    by_group: dict[str, list[int]] = {}
    for g, (max_jobs, duration) in limits.items():
        mine = [s for s in starts if s["g"] == g]
        assert_rate(sorted(started[s["id"]] for s in mine), max_jobs, duration, f"group {g} (processed_at_ms)")
        assert_rate(sorted(s["t0"] for s in mine), max_jobs, duration, f"group {g} (t0)", t0_slack(duration))
    for s in starts:
        by_group.setdefault(s["g"], []).append(started[s["id"]])
    return {g: sorted(v) for g, v in by_group.items()}


async def wait_finished(url: str, schema: str, queue: str, count: int, timeout: float = 90) -> None:
    async def done() -> bool:
        return await finished_count(url, schema, queue) >= count

    await wait_for(done, timeout, f"{count} finished runs")


async def test_settings_bad_values_and_the_sync_shape(postgres_url: str, gschema: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        with pytest.raises(InvalidArgument, match="max=0 must be an int"):
            await queue.set_group_rate_limit("A", max=0, duration=10)
        with pytest.raises(InvalidArgument, match="duration=1.5 must be an int"):
            await queue.set_default_group_rate_limit(max=1, duration=1.5)
        assert await queue.get_group_rate_limit("A") is None
        await queue.set_default_group_rate_limit(max=10, duration=1000)
        await queue.set_group_rate_limit("A", max=2, duration=500)
        assert await queue.get_group_rate_limit() == {"max": 10, "duration": 1000}
        assert await queue.get_group_rate_limit("A") == {"max": 2, "duration": 500}
        assert await queue.get_group_rate_limit("B") == {"max": 10, "duration": 1000}
        await queue.set_group_concurrency("A", 2)
        await queue.set_group_concurrency("A", 1)  # (the group's row stays: it has a rate limit)
        assert await queue.get_group_rate_limit("A") == {"max": 2, "duration": 500}
        await queue.remove_group_rate_limit("A")
        assert await queue.get_group_rate_limit("A") == {"max": 10, "duration": 1000}
        await queue.remove_default_group_rate_limit()
        assert await queue.get_group_rate_limit("A") is None
        assert await queue.get_group_rate_limit_ttl("A") == 0


async def test_a_limited_groups_next_job_is_delayed_until_its_due_time(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_rate_limit("A", max=1, duration=60_000)
        first = await queue.add("rl", {"g": "A", "s": 0}, group="A")
        second = await queue.add("rl", {"g": "A", "s": 1}, group="A")
        third = await queue.add("rl", {"g": "A", "s": 2}, group="A")
        async with python_workers(postgres_url, gschema, queue_name, 1, group_keeper=False):
            async def second_delayed() -> bool:
                return bool(await queue.get_job_state(second.id) == "delayed")
            await wait_for(second_delayed, 30, "the second job delayed")
        started = (await queue.get_job(first.id)).processed_on
        [(due,)] = await sql(postgres_url, gschema, "SELECT process_at_ms FROM job WHERE queue = %(q)s AND id = %(id)s",
                             {"q": queue_name, "id": second.id})
        assert due == started + 60_000
        assert [j.id for j in await queue.get_delayed()] == [second.id]
        assert await queue.get_job_state(third.id) == "waiting-children"
        ttl = await queue.get_group_rate_limit_ttl("A")
        assert 0 < ttl <= 60_000
        groups = await queue.get_groups()
        assert [(g["id"], g["rate_limit"]) for g in groups] == [("A", {"max": 1, "duration": 60_000})]
        assert 0 < groups[0]["rate_limit_ttl"] <= 60_000


async def test_python_workers_keep_limits_with_group_concurrency_and_others_run_freely(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    groups = {"A": 7, "B": 10, "free": 12}
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_rate_limit("A", max=2, duration=700)
        await queue.set_group_rate_limit("B", max=3, duration=800)
        await queue.set_group_concurrency("B", 2)
        await queue.add_bulk(items(groups, sleep_ms=5))
        async with python_workers(postgres_url, gschema, queue_name, 2, concurrency=4, group_keeper=False):
            await wait_finished(postgres_url, gschema, queue_name, sum(groups.values()))
        ends, starts = await read_runs(postgres_url, gschema, queue_name)
        check_groups(ends, starts, groups, k=2)
        for g in ("A", "free"):
            assert [s["s"] for s in starts if s["g"] == g] == list(range(groups[g])), g
        by_p = await check_rates(postgres_url, gschema, queue_name, starts, {"A": (2, 700), "B": (3, 800)})
        assert by_p["free"][-1] < by_p["A"][-1] and by_p["free"][-1] < by_p["B"][-1]


async def test_node_workers_honour_group_rate_limits_without_a_keeper(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    groups = {"A": 6, "B": 6, "free": 10}
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_default_group_rate_limit(max=2, duration=700)
        await queue.set_group_rate_limit("free", max=1000, duration=1)
        await queue.add_bulk(items(groups, sleep_ms=2))
        async with node_group_workers(postgres_url, gschema, queue_name, workers=2, concurrency=4, drainDelay=1):
            await wait_finished(postgres_url, gschema, queue_name, sum(groups.values()))
        ends, starts = await read_runs(postgres_url, gschema, queue_name)
        assert {s["w"] for s in starts} == {"node"}
        check_groups(ends, starts, groups)
        by_p = await check_rates(postgres_url, gschema, queue_name, starts, {"A": (2, 700), "B": (2, 700)})
        assert by_p["free"][-1] < by_p["A"][-1]


async def test_a_start_sent_late_is_stamped_on_the_databases_clock_so_the_window_holds(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    """A worker's "now" is its own clock when it sent the call (Node's Date.now(), ours alike): on a
    busy machine the database runs the call later. Here a fused finish-and-fetch (upstream's
    move_to_completed_fetch, as a Node worker sends it) of A's first job reaches the database 500 ms
    after its "now" was taken, when the group's 400 ms window has passed: the gate releases A's
    second job and the same call starts it. Its processed_at_ms is not the stale "now" (which would
    put both starts 100 ms apart, inside the window) but the database's clock (a version-4 schema
    recorded the stale one: this fails there)."""
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_rate_limit("A", max=1, duration=400)
        first = await queue.add("rl", {"s": 0}, group="A")
        second = await queue.add("rl", {"s": 1}, group="A")
        assert await queue.get_job_state(second.id) == "waiting-children"
    claim = ("SELECT id, processed_at_ms FROM move_to_active(%(q)s, 'tok-1', 30000, %(now)s, 'late', NULL, NULL)")
    started = now_ms()
    ((job_id, t1),) = await sql(postgres_url, gschema, claim, {"q": queue_name, "now": started})
    assert job_id == first.id and started <= t1 <= now_ms()
    await asyncio.sleep(0.5)
    stale = t1 + 100
    rows = await sql(postgres_url, gschema, "SELECT id, processed_at_ms FROM move_to_completed_fetch(%(q)s, %(id)s, "
                     "'tok-1', '1'::jsonb, %(now)s, false, NULL, NULL, 30000, %(now)s, 'late', NULL, NULL)",
                     {"q": queue_name, "id": first.id, "now": stale})
    assert [r[0] for r in rows] == [second.id]  # released (the window is over on the database's clock) and taken
    t2 = rows[0][1]
    assert t2 - t1 >= 400, f"the second start recorded {t2 - t1} ms after the first (limit 1 per 400 ms)"
    assert t2 <= now_ms()
    assert (await processed_on(postgres_url, gschema, queue_name))[second.id] == t2


async def test_rate_limit_group_holds_the_group_for_python_and_node_workers(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    """A Python worker takes A:0 and rate-limits its group for 8 s (A:1 was released too, k = 2: it
    is delayed as well); then Python and Node workers run everything: no job of A starts before the
    limit ends, B runs meanwhile."""
    limit_ms = 8000
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_concurrency("A", 2)
        for s in range(4):
            await queue.add("rl", {"g": "A", "s": s, "sleepMs": 2}, group="A")
        taker = Worker(queue_name, None, connection=postgres_url, schema=gschema)
        try:
            job = await taker.get_next_job("manual-token", block=False)
            assert job is not None and job.data["s"] == 0
            limited_at = now_ms()
            await taker.rate_limit_group(job, limit_ms)
            with pytest.raises(Exception, match="not in the active state|not active|lock"):
                await taker.rate_limit_group(job, limit_ms)
        finally:
            await taker.close()
        states = {j.data["s"]: await queue.get_job_state(j.id) for j in await queue.get_jobs(["delayed"])}
        assert states == {0: "delayed", 1: "delayed"}
        assert 0 < await queue.get_group_rate_limit_ttl("A") <= limit_ms
        rates = {g["id"]: g for g in await queue.get_groups()}
        assert rates["A"]["rate_limit"] is None and 0 < rates["A"]["rate_limit_ttl"] <= limit_ms
        async with node_group_workers(postgres_url, gschema, queue_name, workers=1, concurrency=3, drainDelay=1), \
                python_workers(postgres_url, gschema, queue_name, 1, concurrency=3, group_keeper=False):
            ready_at = now_ms()
            for s in range(5):
                await queue.add("rl", {"g": "B", "s": s, "sleepMs": 2}, group="B")
            await wait_finished(postgres_url, gschema, queue_name, 9)
        ends, starts = await read_runs(postgres_url, gschema, queue_name)
        check_groups(ends, starts, {"A": 4, "B": 5}, k=2)
        started = await processed_on(postgres_url, gschema, queue_name)
        for start in starts:
            if start["g"] == "A":
                assert started[start["id"]] >= limited_at + limit_ms - 5, start
                assert start["t0"] >= limited_at + limit_ms - 50, start
        if ready_at < limited_at + limit_ms - 3000:  # the machine kept up: B ran while A was limited
            assert all(started[s["id"]] < limited_at + limit_ms for s in starts if s["g"] == "B"), starts
        assert await queue.get_group_rate_limit_ttl("A") == 0


async def test_a_version_2_schema_is_upgraded_in_place_and_drop_removes_everything(
        postgres_url: str, pg_schema: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from bullmq_compat._backends.postgres import groups as pg_groups

    everything = pg_groups.group_migrations()
    assert [m.version for m in everything][-1] == pg_groups.latest_groups_version() >= 4
    with monkeypatch.context() as patch:
        patch.setattr(pg_groups, "group_migrations", lambda: everything[:2])
        await migrate_postgres(postgres_url, pg_schema, groups=True)
    async with Queue(queue_name, connection=postgres_url, schema=pg_schema) as queue:
        await queue.add("x", {}, group="g")
        await queue.add("x", {}, group="g")
        with pytest.raises(GroupsNotInstalled, match="a group rate limit needs a newer version"):
            await queue.set_group_rate_limit("g", max=1, duration=1000)
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 1}
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    async with Queue(queue_name, connection=postgres_url, schema=pg_schema) as queue:
        await queue.set_group_rate_limit("g", max=1, duration=1000)
        assert await queue.get_group_rate_limit("g") == {"max": 1, "duration": 1000}
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 1}
        await queue.add("x", {}, group="h")
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 2, "waiting-children": 1}
    await drop_postgres_groups(postgres_url, pg_schema)
    assert await our_objects(postgres_url, pg_schema) == {"functions": [], "relations": [], "triggers": []}


async def test_obliterate_forgets_the_start_log(postgres_url: str, gschema: str, queue_name: str) -> None:
    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_rate_limit("A", max=1, duration=60_000)
        await queue.add_bulk(items({"A": 2}, sleep_ms=0))
        async with python_workers(postgres_url, gschema, queue_name, 1, group_keeper=False):
            await wait_finished(postgres_url, gschema, queue_name, 1)
            await asyncio.sleep(0.2)
        assert await sql(postgres_url, gschema, "SELECT count(*) FROM bullmq_compat_group_start WHERE queue = %(q)s",
                         {"q": queue_name}) == [(1,)]
        await queue.obliterate(force=True)
        assert await sql(postgres_url, gschema, "SELECT count(*) FROM bullmq_compat_group_start WHERE queue = %(q)s",
                         {"q": queue_name}) == [(0,)]
        assert await queue.get_group_rate_limit("A") is None


async def test_a_batch_worker_with_group_affinity_keeps_the_rate_limit(
        postgres_url: str, gschema: str, queue_name: str) -> None:
    started: list[tuple[str, int, int]] = []

    async def process(job: Any) -> None:
        for member in job.get_batch():
            started.append((member.data["g"], member.data["s"], int(member.processed_on)))
        await asyncio.sleep(0.01)

    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        await queue.set_group_rate_limit("A", max=2, duration=600)
        await queue.add_bulk(items({"A": 8, "B": 8}, sleep_ms=0))
        worker = Worker(queue_name, process, connection=postgres_url, schema=gschema, drain_delay=0.5,
                        batch={"size": 5, "group_affinity": True})
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            async def all_ran() -> bool:
                return len(started) >= 16
            await wait_for(all_ran, 60, "16 jobs run")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
    assert sorted((g, s) for g, s, _ in started) == sorted([("A", s) for s in range(8)] + [("B", s) for s in range(8)])
    assert [s for g, s, _ in started if g == "A"] == list(range(8))
    assert_rate(sorted(p for g, _, p in started if g == "A"), 2, 600, "group A in batches (processed_at_ms)")


async def test_rate_limit_group_from_a_python_processor(postgres_url: str, gschema: str, queue_name: str) -> None:
    """The processor of A:0 rate-limits its group and raises RateLimitError: no job of A starts before
    the limit ends (A:0 first again), B runs meanwhile; no error is emitted."""
    limit_ms = 4000
    limited_at: list[int] = []
    errors: list[Any] = []
    starts: list[tuple[str, int, int]] = []

    async def processor(job: Any) -> None:
        if job.data["g"] == "A" and not limited_at:
            limited_at.append(now_ms())
            await worker.rate_limit_group(job, limit_ms)
            from bullmq_compat import RateLimitError

            raise RateLimitError()
        starts.append((job.data["g"], job.data["s"], int(job.processed_on)))

    async with Queue(queue_name, connection=postgres_url, schema=gschema) as queue:
        worker = Worker(queue_name, processor, connection=postgres_url, schema=gschema, concurrency=3, drain_delay=0.5)
        worker.on("error", errors.append)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await queue.add_bulk(items({"A": 3, "B": 6}, sleep_ms=0))

            async def all_ran() -> bool:
                return len(starts) >= 9
            await wait_for(all_ran, 60, "9 jobs run")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
    assert errors == []
    assert [s for g, s, _ in starts if g == "A"] == [0, 1, 2]
    assert all(p >= limited_at[0] + limit_ms - 5 for g, _, p in starts if g == "A"), (limited_at, starts)
    assert any(p < limited_at[0] + limit_ms for g, _, p in starts if g == "B"), (limited_at, starts)
