"""Running a missed or overlap-skipped fire again under its own id (dispatch/rerun.py, dispatch/admin/rerun.py): it
goes back to the outbox forced, a worker claims and runs it as the same occurrence, the operator's note is recorded
and shown, reconcile still finds the fire once, and every other case is refused with its reason; in the console, from
its page or in bulk after a confirmation, only for operators who may change occurrences of their own tenants."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from html import unescape

import pytest
from django.conf import settings
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection

from core.clock import db_now
from dispatch import partitions
from dispatch.engine.claims import Claim, claim_many, try_claim
from dispatch.engine.execution import complete, run_claimed
from dispatch.engine.retry import RunResult
from dispatch.models import (
    Attempt,
    Notification,
    Occurrence,
    OccurrenceRerun,
    OccurrenceState,
    OutboxMessage,
)
from dispatch.reconcile import reconcile
from dispatch.rerun import RERUN_REASON
from dispatch.services import RerunRefused, rerun_occurrence
from schedules.models import Schedule
from schedules.services import cancel_schedule
from tenants.access import OPERATOR_GROUP, READ_ONLY_GROUP
from tenants.models import NotificationTarget
from tests.conftest import occurrence_for, schedule_for
from tests.integration.test_operator_scope import member
from tests.integration.test_upkeep import command, days_of

OCCURRENCES = "/admin/dispatch/occurrence/"
WORKER = "rerun-worker"
LATE = "late by 1800 s > max lateness 60 s (skip)"
SKIPPED = "overlap: occurrence 5e1f0c3a-0000-4000-8000-000000000000 still running (skip_if_running)"


def html(response) -> str:
    """The page's text, entities decoded (a reason's '>' is '&gt;' in it)."""
    assert response.status_code == 200, response.status_code
    return unescape(response.content.decode())


def texts(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def minutes_ago(minutes: float) -> datetime:
    return db_now().replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def missed(schedule: Schedule, minutes: float = 30, *, state: str = OccurrenceState.MISSED, **fields) -> Occurrence:
    """A fire its rules ended without a run (missed by default), as the materializer or a claim records it."""
    at = minutes_ago(minutes)
    reason = LATE if state == OccurrenceState.MISSED else SKIPPED
    return occurrence_for(schedule, at=at, state=state, state_reason=reason, finished_at=at, **fields)


def rerun(occurrence: Occurrence, note: str = "the outage is over", now: datetime | None = None) -> OccurrenceRerun:
    return rerun_occurrence(occurrence.occurrence_id, note=note, actor="operator:test", now=now or db_now())


def late_schedule(tenant, **fields) -> Schedule:
    """Every minute, 60 s of lateness allowed, misfire policy skip: a fire 30 minutes late is missed at claim unless
    something exempts it. Made two hours ago, so reconcile expects its fires of the last hour."""
    fields = {"name": f"late-{uuid.uuid4().hex[:6]}", "max_lateness_seconds": 60, "misfire_policy": "skip", **fields}
    return schedule_for(tenant, now=db_now() - timedelta(hours=2), **fields)


def state_of(occurrence: Occurrence) -> tuple[str, int]:
    occurrence.refresh_from_db()
    return occurrence.state, occurrence.attempt_count


# --- the service ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "ends", "told"),
    [
        (RunResult("succeeded"), "succeeded", {"missed"}),
        (RunResult("failed", "permanent", "PermanentError: bad payload"), "dead", {"missed", "dead"}),
    ],
    ids=["succeeds", "dies"],
)
def test_a_missed_fire_runs_again_under_its_own_id_through_the_outbox_and_a_worker(tenant, result, ends, told):
    schedule = late_schedule(tenant)
    NotificationTarget.objects.create(
        tenant=tenant,
        url="https://alerts.example.test/hook",
        events=["missed", "dead", "skipped_overlap"],
        updated_at=db_now(),
        updated_by="test",
    )
    occurrence = missed(schedule)
    assert set(Notification.objects.values_list("event", flat=True)) == {"missed"}, "told once, when it was missed"
    now = db_now()

    record = rerun(occurrence, "the relay was down 09:00-09:40", now=now)

    row = Occurrence.objects.get(pk=occurrence.pk)
    assert (row.state, row.forced, row.available_at, row.finished_at, row.state_reason) == (
        "scheduled",
        True,
        now,
        None,
        RERUN_REASON,
    )
    assert (record.occurrence_id, record.previous_state, record.previous_reason, record.rerun_by, record.note) == (
        occurrence.pk,
        "missed",
        LATE,
        "operator:test",
        "the relay was down 09:00-09:40",
    )
    envelope = OutboxMessage.objects.get(occurrence_ids__contains=[occurrence.pk])
    assert (envelope.occurrence_ids, envelope.available_at, envelope.published_at) == ([occurrence.pk], now, None)

    # The worker's batched claim of that very envelope: not missed again (30 minutes late, 60 s allowed: forced),
    # and not dropped as a duplicate (no attempt of generation 1 exists).
    pairs = list(zip(envelope.occurrence_ids, envelope.scheduled_fors, strict=True))
    claimed = claim_many(pairs, WORKER, now=now + timedelta(seconds=1))
    assert claimed.drops == [] and [c.occurrence_id for c in claimed.claims] == [occurrence.pk]
    claim = claimed.claims[0]
    assert claim.generation == 1
    assert run_claimed(claim, renew_lease=False).outcome == "succeeded", "the noop handler ran"
    complete(claim, result, now=now + timedelta(seconds=2))

    assert state_of(occurrence) == (ends, 1)
    assert list(Attempt.objects.filter(occurrence_id=occurrence.pk).values_list("generation", "worker")) == [
        (1, WORKER)
    ]
    assert set(Notification.objects.values_list("event", flat=True)) == told
    report = reconcile(since=occurrence.scheduled_for, until=occurrence.scheduled_for + timedelta(minutes=1))
    assert (report.expected, dict(report.found_by_state), report.missing, report.unexpected) == (1, {ends: 1}, 0, 0)


def test_a_rerun_is_refused_with_its_reason_and_changes_nothing(tenant):
    schedule = late_schedule(tenant)
    gone = late_schedule(tenant)
    cases = {
        "succeeded: it ran already": missed(schedule, 10, state=OccurrenceState.SUCCEEDED),
        "dead: replay it from the dead-letter queue": missed(schedule, 11, state=OccurrenceState.DEAD),
        "a withdrawal by a change of its schedule": missed(schedule, 12, state=OccurrenceState.CANCELED),
        "enqueued: it has not ended yet": missed(schedule, 13, state=OccurrenceState.ENQUEUED),
        "its schedule is canceled": missed(gone, 14),
        "its schedule no longer exists": Occurrence.objects.create(
            occurrence_id=uuid.uuid4(),
            schedule_id=uuid.uuid4(),
            tenant_id=987654,
            schedule_version=1,
            scheduled_for=minutes_ago(15),
            available_at=minutes_ago(15),
            lane="strict",
            state=OccurrenceState.MISSED,
        ),
    }
    cancel_schedule(gone, actor="test")
    fine = missed(schedule, 16)
    before = {o.pk: state_of(o) for o in (*cases.values(), fine)}

    for words, occurrence in cases.items():
        with pytest.raises(RerunRefused, match=words):
            rerun(occurrence)
    with pytest.raises(RerunRefused, match="needs a note"):
        rerun(fine, "   ")
    with pytest.raises(RerunRefused, match="No occurrence with id"):
        rerun_occurrence(uuid.uuid4(), note="why", actor="operator:test", now=db_now())

    assert {o.pk: state_of(o) for o in (*cases.values(), fine)} == before
    assert not OccurrenceRerun.objects.exists()
    assert not OutboxMessage.objects.filter(occurrence_ids__overlap=list(before)).exists()


def test_a_skip_the_overlap_policy_would_repeat_is_refused_until_the_sibling_is_done(tenant):
    """`forced` exempts a fire from the misfire policy only: the claim applies the overlap policy to a first delivery
    however it was made, so a re-run while the sibling still runs would only be skipped again."""
    schedule = late_schedule(tenant, overlap_policy="skip_if_running")
    skipped = missed(schedule, 20, state=OccurrenceState.SKIPPED_OVERLAP)
    now = db_now()
    sibling = occurrence_for(
        schedule,
        at=minutes_ago(1),
        state=OccurrenceState.RUNNING,
        attempt_count=1,
        lease_expires_at=now + timedelta(minutes=5),
    )

    with pytest.raises(RerunRefused, match=f"occurrence {sibling.pk} of its schedule is running"):
        rerun(skipped, now=now)
    Occurrence.objects.filter(pk=sibling.pk).update(state=OccurrenceState.SUCCEEDED, lease_expires_at=None)
    rerun(skipped, now=now)

    # Overlap policies other than allow are claimed one by one, holding the schedule's row.
    outcome = try_claim(skipped.occurrence_id, skipped.scheduled_for, WORKER, now=now + timedelta(seconds=1))
    assert isinstance(outcome, Claim) and outcome.generation == 1
    assert OccurrenceRerun.objects.get().previous_state == "skipped_overlap"


@pytest.mark.parametrize(("policy", "accepted"), [("skip_if_running", 1), ("queue_one", 2), ("allow", 4)])
def test_re_running_many_fires_of_one_schedule_accepts_only_what_the_overlap_rule_will_run(tenant, policy, accepted):
    """After an outage an operator re-runs every missed fire of a schedule: its overlap rule will meet the ones already
    re-run before the next, though none runs yet. Only those it will run are accepted; the rest are refused now
    rather than skipped again at claim (with a fresh skipped_overlap notification each)."""
    schedule = late_schedule(tenant, overlap_policy=policy)
    fires = [missed(schedule, minutes) for minutes in (40, 30, 20, 10)]
    now = db_now()
    done = 0
    for fire in fires:
        try:
            rerun(fire, now=now)
            done += 1
        except RerunRefused as exc:
            assert "waits" in str(exc)
    assert done == accepted
    assert OccurrenceRerun.objects.count() == accepted


# --- the console -----------------------------------------------------------------------------------------------------


def test_run_this_occurrence_from_its_page_asks_for_a_note_and_shows_the_rerun_on_its_timeline(
    console, operator, tenant
):
    schedule = late_schedule(tenant)
    occurrence = missed(schedule)
    done = missed(schedule, 31, state=OccurrenceState.SUCCEEDED)
    page_url, rerun_url = f"{OCCURRENCES}{occurrence.pk}/change/", f"{OCCURRENCES}{occurrence.pk}/rerun/"
    assert rerun_url in html(console.get(page_url)) and "Run this occurrence" in html(console.get(page_url))
    assert f"{OCCURRENCES}{done.pk}/rerun/" not in html(console.get(f"{OCCURRENCES}{done.pk}/change/"))
    form = html(console.get(rerun_url))
    assert 'name="note"' in form and "its misfire policy does not judge it again" in form and LATE in form

    assert "This field is required." in html(console.post(rerun_url, {"note": ""}))
    assert state_of(occurrence) == ("missed", 0), "no note, nothing done"

    response = console.post(rerun_url, {"note": "rerun after the 09:00 outage"}, follow=True)

    assert any("scheduled again, under the same id (it was missed)" in text for text in texts(response))
    assert state_of(occurrence) == ("scheduled", 0)
    assert LogEntry.objects.get(user=operator, object_id=str(occurrence.pk)).change_message == (
        "Run again under the same id (was missed): rerun after the 09:00 outage"
    )
    page = html(console.get(page_url))
    assert "Re-run by operator:ops" in page and "rerun after the 09:00 outage" in page
    assert f"It was missed: {LATE}." in page, "the judgement it set aside stays on the timeline"
    assert rerun_url not in page, "scheduled again: nothing to re-run"
    refused = console.post(f"{OCCURRENCES}{done.pk}/rerun/", {"note": "again"}, follow=True)
    assert any("Not run" in text and "succeeded: it ran already" in text for text in texts(refused))


def test_bulk_rerun_lists_what_it_will_run_takes_a_note_and_runs_only_once_confirmed(console, tenant):
    schedule = late_schedule(tenant)
    retired = late_schedule(tenant, name="retired")
    first, second = missed(schedule, 3), missed(schedule, 4, state=OccurrenceState.SKIPPED_OVERLAP)
    fine = missed(schedule, 5, state=OccurrenceState.SUCCEEDED)
    orphan = missed(retired, 6)
    cancel_schedule(retired, actor="test")
    chosen = {"action": "rerun_selected", ACTION_CHECKBOX_NAME: [str(o.pk) for o in (first, second, fine, orphan)]}

    page = html(console.post(OCCURRENCES, chosen))

    assert "Run 2 of these 4 occurrences again?" in page and 'name="note"' in page
    assert "refused: succeeded: it ran already" in page and "refused: its schedule is canceled" in page
    assert 'value="Confirm: run 2 again"' in page and 'name="confirm" value="yes"' in page
    assert "This field is required." in html(console.post(OCCURRENCES, {**chosen, "confirm": "yes", "note": ""}))
    assert not OccurrenceRerun.objects.exists() and not LogEntry.objects.exists(), "nothing done before the note"

    done = console.post(OCCURRENCES, {**chosen, "confirm": "yes", "note": "post-incident rerun"}, follow=True)

    assert "Scheduled 2 occurrence(s) again under their own ids." in texts(done)
    assert any("Not run: 2." in text for text in texts(done))
    assert [state_of(o)[0] for o in (first, second, fine, orphan)] == ["scheduled", "scheduled", "succeeded", "missed"]
    assert set(OccurrenceRerun.objects.values_list("occurrence_id", "note")) == {
        (first.pk, "post-incident rerun"),
        (second.pk, "post-incident rerun"),
    }
    assert OutboxMessage.objects.filter(occurrence_ids__overlap=[first.pk, second.pk]).count() == 2


def test_a_confirmed_occurrence_that_left_the_lists_range_is_named_not_dropped_in_silence(console, tenant):
    schedule = late_schedule(tenant)
    recent, older = missed(schedule, 3), missed(schedule, 90)
    chosen = {"action": "rerun_selected", ACTION_CHECKBOX_NAME: [str(recent.pk), str(older.pk)]}

    # Confirmed on the last hour's list: the older fire is no longer in it (it left while the page was open).
    done = console.post(
        f"{OCCURRENCES}?scheduled_after=now-1h", {**chosen, "confirm": "yes", "note": "after the outage"}, follow=True
    )

    assert any("Nothing done to 1 listed occurrence(s) that have left the list's range" in t for t in texts(done))
    assert any(str(older.pk) in t for t in texts(done))
    assert [state_of(o)[0] for o in (recent, older)] == ["scheduled", "missed"]


def test_a_read_only_operator_is_offered_no_rerun_and_an_operator_reruns_only_its_tenants_fires(tenant_a, tenant_b):
    own = missed(late_schedule(tenant_a.tenant, name="own"), 5)
    other = missed(late_schedule(tenant_b.tenant, name="other"), 5)
    reader = member("rita", READ_ONLY_GROUP, [tenant_a.tenant])
    operator = member("ana", OPERATOR_GROUP, [tenant_a.tenant])

    listing = html(reader.get(OCCURRENCES, {"scheduled_after": "now-24h"}))
    assert str(own.pk) in listing and 'value="rerun_selected"' not in listing
    assert f"{OCCURRENCES}{own.pk}/rerun/" not in html(reader.get(f"{OCCURRENCES}{own.pk}/change/"))
    assert reader.post(f"{OCCURRENCES}{own.pk}/rerun/", {"note": "x"}).status_code == 403
    assert 'value="rerun_selected"' in html(operator.get(OCCURRENCES))

    operator.post(
        OCCURRENCES,
        {
            "action": "rerun_selected",
            ACTION_CHECKBOX_NAME: [str(own.pk), str(other.pk)],
            "confirm": "yes",
            "note": "mine",
        },
    )
    assert operator.post(f"{OCCURRENCES}{other.pk}/rerun/", {"note": "not mine"}).status_code == 302

    assert list(OccurrenceRerun.objects.values_list("occurrence_id", flat=True)) == [own.pk]
    assert (state_of(own)[0], state_of(other)[0]) == ("scheduled", "missed")


# --- retention -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_day_dropped_past_the_retention_takes_its_reruns_and_keeps_the_others(tenant_a):
    old = db_now() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 7)
    partitions.ensure_partitions(connection, old.date(), old.date())
    schedule = late_schedule(tenant_a.tenant)
    gone = missed(schedule, (db_now() - old).total_seconds() // 60)
    kept = missed(schedule, 20)
    rerun(gone, "long ago")
    rerun(kept, "recent")
    # The old one ran since (its envelope settled): a day with a fire still to run is never dropped.
    Occurrence.objects.filter(pk=gone.pk).update(state=OccurrenceState.SUCCEEDED, finished_at=db_now())
    OutboxMessage.objects.filter(occurrence_ids__contains=[gone.pk]).delete()

    command("prune_occurrences")

    assert old.date() not in days_of()
    assert list(OccurrenceRerun.objects.values_list("occurrence_id", flat=True)) == [kept.pk]
