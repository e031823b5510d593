"""The operator console as a product: what the schedule and occurrence pages show, the live preview, the timelines,
the operations (each through its service, each in Recent actions) and the tenant's API token."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.clock import db_now
from dispatch.models import Attempt, Occurrence, OccurrenceState
from dispatch.stuck import stuck_pages
from schedules.models import Schedule, ScheduleVersion
from schedules.services import cancel_schedule, create_schedule, pause_schedule
from tenants.credentials.tokens import digest_of, tokens_of
from tests.conftest import api_client_for, mark_completed, move_cursor, occurrence_for
from tests.integration.support import form_data

SCHEDULES_URL = "/admin/schedules/schedule/"
OCCURRENCES_URL = "/admin/dispatch/occurrence/"
PREVIEW_URL = "/admin/schedules/schedule/preview/"
NEW_YORK = ZoneInfo("America/New_York")


@pytest.fixture
def make(tenant_a):
    """A schedule of acme through the service: daily at 02:30 New York unless told otherwise."""

    def make(**fields) -> Schedule:
        now = fields.pop("now", None)
        data = {
            "name": "nightly-report",
            "kind": "cron",
            "cron": "30 2 * * *",
            "timezone": "America/New_York",
            "handler": "noop",
            **fields,
        }
        schedule, _ = create_schedule(tenant=tenant_a.tenant, data=data, actor="tenant:acme/api", now=now)
        return schedule

    return make


def change_url(schedule: Schedule) -> str:
    return f"{SCHEDULES_URL}{schedule.pk}/change/"


def texts(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def html_of(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def occurrence_page(console: Client, occurrence: Occurrence) -> str:
    return html_of(console.get(f"{OCCURRENCES_URL}{occurrence.pk}/change/"))


def preview(console: Client, body) -> tuple[int, dict]:
    payload = body if isinstance(body, str | bytes) else json.dumps(body)
    response = console.post(PREVIEW_URL, payload, content_type="application/json")
    return response.status_code, response.json()


def entries_for(obj) -> list[str]:
    return list(LogEntry.objects.filter(object_id=str(obj.pk)).values_list("change_message", flat=True))


# --- the frame ----------------------------------------------------------------------------------------------------


def test_every_console_page_declares_its_icon_and_the_icon_is_served(console, db):
    icon = re.compile(r'<link rel="icon" href="(/static/schedules/favicon\.svg)" type="image/svg\+xml">')
    for url in ("/admin/", SCHEDULES_URL, OCCURRENCES_URL):
        assert icon.search(html_of(console.get(url))), url
    login_page = Client(HTTP_HOST="localhost").get("/admin/login/").content.decode()
    found = icon.search(login_page)
    assert found, "the login page too"

    served = Client(HTTP_HOST="localhost").get(found.group(1))
    assert served.status_code == 200
    assert served["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(served.streaming_content)
    legacy = Client(HTTP_HOST="localhost").get("/favicon.ico")
    assert legacy.status_code == 301 and legacy["Location"] == found.group(1)


# --- schedule list ------------------------------------------------------------------------------------------------


def test_schedule_list_shows_the_last_run_with_its_state_and_the_next_fire_from_the_rule(console, make):
    schedule = make(cron="*/5 * * * *", timezone="UTC")
    now = db_now()
    last = occurrence_for(schedule, at=now - timedelta(minutes=3), state=OccurrenceState.DEAD)
    # The materializer runs a horizon ahead: the cursor already sits past the next fire, which is materialized.
    next_fire = schedule.time_rule.next_after(now)
    move_cursor(schedule.pk, next_fire + timedelta(minutes=10))

    html = html_of(console.get(SCHEDULES_URL))

    assert f"{last.scheduled_for:%Y-%m-%d %H:%M}" in html and "sched-state-dead" in html
    assert f"/admin/dispatch/occurrence/{last.pk}/change/" in html
    assert f"{next_fire:%Y-%m-%d %H:%M} UTC" in html
    assert f"{next_fire + timedelta(minutes=10):%Y-%m-%d %H:%M} UTC" not in html
    assert "behind" not in html


def test_schedule_list_warns_when_the_cursor_is_behind_now(console, make):
    lagging = make(name="lagging", cron="* * * * *", timezone="UTC")
    on_time = make(name="on-time", cron="* * * * *", timezone="UTC")
    now = db_now()
    move_cursor(lagging.pk, now - timedelta(minutes=7))
    move_cursor(on_time.pk, now - timedelta(seconds=2))

    html = html_of(console.get(SCHEDULES_URL))

    assert html.count("cursor-behind") == 1
    assert re.search(r"cursor is at [0-9: -]+ UTC: fires already due", html)
    assert re.search(r"cursor 7 min \d+ s behind", html)
    page = html_of(console.get(change_url(lagging)))
    assert re.search(r"7 min \d+ s behind now</span>. Fires already due have not been materialized", page)


def test_the_last_run_is_the_newest_version_at_an_instant_and_never_a_fire_withdrawn_unrun(console, make):
    schedule = make(cron="* * * * *", timezone="UTC")
    minute = db_now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    # 02:34 in the audit: version 2's fire was withdrawn by an update, version 3's fire at the same instant ran.
    withdrawn = occurrence_for(
        schedule, at=minute, version=2, state=OccurrenceState.CANCELED, state_reason="withdrawn: schedule updated"
    )
    ran = occurrence_for(schedule, at=minute, version=3, state=OccurrenceState.SUCCEEDED, attempt_count=1)
    # The next minute's fire was withdrawn by a pause before any worker claimed it: it never ran.
    occurrence_for(
        schedule,
        at=minute + timedelta(minutes=1),
        version=3,
        state=OccurrenceState.CANCELED,
        state_reason="withdrawn: schedule paused",
    )

    html = html_of(console.get(SCHEDULES_URL))

    assert f"/admin/dispatch/occurrence/{ran.pk}/change/" in html
    assert f"/admin/dispatch/occurrence/{withdrawn.pk}/change/" not in html
    assert f'{minute:%Y-%m-%d %H:%M} UTC</a> <span class="sched-state sched-state-succeeded">' in html
    assert "sched-state-canceled" not in html


def test_a_fire_canceled_while_it_ran_is_still_the_last_run(console, make):
    schedule = make(cron="* * * * *", timezone="UTC")
    minute = db_now().replace(second=0, microsecond=0) - timedelta(minutes=2)
    occurrence_for(schedule, at=minute - timedelta(minutes=1), state=OccurrenceState.SUCCEEDED, attempt_count=1)
    stopped = occurrence_for(
        schedule, at=minute, state=OccurrenceState.CANCELED, attempt_count=1, state_reason="schedule canceled"
    )

    html = html_of(console.get(SCHEDULES_URL))

    assert f"/admin/dispatch/occurrence/{stopped.pk}/change/" in html and "sched-state-canceled" in html


@pytest.mark.parametrize(
    ("state", "shown"),
    [
        (OccurrenceState.DEAD, "fired — dead"),
        (OccurrenceState.MISSED, "fired — missed"),
        (OccurrenceState.ENQUEUED, "fired — queued"),
        (OccurrenceState.SUCCEEDED, "fired — succeeded"),
    ],
)
def test_a_fired_one_off_shows_what_happened_to_its_fire_not_completed(console, make, state, shown):
    run_at = db_now() - timedelta(minutes=1)
    one_off = make(name="welcome-email", kind="once", cron=None, run_at=run_at, timezone="UTC")
    occurrence_for(one_off, at=run_at, state=state)
    # What the materializer does once it has written the fire (a test stand-in; the console never writes states).
    mark_completed(one_off.pk)

    html = html_of(console.get(SCHEDULES_URL))

    assert shown in html
    assert "sched-state-completed" not in html


def test_the_schedule_list_reads_its_run_columns_in_one_query_for_the_whole_page(console, make):
    def occurrence_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            html_of(console.get(SCHEDULES_URL))
        return sum("dispatch_occurrence" in query["sql"] for query in queries.captured_queries)

    first = make(name="first", cron="* * * * *")
    occurrence_for(first, at=db_now() - timedelta(minutes=1), state=OccurrenceState.SUCCEEDED)
    with_one = occurrence_queries()
    for index in range(5):
        extra = make(name=f"more-{index}", cron="* * * * *")
        occurrence_for(extra, at=db_now() - timedelta(minutes=1), state=OccurrenceState.SUCCEEDED)

    assert occurrence_queries() == with_one == 1


# --- the schedule form ---------------------------------------------------------------------------------------------


def test_a_rejected_edit_keeps_the_zone_typed_and_shows_the_stored_rule(console, make):
    schedule = make()

    html = html_of(console.post(change_url(schedule), form_data(schedule, cron="61 * * * *", timezone="Europe/Madrid")))

    select = re.search(r'<select name="timezone".*?</select>', html, re.S).group(0)
    assert re.findall(r'<option value="([^"]+)" selected>', select) == ["Europe/Madrid"]
    assert "At 02:30 every day (America/New_York)" in html
    assert "(Europe/Madrid)" not in html
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.timezone, schedule.version) == ("30 2 * * *", "America/New_York", 1)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"priority": "500"}, "priority"), ({"kind": "once"}, "run_at"), ({"max_lateness_seconds": "-5"}, "max_lateness")],
)
def test_a_rejected_edit_reports_each_problem_once(console, make, overrides, field):
    schedule = make()

    html = html_of(console.post(change_url(schedule), form_data(schedule, **overrides)))

    errors = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', html, re.S)
    assert len(errors) == 1, errors
    assert "Constraint" not in html


def test_a_saved_edit_says_so_once(console, make):
    schedule = make()

    response = console.post(change_url(schedule), form_data(schedule, cron="0 9 * * 1-5"), follow=True)

    assert texts(response) == ["nightly-report saved as version 2 (cron changed) by the service."]


def test_the_change_page_offers_the_live_preview_from_a_local_script(console, make):
    schedule = make()
    html = html_of(console.get(change_url(schedule)))

    # With the schedule's tenant: its calendars decide the fires.
    assert 'id="live-preview"' in html and f'data-preview-url="{PREVIEW_URL}?tenant={schedule.tenant_id}"' in html
    script = re.search(r'<script src="(/static/schedules/js/preview\.js)"', html).group(1)
    served = Client(HTTP_HOST="localhost").get(script)
    assert served.status_code == 200
    assert not re.search(r'(?:src|href)="https?://', html), "nothing from another host: the console works offline"


# --- the preview JSON view ---------------------------------------------------------------------------------------


def test_preview_lists_the_next_fires_of_a_definition_as_typed(console, tenants):
    status, data = preview(console, {"kind": "cron", "cron": "0 9 * * 1-5", "timezone": "Europe/Madrid", "count": 5})

    assert status == 200
    assert data["summary"] == "At 09:00 on Monday through Friday (Europe/Madrid)"
    assert len(data["fires"]) == 5
    for fire in data["fires"]:
        local = datetime.fromisoformat(fire["local"])
        assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
        assert fire["at"].endswith("Z")


def test_preview_agrees_with_the_api_preview_for_the_same_body(console, api_a):
    body = {"kind": "cron", "cron": "*/20 3 * * *", "timezone": "Asia/Kolkata", "after": "2026-12-01T00:00:00Z"}

    status, data = preview(console, body)
    api = api_a.post("/api/v1/schedules/preview/", body, format="json")

    assert status == 200 and api.status_code == 200
    assert [(fire["at"], fire["local"]) for fire in data["fires"]] == [
        (fire["at"], fire["local"]) for fire in api.json()["fires"]
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "cron", "cron": "61 * * * *"}, "cron"),
        ({"kind": "cron", "cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"kind": "once", "run_at": "tomorrow"}, "run_at"),
        ({"kind": "cron", "cron": "* * * * *", "count": 1000}, "count"),
        ({"kind": "cron", "cron": "* * * * *", "priority": "high"}, "priority"),
        ({"kind": "cron", "cron": "* * * * *", "bogus": 1}, "bogus"),
        ({"kind": "weekly"}, "kind"),
    ],
)
def test_preview_refuses_a_bad_definition_with_field_errors(console, tenants, body, field):
    status, data = preview(console, body)

    assert status == 400
    assert field in data and all(isinstance(message, str) for message in data[field])


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '{"a": NaN}', '"text"', b"\xff\xfe"])
def test_preview_refuses_a_body_that_is_not_a_json_object(console, tenants, body):
    status, data = preview(console, body)

    assert status == 400 and "detail" in data


def test_preview_takes_only_posts_from_a_signed_in_operator(console, db):
    assert console.get(PREVIEW_URL).status_code == 405
    anonymous = Client(HTTP_HOST="localhost").post(PREVIEW_URL, "{}", content_type="application/json")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]


def test_preview_notes_a_wall_time_skipped_by_spring_forward(console, tenants):
    body = {"kind": "cron", "cron": "30 2 * * *", "timezone": "America/New_York", "after": "2027-03-10T12:00:00Z"}

    status, data = preview(console, body)

    assert status == 200
    assert [note["text"] for note in data["notes"]] == [
        "02:30 does not exist on 2027-03-14 in America/New_York: skipped (the clocks jump from 02:00 to 03:00)."
    ]
    days = [datetime.fromisoformat(fire["local"]).date().isoformat() for fire in data["fires"]]
    assert "2027-03-13" in days and "2027-03-15" in days and "2027-03-14" not in days


def test_preview_notes_a_repeated_hour_that_fires_once_at_the_first(console, tenants):
    body = {"kind": "cron", "cron": "30 1 * * *", "timezone": "America/New_York", "after": "2026-10-28T12:00:00Z"}

    status, data = preview(console, body)

    assert status == 200
    (note,) = data["notes"]
    assert note["kind"] == "repeated"
    assert "01:30 occurs twice: fires once, at the first (01:30 EDT, 05:30 UTC)" in note["text"]
    (fall_back,) = [fire for fire in data["fires"] if fire["note"]]
    assert fall_back["at"] == "2026-11-01T05:30:00Z"


def test_preview_warns_of_the_next_clock_change_beyond_the_fires_it_lists(console, tenants):
    body = {"kind": "cron", "cron": "30 2 * * *", "timezone": "America/New_York", "after": "2026-12-01T00:00:00Z"}

    status, data = preview(console, body)

    assert status == 200 and data["notes"] == []
    assert [note["text"] for note in data["ahead"]] == [
        "02:30 does not exist on 2027-03-14 in America/New_York: skipped (the clocks jump from 02:00 to 03:00)."
    ]


def test_preview_of_a_rule_away_from_clock_changes_has_no_notes(console, tenants):
    status, data = preview(console, {"kind": "cron", "cron": "30 2 * * *", "timezone": "UTC"})

    assert status == 200 and data["notes"] == data["ahead"] == []
    assert all(fire["note"] == "" for fire in data["fires"])


def test_the_change_page_notes_clock_changes_among_its_next_fires(console, make):
    # Every 30 minutes in New York: the next fires of a schedule previewed at a fall-back are out of our control
    # (db clock), so the rule's own notes are checked through the view's helper instead.
    from core.dst import dst_notes

    fires = [datetime(2026, 11, 1, 5, 0, tzinfo=UTC) + timedelta(minutes=30 * n) for n in range(4)]
    notes = dst_notes("*/30 * * * *", "America/New_York", after=fires[0] - timedelta(minutes=1), fires=fires)

    assert [note.kind for note in notes] == ["repeated"]
    assert "01:00 and 01:30 occur twice: each fires once, at the first (EDT), not again in EST." in notes[0].text


# --- the occurrence list -----------------------------------------------------------------------------------------


def test_occurrence_list_is_newest_first_within_the_last_hour_by_default(console, make):
    schedule = make(cron="* * * * *", timezone="UTC")
    now = db_now()
    older, newer, newest = (occurrence_for(schedule, at=now - timedelta(minutes=minutes)) for minutes in (40, 20, 5))
    outside = occurrence_for(schedule, at=now - timedelta(hours=3))

    html = html_of(console.get(OCCURRENCES_URL))

    positions = [html.find(str(occurrence.pk)) for occurrence in (newest, newer, older)]
    assert -1 not in positions and positions == sorted(positions)
    assert str(outside.pk) not in html


def test_occurrence_list_range_filter_reaches_back_and_stops_where_told(console, make):
    schedule = make(cron="* * * * *", timezone="UTC")
    now = db_now()
    day_old = occurrence_for(schedule, at=now - timedelta(hours=23))
    week_old = occurrence_for(schedule, at=now - timedelta(days=6))
    recent = occurrence_for(schedule, at=now - timedelta(minutes=1))

    last_day = html_of(console.get(OCCURRENCES_URL, {"scheduled_after": "now-24h"}))
    window = (now - timedelta(days=7)).strftime("%Y-%m-%d %H:%M")
    bounded = html_of(
        console.get(
            OCCURRENCES_URL, {"scheduled_after": window, "scheduled_before": (now - timedelta(hours=1)).isoformat()}
        )
    )

    assert str(day_old.pk) in last_day and str(recent.pk) in last_day and str(week_old.pk) not in last_day
    assert str(day_old.pk) in bounded and str(week_old.pk) in bounded and str(recent.pk) not in bounded


@pytest.mark.parametrize(
    "query",
    [{"scheduled_after": "yesterday"}, {"scheduled_after": "0001-01-01T00:00:00+05:00"}, {"scheduled_before": "now-x"}],
)
def test_a_bad_range_is_reported_and_the_default_range_shown(console, make, query):
    response = console.get(OCCURRENCES_URL, query)

    assert response.status_code == 200
    assert any("Range ignored" in text for text in texts(response))


def test_the_stuck_filter_lists_what_dispatch_stuck_finds_within_the_range(console, make):
    schedule = make(cron="* * * * *", timezone="UTC")
    now = db_now()
    half_hour = now - timedelta(minutes=30)
    stuck = [
        occurrence_for(schedule, at=half_hour, state=OccurrenceState.ENQUEUED),
        occurrence_for(
            schedule,
            at=half_hour + timedelta(minutes=1),
            state=OccurrenceState.RUNNING,
            attempt_count=1,
            lease_expires_at=now - timedelta(minutes=20),
        ),
    ]
    healthy = [
        occurrence_for(schedule, at=now - timedelta(minutes=2), state=OccurrenceState.ENQUEUED),
        occurrence_for(schedule, at=half_hour + timedelta(minutes=2), state=OccurrenceState.SUCCEEDED),
        occurrence_for(
            schedule,
            at=half_hour + timedelta(minutes=3),
            state=OccurrenceState.RUNNING,
            attempt_count=1,
            lease_expires_at=now + timedelta(seconds=30),
        ),
    ]
    earlier = occurrence_for(schedule, at=now - timedelta(hours=3), state=OccurrenceState.SCHEDULED)

    found = {
        row.occurrence_id for page in stuck_pages(since=now - timedelta(days=1), until=now, now=now) for row in page
    }
    assert found == {o.pk for o in [*stuck, earlier]}, "the fixture is what the one definition calls stuck"

    def listed(query: str) -> set[str]:
        html = html_of(console.get(f"{OCCURRENCES_URL}?{query}"))
        return {o for o in (str(x.pk) for x in [*stuck, *healthy, earlier]) if f"/{o}/change/" in html}

    assert listed("stuck=1") == {str(o.pk) for o in stuck}, "the default hour: the one 3 h ago is outside it"
    assert listed("stuck=1&scheduled_after=now-24h") == {str(o.pk) for o in [*stuck, earlier]}
    assert listed("stuck=banana") == {str(o.pk) for o in [*stuck, *healthy]}, "not a choice: ignored"


def test_the_dashboards_stuck_tile_links_to_the_stuck_filter_over_its_day(console, db):
    html = html_of(console.get("/admin/"))

    assert re.search(r'class="tile[^"]*" href="/admin/dispatch/occurrence/\?stuck=1&amp;scheduled_after=now-24h"', html)


def test_one_schedules_occurrences_are_listed_over_any_range(console, make):
    schedule = make(cron="* * * * *", timezone="UTC")
    other = make(name="other", cron="* * * * *", timezone="UTC")
    now = db_now()
    old = occurrence_for(schedule, at=now - timedelta(days=3))
    theirs = occurrence_for(other, at=now - timedelta(minutes=1))

    html = html_of(console.get(OCCURRENCES_URL, {"schedule": str(schedule.pk)}))

    assert str(old.pk) in html and str(theirs.pk) not in html
    assert "not a schedule id" in " ".join(texts(console.get(OCCURRENCES_URL, {"schedule": "nope"})))


def test_occurrence_list_shows_lateness_and_duration_with_seconds_and_zone(console, make):
    schedule = make(cron="* * * * *", timezone="America/New_York")
    at = (db_now() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    occurrence = occurrence_for(
        schedule, at=at, state=OccurrenceState.SUCCEEDED, enqueued_at=at + timedelta(seconds=1.5), attempt_count=1
    )
    Attempt.objects.create(
        occurrence_id=occurrence.pk,
        scheduled_for=at,
        generation=1,
        started_at=at + timedelta(seconds=2.25),
        finished_at=at + timedelta(seconds=3.75),
        outcome="succeeded",
    )

    html = html_of(console.get(OCCURRENCES_URL))

    assert f"{at:%Y-%m-%d %H:%M}:00.000 UTC" in html
    assert f"{at.astimezone(NEW_YORK):%Y-%m-%d %H:%M}:00 {at.astimezone(NEW_YORK).tzname()}" in html
    assert "enqueued +1.500 s" in html and "started +2.250 s" in html
    assert "1.500 s" in html


def test_the_schedule_page_links_to_its_occurrences(console, make):
    schedule = make()

    html = html_of(console.get(change_url(schedule)))

    assert f"{OCCURRENCES_URL}?schedule={schedule.pk}" in html


# --- timelines ----------------------------------------------------------------------------------------------------


def test_a_missed_occurrence_says_by_how_much_and_which_rule_decided(console, make):
    schedule = make()
    at = db_now() - timedelta(hours=1)
    occurrence = occurrence_for(
        schedule,
        at=at,
        state=OccurrenceState.MISSED,
        finished_at=at + timedelta(seconds=612),
        state_reason="late by 612 s > max lateness 60 s (skip)",
    )

    html = occurrence_page(console, occurrence)

    assert "missed: late by 612 s &gt; max lateness 60 s (skip)" in html
    assert "Decided by the rule of version 1: misfire policy skip, max lateness 60 s" in html
    assert "Fire time (scheduled for)" in html and "Finished: missed" in html


def test_a_skipped_occurrence_links_the_occurrence_it_overlapped(console, make):
    schedule = make(overlap_policy="skip_if_running")
    at = db_now() - timedelta(minutes=30)
    running = occurrence_for(schedule, at=at - timedelta(minutes=1), state=OccurrenceState.RUNNING)
    skipped = occurrence_for(
        schedule,
        at=at,
        state=OccurrenceState.SKIPPED_OVERLAP,
        finished_at=at,
        state_reason=f"overlap: occurrence {running.pk} still running (skip_if_running)",
    )

    html = occurrence_page(console, skipped)

    assert f"skipped: overlap: occurrence {running.pk} still running (skip_if_running)" in html
    assert f'href="/admin/dispatch/occurrence/{running.pk}/change/"' in html
    assert "overlap policy of version 1 (skip_if_running)" in html


def test_a_dead_occurrence_shows_each_attempt_with_its_error_and_offers_a_replay(console, make):
    schedule = make()
    at = db_now() - timedelta(minutes=30)
    occurrence = occurrence_for(
        schedule,
        at=at,
        state=OccurrenceState.DEAD,
        attempt_count=2,
        enqueued_at=at + timedelta(seconds=0.2),
        finished_at=at + timedelta(seconds=9),
        state_reason="permanent error (attempt 2 of 5)",
    )
    for generation, (start, end, error_class, error) in enumerate(
        [(1, 2, "transient", "TimeoutError: upstream"), (7, 9, "permanent", "ValueError: bad payload")], start=1
    ):
        Attempt.objects.create(
            occurrence_id=occurrence.pk,
            scheduled_for=at,
            generation=generation,
            worker="worker-3",
            started_at=at + timedelta(seconds=start),
            finished_at=at + timedelta(seconds=end),
            outcome="failed",
            error_class=error_class,
            error=error,
        )

    html = occurrence_page(console, occurrence)

    assert (
        "dead: permanent error (attempt 2 of 5) after 2 attempt(s); last error permanent: ValueError: bad payload"
        in html
    )
    assert "Attempt 1 started" in html and "transient: TimeoutError: upstream" in html
    assert "Attempt 2 failed" in html and "Published to the broker (enqueued)" in html
    assert f"{OCCURRENCES_URL}{occurrence.pk}/replay/" in html
    timeline = html[html.index('id="occurrence-timeline"') :]
    order = [timeline.index(label) for label in ("Fire time", "Published", "Attempt 1 started", "Attempt 2 failed")]
    assert order == sorted(order)


def test_a_withdrawn_and_a_throttled_occurrence_say_why(console, make):
    schedule = make()
    at = db_now() - timedelta(minutes=5)
    withdrawn = occurrence_for(
        schedule,
        at=at,
        state=OccurrenceState.CANCELED,
        finished_at=at,
        state_reason="withdrawn: schedule updated (version 2)",
    )
    waiting = occurrence_for(
        schedule,
        at=at + timedelta(minutes=1),
        state=OccurrenceState.RETRY_WAIT,
        throttled=True,
        enqueued_at=at + timedelta(minutes=1, seconds=4),
        state_reason="throttled: the tenant's max_running quota is reached",
    )

    assert "canceled: withdrawn: schedule updated (version 2)" in occurrence_page(console, withdrawn)
    html = occurrence_page(console, waiting)
    assert "throttled: the tenant&#x27;s max_running quota is reached" in html
    assert "max_fires_per_second" in html


def test_an_attempt_page_shows_its_occurrences_timeline(console, make):
    schedule = make()
    at = db_now() - timedelta(minutes=5)
    occurrence = occurrence_for(schedule, at=at, state=OccurrenceState.RUNNING, attempt_count=1)
    attempt = Attempt.objects.create(
        occurrence_id=occurrence.pk, scheduled_for=at, generation=1, worker="worker-9", started_at=at
    )

    html = html_of(console.get(f"/admin/dispatch/attempt/{attempt.pk}/change/"))

    assert "worker-9" in html and 'id="occurrence-timeline"' in html and "highlight" in html
    assert console.get("/admin/dispatch/attempt/").status_code == 302
    assert console.get("/admin/dispatch/attempt/abc/change/").status_code == 302


# --- operations on one schedule ----------------------------------------------------------------------------------


def operate(console: Client, schedule: Schedule, verb: str, **data: str):
    return console.post(f"{SCHEDULES_URL}{schedule.pk}/operate/{verb}/", data, follow=True)


def test_run_now_fires_a_manual_occurrence_once_per_confirmation(console, make):
    schedule = make()
    page = html_of(console.get(f"{SCHEDULES_URL}{schedule.pk}/operate/trigger/"))
    key = re.search(r'name="key" value="([^"]+)"', page).group(1)

    first = operate(console, schedule, "trigger", key=key)
    again = operate(console, schedule, "trigger", key=key)

    manual = Occurrence.objects.filter(schedule=schedule, manual=True)
    assert manual.count() == 1
    assert any("is queued" in text for text in texts(first)) and any("is queued" in text for text in texts(again))
    assert entries_for(schedule)[0].startswith("Run now from its page: manual occurrence")


def test_pause_with_a_note_keeps_it_on_the_version_in_the_history_and_in_recent_actions(console, make, operator):
    schedule = make()

    response = operate(console, schedule, "pause", note="upstream API down, INC-1234")

    schedule.refresh_from_db()
    assert schedule.state == "paused"
    version = ScheduleVersion.objects.get(schedule=schedule, version=2)
    assert (version.change, version.actor, version.note) == ("pause", "operator:ops", "upstream API down, INC-1234")
    assert "nightly-report paused (version 2). Note kept on the version: upstream API down, INC-1234" in texts(response)
    assert "upstream API down, INC-1234" in html_of(response)  # the version history on the change page
    history = html_of(console.get(f"{SCHEDULES_URL}{schedule.pk}/history/"))
    assert "Paused from its page (version 2). Note: upstream API down, INC-1234" in history
    assert LogEntry.objects.filter(user=operator, object_id=str(schedule.pk)).count() == 1


def test_resume_and_cancel_from_the_schedule_page_go_through_the_services(console, make):
    schedule = make()
    pause_schedule(schedule, actor="test")

    operate(console, schedule, "resume")
    schedule.refresh_from_db()
    assert (schedule.state, schedule.version) == ("active", 3)

    operate(console, schedule, "cancel", note="customer left")
    schedule.refresh_from_db()
    assert (schedule.state, schedule.version) == ("canceled", 4)
    assert schedule.versions.get(version=4).note == "customer left"
    refused = operate(console, schedule, "pause")
    assert any("canceled is final" in text or "final" in text for text in texts(refused))
    assert len(entries_for(schedule)) == 2


def test_an_operation_that_does_nothing_says_so_and_is_not_logged(console, make):
    schedule = make()
    pause_schedule(schedule, actor="test")

    response = operate(console, schedule, "pause")

    assert "Nothing done to nightly-report: already paused." in texts(response)
    assert entries_for(schedule) == []


# --- bulk actions -------------------------------------------------------------------------------------------------


def bulk(console: Client, action: str, schedules: list[Schedule], **extra: str):
    data = {"action": action, ACTION_CHECKBOX_NAME: [str(s.pk) for s in schedules], **extra}
    return console.post(SCHEDULES_URL, data, follow=True)


def test_bulk_pause_with_a_note_is_logged_per_schedule_and_shows_in_each_history(console, make, operator):
    first, second = make(name="a"), make(name="b")

    response = bulk(console, "pause_schedules", [first, second], note="maintenance window")

    assert "Paused 2 schedules." in texts(response)
    for schedule in (first, second):
        assert schedule.versions.get(version=2).note == "maintenance window"
        assert entries_for(schedule) == ["Paused by a bulk action (version 2). Note: maintenance window"]
        assert "Paused by a bulk action" in html_of(console.get(f"{SCHEDULES_URL}{schedule.pk}/history/"))
    recent = LogEntry.objects.filter(user=operator).order_by("-action_time")[:2]
    assert {entry.object_id for entry in recent} == {str(first.pk), str(second.pk)}


def test_bulk_run_now_triggers_each_schedule_and_skips_canceled_ones(console, make):
    live, gone = make(name="live"), make(name="gone")
    cancel_schedule(gone, actor="test")

    response = bulk(console, "trigger_schedules", [live, gone])

    assert "Triggered 1 schedule." in texts(response)
    assert any("A canceled schedule cannot be triggered." in text for text in texts(response))
    assert Occurrence.objects.filter(schedule=live, manual=True).count() == 1
    assert not Occurrence.objects.filter(schedule=gone).exists()
    assert len(entries_for(live)) == 1 and entries_for(gone) == []


def test_a_bulk_note_too_long_to_keep_changes_nothing(console, make):
    schedule = make()

    response = bulk(console, "pause_schedules", [schedule], note="x" * 501)

    assert any("at most 500" in text for text in texts(response))
    schedule.refresh_from_db()
    assert schedule.state == "active"


def test_bulk_cancel_carries_the_note_through_its_confirmation(console, make):
    schedule = make()

    confirmation = console.post(
        SCHEDULES_URL, {"action": "cancel_schedules", ACTION_CHECKBOX_NAME: [str(schedule.pk)], "note": "retired"}
    )
    assert 'name="note" value="retired"' in html_of(confirmation)
    bulk(console, "cancel_schedules", [schedule], note="retired", confirm="yes")

    assert schedule.versions.get(version=2).note == "retired"


# --- backfill ---------------------------------------------------------------------------------------------------


def backfill(console: Client, schedule: Schedule, since: str, until: str, follow: bool = True):
    return console.post(f"{SCHEDULES_URL}{schedule.pk}/backfill/", {"since": since, "until": until}, follow=follow)


def test_backfill_from_the_console_creates_the_missing_fires_and_reports_them(console, make):
    now = db_now().replace(minute=0, second=0, microsecond=0)
    schedule = make(cron="0 * * * *", timezone="UTC", now=now - timedelta(hours=5))
    occurrence_for(schedule, at=now - timedelta(hours=3), state=OccurrenceState.SUCCEEDED)
    since, until = now - timedelta(hours=4), now - timedelta(hours=1)

    response = backfill(console, schedule, f"{since:%Y-%m-%d %H:%M}", until.isoformat(), follow=False)

    assert response.status_code == 302 and f"schedule={schedule.pk}" in response["Location"]
    assert Occurrence.objects.filter(schedule=schedule, forced=True).count() == 2
    messages = texts(response)
    assert any("expected 3, created 2, already present 1" in text for text in messages)
    assert "expected 3, created 2, already present 1" in entries_for(schedule)[0]


@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        ("2026-01-01 00:00", "2999-01-01 00:00", "later than now"),
        ("2026-01-02 00:00", "2026-01-01 00:00", "Must be later than since."),
        ("last tuesday", "2026-01-01 00:00", "is not a date and time"),
        ("0001-01-01T00:00:00+05:00", "2026-01-01 00:00", "Must be from 1900"),
    ],
)
def test_backfill_refuses_a_bad_range_with_a_message_not_an_error_page(console, make, since, until, message):
    schedule = make(cron="0 * * * *", timezone="UTC")

    response = backfill(console, schedule, since, until)

    assert response.status_code == 200
    assert message in response.content.decode() or any(message in text for text in texts(response))
    assert not Occurrence.objects.filter(schedule=schedule).exists()


def test_backfill_of_a_canceled_schedule_is_refused(console, make):
    schedule = make()
    cancel_schedule(schedule, actor="test")

    response = backfill(console, schedule, "2026-01-01 00:00", "2026-01-02 00:00")

    assert any("final" in text for text in texts(response))


# --- replay -------------------------------------------------------------------------------------------------------


def test_replay_from_the_occurrence_page_goes_through_the_service_and_is_logged(console, make, operator):
    schedule = make()
    dead = occurrence_for(schedule, at=db_now() - timedelta(minutes=10), state=OccurrenceState.DEAD, attempt_count=5)

    assert "Replay occurrence" in html_of(console.get(f"{OCCURRENCES_URL}{dead.pk}/replay/"))
    response = console.post(f"{OCCURRENCES_URL}{dead.pk}/replay/", follow=True)

    dead.refresh_from_db()
    assert (dead.state, dead.forced) == ("scheduled", True)
    assert any("replayed" in text for text in texts(response))
    assert LogEntry.objects.get(user=operator, object_id=str(dead.pk)).change_message.startswith("Replayed")
    again = console.post(f"{OCCURRENCES_URL}{dead.pk}/replay/", follow=True)
    assert any("Not replayed" in text and "only a dead occurrence" in text for text in texts(again))


def test_bulk_replay_replays_the_dead_and_names_what_it_refused(console, make):
    schedule = make()
    now = db_now()
    dead = [occurrence_for(schedule, at=now - timedelta(minutes=m), state=OccurrenceState.DEAD) for m in (3, 4)]
    fine = occurrence_for(schedule, at=now - timedelta(minutes=5), state=OccurrenceState.SUCCEEDED)

    response = console.post(
        OCCURRENCES_URL,
        {"action": "replay_dead", ACTION_CHECKBOX_NAME: [str(o.pk) for o in [*dead, fine]], "confirm": "yes"},
        follow=True,
    )

    assert "Replayed 2 dead occurrence(s) under their own ids." in texts(response)
    assert any("Not replayed: 1." in text and "succeeded" in text for text in texts(response))
    assert set(Occurrence.objects.filter(pk__in=[o.pk for o in dead]).values_list("state", flat=True)) == {"scheduled"}
    assert all(len(entries_for(o)) == 1 for o in dead) and entries_for(fine) == []


# --- the tenant's API tokens --------------------------------------------------------------------------------------


def token_url(tenant) -> str:
    return f"/admin/tenants/tenant/{tenant.pk}/token/"


def test_the_token_page_lists_tokens_without_their_keys(console, tenant_a):
    page = html_of(console.get(f"/admin/tenants/tenant/{tenant_a.tenant.pk}/change/"))
    token_page = console.get(token_url(tenant_a.tenant))

    assert "List, issue or revoke" in page and tenant_a.token not in page
    assert f"{tenant_a.token[:8]}…" in html_of(token_page) and tenant_a.token not in html_of(token_page)
    assert "no-store" in token_page["Cache-Control"] or "no-cache" in token_page["Cache-Control"]


def test_issuing_a_token_needs_a_post_with_csrf(operator, tenant_a):
    strict = Client(HTTP_HOST="localhost", enforce_csrf_checks=True)
    strict.force_login(operator)
    before = len(tokens_of(tenant_a.tenant))

    assert (
        strict.post(token_url(tenant_a.tenant), {"op": "issue", "name": "x", "scope": "read", "days": "7"}).status_code
        == 403
    )
    assert len(tokens_of(tenant_a.tenant)) == before


def test_an_issued_key_is_shown_once_works_within_its_scope_and_is_logged(console, operator, tenant_a, cron_body):
    page = html_of(
        console.post(token_url(tenant_a.tenant), {"op": "issue", "name": "dashboards", "scope": "read", "days": "30"})
    )
    key = re.search(r'<code id="api-token-key"[^>]*>(sch_[A-Za-z0-9_-]{43})</code>', page).group(1)

    assert "shown this once" in page
    reader = api_client_for(tenant_a, key)
    assert reader.get("/api/v1/schedules/").status_code == 200
    assert reader.post("/api/v1/schedules/", cron_body, format="json").status_code == 403
    assert key not in html_of(console.get(token_url(tenant_a.tenant)))
    entry = LogEntry.objects.get(user=operator, object_id=str(tenant_a.tenant.pk))
    assert "Issued API token 'dashboards' (read" in entry.change_message and key not in entry.change_message
    issued = next(token for token in tokens_of(tenant_a.tenant) if token.name == "dashboards")
    assert (
        29 <= (issued.expires_at - issued.created_at).days <= 30
        and issued.created_by == f"operator:{operator.username}"
    )


def test_revoking_a_token_in_the_console_makes_its_key_answer_401(console, operator, tenant_a):
    token_id = next(token.pk for token in tokens_of(tenant_a.tenant) if token.digest == digest_of(tenant_a.token))

    console.post(token_url(tenant_a.tenant), {"op": "revoke", "token": str(token_id)})

    assert api_client_for(tenant_a).get("/api/v1/schedules/").status_code == 401
    assert "Revoked API token" in LogEntry.objects.get(user=operator, object_id=str(tenant_a.tenant.pk)).change_message


@pytest.mark.parametrize(
    "form",
    [
        {"name": "", "scope": "read", "days": "7"},
        {"name": "x", "scope": "root", "days": "7"},
        {"name": "x", "scope": "read", "days": "9999"},
    ],
)
def test_a_wrong_token_form_is_a_message_not_a_token(console, tenant_a, form):
    before = len(tokens_of(tenant_a.tenant))

    response = console.post(token_url(tenant_a.tenant), {"op": "issue", **form}, follow=True)

    assert response.status_code == 200 and len(tokens_of(tenant_a.tenant)) == before
    assert "api-token-key" not in html_of(response)


def test_the_public_tenant_has_no_token_to_show(console, tenants):
    from tenants.models import Tenant

    public = Tenant.objects.get(schema_name="public")

    response = console.get(token_url(public), follow=True)

    assert any("no token" in text for text in texts(response))


def test_rotating_the_webhook_secret_in_the_console_keeps_the_old_one_signing_for_a_day(
    console, operator, api_a, tenant_a
):
    old = api_a.get("/api/v1/webhook-secret/").json()["secret"]

    page = html_of(console.post(token_url(tenant_a.tenant), {"op": "rotate_secret"}))

    state = api_a.get("/api/v1/webhook-secret/").json()
    assert state["secret"] != old and state["previous_valid_until"] is not None
    assert old not in page and state["secret"] not in page and "previous secret" in page
    assert "Rotated the webhook signing secret" in LogEntry.objects.get(user=operator).change_message


def test_the_credentials_page_shows_the_notification_target_and_how_delivery_fares(console, api_a, tenant_a):
    assert "None set" in html_of(console.get(token_url(tenant_a.tenant)))
    api_a.put("/api/v1/notifications/", {"url": "https://hooks.example.com/a", "events": ["dead"]}, format="json")

    page = html_of(console.get(token_url(tenant_a.tenant)))

    assert "https://hooks.example.com/a" in page and "Waiting to be delivered: 0" in page
