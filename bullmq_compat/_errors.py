"""One exception hierarchy: every error says what the caller did and what to do.

The upstream Lua scripts answer some calls with a negative code; `script_error` turns
each code into a named exception carrying the message Node BullMQ gives for it.
"""
from __future__ import annotations

from typing import Any, Optional


class BullMQCompatError(Exception):
    """Base class of every error raised by bullmq-compat."""


class UpstreamScriptsMissing(BullMQCompatError):
    """The upstream BullMQ Lua scripts have not been fetched into the package yet."""


class InvalidArgument(BullMQCompatError, ValueError):
    """Bad input refused at the edge, before anything is written to Redis."""


class InvalidQueueName(InvalidArgument):
    """A queue name that is empty, not a string, or contains ':'."""


class InvalidJobId(InvalidArgument):
    """A custom job id that Node BullMQ would refuse or misread."""


class InvalidJobData(InvalidArgument):
    """Job data (or a return value) that cannot be stored as JSON."""


class InvalidJobOptions(InvalidArgument):
    """An unknown job option, or a value outside the option's rule."""


class RedisUnavailable(BullMQCompatError, ConnectionError):
    """Redis could not be reached at the configured address."""


class RedisOutOfMemory(BullMQCompatError):
    """Redis refused a write with its OOM reply: used memory is over ``maxmemory`` and the
    ``maxmemory-policy`` (``noeviction``) lets it evict nothing. The refused call wrote nothing (a
    script is refused at its first write); `reply` is Redis's own error. Retry once memory frees."""

    def __init__(self, what: str, reply: BaseException) -> None:
        """``what`` names the refused call and its queue; ``reply`` is the error Redis answered."""
        super().__init__(
            f"{what} refused: Redis is out of memory (used memory > 'maxmemory', and maxmemory-policy "
            f"noeviction lets it evict nothing); nothing was written. Free memory or raise maxmemory, "
            f"then retry. Redis said: {reply}")
        self.reply = reply


def is_out_of_memory(err: BaseException) -> bool:
    """Redis's OOM reply, as redis-py raises it (``OutOfMemoryError``) or the fast path (code ``OOM``)."""
    return isinstance(err, RedisOutOfMemory) or getattr(err, "code", None) == "OOM" or any(
        cls.__name__ == "OutOfMemoryError" for cls in type(err).__mro__)


class QueueClosed(BullMQCompatError):
    """A call on a Queue (Worker, QueueEvents, FlowProducer...) after its ``close()``: it does not
    reconnect; create a new one."""


class ScriptError(BullMQCompatError):
    """An upstream script refused the call with a negative code (see `code`)."""

    code: int = 0

    def __init__(self, message: str, *, job_id: Optional[str] = None, command: str = "") -> None:
        """``message`` is Node's text for the code; ``job_id`` and ``command`` name the job and the
        script that refused it."""
        super().__init__(message)
        self.job_id = job_id
        self.command = command
        #: the parent's key, for the codes about a parent (-5, -7)
        self.parent_key: Optional[str] = None


class JobNotFound(ScriptError):
    """Code -1: the job's hash is missing (Node: "Missing key for job")."""
    code = -1


class JobLockNotFound(ScriptError):
    """Code -2: the job has no lock (it stalled, or another worker took it over)."""
    code = -2


class JobNotInState(ScriptError):
    """Code -3: the job is not in the state the call needs (e.g. promoting a job that is not delayed)."""
    code = -3


class JobPendingChildren(ScriptError):
    """Code -4: the job still has unfinished children."""
    code = -4


class ParentJobNotFound(ScriptError):
    """Code -5: the flow parent named by the job is missing (see `parent_key`)."""
    code = -5


class JobLockMismatch(ScriptError):
    """Code -6: the job's lock is held under another token (another worker took the job over)."""
    code = -6


class ParentJobCannotBeReplaced(ScriptError):
    """Code -7: a job with this id exists as a parent and cannot be replaced (see `parent_key`)."""
    code = -7


class JobBelongsToJobScheduler(ScriptError):
    """Code -8: the job is a job scheduler's next job and cannot be removed directly."""
    code = -8


class JobHasFailedChildren(ScriptError):
    """Code -9: the job cannot complete because at least one child failed."""
    code = -9


class SchedulerJobIdCollision(ScriptError):
    """Code -10: a job scheduler's next iteration has an id that already exists."""
    code = -10


class SchedulerJobSlotsBusy(ScriptError):
    """Code -11: a job scheduler's current and next time slots already have jobs."""
    code = -11


# code -> (exception class, message template); the messages are Node BullMQ's.
_SCRIPT_ERRORS: dict[int, tuple[type[ScriptError], str]] = {
    -1: (JobNotFound, "Missing key for job {job_id}. {command}"),
    -2: (JobLockNotFound, "Missing lock for job {job_id}. {command}"),
    -3: (JobNotInState, "Job {job_id} is not in the {state} state. {command}"),
    -4: (JobPendingChildren, "Job {job_id} has pending dependencies. {command}"),
    -5: (ParentJobNotFound, "Missing key for parent job {parent_key}. {command}"),
    -6: (JobLockMismatch, "Lock mismatch for job {job_id}. Cmd {command} from {state}"),
    -7: (ParentJobCannotBeReplaced, "The parent job {parent_key} cannot be replaced. {command}"),
    -8: (JobBelongsToJobScheduler,
         "Job {job_id} belongs to a job scheduler and cannot be removed directly. {command}"),
    -9: (JobHasFailedChildren,
         "Cannot complete job {job_id} because it has at least one failed child. {command}"),
    -10: (SchedulerJobIdCollision,
          "Cannot create job scheduler iteration - job ID already exists. {command}"),
    -11: (SchedulerJobSlotsBusy,
          "Cannot create job scheduler iteration - current and next time slots already have jobs. {command}"),
}


def script_error(code: int, *, job_id: Optional[str] = None, command: str = "", state: str = "",
                 parent_key: Optional[str] = None) -> ScriptError:
    """The exception for an upstream script's negative return `code`."""
    entry = _SCRIPT_ERRORS.get(int(code))
    if entry is None:
        err = ScriptError(f"Unknown code {code} error for {job_id}. {command}", job_id=job_id, command=command)
        err.code = int(code)
        return err
    cls, template = entry
    message = template.format(job_id=job_id, command=command, state=state, parent_key=parent_key)
    err = cls(message, job_id=job_id, command=command)
    err.parent_key = parent_key
    return err


# -- raised by processors to steer what the worker does with the job --------------------------
class UnrecoverableError(BullMQCompatError):
    """Raise from a processor to fail the job at once, whatever attempts remain."""


class RateLimitError(BullMQCompatError):
    """Raise (after `worker.rate_limit(ms)`) to put the job back to waiting, not failed."""

    def __init__(self, message: str = "bullmq:rateLimitExceeded") -> None:
        """The message defaults to Node's marker text, which workers recognise."""
        super().__init__(message)


class DelayedError(BullMQCompatError):
    """Raise after `job.move_to_delayed(ts, token)`: the job was moved, do not finish it."""

    def __init__(self, message: str = "bullmq:movedToDelayed") -> None:
        """The message defaults to Node's marker text, which workers recognise."""
        super().__init__(message)


class WaitingChildrenError(BullMQCompatError):
    """Raise after `job.move_to_waiting_children(token)`: the job waits for its children."""

    def __init__(self, message: str = "bullmq:movedToWaitingChildren") -> None:
        """The message defaults to Node's marker text, which workers recognise."""
        super().__init__(message)


# -- raised by Job.wait_until_finished ----------------------------------------------------------
class JobFailed(BullMQCompatError):
    """The job waited for failed; the message (and `failed_reason`) is its failedReason."""

    def __init__(self, failed_reason: str, *, job_id: Optional[str] = None) -> None:
        """``failed_reason`` is the job's failedReason; ``job_id`` the job waited for."""
        super().__init__(failed_reason)
        self.failed_reason = failed_reason
        self.job_id = job_id


class JobWaitTimeout(BullMQCompatError, TimeoutError):
    """No finish notification for the job waited for arrived within the timeout."""


class NotSupportedOnBackend(BullMQCompatError):
    """An operation the queue's backend (Redis or PostgreSQL) does not implement, as in Node."""

    def __init__(self, operation: str, backend: str) -> None:
        """``operation`` is the call refused, ``backend`` the backend's name (``"redis"`` or
        ``"postgres"``)."""
        super().__init__(f"{operation} is not supported on the {backend} backend (Node BullMQ refuses it too)")
        self.operation = operation
        self.backend = backend


# -- the PostgreSQL backend ---------------------------------------------------------------------
class InvalidSchemaName(InvalidArgument):
    """A PostgreSQL schema name outside Node's rule: ``^[A-Za-z_][A-Za-z0-9_$]*$``, at most 63 characters."""


class PostgresUnavailable(BullMQCompatError, ConnectionError):
    """PostgreSQL could not be reached at the configured address (named with its password as ``***``)."""


class PostgresDriverMissing(BullMQCompatError, ImportError):
    """A ``postgresql://`` connection without the PostgreSQL driver: ``pip install 'bullmq-compat[postgres]'``."""


class MetricsUnavailable(BullMQCompatError, ImportError):
    """Prometheus metrics without prometheus_client: ``pip install 'bullmq-compat[metrics]'``."""


class SchemaMigrationRequired(BullMQCompatError):
    """The schema has no migration ledger: run `migrate_postgres`, or connect with ``migrate=True``
    (Node's SchemaMigrationRequiredError)."""

    def __init__(self, schema: str, message: Optional[str] = None) -> None:
        """``schema`` is the PostgreSQL schema that has no migration ledger; ``message`` replaces the
        default text."""
        super().__init__(message or (
            f"PostgreSQL schema {schema!r} is not initialized (it has no migration ledger): run "
            f"bullmq_compat.migrate_postgres(url, schema={schema!r}) once, or connect with migrate=True"))
        self.schema = schema


class GroupsNotInstalled(BullMQCompatError):
    """A group job or group call on a PostgreSQL schema without bullmq-compat's group objects
    (install them with ``migrate_postgres(url, schema=..., groups=True)``)."""

    def __init__(self, schema: str, needed: Optional[str] = None) -> None:
        """``schema`` is the PostgreSQL schema that lacks the group objects; ``needed``: the feature
        that needs newer ones than the schema has (their upgrade is the same call)."""
        what = (f"{needed} needs a newer version of bullmq-compat's group objects than schema {schema!r} has"
                if needed else
                f"groups on PostgreSQL need bullmq-compat's group objects in schema {schema!r}, which has none")
        super().__init__(
            f"{what}: run bullmq_compat.migrate_postgres(url, schema={schema!r}, groups=True) once, or "
            f"`bullmq-compat migrate --postgres URL --schema {schema} --groups`")
        self.schema = schema


class GroupMaxSizeExceeded(BullMQCompatError):
    """A group add refused because the group already holds its ``max_size`` (BullMQ Pro's
    ``group.maxSize``, its GroupMaxSizeExceededError): the job was not added, nothing was written.

    A group's size is its jobs not started yet: those waiting for their turn behind the gate and
    those released but not yet taken by a worker (waiting, prioritized or delayed, a retry's backoff
    included); active and finished jobs do not count. ``group_id`` and ``max_size`` name the group
    and its limit."""

    def __init__(self, group_id: str, max_size: int, queue: Optional[str] = None) -> None:
        """``group_id``: the group; ``max_size``: the limit the refused add gave; ``queue``: its queue."""
        where = f" of queue {queue!r}" if queue else ""
        super().__init__(
            f"group {group_id!r}{where} already holds max_size={max_size} jobs not started yet (waiting for "
            f"their turn, or released and not taken by a worker; active and finished jobs do not count): the "
            f"job was not added and nothing was written. Catch GroupMaxSizeExceeded to drop it, or retry "
            f"once the group has run some of its jobs")
        self.group_id = group_id
        self.max_size = max_size
        self.queue = queue


class SchemaVersionMismatch(BullMQCompatError):
    """The schema needs a newer client (Node's SchemaVersionMismatchError), or it is older than the
    migrations this client bundles (our own check: Node accepts an older schema silently)."""

    def __init__(self, message: str, *, schema: str, database_version: int, supported_version: int) -> None:
        """The schema's migration version (``database_version``) against the one this client bundles
        (``supported_version``)."""
        super().__init__(message)
        self.schema = schema
        self.database_version = database_version
        self.supported_version = supported_version


class UnsupportedPostgresVersion(BullMQCompatError):
    """The PostgreSQL server is older than the backend supports (Node's UnsupportedPostgresVersionError)."""

    def __init__(self, server_version: str, minimum_version: int) -> None:
        """``server_version`` as the server reports it; ``minimum_version`` the oldest major version
        supported."""
        super().__init__(f"the PostgreSQL backend needs server version {minimum_version} or newer, but the "
                         f"server reports {server_version}: upgrade PostgreSQL")
        self.server_version = server_version
        self.minimum_version = minimum_version


# -- Node's public enums ------------------------------------------------------------------------
import enum as _enum  # noqa: E402


class ErrorCode(_enum.IntEnum):
    """Node's ``ErrorCode``: the negative codes upstream's scripts answer (`script_error` turns
    each into its `ScriptError` subclass, whose ``code`` is one of these)."""

    JOB_NOT_EXIST = -1
    JOB_LOCK_NOT_EXIST = -2
    JOB_NOT_IN_STATE = -3
    JOB_PENDING_CHILDREN = -4
    PARENT_JOB_NOT_EXIST = -5
    JOB_LOCK_MISMATCH = -6
    PARENT_JOB_CANNOT_BE_REPLACED = -7
    JOB_BELONGS_TO_JOB_SCHEDULER = -8
    JOB_HAS_FAILED_CHILDREN = -9
    SCHEDULER_JOB_ID_COLLISION = -10
    SCHEDULER_JOB_SLOTS_BUSY = -11

    @property
    def node_name(self) -> str:
        """The member's name in Node (``JobNotExist`` ...)."""
        return "".join(part.capitalize() for part in self.name.split("_"))


class MetricsTime(_enum.IntEnum):
    """Node's ``MetricsTime``: sizes, in one-minute points, for a worker's ``metrics={"max_data_points": ...}``."""

    ONE_MINUTE = 1
    FIVE_MINUTES = 5
    FIFTEEN_MINUTES = 15
    THIRTY_MINUTES = 30
    ONE_HOUR = 60
    ONE_WEEK = 10080
    TWO_WEEKS = 20160
    ONE_MONTH = 80640


#: upstream's relay error codes (``RelayErrorCode``) and Node's texts for them
RELAY_ERROR_MESSAGES = {
    -1: "Invalid topic",
    -2: "Invalid topic pattern",
    -3: "Relay node is not registered",
    -4: "Message data is too large",
    -5: "Invalid relay node or endpoint id",
    -6: "The relay namespace is in use by nodes with an incompatible BullMQ version",
}


class RelayError(BullMQCompatError):
    """The relay's datastore refused a call (upstream's ``RelayError``): `code` is upstream's negative
    ``RelayErrorCode`` (-1 invalid topic, -2 invalid pattern, -3 node not registered, -4 data too
    large, -5 invalid id, -6 incompatible layout), the message Node's text, then the detail."""

    INVALID_TOPIC = -1
    INVALID_PATTERN = -2
    NODE_NOT_REGISTERED = -3
    DATA_TOO_LARGE = -4
    INVALID_ID = -5
    INCOMPATIBLE_LAYOUT = -6

    def __init__(self, code: int, detail: Optional[str] = None) -> None:
        """``code``: upstream's code; ``detail``: what was refused (the topic, pattern or node id)."""
        text = RELAY_ERROR_MESSAGES.get(code, f"Relay error {code}")
        super().__init__(f"{text}: {detail}" if detail else text)
        self.code = code
        self.detail = detail


def check_relay_result(result: Any, detail: Optional[str] = None) -> Any:
    """Upstream's ``checkRelayResult``: a negative integer reply raises `RelayError`, else the reply."""
    if isinstance(result, int) and not isinstance(result, bool) and result < 0:
        raise RelayError(result, detail)
    return result
