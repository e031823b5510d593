"""/metrics on the public host: scheduler gauges read from the durable record."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test import Client

from dispatch.identity import occurrence_id_for
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from schedules.clock import db_now


def scrape() -> dict[str, float]:
    response = Client(HTTP_HOST="localhost").get("/metrics")
    assert response.status_code == 200
    values = {}
    for line in response.content.decode().splitlines():
        if line.startswith("scheduler_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_report_outbox_depth_dlq_size_and_recent_lag(tenant_a, make_schedule, make_occurrence):
    now = db_now()
    schedule = make_schedule(tenant_a.tenant, name="m", actor="t")
    at = now - timedelta(seconds=30)
    dead = make_occurrence(
        schedule, at=at, version=1, lane="strict", state="dead", enqueued_at=at + timedelta(seconds=2)
    )
    later = now + timedelta(minutes=5)
    with connection.cursor() as cursor:
        enqueue(
            cursor, [Fire(occurrence_id_for(schedule.id, 1, later), later, tenant_a.tenant.id, STRICT_QUEUE, later, 0)]
        )
    values = scrape()
    assert values["scheduler_outbox_envelopes"] == 1
    assert values["scheduler_outbox_occurrences"] == 1
    assert values["scheduler_dlq_occurrences"] == 1
    assert values['scheduler_schedule_lag_seconds{lane="strict",quantile="0.99"}'] == 2.0
    assert values['scheduler_recent_occurrences{lane="strict",state="dead"}'] == 1
    assert dead.state == "dead"


def test_metrics_are_not_served_on_a_tenant_host(tenant_a):
    assert Client(HTTP_HOST=tenant_a.domain).get("/metrics").status_code == 404


def test_throttled_lateness_is_reported_apart_and_quota_counters_per_tenant(tenant_a, make_schedule, make_occurrence):
    now = db_now()
    schedule = make_schedule(tenant_a.tenant, name="throttled", actor="t")
    on_time, held_back = now - timedelta(seconds=40), now - timedelta(seconds=30)
    make_occurrence(schedule, at=on_time, state="succeeded", enqueued_at=on_time + timedelta(seconds=1))
    make_occurrence(
        schedule, at=held_back, state="succeeded", throttled=True, enqueued_at=held_back + timedelta(seconds=20)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dispatch_tenant_fire_bucket (tenant_id, tokens, refilled_at, rate, throttled_fires,"
            " dispatched_fires) VALUES (%s, 0, clock_timestamp(), 10, 7, 30)",
            [tenant_a.tenant.id],
        )
    values = scrape()
    assert values['scheduler_schedule_lag_seconds{lane="strict",quantile="1"}'] == 1.0, "SLO lag without throttled"
    assert values['scheduler_throttled_lag_seconds{lane="strict",quantile="1"}'] == 20.0
    slug = tenant_a.tenant.slug
    assert values[f'scheduler_tenant_throttled_fires_total{{tenant="{slug}"}}'] == 7
    assert values[f'scheduler_tenant_dispatched_fires_total{{tenant="{slug}"}}'] == 30
