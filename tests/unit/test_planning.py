"""Pure materialization rules: misfire policies, lanes, cursors (driven clock, no database)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from core.exclusions import Exclusions
from core.timerules import TimeRule
from dispatch.engine.materializer import Materializer
from dispatch.identity import occurrence_id_for
from dispatch.planning import (
    MAX_FIRES_PER_SCHEDULE,
    DueSchedule,
    due_schedule_of,
    late_one_off_fires,
    plan_schedule,
)

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
HORIZON = timedelta(seconds=120)


def due(**overrides) -> DueSchedule:
    values = {
        "id": uuid.UUID("11111111-2222-4333-8444-555555555555"),
        "tenant_id": 1,
        "kind": "cron",
        "cron": "* * * * *",
        "run_at": None,
        "timezone": "UTC",
        "version": 1,
        "next_run_at": datetime(2026, 12, 1, 12, 1, tzinfo=UTC),
        "lane": "strict",
        "flexible_window_seconds": 300,
        "priority": 0,
        "misfire_policy": "skip",
        "max_lateness_seconds": 60,
        "catchup_limit": 3,
        "catchup_per_minute": 60,
    }
    values.update(overrides)
    return DueSchedule(**values)


def test_fires_up_to_the_horizon_are_planned_and_the_cursor_moves_past_them():
    plan = plan_schedule(due(), now=NOW, horizon=HORIZON)
    assert [o.scheduled_for.minute for o in plan.occurrences] == [1, 2]
    assert plan.new_cursor == datetime(2026, 12, 1, 12, 3, tzinfo=UTC)
    assert all(o.state == "scheduled" and o.available_at == o.scheduled_for for o in plan.occurrences)


def test_occurrence_ids_are_deterministic_per_schedule_version_and_instant():
    first = plan_schedule(due(), now=NOW, horizon=HORIZON)
    again = plan_schedule(due(), now=NOW + timedelta(seconds=5), horizon=HORIZON)
    assert [o.occurrence_id for o in first.occurrences] == [o.occurrence_id for o in again.occurrences]
    newer = plan_schedule(due(version=2), now=NOW, horizon=HORIZON)
    assert newer.occurrences[0].occurrence_id != first.occurrences[0].occurrence_id
    assert first.occurrences[0].occurrence_id == occurrence_id_for(due().id, 1, first.occurrences[0].scheduled_for)


def test_a_one_off_fires_once_and_completes():
    run_at = datetime(2026, 12, 1, 12, 1, 15, tzinfo=UTC)
    plan = plan_schedule(due(kind="once", cron=None, run_at=run_at, next_run_at=run_at), now=NOW, horizon=HORIZON)
    assert [o.scheduled_for for o in plan.occurrences] == [run_at]
    assert plan.completed and plan.new_cursor is None


def outage(policy: str, **overrides) -> list:
    """Ten minutes behind: the cursor is at 11:50 and now is 12:00:30."""
    plan = plan_schedule(
        due(misfire_policy=policy, next_run_at=datetime(2026, 12, 1, 11, 50, tzinfo=UTC), **overrides),
        now=NOW,
        horizon=HORIZON,
    )
    return plan.occurrences


def test_skip_records_every_late_fire_as_missed_and_keeps_on_time_ones():
    occurrences = outage("skip")
    late = [o for o in occurrences if o.scheduled_for < NOW - timedelta(seconds=60)]
    assert late and all(o.state == "missed" for o in late)
    on_time = [o for o in occurrences if o.scheduled_for >= NOW - timedelta(seconds=60)]
    assert [o.state for o in on_time] == ["scheduled"] * len(on_time)
    assert on_time[0].scheduled_for == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_fire_once_emits_only_the_latest_late_fire_released_now():
    occurrences = outage("fire_once")
    late = [o for o in occurrences if o.scheduled_for < NOW - timedelta(seconds=60)]
    emitted = [o for o in late if o.state == "scheduled"]
    assert [o.scheduled_for for o in emitted] == [late[-1].scheduled_for]
    assert emitted[0].available_at == NOW


def test_catch_up_emits_at_most_the_limit_marked_for_pacing_by_the_tenant_budget():
    occurrences = outage("catch_up", catchup_limit=3, catchup_per_minute=30)
    late = [o for o in occurrences if o.scheduled_for < NOW - timedelta(seconds=60)]
    emitted = [o for o in late if o.state == "scheduled"]
    assert [o.scheduled_for for o in emitted] == [o.scheduled_for for o in late[-3:]]
    assert all(o.catch_up and o.available_at == NOW for o in emitted)
    assert not any(o.catch_up for o in occurrences if o not in emitted)
    assert sum(o.state == "missed" for o in late) == len(late) - 3


def test_a_walk_cut_short_in_the_past_emits_nothing_yet_for_fire_once():
    far_behind = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
    plan = plan_schedule(due(misfire_policy="fire_once", next_run_at=far_behind), now=NOW, horizon=HORIZON)
    assert len(plan.occurrences) == MAX_FIRES_PER_SCHEDULE
    assert all(o.state == "missed" for o in plan.occurrences)
    assert plan.new_cursor == far_behind + timedelta(minutes=MAX_FIRES_PER_SCHEDULE)


def test_flexible_jitter_is_deterministic_and_inside_the_window():
    window = 300
    offsets = []
    for n in range(200):
        schedule = due(id=uuid.UUID(int=n + 1), lane="flexible", flexible_window_seconds=window)
        plan = plan_schedule(schedule, now=NOW, horizon=HORIZON)
        again = plan_schedule(schedule, now=NOW, horizon=HORIZON)
        for first, second in zip(plan.occurrences, again.occurrences, strict=True):
            assert first.available_at == second.available_at
            offset = (first.available_at - first.scheduled_for).total_seconds()
            assert 0 <= offset < window
            offsets.append(offset)
    # Spread, not bunched: correlated fires land all over the window.
    assert max(offsets) - min(offsets) > window * 0.8


def test_daily_local_cron_follows_wall_clock_across_dst_not_24_hours():
    schedule = due(
        cron="0 9 * * *",
        timezone="Europe/Madrid",
        next_run_at=datetime(2026, 3, 28, 8, 0, tzinfo=UTC),  # 09:00 CET
    )
    plan = plan_schedule(schedule, now=datetime(2026, 3, 28, 7, 59, tzinfo=UTC), horizon=timedelta(days=1))
    assert [o.scheduled_for for o in plan.occurrences] == [
        datetime(2026, 3, 28, 8, 0, tzinfo=UTC),  # 09:00 CET
        datetime(2026, 3, 29, 7, 0, tzinfo=UTC),  # 09:00 CEST, 23 h later
    ]


def test_a_due_schedule_is_built_from_named_columns_and_refuses_a_missing_one():
    columns = {**due()._asdict(), "every_seconds": None, "anchor_at": None, "name": "not a planning column"}
    assert due_schedule_of(columns, version=7) == due(version=7)
    del columns["catchup_limit"]
    with pytest.raises(KeyError, match="catchup_limit"):
        due_schedule_of(columns)


def test_a_late_one_off_fires_or_is_missed_by_its_misfire_policy():
    run_at = NOW - timedelta(minutes=10)
    rule = TimeRule(kind="once", timezone="UTC", run_at=run_at)
    definition = {
        "lane": "strict",
        "flexible_window_seconds": 300,
        "priority": 0,
        "max_lateness_seconds": 60,
        "catchup_limit": 3,
    }
    assert late_one_off_fires({**definition, "misfire_policy": "fire_once"}, rule, now=NOW)
    assert not late_one_off_fires({**definition, "misfire_policy": "skip"}, rule, now=NOW)


# --- calendars ------------------------------------------------------------------------------------------------


def test_excluded_fires_are_left_out_and_the_cursor_stops_within_the_horizon_of_a_long_exclusion():
    """Inside a week-long excluded range the walk writes nothing and leaves the cursor on the rhythm's first fire
    past the horizon, never at the range's end: a change to the calendar applies to every fire not yet written."""
    week = Exclusions(ranges=((datetime(2026, 12, 1, 12, 2, tzinfo=UTC), datetime(2026, 12, 8, tzinfo=UTC)),))

    plan = plan_schedule(due(exclusions=week), now=NOW, horizon=HORIZON)

    assert [o.scheduled_for.minute for o in plan.occurrences] == [1]
    assert plan.new_cursor == datetime(2026, 12, 1, 12, 3, tzinfo=UTC)


def test_a_one_off_on_an_excluded_date_plans_nothing_and_ends():
    christmas = Exclusions(dates=frozenset({date(2026, 12, 1)}))
    run_at = datetime(2026, 12, 1, 12, 1, tzinfo=UTC)

    plan = plan_schedule(
        due(kind="once", cron=None, run_at=run_at, next_run_at=run_at, exclusions=christmas), now=NOW, horizon=HORIZON
    )

    assert plan.occurrences == [] and plan.completed


def test_the_batch_puts_each_rows_calendars_in_place_of_their_names():
    """The scan's row carries calendar names; _plan plans with the batch's Exclusions of that tenant's names."""
    week = Exclusions(ranges=((datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 8, tzinfo=UTC)),))
    named, plain = due(exclusions=["shutdown"]), due(id=uuid.uuid4())
    rows = [(*schedule, 0, "(0,1)", str(schedule.id)) for schedule in (named, plain)]

    plans = Materializer("unit", horizon_seconds=HORIZON.total_seconds())._plan(rows, NOW, {(1, ("shutdown",)): week})

    assert [len(plan.occurrences) for plan in plans] == [0, 2]
    assert plans[0].schedule.exclusions is week
