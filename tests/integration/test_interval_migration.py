"""The kind rule holds interval rows, and the migration that adds interval schedules is safe on a busy table: it gives
up on a lock it cannot get instead of queueing every write behind it, and validates the new rule separately."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from django.db import IntegrityError, transaction

from schedules.models import Schedule
from tests.integration.databases import admin_connection, manage_on, own_database


@pytest.mark.parametrize(
    "change",
    [{"every_seconds": None}, {"every_seconds": 0}, {"every_seconds": -60}, {"anchor_at": None}],
    ids=["no period", "zero period", "negative period", "no anchor"],
)
def test_the_database_refuses_an_interval_row_without_a_positive_period_and_an_anchor(tenant, make_schedule, change):
    schedule = make_schedule(tenant, kind="interval", every_seconds=60, anchor_at=datetime(2026, 1, 1, tzinfo=UTC))

    with pytest.raises(IntegrityError, match="schedule_kind_has_time"), transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(**change)


@pytest.fixture
def database_before_intervals() -> Iterator[str]:
    """A database of its own, migrated, then taken back to the last schedules migration before interval schedules."""
    with own_database("interval_migration", "schedules", "0007") as name:
        yield name


def _columns(connection: psycopg.Connection, table: str) -> set[str]:
    rows = connection.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s", [table]
    ).fetchall()
    return {row[0] for row in rows}


@pytest.mark.slow
def test_the_interval_migration_gives_up_on_a_held_lock_then_applies_and_validates_the_rule(database_before_intervals):
    with admin_connection(database_before_intervals) as blocker:
        # A long transaction that has read the cursor table (a materializer batch, a report): ALTER TABLE needs the
        # table to itself and would otherwise wait for it, with every schedule write queued behind the ALTER.
        blocker.autocommit = False
        blocker.execute("SELECT count(*) FROM schedules_schedulecursor").fetchone()

        held = manage_on(database_before_intervals, "migrate", "schedules", "--noinput")

        assert held.returncode != 0
        assert "lock timeout" in held.stderr
        blocker.rollback()
        # The long transaction has ended; the blocker's reads from here on end with each statement (a transaction
        # left open, even idle, would hold up the later migrations' concurrent index builds: test_index_migrations).
        blocker.autocommit = True
        # Rolled back whole: no column was left behind on either table.
        assert "every_seconds" not in _columns(blocker, "schedules_schedule")
        assert "every_seconds" not in _columns(blocker, "schedules_schedulecursor")

        free = manage_on(database_before_intervals, "migrate", "schedules", "--noinput")

        assert free.returncode == 0, free.stderr[-4000:]
        for table in ("schedules_schedule", "schedules_schedulecursor"):
            assert {"every_seconds", "anchor_at"} <= _columns(blocker, table)
        validated, definition = blocker.execute(
            "SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'schedule_kind_has_time'"
        ).fetchone()
        assert validated is True
        assert "'interval'" in definition and "every_seconds >= 1" in definition
