"""Cron syntax: strict parsing and normalisation of 5-field Vixie expressions and macros, without croniter.

Beyond Vixie, the day fields take the calendar extensions Quartz and EventBridge users know (docs/API.md, "The time
model"): day-of-month `L` (the month's last day) and `NW` (the weekday nearest day N, within the month), day-of-week
`D#N` (the N-th weekday D of the month) and `DL` (the month's last weekday D). Each may stand in a comma list beside
plain values; none takes a range or a step.
"""

from __future__ import annotations

import calendar
import functools
import re
from dataclasses import dataclass
from datetime import date, datetime

__all__ = [
    "CronField",
    "CronSpec",
    "TimeRuleError",
    "normalize_cron",
    "parse_cron",
]

# Longer input is never a hand-written crontab line; refusing it early bounds parsing work per request.
MAX_CRON_LENGTH = 200
# One entry per distinct expression: tenants share a handful of rhythms, so this stays small.
PARSE_CACHE_SIZE = 4096

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
_FIELDS_HINT = "minute hour day-of-month month day-of-week"
_ELEMENT_RE = re.compile(r"(?:(\*)|([0-9a-z]+)(?:-([0-9a-z]+))?)(?:/([0-9]+))?", re.ASCII)


# Defined here, at the bottom of the time-rule modules, so the syntax checks can raise it without importing
# croniter; core.timerules raises the same class for zones, kinds and run_at, and re-exports it.
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
class CronField:
    """One parsed field: its normalised text and the values it selects (day-of-week 7 folded into 0)."""

    text: str
    values: frozenset[int]
    full: bool
    # Vixie decides the day-of-month/day-of-week OR rule on whether the field *starts with* "*" ("*/2" too).
    star: bool
    # The day fields' calendar extensions, normalised: day-of-month ("l", "15w"), day-of-week ("5#2", "5l"); their
    # days depend on the month, so they are not among `values`.
    specials: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CronSpec:
    """A validated expression: the normalised text (macros kept as written) and its five fields."""

    expression: str
    minute: CronField
    hour: CronField
    dom: CronField
    month: CronField
    dow: CronField

    @property
    def day_or(self) -> bool:
        return not (self.dom.star or self.dow.star)

    @property
    def has_specials(self) -> bool:
        """Whether a day field uses L, W or # (croniter is never asked to walk those)."""
        return bool(self.dom.specials or self.dow.specials)

    def days_of(self, year: int, month: int) -> tuple[int, ...]:
        """The days of that month the expression fires on (ascending), the Vixie day rule included; empty when the
        month is not selected."""
        return _days_of(self, year, month)

    def day_matches(self, day: date) -> bool:
        return day.day in _days_of(self, day.year, day.month)

    def matches(self, wall: datetime) -> bool:
        """Whether the expression selects this wall-clock minute (its days by the Vixie rule and the extensions)."""
        if wall.minute not in self.minute.values or wall.hour not in self.hour.values:
            return False
        return self.day_matches(wall.date())


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _days_of(spec: CronSpec, year: int, month: int) -> tuple[int, ...]:
    if month not in spec.month.values:
        return ()
    first_weekday, last = calendar.monthrange(year, month)  # Monday is 0 there; Sunday is 0 in cron
    first_dow = (first_weekday + 1) % 7
    every_day = set(range(1, last + 1))
    dom = every_day if spec.dom.full else _month_days(spec.dom, year, month, last)
    dow = every_day if spec.dow.full else _weekday_days(spec.dow, first_dow, last)
    # Vixie: either day field matching is enough when both are restricted; a field starting with "*" makes it both.
    return tuple(sorted(dom | dow if spec.day_or else dom & dow))


def _month_days(field: CronField, year: int, month: int, last: int) -> set[int]:
    days = {day for day in field.values if day <= last}
    for special in field.specials:
        if special == "l":
            days.add(last)
        else:  # "Nw": the weekday nearest day N, never leaving the month; no fire in a month without day N
            target = int(special[:-1])
            if target <= last:
                days.add(_nearest_weekday(year, month, target, last))
    return days


def _nearest_weekday(year: int, month: int, day: int, last: int) -> int:
    weekday = date(year, month, day).weekday()  # Monday 0 ... Saturday 5, Sunday 6
    if weekday == 5:
        return day - 1 if day > 1 else day + 2
    if weekday == 6:
        return day + 1 if day < last else day - 2
    return day


def _weekday_days(field: CronField, first_dow: int, last: int) -> set[int]:
    days = {day for day in range(1, last + 1) if (first_dow + day - 1) % 7 in field.values}
    for special in field.specials:
        if special.endswith("l"):  # "Dl": the month's last weekday D
            weekday = int(special[:-1])
            last_dow = (first_dow + last - 1) % 7
            days.add(last - (last_dow - weekday) % 7)
        else:  # "D#N": the N-th weekday D, when the month has one
            weekday, nth = (int(part) for part in special.split("#"))
            day = 1 + (weekday - first_dow) % 7 + 7 * (nth - 1)
            if day <= last:
                days.add(day)
    return days


def normalize_cron(expr: str) -> str:
    """Validate a 5-field Vixie expression or macro; return it lowercased with whitespace collapsed."""
    return parse_cron(expr).expression


def parse_cron(expr: object) -> CronSpec:
    """Validate an expression or macro and return its fields; raises TimeRuleError(field="cron")."""
    return _parse_checked(_check_cron_text(expr))


def _check_cron_text(expr: object) -> str:
    # Runs before the cache: an unhashable non-string would raise TypeError there instead of TimeRuleError.
    if not isinstance(expr, str):
        raise TimeRuleError("cron", "The cron expression must be a string such as '30 2 * * *'.")
    if len(expr) > MAX_CRON_LENGTH:
        raise TimeRuleError("cron", f"The cron expression is too long (over {MAX_CRON_LENGTH} characters).")
    if not expr.strip():
        raise TimeRuleError("cron", f"The cron expression is empty. Use 5 fields: {_FIELDS_HINT}.")
    return expr


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parse_checked(expr: str) -> CronSpec:
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
    if dom.specials or dow.specials:
        normalized = " ".join([*tokens[:2], _capital_l_and_w(tokens[2]), tokens[3], _capital_l_and_w(tokens[4])])
    spec = CronSpec(normalized, minute, hour, dom, month, dow)
    _check_satisfiable(spec)
    return spec


def _capital_l_and_w(token: str) -> str:
    """A day field with the extensions' L and W in capitals, as written in docs/API.md: lowercased, "5l" reads as
    fifty-one. Names stay lowercase ("fri#2")."""
    items = token.split(",")
    return ",".join(
        item[:-1] + item[-1].upper()
        if _DOM_SPECIAL_RE.fullmatch(item) or (_DOW_SPECIAL_RE.fullmatch(item) and item.endswith("l"))
        else item
        for item in items
    )


_DOM_SPECIAL_RE = re.compile(r"l|([0-9]+)w", re.ASCII)
_DOW_SPECIAL_RE = re.compile(r"([0-9a-z]+?)(?:#([0-9]+)|l)", re.ASCII)


def _parse_field(token: str, spec: _FieldSpec) -> CronField:
    values: set[int] = set()
    specials: set[str] = set()
    for element in token.split(","):
        special = _parse_special(element, token, spec)
        if special is not None:
            specials.add(special)
        else:
            values.update(_parse_element(element, token, spec))
    if spec.name == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    span = 7 if spec.name == "day-of-week" else spec.high - spec.low + 1
    full = len(values) == span and not specials
    return CronField(token, frozenset(values), full, token.startswith("*"), frozenset(specials))


def _parse_special(element: str, token: str, spec: _FieldSpec) -> str | None:
    """The normalised calendar extension `element` names in a day field, or None for a plain element."""
    where = f"In the {spec.name} field {token[:40]!r}"
    if spec.name == "day-of-month":
        match = _DOM_SPECIAL_RE.fullmatch(element)
        if match is None:
            return None
        if element == "l":
            return "l"
        day = int(match.group(1))
        if not 1 <= day <= 31:
            raise TimeRuleError("cron", f"{where}: '{element.upper()}' needs a day from 1 to 31 before the W.")
        return f"{day}w"
    if spec.name == "day-of-week":
        match = _DOW_SPECIAL_RE.fullmatch(element)
        if match is None or not (match.group(1).isdigit() or match.group(1) in spec.names):
            return None
        weekday = _parse_value(match.group(1), spec) % 7
        if match.group(2) is None:
            return f"{weekday}l"
        nth = int(match.group(2))
        if not 1 <= nth <= 5:
            raise TimeRuleError("cron", f"{where}: the N of '#N' must be from 1 to 5 (a month has at most five).")
        return f"{weekday}#{nth}"
    return None


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
        return "'#' (N-th weekday of the month) belongs in the day-of-week field alone, e.g. 'fri#2' or '5#2'."
    for part in re.split(r"[-/]", element):
        if part == "lw":
            return "'LW' is not supported; use 'L' (last day) or 'NW' (weekday nearest day N)."
        if part == "l" or re.fullmatch(r"[0-9]+l", part) or (part.endswith("l") and part[:-1] in DOW_NAMES):
            return (
                "'L' belongs in the day-of-month field (last day of the month) or after a weekday in the "
                "day-of-week field (e.g. '5L', the last Friday), alone: not in a range or a step."
            )
        if re.fullmatch(r"[0-9]+w|w[0-9]*", part):
            return "'W' belongs after a day in the day-of-month field alone (e.g. '15W'): not in a range or a step."
        if part == "h" or part.startswith("h("):
            return "'H' (hashed values) is not supported."
        if part == "r" or part.startswith("r("):
            return "'R' (random values) is not supported."
    return None


def _check_satisfiable(spec: CronSpec) -> None:
    # Under the OR rule any restricted weekday occurs every month, and with AND each calendar date falls on
    # every weekday over the years, so only a day-of-month that no selected month contains is hopeless.
    # The extensions: the last day occurs in every month, and a weekday's N-th or last occurrence in every month
    # over the years (a fifth Monday in February too, in some leap years); a weekday nearest day N needs day N.
    if spec.day_or or spec.dom.full or "l" in spec.dom.specials:
        return
    days = spec.dom.values | {int(special[:-1]) for special in spec.dom.specials}
    if any(day <= _DAYS_IN_MONTH[month - 1] for month in spec.month.values for day in days):
        return
    message = f"day-of-month {spec.dom.text!r} never occurs in month {spec.month.text!r}"
    raise TimeRuleError("cron", f"The expression never fires: {message}.")
