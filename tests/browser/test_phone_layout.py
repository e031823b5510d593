"""The console on a phone, in Chromium: every main page at 390 x 844 CSS px fits the screen's width (a wide table or
chart scrolls inside its own box, never the page), keeps its text readable and its buttons on the screen, and at
1440 x 900 nothing regressed. The `page` fixture fails a test on anything the Content-Security-Policy refuses.
Screenshots of four pages at both widths go to docs/img/ when SCHEDULER_SCREENSHOTS=1."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from core.clock import db_now
from dispatch.models import OutboxMessage, ProcessHeartbeat
from schedules.calendars import create_calendar
from tests.browser.conftest import SCREENSHOTS, an_hour_of_fires

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.django_db(transaction=True)]
PASSWORD = "browser-phone-password"
# Regenerate the screenshots only when asked: a test run must not dirty the checkout.
KEEP_SCREENSHOTS = os.environ.get("SCHEDULER_SCREENSHOTS") == "1"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
# Rendered sizes, in CSS px, below which text is too small to read on a phone: the page's own text (about 11 px, the
# admin's help lines; a <small> in a 13 px field renders 10.8 px), and a chart's (drawn in the SVG's units, then
# scaled with the chart).
MIN_TEXT_PX = 10.5
MIN_CHART_TEXT_PX = 10
# The pages shown in docs/img/: console-phone-<name>.png at 390 px, console-<name>.png at 1440 px.
SCREENSHOT_PAGES = ("dashboard", "schedules", "schedule", "timeline")


@pytest.fixture
def console(tenant_a, make_schedule, make_occurrence) -> dict[str, str]:
    """A tenant with what makes pages wide: labelled schedules in several zones, an hour of fires, a missed and a
    dead one with long reasons, a calendar, an envelope in the outbox, live processes; the operator who reads them.
    Returns the path of each page visited, by name."""
    tenant = tenant_a.tenant
    now = db_now().replace(second=0, microsecond=0)
    labels = {"team": "payments-platform", "env": "production", "region": "eu-west-1", "tier": "critical"}
    heartbeat = make_schedule(tenant, name="heartbeat", cron="* * * * *", handler="log", labels=labels)
    make_schedule(tenant, name="nightly-report", cron="30 2 * * *", timezone="America/New_York", handler="log")
    report = make_schedule(
        tenant,
        name="standup-reminder-for-the-payments-platform-team",
        cron="0 9 * * mon-fri",
        timezone="Europe/Madrid",
        labels={"team": "payments-platform", "channel": "standup"},
    )
    missed, dead = an_hour_of_fires(
        make_occurrence,
        heartbeat,
        report,
        now,
        dead_reason="attempts exhausted (5 of 5): HTTP 503 from https://payments.example.com/hooks/standup-reminder",
    )
    calendar = create_calendar(
        tenant=tenant,
        data={
            "name": "public-holidays-and-shutdowns",
            "dates": [f"2027-{month:02d}-{day:02d}" for month in range(1, 13) for day in (1, 15)],
            "ranges": [{"start": "2026-12-24T00:00:00Z", "end": "2027-01-07T00:00:00Z"}],
        },
        actor="browser-test",
    )
    due = now + timedelta(minutes=5)
    OutboxMessage.objects.create(
        tenant_id=tenant.pk,
        queue="test.helperphone.strict",
        available_at=due,
        occurrence_ids=[make_occurrence(heartbeat, at=due + timedelta(minutes=n)).pk for n in range(3)],
        scheduled_fors=[due + timedelta(minutes=n) for n in range(3)],
        body=b"{}",
    )
    ProcessHeartbeat.objects.all().delete()
    for role in ("materializer", "relay", "worker"):
        ProcessHeartbeat.objects.create(name=f"{role}-1", role=role, started_at=now, heartbeat_at=db_now())
    get_user_model().objects.create_superuser("operator", "ops@example.com", PASSWORD)
    schedule = f"/admin/schedules/schedule/{report.pk}"
    return {
        "dashboard": "/admin/",
        "schedules": "/admin/schedules/schedule/",
        "schedule": f"{schedule}/change/",
        "schedule-add": "/admin/schedules/schedule/add/",
        "pause": f"{schedule}/operate/pause/",
        "backfill": f"{schedule}/backfill/",
        "history": f"{schedule}/history/",
        "occurrences": "/admin/dispatch/occurrence/",
        "timeline": f"/admin/dispatch/occurrence/{missed.pk}/change/",
        "dead": f"/admin/dispatch/occurrence/{dead.pk}/change/",
        "resolve": f"/admin/dispatch/occurrence/{dead.pk}/resolve/",
        "replay": f"/admin/dispatch/occurrence/{dead.pk}/replay/",
        "rerun": f"/admin/dispatch/occurrence/{missed.pk}/rerun/",
        "outbox": "/admin/dispatch/outboxmessage/",
        "tenants": "/admin/tenants/tenant/",
        "tenant": f"/admin/tenants/tenant/{tenant.pk}/change/",
        "credentials": f"/admin/tenants/tenant/{tenant.pk}/token/",
        "calendars": "/admin/schedules/calendar/",
        "calendar": f"/admin/schedules/calendar/{calendar.pk}/change/",
        "metrics": "/admin/metrics/",
    }


def log_in(page, live_server) -> list[str]:
    """Sign in; returns the list the page's console errors are collected in from then on."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return errors


# The page's width, and the elements that make it wider than the window: each outermost element sticking out past
# the right edge that no scrolling or clipping box of its own holds in.
PAGE_WIDTH = """() => {
  const limit = document.documentElement.clientWidth + 1;
  const held = e => {
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') return a.getBoundingClientRect().right <= limit;
    }
    return false;
  };
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
    (typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/).join('.') : '');
  const culprits = [];
  for (const e of document.body.querySelectorAll('*')) {
    const box = e.getBoundingClientRect();
    if (box.width === 0 || box.right <= limit || held(e)) continue;
    const parent = e.parentElement.getBoundingClientRect();
    if (parent.right <= limit || e.parentElement === document.body)
      culprits.push(`${name(e)} in ${name(e.parentElement)}: ${Math.round(box.width)} px to ${Math.round(box.right)}`);
  }
  return {width: document.documentElement.scrollWidth, culprits: culprits.slice(0, 12)};
}"""

# Visible text rendered smaller than the limits: the page's (its computed font size) and the charts' (the SVG font
# size times the chart's scale on the screen).
SMALL_TEXT = """([pageMin, chartMin]) => {
  const small = [];
  const visible = e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  for (const e of document.body.querySelectorAll('*')) {
    if (e instanceof SVGElement) continue;
    const own = [...e.childNodes].some(n => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
    const size = parseFloat(getComputedStyle(e).fontSize);
    if (own && size < pageMin && visible(e))
      small.push(`${e.tagName} ${size} px: ${e.textContent.trim().slice(0, 30)}`);
  }
  for (const t of document.querySelectorAll('svg text')) {
    if (!visible(t)) continue;
    const size = parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a;
    if (size < chartMin) small.push(`svg text ${size.toFixed(1)} px: ${t.textContent.slice(0, 30)}`);
  }
  return small.slice(0, 12);
}"""

# Buttons and operation links partly off the screen's width: hidden by a box that clips them (the admin's object
# tools clip on a phone) rather than reachable. One inside a box that scrolls sideways is reached by scrolling it.
OFF_SCREEN_BUTTONS = """() => {
  const limit = document.documentElement.clientWidth + 1;
  const scrolled = e => {
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(a).overflowX)) return true;
    }
    return false;
  };
  return [...document.querySelectorAll('input[type=submit], button, a.button, .object-tools a')]
    .filter(e => e.getClientRects().length > 0 && !scrolled(e))
    .filter(e => { const box = e.getBoundingClientRect(); return box.left < -1 || box.right > limit; })
    .map(e => (e.value || e.textContent).trim().slice(0, 30));
}"""

# The schedule form's live preview has drawn its fires (or what it refuses) in place of its placeholder.
PREVIEW_DRAWN = "() => !document.querySelector('#live-preview .live-preview-body').innerText.includes('JavaScript')"


def check(page, name: str, width: int) -> dict[str, object]:
    """What is wrong with the page on a screen `width` px wide: overflow everywhere; small text and buttons off the
    screen on a phone."""
    problems: dict[str, object] = {}
    layout = page.evaluate(PAGE_WIDTH)
    if layout["width"] > width + 1:
        problems[f"{name} is {layout['width']} px wide"] = layout["culprits"]
    if width < DESKTOP["width"]:
        small = page.evaluate(SMALL_TEXT, [MIN_TEXT_PX, MIN_CHART_TEXT_PX])
        if small:
            problems[f"{name} has small text"] = small
        buttons = page.evaluate(OFF_SCREEN_BUTTONS)
        if buttons:
            problems[f"{name} has buttons off the screen"] = buttons
    return problems


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone-390px", "desktop-1440px"])
def test_every_main_console_page_fits_the_screen_without_scrolling_sideways(page, live_server, console, viewport):
    width = viewport["width"]
    page.set_viewport_size(viewport)
    page.goto(f"{live_server.url}/admin/login/")
    problems = check(page, "login", width)
    errors = log_in(page, live_server)
    for name, path in console.items():
        before = len(errors)
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state()
        if page.locator("#live-preview").count():
            # Measured with what the preview shows, not its placeholder.
            page.wait_for_function(PREVIEW_DRAWN)
        problems |= check(page, name, width)
        if name == "schedule-add":
            # The live preview asks for the empty form's fires and is answered 400 (shown in its panel as what would
            # be refused), which the browser logs; nothing else may fail.
            errors[before:] = [error for error in errors[before:] if "status of 400" not in error]
        if KEEP_SCREENSHOTS and name in SCREENSHOT_PAGES:
            prefix = "console-phone-" if width == PHONE["width"] else "console-"
            page.screenshot(path=str(SCREENSHOTS / f"{prefix}{name}.png"), full_page=True)
    assert problems == {}, "\n".join(f"{where}: {what}" for where, what in problems.items())
    assert errors == [], "no page logged an error"
