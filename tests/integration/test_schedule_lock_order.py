"""The tenant row comes before its schedule rows (docs/ARCHITECTURE.md, "Lock order"): an update that may revive a
completed one-off, and so claim a quota slot on the tenant row, must not hold the schedule row while it waits for the
tenant row, or it and a deletion of its tenant (tenant row, then schedules) would deadlock."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from core.clock import db_now
from schedules.models import Schedule
from schedules.services import update_schedule
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def raw_connection() -> psycopg.Connection:
    settings = connection.settings_dict
    return psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"], port=settings["PORT"] or 5432
    )


def waiting_on_a_lock(application_pid: int) -> bool:
    with raw_connection() as probe:
        row = probe.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [application_pid]).fetchone()
    return row is not None and row[0] == "Lock"


def test_reviving_a_completed_one_off_waits_for_the_tenant_row_before_it_locks_the_schedule(tenant, make_schedule):
    now = db_now()
    schedule = make_schedule(tenant, kind="once", run_at=now + timedelta(hours=1))
    schedule.state, schedule.next_run_at = "completed", None  # as the materializer leaves a fired one-off
    schedule.save()
    schedule = Schedule.objects.get(pk=schedule.pk)

    deletion = raw_connection()  # stands for a tenant's deletion: it holds the tenant row first
    deletion.execute("SELECT 1 FROM tenants_tenant WHERE id = %s FOR UPDATE", [tenant.pk])
    outcome: dict = {}

    def revive() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            outcome["schedule"] = update_schedule(schedule, {"run_at": now + timedelta(hours=2)}, actor="test", now=now)
        finally:
            connection.close()

    reviver = threading.Thread(target=revive)
    reviver.start()
    try:
        wait_for(
            lambda: "pid" in outcome and waiting_on_a_lock(outcome["pid"]),
            timeout=10,
            what="the update waiting for the tenant row",
        )
        # While the update waits for the tenant row, the schedule row is free: the deletion could take it next.
        with raw_connection() as other:
            locked = other.execute(
                "SELECT id FROM schedules_schedule WHERE id = %s FOR UPDATE NOWAIT", [schedule.pk]
            ).fetchall()
        assert len(locked) == 1
    finally:
        deletion.rollback()
        deletion.close()
        reviver.join(timeout=10)
    assert not reviver.is_alive()
    revived = outcome["schedule"]
    assert revived.state == "active" and revived.next_run_at == now + timedelta(hours=2)
