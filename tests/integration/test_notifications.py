"""Notifications (docs/API.md, "Notifications"): a tenant's target set through the API hears, once per event and
occurrence, of fires that went dead, were missed, skipped for overlap or got stuck; each POST is signed like a
webhook and passes the reference verifier; delivery is at least once (a failing target is tried again) and a
refusal is given up and shown."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

from django.db import connection
from standardwebhooks import Webhook

from core.clock import db_now
from dispatch.models import Notification, Occurrence, OccurrenceState
from dispatch.notifications import PER_TENANT, Due, _record, record_stuck, send_due
from dispatch.sql import notifications as sql
from tenants.models import WebhookSecret
from tests.conftest import api_client_for, occurrence_for, schedule_for
from tests.integration.webhook_target import Reply, deliver

NOTIFICATIONS = "/api/v1/notifications/"
EVERY_EVENT = ["dead", "missed", "stuck", "skipped_overlap"]


def subscribe(api, url: str, events=None, selector=None):
    body = {"url": url, "events": events or EVERY_EVENT, **({"selector": selector} if selector is not None else {})}
    response = api.put(NOTIFICATIONS, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def send_round():
    return send_due(db_now(), threading.Event())


def occurrence(tenant, state=OccurrenceState.SCHEDULED, minutes_ago: int = 10, labels=None, **fields) -> Occurrence:
    schedule = schedule_for(tenant, name=f"job-{minutes_ago}-{state}", labels=labels or {})
    at = db_now().replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)
    return occurrence_for(schedule, at=at, state=state, **fields)


def move(occ: Occurrence, state: str, reason: str = "") -> None:
    Occurrence.objects.filter(pk=occ.pk).update(state=state, state_reason=reason)


def test_a_dead_fire_is_told_once_signed_and_verifiable(api_a, tenant, target, webhook_occurrence):
    secret = api_a.get("/api/v1/webhook-secret/").json()["secret"]
    subscribe(api_a, f"{target.url}/alerts")
    target.script(404)  # the webhook's own target refuses: the fire goes dead at once
    occ = webhook_occurrence(tenant, {"url": f"{target.url}/hook"})

    assert deliver(occ) == OccurrenceState.DEAD
    assert send_round().delivered == 1
    assert send_round().delivered == 0

    alert = target.received[-1]
    assert alert.path == "/alerts"
    body = Webhook(secret).verify(alert.raw, {k.lower(): v for k, v in alert.headers.items()})
    assert body["event"] == "dead" and body["state"] == "dead" and body["occurrence_id"] == str(occ.occurrence_id)
    assert body["schedule_id"] == str(occ.schedule_id) and "answered 404" in body["error"]
    assert alert.headers["webhook-id"] == f"dead-{occ.occurrence_id}"


def test_missed_and_skipped_overlap_are_told_and_a_second_transition_is_not(api_a, tenant, target):
    subscribe(api_a, target.url)
    missed, skipped = occurrence(tenant, minutes_ago=10), occurrence(tenant, minutes_ago=20)

    move(missed, OccurrenceState.MISSED, "later than max_lateness_seconds")
    move(skipped, OccurrenceState.SKIPPED_OVERLAP, "the previous run was still going")
    move(missed, OccurrenceState.SCHEDULED)
    move(missed, OccurrenceState.MISSED, "again")
    send_round()

    assert sorted(r.body["event"] for r in target.received) == ["missed", "skipped_overlap"]
    assert Notification.objects.filter(occurrence_id=missed.occurrence_id).count() == 1


def test_only_the_events_asked_for_and_only_for_a_tenant_that_asked(api_a, tenant, tenant_b, target):
    subscribe(api_a, target.url, ["dead"])
    move(occurrence(tenant, minutes_ago=10), OccurrenceState.MISSED)
    move(occurrence(tenant_b.tenant, minutes_ago=10), OccurrenceState.DEAD)

    assert Notification.objects.count() == 0


def test_a_stuck_occurrence_is_found_and_told_once(api_a, tenant, target):
    subscribe(api_a, target.url, ["stuck"])
    stuck = occurrence(tenant, OccurrenceState.ENQUEUED, minutes_ago=30)
    occurrence(tenant, OccurrenceState.ENQUEUED, minutes_ago=1)  # not stuck yet

    assert record_stuck(db_now()) == 1
    assert record_stuck(db_now()) == 0
    send_round()

    (alert,) = target.received
    assert (alert.body["event"], alert.body["state"]) == ("stuck", "enqueued")
    assert alert.body["occurrence_id"] == str(stuck.occurrence_id) and "past its time" in alert.body["state_reason"]


def test_a_failing_target_is_tried_again_until_it_answers(api_a, tenant, target):
    subscribe(api_a, target.url)
    first, second = occurrence(tenant, minutes_ago=10), occurrence(tenant, minutes_ago=20)
    move(first, OccurrenceState.MISSED)
    move(second, OccurrenceState.MISSED)
    target.script(503)

    failed = send_round()
    # The target is down: the tenant's other notification waits without a call.
    assert (failed.retried, failed.delivered, len(target.received)) == (2, 0, 1)
    assert api_a.get(NOTIFICATIONS).json()["pending"] == 2
    Notification.objects.update(next_attempt_at=db_now() - timedelta(seconds=1))
    assert send_round().delivered == 2

    ids = [r.headers["webhook-id"] for r in target.received]
    assert ids.count(f"missed-{first.occurrence_id}") + ids.count(f"missed-{second.occurrence_id}") == 3
    assert api_a.get(NOTIFICATIONS).json()["pending"] == 0


def test_a_refusing_target_is_given_up_and_the_reason_shown(api_a, tenant, target):
    subscribe(api_a, target.url)
    move(occurrence(tenant), OccurrenceState.MISSED)
    target.script(Reply(410))

    assert send_round().given_up == 1

    state = api_a.get(NOTIFICATIONS).json()
    assert (state["pending"], state["given_up"]) == (0, 1) and "answered 410" in state["last_error"]


def test_a_sender_that_died_mid_send_leaves_the_notification_to_another(api_a, tenant, target):
    subscribe(api_a, target.url)
    move(occurrence(tenant), OccurrenceState.MISSED)
    with connection.cursor() as cursor:
        # A sender took it (its lease moved next_attempt_at ahead) and died before recording anything.
        cursor.execute("UPDATE dispatch_notification SET next_attempt_at = now() + interval '2 minutes', attempts = 1")
    assert send_round().delivered == 0

    Notification.objects.update(next_attempt_at=db_now() - timedelta(seconds=1))  # the lease ran out

    assert send_round().delivered == 1 and len(target.received) == 1


def test_only_fires_of_the_schedules_the_selector_picks_are_told(api_a, tenant, target):
    shown = subscribe(api_a, target.url, ["missed", "stuck"], selector=" team=payments , env!=dev")
    assert shown["selector"] == "team=payments,env!=dev"
    picked = occurrence(tenant, minutes_ago=10, labels={"team": "payments", "env": "prod"})
    unlabelled_env = occurrence(tenant, minutes_ago=20, labels={"team": "payments"})
    dev = occurrence(tenant, minutes_ago=30, labels={"team": "payments", "env": "dev"})
    other_team = occurrence(tenant, minutes_ago=40, labels={"team": "search"})
    for occ in (picked, unlabelled_env, dev, other_team):
        move(occ, OccurrenceState.MISSED, "later than max_lateness_seconds")
    # The stuck search applies the same selector.
    stuck_picked = occurrence(tenant, OccurrenceState.ENQUEUED, minutes_ago=50, labels={"team": "payments"})
    occurrence(tenant, OccurrenceState.ENQUEUED, minutes_ago=60, labels={"team": "payments", "env": "dev"})
    assert record_stuck(db_now()) == 1
    send_round()

    told = sorted((r.body["event"], r.body["occurrence_id"]) for r in target.received)
    expected = [("missed", str(picked.occurrence_id)), ("missed", str(unlabelled_env.occurrence_id))]
    assert told == sorted([*expected, ("stuck", str(stuck_picked.occurrence_id))])


def test_the_target_is_read_replaced_and_removed_through_the_api(api_a, tenant_a, target):
    assert api_a.get(NOTIFICATIONS).status_code == 404
    subscribe(api_a, target.url, ["stuck", "dead"])

    shown = api_a.get(NOTIFICATIONS).json()
    assert (shown["url"], shown["events"], shown["selector"]) == (target.url, ["dead", "stuck"], "")
    reader = api_client_for(tenant_a, api_a.post("/api/v1/tokens/", {"name": "r", "scope": "read"}).json()["token"])
    assert reader.get(NOTIFICATIONS).status_code == 200
    assert reader.put(NOTIFICATIONS, {"url": target.url, "events": ["dead"]}, format="json").status_code == 403
    assert api_a.delete(NOTIFICATIONS).status_code == 204
    assert api_a.get(NOTIFICATIONS).status_code == 404 and api_a.delete(NOTIFICATIONS).status_code == 404


def test_a_wrong_target_is_a_400_naming_the_field(api_a, target):
    cases = [
        ({"url": "file:///etc/passwd", "events": ["dead"]}, "url"),
        ({"url": target.url, "events": []}, "events"),
        ({"url": target.url, "events": ["dead", "dead"]}, "events"),
        ({"url": target.url, "events": ["exploded"]}, "events"),
        ({"url": target.url, "events": ["dead"], "selector": "team"}, "selector"),
        ({"url": target.url, "events": ["dead"], "selector": "team=a,team=b"}, "selector"),
        ({"url": target.url, "events": ["dead"], "colour": "red"}, "colour"),
    ]
    for body, field in cases:
        response = api_a.put(NOTIFICATIONS, body, format="json")
        assert response.status_code == 400 and field in response.json(), (body, response.content)


def test_a_notification_never_tried_is_not_given_up_however_long_it_waited(api_a, tenant, target):
    subscribe(api_a, target.url)
    move(occurrence(tenant), OccurrenceState.MISSED)
    Notification.objects.update(created_at=db_now() - timedelta(days=2))  # the workers were down for two days

    assert send_round().delivered == 1


def test_a_day_of_failures_since_the_first_call_gives_up(api_a, tenant, target):
    subscribe(api_a, target.url)
    move(occurrence(tenant), OccurrenceState.MISSED)
    Notification.objects.update(first_tried_at=db_now() - timedelta(hours=25), attempts=30)
    target.script(503)

    assert send_round().given_up == 1
    assert "failing for over" in Notification.objects.get().last_error


def test_one_tenants_unforeseen_error_holds_back_no_other_tenant(api_a, api_b, tenant, tenant_b, target):
    subscribe(api_a, target.url)
    subscribe(api_b, target.url)
    move(occurrence(tenant), OccurrenceState.MISSED)
    move(occurrence(tenant_b.tenant), OccurrenceState.MISSED)
    api_a.get("/api/v1/webhook-secret/")
    WebhookSecret.objects.filter(tenant=tenant).update(current="no key opens this")

    done = send_round()

    assert (done.delivered, done.retried) == (1, 1)
    failed = Notification.objects.get(tenant_id=tenant.pk)
    assert failed.delivered_at is None and "SealBroken" in failed.last_error


def test_a_round_takes_a_bounded_share_of_one_tenants_backlog(api_a, api_b, tenant, tenant_b, target):
    subscribe(api_a, target.url)
    subscribe(api_b, target.url)
    for minutes in range(PER_TENANT + 5):
        move(occurrence(tenant, minutes_ago=10 + minutes), OccurrenceState.MISSED)
    move(occurrence(tenant_b.tenant, minutes_ago=10), OccurrenceState.MISSED)

    done = send_round()

    assert done.taken == PER_TENANT + 1
    assert Notification.objects.filter(tenant_id=tenant_b.tenant.pk, delivered_at__isnull=False).count() == 1


def test_a_sender_whose_lease_ran_out_records_nothing(api_a, tenant, target):
    subscribe(api_a, target.url)
    move(occurrence(tenant), OccurrenceState.MISSED)
    stale, current = uuid.uuid4(), uuid.uuid4()
    Notification.objects.update(lease=current)
    row = Notification.objects.get()
    due = Due(row.id, row.tenant_id, row.event, row.occurrence_id, row.scheduled_for, row.schedule_id, row.state,
              row.state_reason, 1, db_now(), target.url, None)  # fmt: skip

    _record(sql.DELIVERED, [due], stale)
    assert Notification.objects.get().delivered_at is None
    _record(sql.DELIVERED, [due], current)
    assert Notification.objects.get().delivered_at is not None
