"""Every call of the schedules API (docs/API.md "Schedules") as one tenant sees it, with the keys of the contract."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from rest_framework.pagination import PageNumberPagination

from dispatch.models import Attempt, Occurrence, OccurrenceState, OutboxMessage
from schedules.models import Schedule, ScheduleVersion

SCHEDULES = "/api/v1/schedules/"
SCHEDULE_KEYS = {
    "id",
    "name",
    "kind",
    "cron",
    "run_at",
    "every_seconds",
    "anchor_at",
    "timezone",
    "dst_gap",
    "dst_repeat",
    "start_at",
    "end_at",
    "max_runs",
    "exclude_calendars",
    "remaining_runs",
    "resume_at",
    "lane",
    "flexible_window_seconds",
    "priority",
    "handler",
    "payload",
    "misfire_policy",
    "max_lateness_seconds",
    "catchup_limit",
    "overlap_policy",
    "max_attempts",
    "retry_base_seconds",
    "retry_cap_seconds",
    "labels",
    "state",
    "version",
    "next_run_at",
    "created_at",
    "updated_at",
}
OCCURRENCE_KEYS = {
    "occurrence_id",
    "schedule_id",
    "schedule_version",
    "scheduled_for",
    "available_at",
    "lane",
    "state",
    "attempt_count",
    "enqueued_at",
    "finished_at",
    "attempts",
}
ATTEMPT_KEYS = {"generation", "started_at", "finished_at", "outcome", "error"}
UTC_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
WITH_OFFSET = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$")


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def create(api, body: dict, **headers) -> dict:
    response = api.post(SCHEDULES, body, format="json", **headers)
    assert response.status_code == 201, response.content
    return response.json()


def url(schedule: dict, suffix: str = "") -> str:
    return f"{SCHEDULES}{schedule['id']}/{suffix}"


def outbox_rows_of(occurrence_id):
    """Outbox envelopes that carry the occurrence."""
    return OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence_id])


@pytest.fixture
def add_occurrence(make_occurrence):
    """`make_occurrence` for a schedule the API answered with, found by its id."""

    def add(schedule_id: str, *, version: int, at: datetime, state: str = OccurrenceState.SCHEDULED) -> Occurrence:
        return make_occurrence(Schedule.objects.get(pk=schedule_id), version=version, at=at, state=state)

    return add


# --- create ---------------------------------------------------------------------------------------------


def test_create_answers_201_with_exactly_the_contract_keys_and_defaults(api_a, cron_body):
    response = api_a.post(SCHEDULES, cron_body, format="json")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == SCHEDULE_KEYS
    assert body["name"] == "nightly-report"
    assert body["kind"] == "cron"
    assert body["cron"] == "30 2 * * *"
    assert body["run_at"] is None
    assert body["every_seconds"] is None and body["anchor_at"] is None, "another kind's fields are null"
    assert body["dst_gap"] is None and body["dst_repeat"] is None, "no DST policy given: the default, shown as null"
    assert body["timezone"] == "America/New_York"
    assert body["state"] == "active"
    assert body["version"] == 1
    assert {key: body[key] for key in ("lane", "flexible_window_seconds", "priority", "payload")} == {
        "lane": "strict",
        "flexible_window_seconds": 300,
        "priority": 0,
        "payload": {},
    }
    assert {key: body[key] for key in ("misfire_policy", "max_lateness_seconds", "catchup_limit")} == {
        "misfire_policy": "skip",
        "max_lateness_seconds": 60,
        "catchup_limit": 10,
    }
    assert body["overlap_policy"] == "allow"
    assert body["max_attempts"] == 5


def test_create_reports_every_instant_in_utc_with_z(api_a, cron_body):
    body = create(api_a, cron_body)

    for key in ("next_run_at", "created_at", "updated_at"):
        assert UTC_Z.match(body[key]), (key, body[key])


def test_create_sets_next_run_at_to_the_next_wall_clock_fire_in_the_zone(api_a, cron_body):
    before = datetime.now(UTC)
    body = create(api_a, cron_body)

    next_run = instant(body["next_run_at"])
    assert before < next_run <= before + timedelta(days=2)
    local = next_run.astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (2, 30)


def test_create_defaults_the_timezone_to_utc(api_a, cron_body):
    del cron_body["timezone"]
    body = create(api_a, cron_body)

    assert body["timezone"] == "UTC"
    assert instant(body["next_run_at"]).strftime("%H:%M") == "02:30"


def test_create_once_schedule_keeps_run_at_as_next_run_at_in_utc(api_a):
    body = create(
        api_a,
        {"name": "one-off", "kind": "once", "run_at": "2030-06-01T09:00:00+02:00", "handler": "log"},
    )

    assert body["cron"] is None
    assert body["run_at"] == "2030-06-01T07:00:00Z"
    assert body["next_run_at"] == "2030-06-01T07:00:00Z"


def test_create_stores_all_given_options(api_a, cron_body):
    options = {
        "lane": "flexible",
        "flexible_window_seconds": 120,
        "priority": -7,
        "payload": {"report": "sales", "ids": [1, 2]},
        "misfire_policy": "catch_up",
        "max_lateness_seconds": 5,
        "catchup_limit": 3,
        "overlap_policy": "queue_one",
        "max_attempts": 9,
    }
    body = create(api_a, {**cron_body, **options})

    assert {key: body[key] for key in options} == options
    stored = Schedule.objects.get(pk=body["id"])
    assert stored.payload == options["payload"]
    assert stored.created_by.startswith("tenant:acme/token:provisioned#")


def test_create_with_the_same_idempotency_key_and_body_returns_the_first_schedule_with_200(api_a, cron_body):
    first = api_a.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    again = api_a.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Schedule.objects.filter(idempotency_key="create-1").count() == 1


def test_create_with_the_same_idempotency_key_and_body_in_another_key_order_is_still_a_retry(api_a, cron_body):
    first = create(api_a, cron_body, HTTP_IDEMPOTENCY_KEY="order")
    reordered = dict(reversed(list(cron_body.items())))
    again = api_a.post(SCHEDULES, reordered, format="json", HTTP_IDEMPOTENCY_KEY="order")

    assert again.status_code == 200
    assert again.json()["id"] == first["id"]


def test_create_with_the_same_idempotency_key_and_another_body_is_a_conflict(api_a, cron_body):
    create(api_a, cron_body, HTTP_IDEMPOTENCY_KEY="create-2")
    response = api_a.post(SCHEDULES, {**cron_body, "cron": "0 3 * * *"}, format="json", HTTP_IDEMPOTENCY_KEY="create-2")

    assert response.status_code == 409
    assert "Idempotency-Key" in response.json()["detail"]
    assert Schedule.objects.filter(idempotency_key="create-2").count() == 1


def test_idempotency_keys_are_per_tenant_so_tenant_b_may_reuse_a_key_of_tenant_a(api_a, api_b, cron_body):
    mine = create(api_a, cron_body, HTTP_IDEMPOTENCY_KEY="shared-key")
    theirs = api_b.post(SCHEDULES, {**cron_body, "name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="shared-key")

    assert theirs.status_code == 201
    assert theirs.json()["id"] != mine["id"]
    assert theirs.json()["name"] == "other"


def test_create_without_idempotency_key_creates_a_new_schedule_each_time(api_a, cron_body):
    first = create(api_a, cron_body)
    second = create(api_a, cron_body)

    assert first["id"] != second["id"]


# --- list -----------------------------------------------------------------------------------------------


def test_list_is_paginated_with_count_next_previous_results(api_a, cron_body):
    created = [create(api_a, {**cron_body, "name": f"job-{n}"}) for n in range(3)]

    response = api_a.get(SCHEDULES)

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 3
    assert body["next"] is None
    assert body["previous"] is None
    assert [row["id"] for row in body["results"]] == [row["id"] for row in reversed(created)]
    assert set(body["results"][0]) == SCHEDULE_KEYS


def test_list_filters_by_state(api_a, cron_body):
    active = create(api_a, {**cron_body, "name": "active"})
    paused = create(api_a, {**cron_body, "name": "paused"})
    api_a.post(url(paused, "pause/"))

    assert [row["id"] for row in api_a.get(SCHEDULES, {"state": "paused"}).json()["results"]] == [paused["id"]]
    assert [row["id"] for row in api_a.get(SCHEDULES, {"state": "active"}).json()["results"]] == [active["id"]]


def test_list_filters_by_handler_and_by_name(api_a, cron_body):
    noop = create(api_a, {**cron_body, "name": "alpha"})
    logged = create(api_a, {**cron_body, "name": "beta", "handler": "log"})

    by_handler = api_a.get(SCHEDULES, {"handler": "log"}).json()
    by_name = api_a.get(SCHEDULES, {"name": "alpha"}).json()

    assert [row["id"] for row in by_handler["results"]] == [logged["id"]]
    assert [row["id"] for row in by_name["results"]] == [noop["id"]]


def test_list_with_an_invalid_state_filter_answers_400_not_500(api_a):
    response = api_a.get(SCHEDULES, {"state": "sleeping"})

    assert response.status_code == 400
    assert "state" in response.json()


def test_list_with_a_too_long_name_filter_answers_400(api_a):
    response = api_a.get(SCHEDULES, {"name": "x" * 201})

    assert response.status_code == 400
    assert "name" in response.json()


def test_list_pages_through_next_and_previous_links(api_a, cron_body, monkeypatch):
    monkeypatch.setattr(PageNumberPagination, "page_size", 2)
    created = [create(api_a, {**cron_body, "name": f"job-{n}"}) for n in range(3)]

    first = api_a.get(SCHEDULES).json()
    second = api_a.get(first["next"]).json()

    assert first["count"] == second["count"] == 3
    assert first["previous"] is None
    assert second["next"] is None
    assert second["previous"] is not None
    ids = [row["id"] for row in first["results"] + second["results"]]
    assert ids == [row["id"] for row in reversed(created)]


# --- retrieve -------------------------------------------------------------------------------------------


def test_retrieve_returns_the_schedule(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.get(url(created))

    assert response.status_code == 200
    assert response.json() == created


def test_retrieve_of_an_unknown_id_is_404(api_a):
    assert api_a.get(f"{SCHEDULES}00000000-0000-4000-8000-000000000000/").status_code == 404


def test_retrieve_of_a_non_uuid_id_is_404(api_a):
    assert api_a.get(f"{SCHEDULES}not-a-uuid/").status_code == 404


def test_retrieve_of_another_tenants_id_is_404(api_a, api_b, cron_body):
    theirs = create(api_b, cron_body)

    assert api_a.get(url(theirs)).status_code == 404


# --- update ---------------------------------------------------------------------------------------------


def test_patch_answers_200_with_version_plus_one_and_recomputed_next_run_at(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.patch(url(created), {"cron": "45 4 * * *"}, format="json")

    assert response.status_code == 200
    body = response.json()
    assert body["version"] == created["version"] + 1
    assert body["cron"] == "45 4 * * *"
    local = instant(body["next_run_at"]).astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (4, 45)
    assert instant(body["updated_at"]) >= instant(created["updated_at"])


def test_patch_of_the_timezone_moves_next_run_at(api_a, cron_body):
    created = create(api_a, cron_body)

    body = api_a.patch(url(created), {"timezone": "Asia/Kolkata"}, format="json").json()

    assert body["timezone"] == "Asia/Kolkata"
    assert body["next_run_at"] != created["next_run_at"]
    local = instant(body["next_run_at"]).astimezone(ZoneInfo("Asia/Kolkata"))
    assert (local.hour, local.minute) == (2, 30)


def test_patch_cancels_unclaimed_occurrences_of_older_versions(api_a, cron_body, add_occurrence):
    created = create(api_a, cron_body)
    at = datetime.now(UTC) + timedelta(seconds=30)
    waiting = add_occurrence(created["id"], version=1, at=at)

    api_a.patch(url(created), {"priority": 5}, format="json")

    waiting.refresh_from_db()
    assert waiting.state == OccurrenceState.CANCELED
    assert waiting.finished_at is not None


def test_patch_ignores_read_only_keys_sent_back_from_a_get(api_a, cron_body):
    created = create(api_a, cron_body)

    body = api_a.patch(url(created), {**created, "name": "renamed"}, format="json").json()

    assert body["name"] == "renamed"
    assert body["id"] == created["id"]
    assert body["version"] == 2


def test_patch_of_a_canceled_schedule_is_a_conflict(api_a, cron_body):
    created = create(api_a, cron_body)
    api_a.post(url(created, "cancel/"))

    response = api_a.patch(url(created), {"priority": 5}, format="json")

    assert response.status_code == 409
    assert Schedule.objects.get(pk=created["id"]).priority == 0


def test_patch_with_an_invalid_value_answers_400_and_keeps_the_version(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.patch(url(created), {"cron": "61 * * * *"}, format="json")

    assert response.status_code == 400
    assert "cron" in response.json()
    assert Schedule.objects.get(pk=created["id"]).version == 1


def test_put_is_not_allowed(api_a, cron_body):
    created = create(api_a, cron_body)

    assert api_a.put(url(created), cron_body, format="json").status_code == 405


# --- pause / resume / cancel ----------------------------------------------------------------------------


def test_pause_sets_state_paused_and_clears_next_run_at(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.post(url(created, "pause/"))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == SCHEDULE_KEYS
    assert body["state"] == "paused"
    assert body["next_run_at"] is None
    assert body["version"] == 2


def test_resume_sets_state_active_with_the_next_fire_after_now(api_a, cron_body):
    created = create(api_a, cron_body)
    api_a.post(url(created, "pause/"))
    before = datetime.now(UTC)

    response = api_a.post(url(created, "resume/"))

    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "active"
    assert instant(body["next_run_at"]) > before
    assert body["version"] == 3


def test_resume_of_a_canceled_schedule_is_a_conflict(api_a, cron_body):
    created = create(api_a, cron_body)
    api_a.post(url(created, "cancel/"))

    assert api_a.post(url(created, "resume/")).status_code == 409


def test_cancel_answers_200_with_the_schedule_and_in_flight_list(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.post(url(created, "cancel/"))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"schedule", "in_flight"}
    assert body["schedule"]["state"] == "canceled"
    assert body["schedule"]["next_run_at"] is None
    assert body["in_flight"] == []


def test_delete_cancels_like_cancel_and_keeps_the_row(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.delete(url(created))

    assert response.status_code == 200
    assert set(response.json()) == {"schedule", "in_flight"}
    assert response.json()["schedule"]["state"] == "canceled"
    assert api_a.get(url(created)).json()["state"] == "canceled"


def test_cancel_reports_a_running_occurrence_in_flight_and_cancels_a_waiting_one(api_a, cron_body, add_occurrence):
    created = create(api_a, cron_body)
    now = datetime.now(UTC)
    running = add_occurrence(created["id"], version=1, at=now - timedelta(minutes=1), state=OccurrenceState.RUNNING)
    waiting = add_occurrence(created["id"], version=1, at=now + timedelta(minutes=1))

    body = api_a.post(url(created, "cancel/")).json()

    assert body["in_flight"] == [{"occurrence_id": str(running.occurrence_id), "state": "running"}]
    running.refresh_from_db()
    waiting.refresh_from_db()
    assert running.state == OccurrenceState.RUNNING
    assert waiting.state == OccurrenceState.CANCELED


def test_cancel_twice_is_harmless_and_does_not_add_a_version(api_a, cron_body):
    created = create(api_a, cron_body)
    api_a.post(url(created, "cancel/"))

    again = api_a.post(url(created, "cancel/"))

    assert again.status_code == 200
    assert again.json()["schedule"]["version"] == 2
    assert ScheduleVersion.objects.filter(schedule_id=created["id"]).count() == 2


# --- preview --------------------------------------------------------------------------------------------


def test_preview_lists_fires_strictly_after_the_given_instant_across_spring_forward(api_a, cron_body):
    created = create(api_a, cron_body)

    # 2026-03-08 02:30 does not exist in New York (spring forward): that day is skipped.
    response = api_a.get(url(created, "preview/"), {"count": 3, "after": "2026-03-07T07:30:00Z"})

    assert response.status_code == 200
    assert response.json() == {
        "fires": [
            {"at": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00"},
            {"at": "2026-03-10T06:30:00Z", "local": "2026-03-10T02:30:00-04:00"},
            {"at": "2026-03-11T06:30:00Z", "local": "2026-03-11T02:30:00-04:00"},
        ]
    }


def test_preview_defaults_to_ten_fires_after_now(api_a, cron_body):
    created = create(api_a, cron_body)
    before = datetime.now(UTC)

    fires = api_a.get(url(created, "preview/")).json()["fires"]

    assert len(fires) == 10
    assert all(UTC_Z.match(fire["at"]) and WITH_OFFSET.match(fire["local"]) for fire in fires)
    ats = [instant(fire["at"]) for fire in fires]
    assert ats == sorted(ats)
    assert ats[0] > before
    assert fires[0]["at"] == created["next_run_at"]


def test_preview_local_time_carries_the_zone_offset(api_a, cron_body):
    created = create(api_a, {**cron_body, "timezone": "Asia/Kathmandu", "cron": "0 9 * * *"})

    fires = api_a.get(url(created, "preview/"), {"count": 1, "after": "2026-01-01T00:00:00Z"}).json()["fires"]

    assert fires == [{"at": "2026-01-01T03:15:00Z", "local": "2026-01-01T09:00:00+05:45"}]


def test_preview_with_more_than_100_fires_answers_400(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.get(url(created, "preview/"), {"count": 101})

    assert response.status_code == 400
    assert "count" in response.json()


@pytest.mark.parametrize("name", ["after", "count"])
def test_preview_with_an_empty_parameter_answers_400_naming_it(api_a, cron_body, name):
    """`?after=` previewed from now as if no instant were named; a client that sent one meant something."""
    created = create(api_a, cron_body)

    response = api_a.get(url(created, "preview/") + f"?{name}=")

    assert response.status_code == 400, response.content
    assert name in response.json()


def test_preview_accepts_exactly_100_fires(api_a, cron_body):
    created = create(api_a, cron_body)

    assert len(api_a.get(url(created, "preview/"), {"count": 100}).json()["fires"]) == 100


@pytest.mark.parametrize("after", ["yesterday", "2026-01-01T00:00:00", "2026-13-01T00:00:00Z", "0001-01-01T00:00:00Z"])
def test_preview_with_a_bad_after_answers_400(api_a, cron_body, after):
    created = create(api_a, cron_body)

    response = api_a.get(url(created, "preview/"), {"after": after})

    assert response.status_code == 400
    assert "after" in response.json()


def test_preview_of_a_once_schedule_lists_its_single_fire(api_a):
    created = create(api_a, {"name": "once", "kind": "once", "run_at": "2030-01-01T00:00:00Z", "handler": "noop"})

    fires = api_a.get(url(created, "preview/"), {"after": "2029-12-31T00:00:00Z"}).json()["fires"]

    assert fires == [{"at": "2030-01-01T00:00:00Z", "local": "2030-01-01T00:00:00+00:00"}]


def test_unsaved_preview_validates_without_saving(api_a, cron_body):
    before = Schedule.objects.count()
    response = api_a.post(
        f"{SCHEDULES}preview/", {**cron_body, "count": 2, "after": "2026-11-01T05:00:00Z"}, format="json"
    )

    assert response.status_code == 200
    # 2026-11-01 is fall-back day in New York; 02:30 EST is after the repeated hour.
    assert response.json() == {
        "fires": [
            {"at": "2026-11-01T07:30:00Z", "local": "2026-11-01T02:30:00-05:00"},
            {"at": "2026-11-02T07:30:00Z", "local": "2026-11-02T02:30:00-05:00"},
        ]
    }
    assert Schedule.objects.count() == before


def test_unsaved_preview_needs_only_the_time_fields(api_a):
    response = api_a.post(f"{SCHEDULES}preview/", {"kind": "cron", "cron": "@hourly", "count": 1}, format="json")

    assert response.status_code == 200
    assert len(response.json()["fires"]) == 1


def test_unsaved_preview_of_a_bad_cron_answers_400(api_a, cron_body):
    before = Schedule.objects.count()
    response = api_a.post(f"{SCHEDULES}preview/", {**cron_body, "cron": "* * * *"}, format="json")

    assert response.status_code == 400
    assert "cron" in response.json()
    assert Schedule.objects.count() == before


def test_unsaved_preview_with_more_than_100_fires_answers_400(api_a, cron_body):
    response = api_a.post(f"{SCHEDULES}preview/", {**cron_body, "count": 101}, format="json")

    assert response.status_code == 400
    assert "count" in response.json()


# --- trigger and occurrences ----------------------------------------------------------------------------


def test_trigger_answers_202_with_an_occurrence_id_and_writes_an_outbox_row(api_a, cron_body):
    created = create(api_a, cron_body)

    response = api_a.post(url(created, "trigger/"))

    assert response.status_code == 202
    assert set(response.json()) == {"occurrence_id"}
    occurrence = Occurrence.objects.get(occurrence_id=response.json()["occurrence_id"])
    assert str(occurrence.schedule_id) == created["id"]
    assert occurrence.manual
    assert outbox_rows_of(occurrence.occurrence_id).count() == 1


def test_trigger_with_the_same_idempotency_key_returns_the_same_occurrence(api_a, cron_body):
    created = create(api_a, cron_body)

    first = api_a.post(url(created, "trigger/"), HTTP_IDEMPOTENCY_KEY="run-now-1").json()
    again = api_a.post(url(created, "trigger/"), HTTP_IDEMPOTENCY_KEY="run-now-1").json()
    other = api_a.post(url(created, "trigger/"), HTTP_IDEMPOTENCY_KEY="run-now-2").json()

    assert first == again
    assert other != first
    assert Occurrence.objects.filter(schedule_id=created["id"]).count() == 2
    assert outbox_rows_of(first["occurrence_id"]).count() == 1


def test_trigger_of_a_canceled_schedule_is_a_conflict(api_a, cron_body):
    created = create(api_a, cron_body)
    api_a.post(url(created, "cancel/"))

    response = api_a.post(url(created, "trigger/"))

    assert response.status_code == 409
    assert not Occurrence.objects.filter(schedule_id=created["id"]).exists()


def test_occurrences_of_a_schedule_are_paginated_newest_first(api_a, cron_body, add_occurrence):
    created = create(api_a, cron_body)
    now = datetime.now(UTC)
    older = add_occurrence(created["id"], version=1, at=now - timedelta(hours=2), state=OccurrenceState.SUCCEEDED)
    newer = add_occurrence(created["id"], version=1, at=now - timedelta(hours=1), state=OccurrenceState.SUCCEEDED)
    triggered = api_a.post(url(created, "trigger/")).json()["occurrence_id"]

    response = api_a.get(url(created, "occurrences/"))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 3
    assert [row["occurrence_id"] for row in body["results"]] == [
        triggered,
        str(newer.occurrence_id),
        str(older.occurrence_id),
    ]
    assert set(body["results"][0]) == OCCURRENCE_KEYS


def test_occurrence_detail_has_every_contract_key_and_its_attempts(api_a, cron_body):
    created = create(api_a, cron_body)
    occurrence_id = api_a.post(url(created, "trigger/")).json()["occurrence_id"]
    started = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    Attempt.objects.create(
        occurrence_id=occurrence_id,
        scheduled_for=Occurrence.objects.get(pk=occurrence_id).scheduled_for,
        generation=1,
        started_at=started,
        finished_at=started + timedelta(seconds=2),
        outcome="failed",
        error="boom",
    )

    response = api_a.get(f"/api/v1/occurrences/{occurrence_id}/")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == OCCURRENCE_KEYS
    assert body["occurrence_id"] == occurrence_id
    assert body["schedule_id"] == created["id"]
    assert body["schedule_version"] == 1
    assert body["state"] == "scheduled"
    assert body["lane"] == "strict"
    assert UTC_Z.match(body["scheduled_for"]) and UTC_Z.match(body["available_at"])
    assert body["attempts"] == [
        {
            "generation": 1,
            "started_at": "2026-05-01T12:00:00Z",
            "finished_at": "2026-05-01T12:00:02Z",
            "outcome": "failed",
            "error": "boom",
        }
    ]
    assert set(body["attempts"][0]) == ATTEMPT_KEYS


def test_occurrence_detail_of_an_unknown_or_non_uuid_id_is_404(api_a):
    assert api_a.get("/api/v1/occurrences/00000000-0000-4000-8000-000000000000/").status_code == 404
    assert api_a.get("/api/v1/occurrences/nope/").status_code == 404


def test_replay_of_an_occurrence_that_is_not_dead_is_a_conflict(api_a, cron_body):
    created = create(api_a, cron_body)
    occurrence_id = api_a.post(url(created, "trigger/")).json()["occurrence_id"]

    response = api_a.post(f"/api/v1/occurrences/{occurrence_id}/replay/")

    assert response.status_code == 409
    assert Occurrence.objects.get(occurrence_id=occurrence_id).state == OccurrenceState.SCHEDULED


def test_replay_of_a_dead_occurrence_re_enqueues_it_under_the_same_id(api_a, cron_body):
    created = create(api_a, cron_body)
    occurrence_id = api_a.post(url(created, "trigger/")).json()["occurrence_id"]
    Occurrence.objects.filter(occurrence_id=occurrence_id).update(
        state=OccurrenceState.DEAD, finished_at=datetime.now(UTC)
    )
    outbox_before = outbox_rows_of(occurrence_id).count()

    response = api_a.post(f"/api/v1/occurrences/{occurrence_id}/replay/")

    assert response.status_code == 202
    assert response.json() == {"occurrence_id": occurrence_id}
    occurrence = Occurrence.objects.get(occurrence_id=occurrence_id)
    assert occurrence.state == OccurrenceState.SCHEDULED
    assert occurrence.finished_at is None
    assert outbox_rows_of(occurrence_id).count() == outbox_before + 1
    assert Occurrence.objects.filter(schedule_id=created["id"]).count() == 1


def test_a_retry_policy_is_kept_and_a_cap_below_its_base_is_a_400(api_a, cron_body):
    made = api_a.post(SCHEDULES, {**cron_body, "retry_base_seconds": 5, "retry_cap_seconds": 600}, format="json")
    assert made.status_code == 201 and (made.json()["retry_base_seconds"], made.json()["retry_cap_seconds"]) == (5, 600)
    assert api_a.post(SCHEDULES, cron_body, format="json").json()["retry_base_seconds"] is None  # the platform's

    for body, field in (
        ({"retry_base_seconds": 60, "retry_cap_seconds": 30}, "retry_cap_seconds"),
        ({"retry_base_seconds": 0}, "retry_base_seconds"),
        ({"retry_cap_seconds": 86401}, "retry_cap_seconds"),
    ):
        response = api_a.post(SCHEDULES, {**cron_body, **body}, format="json")
        assert response.status_code == 400 and field in response.json(), (body, response.content)
    lowered = api_a.patch(f"{SCHEDULES}{made.json()['id']}/", {"retry_cap_seconds": 4}, format="json")
    assert lowered.status_code == 400 and "retry_cap_seconds" in lowered.json()
