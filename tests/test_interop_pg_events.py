"""QueueEvents across languages on PostgreSQL: Node's QueueEvents (interop/events.js) on a Python
producer and worker, Python's QueueEvents on a Node worker, waitUntilFinished both ways, and each
side listing the other's QueueEvents session."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from bullmq_compat import JobFailed, QueueEvents
from tests.node import node
from tests.pg_interop_helpers import (
    apsql,
    events_js,
    eventually,
    node_call,
    node_states,
    node_work,
    pg_of,
    py_queue,
    py_worker,
)

pytestmark = pytest.mark.node


async def test_node_queue_events_sees_a_python_producer_and_worker(postgres_url: str, pg_schema: str,
                                                                    queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    await node("migrate", **pg)
    # Python's QueueEvents replays from the start too: both must report the same events, same ids
    python_qe = QueueEvents(queue_name, connection=postgres_url, schema=pg_schema, last_event_id="0")
    python_seen: list[tuple[str, dict[str, Any], str]] = []
    python_events = aiter(python_qe)

    async def collect() -> None:
        async for event in python_events:
            python_seen.append(event)
            if event[0] == "delayed":
                return
    collector = asyncio.ensure_future(collect())
    try:
        async with events_js("listen", **pg, queue=queue_name, lastEventId="0", until="delayed",
                             timeoutMs=90000) as listener:
            assert listener.first_line == {"ready": True}
            async with py_queue(queue_name, postgres_url, pg_schema) as queue:
                text = await queue.add("text", {"behave": {"return": "42"}})
                obj = await queue.add("obj", {"behave": {"return": {"r": [1, 2]}}})
                bad = await queue.add("bad", {"behave": {"fail": "python says no"}}, attempts=1)
                async with py_worker(queue_name, postgres_url, pg_schema):
                    await eventually(lambda: node_states(pg, queue_name, [text.id, obj.id], "completed"))
                    await eventually(lambda: node_states(pg, queue_name, [bad.id], "failed"))
                delayed = await queue.add("later", {}, delay=50000)
                heard = await listener.result()
                # on PostgreSQL neither Node's remove nor ours publishes a "removed" event (Redis does)
                await queue.remove(str(delayed.id))
                assert await apsql(f"SELECT count(*) FROM {pg_schema}.event WHERE event = 'removed'") == [["0"]]
        try:
            await asyncio.wait_for(collector, 30)
        except asyncio.TimeoutError:
            raise AssertionError(f"Python's QueueEvents never saw 'delayed': {python_seen}") from None
    finally:
        collector.cancel()
        await python_qe.close()

    assert heard["timedOut"] is False
    node_seen = [(e["name"], e["args"]) for e in heard["events"]]

    def first(name: str, match: Callable[[dict[str, Any]], bool]) -> Any:
        for seen_name, args in node_seen:
            if seen_name == name and match(args[0]):
                return args
        raise AssertionError(f"Node's QueueEvents saw no {name!r}: {node_seen}")

    job = lambda jid: (lambda a: a.get("jobId") == jid)  # noqa: E731
    # "42" reaches Node's listener as the string the Python processor returned
    assert first("completed", job(text.id))[0] == {"jobId": text.id, "returnvalue": "42", "prev": "active"}
    assert first("completed", job(obj.id))[0] == {"jobId": obj.id, "returnvalue": {"r": [1, 2]}, "prev": "active"}
    assert first("failed", job(bad.id))[0] == {"jobId": bad.id, "failedReason": "python says no", "prev": "active"}
    assert first("active", job(bad.id))[0] == {"jobId": bad.id, "prev": "waiting"}
    assert first("added", job(bad.id))[0] == {"jobId": bad.id, "name": "bad"}
    assert first("waiting", job(obj.id))[0]["jobId"] == obj.id
    assert first("delayed", job(delayed.id))[0]["delay"] >= delayed.timestamp + 50000 - 5
    assert first("drained", lambda a: True) and first("retries-exhausted", job(bad.id))[0] == \
        {"jobId": bad.id, "attemptsMade": "1"}
    names = [n for n, a in node_seen if a and isinstance(a[0], dict) and a[0].get("jobId") == text.id]
    assert names.index("added") < names.index("active") < names.index("completed")
    ids = [int(args[-1]) for _, args in node_seen]
    assert ids == sorted(ids)

    # the same events, fields and ids in Python's QueueEvents as in Node's
    as_node = [(name, [fields, event_id] if name != "drained" else [event_id])
               for name, fields, event_id in python_seen]
    assert as_node == node_seen


async def test_python_queue_events_sees_a_node_worker(postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    await node("migrate", **pg)
    seen: list[tuple[str, Any]] = []
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue, \
            QueueEvents(queue_name, connection=postgres_url, schema=pg_schema) as qe:
        for name in ("added", "active", "completed", "failed", "retries-exhausted"):
            qe.on(name, lambda *args, name=name: seen.append((name, args[0])))
        await qe.wait_until_ready()
        text = await node("add", **pg, queue=queue_name, name="t", data={"behave": {"return": "42"}})
        ok = await queue.add("ok", {"v": 1})
        bad = await queue.add("bad", {"behave": {"fail": "node says no"}}, attempts=1)
        late = await queue.add("late", {"behave": {"sleepMs": 300, "return": [1, {"two": None}]}})
        waits = [asyncio.ensure_future(j.wait_until_finished(qe, timeout=90000)) for j in (ok, bad, late)]
        async with node_work(pg, queue_name, count=4) as worker:
            outcome = await worker.result()
        assert sorted(outcome["completed"]) == sorted([text["id"], ok.id, late.id]) and outcome["failed"] == [bad.id]
        assert await asyncio.wait_for(waits[0], 60) == {"echo": {"v": 1}}
        with pytest.raises(JobFailed, match="^node says no$"):
            await asyncio.wait_for(waits[1], 60)
        assert await asyncio.wait_for(waits[2], 60) == [1, {"two": None}]

        def fields(name: str, job_id: str) -> list[Any]:
            return [args for seen_name, args in seen if seen_name == name and args.get("jobId") == job_id]

        async def heard_all() -> bool:
            return bool(fields("completed", text["id"]) and fields("retries-exhausted", bad.id))
        await eventually(heard_all)
        assert fields("completed", text["id"]) == [{"jobId": text["id"], "returnvalue": "42", "prev": "active"}]
        assert fields("completed", ok.id) == [{"jobId": ok.id, "returnvalue": {"echo": {"v": 1}}, "prev": "active"}]
        assert fields("failed", bad.id) == [{"jobId": bad.id, "failedReason": "node says no", "prev": "active"}]
        assert fields("retries-exhausted", bad.id) == [{"jobId": bad.id, "attemptsMade": "1"}]
        assert fields("active", ok.id) == [{"jobId": ok.id, "prev": "waiting"}]
        assert fields("added", text["id"]) == [{"jobId": text["id"], "name": "t"}]
        # already finished: answered from the job's state
        assert await ok.wait_until_finished(qe, timeout=5000) == {"echo": {"v": 1}}


async def test_node_waits_for_jobs_python_finishes_and_lists_its_queue_events(
        postgres_url: str, pg_schema: str, queue_name: str) -> None:
    pg = pg_of(postgres_url, pg_schema)
    async with py_queue(queue_name, postgres_url, pg_schema, migrate=True) as queue:
        ok = await queue.add("ok", {"behave": {"return": {"answer": 42}}})
        text = await queue.add("text", {"behave": {"return": "42"}})
        bad = await queue.add("bad", {"behave": {"fail": "nope from python"}}, attempts=1)
        common = dict(**pg, queue=queue_name, lastEventId="0", ttl=90000)
        async with events_js("wait", id=ok.id, **common) as wait_ok, \
                events_js("wait", id=text.id, **common) as wait_text, \
                events_js("wait", id=bad.id, **common) as wait_bad:
            async with py_worker(queue_name, postgres_url, pg_schema):
                assert await wait_ok.result() == {"returnvalue": {"answer": 42}}
                assert await wait_text.result() == {"returnvalue": "42"}
                assert await wait_bad.result() == {"rejected": "nope from python"}

        # Node's getQueueEvents lists a Python QueueEvents (application_name "<queue>:qe")
        async with QueueEvents(queue_name, connection=postgres_url, schema=pg_schema) as qe:
            await qe.wait_until_ready()

            async def node_lists() -> Any:
                got = await node_call(pg, queue_name, "getQueueEvents")
                return got if len(got) == 1 else None
            listed = await eventually(node_lists)
            assert listed[0]["name"] == queue_name
            assert await node_call(pg, queue_name, "getWorkers") == []  # a QueueEvents is no worker
        async with events_js("listen", **pg, queue=queue_name, until="never", timeoutMs=60000):
            async def python_lists() -> Any:
                got = await queue.get_queue_events()
                return got if len(got) == 1 else None
            assert (await eventually(python_lists))[0]["name"] == queue_name
            assert await queue.get_workers() == []
