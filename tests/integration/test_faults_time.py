"""Time passing: a platform that has run for a week meets missing day partitions in autocommit, never a dead loop.

These tests commit (transaction=True): partition DDL outside a transaction is exactly what a wrapping test
transaction would hide.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection

from core.clock import db_now
from dispatch import partitions
from dispatch.models import Occurrence
from schedules import services
from tests.integration.processes import run_manage
from tests.integration.support import materializer_holding_every_shard, run_materializer

pytestmark = pytest.mark.django_db(transaction=True)


def drop_partitions_from(first_day: date) -> None:
    """As if the days from `first_day` on had never been prepared (the platform migrated long ago)."""
    for table in partitions.PARTITIONED_TABLES:
        for day in partitions.existing_partition_days(connection, table):
            if day >= first_day:
                with connection.cursor() as cursor:
                    cursor.execute(f'DROP TABLE "public"."{partitions.partition_name(table, day)}"')


def rows_in_default(schedule_id) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_occurrence_default WHERE schedule_id = %s", [schedule_id])
        return cursor.fetchone()[0]


def test_a_week_after_migrate_the_materializers_upkeep_makes_the_missing_partitions_in_autocommit(tenant_a):
    week_later = (db_now() + timedelta(days=8)).replace(second=0, microsecond=0)
    drop_partitions_from(week_later.date() - timedelta(days=1))
    schedule, _ = services.create_schedule(
        tenant=tenant_a.tenant,
        data={"name": "week", "kind": "cron", "cron": "* * * * *", "handler": "noop"},
        actor="test",
        now=week_later,
    )
    materializer = materializer_holding_every_shard("week-later")
    assert connection.get_autocommit(), "the materializer's upkeep runs between transactions"

    assert materializer.upkeep.run_due(week_later)
    run_materializer(materializer, week_later, week_later + timedelta(minutes=5))

    ahead = settings.SCHEDULER_PARTITION_DAYS_AHEAD
    for table in partitions.PARTITIONED_TABLES:
        days = partitions.existing_partition_days(connection, table)
        assert {week_later.date() + timedelta(days=n) for n in range(-1, ahead + 1)} <= days, table
    fired = Occurrence.objects.filter(schedule_id=schedule.id).count()
    assert fired >= 5
    assert rows_in_default(schedule.id) == 0, "each fire lands in its own day's partition, not in DEFAULT"


def test_a_day_refused_because_default_holds_its_rows_does_not_stop_the_next_days(tenant_a):
    """Rows of a day that had no partition sit in DEFAULT; PostgreSQL then refuses that day's partition. The
    refusal costs that one day, not the days after it, and the caller's loop goes on."""
    day = (db_now() + timedelta(days=20)).date()
    drop_partitions_from(day)
    schedule, _ = services.create_schedule(
        tenant=tenant_a.tenant,
        data={"name": "default-day", "kind": "cron", "cron": "0 12 * * *", "handler": "noop"},
        actor="test",
    )
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    Occurrence.objects.create(
        occurrence_id=schedule.id,
        schedule=schedule,
        tenant_id=schedule.tenant_id,
        schedule_version=1,
        scheduled_for=noon,
        available_at=noon,
        lane="strict",
    )
    assert rows_in_default(schedule.id) == 1

    report = partitions.ensure_partitions(connection, day, day + timedelta(days=2))

    assert len(report.created) == 3 * len(partitions.PARTITIONED_TABLES) - 1
    assert report.refused == [partitions.partition_name("dispatch_occurrence", day)] and not report.failed
    days = partitions.existing_partition_days(connection, "dispatch_occurrence")
    assert day not in days and {day + timedelta(days=1), day + timedelta(days=2)} <= days
    assert Occurrence.objects.filter(schedule_id=schedule.id).count() == 1, "the DEFAULT row is still found"


def test_a_fresh_materializer_process_recreates_a_dropped_partition_and_exits_cleanly(tenant_a):
    day_after_tomorrow = (db_now() + timedelta(days=2)).date()
    drop_partitions_from(day_after_tomorrow)

    finished = run_manage("materialize", "--once", "--name", "fresh-process")

    assert finished.returncode == 0, finished.stderr[-2000:]
    for table in partitions.PARTITIONED_TABLES:
        assert day_after_tomorrow in partitions.existing_partition_days(connection, table), table
