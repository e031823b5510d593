"""The misfire policy at claim time (docs/ARCHITECTURE.md rule 12): a fire delivered later than its version's max
lateness, because the relay, the broker or the workers were down, meets the same policy the materializer would
apply."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from core.clock import db_now
from dispatch.engine.claims import Claim, Drop, try_claim
from dispatch.engine.execution import complete
from dispatch.engine.retry import RunResult
from dispatch.models import Occurrence, OccurrenceState

WORKER = "misfire-worker"


@pytest.fixture
def now():
    return db_now().replace(microsecond=0)


@pytest.fixture
def schedule_with(tenant, make_schedule):
    def make(**fields):
        fields = {"name": f"misfire-{uuid.uuid4().hex[:8]}", "max_lateness_seconds": 60, **fields}
        return make_schedule(tenant, **fields)

    return make


@pytest.fixture
def fire(make_occurrence):
    """An enqueued fire `seconds_ago` before now (the relay published it; no worker took it yet)."""

    def add(schedule, now, seconds_ago: int, state: str = OccurrenceState.ENQUEUED, **fields) -> Occurrence:
        return make_occurrence(schedule, at=now - timedelta(seconds=seconds_ago), state=state, **fields)

    return add


def claim(occurrence: Occurrence, now) -> Claim | Drop:
    return try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)


def state_and_reason(occurrence: Occurrence) -> tuple[str, str]:
    occurrence.refresh_from_db()
    return occurrence.state, occurrence.state_reason


def test_a_skip_fire_delivered_later_than_its_max_lateness_is_missed_with_the_rule_in_words(schedule_with, fire, now):
    late = fire(schedule_with(misfire_policy="skip"), now, 612)

    outcome = claim(late, now)

    assert outcome == Drop("missed", OccurrenceState.MISSED)
    assert state_and_reason(late) == (OccurrenceState.MISSED, "late by 612 s > max lateness 60 s (skip)")
    assert late.finished_at == now
    assert not late.attempts.exists()


def test_a_skip_fire_within_its_max_lateness_runs(schedule_with, fire, now):
    assert isinstance(claim(fire(schedule_with(misfire_policy="skip"), now, 59), now), Claim)


def test_the_pipelines_own_latency_is_not_lateness_even_with_zero_max_lateness(settings, schedule_with, fire, now):
    settings.SCHEDULER_CLAIM_LATENESS_GRACE_SECONDS = 5
    schedule = schedule_with(misfire_policy="skip", max_lateness_seconds=0)
    delivered, late = fire(schedule, now, 2), fire(schedule, now, 6)

    assert isinstance(claim(delivered, now), Claim)
    assert claim(late, now).reason == "missed"
    assert state_and_reason(late)[1] == "late by 6 s > max lateness 0 s (skip)"


def test_a_flexible_fire_measures_its_lateness_from_its_release_instant(schedule_with, fire, now):
    schedule = schedule_with(misfire_policy="skip", lane="flexible", flexible_window_seconds=300)
    spread_late = fire(schedule, now, 250, available_at=now - timedelta(seconds=30))
    really_late = fire(schedule, now, 400, available_at=now - timedelta(seconds=90))

    assert isinstance(claim(spread_late, now), Claim)
    assert claim(really_late, now).reason == "missed"
    assert state_and_reason(really_late)[1] == "late by 90 s > max lateness 60 s (skip)"


def test_fire_once_runs_only_the_latest_of_its_late_fires(schedule_with, fire, now):
    schedule = schedule_with(misfire_policy="fire_once")
    older, newer = fire(schedule, now, 600), fire(schedule, now, 540)

    assert claim(older, now).reason == "missed"
    assert isinstance(claim(newer, now), Claim)
    state, reason = state_and_reason(older)
    assert state == OccurrenceState.MISSED
    assert reason == (
        "late by 600 s > max lateness 60 s (fire_once keeps only the latest late fire; a newer one at "
        f"{newer.scheduled_for:%Y-%m-%dT%H:%M:%SZ} is due)"
    )


def test_fire_once_misses_a_late_fire_whose_newer_sibling_already_ran(schedule_with, fire, now):
    """Deliveries are not ordered: the newer fire may be claimed and finished first. The older one is still not
    the latest, and running it would emit two."""
    schedule = schedule_with(misfire_policy="fire_once")
    older, newer = fire(schedule, now, 600), fire(schedule, now, 540)
    first = claim(newer, now)
    complete(first, RunResult("succeeded"), now=now)

    assert claim(older, now).reason == "missed"


def test_fire_once_runs_a_late_fire_when_the_next_fire_is_not_due_yet(schedule_with, fire, now):
    schedule = schedule_with(misfire_policy="fire_once")
    late = fire(schedule, now, 600)
    fire(schedule, now, -30)  # materialized ahead (the horizon), not due

    assert isinstance(claim(late, now), Claim)


def test_catch_up_runs_at_most_catchup_limit_of_the_latest_late_fires(schedule_with, fire, now):
    schedule = schedule_with(misfire_policy="catch_up", catchup_limit=2)
    late = [fire(schedule, now, seconds) for seconds in (500, 400, 300, 200)]

    outcomes = [claim(o, now) for o in late]

    assert [isinstance(o, Claim) for o in outcomes] == [False, False, True, True]
    assert state_and_reason(late[0]) == (
        OccurrenceState.MISSED,
        "late by 500 s > max lateness 60 s (catch_up keeps the latest 2 late fires; at least 2 newer ones exist)",
    )
    assert state_and_reason(late[1])[0] == OccurrenceState.MISSED


def test_catch_up_does_not_count_newer_fires_that_are_on_time(schedule_with, fire, now):
    schedule = schedule_with(misfire_policy="catch_up", catchup_limit=1)
    late = fire(schedule, now, 300)
    fire(schedule, now, 30)  # due, but within the max lateness: not a misfire

    assert isinstance(claim(late, now), Claim)


def test_a_retry_a_manual_trigger_and_a_forced_fire_are_exempt_from_the_lateness_rule(schedule_with, fire, now):
    schedule = schedule_with(misfire_policy="skip")
    retry = fire(schedule, now, 900, state=OccurrenceState.RETRY_WAIT, attempt_count=1)
    manual = fire(schedule, now, 901, manual=True)
    forced = fire(schedule, now, 902, forced=True)

    assert [isinstance(claim(o, now), Claim) for o in (retry, manual, forced)] == [True, True, True]
