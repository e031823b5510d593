"""An occurrence runs under its own version's definition: backfilled and replayed fires of an older version keep
the handler, payload and attempt limit they were created with, whatever the schedule says now."""

from __future__ import annotations

import uuid
from datetime import timedelta

from core.clock import db_now
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.leases import reap_expired_leases
from dispatch.models import OccurrenceState
from schedules import services

WORKER = "versions-worker"


def claim_at(occurrence, now) -> Claim:
    outcome = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)
    assert isinstance(outcome, Claim), outcome
    return outcome


def old_version_fire(make_schedule, make_occurrence, tenant, now, v1: dict, v2: dict):
    """A forced (backfilled) fire of version 1 of a schedule that has since been updated to version 2."""
    schedule = make_schedule(tenant, name=f"versions-{uuid.uuid4().hex[:8]}", **v1)
    occurrence = make_occurrence(
        schedule, at=now - timedelta(minutes=3), version=1, state=OccurrenceState.SCHEDULED, forced=True
    )
    services.update_schedule(schedule, v2, actor="test")
    return occurrence


def test_a_backfilled_fire_of_an_older_version_runs_that_versions_handler_payload_and_attempts(
    tenant, make_schedule, make_occurrence
):
    now = db_now()
    occurrence = old_version_fire(
        make_schedule,
        make_occurrence,
        tenant,
        now,
        v1={"handler": "log", "payload": {"report": "v1"}, "max_attempts": 2},
        v2={"handler": "noop", "payload": {"report": "v2"}, "max_attempts": 9},
    )

    claimed = claim_at(occurrence, now)

    assert (claimed.handler, claimed.payload, claimed.max_attempts) == ("log", {"report": "v1"}, 2)
    assert claimed.schedule_version == 1


def test_a_fire_of_the_current_version_runs_the_current_definition(tenant, make_schedule, make_occurrence):
    now = db_now()
    schedule = make_schedule(tenant, name="versions-current", handler="noop", payload={"n": 1})
    services.update_schedule(schedule, {"handler": "log", "payload": {"n": 2}, "max_attempts": 4}, actor="test")
    schedule.refresh_from_db()
    occurrence = make_occurrence(schedule, at=now - timedelta(seconds=5), state=OccurrenceState.ENQUEUED)

    claimed = claim_at(occurrence, now)

    assert (claimed.handler, claimed.payload, claimed.max_attempts, claimed.schedule_version) == (
        "log",
        {"n": 2},
        4,
        2,
    )


def test_the_reaper_counts_attempts_against_the_occurrences_own_version(tenant, make_schedule, make_occurrence):
    now = db_now()
    occurrence = old_version_fire(
        make_schedule, make_occurrence, tenant, now, v1={"max_attempts": 1}, v2={"max_attempts": 5}
    )
    claim_at(occurrence, now)

    reap_expired_leases(now=now + timedelta(hours=1))

    occurrence.refresh_from_db()
    assert occurrence.state == OccurrenceState.DEAD
    assert occurrence.state_reason == "attempts exhausted (1 of 1)"
