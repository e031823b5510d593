"""Time rules: strict Vixie cron parsing and DST-correct fire instants for schedules in IANA zones."""

from __future__ import annotations

import copy
import functools
import re
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadDateError, croniter

__all__ = [
    "TimeRule",
    "TimeRuleError",
    "describe_cron",
    "local_time",
    "normalize_cron",
    "parse_timezone",
]

# Longer input is never a hand-written crontab line; refusing it early bounds parsing work per request.
MAX_CRON_LENGTH = 200
# One entry per distinct (expression, zone) pair: tenants share a handful of rhythms, so this stays small.
COMPILE_CACHE_SIZE = 4096
# The materializer asks for the next fire of many schedules at the same instants; ~100 bytes per entry.
NEXT_FIRE_CACHE_SIZE = 65536

KINDS = ("cron", "once")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# Zone files that zoneinfo can load but that name no place: they would silently mean "this host" or "no zone".
_NOT_IANA_ZONES = frozenset({"localtime", "posixrules", "Factory"})
_FIELDS_HINT = "minute hour day-of-month month day-of-week"
_ELEMENT_RE = re.compile(r"(?:(\*)|([0-9a-z]+)(?:-([0-9a-z]+))?)(?:/([0-9]+))?", re.ASCII)


class TimeRuleError(ValueError):
    """Raised with a precise, user-facing message; `field` names the API field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0

    def hint(self) -> str:
        if self.names:
            return f"{self.low}-{self.high} or {self.names[0]}-{self.names[-1]}"
        return f"{self.low}-{self.high}"


# Day-of-week accepts 7 as a second Sunday, as Vixie cron does.
_FIELD_SPECS = (
    _FieldSpec("minute", 0, 59),
    _FieldSpec("hour", 0, 23),
    _FieldSpec("day-of-month", 1, 31),
    _FieldSpec("month", 1, 12, MONTH_NAMES, 1),
    _FieldSpec("day-of-week", 0, 7, DOW_NAMES, 0),
)
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February at its leap-year longest


@dataclass(frozen=True)
class _Field:
    text: str
    values: frozenset[int]
    full: bool
    # Vixie decides the day-of-month/day-of-week OR rule on whether the field *starts with* "*" ("*/2" too).
    star: bool


@dataclass(frozen=True)
class _CronSpec:
    expression: str
    minute: _Field
    hour: _Field
    dom: _Field
    month: _Field
    dow: _Field

    @property
    def day_or(self) -> bool:
        return not (self.dom.star or self.dow.star)


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


@functools.lru_cache(maxsize=1)
def _zones_by_lowercase() -> dict[str, str]:
    return {zone.lower(): zone for zone in _known_zones()}


def normalize_cron(expr: str) -> str:
    """Validate a 5-field Vixie expression or macro; return it lowercased with whitespace collapsed."""
    return _parse_cron(_check_cron_text(expr)).expression


def _check_cron_text(expr: object) -> str:
    if not isinstance(expr, str):
        raise TimeRuleError("cron", "The cron expression must be a string such as '30 2 * * *'.")
    if len(expr) > MAX_CRON_LENGTH:
        raise TimeRuleError("cron", f"The cron expression is too long (over {MAX_CRON_LENGTH} characters).")
    if not expr.strip():
        raise TimeRuleError("cron", f"The cron expression is empty. Use 5 fields: {_FIELDS_HINT}.")
    return expr


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _parse_cron(expr: str) -> _CronSpec:
    # Only spaces and tabs separate fields, as in a crontab; other whitespace inside is reported as invalid.
    tokens = re.split(r"[ \t]+", expr.strip(" \t\r\n").lower())
    normalized = " ".join(tokens)
    if len(tokens) == 1 and tokens[0].startswith("@"):
        macro = tokens[0]
        if macro == "@reboot":
            raise TimeRuleError("cron", "'@reboot' is not supported: a schedule needs fire times.")
        if macro not in MACROS:
            supported = ", ".join(MACROS)
            raise TimeRuleError("cron", f"Unknown macro {macro[:20]!r}. Supported macros: {supported}.")
        tokens = MACROS[macro].split(" ")
    elif any(token.startswith("@") for token in tokens):
        raise TimeRuleError("cron", "A macro such as '@daily' must be the whole expression.")
    if len(tokens) != 5:
        extra = ""
        if len(tokens) in (6, 7):
            extra = " Seconds and year fields are not supported."
        raise TimeRuleError("cron", f"Expected 5 fields ({_FIELDS_HINT}) but got {len(tokens)}.{extra}")
    minute, hour, dom, month, dow = (
        _parse_field(token, spec) for token, spec in zip(tokens, _FIELD_SPECS, strict=True)
    )
    spec = _CronSpec(normalized, minute, hour, dom, month, dow)
    _check_satisfiable(spec)
    return spec


def _parse_field(token: str, spec: _FieldSpec) -> _Field:
    values: set[int] = set()
    for element in token.split(","):
        values.update(_parse_element(element, token, spec))
    if spec.name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    span = 7 if spec.name == "day-of-week" else spec.high - spec.low + 1
    return _Field(token, frozenset(values), len(values) == span, token.startswith("*"))


def _parse_element(element: str, token: str, spec: _FieldSpec) -> range:
    where = f"In the {spec.name} field {token[:40]!r}"
    unsupported = _unsupported_syntax(element)
    if unsupported:
        raise TimeRuleError("cron", f"{where}: {unsupported}")
    match = _ELEMENT_RE.fullmatch(element)
    if match is None:
        raise TimeRuleError(
            "cron",
            f"{where}: {element[:20]!r} is not valid. Use values {spec.hint()}, '*', ranges (a-b), "
            "steps (*/n or a-b/n) and lists (a,b).",
        )
    star, first, last, step_text = match.groups()
    if star:
        low, high = spec.low, spec.high
    else:
        low = _parse_value(first, spec)
        if last is None and step_text is not None:
            raise TimeRuleError(
                "cron",
                f"{where}: a step needs '*' or a range before it, "
                f"e.g. '*/{step_text}' or '{first}-{spec.high}/{step_text}'.",
            )
        high = low if last is None else _parse_value(last, spec)
        if high < low:
            raise TimeRuleError(
                "cron",
                f"{where}: the range {first}-{last} runs backwards; "
                "list the values instead (ranges do not wrap around).",
            )
    step = 1
    if step_text is not None:
        step = int(step_text)
        span = spec.high - spec.low + 1
        if not 1 <= step <= span:
            raise TimeRuleError("cron", f"{where}: the step must be between 1 and {span}.")
    return range(low, high + 1, step)


def _parse_value(text: str, spec: _FieldSpec) -> int:
    if text.isdigit():
        value = int(text)
        if not spec.low <= value <= spec.high:
            raise TimeRuleError(
                "cron",
                f"{value} is out of range for the {spec.name} field (allowed {spec.low}-{spec.high}).",
            )
        return value
    if text in spec.names:
        return spec.names.index(text) + spec.name_base
    if spec.names:
        expected = f"use {spec.names[0]}-{spec.names[-1]} or {spec.low}-{spec.high}"
    else:
        expected = f"names are only allowed in the month and day-of-week fields; use {spec.low}-{spec.high}"
    raise TimeRuleError("cron", f"Unknown value {text[:20]!r} in the {spec.name} field: {expected}.")


def _unsupported_syntax(element: str) -> str | None:
    """Name the non-Vixie feature the user reached for, since other schedulers taught them to."""
    if not element:
        return "empty list item."
    if "?" in element:
        return "'?' is not supported; use '*'."
    if "#" in element:
        return "'#' (nth weekday of the month) is not supported."
    for part in re.split(r"[-/]", element):
        if part in ("l", "lw") or re.fullmatch(r"[0-9]+l", part):
            return "'L' (last day) is not supported."
        if re.fullmatch(r"[0-9]+w|w[0-9]*", part):
            return "'W' (nearest weekday) is not supported."
        if part == "h" or part.startswith("h("):
            return "'H' (hashed values) is not supported."
        if part == "r" or part.startswith("r("):
            return "'R' (random values) is not supported."
    return None


def _check_satisfiable(spec: _CronSpec) -> None:
    # Under the OR rule any restricted weekday occurs every month, and with AND each calendar date falls on
    # every weekday over the years, so only a day-of-month that no selected month contains is hopeless.
    if spec.day_or or spec.dom.full:
        return
    if any(day <= _DAYS_IN_MONTH[month - 1] for month in spec.month.values for day in spec.dom.values):
        return
    message = f"day-of-month {spec.dom.text!r} never occurs in month {spec.month.text!r}"
    raise TimeRuleError("cron", f"The expression never fires: {message}.")


@dataclass(frozen=True, eq=False)
class _Plan:
    """A compiled (expression, zone) pair; `template` is copied per use because croniter is stateful."""

    spec: _CronSpec
    zone: zoneinfo.ZoneInfo
    template: croniter


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _compile(expression: str, timezone: str) -> _Plan:
    spec = _parse_cron(expression)
    zone = parse_timezone(timezone)
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


def _as_list(field: _Field) -> str:
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
    walker = copy.copy(plan.template)
    try:
        start = after.astimezone(plan.zone).replace(tzinfo=None)
    except OverflowError:
        # Only at the edges of datetime's range (a user-supplied preview `after`); never a server error.
        if after.year > 1:
            return
        start = datetime.min
    walker.set_current(start)
    while True:
        try:
            wall = walker.get_next(datetime)
            instant = _to_instant(wall, plan.zone)
        except CroniterBadDateError:
            return  # nothing matches within croniter's 50-year search
        except (OverflowError, ValueError, OSError):
            return  # the walk ran off the end of datetime's range (year 9999)
        if instant is not None and instant > after:
            yield instant


@functools.lru_cache(maxsize=NEXT_FIRE_CACHE_SIZE)
def _next_cron_fire(expression: str, timezone: str, after: datetime) -> datetime | None:
    return next(_iter_cron(_compile(expression, timezone), after), None)


def _as_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
    return value if value.tzinfo is UTC else value.astimezone(UTC)


@dataclass(frozen=True)
class TimeRule:
    """When a schedule fires: a cron rhythm in a zone, or a single instant."""

    kind: str
    timezone: str = "UTC"
    cron: str | None = None
    run_at: datetime | None = None

    def validate(self) -> None:
        """Raise TimeRuleError naming the API field at fault; `once` needs a valid zone too (previews)."""
        if self.kind not in KINDS:
            raise TimeRuleError("kind", f"Unknown kind {str(self.kind)[:20]!r}. Use 'cron' or 'once'.")
        parse_timezone(self.timezone)
        if self.kind == "cron":
            if self.cron is None:
                raise TimeRuleError("cron", "A cron schedule needs a cron expression, e.g. '30 2 * * *'.")
            normalize_cron(self.cron)
        else:
            self._run_at_utc()

    def next_after(self, after: datetime) -> datetime | None:
        """First fire strictly after `after` (aware, any zone) as aware UTC; None when there is none."""
        after = _as_utc(after, "after")
        if self.kind == "once":
            run_at = self._run_at_utc()
            return run_at if run_at > after else None
        if self.kind != "cron":
            self.validate()
        if self.cron is None:
            raise TimeRuleError("cron", "A cron schedule needs a cron expression, e.g. '30 2 * * *'.")
        return _next_cron_fire(normalize_cron(self.cron), self.timezone, after)

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


def local_time(instant: datetime, timezone: str) -> datetime:
    """The instant on the zone's wall clock (with its offset), for "local" columns in previews."""
    return _as_utc(instant, "instant").astimezone(parse_timezone(timezone))


# --- describe_cron -------------------------------------------------------------------------------------

_MONTH_TITLES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DOW_TITLES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_STEP_RE = re.compile(r"\*/([0-9]+)")
_MAX_LISTED_TIMES = 6


def describe_cron(expr: str) -> str:
    """English text for an admin list column; falls back to the expression itself when phrasing gets hard."""
    spec = _parse_cron(_check_cron_text(expr))
    time_text = _describe_time(spec.minute, spec.hour)
    day_text = _describe_days(spec)
    if time_text is None or day_text is None:
        return spec.expression
    if not day_text and time_text.startswith("At ") and "past" not in time_text:
        day_text = "every day"
    return f"{time_text} {day_text}".strip()


def _describe_time(minute: _Field, hour: _Field) -> str | None:
    minutes, hours = sorted(minute.values), sorted(hour.values)
    minute_step = _STEP_RE.fullmatch(minute.text)
    hour_step = _STEP_RE.fullmatch(hour.text)
    if minute.full:
        every = "Every minute"
    elif minute_step:
        every = f"Every {minute_step.group(1)} minutes"
    else:
        every = None
    if every is not None:
        if hour.full:
            return every
        if hours == list(range(hours[0], hours[-1] + 1)):
            return f"{every} from {hours[0]:02d}:00 through {hours[-1]:02d}:59"
        return None
    if len(minutes) * len(hours) <= _MAX_LISTED_TIMES:
        return "At " + _join([f"{h:02d}:{m:02d}" for h in hours for m in minutes])
    if len(minutes) > _MAX_LISTED_TIMES:
        return None
    past = "minute " + _join([str(m) for m in minutes])
    if len(minutes) > 1:
        past = "minutes " + _join([str(m) for m in minutes])
    if hour.full:
        return f"At {past} past every hour"
    if hour_step:
        return f"At {past} past every {_ordinal(int(hour_step.group(1)))} hour"
    if hours == list(range(hours[0], hours[-1] + 1)):
        return f"At {past} past every hour from {hours[0]:02d}:00 through {hours[-1]:02d}:00"
    return None


def _describe_days(spec: _CronSpec) -> str | None:
    dom, dow, month = spec.dom, spec.dow, spec.month
    months = sorted(month.values)
    month_text = ""
    if not month.full:
        month_text = " in " + _join_runs(months, lambda m: _MONTH_TITLES[m - 1], " through ")
    if spec.day_or and (dom.full or dow.full):
        return month_text.strip()
    dom_text = "" if dom.full else _describe_dom(sorted(dom.values))
    dow_text = "" if dow.full else _join_runs(sorted(dow.values), lambda d: _DOW_TITLES[d], " through ")
    if dom_text and dow_text:
        if not spec.day_or:
            return None  # Vixie's "both must match" reading has no short English phrasing
        return f"on {dom_text} or on {dow_text}{month_text}"
    if dom_text:
        if len(dom.values) == 1 and len(months) == 1:
            return f"on {_MONTH_TITLES[months[0] - 1]} {min(dom.values)}"
        return f"on {dom_text}{month_text}"
    if dow_text:
        return f"on {dow_text}{month_text}"
    return month_text.strip()


def _describe_dom(days: list[int]) -> str:
    label = "day" if len(days) == 1 else "days"
    return f"{label} {_join_runs(days, str, '-')} of the month"


def _join_runs(values: list[int], label: Callable[[int], str], dash: str) -> str:
    """Join sorted values, folding runs of three or more into 'first<dash>last'."""
    parts: list[str] = []
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and values[end + 1] == values[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{label(values[start])}{dash}{label(values[end])}")
        else:
            parts.extend(label(value) for value in values[start : end + 1])
        start = end + 1
    return _join(parts)


def _join(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"
