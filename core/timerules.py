"""Time rules: DST-correct fire instants for schedules in IANA zones; the only module that drives croniter.

Three kinds: `cron` (wall-clock times in the zone), `once` (one instant) and `interval` (a fixed rate in elapsed
time: anchor_at + k x every_seconds, k >= 0, which clock changes never move; the zone only labels local times).

A cron rule's DST policy says what its wall times do when a clock change touches them (docs/API.md, "Time rules"):
a time the clocks skip is skipped or shifted (`dst_gap`), a time they repeat fires at its first instant, its last,
or both (`dst_repeat`). The defaults, skip and first, are the plain walk below; the others add or swap the few fires
of the clock changes (_next_cron_fire_by_policy).
"""

from __future__ import annotations

import copy
import functools
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import MAXYEAR, UTC, datetime, time, timedelta

from croniter import CroniterBadDateError, croniter

from core.cron_syntax import CronField, CronSpec, TimeRuleError, normalize_cron, parse_cron
from core.exclusions import ExclusionHistory, Exclusions, ExclusionsLike
from core.zone_changes import ClockChange, year_changes

# TimeRuleError is defined with the syntax checks but stays part of this API: TimeRule raises it, and the
# dispatch plane imports it from here.
__all__ = [
    "DST_GAP_POLICIES",
    "DST_REPEAT_POLICIES",
    "EARLIEST_INSTANT",
    "EVERY_SECONDS_RANGE",
    "LATEST_INSTANT",
    "ExclusionHistory",
    "Exclusions",
    "TimeRule",
    "TimeRuleError",
    "cron_walls_in",
    "local_time",
    "parse_timezone",
    "zone_names",
]

# How far ahead a walk looks for an expression's next fire before it says there is none: croniter's own bound.
SEARCH_YEARS = 50
# One entry per distinct (expression, zone) pair: tenants share a handful of rhythms, so this stays small.
COMPILE_CACHE_SIZE = 4096
# The materializer asks for the next fire of many schedules at the same instants; ~100 bytes per entry.
NEXT_FIRE_CACHE_SIZE = 65536

KINDS = ("cron", "once", "interval")
# A cron rule's DST policy; the first of each is the default (a schedule that names none).
DST_GAP_POLICIES = ("skip", "shift")
DST_REPEAT_POLICIES = ("first", "last", "both")
# The largest clock change there is (Pacific/Apia skipped 2011-12-30): the policies look back this far.
_LARGEST_CHANGE = timedelta(days=1)
# The instants a definition may name (run_at, anchor_at; the API's inputs too). Outside them zone conversion
# overflows datetime (year 1 or 9999 with an offset), and a preview of up to 100 fires of a rare rule (29 February,
# a yearly interval) would walk past year 9999.
EARLIEST_INSTANT = datetime(1900, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)
# The accepted periods of an interval schedule, in seconds: one second to 365 days.
EVERY_SECONDS_RANGE = (1, 31_536_000)
_ONE_MICROSECOND = timedelta(microseconds=1)
_MICROSECONDS_PER_SECOND = 1_000_000
# Zone files that zoneinfo can load but that name no place: they would silently mean "this host" or "no zone".
_NOT_IANA_ZONES = frozenset({"localtime", "posixrules", "Factory"})


def parse_timezone(name: str) -> zoneinfo.ZoneInfo:
    """Return the zone for an exact IANA name; host-relative and path-like names are refused."""
    if not isinstance(name, str):
        raise TimeRuleError("timezone", "The time zone must be a string such as 'Europe/Madrid'.")
    if not name:
        raise TimeRuleError("timezone", "The time zone is empty. Use an IANA name such as 'Europe/Madrid'.")
    return _load_zone(name)


@functools.lru_cache(maxsize=1024)
def _load_zone(name: str) -> zoneinfo.ZoneInfo:
    if name not in _NOT_IANA_ZONES and name in _known_zones():
        try:
            return zoneinfo.ZoneInfo(name)
        except (ValueError, OSError, zoneinfo.ZoneInfoNotFoundError):
            pass
    message = f"Unknown time zone {name[:64]!r}. Use an IANA name such as 'Europe/Madrid'."
    suggestion = _zones_by_lowercase().get(name.strip().lower())
    if suggestion:
        message = f"Unknown time zone {name[:64]!r}. Did you mean {suggestion!r}?"
    raise TimeRuleError("timezone", message)


@functools.lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    # An allow-list rather than trusting ZoneInfo(): it would also open relative paths and stray files.
    return frozenset(zoneinfo.available_timezones()) - _NOT_IANA_ZONES


def zone_names() -> list[str]:
    """Every zone name parse_timezone accepts, sorted (the API schema lists them)."""
    return sorted(_known_zones())


@functools.lru_cache(maxsize=1)
def _zones_by_lowercase() -> dict[str, str]:
    return {zone.lower(): zone for zone in _known_zones()}


@dataclass(frozen=True, eq=False)
class _Plan:
    """A compiled (expression, zone) pair; `template` is copied per use because croniter is stateful. None for an
    expression with calendar extensions (L, W, #), which its parsed fields walk instead."""

    spec: CronSpec
    zone: zoneinfo.ZoneInfo
    template: croniter | None


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _compile(expression: str, timezone: str) -> _Plan:
    spec = parse_cron(expression)
    zone = parse_timezone(timezone)
    if spec.has_specials:
        return _Plan(spec, zone, None)
    # croniter only ever sees plain number lists that we validated, so none of its dialect extensions (or
    # its reading of "*/2" in the day fields) can leak in; day_or carries the Vixie day rule explicitly.
    dom, dow = spec.dom, spec.dow
    if spec.day_or and (dom.full or dow.full):
        dom_text = dow_text = "*"
    else:
        dom_text, dow_text = _as_list(dom), _as_list(dow)
    fields = (_as_list(spec.minute), _as_list(spec.hour), dom_text, _as_list(spec.month), dow_text)
    template = croniter(" ".join(fields), datetime(2000, 1, 1), day_or=spec.day_or)
    return _Plan(spec, zone, template)


def _as_list(field: CronField) -> str:
    return "*" if field.full else ",".join(str(value) for value in sorted(field.values))


def _to_instant(wall: datetime, zone: zoneinfo.ZoneInfo) -> datetime | None:
    """Map a naive wall-clock time to its first UTC instant, or None when the zone skips it that day."""
    # fold=0 picks the earlier instant of a repeated (fall-back) time. For a time inside a spring-forward gap
    # zoneinfo still returns *some* instant, so existence is checked by converting back to the wall clock.
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return instant


def _iter_cron(plan: _Plan, after: datetime) -> Iterator[datetime]:
    """Yield the UTC fires strictly after `after` (aware UTC).

    1. Walk croniter over naive wall-clock times of the zone, so it never sees (or mishandles) DST.
    2. Drop wall times that do not exist that day (spring-forward gap, Apia's missing 2011-12-30).
    3. Map the rest with fold=0 and drop instants not after `after`.

    Starting the walk at after's own wall time is enough: with fold=0, later wall times map to later
    instants, so no earlier wall time can fire after `after`. When `after` lies in the second pass of a
    fall-back hour its wall time is repeated; the first-pass instants of that hour fall before it and are
    dropped in step 3, which is the "fires once, at the first instant" rule.
    """
    try:
        start = after.astimezone(plan.zone).replace(tzinfo=None)
    except OverflowError:
        # Only at the edges of datetime's range (a user-supplied preview `after`); never a server error.
        if after.year > 1:
            return
        start = datetime.min
    walls = _croniter_walls(plan.template, start) if plan.template is not None else _calendar_walls(plan.spec, start)
    while True:
        try:
            wall = next(walls, None)
            if wall is None:
                return
            instant = _to_instant(wall, plan.zone)
        except CroniterBadDateError:
            return  # nothing matches within croniter's 50-year search
        except (OverflowError, ValueError, OSError):
            return  # the walk ran off the end of datetime's range (year 9999)
        if instant is not None and instant > after:
            yield instant


def _croniter_walls(template: croniter, start: datetime) -> Iterator[datetime]:
    walker = copy.copy(template)
    walker.set_current(start)
    while True:
        yield walker.get_next(datetime)


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _times_of_day(spec: CronSpec) -> tuple[time, ...]:
    return tuple(time(hour, minute) for hour in sorted(spec.hour.values) for minute in sorted(spec.minute.values))


def _calendar_walls(spec: CronSpec, start: datetime) -> Iterator[datetime]:
    """The wall-clock times strictly after `start`, ascending, of an expression with calendar extensions: month by
    month, each month's days from the parsed fields (CronSpec.days_of), for as long as croniter would search."""
    times = _times_of_day(spec)
    year, month = start.year, start.month
    for _ in range(SEARCH_YEARS * 12):
        for day in spec.days_of(year, month):
            if (year, month, day) < (start.year, start.month, start.day):
                continue
            for moment in times:
                wall = datetime(year, month, day, moment.hour, moment.minute)
                if wall > start:
                    yield wall
        year, month = (year, month + 1) if month < 12 else (year + 1, 1)
        if year > MAXYEAR:
            return


@functools.lru_cache(maxsize=NEXT_FIRE_CACHE_SIZE)
def _next_cron_fire(expression: str, timezone: str, after: datetime) -> datetime | None:
    return next(_iter_cron(_compile(expression, timezone), after), None)


def cron_walls_in(spec: CronSpec, start: datetime, end: datetime) -> list[datetime]:
    """The wall-clock minutes in [start, end) (naive) the expression selects: those a clock change touches."""
    matched = []
    wall = start.replace(second=0, microsecond=0)
    if wall < start:
        wall += timedelta(minutes=1)
    while wall < end:
        if spec.matches(wall):
            matched.append(wall)
        wall += timedelta(minutes=1)
    return matched


@functools.lru_cache(maxsize=NEXT_FIRE_CACHE_SIZE)
def _next_cron_fire_by_policy(
    expression: str, timezone: str, gap: str, repeat: str, after: datetime
) -> datetime | None:
    """The first fire strictly after `after` under a DST policy other than (skip, first).

    The policies change the fires of clock changes only: `last` drops the first instant of each repeated wall time,
    and the fires they add all lie in [change.at, change.at + size) of a change (a skipped time shifted by the
    offset from before it, or a repeated time's second instant). So the answer is the plain walk's next fire (its
    first instants dropped under `last`) or the earliest added fire of a change between one day before `after` (the
    largest change there is) and that fire, whichever comes first; a shifted fire that lands on a real one is one
    fire.
    """
    plan = _compile(expression, timezone)
    walk = _iter_cron(plan, after)
    best = next(walk, None)
    if repeat == "last":
        while best is not None and _is_first_of_repeated(best, plan.zone):
            best = next(walk, None)
    # A rule whose every wall time is skipped within a year would have no plain fire: look a year ahead for it.
    until = best if best is not None else after + timedelta(days=366)
    for change in _changes_between(plan.zone, after - _LARGEST_CHANGE, until):
        if change.at + change.size <= after:
            continue
        if best is not None and change.at > best:
            break
        for instant in _added_fires(plan.spec, change, gap, repeat):
            if instant > after and (best is None or instant < best):
                best = instant
    return best


def _is_first_of_repeated(instant: datetime, zone: zoneinfo.ZoneInfo) -> bool:
    local = instant.astimezone(zone)
    return local.fold == 0 and local.replace(fold=1).utcoffset() != local.utcoffset()


def _changes_between(zone: zoneinfo.ZoneInfo, since: datetime, until: datetime) -> Iterator[ClockChange]:
    """The zone's changes with since < at <= until, from its cached years."""
    for year in range(since.year, min(until.year, MAXYEAR) + 1):
        for change in year_changes(zone, year):
            if since < change.at <= until:
                yield change


def _added_fires(spec: CronSpec, change: ClockChange, gap: str, repeat: str) -> list[datetime]:
    """The fires a policy adds at one change, ascending: its skipped times at the offset from before the change
    (shift), or its repeated times' second instants (last, both)."""
    if change.is_gap:
        offset = change.before if gap == "shift" else None
    else:
        offset = change.after if repeat in ("last", "both") else None
    if offset is None:
        return []
    return [(wall - offset).replace(tzinfo=UTC) for wall in cron_walls_in(spec, *change.wall_range())]


def _as_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def _next_interval_fire(anchor: datetime, every_seconds: int, after: datetime) -> datetime | None:
    """The first anchor + k x every_seconds (k >= 0) strictly after `after`, by division: O(1) however far the
    anchor lies behind (the materializer asks this for every fire it plans). Exact integer microseconds, so a fire is
    never a float's rounding away from the grid. None past the end of datetime's range."""
    if after < anchor:
        return anchor
    every = every_seconds * _MICROSECONDS_PER_SECOND
    steps = (after - anchor) // _ONE_MICROSECOND // every + 1
    try:
        return anchor + timedelta(microseconds=steps * every)
    except OverflowError:
        return None


@dataclass(frozen=True)
class TimeRule:
    """When a schedule fires: a cron rhythm in a zone, a single instant, or a fixed interval from an anchor."""

    kind: str
    timezone: str = "UTC"
    cron: str | None = None
    run_at: datetime | None = None
    every_seconds: int | None = None
    anchor_at: datetime | None = None
    # Kind "cron" only; None is the default policy (skip, first).
    dst_gap: str | None = None
    dst_repeat: str | None = None
    # Every kind: no fire before start_at or after end_at (both inclusive; None is unbounded).
    start_at: datetime | None = None
    end_at: datetime | None = None
    # Every kind: fires that do not exist (calendars); None is none.
    exclusions: ExclusionsLike | None = None

    def validate(self) -> None:
        """Raise TimeRuleError naming the API field at fault; `once` and `interval` need a valid zone too (the
        local labels of previews)."""
        if self.kind not in KINDS:
            raise TimeRuleError("kind", f"Unknown kind {str(self.kind)[:20]!r}. Use 'cron', 'once' or 'interval'.")
        parse_timezone(self.timezone)
        if self.kind != "cron" and (self.dst_gap is not None or self.dst_repeat is not None):
            field = "dst_gap" if self.dst_gap is not None else "dst_repeat"
            raise TimeRuleError(field, f"Only cron schedules take {field}: other kinds' fires never meet a wall time.")
        if self.kind == "cron":
            if self.cron is None:
                raise TimeRuleError("cron", "A cron schedule needs a cron expression, e.g. '30 2 * * *'.")
            normalize_cron(self.cron)
            for field, value, choices in (
                ("dst_gap", self.dst_gap, DST_GAP_POLICIES),
                ("dst_repeat", self.dst_repeat, DST_REPEAT_POLICIES),
            ):
                if value is not None and value not in choices:
                    raise TimeRuleError(field, f"{field} must be one of: {', '.join(choices)}.")
        elif self.kind == "interval":
            self._interval()
            low, high = EVERY_SECONDS_RANGE
            if not low <= (self.every_seconds or 0) <= high:
                raise TimeRuleError("every_seconds", f"every_seconds must be an integer from {low} to {high:,}.")
        else:
            self._run_at_utc()
        for field in ("start_at", "end_at"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise TimeRuleError(field, f"{field} needs a UTC offset or 'Z', e.g. '2026-12-01T07:30:00Z'.")
        if self.start_at is not None and self.end_at is not None and self.end_at < self.start_at:
            raise TimeRuleError("end_at", "end_at must not be before start_at.")

    def next_after(self, after: datetime) -> datetime | None:
        """First fire strictly after `after` (aware, any zone) as aware UTC; None when there is none."""
        after = _as_utc(after, "after")
        if self.start_at is not None and after < self.start_at:
            after = _as_utc(self.start_at, "start_at") - _ONE_MICROSECOND
        fire = self._next_in_rhythm(after)
        if self.exclusions:
            zone = parse_timezone(self.timezone)
            while fire is not None and (resume := self.exclusions.skip_to(fire, zone)) is not None:
                fire = self._next_in_rhythm(resume)
        if fire is not None and self.end_at is not None and fire > self.end_at:
            return None
        return fire

    def allows(self, instant: datetime) -> bool:
        """Whether a fire at `instant` may exist: in [start_at, end_at] and not excluded (a one-off's run_at that is
        not allowed has no fire)."""
        if (self.start_at is not None and instant < self.start_at) or (
            self.end_at is not None and instant > self.end_at
        ):
            return False
        return not self.exclusions or self.exclusions.skip_to(instant, parse_timezone(self.timezone)) is None

    def _next_in_rhythm(self, after: datetime) -> datetime | None:
        """next_after without the window: the kind's own rule."""
        if self.kind == "interval":
            return _next_interval_fire(*self._grid, after)
        if self.kind == "once":
            run_at = self._run_at_utc()
            return run_at if run_at > after else None
        if self.kind != "cron":
            self.validate()
        if self.cron is None:
            raise TimeRuleError("cron", "A cron schedule needs a cron expression, e.g. '30 2 * * *'.")
        expression = normalize_cron(self.cron)
        gap, repeat = self.dst_gap or "skip", self.dst_repeat or "first"
        if gap == "skip" and repeat == "first":
            return _next_cron_fire(expression, self.timezone, after)
        return _next_cron_fire_by_policy(expression, self.timezone, gap, repeat, after)

    def dst_mark(self, fire: datetime) -> str | None:
        """How a clock change touches one of this rule's fires, for previews: "repeated" when its local time occurs
        twice that day, "shifted" when it is a skipped time fired under dst_gap "shift" (its own local time is not
        one the expression names); None otherwise and for other kinds."""
        if self.kind != "cron" or self.cron is None:
            return None
        local = _as_utc(fire, "fire").astimezone(parse_timezone(self.timezone))
        if local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
            return "repeated"
        if self.dst_gap == "shift" and not parse_cron(self.cron).matches(local.replace(tzinfo=None)):
            return "shifted"
        return None

    def iter_after(self, after: datetime) -> Iterator[datetime]:
        """Successive fires strictly after `after`, ascending aware UTC; ends when the rule has no more."""
        fire = self.next_after(after)
        while fire is not None:
            yield fire
            # Chaining next_after (not one long croniter walk) lets schedules that share a rhythm share
            # the cache as the materializer walks them forward.
            fire = self.next_after(fire)

    def fires_between(self, since: datetime, until: datetime) -> list[datetime]:
        """Fires t with since <= t < until (inclusive since, exclusive until), ascending aware UTC.

        Half-open windows tile: consecutive windows [a, b), [b, c) never count a fire twice.
        """
        since, until = _as_utc(since, "since"), _as_utc(until, "until")
        fires: list[datetime] = []
        # Fires are whole microseconds, so "strictly after since - 1 µs" is exactly "at or after since".
        for fire in self.iter_after(since - timedelta(microseconds=1)):
            if fire >= until:
                break
            fires.append(fire)
        return fires

    def _run_at_utc(self) -> datetime:
        if self.run_at is None:
            raise TimeRuleError("run_at", "A one-off schedule needs run_at, e.g. '2026-12-01T07:30:00Z'.")
        if not isinstance(self.run_at, datetime):
            raise TimeRuleError("run_at", "run_at must be a date and time, e.g. '2026-12-01T07:30:00Z'.")
        if self.run_at.utcoffset() is None:
            raise TimeRuleError("run_at", "run_at needs a UTC offset or 'Z', e.g. '2026-12-01T07:30:00Z'.")
        return self.run_at.astimezone(UTC)

    @functools.cached_property
    def _grid(self) -> tuple[datetime, int]:
        """_interval(), checked once per rule: the materializer asks a rule for each fire it walks."""
        return self._interval()

    def _interval(self) -> tuple[datetime, int]:
        """(anchor_at in UTC, every_seconds), checked as far as the arithmetic needs: a positive whole period (the
        accepted range is validate()'s; a stored rule past it still has fires, so the materializer never fails)."""
        every = self.every_seconds
        if every is None:
            raise TimeRuleError("every_seconds", "An interval schedule needs every_seconds, e.g. 300.")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            low, high = EVERY_SECONDS_RANGE
            raise TimeRuleError("every_seconds", f"every_seconds must be an integer from {low} to {high:,}.")
        anchor = self.anchor_at
        if anchor is None:
            raise TimeRuleError("anchor_at", "An interval schedule needs anchor_at, e.g. '2026-12-01T07:30:00Z'.")
        if not isinstance(anchor, datetime):
            raise TimeRuleError("anchor_at", "anchor_at must be a date and time, e.g. '2026-12-01T07:30:00Z'.")
        if anchor.utcoffset() is None:
            raise TimeRuleError("anchor_at", "anchor_at needs a UTC offset or 'Z', e.g. '2026-12-01T07:30:00Z'.")
        return (anchor if anchor.tzinfo is UTC else anchor.astimezone(UTC)), every


def local_time(instant: datetime, timezone: str) -> datetime:
    """The instant on the zone's wall clock (with its offset), for "local" columns in previews."""
    return _as_utc(instant, "instant").astimezone(parse_timezone(timezone))
