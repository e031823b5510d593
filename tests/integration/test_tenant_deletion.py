"""Deleting a tenant ends its pending work, and no process spins on what it left: a real relay beside the deletion."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client

from core.clock import db_now
from dispatch.identity import occurrence_id_for
from dispatch.models import Attempt, Occurrence, OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from schedules.models import Schedule
from tenants.models import Tenant
from tenants.services import provision_tenant
from tests.integration.test_faults_connections import Running
from tests.integration.test_relay_process import drain_queue
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used so far (/proc/<pid>/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fires(schedule, instants, *, state: str = "scheduled", **fields) -> list[Occurrence]:
    """Occurrences of `schedule` at `instants`, each with its own envelope on the strict queue (as materialized)."""
    rows = [
        Occurrence.objects.create(
            occurrence_id=occurrence_id_for(schedule.id, 1, at),
            schedule_id=schedule.id,
            tenant_id=schedule.tenant_id,
            schedule_version=1,
            scheduled_for=at,
            available_at=at,
            lane="strict",
            state=state,
            **fields,
        )
        for at in instants
    ]
    if state == "scheduled":
        with connection.cursor() as cursor:
            enqueue(
                cursor,
                [Fire(o.occurrence_id, o.scheduled_for, o.tenant_id, STRICT_QUEUE, o.available_at, 0) for o in rows],
                1,
            )
    return rows


def test_a_deleted_tenant_s_pending_fires_end_canceled_and_the_relay_neither_spins_nor_delays_others(
    tenant_a, make_schedule
):
    """Before, Tenant.delete() left the tenant's envelopes behind: never granted a fire (the reservation joins the
    tenant row) yet counted due, so the relay napped 0 s and spun at 61 % of a core for ever, and the occurrences
    stayed scheduled."""
    drain_queue(STRICT_QUEUE)
    doomed = provision_tenant(f"doomed-{uuid.uuid4().hex[:6]}", domain=f"d{uuid.uuid4().hex[:6]}.localhost").tenant
    doomed_id = doomed.id
    schedule = make_schedule(doomed, name="doomed-job")
    now = db_now()
    # Five materialized fires due a few seconds after the deletion, and one running.
    pending = fires(schedule, [now + timedelta(seconds=5, milliseconds=n) for n in range(5)])
    running = fires(
        schedule,
        [now - timedelta(seconds=5)],
        state="running",
        attempt_count=1,
        lease_expires_at=now + timedelta(seconds=60),
    )[0]
    Attempt.objects.create(
        occurrence_id=running.occurrence_id,
        scheduled_for=running.scheduled_for,
        generation=1,
        worker="w",
        started_at=now,
        lease_expires_at=now + timedelta(seconds=60),
    )
    other = make_schedule(tenant_a.tenant, name="neighbour")
    # Another tenant's fires, one a second through the measured window.
    neighbour = fires(other, [now + timedelta(seconds=6 + n) for n in range(10)])

    # A short staging lead: between the neighbour's fires the relay has nothing of its own to do.
    relay = Running("relay", "--name", "deletion-relay", SCHEDULER_RELAY_STAGE_SECONDS="0.2")
    try:
        wait_for(lambda: "queues declared" in relay.text(), 30, "the relay connected")
        Tenant.objects.get(pk=doomed_id).delete()
        # A writer that read the tenant before its deletion commits an envelope after it (a race the relay must
        # survive by withdrawing it, not by polling it).
        straggler = fires(schedule, [db_now() + timedelta(seconds=1)])[0]
        wait_for(lambda: db_now() > now + timedelta(seconds=5.5), 30, "the deleted tenant's fires to fall due")
        before, started = cpu_seconds(relay.process.pid), time.monotonic()
        time.sleep(10)
        share = (cpu_seconds(relay.process.pid) - before) / (time.monotonic() - started)
        wait_for(
            lambda: Occurrence.objects.filter(schedule_id=other.id, enqueued_at__isnull=True).count() == 0,
            30,
            "the neighbour's fires published and settled",
        )
    finally:
        assert relay.stop() == 0, relay.text()

    assert share < 0.30, f"the relay used {share:.0%} of a core with nothing of its own to do"
    for occurrence in Occurrence.objects.filter(tenant_id=doomed_id):
        assert occurrence.state == "canceled", occurrence
        assert "tenant" in occurrence.state_reason and "deleted" in occurrence.state_reason, occurrence.state_reason
    assert {o.occurrence_id for o in [*pending, running, straggler]} == set(
        Occurrence.objects.filter(tenant_id=doomed_id).values_list("occurrence_id", flat=True)
    )
    assert not OutboxMessage.objects.filter(tenant_id=doomed_id).exists(), "no envelope of the tenant stays"
    assert Attempt.objects.get(occurrence_id=running.occurrence_id).finished_at is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_tenant_fire_bucket WHERE tenant_id = %s", [doomed_id])
        assert cursor.fetchone()[0] == 0, "its fire bucket is gone"
    lags = [(o.enqueued_at - o.available_at).total_seconds() for o in Occurrence.objects.filter(schedule_id=other.id)]
    assert len(lags) == len(neighbour) and max(lags) < 1.0, f"the neighbour's fires left on time: {max(lags):.2f} s"
    drain_queue(STRICT_QUEUE)


def test_the_console_deletes_a_tenant_through_the_service(tenants, admin_user, make_schedule):
    """The operator console's delete ends the tenant's pending work and drops its schema, as the service does."""
    slug = f"gone-{uuid.uuid4().hex[:6]}"
    gone = provision_tenant(slug, domain=f"{slug}.localhost").tenant
    schedule = make_schedule(gone, name="orphaned")
    pending = fires(schedule, [db_now() + timedelta(seconds=30)])[0]
    Schedule.objects.filter(pk=schedule.pk).delete()  # the console refuses a tenant holding schedules
    client = Client(HTTP_HOST="localhost")
    client.force_login(admin_user)

    response = client.post(f"/admin/tenants/tenant/{gone.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302, response.content[:500]
    assert not Tenant.objects.filter(pk=gone.pk).exists()
    pending.refresh_from_db()
    assert pending.state == "canceled" and "deleted by operator:" in pending.state_reason
    assert not OutboxMessage.objects.filter(tenant_id=gone.pk).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [gone.schema_name])
        assert cursor.fetchone()[0] == 0, "its schema, users and tokens are gone"
