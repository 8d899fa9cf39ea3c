"""Next run times of cron patterns, as Node BullMQ's job schedulers compute them.

Node BullMQ 6.7.0 asks cron-parser 5.x for the next time (``defaultRepeatStrategy``): it parses
the pattern afresh from the previous iteration's time and takes ``next()``. This module gives the
same answers, with croniter doing the calendar work:

* the pattern is read with cron-parser's rules (5 fields get a ``0`` seconds field in front;
  6 fields start with seconds; ``?`` is ``*``; month and weekday names; ``a/n`` means ``a-max/n``;
  weekday ``7`` is Sunday; ``L`` last day of month; ``5L`` last Friday; ``1#2`` second Monday;
  the ``@daily``-style names) and each field is expanded to explicit values, so croniter never
  applies a rule of its own;
* day-of-month and day-of-week are OR-ed when both are restricted, deciding "restricted" as
  cron-parser does (the field is not exactly ``*`` or ``?``): the union is computed as the
  earliest of several croniter iterations, one per alternative;
* croniter walks naive wall-clock time; each wall time is then placed in the time zone with
  cron-parser's daylight-saving behaviour (see `_resolve`);
* ``start_date`` / ``end_date`` bound the result as cron-parser's options do.

Differences that remain are listed in `KNOWN_DIFFERENCES` (tested against Node in
tests/test_interop_schedulers.py).
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Iterator, Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bullmq_compat._errors import InvalidArgument

__all__ = ["CronPattern", "parse_cron", "next_cron_millis", "KNOWN_DIFFERENCES"]

KNOWN_DIFFERENCES = {
    "H": "hashed values ('H', 'H/5', 'H(0-29)'): cron-parser draws them from Math.random on every "
         "parse unless a hashSeed is given, so Node itself is not repeatable; refused here",
    "30-minute DST": "zones whose clocks move by 30 minutes (Australia/Lord_Howe): cron-parser's "
                     "hour arithmetic goes wrong there (clocks forward 02:00->02:30: '15 45 */2 * * *' "
                     "gives 03:45:15 for the existing 02:45:15, '0 0,30 1,2 * * *' gives 03:00 for "
                     "02:30; clocks back 02:00->01:30: '0 0 2 * * *' finds no time at all and "
                     "'0 0 * * * *' keeps returning 01:00); here such a day follows the rules of the "
                     "1-hour zones (an existing time runs, a missing one is skipped)",
}

# cron-parser's predefined expressions (6 fields, seconds first)
PREDEFINED = {
    "@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *", "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0", "@daily": "0 0 0 * * *", "@hourly": "0 0 * * * *",
    "@minutely": "0 * * * * *", "@secondly": "* * * * * *", "@weekdays": "0 0 0 * * 1-5",
    "@weekends": "0 0 0 * * 0,6",
}
_MONTHS = {name: i + 1 for i, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (name, min, max) of the six fields, in cron-parser's order
_FIELDS = (("second", 0, 59), ("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31),
           ("month", 1, 12), ("day of week", 0, 7))
_VALID = re.compile(r"^[?,*\dL#/-]+$")
_MAX_OVERLAP = timedelta(hours=2)  # the longest repeated stretch of wall time (clocks set back)
_MAX_YEARS = 50  # how far a pattern's next time is looked for (cron-parser gives up after 10000 steps)


def _bad(pattern: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"cron pattern {pattern!r} is not valid: {why}")


def _int(pattern: str, text: str, lo: int, hi: int, field: str) -> int:
    if not text.isdigit():
        raise _bad(pattern, f"{field} value {text!r} is not a number")
    value = int(text)
    if not lo <= value <= hi:
        raise _bad(pattern, f"{field} value {value} is outside {lo}-{hi}")
    return value


def _expand(pattern: str, raw: str, index: int) -> tuple[list[int], list[int], Optional[int]]:
    """One field → (sorted values, weekdays given with L, nth of '#'), by cron-parser's rules."""
    field, lo, hi = _FIELDS[index]
    text = raw.replace("?", "*")
    if index in (4, 5):  # names: cron-parser replaces any run of three letters
        def alias(m: re.Match[str]) -> str:
            name = m.group(0).lower()
            number = _MONTHS.get(name) if name in _MONTHS else _DAYS.get(name)
            if number is None:
                raise _bad(pattern, f"cannot resolve the alias {m.group(0)!r} in the {field} field")
            return str(number)
        text = re.sub(r"[A-Za-z]{3}", alias, text)
    if "H" in text:
        raise _bad(pattern, "hashed values (H) are not supported: Node draws them at random on every parse")
    if not _VALID.match(text):
        raise _bad(pattern, f"invalid characters in the {field} field {raw!r}")
    nth: Optional[int] = None
    if "#" in text:
        if index != 5:
            raise _bad(pattern, f"'#' is only valid in the day-of-week field, not in {raw!r}")
        if re.search(r"[,/-]", text):
            raise _bad(pattern, "'#' cannot be combined with ',', '-' or '/'")
        day, _, occurrence = text.partition("#")
        if "#" in occurrence or not occurrence.isdigit() or not 1 <= int(occurrence) <= 5:
            raise _bad(pattern, "the '#' occurrence must be 1 to 5")
        nth = int(occurrence)
        text = day
    text = text.replace("*", f"{lo}-{hi}")
    values: set[int] = set()
    last_days: list[int] = []
    for atom in text.split(","):
        if not atom:
            raise _bad(pattern, f"empty list value in the {field} field {raw!r}")
        if "L" in atom:
            if index == 3 and re.fullmatch(r"\d*L", atom):
                values.add(-1)  # last day of the month (cron-parser ignores digits before L here)
                continue
            if index == 5 and re.fullmatch(r"\dL", atom):
                last_days.append(int(atom[0]) % 7)
                continue
            raise _bad(pattern, f"'L' is not valid in {atom!r} of the {field} field")
        range_text, slash, step_text = atom.partition("/")
        if slash:
            if "/" in step_text:
                raise _bad(pattern, f"invalid repeat {atom!r}")
            if "-" not in range_text:
                range_text = f"{range_text}-{hi}"
            if not step_text.isdigit() or int(step_text) <= 0:
                raise _bad(pattern, f"cannot repeat every {step_text!r} in {atom!r}")
            step = int(step_text)
        else:
            step = 1
        if "-" in range_text:
            parts = range_text.split("-")
            if len(parts) != 2:
                raise _bad(pattern, f"invalid range {atom!r}")
            first, last = (_int(pattern, p, lo, hi, field) for p in parts)
            if first > last:
                raise _bad(pattern, f"invalid range {atom!r}: {first} > {last}")
            values.update(range(first, last + 1, step))
        else:
            values.add(_int(pattern, range_text, lo, hi, field))
    if index == 5:
        values = {v % 7 for v in values}
        if nth is not None and (last_days or len(values) != 1):
            raise _bad(pattern, "'#' needs exactly one weekday")
    return sorted(values), last_days, nth


@dataclass(frozen=True)
class CronPattern:
    """A pattern read by cron-parser's rules; `alternatives` are croniter expressions OR-ed."""

    pattern: str
    alternatives: tuple[str, ...]
    hours_count: int
    hours: frozenset[int]
    first_minute: int
    first_second: int


def _join(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


@functools.lru_cache(maxsize=512)
def parse_cron(pattern: str) -> CronPattern:
    """Read ``pattern`` as cron-parser does; raises InvalidArgument where cron-parser throws."""
    if not isinstance(pattern, str):
        raise InvalidArgument(f"cron pattern {pattern!r} must be a str")
    text = PREDEFINED.get(pattern, pattern)
    atoms = text.split()
    if not atoms:
        raise _bad(pattern, "it is empty")
    if len(atoms) > 6:
        raise _bad(pattern, "too many fields (at most 6: second minute hour day-of-month month day-of-week)")
    atoms = ["0", "*", "*", "*", "*", "*"][: 6 - len(atoms)] + atoms
    expanded = [_expand(pattern, raw, i) for i, raw in enumerate(atoms)]
    seconds, minutes, hours, days, months = (e[0] for e in expanded[:5])
    weekdays, last_weekdays, nth = expanded[5]
    if not (seconds and minutes and hours and days and months):
        raise _bad(pattern, "a field has no values")
    head = f"{_join(seconds)} {_join(minutes)} {_join(hours)}"
    dom = ",".join("L" if d == -1 else str(d) for d in days)
    # cron-parser: a day field is a wildcard only when written exactly '*' or '?'
    dom_restricted = atoms[3] not in ("*", "?")
    dow_restricted = atoms[5] not in ("*", "?")
    dow_parts: list[str] = []
    if nth is not None:
        dow_parts.append(f"{weekdays[0]}#{nth}")
    elif weekdays:
        dow_parts.append(_join(weekdays))
    dow_parts.extend(f"L{d}" for d in last_weekdays)
    month = _join(months)
    alternatives: list[str] = []
    if dom_restricted and dow_restricted:
        alternatives.append(f"{head} {dom} {month} *")
        alternatives.extend(f"{head} * {month} {part}" for part in dow_parts)
    elif dow_restricted:
        alternatives.extend(f"{head} * {month} {part}" for part in dow_parts)
    else:
        alternatives.append(f"{head} {dom if dom_restricted else '*'} {month} *")
    return CronPattern(pattern, tuple(alternatives), len(hours), frozenset(hours), minutes[0], seconds[0])


@functools.lru_cache(maxsize=64)
def _zone(tz: Optional[str]) -> tzinfo:
    """The time zone: ``tz``, or (like Node without tz) the process's local zone."""
    if tz:
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidArgument(f"tz={tz!r} is not a known IANA time zone") from None
    env = os.environ.get("TZ", "").lstrip(":")
    if env:
        try:
            return ZoneInfo(env)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with open("/etc/localtime", "rb") as f:
            return ZoneInfo.from_file(f)
    except OSError:
        return timezone.utc


def _wall_times(cron: CronPattern, after: datetime) -> Iterator[datetime]:
    """Naive wall times matching ``cron``, strictly after ``after``, in order (OR of alternatives)."""
    from croniter import croniter  # here, not at import: croniter (and dateutil) cost a Worker's start ~30 ms
    from croniter.croniter import CroniterBadDateError

    iters = []
    for expr in cron.alternatives:
        iters.append(croniter(expr, after, second_at_beginning=True, max_years_between_matches=_MAX_YEARS))
    heads: list[Optional[datetime]] = []
    for it in iters:
        try:
            heads.append(it.get_next(datetime))
        except (CroniterBadDateError, OverflowError, ValueError):
            heads.append(None)
    while True:
        live = [(h, i) for i, h in enumerate(heads) if h is not None]
        if not live:
            return
        best = min(h for h, _ in live)
        yield best
        for h, i in live:
            if h == best:
                try:
                    heads[i] = iters[i].get_next(datetime)
                except (CroniterBadDateError, OverflowError, ValueError):
                    heads[i] = None


def _wall(instant: float, zone: tzinfo) -> datetime:
    return datetime.fromtimestamp(instant, zone)


def _instants(wall: datetime, zone: tzinfo) -> tuple[float, float]:
    return (wall.replace(tzinfo=zone, fold=0).timestamp(), wall.replace(tzinfo=zone, fold=1).timestamp())


def _exists(wall: datetime, instant: float, zone: tzinfo) -> bool:
    return _wall(instant, zone).replace(tzinfo=None, fold=0) == wall


def _transition(before: float, after: float, zone: tzinfo) -> float:
    """The instant (whole second) where the UTC offset changes, between ``before`` and ``after``."""
    lo, hi = int(before), int(after) + 1
    offset = _wall(lo, zone).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(mid, zone).utcoffset() == offset:
            lo = mid
        else:
            hi = mid
    return float(hi)


def _day_matches(cron: CronPattern, day: datetime) -> bool:
    """Whether some time of this calendar day matches the pattern's day and month fields."""
    start = day.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(seconds=1)
    for wall in _wall_times(cron, start):
        return wall.date() == day.date()
    return False


def _resolve(cron: CronPattern, wall: datetime, zone: tzinfo, start: float) -> list[float]:
    """The instants at which cron-parser runs a matching wall time, given the search start.

    * a wall time that exists once is run then;
    * a repeated wall time (clocks set back): both times when the hour field allows all 24
      hours; otherwise only the first, unless the search starts inside the repeated hour's
      second pass;
    * a skipped wall time (clocks set forward): never when the hour field allows all 24 hours;
      otherwise, when the clocks jump a whole hour or more and the search starts before the
      jump, the skipped hour is run at the first minute and second of the hour landed on. Where
      the jump is at midnight, cron-parser only gets there from 23:xx of the day before (when
      hour 23 is allowed and that day matches), else the day is skipped.
    """
    first, second = _instants(wall, zone)
    first_ok, second_ok = _exists(wall, first, zone), _exists(wall, second, zone)
    if first_ok and second_ok and first != second:
        out = [first]
        if cron.hours_count == 24 or _wall(start, zone).fold == 1:
            out.append(second)
        return out
    if first_ok:
        return [first]
    if second_ok:
        return [second]
    # a gap: ``second`` uses the offset after the change, so it is the earlier instant
    if cron.hours_count == 24:
        return []
    at = _transition(min(first, second), max(first, second), zone)
    old_offset = _wall(at - 1, zone).utcoffset() or timedelta(0)
    new_offset = _wall(at, zone).utcoffset() or timedelta(0)
    gap_start = datetime.fromtimestamp(at, timezone.utc).replace(tzinfo=None) + old_offset
    if new_offset - old_offset < timedelta(hours=1) or gap_start.minute or gap_start.second:
        return []
    if start >= at:
        return []
    if gap_start.hour == 0:
        day_before = gap_start - timedelta(days=1)
        if 23 not in cron.hours or not _day_matches(cron, day_before):
            return []
    return [at + cron.first_minute * 60 + cron.first_second]


def next_cron_millis(pattern: str, millis: float, *, tz: Optional[str] = None,
                     start_date: Optional[float] = None, end_date: Optional[float] = None) -> Optional[int]:
    """The first time (epoch ms) after ``millis`` matching ``pattern``, or None when there is none
    (past ``end_date``, or never), exactly as BullMQ's defaultRepeatStrategy computes it."""
    cron = parse_cron(pattern)
    zone = _zone(tz)
    current = float(millis)
    if start_date is not None and start_date > current:
        current = float(start_date)
    if end_date is not None and current > end_date:
        current = float(end_date)
    start = current / 1000.0
    start_wall = _wall(int(start // 1), zone)
    begin = start_wall.replace(tzinfo=None, fold=0)
    if start_wall.fold == 0:
        # inside the first pass of a repeated hour, the second pass has earlier wall times
        first, second = _instants(begin, zone)
        if second != first and _exists(begin, second, zone):
            begin -= timedelta(seconds=second - first)
    best: Optional[float] = None
    best_wall: Optional[datetime] = None
    best_second_pass = False
    for wall in _wall_times(cron, begin):
        if best_wall is not None and (not best_second_pass or wall > best_wall + _MAX_OVERLAP):
            break  # elsewhere later wall times are later instants
        for instant in _resolve(cron, wall, zone, start):
            if instant > start and (best is None or instant < best):
                best, best_wall = instant, wall
                best_second_pass = _wall(instant, zone).fold == 1
    if best is None:
        return None
    result = int(round(best * 1000))
    if end_date is not None and result > end_date:
        return None
    return result
