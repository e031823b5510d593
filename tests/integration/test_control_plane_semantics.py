"""One answer for every path of the control plane: manual triggers across versions, changes while behind."""

from __future__ import annotations

from dispatch.models import Occurrence, OccurrenceState

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
