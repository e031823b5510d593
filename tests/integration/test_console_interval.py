"""Interval schedules in the operator console: the list's words and next fire, the change form's interval fields
(saved through the service as new versions), the live preview with its clock-change notes, the dashboard's fires
due in the next hour."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from core.clock import db_now
from dispatch import dashboard
from schedules.models import Schedule, ScheduleVersion
from schedules.services import create_schedule
from tests.conftest import move_cursor
from tests.integration.support import form_data
from tests.integration.test_admin_console import PREVIEW_URL, SCHEDULES_URL, change_url, preview

ANCHOR = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)


@pytest.fixture
def make_interval(tenant_a):
    def make(**fields) -> Schedule:
        data = {
            "name": "poll-inbox",
            "kind": "interval",
            "every_seconds": 90,
            "anchor_at": ANCHOR,
            "timezone": "America/New_York",
            "handler": "noop",
            **fields,
        }
        schedule, _ = create_schedule(tenant=tenant_a.tenant, data=data, actor="tenant:acme/api")
        return schedule

    return make


def interval_form(schedule: Schedule, **overrides) -> dict:
    anchor = schedule.anchor_at.astimezone(UTC) if schedule.anchor_at else None
    fields = {
        "every_seconds": schedule.every_seconds or "",
        "anchor_at_0": f"{anchor:%Y-%m-%d}" if anchor else "",
        "anchor_at_1": f"{anchor:%H:%M:%S}" if anchor else "",
    }
    return form_data(schedule, **{**fields, **overrides})


# --- list and change page ----------------------------------------------------------------------------------------


def test_the_list_reads_an_interval_in_words_and_shows_its_next_fire_from_the_rule(console: Client, make_interval):
    schedule = make_interval()
    before = db_now()

    html = console.get(SCHEDULES_URL).content.decode()

    assert "Every 1 min 30 s from 2026-01-01 00:00:05 UTC, elapsed time (America/New_York)" in html
    # The page reads its own clock: a fire can fall due between `before` and the render, and then the next one shows.
    candidates = [schedule.time_rule.next_after(at) for at in (before, db_now())]
    assert all(fire is not None and (fire - ANCHOR) % timedelta(seconds=90) == timedelta(0) for fire in candidates)
    assert any(f"{fire:%Y-%m-%d %H:%M:%S} UTC" in html for fire in candidates)


def test_the_change_page_shows_the_interval_fields_its_next_fires_and_the_clock_change_ahead(
    console: Client, make_interval
):
    schedule = make_interval(every_seconds=86400)

    response = console.get(change_url(schedule))

    html = response.content.decode()
    assert 'name="every_seconds"' in html and 'value="86400"' in html
    assert 'name="anchor_at_0"' in html and 'value="2026-01-01"' in html
    fires = response.context["next_fires"]
    assert len(fires) == 10 and all(fire["utc"].endswith("00:00:05 UTC") for fire in fires)
    notes = response.context["dst_notes"] + response.context["dst_ahead"]
    assert notes and all("keeps its rhythm in elapsed time" in note for note in notes)


def test_saving_a_new_period_in_the_form_is_a_new_version_through_the_service(console: Client, make_interval):
    schedule = make_interval()

    response = console.post(change_url(schedule), interval_form(schedule, every_seconds=600))

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.every_seconds, schedule.anchor_at, schedule.version) == (600, ANCHOR, 2)
    version = ScheduleVersion.objects.get(schedule=schedule, version=2)
    assert (version.actor, version.definition["every_seconds"]) == ("operator:ops", 600)
    assert (schedule.next_run_at - ANCHOR) % timedelta(seconds=600) == timedelta(0)


def test_switching_a_cron_schedule_to_interval_in_the_form_drops_the_cron_and_anchors_now(
    console: Client, make_interval
):
    schedule = make_interval(kind="cron", cron="30 2 * * *", every_seconds=None, anchor_at=None)
    before = db_now()

    response = console.post(change_url(schedule), form_data(schedule, kind="interval", every_seconds=300))

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.kind, schedule.cron, schedule.every_seconds, schedule.version) == ("interval", None, 300, 2)
    assert schedule.anchor_at is not None and schedule.anchor_at.microsecond == 0
    assert before - timedelta(seconds=1) < schedule.anchor_at <= db_now()


def test_an_interval_without_a_period_is_a_form_error_and_saves_nothing(console: Client, make_interval):
    schedule = make_interval()

    response = console.post(change_url(schedule), interval_form(schedule, every_seconds=""))

    assert response.status_code == 200
    assert "every_seconds" in response.context["adminform"].form.errors
    schedule.refresh_from_db()
    assert (schedule.version, schedule.every_seconds) == (1, 90)


# --- the live preview ----------------------------------------------------------------------------------------------


def test_the_live_preview_of_an_interval_notes_the_clock_change_at_the_first_fire_after_it(console, tenants):
    body = {
        "kind": "interval",
        "every_seconds": 86400,
        "anchor_at": "2026-03-06T14:00:00Z",
        "timezone": "America/New_York",
        "after": "2026-03-06T00:00:00Z",
        "count": 4,
    }

    status, data = preview(console, body)

    assert status == 200, data
    assert data["summary"] == "Every 1 d from 2026-03-06 14:00 UTC, elapsed time (America/New_York)"
    assert [fire["local_text"] for fire in data["fires"]] == [
        "2026-03-06 09:00 EST (UTC-05:00)",
        "2026-03-07 09:00 EST (UTC-05:00)",
        "2026-03-08 10:00 EDT (UTC-04:00)",
        "2026-03-09 10:00 EDT (UTC-04:00)",
    ]
    assert [note["kind"] for note in data["notes"]] == ["elapsed"]
    assert [bool(fire["note"]) for fire in data["fires"]] == [False, False, True, False]
    assert "1 h later on the local clock" in data["fires"][2]["note"]
    assert data["ahead"] and "go back" in data["ahead"][0]["text"]


def test_the_live_preview_agrees_with_the_api_and_anchors_an_unsaved_interval_now(console, api_a):
    body = {
        "kind": "interval",
        "every_seconds": 45,
        "anchor_at": "2026-01-01T00:00:00Z",
        "after": "2026-12-01T00:00:00Z",
    }
    status, data = preview(console, body)
    api = api_a.post("/api/v1/schedules/preview/", body, format="json").json()
    assert status == 200 and [f["at"] for f in data["fires"]] == [f["at"] for f in api["fires"]]

    status, data = preview(console, {"kind": "interval", "every_seconds": 45, "count": 2})
    assert status == 200
    first, second = (datetime.fromisoformat(fire["at"]) for fire in data["fires"])
    assert second - first == timedelta(seconds=45) and first.microsecond == 0


def test_the_live_preview_refuses_interval_fields_on_another_kind(console, tenants):
    status, data = preview(console, {"kind": "cron", "cron": "* * * * *", "every_seconds": 60})

    assert status == 400 and list(data) == ["every_seconds"]
    assert console.post(PREVIEW_URL, json.dumps({"kind": "interval"}), content_type="application/json").json() == {
        "every_seconds": ["Required for kind 'interval', e.g. 300 (5 minutes)."]
    }


# --- the dashboard -------------------------------------------------------------------------------------------------


def test_fires_due_next_hour_count_every_fire_of_an_interval_from_its_cursor(make_interval):
    now = db_now()
    ahead = make_interval(name="every-5-min", every_seconds=300, anchor_at=now.replace(microsecond=0))
    behind = make_interval(name="every-20-min-behind", every_seconds=1200, anchor_at=ANCHOR)
    # The materializer is down: this cursor trails now by two periods, its fires still fall due in the hour.
    move_cursor(behind.pk, behind.time_rule.next_after(now - timedelta(seconds=2500)))

    due = dict(dashboard.build().due)

    expected: dict[datetime, int] = {}
    for schedule in (ahead, behind):
        for fire in schedule.time_rule.fires_between(now, now + timedelta(minutes=60)):
            minute = fire.replace(second=0, microsecond=0)
            expected[minute] = expected.get(minute, 0) + 1
    assert sum(expected.values()) == 12 + 3
    assert due == expected


def test_due_per_minute_expands_an_interval_group_by_its_period():
    now = datetime(2026, 12, 2, 4, 0, 30, tzinfo=UTC)
    groups = [
        ("interval", None, None, 1200, datetime(2026, 12, 2, 4, 10, 5, tzinfo=UTC), 3),  # 04:10, 04:30, 04:50
        # 04:59:50 and 05:00:10; 05:00:30 is the end of the window, not in it
        ("interval", None, None, 20, datetime(2026, 12, 2, 4, 59, 50, tzinfo=UTC), 1),
    ]

    due = dashboard.due_per_minute(now, now + timedelta(minutes=60), [], groups)

    assert {minute.strftime("%H:%M"): count for minute, count in due} == {
        "04:10": 3,
        "04:30": 3,
        "04:50": 3,
        "04:59": 1,
        "05:00": 1,
    }


@pytest.mark.parametrize("day", ["9999-12-31", "0001-01-01"])
def test_an_anchor_or_run_at_past_the_accepted_range_is_a_form_error_not_a_server_error(
    console: Client, make_interval, day
):
    interval = make_interval(timezone="Asia/Tokyo")
    once = make_interval(
        name="launch", kind="once", run_at=datetime(2030, 1, 1, tzinfo=UTC), every_seconds=None, anchor_at=None
    )

    for schedule, fields in (
        (interval, interval_form(interval, anchor_at_0=day, anchor_at_1="23:59:59")),
        (once, form_data(once, run_at_0=day, run_at_1="23:59:59")),
    ):
        response = console.post(change_url(schedule), fields)

        assert response.status_code == 200
        field = "anchor_at" if schedule.kind == "interval" else "run_at"
        assert response.context["adminform"].form.errors[field] == ["Must be from 1900 up to 9000 (UTC)."]
        assert console.get(change_url(schedule)).status_code == 200
        schedule.refresh_from_db()
        assert schedule.version == 1
