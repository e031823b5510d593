"""Exclusions: the fires a tenant's holiday calendars say do not exist, as the time rules (core/timerules.py) skip
them: by the fire's local date in the rule's zone, or by its instant in a range.

Two shapes with one method (skip_to): `Exclusions`, the calendars as they are now (the materializer, previews), and
`ExclusionHistory`, every content they had, each over the fires it may have decided (reconcile and backfill)."""

from __future__ import annotations

import bisect
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

__all__ = ["ExclusionHistory", "Exclusions", "ExclusionsLike"]

_ONE_MICROSECOND = timedelta(microseconds=1)
# Sorts after every range that starts at a fire's instant (bisection by start).
_LATEST = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True, eq=False)
class Exclusions:
    """Fires that do not exist (a tenant's holiday calendars, merged): those whose local date in the rule's zone is
    one of `dates`, or whose instant lies in one of `ranges`, each [start, end).

    `ranges` are kept sorted and disjoint (overlapping ones joined), so a fire is looked up in them by bisection.
    Hashed once: the materializer keys its shared walks and rules by it for every due row."""

    dates: frozenset[date] = frozenset()
    ranges: tuple[tuple[datetime, datetime], ...] = ()
    _hash: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        disjoint: list[tuple[datetime, datetime]] = []
        for start, end in sorted(self.ranges):
            if disjoint and start <= disjoint[-1][1]:
                disjoint[-1] = (disjoint[-1][0], max(end, disjoint[-1][1]))
            else:
                disjoint.append((start, end))
        object.__setattr__(self, "dates", frozenset(self.dates))
        object.__setattr__(self, "ranges", tuple(disjoint))
        object.__setattr__(self, "_hash", hash((self.dates, self.ranges)))

    @classmethod
    def stored(cls, dates: Iterable[str], ranges: Iterable[Mapping[str, Any]]) -> Exclusions:
        """From a calendar's stored JSON: ISO dates, and ranges {"start", "end"} as ISO instants with offsets."""
        return cls(
            frozenset(date.fromisoformat(text) for text in dates),
            tuple(
                (datetime.fromisoformat(r["start"]).astimezone(UTC), datetime.fromisoformat(r["end"]).astimezone(UTC))
                for r in ranges
            ),
        )

    @classmethod
    def merged(cls, parts: Iterable[Exclusions]) -> Exclusions:
        """One Exclusions for several calendars: a fire any of them excludes does not exist."""
        parts = list(parts)
        return cls(frozenset().union(*(part.dates for part in parts)), tuple(r for part in parts for r in part.ranges))

    def __bool__(self) -> bool:
        return bool(self.dates or self.ranges)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Exclusions):
            return NotImplemented
        return self._hash == other._hash and self.dates == other.dates and self.ranges == other.ranges

    def skip_to(self, fire: datetime, zone: zoneinfo.ZoneInfo) -> datetime | None:
        """None when `fire` is not excluded; otherwise an instant before the next fire that could exist (the end of
        its range, or the start of the next local day not excluded), from which the walk goes on."""
        if self.ranges:
            index = bisect.bisect_right(self.ranges, (fire, _LATEST)) - 1
            if index >= 0 and fire < self.ranges[index][1]:
                return self.ranges[index][1] - _ONE_MICROSECOND
        if self.dates:
            day = fire.astimezone(zone).date()
            if day in self.dates:
                # Over a run of excluded days at once: a year of holidays in a row is one step of the walk.
                while day in self.dates and day < date.max:
                    day += timedelta(days=1)
                # fold=0 at that midnight: where a clock change skips midnight, an instant still on the day before;
                # the walk then meets that day's later fires again and skips them one by one.
                midnight = datetime.combine(day, time(0), tzinfo=zone)
                return max(fire, midnight.astimezone(UTC) - _ONE_MICROSECOND)
        return None


@dataclass(frozen=True)
class ExclusionHistory:
    """What calendars may have excluded over time: each content they had, applying to the fires in [since, until).

    A calendar change applies to fires not yet materialized, and the materializer writes a fire at most one horizon
    before it is due (or a little after, when it is behind). So a content in force from `valid_from` to `valid_to`
    may have decided the fires in [valid_from - after, valid_to + horizon): a fire any such content excludes is not
    owed. (The caller widens each span; dispatch/history.py.)"""

    spans: tuple[tuple[datetime, datetime | None, Exclusions], ...] = ()
    # False: a fire any content whose span holds it excludes is excluded (it may not exist, so it is not owed).
    # True: only a fire every such content excludes (it certainly does not exist, so it took no run under max_runs).
    every: bool = False

    def __bool__(self) -> bool:
        return any(exclusions for _, _, exclusions in self.spans)

    def certain(self) -> ExclusionHistory:
        """The same history excluding only what every content in force excluded."""
        return ExclusionHistory(self.spans, every=True)

    def skip_to(self, fire: datetime, zone: zoneinfo.ZoneInfo) -> datetime | None:
        resumes: list[datetime] = []
        held = False
        for since, until, exclusions in self.spans:
            if fire < since:
                if self.every:
                    # From `since` on another content has its say: look again there.
                    resumes.append(since - _ONE_MICROSECOND)
                continue
            if until is not None and fire >= until:
                continue
            held = True
            resume = exclusions.skip_to(fire, zone)
            if resume is None:
                if self.every:
                    return None
                continue
            # Past `until` this content decides nothing: the walk looks again from there.
            resume = resume if until is None else min(resume, until - _ONE_MICROSECOND)
            if not self.every:
                return resume
            resumes.append(resume)
        # Under `every`, a fire no content's span holds is not excluded.
        return min(resumes) if self.every and held else None


ExclusionsLike = Exclusions | ExclusionHistory
