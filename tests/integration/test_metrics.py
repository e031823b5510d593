"""/metrics on the public host: stored counters of every process, the lag histograms the settle step keeps, gauges
read from the durable record, the lanes' queues; and /healthz, which says when fires would not go out on time."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client

from core.clock import db_now
from dispatch import counters
from dispatch.engine.relay import Relay
from dispatch.engine.settler import settle_params
from dispatch.identity import occurrence_id_for
from dispatch.models import OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from dispatch.sql import metrics as metrics_sql
from dispatch.sql import outbox as outbox_sql
from tests.conftest import move_cursor


def scrape() -> dict[str, float]:
    response = Client(HTTP_HOST="localhost").get("/metrics")
    assert response.status_code == 200
    values = {}
    for line in response.content.decode().splitlines():
        if line.startswith("scheduler_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def settle_published(envelope_ids: list[int], published_after: timedelta) -> int:
    """Stamp envelopes as the relay does (confirmed `published_after` their release instant) and settle them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_outboxmessage SET published_at = available_at + %s WHERE id = ANY(%s)",
            [published_after, envelope_ids],
        )
        cursor.execute(outbox_sql.SETTLE_PUBLISHED, settle_params(1000, 1000, 0))
        return cursor.fetchone()[0]


def envelopes_for(schedule, instants, *, version: int = 1) -> list[int]:
    fires = [
        Fire(occurrence_id_for(schedule.id, version, at), at, schedule.tenant_id, STRICT_QUEUE, at, 0)
        for at in instants
    ]
    with connection.cursor() as cursor:
        enqueue(cursor, fires)
    ids = [f.occurrence_id for f in fires]
    return list(OutboxMessage.objects.filter(occurrence_ids__overlap=ids).values_list("id", flat=True))


def test_metrics_report_outbox_depth_dlq_size_and_recent_states(tenant_a, make_schedule, make_occurrence):
    now = db_now()
    schedule = make_schedule(tenant_a.tenant, name="m", actor="t")
    at = now - timedelta(seconds=30)
    make_occurrence(schedule, at=at, version=1, lane="strict", state="dead", enqueued_at=at + timedelta(seconds=2))
    later = now + timedelta(minutes=5)
    envelopes_for(schedule, [later])

    values = scrape()

    assert values["scheduler_outbox_envelopes"] == 1
    assert values["scheduler_outbox_occurrences"] == 1
    assert values["scheduler_dlq_occurrences"] == 1
    assert values['scheduler_recent_occurrences{lane="strict",state="dead"}'] == 1


def test_the_settle_step_keeps_a_lag_histogram_counting_each_first_publish_once(
    tenant_a, make_schedule, make_occurrence
):
    schedule = make_schedule(tenant_a.tenant, name="lagging", actor="t")
    base = db_now().replace(microsecond=0) - timedelta(minutes=5)
    instants = [base + timedelta(seconds=n) for n in range(3)]
    occurrences = [make_occurrence(schedule, at=at, version=1) for at in instants]
    before = scrape()
    bucket = 'scheduler_schedule_lag_seconds_bucket{lane="strict",le="%s"}'

    assert settle_published(envelopes_for(schedule, instants), timedelta(seconds=0.3)) == 3
    after = scrape()

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew(bucket % "0.25") == 0, "0.3 s is above the 0.25 s bound"
    assert grew(bucket % "0.5") == 3 and grew(bucket % "+Inf") == 3, "buckets are cumulative"
    assert grew('scheduler_schedule_lag_seconds_count{lane="strict"}') == 3
    assert grew('scheduler_schedule_lag_seconds_sum{lane="strict"}') == pytest.approx(0.9)
    assert all(o.__class__.objects.get(pk=o.pk).state == "enqueued" for o in occurrences)

    # A retry's envelope for the same occurrences is settled too, but their first publish was counted already.
    assert settle_published(envelopes_for(schedule, instants), timedelta(seconds=40)) == 3
    again = scrape()
    assert (
        again['scheduler_schedule_lag_seconds_count{lane="strict"}']
        == after['scheduler_schedule_lag_seconds_count{lane="strict"}']
    )


def test_throttled_fires_go_to_their_own_histogram_and_tenant_series_are_bounded(
    tenant_a, tenant_b, make_schedule, make_occurrence
):
    schedule_a = make_schedule(tenant_a.tenant, name="busy", actor="t")
    schedule_b = make_schedule(tenant_b.tenant, name="quiet", actor="t")
    base = db_now().replace(microsecond=0) - timedelta(minutes=5)
    with connection.cursor() as cursor:
        # acme is the busiest tenant by fires dispatched; the ranking is redone at the next scrape.
        cursor.execute(
            "INSERT INTO dispatch_tenant_fire_bucket (tenant_id, tokens, refilled_at, rate, dispatched_fires)"
            " VALUES (%s, 0, clock_timestamp(), 10, 500)",
            [tenant_a.tenant.id],
        )
        cursor.execute("DELETE FROM dispatch_metric_tenant_series")
    scrape()
    make_occurrence(schedule_a, at=base, version=1)
    make_occurrence(schedule_b, at=base, version=1)
    held_back = base + timedelta(seconds=1)
    make_occurrence(schedule_a, at=held_back, version=1)
    ids = envelopes_for(schedule_a, [base]) + envelopes_for(schedule_b, [base])
    throttled = envelopes_for(schedule_a, [held_back])
    OutboxMessage.objects.filter(id__in=throttled).update(throttled=True)
    before = scrape()

    settle_published(ids + throttled, timedelta(seconds=2))
    after = scrape()

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    slug = tenant_a.tenant.slug
    assert grew('scheduler_throttled_lag_seconds_count{lane="strict"}') == 1
    assert grew('scheduler_schedule_lag_seconds_count{lane="strict"}') == 2, "SLO lag without the throttled fire"
    assert grew(f'scheduler_tenant_schedule_lag_seconds_count{{lane="strict",tenant="{slug}"}}') == 1
    assert grew('scheduler_tenant_schedule_lag_seconds_count{lane="strict",tenant="other"}') == 1
    assert not any(tenant_b.tenant.slug in name for name in after), "a quiet tenant has no series of its own"


def test_counts_of_any_process_are_served_after_a_flush_and_a_failed_flush_keeps_them(db, monkeypatch):
    before = scrape().get("scheduler_worker_claims_total", 0)
    counters.WORKER_CLAIMS.inc(3)
    counters.WORKER_CLAIM_DROPS.labels("duplicate").inc()
    monkeypatch.setattr(metrics_sql, "ADD_TO_COUNTERS", "SELECT no_such_function()")

    assert counters.flush() == 0
    monkeypatch.undo()
    assert counters.stored_value("scheduler_worker_claims") == pytest.approx(before + 3), "kept for the next flush"

    values = scrape()  # the scrape flushes this process's pending counts first
    assert values["scheduler_worker_claims_total"] == before + 3
    assert values['scheduler_worker_claim_drops_total{reason="duplicate"}'] >= 1
    assert counters.flush() == 0, "nothing was left pending"


def test_histograms_from_any_process_are_cumulative_with_count_and_sum(db):
    family = counters.START_LAG.labels("flexible")
    before = scrape()
    for seconds in (0.004, 0.2, 7.0, 4000.0):
        family.observe(seconds)
    after = scrape()

    def grew(le: str) -> float:
        name = f'scheduler_start_lag_seconds_bucket{{lane="flexible",le="{le}"}}'
        return after[name] - before.get(name, 0)

    assert [grew(le) for le in ("0.005", "0.25", "10.0", "1800.0", "+Inf")] == [1, 2, 3, 3, 4]
    count = 'scheduler_start_lag_seconds_count{lane="flexible"}'
    assert after[count] - before.get(count, 0) == 4


def test_counters_and_histograms_without_labels_show_a_zero_sample_before_their_first_count(db, monkeypatch):
    monkeypatch.setattr(counters, "_pending", {})  # nothing another test left pending in this process
    monkeypatch.setattr(counters, "FAMILIES", dict(counters.FAMILIES))  # the probe family below is this test's
    probe = counters.Histogram("scheduler_test_probe_seconds", "A histogram without labels, never observed.")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM dispatch_metric_counter WHERE name LIKE 'scheduler_worker_claims%%'")

    lines = Client(HTTP_HOST="localhost").get("/metrics").content.decode().splitlines()

    assert "scheduler_worker_claims_total 0.0" in lines
    assert "scheduler_materializer_conflicts_total 0.0" in lines
    assert 'scheduler_test_probe_seconds_bucket{le="+Inf"} 0.0' in lines
    assert f'scheduler_test_probe_seconds_bucket{{le="{probe.bucket_labels()[0]}"}} 0.0' in lines
    assert "scheduler_test_probe_seconds_count 0.0" in lines and "scheduler_test_probe_seconds_sum 0.0" in lines
    # A labelled family has no series until a label set is used: no sample with empty labels is made up for it.
    assert not any(line.startswith("scheduler_worker_claim_drops_total ") for line in lines)


def test_clock_skew_of_live_processes_and_the_lanes_queues_are_reported(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dispatch_processheartbeat (name, role, started_at, heartbeat_at, clock_skew_seconds)"
            " VALUES ('relay-a', 'relay', now(), clock_timestamp(), -0.2), ('relay-b', 'relay', now(),"
            " clock_timestamp(), 3.5), ('worker-gone', 'worker', now(), clock_timestamp() - interval '1 hour', 99)"
        )
        counters.write_heartbeat(cursor, "materializer-here", "materializer")

    values = scrape()

    assert values['scheduler_clock_skew_seconds{role="relay"}'] == 3.5, "the live process furthest off"
    assert abs(values['scheduler_clock_skew_seconds{role="materializer"}']) < 1.0
    assert 'scheduler_clock_skew_seconds{role="worker"}' not in values, "a process long silent is not live"
    assert values['scheduler_live_processes{role="relay"}'] == 2
    assert values["scheduler_broker_up"] == 1


def test_metrics_are_not_served_on_a_tenant_host(tenant_a):
    assert Client(HTTP_HOST=tenant_a.domain).get("/metrics").status_code == 404


def test_quota_counters_are_reported_per_tenant(tenant_a):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dispatch_tenant_fire_bucket (tenant_id, tokens, refilled_at, rate, throttled_fires,"
            " dispatched_fires) VALUES (%s, 0, clock_timestamp(), 10, 7, 30)",
            [tenant_a.tenant.id],
        )
    values = scrape()
    slug = tenant_a.tenant.slug
    assert values[f'scheduler_tenant_throttled_fires_total{{tenant="{slug}"}}'] == 7
    assert values[f'scheduler_tenant_dispatched_fires_total{{tenant="{slug}"}}'] == 30
    assert values["scheduler_throttled_fires_total"] == 7


# --- /healthz -----------------------------------------------------------------------------------------------------


def healthz() -> tuple[int, dict]:
    response = Client(HTTP_HOST="localhost").get("/healthz")
    return response.status_code, response.json()


def beat(*roles: str) -> None:
    with connection.cursor() as cursor:
        for role in roles:
            counters.write_heartbeat(cursor, f"{role}-test", role)


def test_healthz_is_ok_with_a_live_materializer_and_relay(db):
    beat("materializer", "relay")

    status, body = healthz()

    assert status == 200, body
    # What it says of autovacuum depends on the server (test_upkeep.py checks it); it never makes it degraded here.
    assert body.pop("autovacuum") in ("on", "off") and isinstance(body.pop("warnings"), list)
    assert body == {
        "status": "ok",
        "database": "ok",
        "broker": "ok",
        "materializer": "ok",
        "relay": "ok",
        "materialization": "ok",
        "reasons": [],
    }


def test_healthz_is_degraded_without_a_materializer_heartbeat_or_with_a_cursor_behind(tenant_a, make_schedule):
    beat("relay")
    status, body = healthz()
    assert (status, body["status"], body["materializer"], body["relay"]) == (503, "degraded", "silent", "ok")
    assert body["reasons"] == ["no materializer wrote a heartbeat in the last 30 s"]

    beat("materializer")
    schedule = make_schedule(tenant_a.tenant, name="frozen", actor="t")
    # A frozen materializer: the cursor of an active schedule stays where it was, two minutes ago.
    move_cursor(schedule.pk, db_now() - timedelta(minutes=2))
    status, body = healthz()
    assert (status, body["status"], body["materialization"]) == (503, "degraded", "behind")
    # 120 s, or 121 when a second turned between moving the cursor and the check.
    behind = re.compile(r"the earliest active cursor is 12[01] s behind now \(limit 60 s\)")
    assert any(behind.fullmatch(reason) for reason in body["reasons"]), body["reasons"]


def test_healthz_is_unavailable_when_the_broker_does_not_answer(db, settings):
    beat("materializer", "relay")
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"

    status, body = healthz()

    assert (status, body["status"], body["broker"], body["database"]) == (503, "unavailable", "down", "ok")


@pytest.mark.django_db(transaction=True)  # the settler works on a connection of its own
def test_unsettled_envelopes_show_as_gauges_and_their_settling_in_the_settle_lag_histogram(
    tenant_a, make_schedule, make_occurrence
):
    """A settler falling behind is visible: how many confirmed envelopes wait, since when, and how long each waited
    between its confirmation and its settling."""
    schedule = make_schedule(tenant_a.tenant, name="unsettled", actor="t")
    base = db_now().replace(microsecond=0) - timedelta(minutes=2)
    instants = [base + timedelta(seconds=n) for n in range(3)]
    for at in instants:
        make_occurrence(schedule, at=at, version=1)
    ids = envelopes_for(schedule, instants)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_outboxmessage SET published_at = clock_timestamp() - interval '45 seconds' "
            "WHERE id = ANY(%s)",
            [ids],
        )
    before = scrape()

    assert before["scheduler_outbox_unsettled_envelopes"] == 3
    assert 45 <= before["scheduler_outbox_oldest_unsettled_age_seconds"] < 60

    relay = Relay("settle-metrics")

    async def settle() -> int:
        try:
            return await relay.settler.settle_all()
        finally:
            await relay.close()

    assert asyncio.run(settle()) == 3
    after = scrape()
    assert after["scheduler_outbox_unsettled_envelopes"] == 0
    assert after["scheduler_outbox_oldest_unsettled_age_seconds"] == 0
    grew = after["scheduler_settle_lag_seconds_count"] - before.get("scheduler_settle_lag_seconds_count", 0)
    assert grew == 3
    assert after['scheduler_settle_lag_seconds_bucket{le="30.0"}'] == before.get(
        'scheduler_settle_lag_seconds_bucket{le="30.0"}', 0
    ), "each waited 45 s"
    assert (
        after['scheduler_settle_lag_seconds_bucket{le="60.0"}']
        - before.get('scheduler_settle_lag_seconds_bucket{le="60.0"}', 0)
        == 3
    )


@pytest.mark.django_db(transaction=True)  # in a transaction PostgreSQL serves the statistics it read first again
def test_checkpoints_by_cause_follow_the_server_and_a_requested_one_is_counted():
    before = scrape()['scheduler_postgres_checkpoints_total{cause="requested"}']
    assert scrape()['scheduler_postgres_checkpoints_total{cause="timed"}'] >= 0
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # an explicit one counts as requested

    # The statistics reach the view once the checkpointer has reported them; a checkpoint of a quiet server is quick.
    for _ in range(50):
        after = scrape()['scheduler_postgres_checkpoints_total{cause="requested"}']
        if after > before:
            break
        time.sleep(0.1)
    assert after >= before + 1


def test_with_a_metrics_token_only_its_bearer_or_a_superuser_session_reads_metrics(db, settings, operator):
    """/metrics names every tenant and its activity: with SCHEDULER_METRICS_TOKEN set, a scrape without the token
    (or with another) is a 401 that says what to send."""
    settings.SCHEDULER_METRICS_TOKEN = "s3cret-metrics-token"
    client = Client(HTTP_HOST="localhost")

    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert "scheduler_" not in refused.content.decode()
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token s3cret-metrics-token").status_code == 401
    answered = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert answered.status_code == 200 and "scheduler_" in answered.content.decode()
    client.force_login(operator)
    assert client.get("/metrics").status_code == 200, "the console's Metrics link, for a superuser"
