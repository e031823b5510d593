"""A schedule's window (start_at, end_at) through the API, the materializer, the maintenance pass, reconcile and the
console: no fire before start_at or after end_at, and completed once end_at has passed with nothing pending
(docs/API.md, "The time model")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.clock import db_now
from dispatch.models import Occurrence
from dispatch.reconcile import reconcile
from schedules.models import Schedule
from tests.integration.support import form_data, materializer_holding_every_shard, run_materializer, split_instant
from tests.integration.test_admin_console import SCHEDULES_URL, change_url
from tests.integration.test_api_schedules import SCHEDULES


def z(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


def hourly(**window) -> dict:
    return {"name": "windowed", "kind": "cron", "cron": "0 * * * *", "handler": "noop", **window}


def preview(api, body: dict, *, after: datetime, count: int = 100) -> list[str]:
    response = api.post(f"{SCHEDULES}preview/", {**body, "after": after.isoformat(), "count": count}, format="json")
    assert response.status_code == 200, response.content
    return [fire["at"] for fire in response.json()["fires"]]


def test_both_ends_are_shown_null_when_unset_and_as_given_when_set(api_a):
    plain = api_a.post(SCHEDULES, hourly(), format="json").json()
    windowed = api_a.post(
        SCHEDULES, hourly(start_at="2030-01-01T00:00:00+01:00", end_at="2030-01-02T00:00:00Z"), format="json"
    )

    assert (plain["start_at"], plain["end_at"]) == (None, None)
    assert windowed.status_code == 201, windowed.content
    assert (windowed.json()["start_at"], windowed.json()["end_at"]) == ("2029-12-31T23:00:00Z", "2030-01-02T00:00:00Z")
    assert windowed.json()["next_run_at"] == "2029-12-31T23:00:00Z", "the first fire is start_at itself"


def test_the_preview_lists_only_the_fires_inside_the_window_both_ends_included(api_a):
    fires = preview(api_a, hourly(start_at="2030-01-01T10:00:00Z", end_at="2030-01-01T13:00:00Z"), after=z(2030, 1, 1))

    assert fires == ["2030-01-01T10:00:00Z", "2030-01-01T11:00:00Z", "2030-01-01T12:00:00Z", "2030-01-01T13:00:00Z"]


def test_an_interval_window_keeps_the_anchors_phase(api_a):
    body = {
        "name": "poll",
        "kind": "interval",
        "every_seconds": 5400,
        "anchor_at": "2030-01-01T00:00:00Z",
        "start_at": "2030-01-01T02:00:00Z",
        "end_at": "2030-01-01T06:00:00Z",
        "handler": "noop",
    }

    assert preview(api_a, body, after=z(2029, 12, 31)) == [
        "2030-01-01T03:00:00Z",
        "2030-01-01T04:30:00Z",
        "2030-01-01T06:00:00Z",
    ]


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        (hourly(start_at="2030-01-02T00:00:00Z", end_at="2030-01-01T00:00:00Z"), "end_at", "before start_at"),
        (hourly(start_at="2030-01-02T00:00:00"), "start_at", "offset"),
        (hourly(end_at="yesterday"), "end_at", "ISO 8601"),
    ],
)
def test_a_backwards_or_unreadable_window_is_a_400_naming_the_field(api_a, body, field, fragment):
    for path in (SCHEDULES, f"{SCHEDULES}preview/"):
        response = api_a.post(path, body, format="json")

        assert response.status_code == 400, response.content
        assert fragment in " ".join(response.json()[field])


@pytest.mark.parametrize(
    "body",
    [
        hourly(end_at="2020-01-01T00:00:00Z"),
        {"name": "o", "kind": "once", "run_at": "2030-01-01T00:00:00Z", "end_at": "2029-12-31T00:00:00Z"},
        {"name": "o", "kind": "once", "run_at": "2030-01-01T00:00:00Z", "start_at": "2030-01-02T00:00:00Z"},
    ],
)
def test_a_schedule_with_no_fire_in_its_window_is_completed_at_once_and_previews_none(api_a, body):
    body = {"handler": "noop", **body}
    response = api_a.post(SCHEDULES, body, format="json")

    assert response.status_code == 201, response.content
    assert (response.json()["state"], response.json()["next_run_at"]) == ("completed", None)
    assert preview(api_a, body, after=z(2020, 1, 1)) == []


def test_the_materializer_writes_exactly_the_window_and_the_schedule_completes_once_end_at_has_passed(
    tenant_a, make_schedule
):
    """A driven clock through a window in the past (end_at before the database's clock): fires before start_at and
    after end_at never get a row, reconcile expects exactly the window, and the maintenance pass completes the
    schedule once its last occurrence has ended. One with no fire left in its window but an end_at still ahead stays
    active until then."""
    real_now = db_now()
    since = (real_now - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    start, end = since + timedelta(hours=3), since + timedelta(hours=6)
    past = make_schedule(tenant_a.tenant, now=since, cron="0 * * * *", start_at=start, end_at=end, name="past")
    # 29 February: no fire before 2028, so nothing is pending from the start.
    ahead = make_schedule(
        tenant_a.tenant, now=since, cron="0 0 29 2 *", start_at=start, end_at=real_now + timedelta(days=1), name="ahead"
    )
    assert (ahead.state, ahead.next_run_at) == ("active", None)
    materializer = materializer_holding_every_shard("window")

    run_materializer(materializer, *(since + timedelta(minutes=30 * step) for step in range(20)))

    rows = Occurrence.objects.filter(schedule_id=past.id).order_by("scheduled_for")
    assert list(rows.values_list("scheduled_for", flat=True)) == [start + timedelta(hours=h) for h in range(4)]
    report = reconcile(
        since=since, until=since + timedelta(hours=10), tenant_id=tenant_a.tenant.id, now=since + timedelta(hours=10)
    )
    assert report.ok, report.as_dict(gap_limit=5)
    assert Schedule.objects.get(pk=past.id).state == "active", "its occurrences have not ended"

    Occurrence.objects.filter(schedule_id__in=[past.id]).update(state="succeeded", finished_at=real_now)
    materializer.complete_fired_one_offs()

    assert Schedule.objects.get(pk=past.id).state == "completed"
    assert Schedule.objects.get(pk=ahead.id).state == "active", "end_at still ahead: not completed yet"


def test_the_change_form_saves_a_window_as_a_new_version_and_the_list_reads_it(console, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, cron="0 9 * * *")

    data = form_data(schedule, **split_instant("start_at", z(2030, 1, 1, 9)), **split_instant("end_at", z(2030, 6, 30)))
    response = console.post(change_url(schedule), data)

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.start_at, schedule.end_at, schedule.version) == (z(2030, 1, 1, 9), z(2030, 6, 30), 2)
    assert "from 2030-01-01 09:00 UTC until 2030-06-30 00:00 UTC" in console.get(SCHEDULES_URL).content.decode()


def test_a_one_off_with_an_end_at_far_ahead_completes_once_its_fire_has_ended(tenant_a, make_schedule):
    run_at = db_now() - timedelta(minutes=5)
    schedule = make_schedule(
        tenant_a.tenant, now=run_at - timedelta(minutes=1), kind="once", run_at=run_at, end_at=z(2100, 1, 1)
    )
    materializer = materializer_holding_every_shard("window-once")
    run_materializer(materializer, run_at)
    Occurrence.objects.filter(schedule_id=schedule.id).update(state="succeeded", finished_at=run_at)

    materializer.complete_fired_one_offs()

    assert Schedule.objects.get(pk=schedule.id).state == "completed"
