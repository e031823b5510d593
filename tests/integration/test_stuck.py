"""Stuck occurrences: reconcile reports what sits unfinished long after its time, `replay --stuck` re-drives it
under the same id, and the worker's claim runs it once."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core.clock import db_now
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.execution import complete, run_claimed
from dispatch.models import Attempt, Occurrence, OccurrenceState, OutboxMessage
from dispatch.reconcile import reconcile
from tests.handlers import effects, ensure_effects_table
from tests.integration.fleet import running_fleet
from tests.support import wait_for

STUCK_AFTER = 900


@pytest.fixture
def now():
    return db_now()


@pytest.fixture
def mixed(tenant_a, make_schedule, make_occurrence, now):
    """One occurrence stuck in each way the contract names, and one healthy neighbour for each."""
    # The default misfire policy (skip, 60 s of lateness): a re-driven fire runs all the same.
    schedule = make_schedule(tenant_a.tenant, name="mixed")
    old = now - timedelta(hours=1)
    fresh = now - timedelta(minutes=1)
    stuck = {
        "scheduled": make_occurrence(schedule, at=old, state=OccurrenceState.SCHEDULED),
        "enqueued": make_occurrence(schedule, at=old + timedelta(minutes=1), state=OccurrenceState.ENQUEUED),
        "running": make_occurrence(
            schedule,
            at=old + timedelta(minutes=2),
            state=OccurrenceState.RUNNING,
            attempt_count=1,
            lease_expires_at=now - timedelta(minutes=20),
        ),
        "retry_wait": make_occurrence(
            schedule,
            at=old + timedelta(minutes=3),
            state=OccurrenceState.RETRY_WAIT,
            attempt_count=1,
            available_at=now - timedelta(minutes=16),
        ),
    }
    healthy = [
        make_occurrence(schedule, at=fresh, state=OccurrenceState.SCHEDULED),
        make_occurrence(
            schedule,
            at=old + timedelta(minutes=4),
            state=OccurrenceState.RUNNING,
            attempt_count=1,
            lease_expires_at=now + timedelta(seconds=20),
        ),
        make_occurrence(
            schedule,
            at=old + timedelta(minutes=5),
            state=OccurrenceState.RETRY_WAIT,
            attempt_count=2,
            available_at=now + timedelta(minutes=5),
        ),
        make_occurrence(schedule, at=old + timedelta(minutes=6), state=OccurrenceState.SUCCEEDED),
        make_occurrence(schedule, at=old + timedelta(minutes=7), state=OccurrenceState.DEAD),
    ]
    return schedule, stuck, healthy


def test_reconcile_reports_each_kind_of_stuck_occurrence_with_its_state_and_age(mixed, now):
    _, stuck, _ = mixed
    report = reconcile(since=now - timedelta(hours=2), until=now, now=now, stuck_after_seconds=STUCK_AFTER)

    assert report.stuck == 4
    assert report.stuck_by_state == {"scheduled": 1, "enqueued": 1, "running": 1, "retry_wait": 1}
    assert {row.occurrence_id for row in report.stuck_samples} == {o.occurrence_id for o in stuck.values()}
    ages = {row.state: row.stuck_for_seconds for row in report.stuck_samples}
    assert ages["running"] == pytest.approx(20 * 60, abs=1)
    assert ages["retry_wait"] == pytest.approx(16 * 60, abs=1)
    assert not report.ok, "a stuck occurrence fails the run like a gap"


def test_a_longer_stuck_after_reports_only_what_is_older_than_it(mixed, now):
    report = reconcile(since=now - timedelta(hours=2), until=now, now=now, stuck_after_seconds=17 * 60)
    assert report.stuck_by_state == {"scheduled": 1, "enqueued": 1, "running": 1}


def test_the_reconcile_command_lists_stuck_occurrences_and_exits_one(mixed, now):
    since = (now - timedelta(hours=2)).isoformat()
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("reconcile", "--since", since, "--until", now.isoformat(), "--json", stdout=out)
    assert exited.value.code == 1
    payload = json.loads(out.getvalue())
    assert payload["stuck"] == 4 and payload["stuck_after_seconds"] == STUCK_AFTER
    assert {"occurrence_id", "state", "age_seconds"} <= set(payload["stuck_samples"][0])

    text = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("reconcile", "--since", since, "--until", now.isoformat(), "--stuck-after", "600", stdout=text)
    assert "STUCK: 4 occurrences" in text.getvalue()
    assert "replay --stuck" in text.getvalue()


def test_a_bad_stuck_after_is_a_clear_command_error(db):
    with pytest.raises(CommandError, match="--stuck-after must be a number of seconds"):
        call_command(
            "reconcile", "--since", "2026-01-01T00:00:00Z", "--until", "2026-01-02T00:00:00Z", "--stuck-after", "-5"
        )


def envelopes_of(occurrence_id) -> int:
    return OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence_id]).count()


def test_replay_stuck_republishes_each_stuck_occurrence_under_its_own_id_and_nothing_else(mixed):
    _, stuck, healthy = mixed
    out = io.StringIO()
    call_command("replay", "--stuck", stdout=out, stderr=io.StringIO())

    assert "Re-published 4 stuck occurrences (enqueued 1, retry_wait 1, running 1, scheduled 1)" in out.getvalue()
    for occurrence in stuck.values():
        assert envelopes_of(occurrence.occurrence_id) == 1, occurrence.state
    for occurrence in healthy:
        assert envelopes_of(occurrence.occurrence_id) == 0, occurrence.state
    assert {o.state for o in stuck.values()} == {type(o).objects.get(pk=o.pk).state for o in stuck.values()}, (
        "states are the claim's to change"
    )


def test_replay_stuck_of_one_tenant_leaves_the_other_alone(mixed, tenant_b, make_schedule, make_occurrence, now):
    other = make_schedule(tenant_b.tenant, name="other")
    theirs = make_occurrence(other, at=now - timedelta(hours=1), state=OccurrenceState.SCHEDULED)

    call_command("replay", "--stuck", "--tenant", "acme", stdout=io.StringIO(), stderr=io.StringIO())

    assert envelopes_of(theirs.occurrence_id) == 0


def test_a_republished_stuck_occurrence_runs_once_and_a_second_delivery_is_dropped(mixed):
    _, stuck, _ = mixed
    occurrence = stuck["enqueued"]
    call_command("replay", "--stuck", stdout=io.StringIO(), stderr=io.StringIO())

    claimed = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, "stuck-worker")
    assert isinstance(claimed, Claim)
    assert complete(claimed, run_claimed(claimed, renew_lease=False)) == OccurrenceState.SUCCEEDED
    again = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, "stuck-worker")
    assert not isinstance(again, Claim) and again.reason == "terminal"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stuck_fire_of_a_default_policy_schedule_re_driven_by_the_command_runs_on_a_real_worker(
    tenant_a, make_schedule, make_occurrence
):
    ensure_effects_table()
    schedule = make_schedule(tenant_a.tenant, name="stuck-default", handler="effect")
    assert (schedule.misfire_policy, schedule.max_lateness_seconds) == ("skip", 60), "the defaults"
    # Published an hour ago and lost (say a queue deleted): far past max_lateness when it is re-driven.
    stuck = make_occurrence(schedule, at=db_now() - timedelta(hours=1), state=OccurrenceState.ENQUEUED)

    def state() -> str:
        return Occurrence.objects.get(pk=stuck.pk).state

    with running_fleet("stuck") as fleet:
        fleet.relay()
        fleet.worker()
        fleet.wait_consuming()
        replayed = fleet.manage("replay", "--stuck")
        assert replayed.returncode == 0, replayed.stderr
        assert "Re-published 1 stuck occurrences (enqueued 1)" in replayed.stdout
        # Until it is over, not only taken: a fire seen `running` was still the worker's when the fleet stopped.
        wait_for(
            lambda: state() not in (OccurrenceState.ENQUEUED, OccurrenceState.RUNNING),
            60,
            "the worker to finish the re-driven fire",
        )

    assert state() == OccurrenceState.SUCCEEDED, Occurrence.objects.get(pk=stuck.pk).state_reason
    assert effects() == {stuck.occurrence_id: 1}
    assert list(Attempt.objects.filter(occurrence_id=stuck.occurrence_id).values_list("outcome", flat=True)) == [
        "succeeded"
    ]


def test_replay_stuck_refuses_flags_that_do_not_go_with_it(db):
    with pytest.raises(CommandError, match="exactly one of"):
        call_command("replay", "--stuck", "--dead")
    with pytest.raises(CommandError, match="go with --stuck"):
        call_command("replay", "--dead", "--older-than", "60")
    with pytest.raises(CommandError, match="--older-than must be"):
        call_command("replay", "--stuck", "--older-than", "nan")
