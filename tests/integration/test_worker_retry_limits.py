"""What bounds retries besides max attempts (docs/ARCHITECTURE.md rule 6): the occurrence deadline and the tenant's
retry budget. Past the deadline an occurrence goes dead; over the budget its retry is delayed, never dropped."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from core.clock import db_now
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.execution import complete
from dispatch.engine.leases import reap_expired_leases
from dispatch.engine.retry import RunResult
from dispatch.models import Occurrence, OccurrenceState
from tenants.models import Tenant

WORKER = "limits-worker"
FLAKY = RunResult("failed", "transient", "TransientError: flaky")


@pytest.fixture(autouse=True)
def _immediate_retries(settings):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 0
    settings.SCHEDULER_RETRY_CAP_SECONDS = 0
    settings.SCHEDULER_OCCURRENCE_DEADLINE_SECONDS = 600


@pytest.fixture
def now():
    return db_now().replace(microsecond=0)


@pytest.fixture
def fire(make_schedule, make_occurrence, now):
    """An enqueued fire of a fresh schedule of `tenant`, `seconds_ago` before now (lateness is not the point here)."""

    def add(tenant: Tenant, seconds_ago: int, state: str = OccurrenceState.ENQUEUED, **fields) -> Occurrence:
        schedule = make_schedule(tenant, name=f"limits-{uuid.uuid4().hex[:8]}", max_lateness_seconds=86400)
        return make_occurrence(schedule, at=now - timedelta(seconds=seconds_ago), state=state, **fields)

    return add


def claimed(occurrence: Occurrence, now) -> Claim:
    outcome = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)
    assert isinstance(outcome, Claim), outcome
    return outcome


def refreshed(occurrence: Occurrence) -> Occurrence:
    occurrence.refresh_from_db()
    return occurrence


# --- deadline -----------------------------------------------------------------------------------------------------


def test_a_transient_failure_past_the_occurrence_deadline_goes_dead_instead_of_retrying(tenant, fire, now):
    within, past = fire(tenant, 500), fire(tenant, 700)

    assert complete(claimed(within, now), FLAKY, now=now) == OccurrenceState.RETRY_WAIT
    assert complete(claimed(past, now), FLAKY, now=now) == OccurrenceState.DEAD

    assert (refreshed(past).state_reason, refreshed(within).state_reason) == ("deadline passed", "")


def test_a_retry_is_not_scheduled_past_the_deadline(tenant, settings, fire, now):
    settings.SCHEDULER_RETRY_CAP_SECONDS = 300
    occurrence = fire(tenant, 590)
    wants_a_minute = RunResult("failed", "transient", "TransientError: slow down", retry_after=60)

    assert complete(claimed(occurrence, now), wants_a_minute, now=now) == OccurrenceState.DEAD

    assert refreshed(occurrence).state_reason == "deadline passed"


def test_the_reaper_sends_an_expired_lease_past_the_deadline_to_dead(tenant, fire, now):
    occurrence = fire(tenant, 300)
    claimed(occurrence, now)

    reap_expired_leases(now=now + timedelta(seconds=400))

    assert (refreshed(occurrence).state, occurrence.state_reason) == (OccurrenceState.DEAD, "deadline passed")


def test_a_retry_delivered_after_the_deadline_is_not_run(tenant, fire, now):
    occurrence = fire(tenant, 700, state=OccurrenceState.RETRY_WAIT, attempt_count=1)

    outcome = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)

    assert not isinstance(outcome, Claim) and outcome.state == OccurrenceState.DEAD
    assert refreshed(occurrence).state_reason == "deadline passed"


def test_a_forced_occurrence_keeps_its_retries_long_after_its_scheduled_time(tenant, fire, now):
    """Backfill and replay re-drive fires days old: a deadline counted from scheduled_for would kill them at the
    first transient error. Max attempts still bounds them."""
    replayed = fire(tenant, 3 * 86400, forced=True)

    assert complete(claimed(replayed, now), FLAKY, now=now) == OccurrenceState.RETRY_WAIT


def test_an_occurrence_out_of_attempts_says_so(tenant, make_schedule, make_occurrence, now):
    schedule = make_schedule(tenant, name="limits-exhausted", max_attempts=1)
    occurrence = make_occurrence(schedule, at=now, state=OccurrenceState.ENQUEUED)

    assert complete(claimed(occurrence, now), FLAKY, now=now) == OccurrenceState.DEAD
    assert refreshed(occurrence).state_reason == "attempts exhausted (1 of 1)"


# --- tenant retry budget ------------------------------------------------------------------------------------------


def minute_of(instant):
    return instant.replace(second=0, microsecond=0)


def test_retries_over_the_tenant_budget_are_delayed_to_a_later_minute_not_dropped(tenant, fire, now):
    Tenant.objects.filter(pk=tenant.pk).update(max_retries_per_minute=2)
    occurrences = [fire(tenant, 10 + n) for n in range(5)]

    outcomes = [complete(claimed(o, now), FLAKY, now=now) for o in occurrences]

    assert outcomes == [OccurrenceState.RETRY_WAIT] * 5
    retry_at = [refreshed(o).available_at for o in occurrences]
    this_minute = minute_of(now)
    assert retry_at[:2] == [now, now]
    # Paced inside the minute they were pushed to: two per minute, half a minute apart.
    assert retry_at[2:] == [
        this_minute + timedelta(seconds=60),
        this_minute + timedelta(seconds=90),
        this_minute + timedelta(seconds=120),
    ]
    assert occurrences[2].state_reason == "retry delayed by the tenant's retry budget (2 per minute)"
    assert occurrences[0].state_reason == ""


def test_a_tenant_without_a_budget_is_not_paced(tenant, fire, now):
    assert Tenant.objects.get(pk=tenant.pk).max_retries_per_minute == 0  # 0 = unlimited, the default
    occurrences = [fire(tenant, 10 + n) for n in range(3)]

    for occurrence in occurrences:
        complete(claimed(occurrence, now), FLAKY, now=now)

    assert {refreshed(o).available_at for o in occurrences} == {now}


def test_one_tenants_budget_does_not_delay_another_tenants_retries(tenant, tenant_b, fire, now):
    Tenant.objects.filter(pk=tenant.pk).update(max_retries_per_minute=1)
    mine = [fire(tenant, 10 + n) for n in range(2)]
    theirs = fire(tenant_b.tenant, 10)

    for occurrence in [*mine, theirs]:
        complete(claimed(occurrence, now), FLAKY, now=now)

    assert refreshed(mine[1]).available_at == minute_of(now) + timedelta(seconds=60)
    assert refreshed(theirs).available_at == now


def clear_budget(tenant_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM dispatch_tenant_retry_window WHERE tenant_id = %s", [tenant_id])


@pytest.mark.django_db(transaction=True)
def test_workers_completing_at_once_never_exceed_the_budget(tenant_a, fire, now):
    tenant = tenant_a.tenant
    Tenant.objects.filter(pk=tenant.pk).update(max_retries_per_minute=3)
    clear_budget(tenant.id)
    occurrences = [fire(tenant, 10 + n) for n in range(8)]
    claims = [claimed(o, now) for o in occurrences]
    barrier = threading.Barrier(len(claims))
    errors: list[BaseException] = []

    def complete_in_thread(claim: Claim) -> None:
        try:
            barrier.wait(timeout=10)
            complete(claim, FLAKY, now=now)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=complete_in_thread, args=(c,)) for c in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert not errors, errors
        rows = [refreshed(o) for o in occurrences]
        assert {o.state for o in rows} == {OccurrenceState.RETRY_WAIT}
        per_minute = Counter(minute_of(o.available_at) for o in rows)
        assert sorted(per_minute.values()) == [2, 3, 3]
    finally:
        clear_budget(tenant.id)
