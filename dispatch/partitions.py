"""Daily partitions of the occurrence and attempt tables: made days ahead of need, dropped whole after retention.

Dropping a day's partition removes its rows without a DELETE, dead tuples or a long vacuum; at 200 M
occurrences a day that is the only affordable way to prune.

Every statement here waits for a lock at most SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS, then gives up: a long read of
the occurrence table (a report, pg_dump) must cost the data plane a pause that short, never a queue of every write
behind a DDL statement waiting for its lock (docs/DESIGN.md, "Upkeep"). A day that was not made or dropped is
reported to the caller, which tries again later.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from dispatch.models import TERMINAL_STATES, OccurrenceState
from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

PARTITIONED_TABLES = ("dispatch_occurrence", "dispatch_attempt")
OCCURRENCES, ATTEMPTS = PARTITIONED_TABLES
# How full an insert leaves a day's heap pages (percent). An occurrence is updated three times (claimed, completed,
# settled) and an attempt once, within seconds of its insert: with room on its own page, an update that changes no
# indexed column is HOT (no index entry written) and one that does still logs only the bytes that changed, instead of
# the whole row moving to another page with a new entry in every index (docs/DESIGN.md, "Hot tables").
FILLFACTOR = {OCCURRENCES: 70, ATTEMPTS: 80}
# States a fire can still leave: a partition holding one is never dropped (its fire would vanish unrun).
UNFINISHED_STATES = [state.value for state in OccurrenceState if state not in TERMINAL_STATES]
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
                    cursor.execute(
                        maintenance_sql.CREATE_DAY_TABLE.format(
                            partition=name, parent=table, fillfactor=FILLFACTOR[table]
                        )
                    )
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


# --- dropping days -------------------------------------------------------------------------------------------------


@dataclass
class PruneReport:
    cutoff: date
    dropped: list[str] = field(default_factory=list)
    # Partitions past the retention kept because they hold unfinished fires: name -> {state: rows}.
    kept: dict[str, dict[str, int]] = field(default_factory=dict)
    # Not dropped this time: a lock busy past the timeout, or rows written while the day was checked.
    busy: dict[str, str] = field(default_factory=dict)
    # Rows older than the cutoff in the DEFAULT partitions: deleted (or, in a dry run, to delete), and kept unfinished.
    default_deleted: int = 0
    default_kept: int = 0


class _ChangedDuringCheck(Exception):
    """Rows of the day were written while it was checked: keep it this time, check it again next time."""


def prune_partitions(connection: BaseDatabaseWrapper, cutoff_day: date, *, dry_run: bool = False) -> PruneReport:
    """Drop the days older than `cutoff_day` (retention) whose fires are all finished; delete the finished rows older
    than it from DEFAULT.

    A day holding a fire that can still run (scheduled, enqueued, running, retry_wait: a backfill of an old range,
    a replay, a catch-up after a long outage) is kept and reported, and dropped by a later pass once they are done.
    1. Count the day's unfinished fires, without a lock that blocks anyone (a full read of the partition).
    2. In one transaction, each lock waiting at most the timeout: the parents and the day's partitions ACCESS
       EXCLUSIVE (parent first, occurrences before attempts, as PostgreSQL's own DROP orders them), then check
       cheaply that nothing re-opened the day since step 1, and drop both partitions.
    """
    report = PruneReport(cutoff=cutoff_day)
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.FLUSH_OWN_STATISTICS)
    days_of = {table: existing_partition_days(connection, table) for table in PARTITIONED_TABLES}
    for day in sorted(set().union(*days_of.values())):
        if day >= cutoff_day:
            continue
        present = [(table, partition_name(table, day)) for table in PARTITIONED_TABLES if day in days_of[table]]
        names = [name for _, name in present]
        occurrences = partition_name(OCCURRENCES, day) if day in days_of[OCCURRENCES] else None
        writes_before = 0
        if occurrences is not None:
            writes_before = _writes(connection, occurrences)  # read before the check, compared after it
            unfinished = _unfinished(connection, occurrences)
            if unfinished:
                report.kept[occurrences] = unfinished
                continue
        if dry_run:
            report.dropped.extend(names)
            continue
        try:
            _drop_day(connection, day, present, occurrences, writes_before)
        except _ChangedDuringCheck:
            report.busy[names[0]] = "rows of the day were written while it was checked"
        except DatabaseError as exc:
            if sqlstate(exc) != LOCK_NOT_AVAILABLE:
                raise
            report.busy[names[0]] = f"a lock was busy for more than {lock_timeout_text()}"
        else:
            report.dropped.extend(names)
    _prune_default(connection, report, dry_run)
    return report


def _writes(connection: BaseDatabaseWrapper, partition: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.PARTITION_WRITES, [f'"public"."{partition}"'])
        row = cursor.fetchone()
        return int(row[0]) if row else 0


def _unfinished(connection: BaseDatabaseWrapper, partition: str) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.UNFINISHED_BY_STATE.format(partition=partition), [UNFINISHED_STATES])
        return dict(cursor.fetchall())


def _drop_day(
    connection: BaseDatabaseWrapper,
    day: date,
    present: list[tuple[str, str]],
    occurrences: str | None,
    writes_before: int,
) -> None:
    start, end = day_bounds(day)
    with (
        transaction.atomic(using=connection.alias),
        connection.cursor() as cursor,
        locks_wait_at_most_the_timeout(cursor),
    ):
        for table, name in present:
            cursor.execute(maintenance_sql.LOCK_PARENT_ONLY.format(parent=table))
            cursor.execute(maintenance_sql.LOCK_PARTITION.format(partition=name))
        if occurrences is not None:
            # Nothing writes to the day while these locks are held. Step 1 read the whole day without them; what could
            # have re-opened a fire since shows here cheaply: the table's write counter moved, a fire of the day
            # waits in the outbox, or one is running or waiting for a retry (the watch).
            cursor.execute(maintenance_sql.PARTITION_WRITES, [f'"public"."{occurrences}"'])
            row = cursor.fetchone()
            cursor.execute(maintenance_sql.DAY_REOPENED.format(partition=occurrences), {"start": start, "end": end})
            if (int(row[0]) if row else 0) != writes_before or cursor.fetchone()[0]:
                raise _ChangedDuringCheck
        for _, name in present:
            cursor.execute(maintenance_sql.DROP_PARTITION.format(partition=name))
        if occurrences is not None:  # else the day's occurrences live in DEFAULT, and their watch rows with them
            cursor.execute(maintenance_sql.FORGET_WATCHED_DAY, {"start": start, "end": end})
    for _, name in present:
        logger.info("dropped partition %s (past the retention, every fire finished)", name, extra={"action": "prune"})


def _prune_default(connection: BaseDatabaseWrapper, report: PruneReport, dry_run: bool) -> None:
    """Rows of days that had no partition when written sit in DEFAULT: the finished ones past the cutoff are deleted
    (the DELETE re-checks each row's state under its row lock, so a fire re-opened meanwhile stays)."""
    params: dict[str, Any] = {"cutoff": day_bounds(report.cutoff)[0], "unfinished": UNFINISHED_STATES}
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.COUNT_DEFAULT_BEFORE, params)
        finished, unfinished, attempts = cursor.fetchone()
    report.default_kept = unfinished
    if dry_run or not (finished or attempts):
        report.default_deleted = finished
        return
    try:
        with (
            transaction.atomic(using=connection.alias),
            connection.cursor() as cursor,
            locks_wait_at_most_the_timeout(cursor),
        ):
            cursor.execute(maintenance_sql.DELETE_FINISHED_DEFAULT_OCCURRENCES, params)
            report.default_deleted = cursor.fetchone()[0]
            cursor.execute(maintenance_sql.DELETE_DEFAULT_ATTEMPTS, params)
    except DatabaseError as exc:
        if sqlstate(exc) != LOCK_NOT_AVAILABLE:
            raise
        report.busy["dispatch_occurrence_default"] = f"a lock was busy for more than {lock_timeout_text()}"
