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

from typing import TYPE_CHECKING, Any, Mapping, Optional

from bullmq_compat._errors import InvalidArgument, InvalidJobOptions

if TYPE_CHECKING:
    from bullmq_compat._backends.base import GroupGate, QueueBackend

FLOW_PARENT_REFUSED = -100
KEEP_LAST_BEHIND_PLAIN_REFUSED = -101


class GroupJobRefused(InvalidJobOptions):
    """A group job combined with an option that cannot hold under the group gate."""


def check_group(name: str, value: Any) -> dict[str, str]:
    """``group="user:42"`` or ``group={"id": "user:42"}`` → BullMQ Pro's ``{"id": ...}`` shape."""
    if isinstance(value, str):
        value = {"id": value}
    if not isinstance(value, Mapping) or set(value) != {"id"}:
        raise InvalidJobOptions(f"option group={value!r} must be a group id str or {{'id': str}}")
    gid = value["id"]
    if not isinstance(gid, str) or not gid:
        raise InvalidJobOptions(f"option group={value!r}: the group id must be a non-empty str")
    return {"id": gid}


def check_order_ms(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InvalidJobOptions(f"option order_ms={value!r} must be a producer timestamp in ms (a number >= 0)")
    return int(value)


GROUP_OPTIONS = {"group": check_group, "order_ms": check_order_ms, "orderMs": check_order_ms}

# Options that cannot hold for a job behind the gate, and why.
_REFUSED_WITH_GROUP = {
    "parent": "a group job cannot be a flow child (upstream would release it from waiting-children "
              "when its parent's dependencies change)",
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


def group_support(backend: "QueueBackend") -> "GroupGate":
    """The backend's group gate, or `NotSupportedOnBackend` where it has none."""
    return backend.groups()


def check_concurrency(concurrency: Any) -> int:
    """A group concurrency: an int >= 1."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidArgument(f"concurrency={concurrency!r} must be an int >= 1")
    return concurrency


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
        return check_group("group", group_id)["id"]

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

    async def get_group_jobs(self, group_id: str, start: int = 0, end: int = -1) -> list[Any]:
        """Jobs of the group waiting for their turn, in the order they will run."""
        ids = await (await self._groups()).held_ids(self._gid(group_id), start, end)
        jobs = [await self.get_job(job_id) for job_id in ids]
        return [job for job in jobs if job is not None]

    async def get_groups(self, status: Optional[str] = None) -> list[dict[str, Any]]:
        """Groups with jobs: ``[{"id", "waiting", "running", "paused", "concurrency"}]``.

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


def refuse_flow_parent(result: Any, gid: str) -> None:
    if result == FLOW_PARENT_REFUSED:
        raise GroupJobRefused(f"group {gid!r}: a group job cannot be a flow child")


def group_add_refusal(result: Any, opts: Mapping[str, Any]) -> Optional[GroupJobRefused]:
    """The refusal the group add script answered with `result`, if any (nothing was written)."""
    group = opts.get("group")
    if not group or not isinstance(result, int):
        return None
    if result == FLOW_PARENT_REFUSED:
        return GroupJobRefused(f"group {group['id']!r}: a group job cannot be a flow child")
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
