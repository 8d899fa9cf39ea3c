"""Job schedulers whose template has group= (docs/groups.md, "Groups and job schedulers"): each
iteration joins its group, held while the group is busy, whoever's worker makes it: on PostgreSQL
through our trigger; on Redis through our scheduler scripts (Python) or a keeper (what a Node
worker's upstream updateJobScheduler makes). The scheduler keeps upstream's semantics: the next
iteration is made when one is taken, at upstream's time.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from bullmq_compat import InvalidJobOptions, Queue, Worker, migrate_postgres
from bullmq_compat._errors import JobBelongsToJobScheduler
from tests.group_helpers import keeper_proc, node_workers, read_records, rec_key, recording_processor, wait_until
from tests.test_group_flows import backend  # noqa: F401 (the fixture: Redis, or PostgreSQL with our groups)

EVERY_MS = 300
BLOCK_MS = 1500


@pytest.fixture
async def pg(postgres_url: str, pg_schema: str) -> dict[str, Any]:
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    return {"connection": postgres_url, "schema": pg_schema}


def tick_template(gid: str = "S", sleep_ms: int = 30) -> dict[str, Any]:
    return {"name": "tick", "data": {"g": gid, "sleepMs": sleep_ms}, "opts": {"group": gid}}


def assert_one_at_a_time(starts: list[dict[str, Any]], ends: list[dict[str, Any]], gid: str) -> None:
    """The group's runs never overlapped (by time, and by the counter at each start)."""
    runs = sorted((e["t0"], e["t1"]) for e in ends if e["g"] == gid)
    for (a0, a1), (b0, b1) in zip(runs, runs[1:]):
        assert b0 >= a1, f"group {gid}: a run started at {b0} before the one before ended at {a1}"
    assert all(e["n"] == 1 for e in ends if e["g"] == gid)
    assert len(starts) == len(ends)


async def test_scheduler_iterations_wait_their_turn_in_the_group(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """A group job runs 1.5 s; a scheduler of the group every 300 ms whose jobs run 700 ms: its
    first iteration is held behind the group job, and each next one (made as the one before is
    taken, due 300 ms later) behind the one before, so the group runs one at a time (without the
    gate, a worker of concurrency 5 would run them side by side), each at or after its time."""
    async with Queue(queue_name, **backend) as queue:
        await queue.add("block", {"g": "S", "s": 0, "sleepMs": BLOCK_MS}, group="S")
        first = await queue.upsert_job_scheduler("sch", {"every": EVERY_MS}, template=tick_template(sleep_ms=700))
        assert first is not None and first.id.startswith("repeat:sch:")
        assert await queue.get_job_state(first.id) == "waiting-children"
        assert [j.id for j in await queue.get_group_jobs("S")] == [first.id]
        stored = await queue.get_job_scheduler("sch")
        assert stored is not None and stored["template"]["opts"]["group"] == {"id": "S"}
        assert (await queue.get_job(first.id)).opts["group"] == {"id": "S"}

        process, client = recording_processor(redis_url, rec_key(queue_name))
        worker = Worker(queue_name, process, **backend, concurrency=5, drain_delay=1)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await wait_until(lambda: _ticks(redis, queue_name, 4), 60, "4 iterations run")
            await queue.remove_job_scheduler("sch")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
            await client.aclose()
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert_one_at_a_time(starts, ends, "S")
        assert ends[0]["id"] != first.id and ends[1]["id"] == first.id  # the blocker first, then the ticks
        ticks = [e for e in ends if e["id"].startswith("repeat:sch:")]
        millis = [int(e["id"].rsplit(":", 1)[1]) for e in ticks]
        assert millis == sorted(millis) and len(set(millis)) == len(millis)
        for run, at in zip(ticks, millis):
            assert run["t0"] >= at, f"iteration {run['id']} ran before its time"


async def _ticks(redis: aioredis.Redis, queue_name: str, n: int) -> bool:
    ends, _ = await read_records(redis, rec_key(queue_name))
    return sum(1 for e in ends if e["id"].startswith("repeat:")) >= n


async def test_a_held_iteration_and_its_scheduler_removed(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """Removing a held iteration directly is refused by upstream's SQL, as for a plain scheduler's
    delayed one (JobBelongsToJobScheduler). Removing the scheduler while its iteration is held:
    upstream's remove_job_scheduler takes only a delayed iteration, so the held one stays and runs
    in its turn (as an iteration already promoted to wait does), and no further one is made."""
    async with Queue(queue_name, **backend) as queue:
        await queue.add("block", {"g": "S", "s": 0, "sleepMs": 200}, group="S")
        held = await queue.upsert_job_scheduler("held", {"every": 60_000}, template=tick_template())
        plain = await queue.upsert_job_scheduler("plain", {"every": 60_000},
                                                 template={"name": "tick", "data": {"g": "P"}})
        assert held is not None and plain is not None
        assert await queue.get_job_state(held.id) == "waiting-children"
        assert await queue.get_job_state(plain.id) in ("delayed", "waiting")
        for job_id in (held.id, plain.id):
            with pytest.raises(JobBelongsToJobScheduler):
                await (await queue.get_job(job_id)).remove()
        assert [j.id for j in await queue.get_group_jobs("S")] == [held.id]
        # an every-scheduler's first iteration is due at once: upstream put the plain one in wait,
        # where its remove_job_scheduler leaves it, as the gate's one is left held
        assert await queue.get_job_state(plain.id) == "waiting"
        await queue.remove_job_scheduler("plain")
        assert await queue.get_job_state(plain.id) == "waiting"
        await queue.remove_job_scheduler("held")
        assert await queue.get_job_scheduler("held") is None
        assert await queue.get_job_state(held.id) == "waiting-children"

        process, client = recording_processor(redis_url, rec_key(queue_name))
        worker = Worker(queue_name, process, **backend, concurrency=3, drain_delay=1)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await wait_until(lambda: _finished(queue, held.id), 60, "the held iteration to run")
            await wait_until(lambda: _finished(queue, plain.id), 60, "the plain iteration to run")
            await asyncio.sleep(0.5)  # (a next iteration would be made as it was taken: none is)
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
            await client.aclose()
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert [e["id"] for e in ends if e["g"] == "S"][-1] == held.id and len(ends) == 3
        assert_one_at_a_time(starts, ends, "S")
        counts = await queue.get_job_counts("waiting", "delayed", "waiting-children", "active")
        assert counts == {"waiting": 0, "delayed": 0, "waiting-children": 0, "active": 0}


async def _finished(queue: Queue, job_id: str) -> bool:
    return await queue.get_job_state(job_id) == "completed"


async def test_scheduler_templates_with_a_group_refused_where_they_cannot_hold(
        backend: dict[str, Any], queue_name: str) -> None:
    async with Queue(queue_name, **backend) as queue:
        for opts, word in (({"group": {"id": "S", "max_size": 3}}, "max_size"),
                           ({"group": "S", "order_ms": 5}, "order_ms"), ({"group": ""}, "group")):
            with pytest.raises(InvalidJobOptions, match=word):
                await queue.upsert_job_scheduler("bad", {"every": 1000}, template={"opts": opts})
        assert await queue.get_job_schedulers_count() == 0
        assert sum((await queue.get_job_counts()).values()) == 0


async def test_node_workers_make_iterations_that_wait_their_turn(
        postgres_url: str, pg: dict[str, Any], queue_name: str) -> None:
    """Node BullMQ Workers on PostgreSQL take the iterations (700 ms each, every 300 ms) and make
    the next ones with upstream's SQL alone; our trigger holds each new one while the group's
    current job runs, so the group runs one at a time (Node's 5 slots would run them side by side)."""
    from tests.pg_group_interop_helpers import create_recorder, node_group_workers, read_runs

    schema = pg["schema"]
    await create_recorder(postgres_url, schema)
    async with Queue(queue_name, **pg) as queue:
        await queue.add("block", {"s": 0, "sleepMs": BLOCK_MS}, group="S")
        first = await queue.upsert_job_scheduler("sch", {"every": EVERY_MS},
                                                 template={"name": "tick", "data": {"sleepMs": 700},
                                                           "opts": {"group": "S"}})
        assert first is not None and await queue.get_job_state(first.id) == "waiting-children"

        async def ticks() -> bool:
            ends, _ = await read_runs(postgres_url, schema, queue_name)
            return sum(1 for e in ends if e["id"].startswith("repeat:")) >= 4

        async with node_group_workers(postgres_url, schema, queue_name, concurrency=5, drainDelay=1):
            await wait_until(ticks, 60, "4 iterations run by Node")
            await queue.remove_job_scheduler("sch")
        ends, starts = await read_runs(postgres_url, schema, queue_name)
        assert {e["w"] for e in ends} == {"node"}
        assert_one_at_a_time(starts, ends, "S")
        assert ends[0]["id"] != first.id and ends[1]["id"] == first.id
        millis = [int(e["id"].rsplit(":", 1)[1]) for e in ends if e["id"].startswith("repeat:")]
        assert millis == sorted(millis) and len(set(millis)) == len(millis)


NODE_EVERY_MS = 2000  # far above a keeper's reaction: see docs/groups.md on Node-made iterations


async def test_node_workers_and_a_keeper_on_redis_gate_the_iterations_node_makes(
        redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """Node BullMQ Workers on Redis make each next iteration with upstream's updateJobScheduler,
    which knows no gate; `bullmq-compat keeper` sees its "added" event and puts it behind the
    group's gate (held: the iteration just taken runs), so the group still runs one at a time."""
    async with Queue(queue_name, connection=redis_url) as queue:
        # each iteration runs 500 ms: Node makes the next one as it takes one, and the keeper has
        # those 500 ms to gate it while the group is busy (it takes milliseconds)
        first = await queue.upsert_job_scheduler("sch", {"every": NODE_EVERY_MS},
                                                 template=tick_template(sleep_ms=500))
        assert first is not None and await queue.get_job_state(first.id) == "waiting"  # the group was free
        async with keeper_proc(redis_url, queue_name, 0.5), node_workers(redis_url, queue_name, concurrency=5):
            await wait_until(lambda: _ticks(redis, queue_name, 4), 90, "4 iterations run by Node")
            await queue.remove_job_scheduler("sch")
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert {e["w"] for e in ends} == {"node"}
        assert_one_at_a_time(starts, ends, "S")
        ticks = [e["id"] for e in ends if e["id"].startswith("repeat:")]
        assert ticks[0] == first.id
        millis = [int(i.rsplit(":", 1)[1]) for i in ticks]
        assert millis == sorted(millis) and len(set(millis)) == len(millis)
        # each iteration Node made (while the one before ran) went behind the gate: our
        # "waiting-children" event, added by the keeper's gating
        events = await redis.xrange(f"bull:{queue_name}:events")
        gated = {f["jobId"] for _, f in events if f.get("event") == "waiting-children"}
        assert set(ticks[1:]) <= gated


async def test_a_sweep_gates_an_iteration_a_node_worker_made_with_no_keeper_running(
        redis_url: str, queue_name: str) -> None:
    """The next iteration made as Node's Worker makes it (upstream's updateJobScheduler alone) while
    no keeper reads the stream: the next sweep finds it (each scheduler's next job) and holds it."""
    from bullmq_compat._wire import codec

    async with Queue(queue_name, connection=redis_url) as queue:
        first = await queue.upsert_job_scheduler("sch", {"every": 60_000}, template=tick_template())
        assert first is not None and await queue.get_job_state(first.id) == "waiting"  # the group was free
        b, k = queue.backend, queue.backend.keys
        stored = await queue.get_job(first.id)
        wire = {"group": {"id": "S"}, "attempts": 0, "repeat": {"every": 60_000, "count": 2}}
        next_id = codec.to_str(await b.runner.call("updateJobScheduler", [
            *b._scheduler_keys(), k.job(first.id), k.active], [
            None, "sch", codec.dumps(stored.data), codec.pack(wire), int(time.time() * 1000), k.prefix_key, first.id]))
        assert next_id.startswith("repeat:sch:") and await queue.get_job_state(next_id) == "delayed"
        await queue.sweep_groups()
        assert await queue.get_job_state(next_id) == "waiting-children"
        assert [j.id for j in await queue.get_group_jobs("S")] == [next_id]
        await queue.sweep_groups()  # idempotent
        assert [j.id for j in await queue.get_group_jobs("S")] == [next_id]
        assert await queue.get_job_state(first.id) == "waiting"


async def test_a_node_producers_scheduler_with_a_group(
        backend: dict[str, Any], redis_url: str, redis: aioredis.Redis, queue_name: str) -> None:
    """Node's queue.upsertJobScheduler with a group in the template: on PostgreSQL our trigger holds
    its first iteration at once; on Redis upstream's script puts it in wait, past the gate, until a
    keeper's sweep (or its stream reading) gates it (docs/groups.md). Then it runs as any."""
    from tests.node import node

    where = ({"redis": redis_url} if "schema" not in backend
             else {"postgres": backend["connection"], "schema": backend["schema"]})
    async with Queue(queue_name, **backend) as queue:
        await queue.add("block", {"g": "S", "s": 0, "sleepMs": 300}, group="S")
        made = await node("queueCall", **where, queue=queue_name, method="upsertJobScheduler",
                          args=["sch", {"every": 60_000}, {"name": "tick", "data": {"g": "S"},
                                                           "opts": {"group": {"id": "S"}}}])
        job_id = made["id"]
        if "schema" not in backend:
            assert await queue.get_job_state(job_id) == "waiting"  # upstream's, past the gate
            await queue.sweep_groups()
        assert await queue.get_job_state(job_id) == "waiting-children"
        assert [j.id for j in await queue.get_group_jobs("S")] == [job_id]
        process, client = recording_processor(redis_url, rec_key(queue_name))
        worker = Worker(queue_name, process, **backend, concurrency=3, drain_delay=1)
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            await wait_until(lambda: _finished(queue, job_id), 60, "the Node-made iteration to run")
            await queue.remove_job_scheduler("sch")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 20)
            await client.aclose()
        ends, starts = await read_records(redis, rec_key(queue_name))
        assert [e["id"] for e in ends][:2][1] == job_id
        assert_one_at_a_time(starts, ends, "S")
