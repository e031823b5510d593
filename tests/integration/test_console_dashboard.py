"""The console's first page: the dashboard's figures come from the rows, its charts are inline SVG, and it still
opens when nothing has happened yet."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from dispatch import dashboard
from dispatch.identity import occurrence_id_for
from dispatch.models import ProcessHeartbeat
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from schedules.clock import db_now


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
    assert re.search(r'href="/admin/dispatch/occurrence/\?state__exact=dead"', page)
    assert "dispatch/dashboard.css" in page
    assert "http://" not in page.split("<body", 1)[1].replace("http://www.w3.org", ""), "nothing from elsewhere"
    assert "worker-dash" in page and "silent" in page


def test_the_index_opens_with_empty_charts_before_anything_happened(console):
    page = console.get("/admin/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "No fire was enqueued in the last hour yet." in text
    assert "No process has a heartbeat" in text or "Processes" in text
