"""Interval time rules (elapsed time from an anchor) against a naive enumeration, in zones with odd clock changes."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.cron_syntax import TimeRuleError
from core.dst import interval_dst_notes, upcoming_interval_dst_notes
from core.timerules import EVERY_SECONDS_RANGE, TimeRule, local_time
from tests.support import examples


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def interval(every: int, anchor: datetime, zone: str = "UTC") -> TimeRule:
    return TimeRule(kind="interval", timezone=zone, every_seconds=every, anchor_at=anchor)


# --- Reference: anchor + k x every, enumerated one k at a time -----------------------------------------


def ref_fires_after(anchor: datetime, every: int, after: datetime, count: int) -> list[datetime]:
    """The first `count` fires strictly after `after`, by adding the period to the anchor one step at a time."""
    fires, fire = [], anchor
    while len(fires) < count:
        if fire > after:
            fires.append(fire)
        fire += timedelta(seconds=every)
    return fires


# Twelve and more zones: half-hour and 45-minute offsets and changes, a southern hemisphere, a date-line jump, and
# zones whose rules changed in the last few years (Mexico City ended DST in 2022, Tehran in 2022, Almaty moved from
# +06 to +05 in March 2024, Nuuk changed its rules in 2023).
ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Santiago",
    "Pacific/Apia",
    "Asia/Kolkata",
    "America/Mexico_City",
    "Asia/Tehran",
    "Asia/Almaty",
    "America/Nuuk",
]
PERIODS = [1, 7, 59, 60, 90, 900, 1800, 3599, 3600, 3601, 5400, 86399, 86400, 86401, 604800, EVERY_SECONDS_RANGE[1]]


@functools.cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """UTC instants (to the second) where the zone's offset changes, 2010-2030."""
    zone, found = ZoneInfo(zone_name), []
    moment = utc(2010, 1, 1)
    offset = moment.astimezone(zone).utcoffset()
    while moment.year < 2030:
        step = moment + timedelta(days=1)
        if step.astimezone(zone).utcoffset() != offset:
            low, high = moment, step
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                if middle.astimezone(zone).utcoffset() == offset:
                    low = middle
                else:
                    high = middle
            found.append(high.replace(microsecond=0))
            offset = step.astimezone(zone).utcoffset()
        moment = step
    return tuple(found)


def test_the_zones_include_recent_rule_changes_and_every_zone_but_utc_changes_its_clock() -> None:
    assert len(ZONES) >= 12
    assert utc(2024, 2, 29, 18) in transitions("Asia/Almaty"), "Almaty's move to +05 (00:00 became 23:00)"
    assert not any(change.year > 2022 for change in transitions("America/Mexico_City")), "no DST since 2022"
    assert sum(bool(transitions(zone)) for zone in ZONES) >= 10, "most change their clocks (not UTC, Kolkata)"


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, int, datetime, datetime]:
    """(zone, period, anchor, after): `after` near one of the zone's clock changes, the anchor at most a few
    thousand periods before it or a few after (sub-second too), so that the enumeration stays short."""
    zone = draw(st.sampled_from(ZONES))
    every = draw(st.one_of(st.sampled_from(PERIODS), st.integers(*EVERY_SECONDS_RANGE)))
    edges = transitions(zone)
    if edges and draw(st.integers(0, 3)):
        after = draw(st.sampled_from(edges)) + timedelta(seconds=draw(st.integers(-2 * 86400, 2 * 86400)))
    else:
        after = utc(2010, 1, 1) + timedelta(seconds=draw(st.integers(0, 20 * 365 * 86400)))
    # At most 3,000 periods back, and no further than a century.
    steps = max(1, min(3000, 100 * 365 * 86400 // every))
    if draw(st.booleans()):
        # Often exactly on a fire, which tests "strictly after".
        anchor = after - timedelta(seconds=every * draw(st.integers(-3, steps)))
    else:
        anchor = after - timedelta(microseconds=draw(st.integers(-3 * every * 10**6, steps * every * 10**6)))
    return zone, every, anchor, after


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fires_match_the_naive_enumeration_in_every_zone(case: tuple[str, int, datetime, datetime]) -> None:
    zone, every, anchor, after = case
    rule = interval(every, anchor, zone)
    expected = ref_fires_after(anchor, every, after, 6)
    got = []
    for fire in rule.iter_after(after):
        got.append(fire)
        if len(got) == len(expected):
            break
    assert got == expected
    assert rule.next_after(after) == expected[0]
    # The zone labels a fire; it never moves one: the same rule in UTC fires at the same instants.
    assert interval(every, anchor).next_after(after) == expected[0]
    assert [local_time(fire, zone) for fire in got] == [fire.astimezone(ZoneInfo(zone)) for fire in expected]


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(1, 400))
def test_fires_between_is_half_open_and_matches_the_enumeration(
    case: tuple[str, int, datetime, datetime], periods: int
) -> None:
    zone, every, anchor, since = case
    until = since + timedelta(seconds=every * periods // 3 + 1)
    expected = [t for t in ref_fires_after(anchor, every, since - timedelta(microseconds=1), periods + 2) if t < until]
    assert interval(every, anchor, zone).fires_between(since, until) == expected


# --- Explicit instants ---------------------------------------------------------------------------------


def test_dst_never_moves_an_interval_through_new_york_spring_forward_and_fall_back() -> None:
    rule = interval(3600, utc(2026, 3, 8, 4), "America/New_York")  # 23:00 EST on the 7th
    spring = rule.fires_between(utc(2026, 3, 8, 4), utc(2026, 3, 8, 9))
    assert [fire - spring[0] for fire in spring] == [timedelta(hours=n) for n in range(5)]
    assert [f"{local_time(fire, 'America/New_York'):%H:%M %Z}" for fire in spring] == [
        "23:00 EST",
        "00:00 EST",
        "01:00 EST",
        "03:00 EDT",  # 02:00 does not exist that night; the hour still passes
        "04:00 EDT",
    ]
    fall = rule.fires_between(utc(2026, 11, 1, 4), utc(2026, 11, 1, 8))
    assert [f"{local_time(fire, 'America/New_York'):%H:%M %Z}" for fire in fall] == [
        "00:00 EDT",
        "01:00 EDT",
        "01:00 EST",  # 01:00 happens twice, and so does an hourly fire at it
        "02:00 EST",
    ]


def test_a_daily_interval_reads_an_hour_later_on_the_wall_clock_after_spring_forward() -> None:
    rule = interval(86400, utc(2026, 3, 6, 14), "America/New_York")  # 09:00 EST
    fires = rule.fires_between(utc(2026, 3, 6), utc(2026, 3, 10))
    assert [f"{local_time(fire, 'America/New_York'):%d %H:%M}" for fire in fires] == [
        "06 09:00",
        "07 09:00",
        "08 10:00",
        "09 10:00",
    ]


def test_lord_howe_half_hour_change_shifts_labels_by_thirty_minutes_only() -> None:
    rule = interval(1800, utc(2026, 10, 3, 14), "Australia/Lord_Howe")  # 00:30 +1030; at 02:00 clocks go to 02:30
    fires = rule.fires_between(utc(2026, 10, 3, 14), utc(2026, 10, 3, 17))
    assert [f"{local_time(fire, 'Australia/Lord_Howe'):%H:%M}" for fire in fires] == [
        "00:30",
        "01:00",
        "01:30",
        "02:30",  # 02:00 +1030 is 02:30 +11: labels move half an hour, fires stay 30 minutes apart
        "03:00",
        "03:30",
    ]


def test_the_anchor_is_the_first_fire_when_it_lies_ahead() -> None:
    anchor = utc(2026, 12, 1, 9, 0, 0)
    rule = interval(300, anchor)
    assert rule.next_after(utc(2026, 1, 1)) == anchor
    assert rule.next_after(anchor - timedelta(microseconds=1)) == anchor
    assert rule.next_after(anchor) == anchor + timedelta(minutes=5), "strictly after"


def test_an_anchor_with_microseconds_keeps_them_in_every_fire() -> None:
    anchor = utc(2026, 1, 1, 0, 0, 0) + timedelta(microseconds=250_001)
    rule = interval(7, anchor)
    fire = rule.next_after(utc(2026, 6, 1))
    assert fire is not None and fire.microsecond == 250_001 and (fire - anchor) % timedelta(seconds=7) == timedelta(0)


def test_an_anchor_a_century_behind_is_answered_by_division_not_by_walking() -> None:
    # Walking one second at a time from 1900 would take ~4 x 10^9 steps; the rule answers at once.
    rule = interval(1, utc(1900, 1, 1))
    after = utc(2026, 12, 2, 17, 0, 0) + timedelta(microseconds=1)
    assert rule.next_after(after) == utc(2026, 12, 2, 17, 0, 1)
    assert rule.fires_between(utc(2026, 12, 2), utc(2026, 12, 2, 0, 0, 3)) == [
        utc(2026, 12, 2, 0, 0, 0),
        utc(2026, 12, 2, 0, 0, 1),
        utc(2026, 12, 2, 0, 0, 2),
    ]


def test_fires_end_at_the_end_of_the_calendar_instead_of_raising() -> None:
    rule = interval(EVERY_SECONDS_RANGE[1], utc(8999, 12, 31))
    fires = list(rule.iter_after(utc(9990, 1, 1)))
    assert fires and fires[-1].year == 9999
    assert rule.next_after(fires[-1]) is None


@pytest.mark.parametrize(
    ("rule", "field", "fragment"),
    [
        (TimeRule(kind="interval", anchor_at=utc(2026, 1, 1)), "every_seconds", "needs every_seconds"),
        (interval(0, utc(2026, 1, 1)), "every_seconds", "from 1 to 31,536,000"),
        (interval(EVERY_SECONDS_RANGE[1] + 1, utc(2026, 1, 1)), "every_seconds", "from 1 to 31,536,000"),
        (interval(True, utc(2026, 1, 1)), "every_seconds", "integer"),
        (interval("60", utc(2026, 1, 1)), "every_seconds", "integer"),  # type: ignore[arg-type]
        (TimeRule(kind="interval", every_seconds=60), "anchor_at", "needs anchor_at"),
        (interval(60, datetime(2026, 1, 1)), "anchor_at", "UTC offset"),
        (interval(60, utc(2026, 1, 1), "Mars/Base"), "timezone", "Unknown time zone"),
    ],
)
def test_validate_names_the_interval_field_at_fault(rule: TimeRule, field: str, fragment: str) -> None:
    with pytest.raises(TimeRuleError) as caught:
        rule.validate()
    assert caught.value.field == field
    assert fragment in caught.value.message


def test_a_stored_period_past_the_accepted_range_still_has_fires() -> None:
    # The range is the API's; the materializer must never fail on a row the database constraint allows.
    rule = interval(EVERY_SECONDS_RANGE[1] * 2, utc(2026, 1, 1))
    assert rule.next_after(utc(2026, 6, 1)) == utc(2026, 1, 1) + timedelta(seconds=EVERY_SECONDS_RANGE[1] * 2)


# --- The console's notes ---------------------------------------------------------------------------------


def test_interval_notes_name_the_first_fire_after_each_clock_change() -> None:
    rule = interval(86400, utc(2026, 3, 6, 14), "America/New_York")
    fires = rule.fires_between(utc(2026, 3, 6), utc(2026, 3, 10))
    notes = interval_dst_notes("America/New_York", after=utc(2026, 3, 6), fires=fires)
    assert [(note.kind, note.fires) for note in notes] == [("elapsed", (utc(2026, 3, 8, 14),))]
    assert "jump from 02:00 to 03:00" in notes[0].text and "1 h later" in notes[0].text

    lord_howe = upcoming_interval_dst_notes("Australia/Lord_Howe", after=utc(2026, 3, 1))
    assert ["30 min earlier" in lord_howe[0].text, "30 min later" in lord_howe[1].text] == [True, True]
    assert interval_dst_notes("UTC", after=utc(2026, 3, 6), fires=fires) == []
    assert interval_dst_notes("Mars/Base", after=utc(2026, 3, 6), fires=fires) == []
