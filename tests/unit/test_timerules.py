"""Time rules against explicit DST instants and a brute-force wall-clock reference with its own matcher."""

from __future__ import annotations

import functools
import itertools
import re
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.cron_syntax import TimeRuleError, normalize_cron
from core.timerules import TimeRule, local_time, parse_timezone
from schedules.cron_text import describe_cron
from tests.support import examples


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def fires(expr: str, zone: str, since: datetime, until: datetime) -> list[datetime]:
    return TimeRule(kind="cron", timezone=zone, cron=expr).fires_between(since, until)


# --- Reference: a tiny Vixie matcher and a minute-by-minute wall-clock walker --------------------------

REF_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
REF_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
REF_DOWS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def ref_field(text: str, low: int, high: int, names: list[str], base: int) -> set[int]:
    def value(token: str) -> int:
        return names.index(token) + base if token in names else int(token)

    out: set[int] = set()
    for item in text.split(","):
        item, _, step = item.partition("/")
        if item == "*":
            first, last = low, high
        elif "-" in item:
            first, last = (value(part) for part in item.split("-"))
        else:
            first = last = value(item)
        out.update(range(first, last + 1, int(step or 1)))
    return out


def ref_split(text: str, special: str) -> tuple[str, list[str]]:
    """A day field's plain items (as one field text, "" when none) and its calendar extensions."""
    items = text.split(",")
    specials = [item for item in items if re.fullmatch(special, item)]
    return ",".join(item for item in items if item not in specials), specials


def ref_weekday(text: str) -> int:
    return (REF_DOWS.index(text) if text in REF_DOWS else int(text)) % 7


def ref_month_days(day: date) -> list[date]:
    first = day.replace(day=1)
    return [first + timedelta(days=n) for n in range(31) if (first + timedelta(days=n)).month == day.month]


def ref_dom_special(item: str, day: date) -> bool:
    """L: no later day in the month. NW: of the month's Monday-to-Friday days, the one closest to day N."""
    days = ref_month_days(day)
    if item == "l":
        return day == days[-1]
    target = int(item[:-1])
    if target > len(days):
        return False
    weekdays = [d for d in days if d.isoweekday() <= 5]
    return day == min(weekdays, key=lambda d: abs(d.day - target))


def ref_dow_special(item: str, day: date) -> bool:
    """D#N: weekday D, and N-1 earlier ones in the month. DL: weekday D, and none a week later in the month."""
    if "#" in item:
        weekday, nth = item.split("#")
        return day.isoweekday() % 7 == ref_weekday(weekday) and (day.day - 1) // 7 + 1 == int(nth)
    return day.isoweekday() % 7 == ref_weekday(item[:-1]) and (day + timedelta(days=7)).month != day.month


class RefCron:
    def __init__(self, expr: str) -> None:
        expr = expr.strip().lower()
        fields = REF_MACROS.get(expr, expr).split()
        self.minutes = ref_field(fields[0], 0, 59, [], 0)
        self.hours = ref_field(fields[1], 0, 23, [], 0)
        dom_plain, self.dom_specials = ref_split(fields[2], r"l|[0-9]+w")
        dow_plain, self.dow_specials = ref_split(fields[4], r"[0-9a-z]+(#[0-9]+|l)")
        self.doms = ref_field(dom_plain, 1, 31, [], 0) if dom_plain else set()
        self.months = ref_field(fields[3], 1, 12, REF_MONTHS, 1)
        self.dows = {day % 7 for day in ref_field(dow_plain, 0, 7, REF_DOWS, 0)} if dow_plain else set()
        # Vixie: a day field that starts with "*" turns the OR rule into AND.
        self.day_and = fields[2].startswith("*") or fields[4].startswith("*")

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.doms or any(ref_dom_special(item, day) for item in self.dom_specials)
        dow_ok = day.isoweekday() % 7 in self.dows or any(ref_dow_special(item, day) for item in self.dow_specials)
        return (dom_ok and dow_ok) if self.day_and else (dom_ok or dow_ok)


def ref_first_instant(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """Earliest UTC instant whose wall clock reads `wall`; None if the zone skips it."""
    return min(ref_instants(wall, zone), default=None)


def ref_instants(wall: datetime, zone: ZoneInfo) -> list[datetime]:
    """Every UTC instant whose wall clock reads `wall`: none (skipped), one, or two (repeated), ascending."""
    instants = set()
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:
            instants.add(instant)
    return sorted(instants)


def ref_policy_instants(wall: datetime, zone: ZoneInfo, gap: str, repeat: str) -> list[datetime]:
    """The instants a wall time fires at under a DST policy, from its definition: a skipped time at the offset of the
    last minute before it that exists (shift) or never (skip); a repeated one at its first, last or both instants."""
    instants = ref_instants(wall, zone)
    if not instants:
        if gap == "skip":
            return []
        before = wall - timedelta(minutes=1)
        while not ref_instants(before, zone):
            before -= timedelta(minutes=1)
        offset = ref_instants(before, zone)[-1].astimezone(zone).utcoffset()
        return [(wall - offset).replace(tzinfo=UTC)]
    if len(instants) == 1 or repeat == "both":
        return instants
    return [instants[-1]] if repeat == "last" else [instants[0]]


def ref_fires_after(
    expr: str, zone_name: str, after: datetime, count: int, gap: str = "skip", repeat: str = "first"
) -> list[datetime]:
    """The first `count` fires strictly after `after`, found by walking wall-clock minutes."""
    zone, cron = ZoneInfo(zone_name), RefCron(expr)
    # Start two days early and sort at the end, so nothing here relies on wall order matching UTC order (a repeated
    # time's second instant or a shifted one comes after later wall times' instants; Apia's clock moved by a day).
    start = after.astimezone(zone).replace(tzinfo=None) - timedelta(hours=51)
    day, found, stop_day = start.date(), set(), date.max
    while day <= stop_day and day.year <= after.year + 60:
        if day.month not in cron.months:
            day = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
            continue
        if cron.day_matches(day):
            for hour in sorted(cron.hours):
                for minute in sorted(cron.minutes):
                    wall = datetime(day.year, day.month, day.day, hour, minute)
                    if wall >= start:
                        found.update(i for i in ref_policy_instants(wall, zone, gap, repeat) if i > after)
            if len(found) >= count and stop_day == date.max:
                stop_day = day + timedelta(days=2)
        day += timedelta(days=1)
    return sorted(found)[:count]


def test_reference_walker_agrees_with_hand_computed_new_york_instants() -> None:
    got = ref_fires_after("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), 3)
    assert got == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30), utc(2026, 11, 3, 6, 30)]


# --- Property tests: the fast path equals the reference ----------------------------------------------

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Santiago",
    "America/Havana",
    "Pacific/Apia",
    "Asia/Kolkata",
    "America/Sao_Paulo",
    "Asia/Tehran",
]
TRANSITION_CRONS = [
    "30 1 * * *",
    "*/15 * * * *",
    "0 2 * * *",
    "30 2 * * *",
    "0 0 * * *",
    "30 23 * * *",
    "30 2 * * 0",
    "0,30 0-3 * * *",
    "45 1 * * *",
    "0 3 * * *",
    "*/20 0-4 * * *",
    "0 12 13 * 5",
    "0 0 1 * mon",
    "15 * * * *",
    "0 */2 * * *",
    "@hourly",
    "@daily",
    "@weekly",
    "0 0 29 2 *",
    "5 4 * * sun",
    "0 22 * * 1-5",
    "0 0 */2 * 1",
    "0 9 1-7 * 7",
]


@functools.cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """UTC instants (to the minute) where the zone's offset changes, 1975-2037."""
    zone, found = ZoneInfo(zone_name), []
    moment = utc(1975, 1, 1)
    offset = moment.astimezone(zone).utcoffset()
    while moment.year < 2037:
        step = moment + timedelta(days=1)
        if step.astimezone(zone).utcoffset() != offset:
            low, high = moment, step
            while high - low > timedelta(minutes=1):
                middle = low + (high - low) / 2
                if middle.astimezone(zone).utcoffset() == offset:
                    low = middle
                else:
                    high = middle
            found.append(high.replace(second=0, microsecond=0))
            offset = step.astimezone(zone).utcoffset()
        moment = step
    return tuple(found)


@st.composite
def cron_field(draw: st.DrawFn, low: int, high: int, names: list[str] | None = None, base: int = 0) -> str:
    def value() -> str:
        number = draw(st.integers(low, high))
        if names and 0 <= number - base < len(names) and draw(st.booleans()):
            return names[number - base]
        return str(number)

    def element() -> str:
        shape = draw(st.sampled_from(["value", "range", "range_step"]))
        if shape == "value":
            return value()
        first = draw(st.integers(low, high))
        last = draw(st.integers(first, high))
        text = f"{first}-{last}"
        return text + (f"/{draw(st.integers(1, 5))}" if shape == "range_step" else "")

    shape = draw(st.sampled_from(["star", "star", "value", "step", "element", "list"]))
    if shape == "star":
        return "*"
    if shape == "step":
        return f"*/{draw(st.integers(1, max(1, (high - low) // 2)))}"
    if shape == "value":
        return value()
    if shape == "element":
        return element()
    return ",".join(element() if draw(st.booleans()) else value() for _ in range(draw(st.integers(2, 3))))


def accepted(expr: str) -> str:
    """The expression, when the API accepts it; otherwise hypothesis draws another."""
    try:
        normalize_cron(expr)
    except TimeRuleError:
        assume(False)
    return expr


@st.composite
def cron_expressions(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.sampled_from(TRANSITION_CRONS))
    # Minutes and hours stay sparse enough that the reference walker is quick.
    minute = draw(st.sampled_from(["0", "30", "*/15", "0,45", "5-10/5", "59", "*/30"]))
    hour = draw(cron_field(0, 23))
    dom = draw(cron_field(1, 31))
    month = draw(cron_field(1, 12, REF_MONTHS, 1))
    dow = draw(cron_field(0, 7, REF_DOWS, 0))
    return accepted(f"{minute} {hour} {dom} {month} {dow}")


@st.composite
def extension_expressions(draw: st.DrawFn) -> str:
    """Expressions with the calendar extensions, alone, in lists and beside plain values under either day rule; at
    hours where clocks change, in months where each extension fires at least every few years."""
    minute = draw(st.sampled_from(["0", "30", "*/30", "15,45"]))
    hour = draw(st.sampled_from(["0", "1", "2", "3", "1-3", "*/6", "23", "*"]))
    dom = draw(st.sampled_from(["*", "*", "l", "15w", "1w", "31w", "30w", "28w", "1,l", "l,15w", "13", "*/2", "1-7"]))
    month = draw(st.sampled_from(["*", "*", "3,10", "11-12", "1-6", "4,9"]))
    dow = draw(
        st.sampled_from(["*", "*", "5l", "fri#2", "1#5", "0#1,6l", "sun#5", "7l", "1-5", "mon#1", "wed#3,thu", "sat"])
    )
    return accepted(f"{minute} {hour} {dom} {month} {dow}")


@st.composite
def instants_near_transitions(draw: st.DrawFn, zone_name: str) -> datetime:
    edges = transitions(zone_name)
    if not edges or draw(st.integers(0, 4)) == 0:
        seconds = draw(st.integers(0, int((utc(2036, 1, 1) - utc(1976, 1, 1)).total_seconds())))
        return utc(1976, 1, 1) + timedelta(seconds=seconds)
    edge = draw(st.sampled_from(edges))
    # Whole minutes make `after` often land exactly on a fire, which tests "strictly after".
    return edge + timedelta(minutes=draw(st.integers(-3 * 24 * 60, 3 * 24 * 60)))


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, datetime]:
    zone = draw(st.sampled_from(ZONES))
    return draw(cron_expressions()), zone, draw(instants_near_transitions(zone))


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fires_match_the_brute_force_reference(case: tuple[str, str, datetime]) -> None:
    assert_matches_reference(*case)


def assert_matches_reference(expr: str, zone: str, after: datetime) -> None:
    """The rule's next six fires after `after`, one by one and chained, are the reference walker's."""
    rule = TimeRule(kind="cron", timezone=zone, cron=expr)
    expected = ref_fires_after(expr, zone, after, 6)
    assert list(itertools.islice(rule.iter_after(after), len(expected))) == expected
    assert rule.next_after(after) == (expected[0] if expected else None)


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extension_expressions(), st.sampled_from(ZONES), st.data())
def test_extension_fires_match_the_brute_force_reference(expr: str, zone: str, data: st.DataObject) -> None:
    assert_matches_reference(expr, zone, data.draw(instants_near_transitions(zone)))


def test_the_reference_reads_the_extensions_as_hand_counted() -> None:
    # February 2026 starts on a Sunday; 1 August 2026 is a Saturday; 31 May 2026 a Sunday.
    assert ref_fires_after("0 0 l * *", "UTC", utc(2026, 2, 1), 1) == [utc(2026, 2, 28)]
    assert ref_fires_after("0 0 15w * *", "UTC", utc(2026, 2, 1), 1) == [utc(2026, 2, 16)]
    assert ref_fires_after("0 0 1w 8 *", "UTC", utc(2026, 7, 1), 1) == [utc(2026, 8, 3)]
    assert ref_fires_after("0 0 31w 5 *", "UTC", utc(2026, 5, 1), 1) == [utc(2026, 5, 29)]
    assert ref_fires_after("0 0 * * fri#2", "UTC", utc(2026, 2, 1), 1) == [utc(2026, 2, 13)]
    assert ref_fires_after("0 0 * * 5l", "UTC", utc(2026, 2, 1), 1) == [utc(2026, 2, 27)]


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(1, 4 * 24 * 60))
def test_fires_between_is_half_open_and_matches_the_reference(
    case: tuple[str, str, datetime], window_minutes: int
) -> None:
    expr, zone, since = case
    until = since + timedelta(minutes=window_minutes)
    expected = [t for t in ref_fires_after(expr, zone, since - timedelta(minutes=1), 400) if t < until]
    assume(len(expected) < 400)
    assert fires(expr, zone, since, until) == [t for t in expected if t >= since]


@settings(max_examples=examples(300), deadline=None)
@given(cron_expressions())
def test_describe_never_raises_and_normalize_is_idempotent(expr: str) -> None:
    normalized = normalize_cron(expr)
    assert normalize_cron(normalized) == normalized
    assert describe_cron(expr)


# --- Explicit DST instants ---------------------------------------------------------------------------


def test_spring_forward_gap_is_skipped_in_new_york() -> None:
    got = fires("30 2 * * *", "America/New_York", utc(2026, 3, 7), utc(2026, 3, 10))
    assert got == [utc(2026, 3, 7, 7, 30), utc(2026, 3, 9, 6, 30)]


def test_fall_back_repeated_time_fires_once_at_its_first_instant_in_new_york() -> None:
    got = fires("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12), utc(2026, 11, 2, 6))
    assert got == [utc(2026, 11, 1, 5, 30)]


def test_after_inside_the_second_pass_of_the_repeated_hour_does_not_fire_it_again() -> None:
    rule = TimeRule(kind="cron", timezone="America/New_York", cron="30 1 * * *")
    # 06:15Z is 01:15 EST, the second pass; 01:30 already fired at 05:30Z.
    assert rule.next_after(utc(2026, 11, 1, 6, 15)) == utc(2026, 11, 2, 6, 30)
    assert rule.next_after(utc(2026, 11, 1, 5, 29)) == utc(2026, 11, 1, 5, 30)
    assert rule.next_after(utc(2026, 11, 1, 5, 30)) == utc(2026, 11, 2, 6, 30)


def test_every_quarter_hour_fires_once_per_wall_time_through_the_repeated_hour() -> None:
    got = fires("*/15 * * * *", "America/New_York", utc(2026, 11, 1, 5), utc(2026, 11, 1, 7, 1))
    first_pass = [utc(2026, 11, 1, 5, minute) for minute in (0, 15, 30, 45)]
    assert got == [*first_pass, utc(2026, 11, 1, 7, 0)]


def test_berlin_spring_forward_skips_half_past_two() -> None:
    got = fires("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28), utc(2026, 3, 31))
    assert got == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30)]


def test_berlin_fall_back_keeps_only_the_summer_time_pass() -> None:
    got = fires("*/30 * * * *", "Europe/Berlin", utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 2, 31))
    # 01:00Z and 01:30Z read 02:00 and 02:30 again (CET); those wall times already fired.
    assert got == [
        utc(2026, 10, 24, 23, 30),
        utc(2026, 10, 25, 0, 0),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 2, 0),
        utc(2026, 10, 25, 2, 30),
    ]


def test_lord_howe_half_hour_shifts_skip_and_dedupe_half_hours() -> None:
    spring = fires("15 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 2), utc(2026, 10, 5))
    # +10:30 until 2026-10-04 02:00 local, then +11: 02:15 does not exist that day.
    assert spring == [utc(2026, 10, 2, 15, 45), utc(2026, 10, 4, 15, 15)]
    autumn = fires("45 1 * * *", "Australia/Lord_Howe", utc(2026, 4, 3), utc(2026, 4, 6))
    # 01:30-02:00 repeats on 2026-04-05; the first pass is at +11.
    assert autumn == [utc(2026, 4, 3, 14, 45), utc(2026, 4, 4, 14, 45), utc(2026, 4, 5, 15, 15)]


def test_chatham_quarter_hour_offsets_skip_and_dedupe_three_oclock() -> None:
    spring = fires("0 3 * * *", "Pacific/Chatham", utc(2026, 9, 25), utc(2026, 9, 28))
    assert spring == [utc(2026, 9, 25, 14, 15), utc(2026, 9, 27, 13, 15)]
    autumn = fires("0 3 * * *", "Pacific/Chatham", utc(2026, 4, 3), utc(2026, 4, 6))
    assert autumn == [utc(2026, 4, 3, 13, 15), utc(2026, 4, 4, 13, 15), utc(2026, 4, 5, 14, 15)]


def test_santiago_midnight_is_skipped_when_dst_starts_at_midnight() -> None:
    got = fires("0 0 * * *", "America/Santiago", utc(2026, 9, 5), utc(2026, 9, 8))
    assert got == [utc(2026, 9, 5, 4, 0), utc(2026, 9, 7, 3, 0)]


def test_santiago_repeated_hour_before_midnight_fires_once() -> None:
    late = fires("30 23 * * *", "America/Santiago", utc(2026, 4, 4), utc(2026, 4, 6, 12))
    assert late == [utc(2026, 4, 4, 2, 30), utc(2026, 4, 5, 2, 30), utc(2026, 4, 6, 3, 30)]
    midnight = fires("0 0 * * *", "America/Santiago", utc(2026, 4, 4), utc(2026, 4, 6, 12))
    assert midnight == [utc(2026, 4, 4, 3, 0), utc(2026, 4, 5, 4, 0), utc(2026, 4, 6, 4, 0)]


def test_havana_midnight_transitions_skip_and_dedupe() -> None:
    spring = fires("0 0 * * *", "America/Havana", utc(2026, 3, 7), utc(2026, 3, 10))
    assert spring == [utc(2026, 3, 7, 5, 0), utc(2026, 3, 9, 4, 0)]
    autumn = fires("30 0 * * *", "America/Havana", utc(2026, 10, 31), utc(2026, 11, 3))
    assert autumn == [utc(2026, 10, 31, 4, 30), utc(2026, 11, 1, 4, 30), utc(2026, 11, 2, 5, 30)]


def test_apia_skipped_day_2011_12_30_never_fires() -> None:
    noon = fires("0 12 * * *", "Pacific/Apia", utc(2011, 12, 28), utc(2012, 1, 1))
    assert [local_time(t, "Pacific/Apia").date().isoformat() for t in noon] == [
        "2011-12-28",
        "2011-12-29",
        "2011-12-31",
        "2012-01-01",
    ]
    # 12:00 on the 29th is UTC-10, 12:00 on the 31st is UTC+14: 24 hours apart across a skipped day.
    assert noon == [
        utc(2011, 12, 28, 22),
        utc(2011, 12, 29, 22),
        utc(2011, 12, 30, 22),
        utc(2011, 12, 31, 22),
    ]
    half_hours = fires("*/30 * * * *", "Pacific/Apia", utc(2011, 12, 29, 10), utc(2011, 12, 31, 10))
    assert len(half_hours) == 96
    assert {local_time(t, "Pacific/Apia").day for t in half_hours} == {29, 31}
    assert all(b - a == timedelta(minutes=30) for a, b in itertools.pairwise(half_hours))


def test_kolkata_half_hour_offset_is_applied_exactly() -> None:
    assert fires("0 9 * * *", "Asia/Kolkata", utc(2026, 1, 1), utc(2026, 1, 2)) == [utc(2026, 1, 1, 3, 30)]
    assert fires("30 0 * * *", "Asia/Kolkata", utc(2026, 1, 1), utc(2026, 1, 2)) == [utc(2026, 1, 1, 19, 0)]


def test_daily_nine_am_stays_nine_am_local_across_dst_instead_of_adding_24_hours() -> None:
    got = fires("0 9 * * *", "America/New_York", utc(2026, 3, 6), utc(2026, 3, 11))
    assert got == [
        utc(2026, 3, 6, 14),
        utc(2026, 3, 7, 14),
        utc(2026, 3, 8, 13),
        utc(2026, 3, 9, 13),
        utc(2026, 3, 10, 13),
    ]
    assert {local_time(t, "America/New_York").hour for t in got} == {9}


def test_day_of_month_or_day_of_week_fires_on_either_day() -> None:
    got = fires("0 12 13 * 5", "UTC", utc(2026, 2, 1), utc(2026, 3, 1))
    # Fridays of February 2026 are the 6th, 13th, 20th and 27th; the 13th counts once.
    assert got == [utc(2026, 2, day, 12) for day in (6, 13, 20, 27)]


def test_star_prefixed_day_field_makes_vixie_require_both_days() -> None:
    got = fires("0 0 */2 * 1", "UTC", utc(2026, 6, 1), utc(2026, 7, 1))
    assert got == [utc(2026, 6, day) for day in (1, 15, 29)]


def test_names_are_case_insensitive_and_seven_is_sunday() -> None:
    sundays = fires("0 8 * * 7", "UTC", utc(2026, 5, 1), utc(2026, 5, 15))
    assert sundays == fires("0 8 * * SUN", "UTC", utc(2026, 5, 1), utc(2026, 5, 15))
    assert sundays == [utc(2026, 5, 3, 8), utc(2026, 5, 10, 8)]
    assert fires("0 0 1 JAN-mar/2 *", "UTC", utc(2026, 1, 1), utc(2027, 1, 1)) == [
        utc(2026, 1, 1),
        utc(2026, 3, 1),
    ]


def test_leap_day_schedule_spans_the_skipped_2100_leap_year() -> None:
    rule = TimeRule(kind="cron", cron="0 0 29 2 *")
    assert rule.next_after(utc(2097, 1, 1)) == utc(2104, 2, 29)


def test_next_after_accepts_any_aware_zone_and_returns_utc() -> None:
    rule = TimeRule(kind="cron", timezone="Europe/London", cron="@daily")
    after = datetime(2026, 7, 1, 12, tzinfo=ZoneInfo("Asia/Tokyo"))
    fire = rule.next_after(after)
    assert fire == utc(2026, 7, 1, 23) and fire.tzinfo is UTC
    assert rule.next_after(after) is fire  # served from the cache


def test_far_future_after_ends_the_iteration_instead_of_overflowing() -> None:
    rule = TimeRule(kind="cron", timezone="Pacific/Kiritimati", cron="0 0 * * *")
    assert rule.next_after(utc(9999, 12, 31, 23)) is None
    assert list(rule.iter_after(utc(9999, 12, 29))) == [utc(9999, 12, 29, 10), utc(9999, 12, 30, 10)]


def test_naive_after_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        TimeRule(kind="cron", cron="@hourly").next_after(datetime(2026, 1, 1))


def test_local_time_shows_the_zone_offset() -> None:
    local = local_time(utc(2026, 7, 1, 12), "Asia/Kolkata")
    assert local.isoformat() == "2026-07-01T17:30:00+05:30"


# --- once --------------------------------------------------------------------------------------------


def test_once_fires_exactly_at_run_at_and_only_before_it() -> None:
    run_at = datetime(2026, 12, 1, 8, 30, 15, tzinfo=ZoneInfo("Europe/Madrid"))
    rule = TimeRule(kind="once", timezone="Europe/Madrid", run_at=run_at)
    assert rule.next_after(utc(2026, 1, 1)) == utc(2026, 12, 1, 7, 30, 15)
    assert rule.next_after(run_at) is None
    assert rule.next_after(utc(2027, 1, 1)) is None
    assert list(rule.iter_after(utc(2026, 1, 1))) == [utc(2026, 12, 1, 7, 30, 15)]
    assert rule.fires_between(run_at, run_at + timedelta(seconds=1)) == [run_at]
    assert rule.fires_between(run_at - timedelta(hours=1), run_at) == []


# --- validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("61 * * * *", "minute field (allowed 0-59)"),
        ("0 24 * * *", "hour field (allowed 0-23)"),
        ("0 0 0 * *", "day-of-month field (allowed 1-31)"),
        ("0 0 1 13 *", "month field (allowed 1-12)"),
        ("0 0 * * 8", "day-of-week field (allowed 0-7)"),
        ("0 0 * * * *", "got 6. Seconds and year fields are not supported"),
        ("0 0 0 * * * 2026", "got 7"),
        ("0 0 *", "got 3"),
        ("0 0 L-5 * *", "'L' belongs in the day-of-month field"),
        ("0 0 * * L", "'L' belongs in the day-of-month field"),
        ("L 0 * * *", "In the minute field 'l': 'L' belongs"),
        ("0 0 * * 5W", "'W' belongs after a day in the day-of-month field"),
        ("0 0 1-15W * *", "'W' belongs after a day"),
        ("0 0 1#2 * *", "'#' (N-th weekday of the month) belongs in the day-of-week field"),
        ("0 0 * * 1#6", "the N of '#N' must be from 1 to 5"),
        ("0 0 * * 1#2/2", "'#' (N-th weekday of the month) belongs in the day-of-week field alone"),
        ("0 0 LW * *", "'LW' is not supported"),
        ("0 0 32W * *", "needs a day from 1 to 31"),
        ("0 0 30W 2 *", "never fires"),
        ("0 0 ? * *", "'?' is not supported"),
        ("H * * * *", "'H' (hashed"),
        ("H(0-29)/10 * * * *", "'H' (hashed"),
        ("R * * * *", "'R' (random"),
        ("@reboot", "'@reboot' is not supported"),
        ("@fortnightly", "Unknown macro"),
        ("", "empty"),
        ("   ", "empty"),
        ("0 " * 101, "too long"),
        ("*/0 * * * *", "step must be between 1 and 60"),
        ("5/15 * * * *", "a step needs '*' or a range"),
        ("30-10 * * * *", "runs backwards"),
        ("0 0 * * thur", "Unknown value 'thur'"),
        ("0 0 jan * *", "names are only allowed in the month and day-of-week fields"),
        ("1,,2 * * * *", "empty list item"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_invalid_cron_is_rejected_with_a_precise_message(expr: str, fragment: str) -> None:
    with pytest.raises(TimeRuleError) as caught:
        normalize_cron(expr)
    assert caught.value.field == "cron"
    assert fragment in caught.value.message
    with pytest.raises(TimeRuleError) as caught:
        TimeRule(kind="cron", cron=expr).validate()
    assert caught.value.field == "cron"


def test_non_string_cron_is_rejected() -> None:
    with pytest.raises(TimeRuleError, match="must be a string") as caught:
        normalize_cron(30)  # type: ignore[arg-type]
    assert caught.value.field == "cron"


def test_normalize_collapses_whitespace_and_lowercases_names() -> None:
    assert normalize_cron("  30\t2  *  *   MON-FRI ") == "30 2 * * mon-fri"
    assert normalize_cron("@Daily") == "@daily"
    assert normalize_cron("0 0 30 2 1") == "0 0 30 2 1"  # OR rule: Mondays of February still fire


@pytest.mark.parametrize("name", ["", "local", "localtime", "Mars/Base", "/etc/localtime", "../UTC", "UTC "])
def test_unknown_time_zone_is_rejected_with_an_iana_hint(name: str) -> None:
    with pytest.raises(TimeRuleError) as caught:
        parse_timezone(name)
    assert caught.value.field == "timezone"
    assert "IANA" in caught.value.message or "Did you mean" in caught.value.message


def test_wrongly_cased_time_zone_gets_a_suggestion() -> None:
    with pytest.raises(TimeRuleError, match="Did you mean 'Europe/Madrid'"):
        parse_timezone("europe/madrid")


def test_valid_zones_including_legacy_posix_style_names_load() -> None:
    assert str(parse_timezone("Europe/Madrid")) == "Europe/Madrid"
    assert str(parse_timezone("EST5EDT")) == "EST5EDT"


@pytest.mark.parametrize(
    ("rule", "field", "fragment"),
    [
        (TimeRule(kind="cron"), "cron", "needs a cron expression"),
        (TimeRule(kind="once"), "run_at", "needs run_at"),
        (TimeRule(kind="once", run_at=datetime(2026, 1, 1)), "run_at", "UTC offset"),
        (TimeRule(kind="once", run_at="2026-01-01Z"), "run_at", "date and time"),  # type: ignore[arg-type]
        (TimeRule(kind="cron", cron="0 0 * * *", timezone="Mars/Base"), "timezone", "Unknown time zone"),
        (TimeRule(kind="weekly"), "kind", "Use 'cron', 'once' or 'interval'"),
    ],
)
def test_validate_names_the_field_at_fault(rule: TimeRule, field: str, fragment: str) -> None:
    with pytest.raises(TimeRuleError) as caught:
        rule.validate()
    assert caught.value.field == field
    assert fragment in caught.value.message


def test_valid_rules_pass_validation() -> None:
    TimeRule(kind="cron", cron="@weekly", timezone="Pacific/Chatham").validate()
    TimeRule(kind="once", run_at=utc(2026, 1, 1)).validate()


# --- describe_cron -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("30 2 * * *", "At 02:30 every day"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("0 * * * *", "At minute 0 past every hour"),
        ("0 9 * * 1-5", "At 09:00 on Monday through Friday"),
        ("0 9 * * MON-FRI", "At 09:00 on Monday through Friday"),
        ("@daily", "At 00:00 every day"),
        ("@weekly", "At 00:00 on Sunday"),
        ("@monthly", "At 00:00 on day 1 of the month"),
        ("@yearly", "At 00:00 on January 1"),
        ("0 */2 * * *", "At minute 0 past every 2nd hour"),
        ("*/10 9-17 * * 1-5", "Every 10 minutes from 09:00 through 17:59 on Monday through Friday"),
        ("0 12 13 * 5", "At 12:00 on day 13 of the month or on Friday"),
        ("0 9,17 * * *", "At 09:00 and 17:00 every day"),
        ("* * * * *", "Every minute"),
    ],
)
def test_describe_cron_reads_as_english(expr: str, text: str) -> None:
    assert describe_cron(expr) == text


def test_describe_cron_falls_back_to_the_expression_when_phrasing_is_hard() -> None:
    assert describe_cron("1-40 1,3,5,7 * * *") == "1-40 1,3,5,7 * * *"
