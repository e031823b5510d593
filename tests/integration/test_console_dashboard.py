"""The console's first page: the dashboard's figures come from the rows, its charts are inline SVG, and it still
opens when nothing has happened yet."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.clock import db_now
from dispatch import dashboard
from dispatch.identity import occurrence_id_for
from dispatch.models import ProcessHeartbeat
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from dispatch.sql import dashboard as dashboard_sql
from tests.conftest import move_cursor, occurrence_for


@pytest.fixture
def console(db) -> Client:
    operator = get_user_model().objects.create_superuser("dash", "dash@example.com", "dashboard-password")
    client = Client(HTTP_HOST="localhost")
    client.force_login(operator)
    return client


@pytest.fixture
def activity(tenant_a, make_schedule, make_occurrence):
    """An hour of a schedule's history: on-time and late fires, a dead one, a fire due in 10 minutes, processes."""
    tenant = tenant_a.tenant
    schedule = make_schedule(tenant, name="dash-every-minute")
    now = db_now().replace(second=0, microsecond=0)
    for minutes_ago in range(2, 40):
        at = now - timedelta(minutes=minutes_ago)
        state = "dead" if minutes_ago == 5 else "succeeded"
        lag = 3.0 if minutes_ago == 10 else 0.05
        make_occurrence(schedule, at=at, state=state, enqueued_at=at + timedelta(seconds=lag))
    soon = now + timedelta(minutes=10)
    with connection.cursor() as cursor:
        enqueue(cursor, [Fire(occurrence_id_for(schedule.id, 1, soon), soon, tenant.id, STRICT_QUEUE, soon, 0)])
    ProcessHeartbeat.objects.all().delete()
    ProcessHeartbeat.objects.create(
        name="materializer-dash", role="materializer", started_at=now, heartbeat_at=db_now()
    )
    ProcessHeartbeat.objects.create(
        name="worker-dash", role="worker", started_at=now, heartbeat_at=db_now() - timedelta(seconds=120)
    )
    return tenant


def test_the_dashboard_reads_its_figures_from_the_rows(activity):
    dash = dashboard.build()

    assert dash.dead == 1
    assert sum(dash.states["succeeded"]) == 37
    assert max(p for p in dash.lag["strict"]["p99"] if p is not None) == pytest.approx(3.0)
    assert sum(fires for _, fires in dash.due) >= 1, "the fire in 10 minutes is in the next hour's histogram"
    assert {p["name"]: p["live"] for p in dash.processes} == {"materializer-dash": True, "worker-dash": False}
    assert [t["recent"] for t in dash.tenants if t["id"] == activity.id] == [38]


def test_the_index_shows_the_charts_as_inline_svg_with_the_dlq_link(console, activity):
    page = console.get("/admin/").content.decode()

    assert page.count('<svg class="chart"') == 3, "lag, states and due-next-hour charts"
    assert "<polyline" in page, "the lag is drawn as lines"
    assert re.search(r'href="/admin/dispatch/occurrence/\?dlq=1"', page), "the DLQ: dead and not resolved"
    assert "dispatch/dashboard.css" in page
    assert "http://" not in page.split("<body", 1)[1].replace("http://www.w3.org", ""), "nothing from elsewhere"
    assert "worker-dash" in page and "silent" in page


def test_the_index_opens_with_empty_charts_before_anything_happened(console):
    page = console.get("/admin/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "strict lane: no data in this range" in text and "flexible lane: no data in this range" in text
    assert "No process has a heartbeat" in text or "Processes" in text


def test_fires_due_next_hour_count_every_fire_of_each_rule_not_one_per_cursor(tenant_a, make_schedule, monkeypatch):
    tenant = tenant_a.tenant
    now = db_now()
    next_minute = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    ahead = make_schedule(tenant, name="every-minute-ahead", cron="* * * * *", timezone="UTC")
    # The materializer wrote the next minute's fire (an envelope) and moved the cursor past it.
    with connection.cursor() as cursor:
        fire_id = occurrence_id_for(ahead.id, 1, next_minute)
        enqueue(cursor, [Fire(fire_id, next_minute, tenant.id, STRICT_QUEUE, next_minute, 0)])
    move_cursor(ahead.pk, next_minute + timedelta(minutes=1))
    # Behind: the materializer is down; its fires still fall due every minute of the hour.
    behind = make_schedule(tenant, name="every-minute-behind", cron="* * * * *", timezone="Asia/Kolkata")
    move_cursor(behind.pk, now - timedelta(minutes=7))
    daily_at = next_minute + timedelta(minutes=20)
    daily = make_schedule(tenant, name="daily", cron=f"{daily_at.minute} {daily_at.hour} * * *", timezone="UTC")
    move_cursor(daily.pk, daily_at)
    once = make_schedule(tenant, name="once", kind="once", run_at=now + timedelta(minutes=30, seconds=10))

    due = dict(dashboard.build().due)

    assert sum(due.values()) == 60 + 60 + 1 + 1
    assert len(due) >= 59, "a bar in (nearly) every minute, not a spike in the first few"
    assert due[daily_at] == 3, "both every-minute schedules and the daily one"
    assert due[once.run_at.replace(second=0, microsecond=0)] == 3
    assert max(due) < now + timedelta(minutes=60)

    # A big cursor table is read through TABLESAMPLE and scaled back up (here a sample of ~all of it).
    monkeypatch.setattr(dashboard, "SAMPLE_ROWS", 1)
    monkeypatch.setattr(dashboard_sql, "CURSOR_ROWS_ESTIMATE", "SELECT 1.000001::float8")
    with CaptureQueriesContext(connection) as queries:
        assert sum(dict(dashboard.build().due).values()) == 122
    assert any("TABLESAMPLE SYSTEM (99.9999)" in query["sql"] for query in queries.captured_queries)


def test_due_per_minute_expands_each_rule_once_and_scales_a_sample():
    now = datetime(2026, 12, 2, 4, 0, 30, tzinfo=UTC)
    until = now + timedelta(minutes=60)
    groups = [
        ("cron", "*/15 * * * *", "UTC", None, now, 2),  # 04:15, 04:30, 04:45, 05:00 for two schedules
        ("cron", "*/15 * * * *", "UTC", None, datetime(2026, 12, 2, 4, 45, tzinfo=UTC), 1),  # from its cursor: 2
        ("cron", "0 5 * * *", "UTC", None, datetime(2026, 12, 2, 5, 0, tzinfo=UTC), 4),
        ("once", None, None, None, datetime(2026, 12, 2, 4, 10, tzinfo=UTC), 5),
    ]
    at = {minute.strftime("%H:%M"): count for minute, count in dashboard.due_per_minute(now, until, [], groups)}
    assert at == {"04:10": 5, "04:15": 2, "04:30": 2, "04:45": 3, "05:00": 7}

    sampled = dashboard.due_per_minute(now, until, [(datetime(2026, 12, 2, 4, 5, tzinfo=UTC), 7)], groups, scale=10)
    assert dict(sampled)[datetime(2026, 12, 2, 4, 5, tzinfo=UTC)] == 7, "materialized rows are read whole"
    assert dict(sampled)[datetime(2026, 12, 2, 5, 0, tzinfo=UTC)] == 70


@pytest.fixture
def lag_history(tenant_a, make_schedule, make_occurrence):
    """Fires enqueued 0.05 s late in the last hour, 2 s late three hours ago and 7 s late twenty hours ago."""
    schedule = make_schedule(tenant_a.tenant, name="dash-lag-history")
    now = db_now().replace(second=0, microsecond=0)
    for ago, lag in ((timedelta(minutes=10), 0.05), (timedelta(hours=3), 2.0), (timedelta(hours=20), 7.0)):
        at = now - ago
        make_occurrence(schedule, at=at, state="succeeded", enqueued_at=at + timedelta(seconds=lag))


@pytest.mark.parametrize(
    ("window", "buckets", "bucket", "worst"),
    [
        ("1h", 61, timedelta(minutes=1), 0.05),
        ("6h", 73, timedelta(minutes=5), 2.0),
        ("24h", 97, timedelta(minutes=15), 7.0),
        ("7d", 85, timedelta(hours=2), 7.0),
    ],
)
def test_the_lag_chart_covers_the_window_asked_for_in_buckets_that_fit(lag_history, window, buckets, bucket, worst):
    dash = dashboard.build(lag=dashboard.lag_window(window))
    axis = dash.lag_buckets or dash.minutes

    assert len(axis) == buckets
    assert {b - a for a, b in pairwise(axis)} == {bucket}
    assert max(p for p in dash.lag["strict"]["p99"] if p is not None) == pytest.approx(worst)
    assert sum(dash.states["succeeded"]) == 1, "the states chart and the tenants stay on the last hour"


@pytest.mark.parametrize(
    ("query", "selected", "title"),
    [
        ("", "1h", "last hour"),
        ("?lag=6h", "6h", "last 6 hours"),
        ("?lag=24h", "24h", "last 24 hours"),
        ("?lag=7d", "7d", "last 7 days"),
        ("?lag=30d", "1h", "last hour"),
        ("?lag=6H", "1h", "last hour"),
        ("?lag=", "1h", "last hour"),
    ],
)
def test_the_index_offers_the_lag_windows_as_links_and_falls_back_to_the_hour(
    console, lag_history, query, selected, title
):
    response = console.get(f"/admin/{query}")
    assert response.status_code == 200
    page = response.content.decode()

    assert f"Enqueue lag per lane, {title}" in page
    chart = page[page.index('aria-label="enqueue lag, strict lane"') :].split("</svg>", 1)[0]
    if selected == "7d":
        days = re.findall(r'class="tick">(\d\d)-(\d\d)<', chart)
        assert len(days) in (7, 8), "an x label each day (month-day, UTC)"
    else:
        ticks = re.findall(r'class="tick">(\d\d):(\d\d)<', chart)
        assert len(ticks) in (6, 7), "an x label every 10 min, 1 h or 4 h"
        spacing = {"1h": 10, "6h": 60, "24h": 240}[selected]
        assert all((int(h) * 60 + int(m)) % spacing == 0 for h, m in ticks), "at round times of the clock"
    windows = page[page.index('class="windows"') :].split("</p>", 1)[0]
    assert re.findall(r"<strong[^>]*>(\w+)</strong>", windows) == [selected]
    assert sorted(re.findall(r'<a href="\?lag=(\w+)">', windows)) == sorted({"1h", "6h", "24h", "7d"} - {selected})


def test_the_tenants_table_counts_fires_sent_once_apart_from_the_relays_publishes(console, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, name="dash-reoffered")
    now = db_now().replace(second=0, microsecond=0)
    for minutes_ago, enqueued in ((3, True), (2, True), (1, False)):
        at = now - timedelta(minutes=minutes_ago)
        occurrence_for(
            schedule, at=at, state="succeeded", enqueued_at=at + timedelta(seconds=0.1) if enqueued else None
        )
    # The relays published 5 times for those 2 fires: each was parked for max_running and offered again (and more).
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dispatch_tenant_fire_bucket (tenant_id, tokens, refilled_at, rate, dispatched_fires)"
            " VALUES (%s, 0, clock_timestamp(), 10, 5)",
            [tenant_a.tenant.id],
        )
        cursor.execute(
            "INSERT INTO dispatch_tenant_running (tenant_id, running, throttled_claims) VALUES (%s, 0, 3)",
            [tenant_a.tenant.id],
        )

    [row] = [t for t in dashboard.build().tenants if t["id"] == tenant_a.tenant.id]
    assert (row["recent"], row["sent"], row["dispatched"], row["throttled_claims"]) == (3, 2, 5, 3)

    page = console.get("/admin/").content.decode()
    table = page[page.index("<h2>Tenants") :].split("</table>", 1)[0]
    headers = re.findall(r'<th title="([^"]+)">([^<]+)</th>', table)
    assert [text for _, text in headers] == [
        "due, 1&nbsp;h",
        "sent, 1&nbsp;h",
        "publishes, total",
        "throttled",
        "running",
        "over quota",
    ]
    assert "each counted once" in headers[1][0] and "re-offer" in headers[2][0]
    assert re.search(r"<td>3</td>\s*<td>2</td>\s*<td>5</td>", table)
