"""Exclusions (a tenant's holiday calendars) in the time rules: a fire whose local date in the rule's zone is an
excluded date, or whose instant lies in an excluded range [start, end), does not exist; every other fire is kept,
under every DST policy, in the twelve zones of test_timerules."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.timerules import DST_GAP_POLICIES, DST_REPEAT_POLICIES, ExclusionHistory, Exclusions, TimeRule
from tests.support import examples
from tests.unit.test_timerules import ZONES, cron_expressions, instants_near_transitions, ref_fires_after, utc


def excluded(fire: datetime, zone: str, exclusions: Exclusions) -> bool:
    """The definition, read literally."""
    if fire.astimezone(ZoneInfo(zone)).date() in exclusions.dates:
        return True
    return any(start <= fire < end for start, end in exclusions.ranges)


@st.composite
def exclusions_near(draw: st.DrawFn, after: datetime, zone: str) -> Exclusions:
    local = after.astimezone(ZoneInfo(zone)).date()
    dates = draw(st.sets(st.integers(-2, 12), max_size=6))
    ranges = []
    for _ in range(draw(st.integers(0, 3))):
        start = after + timedelta(minutes=draw(st.integers(-600, 14 * 24 * 60)))
        ranges.append((start, start + timedelta(minutes=draw(st.integers(1, 3 * 24 * 60)))))
    return Exclusions(frozenset(local + timedelta(days=d) for d in dates), tuple(ranges))


@settings(max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cron_expressions(),
    st.sampled_from(ZONES),
    st.sampled_from(DST_GAP_POLICIES),
    st.sampled_from(DST_REPEAT_POLICIES),
    st.data(),
)
def test_excluded_fires_are_exactly_those_the_definition_names(expr, zone, gap, repeat, data):
    after = data.draw(instants_near_transitions(zone))
    exclusions = data.draw(exclusions_near(after, zone))
    reference = ref_fires_after(expr, zone, after, 60, gap, repeat)
    rule = TimeRule(kind="cron", timezone=zone, cron=expr, dst_gap=gap, dst_repeat=repeat, exclusions=exclusions)
    expected = [fire for fire in reference if not excluded(fire, zone, exclusions)]
    horizon = reference[-1] if reference else after

    got = list(itertools.takewhile(lambda fire: fire <= horizon, rule.iter_after(after)))

    assert got == expected


def test_an_excluded_day_of_a_one_second_interval_is_skipped_at_once() -> None:
    # 86,400 fires on the excluded day are jumped over, not walked.
    rule = TimeRule(
        kind="interval",
        timezone="Europe/Madrid",
        every_seconds=1,
        anchor_at=utc(2026, 1, 1),
        exclusions=Exclusions(frozenset({date(2026, 12, 25)})),
    )
    # 25 December in Madrid is 24 Dec 23:00 UTC to 25 Dec 23:00 UTC.
    assert rule.next_after(utc(2026, 12, 24, 22, 59, 59)) == utc(2026, 12, 25, 23, 0, 0)


def test_a_range_excludes_its_start_and_keeps_its_end() -> None:
    exclusions = Exclusions(ranges=((utc(2026, 1, 1, 1), utc(2026, 1, 1, 3)),))
    rule = TimeRule(kind="cron", cron="0 * * * *", exclusions=exclusions)
    assert rule.fires_between(utc(2026, 1, 1), utc(2026, 1, 1, 5)) == [
        utc(2026, 1, 1, 0),
        utc(2026, 1, 1, 3),
        utc(2026, 1, 1, 4),
    ]


def test_a_one_off_on_an_excluded_date_has_no_fire() -> None:
    rule = TimeRule(kind="once", run_at=utc(2026, 12, 25, 9), exclusions=Exclusions(frozenset({date(2026, 12, 25)})))
    assert rule.next_after(utc(2026, 1, 1)) is None


def test_a_date_is_read_in_the_rules_zone_where_midnight_is_skipped() -> None:
    # Santiago skipped 00:00-00:59 on 2026-09-06: the excluded 5 September ends at 01:00 local (04:00 UTC).
    rule = TimeRule(
        kind="cron",
        timezone="America/Santiago",
        cron="30 * * * *",
        exclusions=Exclusions(frozenset({date(2026, 9, 5)})),
    )
    fires = list(itertools.islice(rule.iter_after(datetime(2026, 9, 5, 12, tzinfo=UTC)), 2))
    assert fires == [utc(2026, 9, 6, 4, 30), utc(2026, 9, 6, 5, 30)]  # 01:30 and 02:30 -03 on 6 September


@st.composite
def histories_near(draw: st.DrawFn, after: datetime, zone: str) -> ExclusionHistory:
    """Contents in force over random spans (some open-ended), overlapping or not, as reconcile builds them."""
    spans = []
    for _ in range(draw(st.integers(1, 4))):
        since = after + timedelta(minutes=draw(st.integers(-600, 10 * 24 * 60)))
        until = None if draw(st.booleans()) else since + timedelta(minutes=draw(st.integers(1, 5 * 24 * 60)))
        spans.append((since, until, draw(exclusions_near(after, zone))))
    return ExclusionHistory(tuple(spans))


def excluded_by_history(fire: datetime, zone: str, history: ExclusionHistory) -> bool:
    """The definition: some content whose span holds the fire excludes it."""
    return any(
        since <= fire and (until is None or fire < until) and excluded(fire, zone, exclusions)
        for since, until, exclusions in history.spans
    )


@pytest.mark.parametrize("certain", [False, True], ids=["any content", "every content"])
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_expressions(), st.sampled_from(ZONES), st.data())
def test_a_history_excludes_exactly_the_fires_its_contents_in_force_exclude(certain, expr, zone, data):
    """Reconcile's view: by default a fire some content in force excludes; certain(), one every content excludes."""
    after = data.draw(instants_near_transitions(zone))
    history = data.draw(histories_near(after, zone))
    history, definition = (history.certain(), certainly_excluded) if certain else (history, excluded_by_history)
    reference = ref_fires_after(expr, zone, after, 60, "skip", "first")
    rule = TimeRule(kind="cron", timezone=zone, cron=expr, exclusions=history)
    expected = [fire for fire in reference if not definition(fire, zone, history)]
    horizon = reference[-1] if reference else after

    got = list(itertools.takewhile(lambda fire: fire <= horizon, rule.iter_after(after)))

    assert got == expected


def test_a_content_stops_excluding_where_its_span_ends_even_mid_day() -> None:
    christmas = Exclusions(frozenset({date(2026, 12, 25)}))
    history = ExclusionHistory(((utc(2026, 12, 1), utc(2026, 12, 25, 12), christmas),))
    rule = TimeRule(kind="cron", cron="0 */6 * * *", exclusions=history)

    assert rule.fires_between(utc(2026, 12, 24, 18), utc(2026, 12, 26)) == [
        utc(2026, 12, 24, 18),
        utc(2026, 12, 25, 12),
        utc(2026, 12, 25, 18),
    ]


def test_stored_contents_parse_and_merge_as_one_exclusion() -> None:
    holidays = Exclusions.stored(["2026-12-25"], [])
    window = Exclusions.stored([], [{"start": "2026-12-31T23:00:00+01:00", "end": "2027-01-01T06:00:00Z"}])

    merged = Exclusions.merged([holidays, window])

    assert merged == Exclusions(frozenset({date(2026, 12, 25)}), ((utc(2026, 12, 31, 22), utc(2027, 1, 1, 6)),))
    assert not Exclusions.merged([]) and not ExclusionHistory()


def certainly_excluded(fire: datetime, zone: str, history: ExclusionHistory) -> bool:
    """The definition of `certain`: some content's span holds the fire, and every such content excludes it."""
    holding = [ex for since, until, ex in history.spans if since <= fire and (until is None or fire < until)]
    return bool(holding) and all(excluded(fire, zone, ex) for ex in holding)


def test_overlapping_ranges_are_joined_and_a_run_of_dates_is_one_step() -> None:
    exclusions = Exclusions(
        frozenset(date(2027, 1, 1) + timedelta(days=n) for n in range(3000)),
        ((utc(2026, 1, 1, 3), utc(2026, 1, 1, 5)), (utc(2026, 1, 1, 1), utc(2026, 1, 1, 4))),
    )
    zone = ZoneInfo("UTC")

    assert exclusions.ranges == ((utc(2026, 1, 1, 1), utc(2026, 1, 1, 5)),)
    assert exclusions == Exclusions(exclusions.dates, tuple(reversed(exclusions.ranges))) and hash(exclusions)
    assert exclusions.skip_to(utc(2026, 1, 1, 4, 30), zone) == utc(2026, 1, 1, 5) - timedelta(microseconds=1)
    resume = exclusions.skip_to(utc(2027, 1, 1, 9), zone)
    assert resume == utc(2027, 1, 1) + timedelta(days=3000) - timedelta(microseconds=1)


def test_the_certain_history_looks_again_where_another_content_begins() -> None:
    # The range is excluded while only the first content speaks; from 12:00 a second one (excluding nothing) has its
    # say too, so 12:00 and 13:00 are no longer certainly excluded.
    upgrade = Exclusions(ranges=((utc(2026, 1, 1, 10), utc(2026, 1, 1, 14)),))
    history = ExclusionHistory(((utc(2026, 1, 1), None, upgrade), (utc(2026, 1, 1, 12), None, Exclusions())))
    rule = TimeRule(kind="cron", cron="0 * * * *", exclusions=history.certain())

    assert rule.fires_between(utc(2026, 1, 1, 9), utc(2026, 1, 1, 15)) == [
        utc(2026, 1, 1, 9),
        utc(2026, 1, 1, 12),
        utc(2026, 1, 1, 13),
        utc(2026, 1, 1, 14),
    ]
