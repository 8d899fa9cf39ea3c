"""bullmq-compat: a Python client wire-compatible with Node.js BullMQ, with per-group FIFO.

>>> from bullmq_compat import Queue
>>> queue = Queue("emails", connection="redis://127.0.0.1:6379/0")
>>> job = await queue.add("send", {"to": "a@b"}, attempts=3)
"""
from bullmq_compat._backends.postgres.migrator import drop_postgres_groups, migrate_postgres
from bullmq_compat._batch import BatchedJob, BatchJob
from bullmq_compat._busy_poll import busy_poll_budget, set_busy_poll
from bullmq_compat._cancellation import AbortController, AbortError, AbortSignal, WaitingError
from bullmq_compat._errors import (
    BullMQCompatError,
    DelayedError,
    ErrorCode,
    GroupMaxSizeExceeded,
    GroupsNotInstalled,
    InvalidArgument,
    InvalidJobData,
    InvalidJobId,
    InvalidJobOptions,
    InvalidQueueName,
    InvalidSchemaName,
    JobBelongsToJobScheduler,
    JobFailed,
    JobHasFailedChildren,
    JobLockMismatch,
    JobLockNotFound,
    JobNotFound,
    JobNotInState,
    JobPendingChildren,
    JobWaitTimeout,
    MetricsTime,
    MetricsUnavailable,
    NotSupportedOnBackend,
    ParentJobCannotBeReplaced,
    ParentJobNotFound,
    PostgresDriverMissing,
    PostgresUnavailable,
    QueueClosed,
    RateLimitError,
    RedisOutOfMemory,
    RedisUnavailable,
    RelayError,
    SchedulerJobIdCollision,
    SchedulerJobSlotsBusy,
    SchemaMigrationRequired,
    SchemaVersionMismatch,
    ScriptError,
    UnrecoverableError,
    UnsupportedPostgresVersion,
    UpstreamScriptsMissing,
    WaitingChildrenError,
)
from bullmq_compat._flow import FlowProducer, JobNode
from bullmq_compat._groups import GroupJobRefused, GroupKeeper
from bullmq_compat._job import Job
from bullmq_compat._job_ids import uuid7_ids
from bullmq_compat._lock_manager import LockManager
from bullmq_compat._prometheus import (  # prometheus_client is imported on first use only
    serve_worker_metrics,
    stop_worker_metrics,
    worker_metrics_port,
    worker_metrics_registry,
)
from bullmq_compat._queue import JobScheduler, Queue
from bullmq_compat._queue_events import QueueEvents, QueueEventsProducer
from bullmq_compat._relay import Relay, RelayMessage
from bullmq_compat._sandbox import ChildCrashed, SandboxedJob
from bullmq_compat._scheduler import default_repeat_strategy
from bullmq_compat._telemetry import Telemetry
from bullmq_compat._version import __version__
from bullmq_compat._wire.options import JobOptions
from bullmq_compat._wire.upstream import UPSTREAM_VERSION
from bullmq_compat._worker import Worker

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "BatchJob",
    "BatchedJob",
    "BullMQCompatError",
    "ChildCrashed",
    "DelayedError",
    "ErrorCode",
    "FlowProducer",
    "GroupJobRefused",
    "GroupKeeper",
    "GroupMaxSizeExceeded",
    "GroupsNotInstalled",
    "InvalidArgument",
    "InvalidJobData",
    "InvalidJobId",
    "InvalidJobOptions",
    "InvalidQueueName",
    "InvalidSchemaName",
    "Job",
    "JobBelongsToJobScheduler",
    "JobFailed",
    "JobHasFailedChildren",
    "JobLockMismatch",
    "JobLockNotFound",
    "JobNode",
    "JobNotFound",
    "JobNotInState",
    "JobOptions",
    "JobPendingChildren",
    "JobScheduler",
    "JobWaitTimeout",
    "LockManager",
    "MetricsTime",
    "MetricsUnavailable",
    "NotSupportedOnBackend",
    "ParentJobCannotBeReplaced",
    "ParentJobNotFound",
    "PostgresDriverMissing",
    "PostgresUnavailable",
    "Queue",
    "QueueClosed",
    "QueueEvents",
    "QueueEventsProducer",
    "RateLimitError",
    "RedisOutOfMemory",
    "RedisUnavailable",
    "Relay",
    "RelayError",
    "RelayMessage",
    "SandboxedJob",
    "SchedulerJobIdCollision",
    "SchedulerJobSlotsBusy",
    "SchemaMigrationRequired",
    "SchemaVersionMismatch",
    "ScriptError",
    "Telemetry",
    "UPSTREAM_VERSION",
    "UnrecoverableError",
    "UnsupportedPostgresVersion",
    "UpstreamScriptsMissing",
    "WaitingChildrenError",
    "WaitingError",
    "Worker",
    "__version__",
    "busy_poll_budget",
    "default_repeat_strategy",
    "drop_postgres_groups",
    "migrate_postgres",
    "serve_worker_metrics",
    "set_busy_poll",
    "stop_worker_metrics",
    "uuid7_ids",
    "worker_metrics_port",
    "worker_metrics_registry",
]
