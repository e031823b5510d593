"""Overlap edge cases: a retry is not a new overlapping fire (it waits, never skipped), and queue_one's held
occurrence runs before any newer fire of its schedule (FIFO), released as soon as its predecessor finishes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from core.clock import db_now
from dispatch.engine.claims import Claim, Drop, try_claim
from dispatch.engine.execution import complete
from dispatch.engine.retry import RunResult
from dispatch.models import Occurrence, OccurrenceState, OutboxMessage

WORKER = "overlap-worker"


@pytest.fixture(autouse=True)
def _quick_retries(settings):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 0
    settings.SCHEDULER_OVERLAP_RECHECK_SECONDS = 5


@pytest.fixture
def now():
    return db_now().replace(microsecond=0)


@pytest.fixture
def fires(tenant, make_schedule, make_occurrence, now):
    """`count` enqueued fires, ten seconds apart and all due, of a fresh schedule with `overlap_policy`."""

    def make(overlap_policy: str, count: int) -> list[Occurrence]:
        schedule = make_schedule(
            tenant, name=f"overlap-{uuid.uuid4().hex[:8]}", overlap_policy=overlap_policy, max_lateness_seconds=3600
        )
        return [
            make_occurrence(schedule, at=now - timedelta(seconds=60 - 10 * n), state=OccurrenceState.ENQUEUED)
            for n in range(count)
        ]

    return make


def claim(occurrence: Occurrence, now) -> Claim | Drop:
    return try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)


def claimed(occurrence: Occurrence, now) -> Claim:
    outcome = claim(occurrence, now)
    assert isinstance(outcome, Claim), outcome
    return outcome


def refreshed(occurrence: Occurrence) -> Occurrence:
    occurrence.refresh_from_db()
    return occurrence


def envelopes_for(occurrence: Occurrence) -> int:
    return OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence.occurrence_id]).count()


@pytest.mark.parametrize("policy", ["skip_if_running", "queue_one"])
def test_a_retry_that_meets_a_running_sibling_waits_for_it_instead_of_being_skipped(fires, now, policy):
    first, second, third = fires(policy, 3)
    failed = claimed(first, now)
    assert complete(failed, RunResult("failed", "transient", "flaky"), now=now) == OccurrenceState.RETRY_WAIT
    running = claimed(second, now)
    if policy == "queue_one":
        assert claim(third, now).reason == "overlap_waiting"  # the held one: the retry must not count as it

    assert claim(first, now).reason == "overlap_waiting"

    waiting = refreshed(first)
    assert (waiting.state, waiting.attempt_count) == (OccurrenceState.RETRY_WAIT, 1)
    assert waiting.state_reason == f"overlap: waiting for occurrence {second.occurrence_id} ({policy})"
    complete(running, RunResult("succeeded"), now=now)
    assert claimed(first, now + timedelta(seconds=5)).generation == 2


def test_skip_if_running_records_which_occurrence_was_running(fires, now):
    first, second = fires("skip_if_running", 2)
    claimed(first, now)

    assert claim(second, now) == Drop("overlap_skipped", OccurrenceState.SKIPPED_OVERLAP)
    assert refreshed(second).state_reason == (
        f"overlap: occurrence {first.occurrence_id} still running (skip_if_running)"
    )


def test_queue_one_runs_its_held_occurrence_before_a_newer_fire(fires, now):
    first, held, newer = fires("queue_one", 3)
    running = claimed(first, now)
    assert claim(held, now).reason == "overlap_waiting"
    complete(running, RunResult("succeeded"), now=now + timedelta(seconds=1))

    # The newer fire arrives before the held one's next offer: it must not overtake it.
    assert claim(newer, now + timedelta(seconds=2)) == Drop("overlap_skipped", OccurrenceState.SKIPPED_OVERLAP)
    assert refreshed(newer).state_reason == f"overlap: occurrence {held.occurrence_id} is queued ahead (queue_one)"
    assert claimed(held, now + timedelta(seconds=3)).generation == 1


def test_queue_one_releases_its_held_occurrence_as_soon_as_the_running_one_finishes(fires, now):
    first, held = fires("queue_one", 2)
    running = claimed(first, now)
    assert claim(held, now).reason == "overlap_waiting"
    assert (refreshed(held).available_at, envelopes_for(held)) == (now + timedelta(seconds=5), 1)

    complete(running, RunResult("succeeded"), now=now + timedelta(seconds=1))

    assert (refreshed(held).available_at, envelopes_for(held)) == (now + timedelta(seconds=1), 2)
    assert claimed(held, now + timedelta(seconds=1)).generation == 1
