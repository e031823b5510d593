"""Upkeep around the workers: one attempt per generation (a unique key), heartbeat rows of dead processes pruned
by the reaper's pass, and a lease that a handler keeps alive while ignoring its cancel event given up at its
maximum lifetime."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction

from core.clock import db_now
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.execution import complete
from dispatch.engine.leases import LeaseRenewer, reap_expired_leases
from dispatch.engine.retry import RunResult
from dispatch.models import Attempt, Occurrence, OccurrenceState, ProcessHeartbeat

WORKER = "upkeep-worker"


@pytest.fixture
def occurrence(tenant, make_schedule, make_occurrence) -> Occurrence:
    schedule = make_schedule(tenant, name="upkeep")
    return make_occurrence(schedule, at=db_now().replace(microsecond=0), state=OccurrenceState.ENQUEUED)


def claimed(occurrence: Occurrence, now=None) -> Claim:
    outcome = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)
    assert isinstance(outcome, Claim), outcome
    return outcome


def test_two_attempts_of_one_occurrence_cannot_share_a_generation(occurrence):
    row = {
        "occurrence_id": occurrence.occurrence_id,
        "scheduled_for": occurrence.scheduled_for,
        "generation": 1,
        "started_at": occurrence.scheduled_for,
    }
    Attempt.objects.create(**row)

    with pytest.raises(IntegrityError, match=r"Key \(occurrence_id, scheduled_for, generation\)"), transaction.atomic():
        Attempt.objects.create(**row)
    Attempt.objects.create(**{**row, "generation": 2})


def test_the_reaper_pass_prunes_heartbeats_of_dead_processes_and_keeps_live_ones(db, settings):
    settings.SCHEDULER_LEASE_SECONDS = 15  # a heartbeat lives 2 leases (30 s): pruned after 10 of those
    now = db_now()
    ProcessHeartbeat.objects.all().delete()
    for name, age in (("long-gone", 301), ("stale", 120), ("live", 1)):
        beat = now - timedelta(seconds=age)
        ProcessHeartbeat.objects.create(name=name, role="materializer", started_at=beat, heartbeat_at=beat)

    reap_expired_leases()

    assert set(ProcessHeartbeat.objects.values_list("name", flat=True)) == {"stale", "live"}


def test_the_renewer_stops_renewing_a_lease_past_its_maximum_lifetime(
    tenant, settings, make_schedule, make_occurrence, occurrence
):
    young = make_occurrence(
        make_schedule(tenant, name="upkeep-young"), at=occurrence.scheduled_for, state=OccurrenceState.ENQUEUED
    )
    renewer = LeaseRenewer()
    settings.SCHEDULER_LEASE_MAX_LIFETIME_SECONDS = 0
    old_ticket = renewer.register(claimed(occurrence), threading.Event(), time.monotonic() + 3600)
    settings.SCHEDULER_LEASE_MAX_LIFETIME_SECONDS = 3600
    young_ticket = renewer.register(claimed(young), threading.Event(), time.monotonic() + 3600)
    renewer.stop()  # rounds are driven by hand below
    old_lease, young_lease = (Occurrence.objects.get(pk=o.pk).lease_expires_at for o in (occurrence, young))

    assert renewer.renew_once() == 1

    assert Occurrence.objects.get(pk=occurrence.pk).lease_expires_at == old_lease
    assert Occurrence.objects.get(pk=young.pk).lease_expires_at > young_lease
    assert old_ticket.cancel_event.is_set() and old_ticket.reason == "lease_max_lifetime"
    assert not young_ticket.cancel_event.is_set()


def test_a_lease_given_up_at_its_maximum_lifetime_is_fenced_once_it_expires(settings, occurrence):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = 30
    settings.SCHEDULER_LEASE_MAX_LIFETIME_SECONDS = 0
    now = db_now()
    claim = claimed(occurrence, now=now - timedelta(seconds=25))  # its lease runs out 5 s from now
    renewer = LeaseRenewer()
    renewer.register(claim, threading.Event(), time.monotonic() + 3600)
    renewer.stop()
    renewer.renew_once()  # a renewal would push the lease 30 s past now

    reap_expired_leases(now=now + timedelta(seconds=10))

    assert complete(claim, RunResult("succeeded")) == "fenced"
    occurrence.refresh_from_db()
    assert (occurrence.state, occurrence.attempt_count) == (OccurrenceState.RETRY_WAIT, 1)
