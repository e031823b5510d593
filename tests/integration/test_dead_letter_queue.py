"""The dead-letter queue below the console (dispatch/dlq.py): what resolving refuses, what leaves the queue with it
(the dashboard, /metrics, `replay --dead`), that each death is resolved apart, that the retention takes resolutions
with their day; and the words of a fire out of attempts after replays ("3 of 1" was the generation against the
limit of one run)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection

from core.clock import db_now
from dispatch import dashboard, partitions
from dispatch.dlq import NOTE_MAX_LENGTH, in_dead_letter_queue
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.execution import complete
from dispatch.engine.leases import reap_expired_leases
from dispatch.engine.retry import RunResult
from dispatch.models import Occurrence, OccurrenceResolution, OccurrenceState
from dispatch.occurrences import replay_dead, replay_dead_occurrence
from dispatch.services import ResolveRefused, resolve_dead_occurrence
from schedules import services as schedule_services
from tests.integration.test_metrics import scrape
from tests.integration.test_upkeep import command, days_of

WORKER = "dlq-worker"
FLAKY = RunResult("failed", "transient", "TransientError: flaky")
BROKEN = RunResult("failed", "permanent", "PermanentError: bad payload")


def resolve(occurrence: Occurrence, note: str = "handled by hand") -> OccurrenceResolution:
    return resolve_dead_occurrence(occurrence.occurrence_id, note=note, actor="operator:test", now=db_now())


def dead_fire(make_schedule, make_occurrence, tenant, minutes_ago: int = 5, **fields) -> Occurrence:
    """A dead fire of a schedule of its own; `fields` are the occurrence's."""
    schedule = make_schedule(tenant, name=f"dlq-{uuid.uuid4().hex[:8]}")
    at = db_now() - timedelta(minutes=minutes_ago)
    return make_occurrence(schedule, at=at, state=OccurrenceState.DEAD, **fields)


def in_queue() -> set[uuid.UUID]:
    return set(in_dead_letter_queue(Occurrence.objects.all()).values_list("occurrence_id", flat=True))


# --- resolving ----------------------------------------------------------------------------------------------------


def test_resolving_refuses_what_is_not_a_dead_fire_in_the_queue_and_a_note_that_says_nothing(
    tenant, make_schedule, make_occurrence
):
    occurrence = dead_fire(make_schedule, make_occurrence, tenant)
    finished = make_occurrence(occurrence.schedule, at=db_now(), state=OccurrenceState.SUCCEEDED)

    refusals = {
        "empty note": ("  ", occurrence.occurrence_id),
        "long note": ("x" * (NOTE_MAX_LENGTH + 1), occurrence.occurrence_id),
        "not dead": ("why", finished.occurrence_id),
        "unknown": ("why", uuid.uuid4()),
    }
    for case, (note, occurrence_id) in refusals.items():
        with pytest.raises(ResolveRefused):
            resolve_dead_occurrence(occurrence_id, note=note, actor="operator:test", now=db_now())
        assert not OccurrenceResolution.objects.exists(), case
    resolve(occurrence)
    with pytest.raises(ResolveRefused, match="already resolved by operator:test"):
        resolve(occurrence, "again")
    assert OccurrenceResolution.objects.count() == 1


def test_a_resolved_fire_leaves_the_dashboard_metrics_and_replay_dead_but_a_replay_by_id_runs_it(
    tenant, make_schedule, make_occurrence
):
    resolved = dead_fire(make_schedule, make_occurrence, tenant)
    waiting = dead_fire(make_schedule, make_occurrence, tenant)
    assert (dashboard.build().dead, scrape()["scheduler_dlq_occurrences"]) == (2, 2)

    resolve(resolved)

    assert in_queue() == {waiting.occurrence_id}
    assert (dashboard.build().dead, scrape()["scheduler_dlq_occurrences"]) == (1, 1)
    assert replay_dead().replayed == 1, "replay --dead replays the queue, not what an operator set aside"
    assert Occurrence.objects.get(pk=resolved.pk).state == OccurrenceState.DEAD
    replay_dead_occurrence(resolved.occurrence_id, now=db_now())
    assert Occurrence.objects.get(pk=resolved.pk).state == OccurrenceState.SCHEDULED


def test_replay_dead_counts_only_the_unresolved_fires_of_canceled_schedules(tenant, make_schedule, make_occurrence):
    first = dead_fire(make_schedule, make_occurrence, tenant)
    second = make_occurrence(first.schedule, at=first.scheduled_for - timedelta(minutes=1), state="dead")
    schedule_services.cancel_schedule(first.schedule, actor="test")
    assert replay_dead().left_canceled == 2

    resolve(first)

    assert replay_dead().left_canceled == 1
    assert in_queue() == {second.occurrence_id}


def test_each_death_is_resolved_apart(tenant, make_schedule, make_occurrence):
    """A resolution holds for the generation the fire died at: replayed and dead again, it is back in the queue."""
    occurrence = dead_fire(make_schedule, make_occurrence, tenant, attempt_count=1)
    resolve(occurrence, "first death")
    replay_dead_occurrence(occurrence.occurrence_id, now=db_now())
    Occurrence.objects.filter(pk=occurrence.pk).update(state=OccurrenceState.DEAD, attempt_count=2)

    assert in_queue() == {occurrence.occurrence_id}
    resolve(occurrence, "second death")
    assert in_queue() == set()
    assert list(OccurrenceResolution.objects.order_by("resolved_at").values_list("attempt_count", "note")) == [
        (1, "first death"),
        (2, "second death"),
    ]


# --- the words of a fire out of attempts ---------------------------------------------------------------------------


def claimed(occurrence: Occurrence, now) -> Claim:
    outcome = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)
    assert isinstance(outcome, Claim), outcome
    return outcome


def reason(occurrence: Occurrence) -> tuple[str, str]:
    occurrence.refresh_from_db()
    return occurrence.state, occurrence.state_reason


@pytest.fixture
def immediate_retries(settings):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 0
    settings.SCHEDULER_RETRY_CAP_SECONDS = 0


def test_attempts_a_replay_allowed_are_counted_as_allowed_never_as_3_of_1(
    tenant, make_schedule, make_occurrence, immediate_retries
):
    schedule = make_schedule(tenant, name="one-attempt", max_attempts=1)
    now = db_now()
    occurrence = make_occurrence(schedule, at=now - timedelta(seconds=5), state=OccurrenceState.ENQUEUED)
    complete(claimed(occurrence, now), FLAKY, now=now)
    assert reason(occurrence) == ("dead", "attempts exhausted (1 of 1)")

    replay_dead_occurrence(occurrence.occurrence_id, now=now)
    complete(claimed(occurrence, now + timedelta(seconds=1)), FLAKY, now=now + timedelta(seconds=1))
    assert reason(occurrence) == ("dead", "attempts exhausted (2 of 2: max_attempts 1 + 1 by replay)")

    # The reaper's words (SQL) for a worker that died on its third attempt, after a second replay.
    replay_dead_occurrence(occurrence.occurrence_id, now=now)
    claimed(occurrence, now + timedelta(seconds=2))
    reap_expired_leases(now=now + timedelta(hours=1))
    assert reason(occurrence) == ("dead", "attempts exhausted (3 of 3: max_attempts 1 + 2 by replay)")

    replay_dead_occurrence(occurrence.occurrence_id, now=now)
    complete(claimed(occurrence, now + timedelta(hours=2)), BROKEN, now=now + timedelta(hours=2))
    assert reason(occurrence) == ("dead", "permanent error (attempt 4 of 4: max_attempts 1 + 3 by replay)")


def test_the_limit_named_is_the_occurrences_own_versions_after_the_schedule_changed_it(
    tenant, make_schedule, make_occurrence, immediate_retries
):
    """A replayed fire of version 1 (max_attempts 1) runs under version 1 although the schedule now allows 5."""
    schedule = make_schedule(tenant, name="changed-limit", max_attempts=1)
    now = db_now()
    occurrence = make_occurrence(schedule, at=now - timedelta(seconds=5), state=OccurrenceState.ENQUEUED)
    complete(claimed(occurrence, now), FLAKY, now=now)
    schedule_services.update_schedule(schedule, {"max_attempts": 5}, actor="test")

    replay_dead_occurrence(occurrence.occurrence_id, now=now)
    complete(claimed(occurrence, now + timedelta(seconds=1)), FLAKY, now=now + timedelta(seconds=1))

    assert reason(occurrence) == ("dead", "attempts exhausted (2 of 2: max_attempts 1 + 1 by replay)")


# --- retention ----------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_day_dropped_past_the_retention_takes_its_resolutions_and_keeps_the_others(
    tenant_a, make_schedule, make_occurrence
):
    old = db_now() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 7)
    partitions.ensure_partitions(connection, old.date(), old.date())
    gone = dead_fire(make_schedule, make_occurrence, tenant_a.tenant, minutes_ago=(db_now() - old).days * 1440)
    recent = dead_fire(make_schedule, make_occurrence, tenant_a.tenant)
    resolve(gone)
    resolve(recent)

    command("prune_occurrences")

    assert old.date() not in days_of()
    assert list(OccurrenceResolution.objects.values_list("occurrence_id", flat=True)) == [recent.occurrence_id]
