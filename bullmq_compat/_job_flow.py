"""What a job of a flow can ask about its children, and how it leaves its parent (Job's flow side).

A parent's children are kept by upstream in four keys beside the parent's hash:

* ``<parent>:dependencies`` — a set of the keys of children not finished yet ("unprocessed");
* ``<parent>:processed`` — child key → the child's return value (JSON text);
* ``<parent>:failed`` — child key → failed reason, for children failed with
  ``ignore_dependency_on_failure`` or ``continue_parent_on_failure`` ("ignored");
* ``<parent>:unsuccessful`` — a sorted set of children failed with ``fail_parent_on_failure``
  ("failed").

On PostgreSQL the same lives in the ``job_dependency`` table; the backend reads either.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from bullmq_compat._errors import InvalidArgument
from bullmq_compat._wire import codec

if TYPE_CHECKING:
    from bullmq_compat._queue import QueueBase

#: ``True`` (the first page, 20 entries) or ``{"cursor": int, "count": int}``
PageOption = Union[bool, Mapping[str, Any], None]

DEPENDENCY_TYPES = ("processed", "unprocessed", "ignored", "failed")


def _json_or_text(text: Any) -> Any:
    text = codec.to_str(text)
    try:
        return codec.loads(text)
    except (TypeError, ValueError):
        return text


def _page(name: str, value: PageOption) -> Optional[tuple[int, int]]:
    """(cursor, count) for one paginated dependency type, or None when it is not asked for."""
    if value is None or value is False:
        return None
    if value is True:
        return 0, 20
    if not isinstance(value, Mapping) or set(value) - {"cursor", "count"}:
        raise InvalidArgument(f"{name}={value!r} must be True or {{'cursor': int, 'count': int}}")
    cursor, count = value.get("cursor", 0), value.get("count", 20)
    for label, number, minimum in (("cursor", cursor, 0), ("count", count, 1)):
        if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
            raise InvalidArgument(f"{name}.{label}={number!r} must be an int >= {minimum}")
    return cursor, count


class FlowJobMixin:
    """Job methods about flows (mixed into `Job`)."""

    queue: "QueueBase"
    id: Optional[str]
    parent_key: Optional[str]
    parent: Optional[dict[str, Any]]

    async def get_children_values(self) -> dict[str, Any]:
        """The return values of this job's completed children, by child key.

        >>> await parent.get_children_values()
        {'bull:steps:7': {'ok': True}}
        """
        raw = await self.queue.backend.get_processed_children_values(str(self.id))
        return {key: _json_or_text(value) for key, value in raw.items()}

    async def get_ignored_children_failures(self) -> dict[str, str]:
        """Failed reasons of children that failed with ``ignore_dependency_on_failure`` or
        ``continue_parent_on_failure``, by child key."""
        return dict(await self.queue.backend.get_ignored_children_failures(str(self.id)))

    async def get_failed_children_values(self) -> dict[str, str]:
        """The same as `get_ignored_children_failures` (Node's deprecated name for it)."""
        return await self.get_ignored_children_failures()

    async def get_dependencies(self, *, processed: PageOption = None, unprocessed: PageOption = None,
                               failed: PageOption = None, ignored: PageOption = None) -> dict[str, Any]:
        """This job's children by state, as Node's ``job.getDependencies``.

        With no arguments, all of them: ``{"processed": {key: value}, "unprocessed": [key...],
        "failed": [key...], "ignored": {key: reason}}``. Passing any of the four (``True`` or
        ``{"cursor": c, "count": n}``) returns one page of just those, with the cursor to pass
        next (0 when done): ``next_processed_cursor``, ``next_unprocessed_cursor``,
        ``next_ignored_cursor``, ``next_failed_cursor``. As in Node, ``count`` is a hint to
        HSCAN/SSCAN, which return small hashes and sets whole.

        >>> await parent.get_dependencies(unprocessed={"cursor": 0, "count": 10})
        {'unprocessed': ['bull:steps:8'], 'next_unprocessed_cursor': 0}
        """
        pages = {name: _page(name, value) for name, value in (
            ("processed", processed), ("unprocessed", unprocessed), ("ignored", ignored), ("failed", failed))}
        out: dict[str, Any] = await self.queue.backend.get_dependencies(str(self.id), pages)
        if "processed" in out:
            out["processed"] = {key: _json_or_text(value) for key, value in out["processed"].items()}
        return out

    async def get_dependencies_count(self, *, processed: bool = False, unprocessed: bool = False,
                                     ignored: bool = False, failed: bool = False) -> dict[str, int]:
        """How many children are in each state; all four when none is asked for.

        >>> await parent.get_dependencies_count()
        {'processed': 2, 'unprocessed': 1, 'ignored': 0, 'failed': 0}
        """
        asked = {"processed": processed, "unprocessed": unprocessed, "ignored": ignored, "failed": failed}
        types = [name for name in DEPENDENCY_TYPES if asked[name]] or list(DEPENDENCY_TYPES)
        counts = await self.queue.backend.get_dependency_counts(str(self.id), types)
        return {name: int(count or 0) for name, count in zip(types, counts)}

    async def remove_child_dependency(self) -> bool:
        """Detach this unfinished child from its parent; True when it was attached. A parent left
        with no pending children moves on to waiting. Raises `ParentJobNotFound` when the parent
        is gone, `JobNotFound` when this job is."""
        if await self.queue.backend.remove_child_dependency(str(self.id), self.parent_key or ""):
            self.parent_key = None
            self.parent = None
            return True
        return False

    async def remove_unprocessed_children(self) -> None:
        """Remove the children (and their children) not processed yet: waiting, delayed, prioritized
        or waiting for children of their own. Completed, failed and locked (active) ones stay."""
        await self.queue.backend.remove_unprocessed_children(str(self.id))
