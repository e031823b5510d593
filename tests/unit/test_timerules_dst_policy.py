"""The DST policies of cron rules (dst_gap, dst_repeat) against the brute-force reference of test_timerules, in its
twelve zones (Lord_Howe's half hour, Chatham, Santiago, Apia's skipped day, Tehran's abolished DST), and by hand."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.timerules import DST_GAP_POLICIES, DST_REPEAT_POLICIES, TimeRule, TimeRuleError
from tests.support import examples
from tests.unit.test_timerules import (
    ZONES,
    cron_expressions,
    extension_expressions,
    instants_near_transitions,
    ref_fires_after,
    transitions,
    utc,
)

NEW_YORK = "America/New_York"


def policy_rule(expr: str, zone: str, gap: str, repeat: str) -> TimeRule:
    return TimeRule(kind="cron", timezone=zone, cron=expr, dst_gap=gap, dst_repeat=repeat)


def assert_policy_matches_reference(expr: str, zone: str, after: datetime, gap: str, repeat: str) -> None:
    """The next eight fires, chained and one by one, are the reference walker's under the same policy."""
    rule = policy_rule(expr, zone, gap, repeat)
    expected = ref_fires_after(expr, zone, after, 8, gap, repeat)
    assert list(itertools.islice(rule.iter_after(after), len(expected))) == expected
    assert rule.next_after(after) == (expected[0] if expected else None)


policies = st.tuples(st.sampled_from(DST_GAP_POLICIES), st.sampled_from(DST_REPEAT_POLICIES))


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_expressions(), st.sampled_from(ZONES), policies, st.data())
def test_policy_fires_match_the_brute_force_reference(
    expr: str, zone: str, policy: tuple[str, str], data: st.DataObject
) -> None:
    assert_policy_matches_reference(expr, zone, data.draw(instants_near_transitions(zone)), *policy)


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extension_expressions(), st.sampled_from(ZONES), policies, st.data())
def test_policies_with_calendar_extensions_match_the_reference(
    expr: str, zone: str, policy: tuple[str, str], data: st.DataObject
) -> None:
    assert_policy_matches_reference(expr, zone, data.draw(instants_near_transitions(zone)), *policy)


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("gap,repeat", list(itertools.product(DST_GAP_POLICIES, DST_REPEAT_POLICIES)))
def test_every_quarter_hour_through_each_clock_change_matches_the_reference(zone: str, gap: str, repeat: str) -> None:
    # Dense fires meet every minute of each change of 2026-2027 (and Apia's skipped day of 2011).
    changes = [t for t in transitions(zone) if t.year in (2026, 2027) or t.date() == date(2011, 12, 30)]
    rule = policy_rule("*/15 * * * *", zone, gap, repeat)
    for change in changes or [utc(2026, 3, 29)]:
        since, until = change - timedelta(days=2), change + timedelta(days=2)
        expected = ref_fires_after("*/15 * * * *", zone, since - timedelta(microseconds=1), 5 * 24 * 4, gap, repeat)
        assert rule.fires_between(since, until) == [t for t in expected if t < until]


def test_shift_fires_a_skipped_time_at_the_offset_from_before_the_change() -> None:
    # 02:30 on 2026-03-08 does not exist in New York: shifted, it is 02:30 EST = 07:30 UTC = 03:30 EDT.
    rule = policy_rule("30 2 * * *", NEW_YORK, "shift", "first")
    assert rule.fires_between(utc(2026, 3, 7), utc(2026, 3, 10)) == [
        utc(2026, 3, 7, 7, 30),
        utc(2026, 3, 8, 7, 30),
        utc(2026, 3, 9, 6, 30),
    ]
    assert rule.dst_mark(utc(2026, 3, 8, 7, 30)) == "shifted"
    assert rule.dst_mark(utc(2026, 3, 9, 6, 30)) is None


def test_a_shifted_time_landing_on_a_real_one_fires_once() -> None:
    # 02:30 shifted is 03:30 EDT, which the rule names too: one fire, an ordinary one.
    rule = policy_rule("30 2,3 * * *", NEW_YORK, "shift", "first")
    assert rule.fires_between(utc(2026, 3, 8, 5), utc(2026, 3, 8, 12)) == [utc(2026, 3, 8, 7, 30)]
    assert rule.dst_mark(utc(2026, 3, 8, 7, 30)) is None


@pytest.mark.parametrize(
    "repeat,expected",
    [
        ("first", [utc(2026, 11, 1, 5, 30)]),
        ("last", [utc(2026, 11, 1, 6, 30)]),
        ("both", [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)]),
    ],
)
def test_a_repeated_time_fires_at_the_instants_its_policy_names(repeat: str, expected: list[datetime]) -> None:
    rule = policy_rule("30 1 * * *", NEW_YORK, "skip", repeat)
    assert rule.fires_between(utc(2026, 11, 1), utc(2026, 11, 1, 12)) == expected
    assert {rule.dst_mark(fire) for fire in expected} == {"repeated"}


def test_every_quarter_hour_is_not_silent_for_75_minutes_on_the_fall_back_night_with_both() -> None:
    fires = policy_rule("*/15 * * * *", NEW_YORK, "skip", "both").fires_between(
        utc(2026, 11, 1, 4), utc(2026, 11, 1, 8)
    )
    assert fires == [utc(2026, 11, 1, 4) + timedelta(minutes=15 * k) for k in range(16)]
    gaps = {later - earlier for earlier, later in itertools.pairwise(fires)}
    assert gaps == {timedelta(minutes=15)}


def test_a_next_fire_asked_from_inside_the_second_pass_is_its_next_second_instant() -> None:
    rule = policy_rule("*/20 * * * *", NEW_YORK, "skip", "last")
    assert rule.next_after(utc(2026, 11, 1, 6, 5)) == utc(2026, 11, 1, 6, 20)  # 01:20 EST
    assert rule.next_after(utc(2026, 11, 1, 5, 50)) == utc(2026, 11, 1, 6, 0)  # from 01:50 EDT: 01:00 EST


@pytest.mark.parametrize(
    "rule,field",
    [
        (TimeRule(kind="cron", cron="0 2 * * *", dst_gap="later"), "dst_gap"),
        (TimeRule(kind="cron", cron="0 2 * * *", dst_repeat="twice"), "dst_repeat"),
        (TimeRule(kind="interval", every_seconds=60, anchor_at=utc(2026, 1, 1), dst_repeat="first"), "dst_repeat"),
        (TimeRule(kind="once", run_at=utc(2026, 1, 1), dst_gap="shift"), "dst_gap"),
    ],
)
def test_policies_are_checked_and_refused_outside_cron(rule: TimeRule, field: str) -> None:
    with pytest.raises(TimeRuleError) as caught:
        rule.validate()
    assert caught.value.field == field


def test_other_kinds_fires_carry_no_mark() -> None:
    rule = TimeRule(kind="interval", timezone=NEW_YORK, every_seconds=900, anchor_at=datetime(2026, 1, 1, tzinfo=UTC))
    assert rule.dst_mark(utc(2026, 11, 1, 5, 30)) is None
