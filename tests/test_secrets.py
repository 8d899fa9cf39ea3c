"""Secrets are never printed: every connection failure we know of names the connection with its
password masked, in exception messages (chained ones included), log records, ``repr()`` and CLI
output (issue: the password landed in every log and error tracker).

The failures: connection refused, wrong password, unknown host, TLS verification failure (a CA
that did not sign the server's certificate), a URL missing its scheme, a URL of another backend
(``postgresql://``), a password in the query string or in a dict of redis-py options; each for
Queue, Worker, QueueEvents, FlowProducer and GroupKeeper, and for the CLI.
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator

import pytest

from bullmq_compat import FlowProducer, Queue, QueueEvents, Worker
from bullmq_compat._errors import BullMQCompatError
from bullmq_compat._groups import GroupKeeper
from bullmq_compat._secrets import redact_kwargs, redact_nodes, redact_url, scrub, secrets_of
from tests._redis_server import RedisServer, free_port
from tests._tls import TLSRedisServer

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cretpw-Zq7"  # what must appear nowhere
RIGHT_PASSWORD = "the-right-one-Kx2"


# -- the redactor ---------------------------------------------------------------------------------

@pytest.mark.parametrize("url, shown", [
    ("redis://default:s3cretpw@127.0.0.1:1/0", "redis://default:***@127.0.0.1:1/0"),
    ("rediss://:s3cretpw@cache.internal:6380/2", "rediss://:***@cache.internal:6380/2"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://app@127.0.0.1:6379/0", "redis://app@127.0.0.1:6379/0"),  # a user alone is no secret
    ("redis://u:p%40ss@h/0", "redis://u:***@h/0"),
    ("redis://u:pa/ss#w@rd@h:6379/0", "redis://u:***@h:6379/0"),  # unencoded / # @ in the password
    ("redis://h:6379/0?password=s3cretpw&db=1", "redis://h:6379/0?password=***&db=1"),
    ("unix:///run/redis.sock?db=0&password=s3cretpw", "unix:///run/redis.sock?db=0&password=***"),
    ("default:s3cretpw@127.0.0.1:6379/0", "default:***@127.0.0.1:6379/0"),  # no scheme
    ("postgresql://app:s3cretpw@127.0.0.1/db", "postgresql://app:***@127.0.0.1/db"),
    ("postgres://app:s3cretpw@db.internal:5432/jobs?sslmode=verify-full&sslrootcert=/ca.pem",
     "postgres://app:***@db.internal:5432/jobs?sslmode=verify-full&sslrootcert=/ca.pem"),
    ("postgresql://db.internal/jobs?user=app&password=s3cretpw", "postgresql://db.internal/jobs?user=app&password=***"),
    ("host=db.internal user=app password=s3cretpw dbname=jobs", "host=db.internal user=app password=*** dbname=jobs"),
    ("host=db password='s3 cret\\' pw' sslmode=require", "host=db password=*** sslmode=require"),
    ("127.0.0.1:6379", "127.0.0.1:6379"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    for secret in secrets_of(url):
        assert secret not in redact_url(url)


def test_redact_kwargs_and_node_lists() -> None:
    kwargs = {"host": "h", "port": 6379, "password": SECRET, "username": "app",
              "sentinel_kwargs": {"password": SECRET}, "url": f"redis://:{SECRET}@h/0", "ssl_password": SECRET}
    shown = redact_kwargs(kwargs)
    assert SECRET not in repr(shown)
    assert shown["host"] == "h" and shown["username"] == "app" and shown["password"] == "***"
    assert set(secrets_of(kwargs)) == {SECRET}
    assert redact_nodes([("10.0.0.1", 26379), ("10.0.0.2", 26379)]) == "10.0.0.1:26379,10.0.0.2:26379"
    assert redact_nodes([f"redis://:{SECRET}@10.0.0.3:7000"]) == "redis://:***@10.0.0.3:7000"
    assert scrub(f"AUTH {SECRET} failed for redis://u:{SECRET}@h", [SECRET]) == "AUTH *** failed for redis://u:***@h"


async def test_sentinel_and_cluster_node_lists_are_shown_without_passwords(queue_name: str) -> None:
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.sentinel import Sentinel

    from bullmq_compat._backends.redis.connection import RedisHandle

    sentinel = Sentinel([("127.0.0.1", free_port()), ("127.0.0.1", free_port())],
                        sentinel_kwargs={"password": SECRET}, password=SECRET)
    handle = RedisHandle(sentinel.master_for("mymaster", password=SECRET))
    assert handle.description.startswith("Sentinel service 'mymaster' via 127.0.0.1:")
    assert SECRET in handle.secrets  # known, so it can be scrubbed from drivers' messages
    cluster = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", free_port())], password=SECRET)
    handle = RedisHandle(cluster)
    assert handle.description.startswith("Redis Cluster 127.0.0.1:") and SECRET in handle.secrets
    for client in (cluster, sentinel.master_for("mymaster", password=SECRET)):
        queue = Queue(queue_name, client)
        assert SECRET not in repr(queue)
        with pytest.raises(Exception) as caught:  # nothing listens there: the failure names the nodes
            await asyncio.wait_for(queue.add("n", {}), 60)
        text = str(caught.value) + "".join(traceback.format_exception(caught.value))
        assert SECRET not in text and "127.0.0.1:" in str(caught.value), text
        await queue.close()
        await client.aclose()


# -- every failure, every class -------------------------------------------------------------------

@pytest.fixture(scope="module")
def auth_server() -> Iterator[RedisServer]:
    server = RedisServer(extra_args=("--requirepass", RIGHT_PASSWORD)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSRedisServer]:
    server = TLSRedisServer().start()
    try:
        yield server
    finally:
        server.stop()


def failures(auth: RedisServer, tls: TLSRedisServer) -> dict[str, Any]:
    return {
        "refused": f"redis://default:{SECRET}@127.0.0.1:{free_port()}/0",
        "wrong password": f"redis://default:{SECRET}@127.0.0.1:{auth.port}/0",
        "wrong password, no user": f"redis://:{SECRET}@127.0.0.1:{auth.port}/0",
        "unknown host": f"redis://default:{SECRET}@no-such-host.invalid:6379/0",
        "TLS verify failure": f"rediss://default:{SECRET}@127.0.0.1:{tls.tls_port}/0?ssl_ca_certs={tls.pki.other_ca}",
        "missing schema": f"default:{SECRET}@127.0.0.1:{auth.port}/0",
        "another backend's URL": f"postgresql://app:{SECRET}@127.0.0.1/jobs",
        "password in the query": f"redis://127.0.0.1:{auth.port}/0?password={SECRET}",
        "dict of options": {"host": "127.0.0.1", "port": auth.port, "password": SECRET},
        "dict with a URL": {"url": f"redis://default:{SECRET}@127.0.0.1:{auth.port}/0"},
    }


FAILURE_NAMES = ["refused", "wrong password", "wrong password, no user", "unknown host", "TLS verify failure",
                 "missing schema", "another backend's URL", "password in the query", "dict of options",
                 "dict with a URL"]


async def noop(job: Any) -> None:
    return None


async def provoke(kind: str, connection: Any, queue_name: str) -> tuple[BaseException, list[str]]:
    """Make ``kind`` (Queue, Worker...) fail on ``connection``: its exception and the texts it showed."""
    shown: list[str] = []
    obj: Any = None
    try:
        if kind == "Queue":
            obj = Queue(queue_name, connection)
            shown.append(repr(obj))
            await obj.add("n", {})
        elif kind == "FlowProducer":
            obj = FlowProducer(connection)
            shown.append(repr(obj))
            await obj.add({"name": "n", "queue_name": queue_name, "data": {}})
        elif kind == "QueueEvents":
            obj = QueueEvents(queue_name, connection, autorun=False)
            shown.append(repr(obj))
            await obj.wait_until_ready()
        elif kind == "GroupKeeper":
            obj = GroupKeeper(queue_name, connection)
            shown.append(repr(obj))
            await obj.sweep()
        elif kind == "Worker":
            obj = Worker(queue_name, noop, connection)
            shown.append(repr(obj))
            errors: list[BaseException] = []
            obj.on("error", errors.append)
            task = asyncio.ensure_future(obj.run(handle_signals=False))
            try:
                for _ in range(3000):  # a worker waits for Redis (as Node's): it reports, retries
                    if errors or task.done():
                        break
                    await asyncio.sleep(0.01)
            finally:
                await obj.close()
                await asyncio.wait_for(task, 30)
            assert errors, "the worker reported no error"
            raise errors[0]
    except BaseException as err:  # noqa: BLE001 - what we look at
        shown += [str(err), repr(err), "".join(traceback.format_exception(err))]
        return err, shown
    finally:
        if obj is not None:
            await obj.close()
    raise AssertionError(f"{kind} did not fail")


@pytest.mark.parametrize("failure", FAILURE_NAMES)
@pytest.mark.parametrize("kind", ["Queue", "Worker", "QueueEvents", "FlowProducer", "GroupKeeper"])
async def test_no_failure_shows_the_password(kind: str, failure: str, auth_server: RedisServer,
                                             tls_server: TLSRedisServer, queue_name: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    connection = failures(auth_server, tls_server)[failure]
    caplog.set_level(logging.DEBUG)  # every logger: ours, redis-py's, asyncio's
    err, shown = await asyncio.wait_for(provoke(kind, connection, queue_name), 60)
    assert isinstance(err, (BullMQCompatError, ConnectionError)), repr(err)
    logs = [record.getMessage() for record in caplog.records]
    logs += [logging.Formatter().formatException(r.exc_info) for r in caplog.records if r.exc_info]
    for text in shown + logs:
        assert SECRET not in text, text
    message = str(err)
    if failure == "another backend's URL" and kind != "GroupKeeper":
        # a postgresql:// URL is the PostgreSQL backend's (groups, and so the keeper, are Redis-only)
        assert "PostgreSQL" in message and "***" in message, message
    elif failure in ("missing schema", "another backend's URL"):
        assert "is not a Redis URL" in message and "***" in message
    elif failure == "TLS verify failure":
        assert "CERTIFICATE_VERIFY_FAILED" in message and "ssl_ca_certs" in message, message
    elif failure.startswith("dict of"):
        assert f"redis://127.0.0.1:{auth_server.port}/0" in message, message  # named, password-free
    else:
        assert "cannot reach Redis at" in message, message
    if isinstance(connection, str):
        assert redact_url(connection) in message, message  # it still says which connection


# -- the command line -----------------------------------------------------------------------------

def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=str(ROOT), capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("failure", [f for f in FAILURE_NAMES if not f.startswith("dict")])
def test_the_cli_never_prints_the_password(failure: str, auth_server: RedisServer,
                                           tls_server: TLSRedisServer) -> None:
    url = failures(auth_server, tls_server)[failure]
    for argv in (["add", "--queue", "q", "--name", "n", "--data", "{}"], ["info"], ["pause", "--queue", "q"]):
        result = cli(*argv, "--redis", url)
        output = result.stdout + result.stderr
        assert result.returncode == 2, output
        assert SECRET not in output, output
        assert "Traceback" not in output, output
        assert output.startswith("bullmq-compat: ") or "bullmq-compat: " in output, output


def test_cli_help_does_not_show_the_password_of_redis_url() -> None:
    result = cli("info", "--help", env={"REDIS_URL": f"redis://default:{SECRET}@127.0.0.1:6379/0"})
    assert result.returncode == 0
    assert SECRET not in result.stdout and "redis://default:***@127.0.0.1:6379/0" in result.stdout


def test_keeper_banner_masks_the_password(auth_server: RedisServer) -> None:
    """`bullmq-compat keeper` says where it runs: with the password masked."""
    url = f"redis://:{RIGHT_PASSWORD}@127.0.0.1:{auth_server.port}/0"
    proc = subprocess.Popen([sys.executable, "-m", "bullmq_compat", "keeper", "--queue", "q", "--redis", url],
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert f"keeper running for q on redis://:***@127.0.0.1:{auth_server.port}/0" in banner, banner + err
    assert RIGHT_PASSWORD not in banner + out + err
