"""Exclusions: the fires a tenant's holiday calendars say do not exist, as the time rules (core/timerules.py) skip
them: by the fire's local date in the rule's zone, or by its instant in a range."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

__all__ = ["Exclusions"]

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
