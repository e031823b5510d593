"""Where a zone's clock changes meet a rule's fires: the notes a preview shows beside them.

The time rules (core/timerules.py; docs/API.md, "Time rules") skip a wall-clock time that does not exist that
day (spring forward) and fire a repeated one once, at its first instant (fall back), unless the rule's DST policy
says otherwise (shift the skipped time; fire the repeated one at its last instant, or both). Each is silent in a
list of fires: a day is just missing, or an hour looks ordinary. These notes say so, in the words an operator checks
a rule with. An interval rule is elapsed time, which a clock change never moves: its note says that its fires read
differently on the local clock from then on (a daily interval at 09:00 EST is at 10:00 EDT after spring forward).

No croniter here: the parsed fields (core.cron_syntax) are matched against the few wall-clock minutes a clock
change affects, with the Vixie day rule, exactly as timerules walks them.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.cron_syntax import CronSpec, TimeRuleError, parse_cron
from core.timerules import cron_walls_in, parse_timezone
from core.zone_changes import ClockChange
from core.zone_changes import clock_changes as zone_clock_changes

__all__ = [
    "ClockChange",
    "DstNote",
    "clock_changes",
    "dst_notes",
    "interval_dst_notes",
    "preview_notes",
    "upcoming_dst_notes",
    "upcoming_interval_dst_notes",
]

# A preview of 100 fires of a yearly rule spans a century; its notes cover the first years only, which bounds the
# sampling (about 7,300 offsets) for a request made on every keystroke.
MAX_SCAN = timedelta(days=5 * 366)
# More affected wall times than this are written as a range ("01:00 to 01:59, 60 times").
LISTED_TIMES = 4


@dataclass(frozen=True)
class DstNote:
    """A note for a preview. `at` orders it among the fires; `fires` are the fires it explains (a repeated time's
    first instants), none for skipped times, which have no fire."""

    kind: str  # "skipped" | "shifted" | "repeated" (cron), "elapsed" (interval)
    at: datetime
    text: str
    fires: tuple[datetime, ...] = ()


def clock_changes(zone: zoneinfo.ZoneInfo, since: datetime, until: datetime) -> list[ClockChange]:
    """The zone's changes with since < at <= until, for at most MAX_SCAN after `since`."""
    return zone_clock_changes(zone, since, min(until.astimezone(UTC), since.astimezone(UTC) + MAX_SCAN))


def _times(walls: list[datetime]) -> str:
    texts = [f"{wall:%H:%M}" for wall in walls]
    if len(texts) == 1:
        return texts[0]
    if len(texts) <= LISTED_TIMES:
        return f"{', '.join(texts[:-1])} and {texts[-1]}"
    return f"{texts[0]} to {texts[-1]} ({len(texts)} times)"


def dst_notes(
    cron: str,
    timezone: str,
    *,
    after: datetime,
    fires: list[datetime],
    dst_gap: str | None = None,
    dst_repeat: str | None = None,
) -> list[DstNote]:
    """Notes for the clock changes among a preview's fires (strictly after `after`, up to the last fire).

    A skipped time is noted when its change falls in that span; a repeated one when its first instant (the one that
    fires) does, and the note names those fires. Nothing for an empty preview, or a rule or zone that does not parse
    (the preview reports those errors itself).
    """
    if not fires:
        return []
    parsed = _parse(cron, timezone)
    if parsed is None:
        return []
    spec, zone = parsed
    last = max(fires)
    notes = []
    # A repeated time's first instant lies before its change (by up to the size of the fold): look a day past `last`.
    for change in clock_changes(zone, after, last + timedelta(days=1)):
        note = _note(spec, zone, timezone, change, after=after, until=last, policy=(dst_gap, dst_repeat))
        if note is not None:
            notes.append(note)
    return notes


def upcoming_dst_notes(
    cron: str,
    timezone: str,
    *,
    after: datetime,
    within: timedelta = timedelta(days=366),
    limit: int = 2,
    dst_gap: str | None = None,
    dst_repeat: str | None = None,
) -> list[DstNote]:
    """The next `limit` clock changes after `after` (within a year) that touch the rule's wall times: what a short
    preview cannot show yet ("30 2 * * *" in New York, previewed in December, skips 02:30 in March)."""
    parsed = _parse(cron, timezone)
    if parsed is None:
        return []
    spec, zone = parsed
    notes = []
    for change in clock_changes(zone, after, after + within):
        until = after + within + timedelta(days=1)
        note = _note(spec, zone, timezone, change, after=after, until=until, policy=(dst_gap, dst_repeat))
        if note is not None:
            notes.append(note)
            if len(notes) >= limit:
                break
    return notes


def _parse(cron: str, timezone: str) -> tuple[CronSpec, zoneinfo.ZoneInfo] | None:
    try:
        return parse_cron(cron), parse_timezone(timezone)
    except TimeRuleError:
        return None


def _note(
    spec: CronSpec,
    zone: zoneinfo.ZoneInfo,
    timezone: str,
    change: ClockChange,
    *,
    after: datetime,
    until: datetime,
    policy: tuple[str | None, str | None] = (None, None),
) -> DstNote | None:
    """The note for one change, when it touches the rule's wall times within (after, until], in the words of the
    rule's DST policy (dst_gap, dst_repeat; None is the default)."""
    walls = cron_walls_in(spec, *change.wall_range())
    if not walls:
        return None
    gap, repeat = policy[0] or "skip", policy[1] or "first"
    day = f"{walls[0]:%Y-%m-%d}"
    if change.is_gap:
        return _gap_note(walls, zone, timezone, change, after=after, until=until, shift=gap == "shift")
    # fold=0: the first pass of a repeated hour is on the offset from before the change; fold=1 the second.
    firsts = tuple((wall - change.before).replace(tzinfo=UTC) for wall in walls)
    seconds = tuple((wall - change.after).replace(tzinfo=UTC) for wall in walls)
    fired = {"first": firsts, "last": seconds, "both": tuple(sorted(firsts + seconds))}[repeat]
    shown = tuple(fire for fire in fired if after < fire <= until)
    if not shown:
        return None
    one = len(walls) == 1
    times, occur = _times(walls), "occurs" if one else "occur"
    first_zone = firsts[0].astimezone(zone).tzname()
    second_zone = seconds[0].astimezone(zone).tzname()
    if repeat == "both":
        text = (
            f"On {day} in {timezone}, {times} {occur} twice: {'fires' if one else 'each fires'} at both, "
            f"in {first_zone} and again in {second_zone} (dst_repeat 'both')."
        )
    else:
        which, other = ("first", second_zone) if repeat == "first" else ("second", first_zone)
        local = shown[0].astimezone(zone)
        if one:
            text = (
                f"On {day} in {timezone}, {times} occurs twice: fires once, at the {which} "
                f"({local:%H:%M} {local.tzname()}, {shown[0]:%H:%M} UTC), not at {walls[0]:%H:%M} {other}."
            )
        else:
            text = (
                f"On {day} in {timezone}, {times} occur twice: each fires once, at the {which} "
                f"({local.tzname()}), not again in {other}."
            )
    return DstNote(kind="repeated", at=shown[0], text=text, fires=shown)


def _gap_note(
    walls: list[datetime],
    zone: zoneinfo.ZoneInfo,
    timezone: str,
    change: ClockChange,
    *,
    after: datetime,
    until: datetime,
    shift: bool,
) -> DstNote | None:
    if not after < change.at <= until:
        return None
    verb = "does not exist" if len(walls) == 1 else "do not exist"
    start, end = change.wall_range()
    # A jump across midnight (Pacific/Apia skipped all of 2011-12-30) needs the dates to read right.
    clock = "%H:%M" if start.date() == end.date() else "%Y-%m-%d %H:%M"
    jump = f"the clocks jump from {start:{clock}} to {end:{clock}}"
    head = f"{_times(walls)} {verb} on {walls[0]:%Y-%m-%d} in {timezone}"
    if not shift:
        return DstNote(kind="skipped", at=change.at, text=f"{head}: skipped ({jump}).")
    shifted = tuple((wall - change.before).replace(tzinfo=UTC) for wall in walls)
    local = shifted[0].astimezone(zone)
    fires_at = f"fires at {local:{clock}} {local.tzname()}"
    if len(walls) > 1:
        fires_at = f"each fires {_span(change.size)} later on the clock ({walls[0]:%H:%M} {fires_at})"
    text = f"{head}: shifted by the clock change, {fires_at} ({jump}; dst_gap 'shift')."
    return DstNote(kind="shifted", at=change.at, text=text, fires=shifted)


def preview_notes(
    kind: str,
    timezone: str,
    *,
    cron: str | None,
    after: datetime,
    fires: list[datetime],
    dst_gap: str | None = None,
    dst_repeat: str | None = None,
) -> tuple[list[DstNote], list[DstNote]]:
    """A preview's notes as they touch the rule's kind: those among its fires, and the next ones after them (within
    a year). A cron rule's skipped and repeated wall times; an interval's fires reading differently on the local
    clock; nothing for a one-off."""
    last = max(fires) if fires else after
    if kind == "cron":
        expression = cron or ""
        notes = dst_notes(expression, timezone, after=after, fires=fires, dst_gap=dst_gap, dst_repeat=dst_repeat)
        ahead = upcoming_dst_notes(expression, timezone, after=last, dst_gap=dst_gap, dst_repeat=dst_repeat)
        return notes, ahead
    if kind == "interval":
        notes = interval_dst_notes(timezone, after=after, fires=fires)
        return notes, upcoming_interval_dst_notes(timezone, after=last)
    return [], []


def interval_dst_notes(timezone: str, *, after: datetime, fires: list[datetime]) -> list[DstNote]:
    """Notes for the clock changes among an interval preview's fires (strictly after `after`, up to the last fire),
    each naming the first fire after the change. Nothing for an empty preview or a zone that does not parse."""
    zone = _zone(timezone)
    if zone is None or not fires:
        return []
    ordered = sorted(fires)
    notes = []
    for change in clock_changes(zone, after, ordered[-1]):
        first_after = next(fire for fire in ordered if fire >= change.at)
        notes.append(_elapsed_note(change, timezone, fires=(first_after,)))
    return notes


def upcoming_interval_dst_notes(
    timezone: str, *, after: datetime, within: timedelta = timedelta(days=366), limit: int = 2
) -> list[DstNote]:
    """The next `limit` clock changes of the zone after `after` (within a year): an interval's fires keep their
    elapsed rhythm through each, and read differently on the local clock after it."""
    zone = _zone(timezone)
    if zone is None:
        return []
    return [_elapsed_note(change, timezone) for change in clock_changes(zone, after, after + within)[:limit]]


def _zone(timezone: str) -> zoneinfo.ZoneInfo | None:
    try:
        return parse_timezone(timezone)
    except TimeRuleError:
        return None


def _elapsed_note(change: ClockChange, timezone: str, fires: tuple[datetime, ...] = ()) -> DstNote:
    start, end = change.wall_range()
    shift = abs(change.after - change.before)
    clock = "%H:%M" if start.date() == end.date() else "%Y-%m-%d %H:%M"
    if change.is_gap:
        what, direction = f"the clocks jump from {start:{clock}} to {end:{clock}}", "later"
    else:
        what, direction = f"the clocks go back from {end:{clock}} to {start:{clock}}", "earlier"
    return DstNote(
        kind="elapsed",
        at=change.at,
        text=f"On {start:%Y-%m-%d} in {timezone} {what}: the interval keeps its rhythm in elapsed time, so from then "
        f"on its fires read {_span(shift)} {direction} on the local clock.",
        fires=fires,
    )


def _span(span: timedelta) -> str:
    """'1 h', '30 min', '1 h 30 min', '1 d': the size of a clock change."""
    minutes = int(span.total_seconds()) // 60
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    return " ".join(part for part in parts if part) or f"{int(span.total_seconds())} s"
