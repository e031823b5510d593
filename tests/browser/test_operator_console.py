"""An operator's first session, in Chromium: log in, see a styled dashboard with data, find why a fire did not run,
act on it. (The README's screenshots are taken by test_phone_layout.py, at 1440 and 390 px.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from core.clock import db_now
from dispatch.models import Occurrence, ProcessHeartbeat
from tests.browser.conftest import an_hour_of_fires

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.django_db(transaction=True)]
PASSWORD = "browser-operator-password"


@pytest.fixture
def demo_like(tenant_a, make_schedule, make_occurrence):
    """What `make demo` shows after a while: schedules in a few zones, an hour of fires, a miss, a dead one."""
    tenant = tenant_a.tenant
    now = db_now().replace(second=0, microsecond=0)
    heartbeat = make_schedule(tenant, name="heartbeat", cron="* * * * *", handler="log")
    make_schedule(tenant, name="nightly-report", cron="30 2 * * *", timezone="America/New_York", handler="log")
    report = make_schedule(tenant, name="standup-reminder", cron="0 9 * * mon-fri", timezone="Europe/Madrid")
    # Due in about ten minutes whenever the test runs: the heartbeat's cursor (no materializer runs here) may slip
    # behind now at the next minute boundary, and the chart of fires due in the next hour must still have one.
    make_schedule(tenant, name="hourly-sync", cron=f"{(now + timedelta(minutes=10)).minute} * * * *", handler="log")
    missed, dead = an_hour_of_fires(make_occurrence, heartbeat, report, now, dead_reason="attempts exhausted (5 of 5)")
    ProcessHeartbeat.objects.all().delete()
    for role in ("materializer", "relay", "worker"):
        ProcessHeartbeat.objects.create(name=f"{role}-1", role=role, started_at=now, heartbeat_at=db_now())
    get_user_model().objects.create_superuser("operator", "ops@example.com", PASSWORD)
    return {"missed": missed, "dead": dead, "heartbeat": heartbeat}


def log_in(page, live_server) -> list[str]:
    """Sign in; returns the list the page's console errors are collected in from then on."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return errors


def overflowing(page, selector: str) -> list[str]:
    """The elements matching `selector` whose content is wider than they are (clipped, or scrolling sideways)."""
    return page.eval_on_selector_all(
        selector, "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.slice(0, 60))"
    )


def test_an_operator_sees_a_styled_dashboard_with_data_and_finds_why_a_fire_was_missed(page, live_server, demo_like):
    errors = log_in(page, live_server)

    # Styled: the admin stylesheet applied (the header has its colour, not the browser's default).
    header_background = page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor")
    assert header_background not in ("rgba(0, 0, 0, 0)", "transparent"), header_background
    assert page.locator("svg.chart").count() == 3
    assert page.locator("svg.chart polyline").count() >= 1, "the lag chart has lines"
    assert page.locator("svg.chart rect[fill='#2e7d32']").count() >= 10, "succeeded fires per minute"
    assert "1" in page.locator(".tile").first.inner_text(), "one occurrence in the DLQ"
    assert overflowing(page, ".ops-dash .panel") == [], "every panel fits at 1440 px, the tenants table too"
    page.click(".windows a:text-is('6h')")
    page.wait_for_load_state()
    assert "Enqueue lag per lane, last 6 hours" in page.inner_text(".ops-dash")
    assert page.locator("svg.chart polyline").count() >= 1

    # Why didn't the report run half an hour ago? From the index to the occurrence list, the range around that
    # time typed into the range form, then the missed ones of it, then the occurrence itself.
    missed_at = demo_like["missed"].scheduled_for
    page.goto(f"{live_server.url}/admin/")
    page.click("#content-main a:text-is('Occurrences')")
    page.wait_for_load_state()
    assert overflowing(page, "#changelist-form .results") == [], "the list's last columns are not cut off"
    page.fill("#range-after", f"{missed_at - timedelta(minutes=2):%Y-%m-%d %H:%M}")
    page.fill("#range-before", f"{missed_at + timedelta(minutes=2):%Y-%m-%d %H:%M}")
    page.click("input[type=submit][value='Apply range']")
    page.wait_for_load_state()
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 5, "the report's missed fire and the heartbeat's four minutes around it"
    page.click("#changelist-filter a:text-is('Missed')")
    page.wait_for_load_state()
    assert "scheduled_after=" in page.url and "state__exact=missed" in page.url, "the filters combine"
    assert rows.count() == 1
    rows.first.locator("a").first.click()
    page.wait_for_load_state()
    assert "late by 700 s > max lateness 60 s (skip)" in page.inner_text("body")
    assert Occurrence.objects.filter(pk=demo_like["missed"].pk, state="missed").exists()
    assert errors == [], "no page logged an error (a missing icon did on every page)"


def test_an_operator_runs_a_schedule_now_and_replays_a_dead_occurrence(page, live_server, demo_like):
    log_in(page, live_server)

    # Run now, from the schedule's page: a manual occurrence is queued, and the action is in Recent actions.
    heartbeat = demo_like["heartbeat"]
    page.goto(f"{live_server.url}/admin/schedules/schedule/")
    assert overflowing(page, "#changelist-form .results") == [], "the schedule list's last columns are not cut off"
    page.goto(f"{live_server.url}/admin/schedules/schedule/{heartbeat.pk}/change/")
    tools, title = page.locator(".object-tools").bounding_box(), page.locator("#content > h2").bounding_box()
    assert tools is not None and title is not None
    assert tools["y"] >= title["y"] + title["height"], "the operations sit below the schedule's name, not over it"
    page.click("text=Run now")
    page.click("input[type=submit][value='Run now']")
    page.wait_for_load_state()
    assert "Run now: occurrence" in page.inner_text(".messagelist")
    assert Occurrence.objects.filter(schedule=heartbeat, manual=True, state="scheduled").count() == 1

    # Replay from the DLQ, from the dead occurrence's page: same id, back to the queue.
    dead = demo_like["dead"]
    page.goto(f"{live_server.url}/admin/dispatch/occurrence/{dead.pk}/change/")
    assert "attempts exhausted (5 of 5)" in page.inner_text("body")
    page.click("text=Replay from the DLQ")
    page.click("input[type=submit][value='Replay']")
    page.wait_for_load_state()
    dead.refresh_from_db()
    assert dead.state in ("scheduled", "enqueued"), dead.state
    page.goto(f"{live_server.url}/admin/")
    recent = page.inner_text("#recent-actions-module")
    assert str(dead.pk) in recent and heartbeat.name in recent, "both actions are under Recent actions"


def test_an_operator_creates_a_labelled_schedule_with_the_live_preview_and_finds_it_by_label(
    page, live_server, demo_like, tenant_a
):
    errors = log_in(page, live_server)
    previews: list[str] = []
    page.on("request", lambda request: previews.append(request.url) if "/preview/" in request.url else None)

    # Add schedule, from the list: the tenant chosen, the rule typed, its fires previewed for that tenant.
    page.goto(f"{live_server.url}/admin/schedules/schedule/")
    page.click(".object-tools a:text('Add schedule')")
    page.wait_for_load_state()
    page.select_option("#id_tenant", str(tenant_a.tenant.pk))
    page.fill("#id_name", "payments-sync")
    page.fill("#id_labels", "team=payments\nenv=prod")
    page.fill("#id_cron", "30 2 * * *")
    page.select_option("#id_timezone", "America/New_York")
    page.select_option("#id_handler", "log")
    page.wait_for_selector("#live-preview .preview-summary:has-text('At 02:30 every day (America/New_York)')")
    assert page.locator("#live-preview tbody tr").count() == 10
    assert page.locator("#live-preview .dst-ahead li").count() >= 1, "the next clock change is noted"
    assert any(f"tenant={tenant_a.tenant.pk}" in url for url in previews), previews
    page.click("input[type=submit][name=_save]")
    page.wait_for_load_state()
    assert "Payments-sync created for tenant acme as version 1" in page.inner_text(".messagelist")  # capfirst
    assert page.url.endswith("/change/")
    assert page.input_value("#id_labels") == "env=prod\nteam=payments"

    # On the list its labels are chips that fit; one picks the schedules carrying it, the selector box narrows.
    page.goto(f"{live_server.url}/admin/schedules/schedule/")
    assert overflowing(page, "#changelist-form .results") == [], "the labels column leaves the last columns in view"
    page.click("a.label-chip:text-is('team=payments')")
    page.wait_for_load_state()
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "payments-sync" in rows.first.inner_text()
    page.fill("#label-selector", "team=payments,env!=prod")
    page.click("input[type=submit][value='Apply selector']")
    page.wait_for_load_state()
    assert "selector=team%3Dpayments%2Cenv%21%3Dprod" in page.url
    assert page.locator("#result_list tbody tr").count() == 0
    # The preview answers 400 to the rule while it is half typed (shown in its panel as what would be refused), and
    # the browser logs each; nothing else may fail.
    assert [error for error in errors if "status of 400" not in error] == []
