"""Daily partitions of the occurrence and attempt tables: created ahead of need, dropped whole after retention.

Dropping a day's partition removes its rows without a DELETE, dead tuples or a long vacuum; at 200 M
occurrences a day that is the only affordable way to prune.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, date, datetime, timedelta

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

PARTITIONED_TABLES = ("dispatch_occurrence", "dispatch_attempt")
_PARTITION_NAME = re.compile(r"_p(\d{8})$")
# Partitions this process has seen, so the hot path does not ask the catalog every batch.
_known: set[tuple[str, date]] = set()


def utc_today() -> date:
    return datetime.now(UTC).date()


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def existing_partition_days(connection: BaseDatabaseWrapper, table: str) -> set[date]:
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.PARTITION_CHILDREN, [table])
        names = [row[0] for row in cursor.fetchall()]
    days = set()
    for name in names:
        match = _PARTITION_NAME.search(name)
        if match:
            days.add(datetime.strptime(match.group(1), "%Y%m%d").date())
    return days


def ensure_partitions(connection: BaseDatabaseWrapper, first_day: date, last_day: date) -> int:
    """Create the daily partitions of [first_day, last_day] that do not exist yet; returns how many were made.

    Works in autocommit (a long-running process between batches) and inside a transaction (a migration, a
    backfill) alike: each CREATE runs in `transaction.atomic`, which is a transaction of its own in autocommit and
    a savepoint inside one, so one refused day never aborts the caller's transaction nor the next day.

    A day whose rows already sit in the DEFAULT partition cannot get its own partition (PostgreSQL refuses):
    those rows stay in DEFAULT, where they are still found and pruned. The refusal is logged once per process
    and not retried every batch.
    """
    created = 0
    wanted = [first_day + timedelta(days=n) for n in range((last_day - first_day).days + 1)]
    for table in PARTITIONED_TABLES:
        if all((table, day) in _known for day in wanted):
            continue
        existing = existing_partition_days(connection, table)
        for day in wanted:
            if (table, day) in _known:
                continue
            if day in existing:
                _known.add((table, day))
                continue
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            end = start + timedelta(days=1)
            name = partition_name(table, day)
            try:
                with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                    cursor.execute(
                        maintenance_sql.CREATE_DAY_PARTITION.format(partition=name, parent=table),
                        [start.isoformat(), end.isoformat()],
                    )
            except DatabaseError as exc:
                logger.warning("partition %s not created: %s", name, exc, extra={"action": "partition"})
            else:
                created += 1
                logger.info("created partition %s", name, extra={"action": "partition"})
            _known.add((table, day))
    return created


def drop_partitions_before(connection: BaseDatabaseWrapper, cutoff_day: date) -> list[str]:
    """Drop whole days older than cutoff_day (retention), and delete older rows left in DEFAULT."""
    dropped: list[str] = []
    cutoff = datetime(cutoff_day.year, cutoff_day.month, cutoff_day.day, tzinfo=UTC)
    for table in PARTITIONED_TABLES:
        for day in sorted(existing_partition_days(connection, table)):
            if day < cutoff_day:
                name = partition_name(table, day)
                with connection.cursor() as cursor:
                    cursor.execute(maintenance_sql.DROP_PARTITION.format(partition=name))
                _known.discard((table, day))
                dropped.append(name)
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.DELETE_DEFAULT_BEFORE.format(parent=table), [cutoff])
    return dropped
