"""PostgresBackend, job schedulers (Node's addJobScheduler ... getJobSchedulersCount), against a real
PostgreSQL (a migrated schema per test)."""
from __future__ import annotations

import pytest

from bullmq_compat._backends.postgres.backend import PostgresBackend
from bullmq_compat._errors import JobBelongsToJobScheduler
from tests.postgres_helpers import now

# -- job schedulers ---------------------------------------------------------------------------------

async def test_a_job_scheduler_enqueues_its_next_iteration(pg_backend: PostgresBackend) -> None:
    next_millis = now() + 5000
    job_id, delay = await pg_backend.add_job_scheduler_node(
        "every-5s", next_millis, '{"x": 1}', {"attempts": 2}, {"name": "tick", "every": 5000},
        {"jobId": f"repeat:every-5s:{next_millis}", "delay": 5000, "repeatJobKey": "every-5s",
         "prevMillis": next_millis})
    fields, next_run = await pg_backend.get_job_scheduler_node("every-5s")
    assert fields is not None and next_run is not None
    assert job_id == f"repeat:every-5s:{next_run}"  # for `every`, upstream picks the slot itself
    assert 0 <= delay <= 5000
    assert await pg_backend.get_state(job_id) in ("delayed", "waiting")
    assert (fields["name"], fields["every"], fields["data"]) == ("tick", "5000", '{"x":1}')
    assert await pg_backend.get_job_schedulers_count() == 1
    assert await pg_backend.get_job_schedulers_range(0, -1, True) == [("every-5s", next_run)]
    assert await pg_backend.is_job_scheduler("every-5s") is True
    with pytest.raises(JobBelongsToJobScheduler):
        await pg_backend.remove(job_id, False)
    assert await pg_backend.remove_job_scheduler_node("every-5s") == 0  # upstream: 0 = removed
    assert await pg_backend.get_job_scheduler_node("every-5s") == (None, None)
    assert await pg_backend.get_job_schedulers_count() == 0


async def test_only_the_current_iterations_producer_advances_a_scheduler(pg_backend: PostgresBackend) -> None:
    first = now() + 60000
    job_id, _ = await pg_backend.add_job_scheduler_node("cron", first, "{}", {}, {"name": "c", "pattern": "* * * * *"},
                                                {"jobId": f"repeat:cron:{first}", "delay": 60000})
    assert job_id == f"repeat:cron:{first}"
    second = first + 60000
    assert await pg_backend.update_job_scheduler_next_millis("cron", second, "{}", {"delay": 120000}) is None
    assert await pg_backend.update_job_scheduler_next_millis("cron", second, "{}", {"delay": 120000},
                                                          producer_id=job_id) == f"repeat:cron:{second}"
    assert (await pg_backend.get_job_scheduler_node("cron"))[1] == str(second)
    assert await pg_backend.update_job_scheduler_next_millis("gone", second, "{}", {}) is None


async def test_removing_a_missing_scheduler_answers_1_as_upstream(pg_backend: PostgresBackend) -> None:
    assert await pg_backend.remove_job_scheduler_node("nope") == 1
