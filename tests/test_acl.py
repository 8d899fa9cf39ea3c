"""Least privilege: a producer, a worker (with QueueEvents) and a keeper run as exactly the Redis
ACL users docs/security.md gives (its ``ACL SETUSER`` lines are read from the page), and what a
missing permission looks like.

The server is the test's own (the ACL users exist only there). After each role's run, ``ACL LOG``
holds no refusal except the worker's ``fcall``: the documented fallback from our function
library to EVALSHA for users without FCALL. redis-py sends ``CLIENT SETINFO`` on every connection
and ignores a refusal, so only ``ACL LOG`` shows a missing ``+client|setinfo`` (Redis 7.2+, Valkey);
Redis before 7.2 has no such subcommand and refuses the rule, which the test then leaves out, as
the page says.
"""
from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions as redis_exc

from bullmq_compat import FlowProducer, Queue, QueueEvents, Worker
from bullmq_compat._groups import GroupKeeper
from tests._redis_server import RedisServer
from tests.helpers import wait_until
from tests.node import NodeProcess

DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"
PASSWORDS = {"bullmq-producer": "PRODUCER_PASSWORD", "bullmq-worker": "WORKER_PASSWORD",
             "bullmq-keeper": "KEEPER_PASSWORD"}


def documented_acls() -> dict[str, list[str]]:
    """user -> the ACL SETUSER rules, as docs/security.md writes them (continuation lines joined)."""
    text = DOC.read_text()
    acls: dict[str, list[str]] = {}
    for match in re.finditer(r"^ACL SETUSER (?:[^\n]*\\\n)*[^\n]*$", text, re.M):
        words = match.group(0).replace("\\\n", " ").split()
        acls[words[2]] = words[3:]
    return acls


def rules_for(user: str, secret: str, drop: tuple[str, ...] = ()) -> list[str]:
    rules = [f">{secret}" if rule == f">{PASSWORDS[user]}" else rule for rule in documented_acls()[user]]
    assert f">{secret}" in rules, f"{user}: the password placeholder changed"
    return [rule for rule in rules if rule not in drop]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def admin(server: RedisServer) -> AsyncIterator[Any]:
    client = aioredis.Redis(port=server.port, decode_responses=True)
    try:
        await client.acl_log_reset()
        yield client
    finally:
        await client.aclose()


async def has_client_setinfo(admin: Any) -> bool:
    """CLIENT SETINFO came with Redis 7.2; Valkey (8: ``redis_version:7.2.4``) has it."""
    major, minor = (int(part) for part in (await admin.info("server"))["redis_version"].split(".")[:2])
    return (major, minor) >= (7, 2)


async def make_user(admin: Any, user: str, drop: tuple[str, ...] = ()) -> str:
    secret = f"pw-{user}"
    if not await has_client_setinfo(admin):
        drop += ("+client|setinfo",)  # ACL SETUSER refuses a subcommand the server does not have
    await admin.execute_command("ACL", "SETUSER", user, *rules_for(user, secret, drop))
    return secret


def url(server: RedisServer, user: str, secret: str) -> str:
    return f"redis://{user}:{secret}@127.0.0.1:{server.port}/0"


async def refusals(admin: Any) -> list[tuple[str, str, str]]:
    return [(e["username"], e["object"], e["context"]) for e in await admin.acl_log()]


def error_code(error: BaseException) -> str:
    """An error reply's code on either path: the fast connection keeps it (``ReplyError.code``);
    redis-py turns NOPERM into ``NoPermissionError`` and drops the code from the text."""
    if isinstance(error, redis_exc.NoPermissionError):
        return "NOPERM"
    return str(getattr(error, "code", ""))


def test_the_documented_acls_are_least_privilege() -> None:
    acls = documented_acls()
    assert set(acls) == set(PASSWORDS)
    for user, rules in acls.items():
        assert rules[:5] == ["reset", "on", f">{PASSWORDS[user]}", "resetchannels", "~bull:*"], rules
        assert "+client|setinfo" in rules, user  # redis-py sends it on connect (Redis 7.2+, Valkey)
        assert "-@all" in rules and not any(r.startswith("+@") for r in rules), rules  # no categories
        for dangerous in ("+keys", "+scan", "+flushall", "+flushdb", "+config", "+function", "+fcall",
                          "+client|list", "+client|kill", "+debug", "+monitor", "+shutdown"):
            assert dangerous not in rules, (user, dangerous)


async def processor(job: Any) -> Any:
    await job.update_progress(50)
    await job.log(f"processing {job.name}")
    if job.data.get("fail_once") and job.attempts_made < 1:
        raise RuntimeError("failing once on purpose")
    if job.data.get("fail"):
        raise RuntimeError("failing for good")
    await asyncio.sleep(job.data.get("ms", 10) / 1000)
    return {"done": job.name}


async def test_producer_and_worker_run_as_the_documented_users(server: RedisServer, admin: Any,
                                                               queue_name: str) -> None:
    producer_url = url(server, "bullmq-producer", await make_user(admin, "bullmq-producer"))
    worker_url = url(server, "bullmq-worker", await make_user(admin, "bullmq-worker"))
    queue = Queue(queue_name, producer_url)
    flows = FlowProducer(producer_url)
    try:
        jobs = [await queue.add("plain", {}),
                await queue.add("delayed", {}, delay=300),
                await queue.add("prioritized", {}, priority=3),
                await queue.add("lifo", {}, lifo=True),
                await queue.add("retried", {"fail_once": True}, attempts=2, backoff={"type": "fixed", "delay": 100}),
                await queue.add("failed", {"fail": True}),
                await queue.add("kept-lock", {"ms": 4000}),  # outlives lock_duration: the lock is renewed
                await queue.add("removed", {}, remove_on_complete=True),
                await queue.add("dedup", {}, deduplication={"id": "d-1"}),
                await queue.add("custom-id", {}, job_id="custom-1")]
        jobs += await queue.add_bulk([{"name": "bulk", "data": {"i": i}} for i in range(5)])
        jobs += [await queue.add("grouped", {"s": s}, group="user:1") for s in range(3)]
        tree = await flows.add({"name": "parent", "queue_name": queue_name, "data": {},
                                "children": [{"name": "child", "queue_name": queue_name, "data": {}}]})
        assert (await queue.get_job(jobs[0].id)).name == "plain"
        assert sum((await queue.get_job_counts()).values()) == len(jobs) + 2
        assert await refusals(admin) == [], "the producer was refused something"

        events = QueueEvents(queue_name, worker_url)
        worker = Worker(queue_name, processor, worker_url, concurrency=4, name="acl-worker",
                        lock_duration=3000, stalled_interval=3000)
        await events.wait_until_ready()
        task = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            assert await tree.job.wait_until_finished(events, timeout=60_000) == {"done": "parent"}

            # all but "failed" complete (parent and child too), and "removed" is gone once done
            expected = {"completed": len(jobs) + 2 - 2, "failed": 1}

            async def all_done() -> bool:
                counts = await queue.get_job_counts()
                return {k: v for k, v in counts.items() if v} == expected
            try:
                await wait_until(all_done, timeout=60, what="every job processed by the worker user", interval=0.1)
            except AssertionError:
                raise AssertionError(f"{await queue.get_job_counts()} != {expected}; "
                                     f"ACL LOG: {await refusals(admin)}") from None
        finally:
            await worker.close()
            await asyncio.wait_for(task, 30)
            await events.close()
        kept = await queue.get_job(jobs[6].id)  # renewed (extendLocks as the worker user), never stalled
        assert kept.returnvalue == {"done": "kept-lock"} and kept.attempts_started == 1 and kept.stalled_counter == 0
        retried = await queue.get_job(jobs[4].id)
        assert retried.attempts_made == 2 and retried.returnvalue == {"done": "retried"}
        # the one refusal: FCALL (no FUNCTION for these users), after which EVALSHA serves
        assert {(obj, ctx) for _, obj, ctx in await refusals(admin)} <= {("fcall", "toplevel")}
    finally:
        await flows.close()
        await queue.close()


@pytest.mark.node
async def test_keeper_runs_as_the_documented_user(server: RedisServer, admin: Any, queue_name: str) -> None:
    """Group jobs finished by a Node worker (default user) are released by a keeper running as the
    keeper user: every job of both groups runs, in order."""
    keeper_url = url(server, "bullmq-keeper", await make_user(admin, "bullmq-keeper"))
    producer_url = url(server, "bullmq-producer", await make_user(admin, "bullmq-producer"))
    queue = Queue(queue_name, producer_url)
    keeper = GroupKeeper(queue_name, keeper_url, sweep_interval=0.5)
    try:
        for step in range(3):
            for group in ("A", "B"):
                await queue.add("g", {"g": group, "s": step}, group=group)
        # a timed sweep (it takes the keepers' shared lease with SET NX PX first) as this user
        assert await keeper.sweep_if_due() == 0 and await keeper.sweep_if_due() is None  # lease held
        keeper.start()
        async with NodeProcess.work(redis=f"redis://127.0.0.1:{server.port}", queue=queue_name, count=6,
                                    timeoutMs=60_000) as node_worker:
            outcome = await node_worker.result()
        assert len(outcome["completed"]) == 6 and not outcome["timedOut"], (
            outcome, keeper.sweeps, keeper.released, await refusals(admin))
        assert keeper.released >= 4  # the second and third job of each group came from the keeper
        assert await refusals(admin) == []
    finally:
        await keeper.close()
        await queue.close()


async def test_what_a_missing_permission_looks_like(server: RedisServer, admin: Any, queue_name: str) -> None:
    # a command the client sends itself
    secret = await make_user(admin, "bullmq-producer", drop=("+evalsha", "+eval"))
    queue = Queue(queue_name, url(server, "bullmq-producer", secret))
    try:
        with pytest.raises(redis_exc.ResponseError, match=r"'eval(sha)?' command") as refused:
            await queue.add("x", {})
        assert error_code(refused.value) == "NOPERM", repr(refused.value)
    finally:
        await queue.close()
    # a key outside the pattern: another prefix (the wording differs: Redis 7.0 "one of the keys",
    # Redis 7.2+ and Valkey "a key"); ACL LOG names the key
    await admin.acl_log_reset()
    secret = await make_user(admin, "bullmq-producer")
    queue = Queue(queue_name, url(server, "bullmq-producer", secret), prefix="other")
    try:
        with pytest.raises(redis_exc.ResponseError) as refused:
            await queue.add("x", {})
        assert error_code(refused.value) == "NOPERM", repr(refused.value)
        keys = {obj for _, obj, _ in await refusals(admin)}
        assert keys and all(key.startswith(f"other:{queue_name}:") for key in keys), keys
    finally:
        await queue.close()
    # a command a script calls: Redis names the script and line (Redis 7.0 "can't run this command or
    # subcommand", Redis 7.2+ and Valkey "ACL failure in script"); ACL LOG names the command
    await admin.acl_log_reset()
    secret = await make_user(admin, "bullmq-producer", drop=("+lpush",))
    queue = Queue(queue_name, url(server, "bullmq-producer", secret))
    try:
        with pytest.raises(redis_exc.ResponseError, match=r"script: [0-9a-f]{40}, on @user_script:\d+") as refused:
            await queue.add("x", {})
        assert error_code(refused.value) == "ERR", repr(refused.value)
        assert ("bullmq-producer", "lpush", "lua") in await refusals(admin)
    finally:
        await queue.close()
    # and no password at connection time: the server wants AUTH
    queue = Queue(queue_name, f"redis://bullmq-producer:wrong@127.0.0.1:{server.port}/0")
    try:
        with pytest.raises(Exception, match="(?i)invalid username-password|WRONGPASS"):
            await queue.add("x", {})
    finally:
        await queue.close()
