"""A catch-up longer than one chunk: across every batch, the misfire policy keeps exactly the latest late fires."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest

from dispatch.planning import MAX_FIRES_PER_SCHEDULE, DueSchedule, PlannedOccurrence, plan_schedule
from tests.unit.test_planning import HORIZON, NOW, due

MINUTE = timedelta(minutes=1)
# The lateness limit of due(): fires before 11:59:30 are late, 11:59 being the latest late fire of a minutely cron.
LATEST_LATE = datetime(2026, 12, 1, 11, 59, tzinfo=NOW.tzinfo)


def behind_by(late_fires: int, **overrides) -> DueSchedule:
    """A minutely schedule whose cursor is `late_fires` fires before the lateness limit."""
    return due(next_run_at=LATEST_LATE - (late_fires - 1) * MINUTE, **overrides)


def walk_every_chunk(schedule: DueSchedule, nows: list[datetime] | None = None) -> list[PlannedOccurrence]:
    """Plan batch after batch, each from the cursor the previous one left, until the horizon is reached; the
    i-th batch runs at nows[i] (the last instant repeats)."""
    occurrences: list[PlannedOccurrence] = []
    batch = 0
    while True:
        now = (nows or [NOW])[min(batch, len(nows or [NOW]) - 1)]
        plan = plan_schedule(schedule, now=now, horizon=HORIZON)
        assert len(plan.occurrences) <= max(MAX_FIRES_PER_SCHEDULE, schedule.catchup_limit + 1)
        occurrences.extend(plan.occurrences)
        if plan.new_cursor is None or plan.new_cursor > now + HORIZON:
            return occurrences
        assert plan.new_cursor > schedule.next_run_at, "every batch moves the cursor forward"
        schedule = schedule._replace(next_run_at=plan.new_cursor)
        batch += 1


def late_fires_of(schedule: DueSchedule) -> list[datetime]:
    count = int((LATEST_LATE - schedule.next_run_at) / MINUTE) + 1
    return [schedule.next_run_at + n * MINUTE for n in range(count)]


def assert_every_fire_planned_once(schedule: DueSchedule, occurrences: list[PlannedOccurrence]) -> None:
    fors = [o.scheduled_for for o in occurrences]
    expected = []
    fire = schedule.next_run_at
    while fire <= NOW + HORIZON:
        expected.append(fire)
        fire += MINUTE
    assert fors == expected


@pytest.mark.parametrize("late_count", [3, 10, 499, 500, 501, 505, 509, 510, 511, 999, 1000, 1003, 2345])
@pytest.mark.parametrize(("policy", "limit"), [("fire_once", 10), ("catch_up", 1), ("catch_up", 10)])
def test_across_chunks_the_policy_emits_exactly_the_latest_late_fires(late_count, policy, limit):
    schedule = behind_by(late_count, misfire_policy=policy, catchup_limit=limit)
    occurrences = walk_every_chunk(schedule)

    assert_every_fire_planned_once(schedule, occurrences)
    keep = 1 if policy == "fire_once" else limit
    late = late_fires_of(schedule)
    emitted = [o.scheduled_for for o in occurrences if o.scheduled_for in set(late) and o.state == "scheduled"]
    assert emitted == late[-keep:]
    assert sum(o.state == "missed" for o in occurrences) == len(late) - len(emitted)


@pytest.mark.parametrize("late_count", [599, 600, 601, 1100, 1201, 1802])
def test_a_catch_up_limit_larger_than_a_chunk_emits_the_latest_k_in_one_batch_for_pacing(late_count):
    schedule = behind_by(late_count, misfire_policy="catch_up", catchup_limit=600, catchup_per_minute=600)
    occurrences = walk_every_chunk(schedule)

    assert_every_fire_planned_once(schedule, occurrences)
    late = late_fires_of(schedule)
    emitted = [o for o in occurrences if o.scheduled_for < LATEST_LATE + MINUTE and o.state == "scheduled"]
    assert [o.scheduled_for for o in emitted] == late[-600:]
    # One batch plans them all, marked for the writer to pace on the tenant's budget (dispatch/quotas.py).
    assert all(o.catch_up and o.available_at == NOW for o in emitted)


def test_a_catch_up_whose_clock_moves_between_batches_still_emits_exactly_k_and_loses_no_fire():
    schedule = behind_by(505, misfire_policy="catch_up", catchup_limit=10)
    # The second batch runs a minute later: one more fire has become late meanwhile.
    occurrences = walk_every_chunk(schedule, nows=[NOW, NOW + MINUTE])

    fors = [o.scheduled_for for o in occurrences]
    assert fors == sorted(set(fors)) and fors[0] == schedule.next_run_at
    assert all(later - earlier == MINUTE for earlier, later in itertools.pairwise(fors))
    late_then = [o for o in occurrences if o.scheduled_for <= LATEST_LATE + MINUTE]
    emitted = [o.scheduled_for for o in late_then if o.state == "scheduled"]
    assert emitted == [LATEST_LATE + MINUTE - n * MINUTE for n in range(9, -1, -1)]


def test_a_walk_cut_short_just_before_the_latest_k_ends_at_the_first_kept_fire_and_misses_only_earlier_ones():
    schedule = behind_by(MAX_FIRES_PER_SCHEDULE + 4, misfire_policy="catch_up", catchup_limit=10)
    plan = plan_schedule(schedule, now=NOW, horizon=HORIZON)
    first_kept = LATEST_LATE - 9 * MINUTE
    assert plan.new_cursor == first_kept
    assert [o.scheduled_for for o in plan.occurrences][-1] == first_kept - MINUTE
    assert {o.state for o in plan.occurrences} == {"missed"}


def test_fire_once_far_behind_emits_the_latest_late_fire_released_now():
    schedule = behind_by(3 * MAX_FIRES_PER_SCHEDULE + 7, misfire_policy="fire_once")
    occurrences = walk_every_chunk(schedule)
    emitted_late = [o for o in occurrences if o.scheduled_for <= LATEST_LATE and o.state == "scheduled"]
    assert [(o.scheduled_for, o.available_at) for o in emitted_late] == [(LATEST_LATE, NOW)]


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ("skip", "late by 630 s > max lateness 60 s (skip)"),
        ("fire_once", "late by 630 s > max lateness 60 s (fire_once keeps only the latest late fire)"),
        ("catch_up", "late by 630 s > max lateness 60 s (catch_up keeps the latest 3 late fires)"),
    ],
)
def test_a_missed_fire_says_which_rule_missed_it_and_by_how_much(policy, reason):
    occurrences = walk_every_chunk(behind_by(10, misfire_policy=policy, catchup_limit=3))
    first = occurrences[0]
    assert (first.scheduled_for, first.state, first.reason) == (LATEST_LATE - 9 * MINUTE, "missed", reason)
    assert all(o.reason for o in occurrences if o.state == "missed")
    assert all(o.reason == "" for o in occurrences if o.state == "scheduled")
