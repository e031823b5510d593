"""Cron in words: English descriptions of cron expressions for the operator console's schedule list."""

from __future__ import annotations

import re
from collections.abc import Callable

from core.cron_syntax import CronField, CronSpec, parse_cron

__all__ = ["describe_cron"]

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
_NTH = ("first", "second", "third", "fourth", "fifth")
_DOW_TITLES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
# Read from the field's text: "*/15" and "0,15,30,45" select the same values but read differently.
_STEP_RE = re.compile(r"\*/([0-9]+)")
# Beyond this many "HH:MM" times a list column reads worse than the expression itself.
_MAX_LISTED_TIMES = 6


def describe_cron(expr: str) -> str:
    """English text for an admin list column; falls back to the expression itself when phrasing gets hard."""
    spec = parse_cron(expr)
    time_text = _describe_time(spec.minute, spec.hour)
    day_text = _describe_days(spec)
    if time_text is None or day_text is None:
        return spec.expression
    if not day_text and time_text.startswith("At ") and "past" not in time_text:
        day_text = "every day"
    return f"{time_text} {day_text}".strip()


def _describe_time(minute: CronField, hour: CronField) -> str | None:
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


def _describe_days(spec: CronSpec) -> str | None:
    dom, dow, month = spec.dom, spec.dow, spec.month
    months = sorted(month.values)
    month_text = ""
    if not month.full:
        month_text = " in " + _join_runs(months, lambda m: _MONTH_TITLES[m - 1], " through ")
    if spec.day_or and (dom.full or dow.full):
        return month_text.strip()
    dom_text = "" if dom.full else _describe_dom(sorted(dom.values), dom.specials)
    dow_text = "" if dow.full else _describe_dow(sorted(dow.values), dow.specials)
    if dom_text and dow_text:
        if not spec.day_or:
            return None  # Vixie's "both must match" reading has no short English phrasing
        return f"on {dom_text} or on {dow_text}{month_text}"
    if dom_text:
        if len(dom.values) == 1 and not dom.specials and len(months) == 1:
            return f"on {_MONTH_TITLES[months[0] - 1]} {min(dom.values)}"
        return f"on {dom_text}{month_text}"
    if dow_text:
        return f"on {dow_text}{month_text}"
    return month_text.strip()


def _describe_dom(days: list[int], specials: frozenset[str]) -> str:
    parts = []
    if days:
        label = "day" if len(days) == 1 else "days"
        parts.append(f"{label} {_join_runs(days, str, '-')} of the month")
    if "l" in specials:
        parts.append("the last day of the month")
    nearest = sorted(int(special[:-1]) for special in specials if special.endswith("w"))
    parts.extend(f"the weekday nearest day {day} of the month" for day in nearest)
    return _join(parts)


def _describe_dow(weekdays: list[int], specials: frozenset[str]) -> str:
    parts = [_join_runs(weekdays, lambda d: _DOW_TITLES[d], " through ")] if weekdays else []
    for special in sorted(specials):
        if special.endswith("l"):
            parts.append(f"the last {_DOW_TITLES[int(special[:-1])]} of the month")
        else:
            weekday, nth = (int(part) for part in special.split("#"))
            parts.append(f"the {_NTH[nth - 1]} {_DOW_TITLES[weekday]} of the month")
    return _join(parts)


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
