"""bullmq-compat: a Python client wire-compatible with Node.js BullMQ, with per-group FIFO.

>>> from bullmq_compat import Queue
>>> queue = Queue("emails", connection="redis://127.0.0.1:6379/0")
>>> job = await queue.add("send", {"to": "a@b"}, attempts=3)
"""
from bullmq_compat._errors import (
    BullMQCompatError,
    DelayedError,
    InvalidArgument,
    InvalidJobData,
    InvalidJobId,
    InvalidJobOptions,
    InvalidQueueName,
    JobBelongsToJobScheduler,
    JobFailed,
    JobHasFailedChildren,
    JobLockMismatch,
    JobLockNotFound,
    JobNotFound,
    JobNotInState,
    JobPendingChildren,
    JobWaitTimeout,
    ParentJobCannotBeReplaced,
    ParentJobNotFound,
    QueueClosed,
    RateLimitError,
    RedisUnavailable,
    SchedulerJobIdCollision,
    SchedulerJobSlotsBusy,
    ScriptError,
    UnrecoverableError,
    UpstreamScriptsMissing,
    WaitingChildrenError,
)
from bullmq_compat._flow import FlowProducer, JobNode
from bullmq_compat._job import Job
from bullmq_compat._queue import Queue
from bullmq_compat._queue_events import QueueEvents, QueueEventsProducer
from bullmq_compat._sandbox import ChildCrashed, SandboxedJob
from bullmq_compat._wire.options import JobOptions
from bullmq_compat._wire.upstream import UPSTREAM_VERSION
from bullmq_compat._worker import Worker

__version__ = "0.1.0"

__all__ = [
    "BullMQCompatError", "ChildCrashed", "DelayedError", "RateLimitError", "SandboxedJob",
    "UnrecoverableError", "WaitingChildrenError", "Worker", "InvalidArgument",
    "InvalidJobData", "InvalidJobId", "InvalidJobOptions",
    "InvalidQueueName", "Job", "JobOptions", "JobBelongsToJobScheduler", "JobHasFailedChildren", "JobLockMismatch",
    "JobLockNotFound", "JobNotFound", "JobNotInState", "JobPendingChildren", "ParentJobCannotBeReplaced",
    "ParentJobNotFound", "Queue", "QueueClosed", "RedisUnavailable", "SchedulerJobIdCollision", "SchedulerJobSlotsBusy",
    "ScriptError", "UPSTREAM_VERSION", "UpstreamScriptsMissing", "__version__",
]
__all__ += ["JobFailed", "JobWaitTimeout", "QueueEvents", "QueueEventsProducer"]
__all__ += ["FlowProducer", "JobNode"]
from bullmq_compat._groups import GroupJobRefused, GroupKeeper  # noqa: E402
from bullmq_compat._telemetry import Telemetry  # noqa: E402

__all__ += ["GroupJobRefused", "GroupKeeper", "Telemetry"]
from bullmq_compat._backends.postgres.migrator import migrate_postgres  # noqa: E402
from bullmq_compat._errors import (  # noqa: E402
    InvalidSchemaName,
    PostgresDriverMissing,
    PostgresUnavailable,
    SchemaMigrationRequired,
    SchemaVersionMismatch,
    UnsupportedPostgresVersion,
)

__all__ += ["InvalidSchemaName", "PostgresDriverMissing", "PostgresUnavailable", "SchemaMigrationRequired",
            "SchemaVersionMismatch", "UnsupportedPostgresVersion", "migrate_postgres"]
from bullmq_compat._errors import ErrorCode, MetricsTime, NotSupportedOnBackend  # noqa: E402
from bullmq_compat._queue import JobScheduler  # noqa: E402
from bullmq_compat._scheduler import default_repeat_strategy  # noqa: E402

__all__ += ["ErrorCode", "JobScheduler", "MetricsTime", "NotSupportedOnBackend", "default_repeat_strategy"]
from bullmq_compat._cancellation import AbortController, AbortError, AbortSignal, WaitingError  # noqa: E402
from bullmq_compat._lock_manager import LockManager  # noqa: E402

__all__ += ["AbortController", "AbortError", "AbortSignal", "LockManager", "WaitingError"]
from bullmq_compat._job_ids import uuid7_ids  # noqa: E402

__all__ += ["uuid7_ids"]
from bullmq_compat._errors import MetricsUnavailable  # noqa: E402
from bullmq_compat._prometheus import (  # noqa: E402  (prometheus_client is imported on first use only)
    serve_worker_metrics,
    stop_worker_metrics,
    worker_metrics_port,
    worker_metrics_registry,
)

__all__ += ["MetricsUnavailable", "serve_worker_metrics", "stop_worker_metrics", "worker_metrics_port",
            "worker_metrics_registry"]

from bullmq_compat._batch import BatchedJob, BatchJob  # noqa: E402

__all__ += ["BatchJob", "BatchedJob"]
from bullmq_compat._busy_poll import busy_poll_budget, set_busy_poll  # noqa: E402

__all__ += ["busy_poll_budget", "set_busy_poll"]
