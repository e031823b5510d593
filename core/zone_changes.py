"""A zone's clock changes: the instants its UTC offset changes, found from the offsets alone.

zoneinfo exposes offsets, not its transition table, so offsets are sampled and each change bisected to the second.
Both the DST policies of the time rules (core/timerules.py) and the preview notes (core/dst.py) read them.
"""

from __future__ import annotations

import functools
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["ClockChange", "clock_changes", "year_changes"]

# Offsets are sampled this far apart, then bisected. Real zones change at most a few times a year, never twice in
# six hours, so no change is stepped over.
SAMPLE_STEP = timedelta(hours=6)
# Years of changes kept per zone: a materializer walks a few zones' current years; ~1,460 offsets build one.
YEAR_CACHE_SIZE = 2048


@dataclass(frozen=True)
class ClockChange:
    """One change of a zone's UTC offset: `at` is the first instant (UTC) on the new offset."""

    at: datetime
    before: timedelta
    after: timedelta

    @property
    def is_gap(self) -> bool:
        """Spring forward: the clock jumps ahead, and the wall times in between never happen."""
        return self.after > self.before

    @property
    def size(self) -> timedelta:
        return abs(self.after - self.before)

    def wall_range(self) -> tuple[datetime, datetime]:
        """The naive wall-clock times the change affects, [start, end): skipped in a gap, repeated in a fold."""
        if self.is_gap:
            start = (self.at + self.before).replace(tzinfo=None)
            return start, start + (self.after - self.before)
        start = (self.at + self.after).replace(tzinfo=None)
        return start, start + (self.before - self.after)


def _offset(zone: zoneinfo.ZoneInfo, instant: datetime) -> timedelta:
    return instant.astimezone(zone).utcoffset() or timedelta(0)


def clock_changes(zone: zoneinfo.ZoneInfo, since: datetime, until: datetime) -> list[ClockChange]:
    """Every offset change of `zone` with since < at <= until (aware instants), in time order."""
    changes: list[ClockChange] = []
    lo = since.astimezone(UTC)
    until = until.astimezone(UTC)
    lo_offset = _offset(zone, lo)
    while lo < until:
        hi = min(lo + SAMPLE_STEP, until)
        hi_offset = _offset(zone, hi)
        if hi_offset != lo_offset:
            changes.append(_bisect(zone, lo, hi, lo_offset, hi_offset))
        lo, lo_offset = hi, hi_offset
    return changes


def _bisect(zone: zoneinfo.ZoneInfo, lo: datetime, hi: datetime, before: timedelta, after: timedelta) -> ClockChange:
    while hi - lo > timedelta(milliseconds=1):
        mid = lo + (hi - lo) / 2
        if _offset(zone, mid) == before:
            lo = mid
        else:
            hi = mid
    # Zones change on whole seconds: the first instant on the new offset is within a millisecond of `hi`.
    at = (hi + timedelta(microseconds=500_000)).replace(microsecond=0)
    if _offset(zone, at) != after:
        at = hi
    return ClockChange(at=at, before=before, after=after)


@functools.lru_cache(maxsize=YEAR_CACHE_SIZE)
def year_changes(zone: zoneinfo.ZoneInfo, year: int) -> tuple[ClockChange, ...]:
    """The changes of one UTC year, [Jan 1, next Jan 1): the time rules ask for the same few years again and again."""
    start = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) if year < 9999 else datetime.max.replace(tzinfo=UTC)
    return tuple(clock_changes(zone, start - timedelta(microseconds=1), end - timedelta(microseconds=1)))
