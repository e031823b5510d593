"""One answer for every path of the control plane: manual triggers across versions, changes while behind."""

from __future__ import annotations

from datetime import timedelta

from core.clock import db_now
from dispatch.models import Occurrence, OccurrenceState, OutboxMessage
from schedules.models import Schedule, ScheduleCursor
from tests.conftest import mark_completed, move_cursor
from tests.integration.support import materializer_holding_every_shard, run_materializer

SCHEDULES = "/api/v1/schedules/"


def create(api, body: dict) -> dict:
    response = api.post(SCHEDULES, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def url(schedule: dict, action: str = "") -> str:
    return f"{SCHEDULES}{schedule['id']}/{action}"


def test_the_same_trigger_key_gives_the_same_occurrence_after_a_patch_a_pause_and_a_resume(api_a, cron_body):
    created = create(api_a, cron_body)
    first = api_a.post(url(created, "trigger/"), HTTP_IDEMPOTENCY_KEY="invoice-42").json()["occurrence_id"]

    api_a.patch(url(created), {"name": "renamed"}, format="json")
    after_patch = api_a.post(url(created, "trigger/"), HTTP_IDEMPOTENCY_KEY="invoice-42")
    api_a.post(url(created, "pause/"))
    api_a.post(url(created, "resume/"))
    after_resume = api_a.post(url(created, "trigger/"), HTTP_IDEMPOTENCY_KEY="invoice-42")

    assert after_patch.status_code == after_resume.status_code == 202
    assert after_patch.json()["occurrence_id"] == after_resume.json()["occurrence_id"] == first
    assert Occurrence.objects.filter(schedule_id=created["id"], manual=True).count() == 1, "one business effect"


def test_an_accepted_manual_trigger_survives_a_later_patch_pause_and_resume(api_a, cron_body):
    created = create(api_a, cron_body)
    triggered = api_a.post(url(created, "trigger/")).json()["occurrence_id"]

    api_a.patch(url(created), {"priority": 7}, format="json")
    api_a.post(url(created, "pause/"))
    api_a.post(url(created, "resume/"))

    occurrence = Occurrence.objects.get(occurrence_id=triggered)
    assert occurrence.state == OccurrenceState.SCHEDULED, "an accepted 202 still runs"
    assert occurrence.forced, "the worker runs it although the schedule moved on to a newer version"


def test_a_cancel_withdraws_an_unclaimed_manual_trigger_and_says_why(api_a, cron_body):
    created = create(api_a, cron_body)
    triggered = api_a.post(url(created, "trigger/")).json()["occurrence_id"]

    api_a.post(url(created, "cancel/"))

    occurrence = Occurrence.objects.get(occurrence_id=triggered)
    assert occurrence.state == OccurrenceState.CANCELED
    assert "canceled" in occurrence.state_reason


def test_a_patch_that_sets_a_read_only_field_is_refused_and_changes_nothing(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.patch(url(created), {"state": "paused"}, format="json")

    assert response.status_code == 400
    assert "pause/" in response.json()["state"][0]
    after = api_a.get(url(created)).json()
    assert (after["state"], after["version"]) == ("active", 1)


def test_a_create_with_a_read_only_field_is_refused(api_a, cron_body):
    response = api_a.post(SCHEDULES, {**cron_body, "version": 7}, format="json")
    assert response.status_code == 400
    assert "version" in response.json()


# --- changes while the materializer is behind (items 5 and 6) ---------------------------------------------------


def behind(schedule_id: str, minutes: int) -> None:
    """As if the materializer had been down: the cursor still points `minutes` fires back."""

    now = db_now().replace(second=0, microsecond=0)
    move_cursor(schedule_id, now - timedelta(minutes=minutes))


def test_owed_fires_of_a_catch_up_schedule_are_delivered_not_missed_when_it_is_patched(api_a, cron_body):
    created = create(
        api_a,
        {**cron_body, "cron": "* * * * *", "misfire_policy": "catch_up", "max_lateness_seconds": 3600},
    )
    behind(created["id"], 5)

    assert api_a.patch(url(created), {"name": "renamed"}, format="json").status_code == 200

    owed = Occurrence.objects.filter(schedule_id=created["id"], schedule_version=1)
    assert owed.count() >= 5
    assert not owed.filter(state=OccurrenceState.MISSED).exists(), "on time for its policy: delivered"
    for occurrence in owed:
        assert occurrence.kept, "the PATCH that follows does not withdraw a fire that was already due"
        assert OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence.occurrence_id]).exists()


def test_owed_fires_past_max_lateness_of_a_skip_schedule_are_missed_with_their_reason(api_a, cron_body):
    created = create(api_a, {**cron_body, "cron": "* * * * *", "misfire_policy": "skip", "max_lateness_seconds": 90})
    behind(created["id"], 5)

    paused_at = db_now()
    api_a.post(url(created, "pause/"))

    owed = list(Occurrence.objects.filter(schedule_id=created["id"], schedule_version=1))
    assert len(owed) >= 5
    for occurrence in owed:
        late = (paused_at - occurrence.scheduled_for).total_seconds()
        if late > 91:
            assert occurrence.state == OccurrenceState.MISSED, late
            assert "late" in occurrence.state_reason, occurrence.state_reason
        elif late < 89:
            assert occurrence.state == OccurrenceState.SCHEDULED, late
    assert any(o.state == OccurrenceState.MISSED for o in owed) and any(o.state != "missed" for o in owed)


def test_a_flexible_fire_already_due_keeps_its_jittered_slot_through_a_patch(api_a, cron_body, make_occurrence):

    created = create(api_a, {**cron_body, "lane": "flexible", "cron": "* * * * *"})
    schedule = Schedule.objects.get(pk=created["id"])
    now = db_now()
    due = make_occurrence(schedule, at=now - timedelta(seconds=10), available_at=now + timedelta(seconds=200))
    future = make_occurrence(schedule, at=now + timedelta(seconds=50), available_at=now + timedelta(seconds=120))

    api_a.patch(url(created), {"priority": 3}, format="json")

    due.refresh_from_db()
    future.refresh_from_db()
    assert due.state == OccurrenceState.SCHEDULED and due.kept, "due before the change: keeps its slot"
    assert due.available_at == now + timedelta(seconds=200)
    assert future.state == OccurrenceState.CANCELED, "after the change: the new version decides"


def test_cancel_of_a_completed_one_off_keeps_the_fact_that_it_fired(api_a):

    run_at = (db_now() + timedelta(hours=1)).isoformat()
    created = create(api_a, {"name": "once", "kind": "once", "run_at": run_at, "handler": "noop"})
    mark_completed(created["id"])

    response = api_a.post(url(created, "cancel/"))

    assert response.status_code == 200
    assert response.json()["schedule"]["state"] == "completed"
    assert api_a.get(url(created)).json()["version"] == 1


# --- a one-off with a run_at in the past: one rule on every path (item 4) -----------------------------------------


def once_body(run_at, **fields) -> dict:
    return {"name": "once", "kind": "once", "run_at": run_at.isoformat(), "handler": "noop", **fields}


def run_materializer_now() -> None:

    run_materializer(materializer_holding_every_shard("semantics"), db_now())


def test_a_patch_to_a_past_run_at_is_judged_by_the_misfire_policy_not_dropped(api_a):

    now = db_now()
    fire_once = create(api_a, once_body(now + timedelta(hours=1), misfire_policy="fire_once"))
    skip = create(api_a, once_body(now + timedelta(hours=1), misfire_policy="skip", max_lateness_seconds=60))
    past = now - timedelta(minutes=10)

    for created in (fire_once, skip):
        response = api_a.patch(url(created), {"run_at": past.isoformat()}, format="json")
        assert response.status_code == 200 and response.json()["state"] == "active"
    run_materializer_now()

    fired = Occurrence.objects.get(schedule_id=fire_once["id"])
    missed = Occurrence.objects.get(schedule_id=skip["id"])
    assert fired.state == OccurrenceState.SCHEDULED and fired.scheduled_for == past
    assert missed.state == OccurrenceState.MISSED and "late" in missed.state_reason


def test_a_resume_after_a_one_off_time_passed_records_it_missed_with_the_reason(api_a):

    created = create(api_a, once_body(db_now() + timedelta(minutes=30)))
    api_a.post(url(created, "pause/"))

    Schedule.objects.filter(pk=created["id"]).update(run_at=db_now() - timedelta(minutes=1))

    resumed = api_a.post(url(created, "resume/")).json()

    assert resumed["state"] == "completed"
    occurrence = Occurrence.objects.get(schedule_id=created["id"])
    assert occurrence.state == OccurrenceState.MISSED and "paused" in occurrence.state_reason


def test_the_preview_of_a_past_one_off_shows_the_fire_exactly_when_create_would_run_it(api_a):

    past = db_now() - timedelta(minutes=5)
    would_fire = api_a.post(f"{SCHEDULES}preview/", once_body(past, misfire_policy="fire_once"), format="json")
    would_miss = api_a.post(
        f"{SCHEDULES}preview/", once_body(past, misfire_policy="skip", max_lateness_seconds=60), format="json"
    )
    on_time = api_a.post(
        f"{SCHEDULES}preview/", once_body(past, misfire_policy="skip", max_lateness_seconds=3600), format="json"
    )

    assert [f["at"] for f in would_fire.json()["fires"]] == [past.isoformat().replace("+00:00", "Z")]
    assert would_miss.json()["fires"] == []
    assert len(on_time.json()["fires"]) == 1


def test_the_preview_of_a_paused_or_canceled_schedule_lists_no_fire_that_will_not_run(api_a, cron_body):
    paused = create(api_a, cron_body)
    api_a.post(url(paused, "pause/"))
    canceled = create(api_a, {**cron_body, "name": "other"})
    api_a.post(url(canceled, "cancel/"))

    assert api_a.get(url(paused, "preview/")).json() == {"fires": []}
    assert api_a.get(url(canceled, "preview/")).json() == {"fires": []}
    api_a.post(url(paused, "resume/"))
    assert len(api_a.get(url(paused, "preview/")).json()["fires"]) == 10


def test_next_run_at_is_the_next_fire_not_yet_enqueued_not_the_materializer_cursor(api_a, cron_body, make_occurrence):
    created = create(api_a, {**cron_body, "cron": "*/2 * * * *"})
    schedule = Schedule.objects.get(pk=created["id"])
    now = db_now().replace(second=0, microsecond=0)
    pending = make_occurrence(schedule, at=now + timedelta(minutes=2))
    make_occurrence(schedule, at=now - timedelta(minutes=2), state=OccurrenceState.SUCCEEDED)
    move_cursor(schedule.pk, now + timedelta(minutes=10))
    expected = pending.scheduled_for.isoformat().replace("+00:00", "Z")

    detail = api_a.get(url(created)).json()
    listed = next(s for s in api_a.get(SCHEDULES).json()["results"] if s["id"] == created["id"])

    assert detail["next_run_at"] == listed["next_run_at"] == expected


def test_a_materialized_one_off_is_active_and_pausable_until_its_occurrence_ends(api_a):
    created = create(api_a, once_body(db_now() + timedelta(seconds=60)))
    run_materializer_now()

    shown = api_a.get(url(created)).json()
    assert shown["state"] == "active", "materialized a horizon ahead is not completed"
    assert shown["next_run_at"] == created["run_at"]
    assert api_a.post(url(created, "pause/")).status_code == 200


def test_a_fire_kept_through_a_change_still_meets_its_misfire_policy_at_claim(api_a, cron_body, make_occurrence):
    """Kept is not forced: a skip fire an hour late after an outage is missed, change or no change."""
    from dispatch.engine.claims import try_claim

    created = create(api_a, {**cron_body, "cron": "* * * * *", "misfire_policy": "skip", "max_lateness_seconds": 60})
    schedule = Schedule.objects.get(pk=created["id"])
    late = make_occurrence(schedule, at=db_now() - timedelta(hours=1), state=OccurrenceState.ENQUEUED)

    api_a.patch(url(created), {"priority": 1}, format="json")
    late.refresh_from_db()
    assert late.kept and not late.forced and late.state == OccurrenceState.ENQUEUED

    try_claim(late.occurrence_id, late.scheduled_for, "kept-worker")
    late.refresh_from_db()
    assert late.state == OccurrenceState.MISSED and "late by" in late.state_reason


def test_a_patch_resending_the_stored_run_at_does_not_fire_a_completed_one_off_again(api_a):
    run_at = db_now() - timedelta(minutes=30)  # it fired half an hour ago
    created = create(api_a, once_body(run_at, misfire_policy="fire_once"))
    mark_completed(created["id"])
    shown = api_a.get(url(created)).json()

    response = api_a.patch(url(created), {**shown, "payload": {"edited": True}}, format="json")

    assert response.status_code == 200
    assert response.json()["state"] == "completed", "the same run_at is not a new fire"


def test_a_resume_does_not_record_missed_a_one_off_fire_that_was_kept_through_the_pause(api_a, make_occurrence):
    run_at = db_now() - timedelta(seconds=20)
    created = create(api_a, once_body(db_now() + timedelta(minutes=30)))
    schedule = Schedule.objects.get(pk=created["id"])
    Schedule.objects.filter(pk=schedule.pk).update(run_at=run_at)
    ScheduleCursor.objects.filter(schedule_id=schedule.pk).update(run_at=run_at, next_run_at=None)
    kept = make_occurrence(schedule, at=run_at, state=OccurrenceState.RUNNING, attempt_count=1)
    api_a.post(url(created, "pause/"))

    api_a.post(url(created, "resume/"))

    rows = list(Occurrence.objects.filter(schedule_id=created["id"]))
    assert [row.occurrence_id for row in rows] == [kept.occurrence_id], "no second, misleading 'missed' row"
