"""The console's frame: its pages carry the product's name, the index lists what operators use, the Metrics link opens
a console page (the raw /metrics stays as it was), and the dashboard writes every instant one way."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.template.loader import render_to_string
from django.test import Client

from core.clock import db_now
from dispatch.models import ProcessHeartbeat
from scheduler_project import health
from tenants.access import OPERATOR_GROUP
from tests.integration.test_operator_scope import member

PRODUCT = "Scheduler operator console"


@pytest.fixture(autouse=True)
def _fresh_assessment():
    health.forget()
    yield
    health.forget()


def title(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    found = re.search(r"<title>(.*?)</title>", response.content.decode(), re.S)
    assert found, url
    return found.group(1).strip()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/admin/", f"Operations | {PRODUCT}"),
        ("/admin/dispatch/occurrence/", f"Select occurrence to view | {PRODUCT}"),
        ("/admin/metrics/", f"Metrics | {PRODUCT}"),
    ],
)
def test_console_pages_carry_the_products_name(console, url, expected):
    assert title(console, url) == expected


def test_a_page_rendered_without_the_sites_context_still_carries_the_products_name(db, settings):
    settings.ROOT_URLCONF = "scheduler_project.urls_public"  # the console's host, as its middleware would choose

    page = render_to_string("admin/base_site.html", {})

    assert re.search(r"<title>(.*?)</title>", page).group(1) == PRODUCT
    assert "Django site admin" not in page and "Django administration" not in page


def index_models(client: Client) -> set[str]:
    page = client.get("/admin/").content.decode()
    return set(re.findall(r'<th scope="row"[^>]*>\s*<a href="[^"]*"[^>]*>([^<]+)</a>', page))


def test_the_index_lists_security_tables_for_superusers_only_and_task_results_for_nobody(console, tenant_a):
    # An operator who was also given the permissions to look at groups, login attempts and task results.
    client = member("olga", OPERATOR_GROUP, [tenant_a.tenant])
    extra = Permission.objects.filter(
        content_type__app_label__in=("auth", "axes", "django_celery_results"), codename__startswith="view_"
    )
    get_user_model().objects.get(username="olga").user_permissions.add(*extra)

    operator, superuser = index_models(client), index_models(console)

    assert {"Occurrences", "Schedules"} <= operator
    assert not operator & {"Groups", "Access attempts", "Access failures", "Access logs", "Task results"}
    assert {"Groups", "Access attempts", "Access failures", "Access logs", "Users"} <= superuser
    assert not superuser & {"Task results", "Group results"}, "every task ignores its result: always empty"
    assert client.get("/admin/auth/group/").status_code == 200, "hidden from the index, not taken away"


def test_the_metrics_link_opens_a_console_page_and_the_raw_text_stays_behind_its_token(console, settings, tenant_a):
    page = console.get("/admin/").content.decode()
    assert '<a href="/admin/metrics/">Metrics</a>' in page

    metrics = console.get("/admin/metrics/").content.decode()
    assert '<a href="/metrics">raw Prometheus text</a>' in metrics and '<a href="/admin/">dashboard</a>' in metrics
    key = metrics.split("<h2>Key figures</h2>", 1)[1].split("<h2>", 1)[0]
    for name in ("scheduler_live_processes", "scheduler_outbox_envelopes", "scheduler_dlq_occurrences"):
        assert f"<code>{name}</code>" in key
    assert "observations" in metrics or "no observations" in metrics, "histograms summed up, not bucket by bucket"
    assert "_bucket" not in metrics

    settings.SCHEDULER_METRICS_TOKEN = "s3cret"
    assert Client(HTTP_HOST="localhost").get("/metrics").status_code == 401
    scraped = Client(HTTP_HOST="localhost").get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert scraped.status_code == 200 and b"scheduler_outbox_envelopes" in scraped.content
    assert member("otto", OPERATOR_GROUP, [tenant_a.tenant]).get("/admin/metrics/").status_code == 403


def test_the_dashboard_writes_instants_in_the_consoles_utc_format(console):
    ProcessHeartbeat.objects.all().delete()
    started = db_now().replace(microsecond=0) - timedelta(hours=3)
    ProcessHeartbeat.objects.create(name="relay-iso", role="relay", started_at=started, heartbeat_at=db_now())

    page = console.get("/admin/").content.decode()

    row = page.split("<code>relay-iso</code>", 1)[1].split("</tr>", 1)[0]
    assert f"<td>{started:%Y-%m-%d %H:%M:%S} UTC</td>" in row or f"<td>{started:%Y-%m-%d %H:%M} UTC</td>" in row
    assert re.search(r'Figures as of <time datetime="[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? UTC</time>', page)
