"""Daily partitions of the occurrence and attempt tables: made days ahead of need, dropped whole after retention.

Dropping a day's partition removes its rows without a DELETE, dead tuples or a long vacuum; at 200 M
occurrences a day that is the only affordable way to prune.

Every day is made under a lock timeout of SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS, then gives up: a long read of the
occurrence table (a report, pg_dump) must cost the data plane a pause that short, never a queue of every write
behind a DDL statement waiting for its lock (docs/DESIGN.md, "Upkeep"). A day that was not made is reported to the
caller, which tries again later.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

PARTITIONED_TABLES = ("dispatch_occurrence", "dispatch_attempt")
_PARTITION_NAME = re.compile(r"_p(\d{8})$")
# PostgreSQL's error codes for "lock not granted within lock_timeout" and "DEFAULT already holds rows of the range".
LOCK_NOT_AVAILABLE = "55P03"
CHECK_VIOLATION = "23514"
# Refusals already logged by this process: a day DEFAULT holds is refused at every later try too.
_refusals_logged: set[str] = set()


def utc_today() -> date:
    return datetime.now(UTC).date()


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


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


def sqlstate(exc: BaseException) -> str | None:
    """PostgreSQL's error code behind a Django DatabaseError (psycopg's error is its cause)."""
    return getattr(exc.__cause__, "sqlstate", None) or getattr(exc, "sqlstate", None)


def lock_timeout_text() -> str:
    """SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS as PostgreSQL's lock_timeout; never 0, which means "wait forever"."""
    return f"{max(1, round(settings.SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS * 1000))}ms"


@contextmanager
def locks_wait_at_most_the_timeout(cursor) -> Iterator[None]:
    """Inside a transaction (or a savepoint of a migration's): the statements of the block wait for a lock at most
    SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS. The caller's value is restored when the block succeeds; a failed block's
    rollback undoes the change anyway."""
    cursor.execute(maintenance_sql.CURRENT_LOCK_TIMEOUT)
    previous = cursor.fetchone()[0]
    cursor.execute(maintenance_sql.SET_LOCK_TIMEOUT, [lock_timeout_text(), True])
    yield
    cursor.execute(maintenance_sql.SET_LOCK_TIMEOUT, [previous, True])


# --- creating days -------------------------------------------------------------------------------------------------


@dataclass
class EnsureReport:
    created: list[str] = field(default_factory=list)
    # Not made this time (a lock busy past the timeout, or another error): the caller tries again later.
    failed: dict[str, str] = field(default_factory=dict)
    # Never made: DEFAULT already holds rows of the day (written while it had no partition), so PostgreSQL refuses
    # the partition. Those rows stay in DEFAULT, where they are still found and pruned.
    refused: list[str] = field(default_factory=list)


def ensure_partitions(connection: BaseDatabaseWrapper, first_day: date, last_day: date) -> EnsureReport:
    """Create the daily partitions of [first_day, last_day] that do not exist yet.

    Each day is `CREATE TABLE ... (LIKE parent)` then `ATTACH PARTITION`, one transaction per day: the attach takes
    SHARE UPDATE EXCLUSIVE on the parent, which no read or write of the data plane conflicts with, where
    `CREATE TABLE ... PARTITION OF` takes ACCESS EXCLUSIVE on it. Both take ACCESS EXCLUSIVE on the DEFAULT
    partition (to check it holds no row of the day), so both wait for a read of the whole table; the wait is bounded
    by the lock timeout, and a day not made is in `failed`.

    Works in autocommit (a long-running process between batches) and inside a transaction (a migration, a backfill)
    alike: `transaction.atomic` is a transaction of its own in autocommit and a savepoint inside one, so one day that
    fails never aborts the caller's transaction nor the next day.
    """
    report = EnsureReport()
    wanted = [first_day + timedelta(days=n) for n in range((last_day - first_day).days + 1)]
    for table in PARTITIONED_TABLES:
        existing = existing_partition_days(connection, table)
        for day in wanted:
            if day in existing:
                continue
            name = partition_name(table, day)
            bounds = [instant.isoformat() for instant in day_bounds(day)]
            if _default_holds(connection, table, bounds):
                _refused(report, name)
                continue
            try:
                with (
                    transaction.atomic(using=connection.alias),
                    connection.cursor() as cursor,
                    locks_wait_at_most_the_timeout(cursor),
                ):
                    cursor.execute(maintenance_sql.CREATE_DAY_TABLE.format(partition=name, parent=table))
                    cursor.execute(maintenance_sql.ATTACH_DAY_PARTITION.format(partition=name, parent=table), bounds)
            except DatabaseError as exc:
                code = sqlstate(exc)
                if code == CHECK_VIOLATION:  # DEFAULT took a row of the day after the check above
                    _refused(report, name)
                elif code == LOCK_NOT_AVAILABLE:
                    report.failed[name] = f"a lock was busy for more than {lock_timeout_text()}"
                else:
                    report.failed[name] = str(exc).strip()
            else:
                report.created.append(name)
                logger.info("created partition %s", name, extra={"action": "partition"})
    return report


def _default_holds(connection: BaseDatabaseWrapper, table: str, bounds: list[str]) -> bool:
    """Whether DEFAULT holds rows of the day: asked first, without a lock, so a refused day costs no ACCESS
    EXCLUSIVE wait on DEFAULT at every try."""
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.DEFAULT_HOLDS_RANGE.format(parent=table), bounds)
        return bool(cursor.fetchone()[0])


def _refused(report: EnsureReport, name: str) -> None:
    report.refused.append(name)
    if name not in _refusals_logged:
        _refusals_logged.add(name)
        logger.warning(
            "partition %s not created: the DEFAULT partition already holds rows of its day (they stay there, found "
            "and pruned as usual)",
            name,
            extra={"action": "partition"},
        )


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
                dropped.append(name)
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.DELETE_DEFAULT_BEFORE.format(parent=table), [cutoff])
    return dropped
