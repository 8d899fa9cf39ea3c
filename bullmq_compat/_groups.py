"""Per-group FIFO: one job at a time per group (or k), groups in parallel, under any worker.

Jobs of a group wait behind a gate our scripts own (``bullmq_compat/_backends/redis/lua/``): only
the head of each group is visible to workers, whichever language they are written in. The rest are
held, and listed in upstream's ``waiting-children`` set so Bull-Board and ``getJobCounts`` show
them. Whoever finishes a group job releases the next: a bullmq-compat worker finishes group jobs
through our moveToFinishedGroup script (upstream's moveToFinished, unchanged, then the release, in
one call); jobs finished by Node workers are released by a `GroupKeeper` that follows the queue's
events stream and sweeps the group index. Release is idempotent, and safety never depends on the
keeper: without one, held jobs only wait longer.

This module is the feature's API and its option rules; the gate itself is the Redis backend's
(``_backends/redis/groups.py``; on PostgreSQL ``_backends/postgres/groups.py``, where our triggers
release the next job inside the transaction that finishes one: no keeper).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from bullmq_compat._errors import BullMQCompatError, GroupMaxSizeExceeded, InvalidArgument, InvalidJobOptions

if TYPE_CHECKING:
    from bullmq_compat._backends.base import GroupGate, QueueBackend

#: (-100, a flow parent refused, is no longer answered: group jobs may be flow children)
KEEP_LAST_BEHIND_PLAIN_REFUSED = -101
GROUP_MAX_SIZE_REFUSED = -102
#: a group priority that is not an int from 0 to GROUP_PRIORITY_LIMIT (from a caller that does not check)
GROUP_PRIORITY_INVALID = -110
#: a group priority >= 1 with an order_ms (a prioritised job is ordered by its priority alone)
GROUP_PRIORITY_WITH_ORDER_MS = -111
#: change_priority(lifo=True) of a held group job (its place among equals is its add order)
GROUP_PRIORITY_LIFO_REFUSED = -112
#: the largest max_size accepted (a number every backend holds exactly: Lua's doubles, JSON, bigint)
MAX_GROUP_SIZE_LIMIT = 2 ** 53 - 1
#: the largest group priority (BullMQ Pro's group.priority: 0, the default, first; then 1, 2, ...)
GROUP_PRIORITY_LIMIT = 2 ** 21 - 1
#: order_ms must stay below this (2**42 ms, year 2109): on Redis a prioritised held job is scored
#: 2**42 + its priority, after every unprioritised one (lua/includes/groupGate.lua)
ORDER_MS_LIMIT = 2 ** 42


class GroupJobRefused(InvalidJobOptions):
    """A group job combined with an option that cannot hold under the group gate."""


def check_group_priority(value: Any, priority: Any) -> int:
    """A group priority (BullMQ Pro's ``group.priority``): an int from 0 to `GROUP_PRIORITY_LIMIT`."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= GROUP_PRIORITY_LIMIT:
        raise InvalidJobOptions(
            f"option group={value!r}: priority={priority!r} must be an int from 0 to {GROUP_PRIORITY_LIMIT} "
            "(the job's place in its group: 0, the default, first; then 1, 2, ...; FIFO among equals)")
    return priority


def check_group(name: str, value: Any) -> dict[str, Any]:
    """``group="user:42"``, ``group={"id": "user:42"}``, with ``"max_size": 100`` (also Pro's ``maxSize``)
    and/or ``"priority": p`` → BullMQ Pro's ``{"id": ...}`` shape (``"maxSize"``, ``"priority"`` when given)."""
    if isinstance(value, str):
        value = {"id": value}
    if not isinstance(value, Mapping) or "id" not in value or not set(value) <= {"id", "max_size", "maxSize",
                                                                                  "priority"}:
        raise InvalidJobOptions(f"option group={value!r} must be a group id str or {{'id': str}} "
                                "(optionally with 'max_size' and 'priority')")
    gid = value["id"]
    if not isinstance(gid, str) or not gid:
        raise InvalidJobOptions(f"option group={value!r}: the group id must be a non-empty str")
    if "max_size" in value and "maxSize" in value:
        raise InvalidJobOptions(f"option group={value!r}: give max_size or maxSize, not both")
    checked: dict[str, Any] = {"id": gid}
    if "max_size" in value or "maxSize" in value:
        key = "max_size" if "max_size" in value else "maxSize"
        max_size = value[key]
        if isinstance(max_size, bool) or not isinstance(max_size, int) or not 1 <= max_size <= MAX_GROUP_SIZE_LIMIT:
            raise InvalidJobOptions(
                f"option group={value!r}: {key}={max_size!r} must be an int from 1 to {MAX_GROUP_SIZE_LIMIT} "
                "(the most jobs not started yet the group may hold)")
        checked["maxSize"] = max_size
    if "priority" in value:
        checked["priority"] = check_group_priority(value, value["priority"])
    return checked


def group_priority(opts: Mapping[str, Any]) -> int:
    """The group priority of a job's (checked) options (0: none)."""
    group = opts.get("group")
    return int(group.get("priority") or 0) if isinstance(group, Mapping) else 0


def stored_max_size(opts: Any) -> Optional[int]:
    """The ``maxSize`` a job's options carry (``opts.group.maxSize``: a number >= 1, floored, as the
    gate reads it; checked options from us, or stored ones from a Python or a Node producer), None
    when they carry none."""
    group = opts.get("group") if isinstance(opts, Mapping) else None
    value = group.get("maxSize") if isinstance(group, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        return None
    return int(min(value, MAX_GROUP_SIZE_LIMIT))


def check_order_ms(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < ORDER_MS_LIMIT:
        raise InvalidJobOptions(f"option order_ms={value!r} must be a producer timestamp in ms (a number >= 0 "
                                f"and below 2**42 = {ORDER_MS_LIMIT})")
    return int(value)


GROUP_OPTIONS = {"group": check_group, "order_ms": check_order_ms, "orderMs": check_order_ms}

# Options that cannot hold for a job behind the gate, and why.
_REFUSED_WITH_GROUP = {
    "repeatJobKey": "scheduler jobs cannot be group jobs",
}

_UNSET: Any = object()


def check_ordering_delay(value: Any) -> int:
    """An ordering delay: an int of ms >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"ordering_delay_ms={value!r} must be an int of milliseconds >= 0")
    return value


def check_group_combination(opts: Mapping[str, Any]) -> None:
    """Refuse a group job whose options cannot hold behind the gate; ``order_ms`` needs a group."""
    if opts.get("group") is None:
        order_ms = opts.get("order_ms", opts.get("orderMs"))
        if order_ms is not None:
            raise InvalidJobOptions(f"option order_ms={order_ms!r} orders jobs within a group: pass group= too")
        return
    for option, reason in _REFUSED_WITH_GROUP.items():
        if option in opts:
            raise GroupJobRefused(f"option {option!r} cannot be used with group={opts['group']!r}: {reason}")
    order_ms = opts.get("order_ms", opts.get("orderMs"))
    if order_ms is not None and group_priority(opts) > 0:
        raise InvalidJobOptions(
            f"option order_ms={order_ms!r} cannot be used with group={opts['group']!r}: order_ms orders a group's "
            "unprioritised jobs (priority 0); a job with a group priority is ordered by it, FIFO among equals")


def group_support(backend: "QueueBackend") -> "GroupGate":
    """The backend's group gate, or `NotSupportedOnBackend` where it has none."""
    return backend.groups()


def check_concurrency(concurrency: Any) -> int:
    """A group concurrency: an int >= 1."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidArgument(f"concurrency={concurrency!r} must be an int >= 1")
    return concurrency


#: the largest max / duration a group rate limit takes (ms as a JavaScript number holds them exactly)
MAX_RATE_LIMIT_VALUE = 2 ** 53 - 1


def check_rate_limit(max: Any, duration: Any, where: str = "") -> tuple[int, int]:
    """A group rate limit: ``max`` jobs start per ``duration`` ms, both ints from 1 to 2**53 - 1."""
    for name, value, rule in (("max", max, "the most jobs of one group that start in any window of `duration` ms"),
                              ("duration", duration, "the window, in milliseconds")):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RATE_LIMIT_VALUE:
            raise InvalidArgument(f"{where}{name}={value!r} must be an int from 1 to {MAX_RATE_LIMIT_VALUE} ({rule})")
    return int(max), int(duration)


def check_group_rate_limit_option(limit: Any, where: str) -> tuple[int, int]:
    """Pro's ``{"max": n, "duration": ms}`` (a worker's ``group={"limit": ...}``)."""
    if not isinstance(limit, Mapping) or set(limit) != {"max", "duration"}:
        raise InvalidArgument(f"{where}={limit!r} must be {{'max': n, 'duration': ms}}: at most n jobs of one group "
                              "start per duration ms")
    return check_rate_limit(limit["max"], limit["duration"], where + ": ")


class GroupsMixin:
    """Group methods of `Queue`."""

    backend: "QueueBackend"
    if TYPE_CHECKING:
        async def wait_until_ready(self) -> None: ...  # provided by QueueBase
        async def get_job(self, job_id: str) -> Any: ...

    async def _groups(self) -> "GroupGate":
        groups = self.backend.groups()
        await self.wait_until_ready()
        await groups.ready()
        return groups

    @staticmethod
    def _gid(group_id: Any) -> str:
        return str(check_group("group", group_id)["id"])

    async def set_group_concurrency(self, group_id: str, concurrency: int) -> None:
        """Let up to ``concurrency`` jobs of ``group_id`` run at once (default 1)."""
        check_concurrency(concurrency)
        await (await self._groups()).set_concurrency(self._gid(group_id), concurrency)

    async def set_default_group_concurrency(self, concurrency: int) -> None:
        """The concurrency of every group of this queue without its own setting."""
        check_concurrency(concurrency)
        await (await self._groups()).set_concurrency(None, concurrency)

    async def get_group_concurrency(self, group_id: str) -> int:
        """How many jobs of ``group_id`` may run at once (its own setting, else the default, else 1)."""
        return int(await (await self._groups()).get_concurrency(self._gid(group_id)))

    async def set_group_ordering_delay(self, ms: int) -> None:
        """The queue's ordering delay: a group job with ``order_ms`` runs only once ``order_ms + ms``
        has passed, so that a late producer's earlier job still runs first (0: none, the default).
        Groups with their own setting (`set_group_options`) keep it. Applies to jobs released from
        now on."""
        delay = check_ordering_delay(ms)
        await (await self._groups()).set_ordering_delay(None, delay)

    async def set_group_options(self, group_id: str, *, ordering_delay_ms: Optional[int] = _UNSET,
                                concurrency: int = _UNSET) -> None:
        """Settings of one group: ``ordering_delay_ms`` (its own ordering delay; None removes it, so
        the queue's applies) and ``concurrency`` (as `set_group_concurrency`). Options left out
        are kept."""
        gid = self._gid(group_id)
        delay = None if ordering_delay_ms is None or ordering_delay_ms is _UNSET else check_ordering_delay(
            ordering_delay_ms)
        if concurrency is not _UNSET:
            check_concurrency(concurrency)
        groups = await self._groups()
        if ordering_delay_ms is not _UNSET:
            await groups.set_ordering_delay(gid, delay)
        if concurrency is not _UNSET:
            await groups.set_concurrency(gid, concurrency)

    async def get_group_ordering_delay(self, group_id: Optional[str] = None) -> int:
        """The ordering delay (ms) of ``group_id`` (its own, else the queue's, else 0), or of the
        queue when no group is given."""
        gid = None if group_id is None else self._gid(group_id)
        return int(await (await self._groups()).get_ordering_delay(gid))

    async def set_default_group_rate_limit(self, max: int, duration: int) -> None:
        """At most ``max`` jobs of any one group start per ``duration`` ms (a sliding window: no
        ``duration`` ms hold more than ``max`` starts of the group); other groups are not slowed.
        Groups with their own limit (`set_group_rate_limit`) keep it. BullMQ Pro's worker option
        ``group.limit``. Applies to jobs released from now on."""
        limit = check_rate_limit(max, duration)
        await (await self._groups()).set_rate_limit(None, limit)

    async def set_group_rate_limit(self, group_id: str, max: int, duration: int) -> None:
        """The rate limit of one group, in place of the queue's default (Pro's ``setGroupRateLimit``)."""
        gid = self._gid(group_id)
        limit = check_rate_limit(max, duration)
        await (await self._groups()).set_rate_limit(gid, limit)

    async def remove_group_rate_limit(self, group_id: str) -> None:
        """Remove the group's own rate limit: the queue's default (if any) applies to it again."""
        await (await self._groups()).set_rate_limit(self._gid(group_id), None)

    async def remove_default_group_rate_limit(self) -> None:
        """Remove the queue's default group rate limit (groups with their own keep theirs)."""
        await (await self._groups()).set_rate_limit(None, None)

    async def get_group_rate_limit(self, group_id: Optional[str] = None) -> Optional[dict[str, int]]:
        """``{"max", "duration"}`` in force for ``group_id`` (its own, else the queue's default), or
        the queue's default when no group is given; None when there is none."""
        gid = None if group_id is None else self._gid(group_id)
        limit = await (await self._groups()).get_rate_limit(gid)
        return None if limit is None else {"max": limit[0], "duration": limit[1]}

    async def get_group_rate_limit_ttl(self, group_id: str) -> int:
        """Ms before the group may start another job by its rate limits (`set_group_rate_limit`, the
        default, or `Worker.rate_limit_group`); 0 when it may now (never negative). BullMQ Pro's
        ``getGroupRateLimitTtl``."""
        return int(await (await self._groups()).rate_limit_ttl(self._gid(group_id)))

    async def pause_group(self, group_id: str) -> None:
        """Hold every not-yet-started job of the group; running ones finish."""
        await (await self._groups()).set_paused(self._gid(group_id), True)

    async def resume_group(self, group_id: str) -> None:
        """Release the group's jobs again after `pause_group`."""
        await (await self._groups()).set_paused(self._gid(group_id), False)

    async def is_group_paused(self, group_id: str) -> bool:
        """Whether `pause_group` holds ``group_id``."""
        return bool(await (await self._groups()).is_paused(self._gid(group_id)))

    async def get_group_job_count(self, group_id: str) -> int:
        """Jobs of the group waiting for their turn."""
        return int(await (await self._groups()).held_count(self._gid(group_id)))

    async def get_groups_jobs_count(self, max_jobs: int = 1000) -> int:
        """Jobs waiting for their turn, over every group (BullMQ Pro's ``getGroupsJobsCount``;
        ``max_jobs``: how many groups are read per round trip)."""
        if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
            raise InvalidArgument(f"max_jobs={max_jobs!r} must be an int >= 1 (groups read per round trip)")
        return int(await (await self._groups()).held_total(max_jobs))

    async def get_counts_per_priority_for_group(self, group_id: str, priorities: Sequence[int]) -> dict[int, int]:
        """How many of the group's jobs wait for their turn with each group priority (BullMQ Pro's
        ``getCountsPerPriorityForGroup``): ``{priority: count}`` for each of ``priorities`` (0: the
        unprioritised)."""
        if isinstance(priorities, (str, bytes)) or not isinstance(priorities, Sequence):
            raise InvalidArgument(f"priorities={priorities!r} must be a list of group priorities")
        wanted: list[int] = []
        for priority in priorities:
            if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= GROUP_PRIORITY_LIMIT:
                raise InvalidArgument(f"priorities: {priority!r} must be an int from 0 to {GROUP_PRIORITY_LIMIT}")
            if priority not in wanted:
                wanted.append(priority)
        if not wanted:
            return {}
        counts = await (await self._groups()).counts_per_priority(self._gid(group_id), wanted)
        return {priority: int(n) for priority, n in zip(wanted, counts)}

    async def get_group_active_count(self, group_id: str) -> int:
        """Jobs of the group that are active: started by a worker of any language, not finished
        (BullMQ Pro's ``getGroupActiveCount``)."""
        return int(await (await self._groups()).active_count(self._gid(group_id)))

    async def get_group_jobs(self, group_id: str, start: int = 0, end: int = -1) -> list[Any]:
        """Jobs of the group waiting for their turn, in the order they will run."""
        ids = await (await self._groups()).held_ids(self._gid(group_id), start, end)
        jobs = [await self.get_job(job_id) for job_id in ids]
        return [job for job in jobs if job is not None]

    async def get_groups(self, status: Optional[str] = None) -> list[dict[str, Any]]:
        """Groups with jobs: ``[{"id", "waiting", "running", "paused", "concurrency"}]``. A group
        whose jobs not finished yet (held, waiting, delayed or active) include one added with a
        ``max_size`` also has ``"max_size"``: that of the most recently added such job (the limit is
        a per-add option: this is the one its producers last gave); ``group.get("max_size")`` is None
        when none does. A group with a rate limit in force also has ``"rate_limit"`` (``{"max",
        "duration"}``, or None when only `Worker.rate_limit_group`'s limit holds it) and
        ``"rate_limit_ttl"`` (as `get_group_rate_limit_ttl`).

        ``status``: None (all), "waiting" (has held jobs), "running" (has released jobs) or "paused".
        """
        if status not in (None, "waiting", "running", "active", "paused"):
            raise InvalidArgument(f"status={status!r} must be None, 'waiting', 'running' or 'paused'")
        groups: list[dict[str, Any]] = await (await self._groups()).list()
        return [group for group in groups
                if status is None or (status == "waiting" and group["waiting"])
                or (status in ("running", "active") and group["running"])
                or (status == "paused" and group["paused"])]

    async def delete_group_jobs(self, group_id: str) -> int:
        """Remove the group's jobs that wait for their turn (running ones are left); returns how many."""
        return int(await (await self._groups()).delete_held(self._gid(group_id)))

    async def sweep_groups(self) -> int:
        """Release groups whose running job has finished (on Redis, what the keeper does
        periodically; on PostgreSQL the database releases them as they finish: a repair only)."""
        return int(await (await self._groups()).sweep())


def held_priority_refusal(code: int, job_id: str, priority: int) -> Optional[InvalidArgument]:
    """The refusal a backend's change of a held job's group priority answered with ``code``, if any
    (both backends answer with these codes; nothing was changed)."""
    if code == GROUP_PRIORITY_LIFO_REFUSED:
        return InvalidArgument(f"job {job_id!r} waits for its turn in its group: change_priority(lifo=True) cannot "
                               "place it (its place among equal group priorities is its add order)")
    if code == GROUP_PRIORITY_WITH_ORDER_MS:
        return InvalidArgument(f"job {job_id!r} has an order_ms: a group priority >= 1 cannot be given to it "
                               f"(got {priority}; order_ms orders a group's unprioritised jobs)")
    return None


def group_add_refusal(result: Any, opts: Mapping[str, Any], queue: Optional[str] = None
                      ) -> Optional[BullMQCompatError]:
    """The refusal the group add script answered with `result`, if any (nothing was written)."""
    group = opts.get("group")
    if not group or not isinstance(result, int):
        return None
    if result == GROUP_MAX_SIZE_REFUSED:
        return GroupMaxSizeExceeded(group["id"], int(group.get("maxSize") or 0), queue)
    if result == GROUP_PRIORITY_INVALID:
        return InvalidJobOptions(f"option group={group!r}: priority must be an int from 0 to {GROUP_PRIORITY_LIMIT}")
    if result == GROUP_PRIORITY_WITH_ORDER_MS:
        return InvalidJobOptions(f"option group={group!r}: a job with a group priority cannot have an order_ms")
    if result == KEEP_LAST_BEHIND_PLAIN_REFUSED:
        dedup = opts.get("de") or opts.get("deduplication") or {}
        return GroupJobRefused(
            f"group {group['id']!r}: deduplication keepLastIfActive of id {dedup.get('id')!r}: its job is active "
            "and is not a group job, so nothing would create the kept job behind the group's gate")
    return None


def __getattr__(name: str) -> Any:
    # GroupKeeper is the Redis gate's keeper; re-exported here for older imports
    if name == "GroupKeeper":
        from bullmq_compat._backends.redis.groups import GroupKeeper

        return GroupKeeper
    raise AttributeError(name)
