"""Tenant quotas enforced by the engine, decision by decision: max_running at claim, max_catchup_per_minute across
schedules, materializers and backfill. (The relays' fire rate and the workers' running count with real processes
are in test_quotas_processes.py.)"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from core.clock import db_now
from dispatch.backfill import backfill_schedule
from dispatch.engine.claims import Claim, Drop, claim_many, try_claim
from dispatch.engine.execution import complete
from dispatch.engine.leases import reap_expired_leases
from dispatch.engine.materializer import Materializer
from dispatch.engine.retry import RunResult
from dispatch.models import Attempt, Occurrence, OccurrenceState, OutboxMessage, ProcessHeartbeat, ShardLease
from tenants.models import Tenant

WORKER = "quota-worker"
MINUTE = timedelta(minutes=1)


def running_count(tenant: Tenant) -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT running, throttled_claims FROM dispatch_tenant_running WHERE tenant_id = %s", [tenant.id]
        )
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, 0)


@pytest.fixture
def quota_tenant(tenant_a) -> Tenant:
    tenant = tenant_a.tenant
    tenant.max_running = 2
    tenant.save(update_fields=["max_running"])
    return tenant


@pytest.fixture
def enqueued(make_schedule, make_occurrence):
    def add(tenant: Tenant, count: int) -> list[Occurrence]:
        now = db_now().replace(microsecond=0)
        return [
            make_occurrence(
                make_schedule(tenant, name=f"quota-{uuid.uuid4().hex[:8]}", max_lateness_seconds=86400),
                at=now - timedelta(seconds=5),
                state=OccurrenceState.ENQUEUED,
            )
            for _ in range(count)
        ]

    return add


# --- max_running --------------------------------------------------------------------------------------------------


def test_an_envelope_claimed_at_once_gets_only_the_slots_left_and_the_rest_waits_with_no_attempt(
    quota_tenant, enqueued
):
    first = enqueued(quota_tenant, 1)[0]
    assert isinstance(try_claim(first.occurrence_id, first.scheduled_for, WORKER), Claim)
    occurrences = enqueued(quota_tenant, 5)

    batch = claim_many([(o.occurrence_id, o.scheduled_for) for o in occurrences], WORKER)

    assert [c.occurrence_id for c in batch.claims] == [occurrences[0].occurrence_id], "one slot was left of two"
    assert [(d.reason, d.state) for _, d in batch.drops] == [("running_quota", OccurrenceState.RETRY_WAIT)] * 4
    assert running_count(quota_tenant) == (2, 4)
    for occurrence in occurrences[1:]:
        occurrence.refresh_from_db()
        assert (occurrence.state, occurrence.attempt_count) == (OccurrenceState.RETRY_WAIT, 0)
        assert not Attempt.objects.filter(occurrence_id=occurrence.occurrence_id).exists(), "its claim was undone"
        assert OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence.occurrence_id]).exists()
    claimed = Occurrence.objects.get(pk=occurrences[0].pk)
    assert (claimed.state, claimed.attempt_count) == (OccurrenceState.RUNNING, 1)
    assert list(Attempt.objects.filter(occurrence_id=claimed.occurrence_id).values_list("generation", flat=True)) == [1]


def test_claims_over_max_running_wait_in_retry_wait_with_their_attempts_untouched(quota_tenant, enqueued):
    occurrences = enqueued(quota_tenant, 4)
    outcomes = [try_claim(o.occurrence_id, o.scheduled_for, WORKER) for o in occurrences]

    claims = [o for o in outcomes if isinstance(o, Claim)]
    waits = [o for o in outcomes if isinstance(o, Drop)]
    assert len(claims) == 2
    assert [(d.reason, d.state) for d in waits] == [("running_quota", OccurrenceState.RETRY_WAIT)] * 2
    assert running_count(quota_tenant) == (2, 2)
    for occurrence in occurrences[2:]:
        occurrence.refresh_from_db()
        assert occurrence.attempt_count == 0, "waiting for a slot consumes no attempt"
        assert occurrence.state_reason == "throttled: the tenant's max_running quota is reached"
        assert occurrence.available_at > db_now(), "offered again later, not at once (no busy loop)"
        assert OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence.occurrence_id]).exists(), (
            "its envelope for the next offer commits with the wait"
        )


def test_a_completion_gives_its_slot_back_and_the_waiting_occurrence_then_runs(quota_tenant, enqueued):
    first, second, third = enqueued(quota_tenant, 3)
    claim = try_claim(first.occurrence_id, first.scheduled_for, WORKER)
    assert isinstance(try_claim(second.occurrence_id, second.scheduled_for, WORKER), Claim)
    assert isinstance(try_claim(third.occurrence_id, third.scheduled_for, WORKER), Drop)

    assert complete(claim, RunResult("succeeded")) == OccurrenceState.SUCCEEDED
    assert running_count(quota_tenant)[0] == 1
    third.refresh_from_db()
    retried = try_claim(third.occurrence_id, third.scheduled_for, WORKER, now=third.available_at)
    assert isinstance(retried, Claim)
    assert retried.generation == 1, "its first attempt, after waiting"
    assert running_count(quota_tenant)[0] == 2


def test_a_waiting_occurrence_is_never_missed_or_dead_because_of_the_quota(quota_tenant, enqueued):
    occurrences = enqueued(quota_tenant, 3)
    for occurrence in occurrences:
        try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER)
    waiting = occurrences[2]
    waiting.refresh_from_db()
    # A day later (far past max lateness and the occurrence deadline) it is still only waiting.
    much_later = waiting.available_at + timedelta(days=1)
    outcome = try_claim(waiting.occurrence_id, waiting.scheduled_for, WORKER, now=much_later)
    assert isinstance(outcome, Drop) and outcome.reason == "running_quota"
    waiting.refresh_from_db()
    assert (waiting.state, waiting.attempt_count) == (OccurrenceState.RETRY_WAIT, 0)
    wait = (waiting.available_at - much_later).total_seconds()
    assert 0.75 * 30 <= wait <= 1.25 * 30, "the wait grew with how long it has waited, up to the cap"


def test_the_reaper_gives_back_the_slot_of_a_dead_worker(quota_tenant, enqueued):
    (first,) = enqueued(quota_tenant, 1)
    claim = try_claim(first.occurrence_id, first.scheduled_for, WORKER)
    assert isinstance(claim, Claim)
    assert running_count(quota_tenant)[0] == 1
    reap_expired_leases(now=claim.lease_expires_at + timedelta(seconds=1))
    first.refresh_from_db()
    assert first.state == OccurrenceState.RETRY_WAIT
    assert running_count(quota_tenant)[0] == 0


def test_a_takeover_over_an_expired_lease_keeps_the_slot_it_inherits(quota_tenant, enqueued):
    (occurrence,) = enqueued(quota_tenant, 1)
    claim = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER)
    assert isinstance(claim, Claim)
    later = claim.lease_expires_at + timedelta(seconds=1)
    again = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, "second-worker", now=later)
    assert isinstance(again, Claim) and again.generation == 2
    assert running_count(quota_tenant)[0] == 1, "one occurrence running, counted once"
    complete(again, RunResult("succeeded"))
    assert running_count(quota_tenant)[0] == 0


def test_a_fenced_completion_gives_back_nothing(quota_tenant, enqueued):
    (occurrence,) = enqueued(quota_tenant, 1)
    claim = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER)
    later = claim.lease_expires_at + timedelta(seconds=1)
    newer = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, "second-worker", now=later)
    assert complete(claim, RunResult("succeeded")) == "fenced"
    assert running_count(quota_tenant)[0] == 1, "the newer attempt still runs"
    complete(newer, RunResult("succeeded"))
    assert running_count(quota_tenant)[0] == 0


# --- max_catchup_per_minute ---------------------------------------------------------------------------------------

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)


def release_minutes(tenant: Tenant) -> Counter:
    late = NOW - timedelta(seconds=60)  # the schedules' max lateness: older fires are catch-up fires
    rows = Occurrence.objects.filter(tenant_id=tenant.id, state=OccurrenceState.SCHEDULED, scheduled_for__lt=late)
    return Counter(o.available_at.replace(second=0, microsecond=0) for o in rows)


def materializers_splitting_the_shards(count: int, batch_size: int) -> list[Materializer]:
    ProcessHeartbeat.objects.all().delete()
    ShardLease.objects.update(owner="", expires_at=None)
    fleet = [Materializer(f"catchup-{n}", batch_size=batch_size) for n in range(count)]
    for _ in range(3):  # each takes its fair share once all have a heartbeat
        for materializer in fleet:
            materializer.maintain_leases()
    assert sum(len(m.leases) for m in fleet) > 0
    return fleet


def test_one_catch_up_budget_per_tenant_across_schedules_batches_and_materializers(tenant_a, make_schedule):
    tenant = tenant_a.tenant
    tenant.max_catchup_per_minute = 60
    tenant.save(update_fields=["max_catchup_per_minute"])
    for n in range(100):
        make_schedule(
            tenant,
            name=f"behind-{n}",
            now=NOW - 20 * MINUTE,
            misfire_policy="catch_up",
            catchup_limit=9,
            max_lateness_seconds=60,
        )
    fleet = materializers_splitting_the_shards(2, batch_size=7)
    while any([m.step(now=NOW) for m in fleet]):
        pass

    minutes = release_minutes(tenant)
    assert sum(minutes.values()) == 900, "each schedule catches up its latest 9 late fires"
    assert max(minutes.values()) <= 60, f"at most the quota is released in any minute: {minutes}"
    assert len(minutes) == 15, "900 fires at 60 a minute take 15 minutes"
    assert min(minutes) == NOW.replace(second=0), "the pacing starts at once"


def test_a_backfill_takes_the_same_budget_after_the_materializer(tenant_a, make_schedule):
    tenant = tenant_a.tenant
    tenant.max_catchup_per_minute = 10
    tenant.save(update_fields=["max_catchup_per_minute"])
    now = db_now()
    schedule = make_schedule(tenant, name="backfilled", now=now - 60 * MINUTE)
    result = backfill_schedule(schedule.id, since=now - 60 * MINUTE, until=now - 30 * MINUTE)
    assert result.created == 30
    rows = Occurrence.objects.filter(schedule=schedule, forced=True)
    minutes = Counter(o.available_at.replace(second=0, microsecond=0) for o in rows)
    assert max(minutes.values()) <= 10 and len(minutes) >= 3, minutes
    envelope_release = {
        occurrence_id: message.available_at
        for message in OutboxMessage.objects.filter(tenant_id=tenant.id)
        for occurrence_id in message.occurrence_ids
    }
    assert all(envelope_release[o.occurrence_id] == o.available_at for o in rows), "row and message agree"


# --- max_schedules ----------------------------------------------------------------------------------------------


def held(tenant: Tenant) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT held FROM schedules_tenant_schedule_count WHERE tenant_id = %s", [tenant.id])
        row = cursor.fetchone()
    return row[0] if row else 0


def test_the_schedule_counter_follows_every_writer_without_counting_rows(tenant_a, make_schedule):
    from schedules.models import Schedule
    from schedules.services import cancel_schedule, pause_schedule, resume_schedule

    tenant = tenant_a.tenant
    start = held(tenant)
    first = make_schedule(tenant, name="counted-1")
    second = make_schedule(tenant, name="counted-2")
    assert held(tenant) == start + 2
    pause_schedule(first, actor="test")
    assert held(tenant) == start + 2, "paused schedules still count"
    resume_schedule(first, actor="test")
    cancel_schedule(second, actor="test")
    assert held(tenant) == start + 1
    # A bulk write outside the services (the materializer completing one-offs does this) is counted too.
    Schedule.objects.filter(pk=first.pk).update(state="completed")
    assert held(tenant) == start
    Schedule.objects.filter(pk=first.pk).delete()
    assert held(tenant) == start
    assert held(tenant) == Schedule.objects.filter(tenant=tenant, state__in=["active", "paused"]).count()


def test_the_quota_refuses_the_create_past_max_schedules(tenant_a, make_schedule, api_a, cron_body):
    tenant = tenant_a.tenant
    Tenant.objects.filter(pk=tenant.pk).update(max_schedules=held(tenant) + 1)
    assert api_a.post("/api/v1/schedules/", cron_body, format="json").status_code == 201
    refused = api_a.post("/api/v1/schedules/", {**cron_body, "name": "one too many"}, format="json")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"]
