"""Exclusions: the fires a tenant's holiday calendars say do not exist, as the time rules (core/timerules.py) skip
them: by the fire's local date in the rule's zone, or by its instant in a range.

Two shapes with one method (skip_to): `Exclusions`, the calendars as they are now (the materializer, previews), and
`ExclusionHistory`, every content they had, each over the fires it may have decided (reconcile and backfill)."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

__all__ = ["ExclusionHistory", "Exclusions", "ExclusionsLike"]

_ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Exclusions:
    """Fires that do not exist (a tenant's holiday calendars, merged): those whose local date in the rule's zone is
    one of `dates`, or whose instant lies in one of `ranges`, each [start, end). Hashable, so rules that share it
    share the caches."""

    dates: frozenset[date] = frozenset()
    ranges: tuple[tuple[datetime, datetime], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.dates or self.ranges)

    @classmethod
    def stored(cls, dates: Iterable[str], ranges: Iterable[Mapping[str, Any]]) -> Exclusions:
        """From a calendar's stored JSON: ISO dates, and ranges {"start", "end"} as ISO instants with offsets."""
        return cls(
            frozenset(date.fromisoformat(text) for text in dates),
            tuple(
                sorted(
                    (
                        datetime.fromisoformat(r["start"]).astimezone(UTC),
                        datetime.fromisoformat(r["end"]).astimezone(UTC),
                    )
                    for r in ranges
                )
            ),
        )

    @classmethod
    def merged(cls, parts: Iterable[Exclusions]) -> Exclusions:
        """One Exclusions for several calendars: a fire any of them excludes does not exist."""
        parts = list(parts)
        return cls(
            frozenset().union(*(part.dates for part in parts)),
            tuple(sorted({r for part in parts for r in part.ranges})),
        )

    def skip_to(self, fire: datetime, zone: zoneinfo.ZoneInfo) -> datetime | None:
        """None when `fire` is not excluded; otherwise an instant before the next fire that could exist (the end of
        its range, or the start of the next local day), from which the walk goes on."""
        for start, end in self.ranges:
            if start <= fire < end:
                return end - _ONE_MICROSECOND
        if self.dates:
            local = fire.astimezone(zone)
            if local.date() in self.dates:
                # fold=0 at the next midnight: where a clock change skips midnight, an instant still on this day;
                # the walk then meets this day's later fires again and skips them one by one.
                midnight = datetime.combine(local.date() + timedelta(days=1), time(0), tzinfo=zone)
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

    def __bool__(self) -> bool:
        return any(exclusions for _, _, exclusions in self.spans)

    def skip_to(self, fire: datetime, zone: zoneinfo.ZoneInfo) -> datetime | None:
        for since, until, exclusions in self.spans:
            if fire < since or (until is not None and fire >= until):
                continue
            resume = exclusions.skip_to(fire, zone)
            if resume is not None:
                # Past `until` this content decides nothing: the walk looks again from there.
                return resume if until is None else min(resume, until - _ONE_MICROSECOND)
        return None


ExclusionsLike = Exclusions | ExclusionHistory
