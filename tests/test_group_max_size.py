"""Max group size (issue #28 §2; BullMQ Pro's ``group.maxSize``), on Redis and on PostgreSQL.

``add(..., group={"id": g, "max_size": n})`` (or Pro's ``maxSize``) is refused with
`GroupMaxSizeExceeded`, writing nothing, when the group already holds n jobs not started yet: held
behind the gate, or released and not taken by a worker. Active and finished jobs do not count. The
decision is inside the add's own atomic call (our addGroupJob script; our BEFORE INSERT trigger
under the group lock), so concurrent producers never overshoot. ``add_bulk``: refused with
max_size on Redis (as Pro), all-or-nothing on PostgreSQL (one transaction).
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any, AsyncIterator

import psycopg
import pytest
import redis.asyncio as aioredis

from bullmq_compat import (
    GroupMaxSizeExceeded,
    GroupsNotInstalled,
    InvalidJobOptions,
    Queue,
    Worker,
    migrate_postgres,
)
from tests.helpers import wait_until
from tests.pg_interop_helpers import pg_of

PRODUCERS = 8
PER_PRODUCER = 20
LIMIT = 50


@pytest.fixture(params=["redis", "postgres"])
async def setup(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[dict[str, Any]]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        yield {"backend": "redis", "url": url, "kw": {"connection": url}}
    else:
        url = request.getfixturevalue("postgres_url")
        schema = request.getfixturevalue("pg_schema")
        await migrate_postgres(url, schema, groups=True)
        yield {"backend": "postgres", "url": url, "schema": schema, "kw": {"connection": url, "schema": schema},
               "node": pg_of(url, schema, migrate=False)}


async def footprint(setup: dict[str, Any], queue: str) -> dict[str, Any]:
    """What an add writes: jobs (by state), events, and on Redis the id counter and the group keys."""
    if setup["backend"] == "redis":
        client = aioredis.from_url(setup["url"], decode_responses=True)
        try:
            base = f"bull:{queue}:"
            keys = sorted(k for k in await client.keys(base + "*") if not k.endswith(":events"))
            return {"id": await client.get(base + "id"), "events": await client.xlen(base + "events"),
                    "keys": keys, "held": await client.zcard(base + "grp:held:g")}
        finally:
            await client.aclose()
    async with await psycopg.AsyncConnection.connect(setup["url"], autocommit=True) as conn:
        await conn.execute(f"SET search_path TO {setup['schema']}")
        jobs = await (await conn.execute(
            "SELECT id, state::text FROM job WHERE queue = %s ORDER BY id", [queue])).fetchall()
        events = await (await conn.execute("SELECT count(*) FROM event WHERE queue = %s", [queue])).fetchone()
        return {"jobs": jobs, "events": events[0] if events else None}


async def stored_group(setup: dict[str, Any], queue: str, job_id: str) -> Any:
    """The group option as stored in the job (what Node and Bull-Board read)."""
    if setup["backend"] == "redis":
        client = aioredis.from_url(setup["url"], decode_responses=True)
        try:
            return json.loads(await client.hget(f"bull:{queue}:{job_id}", "opts"))["group"]
        finally:
            await client.aclose()
    async with await psycopg.AsyncConnection.connect(setup["url"], autocommit=True) as conn:
        await conn.execute(f"SET search_path TO {setup['schema']}")
        row = await (await conn.execute("SELECT opts FROM job WHERE queue = %s AND id = %s", [queue, job_id])).fetchone()
        assert row is not None
        return row[0]["group"]


async def test_a_full_group_refuses_the_add_and_nothing_is_written(setup: dict[str, Any], queue_name: str) -> None:
    queue = Queue(queue_name, **setup["kw"])
    try:
        jobs = [await queue.add("x", {"i": i}, group={"id": "g", "max_size": 3}) for i in range(3)]
        # Pro's shape, stored: Node and Bull-Board read opts.group.maxSize
        assert await stored_group(setup, queue_name, jobs[0].id) == {"id": "g", "maxSize": 3}
        assert jobs[0].opts["group"] == {"id": "g", "maxSize": 3}
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 2}
        before = await footprint(setup, queue_name)
        for spelling in ({"id": "g", "max_size": 3}, {"id": "g", "maxSize": 3}):
            with pytest.raises(GroupMaxSizeExceeded) as refused:
                await queue.add("x", {"late": True}, group=spelling)
            err = refused.value
            assert (err.group_id, err.max_size, err.queue) == ("g", 3, queue_name)
            assert "group 'g'" in str(err) and "max_size=3" in str(err) and "not started yet" in str(err)
            assert await footprint(setup, queue_name) == before  # no job, no event, no id (Redis)
        # a bigger limit, another group, or no limit at all: accepted
        assert (await queue.add("x", {}, group={"id": "g", "max_size": 4})).id is not None
        await queue.add("x", {}, group={"id": "other", "max_size": 1})
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group={"id": "other", "max_size": 1})
        await queue.add("x", {}, group="g")
        assert await queue.get_group_job_count("g") == 4
    finally:
        await queue.close()


async def test_active_jobs_do_not_count_and_a_run_or_removed_job_frees_its_place(
        setup: dict[str, Any], queue_name: str) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def process(job: Any) -> None:
        started.append(job.id)
        await release.wait()

    group = {"id": "g", "max_size": 3}
    queue = Queue(queue_name, **setup["kw"])
    worker = None
    try:
        first = [await queue.add("x", {"i": i}, group=group) for i in range(3)]
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group=group)
        worker = Worker(queue_name, process, concurrency=5, drain_delay=1, autorun=True, **setup["kw"])
        await wait_until(lambda: len(started) == 1, timeout=30)
        assert started == [first[0].id]
        # the head is active: it no longer counts, so one more fits (2 held + 1 new held)
        fourth = await queue.add("x", {"i": 3}, group=group)
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group=group)
        # a held job removed (upstream's remove, which knows nothing of the gate) frees its place
        removed = await queue.get_job(first[2].id)
        assert removed is not None
        await removed.remove()
        fifth = await queue.add("x", {"i": 4}, group=group)
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group=group)
        release.set()
        # every job runs; then the group is empty and takes max_size jobs again
        want = [first[0].id, first[1].id, fourth.id, fifth.id]
        await wait_until(lambda: started == want, timeout=60)
        async def all_completed() -> bool:
            return (await queue.get_job_counts("completed"))["completed"] == 4

        await wait_until(all_completed, timeout=60, what="the 4 jobs completed")
        await worker.close()
        worker = None
        again = [await queue.add("x", {"again": i}, group=group) for i in range(3)]
        assert len({job.id for job in again}) == 3
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group=group)
    finally:
        release.set()
        if worker is not None:
            await worker.close()
        await queue.close()


@pytest.mark.parametrize("bad", [0, -1, "x", True, False, 1.5, 2.0, None, [3]])
async def test_a_bad_max_size_is_refused_naming_the_value(setup: dict[str, Any], queue_name: str, bad: Any) -> None:
    queue = Queue(queue_name, **setup["kw"])
    try:
        for key in ("max_size", "maxSize"):
            with pytest.raises(InvalidJobOptions, match=re.escape(f"{key}={bad!r} must be an int from 1")):
                await queue.add("x", {}, group={"id": "g", key: bad})
            with pytest.raises(InvalidJobOptions, match=re.escape(f"{key}={bad!r} must be an int from 1")):
                await queue.add_bulk([{"name": "x", "data": {}, "opts": {"group": {"id": "g", key: bad}}}])
        with pytest.raises(InvalidJobOptions, match="max_size or maxSize, not both"):
            await queue.add("x", {}, group={"id": "g", "max_size": 2, "maxSize": 2})
        with pytest.raises(InvalidJobOptions, match="must be a group id str"):
            await queue.add("x", {}, group={"id": "g", "max": 2})
        assert sum((await queue.get_job_counts()).values()) == 0
    finally:
        await queue.close()


async def test_concurrent_producers_never_overshoot(setup: dict[str, Any], queue_name: str) -> None:
    """8 producers (each a Queue of its own, so its own connection), 20 adds each to one group with
    max_size 50, no worker: exactly 50 are accepted, 110 refused, never more than 50 held."""
    queues = [Queue(queue_name, **setup["kw"]) for _ in range(PRODUCERS)]
    accepted: list[str] = []
    refused = 0
    start = asyncio.Event()

    async def produce(queue: Queue, p: int) -> None:
        nonlocal refused
        await queue.wait_until_ready()
        await start.wait()
        for i in range(PER_PRODUCER):
            try:
                job = await queue.add("x", {"p": p, "i": i}, group={"id": "g", "maxSize": LIMIT})
                accepted.append(job.id)
            except GroupMaxSizeExceeded as err:
                assert err.max_size == LIMIT
                refused += 1

    try:
        tasks = [asyncio.create_task(produce(q, p)) for p, q in enumerate(queues)]
        await asyncio.sleep(0.2)
        start.set()
        await asyncio.gather(*tasks)
        assert len(accepted) == LIMIT and len(set(accepted)) == LIMIT
        assert refused == PRODUCERS * PER_PRODUCER - LIMIT
        assert await queues[0].get_job_counts("waiting", "waiting-children") == {
            "waiting": 1, "waiting-children": LIMIT - 1}
        assert await queues[0].get_group_job_count("g") == LIMIT - 1
    finally:
        for q in queues:
            await q.close()


async def test_add_bulk(setup: dict[str, Any], queue_name: str) -> None:
    """Redis: max_size in add_bulk is refused before anything is sent (Pro refuses it too).
    PostgreSQL: the bulk is one transaction, so a full group refuses the whole bulk."""
    queue = Queue(queue_name, **setup["kw"])

    def items(gid: str, n: int, max_size: int) -> list[dict[str, Any]]:
        return [{"name": "x", "data": {"i": i}, "opts": {"group": {"id": gid, "max_size": max_size}}}
                for i in range(n)]

    try:
        await queue.add("x", {}, group="g")  # one job of g already
        if setup["backend"] == "redis":
            with pytest.raises(InvalidJobOptions, match="max_size is not supported in add_bulk on Redis"):
                await queue.add_bulk(items("g", 1, 5))
            assert sum((await queue.get_job_counts()).values()) == 1
            # without max_size, as before
            assert len(await queue.add_bulk([{"name": "x", "data": {}, "opts": {"group": "g"}}])) == 1
            return
        before = await footprint(setup, queue_name)
        # plain jobs and another group first, then g's 4th of max 3: nothing of it is written
        bulk = [{"name": "plain", "data": {}}] + items("h", 2, 5) + items("g", 3, 3)
        with pytest.raises(GroupMaxSizeExceeded) as refused:
            await queue.add_bulk(bulk)
        assert (refused.value.group_id, refused.value.max_size) == ("g", 3)
        assert await footprint(setup, queue_name) == before
        # up to the limit exactly: written
        done = await queue.add_bulk(items("g", 2, 3) + items("h", 2, 2))
        assert len(done) == 4
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 2, "waiting-children": 3}
    finally:
        await queue.close()


async def test_an_add_answered_by_an_existing_job_is_not_refused(setup: dict[str, Any], queue_name: str) -> None:
    """A duplicate custom id, or a deduplicated add, adds no job: a full group does not refuse it."""
    queue = Queue(queue_name, **setup["kw"])
    group = {"id": "g", "max_size": 2}
    try:
        a = await queue.add("x", {}, group=group, job_id="a")
        d = await queue.add("x", {}, group=group, deduplication={"id": "d"})
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group=group)
        assert (await queue.add("x", {}, group=group, job_id="a")).id == a.id
        assert (await queue.add("x", {}, group=group, deduplication={"id": "d"})).id == d.id
        assert sum((await queue.get_job_counts()).values()) == 2
    finally:
        await queue.close()


async def test_a_node_producer_on_postgres_is_refused_by_the_database(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    """A plain Node producer's `{group: {id, maxSize}}` (no bullmq-compat code in Node): the trigger
    refuses it once the group is full (SQLSTATE BQG01), and its add writes nothing."""
    from tests.node import NodeError, node

    await migrate_postgres(postgres_url, pg_schema, groups=True)
    pg = pg_of(postgres_url, pg_schema, migrate=False)
    setup = {"backend": "postgres", "url": postgres_url, "schema": pg_schema}
    opts = {"group": {"id": "g", "maxSize": 2}}
    added = [await node("add", **pg, queue=queue_name, name="n", data={"i": i}, opts=opts) for i in range(2)]
    assert [a["row"]["state"] for a in added] == ["waiting", "waiting-children"]
    before = await footprint(setup, queue_name)
    with pytest.raises(NodeError, match="already holds maxSize=2 jobs not started yet"):
        await node("add", **pg, queue=queue_name, name="n", data={"i": 2}, opts=opts)
    assert await footprint(setup, queue_name) == before
    # Python sees the same limit in Node's jobs
    async with Queue(queue_name, connection=postgres_url, schema=pg_schema) as queue:
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group={"id": "g", "max_size": 2})
        assert (await queue.get_job(added[0]["row"]["id"])).opts["group"] == {"id": "g", "maxSize": 2}


async def test_a_version_1_schema_is_upgraded_in_place(postgres_url: str, pg_schema: str, queue_name: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema whose group objects are version 1 (before max size): a max_size add asks for the
    upgrade and writes nothing; migrate_postgres(groups=True) upgrades it, held jobs kept."""
    from bullmq_compat._backends.postgres import groups as pg_groups

    everything = pg_groups.group_migrations()
    with monkeypatch.context() as patch:
        patch.setattr(pg_groups, "group_migrations", lambda: everything[:1])
        await migrate_postgres(postgres_url, pg_schema, groups=True)
    async with Queue(queue_name, connection=postgres_url, schema=pg_schema) as queue:
        await queue.add("x", {}, group="g")
        await queue.add("x", {}, group="g")
        with pytest.raises(GroupsNotInstalled, match="max_size needs a newer version"):
            await queue.add("x", {}, group={"id": "g", "max_size": 2})
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 1}
    await migrate_postgres(postgres_url, pg_schema, groups=True)
    async with Queue(queue_name, connection=postgres_url, schema=pg_schema) as queue:
        with pytest.raises(GroupMaxSizeExceeded):
            await queue.add("x", {}, group={"id": "g", "max_size": 2})
        await queue.add("x", {}, group={"id": "g", "max_size": 3})
        assert await queue.get_job_counts("waiting", "waiting-children") == {"waiting": 1, "waiting-children": 2}
