"""Materialization rules for interval schedules: the walk, misfire policies across chunks, lanes, shared walks."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from dispatch.engine.materializer import Materializer
from dispatch.planning import DueSchedule, plan_schedule, walk_key
from tests.unit.test_planning import HORIZON, NOW, due
from tests.unit.test_planning_chunks import walk_every_chunk

ANCHOR = datetime(2026, 11, 1, 0, 0, 7, tzinfo=UTC)
EVERY = 45


def interval(**overrides) -> DueSchedule:
    """Every 45 s from 1 November 00:00:07, its cursor on the first fire after 12:00:30 (NOW) on 1 December."""
    values = {
        "kind": "interval",
        "cron": None,
        "every_seconds": EVERY,
        "anchor_at": ANCHOR,
        "next_run_at": grid(datetime(2026, 12, 1, 12, 0, 31, tzinfo=UTC)),
    }
    return due(**{**values, **overrides})


def grid(at_or_after: datetime, every: int = EVERY) -> datetime:
    """The first fire of the 45 s grid at or after an instant, by enumeration (the test's own reference)."""
    fire = ANCHOR
    while fire < at_or_after:
        fire += timedelta(seconds=every)
    return fire


def test_fires_from_the_cursor_up_to_the_horizon_are_the_anchor_plus_whole_periods():
    schedule = interval()
    plan = plan_schedule(schedule, now=NOW, horizon=HORIZON)
    first = schedule.next_run_at
    expected = [
        first + n * timedelta(seconds=EVERY) for n in range(10) if first + n * timedelta(seconds=EVERY) <= NOW + HORIZON
    ]
    assert [o.scheduled_for for o in plan.occurrences] == expected and len(expected) >= 2
    assert plan.new_cursor == expected[-1] + timedelta(seconds=EVERY) > NOW + HORIZON
    assert all((o.scheduled_for - ANCHOR) % timedelta(seconds=EVERY) == timedelta(0) for o in plan.occurrences)
    assert all(o.state == "scheduled" and o.available_at == o.scheduled_for for o in plan.occurrences)


def test_a_one_second_interval_plans_every_second_of_the_horizon():
    schedule = interval(every_seconds=1, next_run_at=NOW.replace(microsecond=0) + timedelta(seconds=1))
    plan = plan_schedule(schedule, now=NOW, horizon=HORIZON)
    assert len(plan.occurrences) == 120
    assert plan.new_cursor == NOW + HORIZON + timedelta(seconds=1)


@pytest.mark.parametrize(("policy", "kept"), [("skip", 0), ("fire_once", 1), ("catch_up", 3)])
def test_after_an_outage_the_misfire_policy_keeps_the_latest_late_fires(policy, kept):
    # 20 periods behind: the 45 s fires before 11:59:30 (now - max lateness) are late.
    schedule = interval(misfire_policy=policy, next_run_at=grid(NOW - timedelta(seconds=20 * EVERY)))
    plan = plan_schedule(schedule, now=NOW, horizon=HORIZON)
    late = [o for o in plan.occurrences if o.scheduled_for < NOW - timedelta(seconds=60)]
    assert len(late) >= 18
    missed, kept_fires = late[: len(late) - kept], late[len(late) - kept :]
    assert all(o.state == "missed" and "late by" in o.reason for o in missed)
    assert all(o.state == "scheduled" and o.catch_up and o.available_at == NOW for o in kept_fires)


@pytest.mark.parametrize("late_count", [3, 499, 500, 501, 1003])
@pytest.mark.parametrize(("policy", "limit"), [("fire_once", 10), ("catch_up", 10)])
def test_across_chunks_an_interval_far_behind_emits_exactly_the_latest_late_fires(late_count, policy, limit):
    every = timedelta(seconds=EVERY)
    latest_late = grid(NOW - timedelta(seconds=60) - every + timedelta(microseconds=1))
    schedule = interval(next_run_at=latest_late - (late_count - 1) * every, misfire_policy=policy, catchup_limit=limit)
    occurrences = walk_every_chunk(schedule)

    fors = [o.scheduled_for for o in occurrences]
    assert fors == sorted(set(fors)), "each fire once, in order"
    assert fors[0] == schedule.next_run_at and all(b - a == every for a, b in itertools.pairwise(fors))
    late = [o for o in occurrences if o.scheduled_for <= latest_late]
    assert len(late) == late_count
    keep = 1 if policy == "fire_once" else limit
    assert [o.scheduled_for for o in late if o.state == "scheduled"] == [o.scheduled_for for o in late][-keep:]
    assert sum(1 for o in late if o.state == "missed") == max(0, late_count - keep)


def test_flexible_interval_fires_are_jittered_inside_the_window_deterministically():
    schedule = interval(lane="flexible", flexible_window_seconds=30)
    plan = plan_schedule(schedule, now=NOW, horizon=HORIZON)
    again = plan_schedule(schedule, now=NOW + timedelta(seconds=3), horizon=HORIZON)
    for occurrence, repeat in zip(plan.occurrences, again.occurrences, strict=True):
        assert occurrence.scheduled_for <= occurrence.available_at < occurrence.scheduled_for + timedelta(seconds=30)
        assert repeat.available_at == occurrence.available_at


def test_schedules_share_a_walk_only_when_period_and_anchor_agree():
    base = interval()
    assert walk_key(base) == walk_key(interval(id=uuid.uuid4(), tenant_id=2, version=7))
    assert walk_key(base) != walk_key(interval(every_seconds=90))
    assert walk_key(base) != walk_key(interval(anchor_at=ANCHOR + timedelta(seconds=1)))


def test_the_materializer_batch_plans_two_periods_from_one_cursor_each_by_its_own_period():
    # 12:01:37 is on both grids (k = 58,562 of 45 s, 29,281 of 90 s): a walk shared by cursor alone would give the 90 s
    # schedule the 45 s schedule's fires.
    cursor = datetime(2026, 12, 1, 12, 1, 37, tzinfo=UTC)
    assert grid(cursor) == grid(cursor, 90) == cursor
    schedules = [interval(next_run_at=cursor), interval(id=uuid.uuid4(), every_seconds=90, next_run_at=cursor)]
    rows = [(*schedule, 0, "(0,1)", str(schedule.id)) for schedule in schedules]
    plans = Materializer("unit", horizon_seconds=HORIZON.total_seconds())._plan(rows, NOW, {})
    assert [[o.scheduled_for for o in plan.occurrences] for plan in plans] == [
        [cursor, cursor + timedelta(seconds=45)],
        [cursor],
    ]
    assert [plan.new_cursor for plan in plans] == [cursor + timedelta(seconds=90), cursor + timedelta(seconds=90)]
