"""Key names of a queue, exactly as upstream BullMQ builds them: `<prefix>:<queue>:<type>`."""
from __future__ import annotations

from dataclasses import dataclass, field

# The suffixes upstream's QueueKeys builds for every queue ('' is the job-key prefix itself).
QUEUE_KEY_TYPES = (
    "", "active", "wait", "waiting-children", "paused", "id", "delayed", "prioritized",
    "stalled-check", "completed", "failed", "stalled", "repeat", "limiter", "meta",
    "events", "pc", "marker", "de",
)


@dataclass(frozen=True)
class QueueKeys:
    """Every key of one queue. `keys.job(id)` is the job hash; `keys.prefix_key` ends in ':'."""

    prefix: str
    name: str
    _all: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base = f"{self.prefix}:{self.name}"
        object.__setattr__(self, "_all", {t: f"{base}:{t}" for t in QUEUE_KEY_TYPES})

    @property
    def qualified_name(self) -> str:
        return f"{self.prefix}:{self.name}"

    @property
    def prefix_key(self) -> str:
        """`<prefix>:<queue>:` — what upstream scripts append a job id to."""
        return self._all[""]

    def __getitem__(self, key_type: str) -> str:
        try:
            return self._all[key_type]
        except KeyError:
            return f"{self.prefix}:{self.name}:{key_type}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:{self.name}:{job_id}"

    wait = property(lambda self: self._all["wait"])
    active = property(lambda self: self._all["active"])
    paused = property(lambda self: self._all["paused"])
    delayed = property(lambda self: self._all["delayed"])
    prioritized = property(lambda self: self._all["prioritized"])
    waiting_children = property(lambda self: self._all["waiting-children"])
    completed = property(lambda self: self._all["completed"])
    failed = property(lambda self: self._all["failed"])
    stalled = property(lambda self: self._all["stalled"])
    stalled_check = property(lambda self: self._all["stalled-check"])
    meta = property(lambda self: self._all["meta"])
    events = property(lambda self: self._all["events"])
    marker = property(lambda self: self._all["marker"])
    limiter = property(lambda self: self._all["limiter"])
    pc = property(lambda self: self._all["pc"])
    id = property(lambda self: self._all["id"])
    repeat = property(lambda self: self._all["repeat"])
    de = property(lambda self: self._all["de"])
