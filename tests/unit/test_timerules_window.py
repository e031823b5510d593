"""A schedule's window (start_at, end_at) on every kind: the rule's fires are exactly the unbounded rule's fires that
lie in [start_at, end_at], both ends included, and none outside it (docs/API.md, "The time model")."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.timerules import TimeRule, TimeRuleError
from tests.support import examples
from tests.unit.test_timerules import ZONES, cron_expressions, instants_near_transitions, ref_fires_after, utc


def windowed(rule: TimeRule, start: datetime | None, end: datetime | None) -> TimeRule:
    return TimeRule(**{**rule.__dict__, "start_at": start, "end_at": end})


@settings(max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_expressions(), st.sampled_from(ZONES), st.data())
def test_a_cron_window_keeps_exactly_the_reference_fires_inside_it(expr: str, zone: str, data: st.DataObject):
    after = data.draw(instants_near_transitions(zone))
    reference = ref_fires_after(expr, zone, after - timedelta(days=3), 40)
    # Window edges on fires (inclusive ends), between them, or absent.
    edges = [*reference, *(fire + timedelta(seconds=1) for fire in reference), None]
    start, end = data.draw(st.sampled_from(edges)), data.draw(st.sampled_from(edges))
    rule = windowed(TimeRule(kind="cron", timezone=zone, cron=expr), start, end)
    if start is not None and end is not None and end < start:
        with pytest.raises(TimeRuleError):
            rule.validate()
        return
    horizon = reference[-1] if reference else after
    expected = [
        fire
        for fire in reference
        if fire > after and (start is None or fire >= start) and (end is None or fire <= end) and fire <= horizon
    ]
    got = list(itertools.takewhile(lambda fire: fire <= horizon, rule.iter_after(after)))
    assert got == expected


@given(
    st.integers(1, 10_000),
    st.integers(0, 10**7),
    st.integers(-(10**6), 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_an_interval_window_keeps_exactly_the_grid_points_inside_it(every, anchor_offset, after_offset, start, span):
    anchor = utc(2026, 1, 1) + timedelta(seconds=anchor_offset)
    after = anchor + timedelta(seconds=after_offset)
    start_at, end_at = anchor + timedelta(seconds=start), anchor + timedelta(seconds=start + span)
    rule = TimeRule(kind="interval", every_seconds=every, anchor_at=anchor, start_at=start_at, end_at=end_at)

    got = list(itertools.islice(rule.iter_after(after), 50))

    # By definition: anchor + k x every, k >= 0, after `after`, inside [start_at, end_at].
    first_k = max(0, -(-(max(after, start_at - timedelta(microseconds=1)) - anchor).total_seconds() // every))
    expected = []
    k = int(first_k) - 1
    while len(expected) < 50:
        k += 1
        fire = anchor + timedelta(seconds=k * every)
        if fire > end_at:
            break
        if fire > after and fire >= start_at and k >= 0:
            expected.append(fire)
    assert got == expected


def test_a_one_off_outside_its_window_never_fires() -> None:
    run_at = utc(2026, 6, 1, 12)
    assert TimeRule(kind="once", run_at=run_at, end_at=run_at).next_after(utc(2026, 1, 1)) == run_at
    assert (
        TimeRule(kind="once", run_at=run_at, end_at=run_at - timedelta(seconds=1)).next_after(utc(2026, 1, 1)) is None
    )
    assert (
        TimeRule(kind="once", run_at=run_at, start_at=run_at + timedelta(seconds=1)).next_after(utc(2026, 1, 1)) is None
    )


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        (TimeRule(kind="cron", cron="0 * * * *", start_at=utc(2026, 2, 1), end_at=utc(2026, 1, 1)), "end_at"),
        (TimeRule(kind="cron", cron="0 * * * *", start_at=datetime(2026, 1, 1)), "start_at"),
    ],
)
def test_a_backwards_or_naive_window_names_the_field(rule: TimeRule, field: str) -> None:
    with pytest.raises(TimeRuleError) as caught:
        rule.validate()
    assert caught.value.field == field


def test_the_window_ends_are_inclusive_in_new_york_local_time() -> None:
    # 09:00 New York daily from the first fire to the last, both included; the window names instants, not dates.
    rule = TimeRule(
        kind="cron",
        timezone="America/New_York",
        cron="0 9 * * *",
        start_at=datetime(2026, 3, 7, 14, tzinfo=UTC),
        end_at=datetime(2026, 3, 9, 13, tzinfo=UTC),
    )
    assert list(rule.iter_after(utc(2026, 1, 1))) == [utc(2026, 3, 7, 14), utc(2026, 3, 8, 13), utc(2026, 3, 9, 13)]
