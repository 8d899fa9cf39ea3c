"""The queue side of PostgresBackend against Node BullMQ's own PostgreSQL backend, same schema.

Node runs in-process scripts (``node -e``) from interop/, where bullmq 6.7.0 and pg are installed.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from typing import Any, AsyncIterator

import pytest

from bullmq_compat import migrate_postgres
from bullmq_compat._backends.base import NewJob
from bullmq_compat._backends.postgres import migrator
from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._backends.postgres.connection import PostgresConnection
from bullmq_compat._job import Job
from bullmq_compat._wire.options import merge_defaults, normalize_job_options
from tests.node import INTEROP


def _pg_resolvable() -> bool:
    binary = shutil.which("node")
    if binary is None:
        return False
    probe = subprocess.run([binary, "-e", "require.resolve('pg')"], cwd=INTEROP, capture_output=True)
    return probe.returncode == 0


pytestmark = [
    pytest.mark.node,
    # node-postgres comes with the Node PostgreSQL harness (interop/package.json, pg 8.23.1)
    pytest.mark.skipif(not _pg_resolvable(), reason="interop/node_modules has no 'pg' (node-postgres), which "
                       "Node BullMQ's PostgreSQL backend loads: add it to interop/package.json and run make setup"),
]

_NODE = r"""
const bullmq = require('bullmq');
const pg = require('pg');
const args = JSON.parse(process.argv[1]);
const connection = { connectionString: args.url, schema: args.schema };
const { Queue } = bullmq.withBackend(bullmq.createPostgresBackend);

async function main() {
  if (args.op === 'migrate' || args.op === 'check') {
    const client = new pg.Client({ connectionString: args.url });
    await client.connect();
    try {
      return args.op === 'migrate'
        ? await bullmq.runMigrations(client, args.schema)
        : await bullmq.assertSchemaCompatibility(client, args.schema);
    } finally { await client.end(); }
  }
  const queue = new Queue(args.queue, { connection });
  try {
    if (args.op === 'add') {
      const jobs = await queue.addBulk(args.jobs);
      const single = await queue.add(args.single.name, args.single.data, args.single.opts);
      return [...jobs.map(j => j.id), single.id];
    }
    if (args.op === 'get') {
      const out = {};
      for (const id of args.ids) {
        const job = await queue.getJob(id);
        out[id] = job && { name: job.name, data: job.data, opts: job.opts, timestamp: job.timestamp,
                           delay: job.delay, priority: job.priority, state: await job.getState() };
      }
      out.counts = await queue.getJobCounts('waiting', 'delayed', 'prioritized');
      return out;
    }
  } finally { await queue.close(); }
}
main().then(r => { process.stdout.write(JSON.stringify(r === undefined ? null : r)); process.exit(0); },
            e => { process.stdout.write(JSON.stringify({ error: e.message, name: e.name })); process.exit(1); });
"""


async def node(**args: Any) -> Any:
    binary = shutil.which("node")
    if binary is None or not (INTEROP / "node_modules" / "bullmq").is_dir():
        raise RuntimeError("Node.js and interop/node_modules are needed: run `make setup`")
    proc = await asyncio.create_subprocess_exec(binary, "-e", _NODE, json.dumps(args), cwd=INTEROP,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    result = json.loads(out.decode() or "null")
    assert proc.returncode == 0, (result, err.decode())
    return result


def new(name: str, data: Any, job_id: str = "", **opts: Any) -> NewJob:
    return NewJob(name, data, merge_defaults(None, normalize_job_options(opts)), int(time.time() * 1000), job_id)


@pytest.fixture
async def backend(postgres_url: str, pg_migrated: str) -> AsyncIterator[PostgresBackend]:
    b = PostgresBackend(PostgresConnection(postgres_url, schema=pg_migrated), "iq")
    await b.connect()
    try:
        yield b
    finally:
        await b.close()


async def test_a_schema_node_migrated_passes_our_check_and_our_migrator_leaves_it(postgres_url: str,
                                                                                   pg_schema: str) -> None:
    assert await node(op="migrate", url=postgres_url, schema=pg_schema) == 11
    conn = PostgresConnection(postgres_url, schema=pg_schema)
    try:
        assert await conn.connect() == 11
        before = (await conn.execute("SELECT version, name, min_client_version, applied_at FROM migration")).rows
        assert await migrate_postgres(postgres_url, pg_schema) == 11
        assert (await conn.execute("SELECT version, name, min_client_version, applied_at FROM migration")).rows \
            == before
    finally:
        await conn.close()


async def test_a_schema_we_migrated_passes_nodes_check_and_its_migrator_leaves_it(postgres_url: str,
                                                                                   pg_migrated: str) -> None:
    assert await node(op="check", url=postgres_url, schema=pg_migrated) == 11
    assert await node(op="migrate", url=postgres_url, schema=pg_migrated) == 11
    async with await __import__("psycopg").AsyncConnection.connect(postgres_url) as conn:
        assert await migrator.check_schema(conn, pg_migrated) == 11


async def test_jobs_node_adds_read_back_through_our_backend(postgres_url: str, backend: PostgresBackend) -> None:
    jobs = [{"name": "plain", "data": "plain"}, {"name": "num", "data": 7},
            {"name": "obj", "data": {"a": [1, {"b": None}]}, "opts": {"jobId": "custom-1", "priority": 3}}]
    single = {"name": "later", "data": {"x": 1}, "opts": {"delay": 60000, "attempts": 4,
                                                          "removeOnComplete": 10, "keepLogs": 2}}
    ids = await node(op="add", url=postgres_url, schema=backend.connection.schema, queue="iq", jobs=jobs,
                     single=single)
    assert ids == ["1", "2", "custom-1", "3"]
    read = {job_id: Job.from_raw(None, job_id, await backend.get_job(job_id) or {})  # type: ignore[arg-type]
            for job_id in ids}
    assert [read[i].data for i in ids] == ["plain", 7, {"a": [1, {"b": None}]}, {"x": 1}]
    assert read["custom-1"].priority == 3 and await backend.get_state("custom-1") == "prioritized"
    later = read["3"]
    assert (later.delay, later.opts["attempts"], later.opts["remove_on_complete"], later.opts["keep_logs"]) == \
        (60000, 4, 10, 2)
    assert await backend.get_state("3") == "delayed"
    assert await backend.get_counts(["waiting", "delayed", "prioritized"]) == [2, 1, 1]


async def test_jobs_we_add_read_back_in_node(postgres_url: str, backend: PostgresBackend) -> None:
    ids = await backend.add_jobs([new("plain", "plain"), new("num", 7), new("obj", {"k": "é"}, job_id="c-1",
                                                                             priority=2)])
    [later] = await backend.add_jobs([new("later", {"x": 1}, delay=60000, attempts=4, remove_on_fail=True)])
    assert ids == ["1", "2", "c-1"] and later == "3"
    seen = await node(op="get", url=postgres_url, schema=backend.connection.schema, queue="iq",
                      ids=[*ids, later])
    assert [seen[i]["data"] for i in ids] == ["plain", 7, {"k": "é"}]
    assert [seen[i]["state"] for i in [*ids, later]] == ["waiting", "waiting", "prioritized", "delayed"]
    assert seen[later]["opts"] == {"attempts": 4, "delay": 60000, "removeOnFail": True}
    assert (seen[later]["delay"], seen["c-1"]["priority"]) == (60000, 2)
    assert seen["counts"] == {"waiting": 2, "delayed": 1, "prioritized": 1}
