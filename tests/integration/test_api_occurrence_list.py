"""GET /api/v1/occurrences/: the tenant's occurrences across its schedules, newest first, with four filters."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import connection
from rest_framework.pagination import PageNumberPagination

from dispatch import partitions
from dispatch.models import Occurrence, OccurrenceState
from schedules.api.filters import OccurrenceFilter
from tests.conftest import api_client_for, occurrence_for, schedule_for

OCCURRENCES = "/api/v1/occurrences/"
NOON = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)
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


def ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["occurrence_id"] for row in response.json()["results"]]


def text(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


@pytest.fixture
def two_schedules(tenant_a):
    return schedule_for(tenant_a.tenant, name="first"), schedule_for(tenant_a.tenant, name="second")


@pytest.fixture
def api(api_a):
    # A 500 must show up as a status code to assert on, not as an exception raised into the test.
    api_a.raise_request_exception = False
    return api_a


# --- listing --------------------------------------------------------------------------------------------


def test_the_list_spans_every_schedule_of_the_tenant_newest_first(api, two_schedules):
    first, second = two_schedules
    oldest = occurrence_for(first, at=NOON - timedelta(hours=2))
    middle = occurrence_for(second, at=NOON - timedelta(hours=1))
    newest = occurrence_for(first, at=NOON)

    response = api.get(OCCURRENCES)

    assert ids(response) == [str(newest.occurrence_id), str(middle.occurrence_id), str(oldest.occurrence_id)]
    body = response.json()
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 3
    assert set(body["results"][0]) == OCCURRENCE_KEYS
    assert body["results"][0]["schedule_id"] == str(first.id)


def test_occurrences_due_at_one_instant_are_ordered_by_occurrence_id(api, two_schedules):
    at_noon = [occurrence_for(schedule, at=NOON) for schedule in two_schedules]

    assert ids(api.get(OCCURRENCES)) == sorted(str(row.occurrence_id) for row in at_noon)


def test_the_list_is_paginated_newest_first(api, two_schedules, monkeypatch):
    monkeypatch.setattr(PageNumberPagination, "page_size", 2)
    first, _ = two_schedules
    rows = [occurrence_for(first, at=NOON + timedelta(hours=hour)) for hour in range(3)]

    page_1 = api.get(OCCURRENCES)
    page_2 = api.get(OCCURRENCES, {"page": 2})

    assert ids(page_1) == [str(rows[2].occurrence_id), str(rows[1].occurrence_id)]
    assert ids(page_2) == [str(rows[0].occurrence_id)]
    assert page_1.json()["count"] == page_2.json()["count"] == 3
    assert page_1.json()["next"] is not None and page_2.json()["next"] is None


def test_a_page_past_the_end_answers_404(api, two_schedules):
    assert api.get(OCCURRENCES, {"page": 99}).status_code == 404


# --- filters ----------------------------------------------------------------------------------------------


def test_the_state_filter_keeps_only_that_state(api, two_schedules):
    first, second = two_schedules
    dead = occurrence_for(first, at=NOON, state=OccurrenceState.DEAD)
    occurrence_for(second, at=NOON, state=OccurrenceState.SUCCEEDED)
    occurrence_for(first, at=NOON - timedelta(hours=1))

    assert ids(api.get(OCCURRENCES, {"state": "dead"})) == [str(dead.occurrence_id)]


def test_a_watched_state_lists_the_tenants_own_fires_of_any_day_newest_first(api, two_schedules, tenant_b):
    """dead, running and retry_wait are read from the watch table (no range needed, the DLQ of the whole
    retention); another tenant's fires in the same state stay out."""
    first, second = two_schedules
    older = occurrence_for(first, at=NOON - timedelta(days=20), state=OccurrenceState.DEAD)
    newer = occurrence_for(second, at=NOON, state=OccurrenceState.DEAD)
    running = occurrence_for(first, at=NOON - timedelta(minutes=5), state=OccurrenceState.RUNNING)
    waiting = occurrence_for(second, at=NOON - timedelta(minutes=5), state=OccurrenceState.RETRY_WAIT)
    others = schedule_for(tenant_b.tenant, name="other-tenant")
    occurrence_for(others, at=NOON, state=OccurrenceState.DEAD)
    occurrence_for(others, at=NOON - timedelta(minutes=1), state=OccurrenceState.RUNNING)

    assert ids(api.get(OCCURRENCES, {"state": "dead"})) == [str(newer.occurrence_id), str(older.occurrence_id)]
    assert ids(api.get(OCCURRENCES, {"state": "running"})) == [str(running.occurrence_id)]
    assert ids(api.get(OCCURRENCES, {"state": "retry_wait"})) == [str(waiting.occurrence_id)]
    in_range = {"state": "dead", "scheduled_after": text(NOON - timedelta(days=1))}
    assert ids(api.get(OCCURRENCES, in_range)) == [str(newer.occurrence_id)]


def test_the_schedule_filter_keeps_only_that_schedule(api, two_schedules):
    first, second = two_schedules
    mine = [occurrence_for(second, at=NOON - timedelta(hours=n)) for n in range(2)]
    occurrence_for(first, at=NOON)

    assert ids(api.get(OCCURRENCES, {"schedule": str(second.id)})) == [str(row.occurrence_id) for row in mine]


def test_the_time_filters_select_the_half_open_range_after_to_before(api, two_schedules):
    first, _ = two_schedules
    rows = {hour: occurrence_for(first, at=NOON + timedelta(hours=hour)) for hour in range(4)}

    response = api.get(
        OCCURRENCES,
        {"scheduled_after": text(NOON + timedelta(hours=1)), "scheduled_before": text(NOON + timedelta(hours=3))},
    )

    assert ids(response) == [str(rows[2].occurrence_id), str(rows[1].occurrence_id)]


def test_each_time_filter_works_alone_and_takes_any_offset(api, two_schedules):
    first, _ = two_schedules
    early = occurrence_for(first, at=NOON - timedelta(days=1))
    late = occurrence_for(first, at=NOON + timedelta(days=1))

    # 13:00 at +01:00 is noon UTC.
    assert ids(api.get(OCCURRENCES, {"scheduled_after": "2031-03-10T13:00:00+01:00"})) == [str(late.occurrence_id)]
    assert ids(api.get(OCCURRENCES, {"scheduled_before": text(NOON)})) == [str(early.occurrence_id)]


def test_filters_combine(api, two_schedules):
    first, second = two_schedules
    wanted = occurrence_for(second, at=NOON, state=OccurrenceState.MISSED)
    occurrence_for(first, at=NOON, state=OccurrenceState.MISSED)
    occurrence_for(second, at=NOON - timedelta(days=2), state=OccurrenceState.MISSED)
    occurrence_for(second, at=NOON + timedelta(minutes=1))

    response = api.get(
        OCCURRENCES,
        {"state": "missed", "schedule": str(second.id), "scheduled_after": text(NOON - timedelta(days=1))},
    )

    assert ids(response) == [str(wanted.occurrence_id)]


def test_a_time_range_lets_postgresql_scan_only_the_days_it_covers(tenant_a):
    days = [date(2031, 3, 10), date(2031, 3, 11)]
    partitions.ensure_partitions(connection, days[0], days[-1])
    query = {"scheduled_after": text(NOON), "scheduled_before": text(NOON + timedelta(hours=1))}

    filtered = OccurrenceFilter(query, queryset=Occurrence.objects.for_tenant(tenant_a.tenant)).qs
    plan = filtered.explain()

    assert partitions.partition_name("dispatch_occurrence", days[0]) in plan
    assert partitions.partition_name("dispatch_occurrence", days[1]) not in plan
    assert "dispatch_occurrence_default" not in plan


# --- bad values -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "exploded"}, "state"),
        ({"state": "DEAD"}, "state"),
        ({"schedule": "not-a-uuid"}, "schedule"),
        ({"schedule": "1234"}, "schedule"),
        ({"scheduled_after": "yesterday"}, "scheduled_after"),
        ({"scheduled_after": "2031-02-30T00:00:00Z"}, "scheduled_after"),
        ({"scheduled_before": "2031-03-10T12:00:00"}, "scheduled_before"),  # naive: which zone?
        ({"scheduled_before": "1800-01-01T00:00:00Z"}, "scheduled_before"),
        ({"scheduled_after": "9999-12-31T23:59:59-23:59"}, "scheduled_after"),
        ({"scheduled_after": "0001-01-01T00:00:00+05:00"}, "scheduled_after"),
    ],
)
def test_a_bad_filter_value_answers_400_naming_the_parameter(api, query, field):
    response = api.get(OCCURRENCES, query)

    assert response.status_code == 400, response.content
    body = response.json()
    assert list(body) == [field]
    assert isinstance(body[field], list) and body[field]


def test_a_bad_state_is_told_the_states_there_are(api):
    message = api.get(OCCURRENCES, {"state": "exploded"}).json()["state"][0]

    assert "scheduled" in message and "skipped_overlap" in message
    assert "exploded" not in message


def test_after_later_than_before_answers_400(api):
    response = api.get(
        OCCURRENCES, {"scheduled_after": text(NOON), "scheduled_before": text(NOON - timedelta(seconds=1))}
    )

    assert response.status_code == 400
    assert "scheduled_after" in response.json()


def test_after_equal_to_before_is_an_empty_range(api, two_schedules):
    occurrence_for(two_schedules[0], at=NOON)

    response = api.get(OCCURRENCES, {"scheduled_after": text(NOON), "scheduled_before": text(NOON)})

    assert ids(response) == []


def test_a_nul_character_in_a_filter_answers_400(api):
    response = api.get(OCCURRENCES, {"state": "dead\x00"})

    assert response.status_code == 400
    assert "NUL" in response.json()["detail"]


def test_filters_do_not_apply_to_an_occurrence_detail(api, two_schedules):
    occurrence = occurrence_for(two_schedules[0], at=NOON, state=OccurrenceState.SUCCEEDED)

    response = api.get(f"{OCCURRENCES}{occurrence.occurrence_id}/", {"state": "dead"})

    assert response.status_code == 200
    assert response.json()["occurrence_id"] == str(occurrence.occurrence_id)


# --- tenancy --------------------------------------------------------------------------------------------


def test_occurrences_of_another_tenant_never_appear(api_a, api_b, tenant_a, tenant_b):
    theirs = occurrence_for(schedule_for(tenant_a.tenant), at=NOON)
    mine = occurrence_for(schedule_for(tenant_b.tenant), at=NOON - timedelta(hours=1))

    assert ids(api_b.get(OCCURRENCES)) == [str(mine.occurrence_id)]
    assert ids(api_b.get(OCCURRENCES, {"schedule": str(theirs.schedule_id)})) == []
    assert ids(api_b.get(OCCURRENCES, {"state": "scheduled", "scheduled_after": text(NOON)})) == []
    assert ids(api_a.get(OCCURRENCES)) == [str(theirs.occurrence_id)]


def test_the_list_needs_a_token_of_the_tenant(tenant_a, tenant_b):
    assert api_client_for(tenant_b, token=tenant_a.token).get(OCCURRENCES).status_code == 401
