"""The materializers' upkeep: day partitions a week ahead, retention, and VACUUM where autovacuum is off.

It runs on a thread of its own in every materializer (`Materializer.keep_up`), on a connection of its own, in
autocommit: never inside a batch transaction, and never on the thread that renews the shard leases, so a long VACUUM
or a read of an old partition holds up neither. Every lock it takes waits at most
SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS; a task that gave up is tried again after SCHEDULER_UPKEEP_RETRY_SECONDS, and
said once per streak of failures in the log, every time in `scheduler_upkeep_failures_total` (docs/DESIGN.md,
"Upkeep").

1. **Partitions**: every day from yesterday to SCHEDULER_PARTITION_DAYS_AHEAD after today (PostgreSQL's date).
2. **Retention**: at most once an hour, the days older than SCHEDULER_RETENTION_DAYS whose fires have all finished
   are dropped (dispatch/partitions.py); a day holding one that can still run is kept and said so.
3. **Vacuum**: every ten seconds, each table autovacuum does not look after (off on the server or for the table) whose
   dead row versions passed the threshold is vacuumed, throttled as autovacuum would be.
4. **Vacuum of the large tables** (more than UNTHROTTLED_LIVE_ROWS live rows: the day partitions, a large cursor
   table): the same, in a lane of its own (a second Upkeep on a thread and connection of its own), so their
   throttled VACUUM, which takes longer as the day grows, never holds up the small queue-like tables' next one.
Each task runs in one materializer at a time (an advisory lock, tried, never waited for).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dispatch import counters
from dispatch.partitions import (
    LOCK_NOT_AVAILABLE,
    OCCURRENCES,
    PARTITIONED_TABLES,
    ensure_partitions,
    existing_partition_days,
    lock_timeout_text,
    prune_partitions,
    sqlstate,
)
from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

PARTITIONS, RETENTION, VACUUM, VACUUM_LARGE = "partitions", "retention", "vacuum", "vacuum_large"
# The two lanes, each an Upkeep on a thread of its own. With one, each round vacuumed the small tables, then the day
# partitions (throttled, 1 s each at the start of the steady bench and 17-20 s ten minutes in, growing with the day),
# and the outbox waited for them: its dead rows reached 80,000, the settle statement's reads per call tripled, and the
# settle lag grew with the day (docs/DESIGN.md, "VACUUM where autovacuum is off").
SMALL_LANE = (PARTITIONS, RETENTION, VACUUM)
LARGE_LANE = (VACUUM_LARGE,)
# How often each task looks again after a pass that succeeded. Partitions: a new day is wanted once a day and is made
# a week early, so ten minutes is plenty. Retention: at most once an hour (each pass reads every day past it). Vacuum:
# the check is one read of PostgreSQL's table statistics.
# Vacuum is looked at every ten seconds: the engine's queue-like tables (the outbox, the tenants' fire buckets and
# running counts, the cursors) turn over thousands of rows a second, and a minute of their dead rows made every
# statement on them walk a bloated table (bench steady: the settler fell 28 s behind on an outbox of 390,000 dead
# rows). A look is one read of pg_stat_user_tables; a small table's VACUUM is milliseconds.
EVERY_SECONDS = {PARTITIONS: 600.0, RETENTION: 3600.0, VACUUM: 10.0, VACUUM_LARGE: 10.0}
# The part of a table's live rows its dead ones may add before a VACUUM: autovacuum's default scale factor.
VACUUM_SCALE = 0.2
# Rows changed since the last ANALYZE (inserted, updated, deleted) before another: autovacuum's analyze rule, with
# a larger base, so the statistics of a table that grows by inserts follow its growth.
ANALYZE_BASE_ROWS = 500
ANALYZE_SCALE = 0.1
# Tables up to this many live rows are vacuumed unthrottled: they sit in shared buffers, so the throttle would only
# make their VACUUM last longer, and the hot small ones (buckets, running counts, the outbox) come first.
UNTHROTTLED_LIVE_ROWS = 200_000
# The throttle of a large table's VACUUM: autovacuum's defaults, a 2 ms nap after every 200 cost units.
VACUUM_COST_DELAY, VACUUM_COST_LIMIT = "2ms", "200"
# /healthz calls the platform degraded when a table autovacuum does not look after holds this many times its vacuum
# threshold, counted from a base of at least HEALTH_BASE_DEAD_TUPLES: the upkeep vacuums at one, so nothing vacuums
# it (no materializer runs, its VACUUM fails) or a long transaction keeps VACUUM from removing anything. The larger
# base: a queue-like table the upkeep vacuums at 1,000 dead rows gathers tens of thousands in the seconds a day
# partition's VACUUM keeps the upkeep busy, and that is not a fault.
BEHIND_FACTOR = 10
HEALTH_BASE_DEAD_TUPLES = 10_000
# Tables shown by scheduler_table_dead_tuples, the ones with the most dead row versions.
DEAD_TUPLE_SERIES = 10
# /healthz warns that max_wal_size is small for the load once more of the server's checkpoints were requested (the WAL
# filled max_wal_size before checkpoint_timeout passed) than timed, counting from this many requested ones. Each
# checkpoint makes the next change of every page write the whole page to the WAL again, so checkpoints forced by
# volume feed themselves: more WAL, sooner the next one (docs/SCALING.md, "PostgreSQL for the steady day").
CHECKPOINT_WARNING_AFTER = 10
_DAY_SUFFIX = re.compile(r"_p\d{8}$")


def vacuum_threshold(live_rows: float, base: int = 0) -> float:
    """Dead rows past which the upkeep vacuums a table (the SQL passes the same scale); `base` raises the fixed
    part, as the health check does."""
    return max(settings.SCHEDULER_VACUUM_DEAD_TUPLES, base) + VACUUM_SCALE * live_rows


def table_label(relname: str) -> str:
    """A metric label for a table: day partitions share one (`dispatch_occurrence_pYYYYMMDD`), so stored series
    do not grow by one a day."""
    return _DAY_SUFFIX.sub("_pYYYYMMDD", relname)


class Upkeep:
    """The upkeep of one materializer process: which task is due when, and the streak of failures of each."""

    def __init__(self, tasks: tuple[str, ...] = SMALL_LANE, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.tasks = tasks
        self.clock = clock  # monotonic seconds: when each task is due again
        self._due = dict.fromkeys(tasks, 0.0)
        self._failing: dict[str, tuple[int, float]] = {}  # task -> (failed tries in a row, clock at the first)
        self._stopping = threading.Event()
        self._busy: Any = None  # the psycopg connection of a VACUUM in progress, for interrupt()

    def run_due(self, now: datetime) -> bool:
        """Run each task that is due, in order (partitions first: they are what the data plane needs); `now` is
        PostgreSQL's instant (its UTC date is "today"). True if any task was due."""
        ran = False
        work_of: dict[str, Callable[[datetime], bool]] = {
            PARTITIONS: self.make_partitions,
            RETENTION: self.enforce_retention,
            VACUUM: self.vacuum,
            VACUUM_LARGE: lambda now: self.vacuum(now, large=True),
        }
        for task in self.tasks:
            work = work_of[task]
            if self._stopping.is_set() or self.clock() < self._due[task]:
                continue
            ran = True
            done = False
            if self._try_lock(task):
                try:
                    done = work(now)
                finally:
                    self._unlock(task)
            # Not done: it gave up, or another materializer holds the task right now. Either way, soon again.
            wait = EVERY_SECONDS[task] if done else settings.SCHEDULER_UPKEEP_RETRY_SECONDS
            self._due[task] = self.clock() + wait
        return ran

    def seconds_until_due(self) -> float:
        return max(0.0, min(self._due.values()) - self.clock())

    def interrupt(self) -> None:
        """The process is stopping: start no further task and cancel a VACUUM in progress (it would otherwise
        run on in PostgreSQL after the process has gone)."""
        self._stopping.set()
        busy = self._busy
        if busy is not None:
            try:
                busy.cancel_safe(timeout=5)
            except Exception:
                logger.debug("cancelling the upkeep's VACUUM failed", exc_info=True)

    # --- the tasks ---------------------------------------------------------------------------------------------

    def make_partitions(self, now: datetime) -> bool:
        today = now.astimezone(UTC).date()
        report = ensure_partitions(
            connection, today - timedelta(days=1), today + timedelta(days=settings.SCHEDULER_PARTITION_DAYS_AHEAD)
        )
        counters.PARTITIONS_CREATED.inc(len(report.created))
        if report.failed:
            reasons = sorted(set(report.failed.values()))
            self._failed(PARTITIONS, f"day partitions not created ({', '.join(sorted(report.failed))}): {reasons[0]}")
            return False
        self._recovered(PARTITIONS, f"day partitions created: {', '.join(report.created) or 'none missing'}")
        return True

    def enforce_retention(self, now: datetime) -> bool:
        cutoff = now.astimezone(UTC).date() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS)
        report = prune_partitions(connection, cutoff)
        counters.PARTITIONS_DROPPED.inc(len(report.dropped))
        counters.PARTITIONS_KEPT.inc(len(report.kept))
        for name, states in report.kept.items():
            logger.warning(
                "kept partition %s past the retention (%d days): %s can still run; it is dropped once they finish",
                name,
                settings.SCHEDULER_RETENTION_DAYS,
                describe_states(states),
                extra={"action": "prune_kept"},
            )
        if report.dropped:
            logger.info("dropped %d partitions older than %s", len(report.dropped), cutoff, extra={"action": "prune"})
        if report.busy:
            names, why = ", ".join(sorted(report.busy)), sorted(report.busy.values())[0]
            self._failed(RETENTION, f"partitions past the retention not dropped ({names}): {why}")
            return False
        self._recovered(RETENTION, f"dropped {len(report.dropped)} partitions")
        return True

    def vacuum(self, now: datetime, *, large: bool = False) -> bool:
        """VACUUM (ANALYZE) each table of this lane (`large`: more than UNTHROTTLED_LIVE_ROWS live rows) past its
        threshold that autovacuum does not look after, and ANALYZE the ones whose rows changed enough since their
        statistics were taken."""
        task = VACUUM_LARGE if large else VACUUM
        with connection.cursor() as cursor:
            cursor.execute(
                maintenance_sql.VACUUM_CANDIDATES,
                {
                    "base": settings.SCHEDULER_VACUUM_DEAD_TUPLES,
                    "scale": VACUUM_SCALE,
                    "analyze_base": ANALYZE_BASE_ROWS,
                    "analyze_scale": ANALYZE_SCALE,
                },
            )
            candidates = [
                (quoted, relname, dead, live, needs_vacuum)
                for quoted, relname, dead, live, needs_vacuum in cursor.fetchall()
                if (live > UNTHROTTLED_LIVE_ROWS) == large  # this lane's tables only
            ]
        failures = []
        for quoted, relname, dead, _live, needs_vacuum in candidates:
            if self._stopping.is_set():
                break
            try:
                if not needs_vacuum:
                    self._analyze_one(quoted, relname)
                    continue
                self._vacuum_one(quoted, throttled=large)
            except DatabaseError as exc:
                if self._stopping.is_set():
                    break
                if sqlstate(exc) == LOCK_NOT_AVAILABLE:
                    failures.append(f"{relname}: a lock was busy for more than {lock_timeout_text()}")
                else:
                    failures.append(f"{relname}: {str(exc).strip()}")
                continue
            counters.UPKEEP_VACUUMS.labels(table_label(relname)).inc()
            logger.info(
                "vacuumed %s: %d dead row versions, autovacuum does not look after it",
                quoted,
                dead,
                extra={"action": "vacuum"},
            )
        if failures:
            self._failed(task, f"VACUUM failed for {'; '.join(failures)}")
            return False
        self._recovered(task, f"vacuumed {len(candidates)} tables")
        return True

    def _analyze_one(self, quoted: str, relname: str) -> None:
        """One ANALYZE (SKIP_LOCKED) under the lock timeout: statistics only, a sample of at most 30,000 rows."""
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.VACUUM_SETTINGS_NOW)
            _, _, timeout = cursor.fetchone()
            cursor.execute(maintenance_sql.SET_LOCK_TIMEOUT, [lock_timeout_text(), False])
            try:
                cursor.execute(maintenance_sql.ANALYZE_TABLE.format(table=quoted))
            finally:
                cursor.execute(maintenance_sql.SET_LOCK_TIMEOUT, [timeout, False])
        counters.UPKEEP_ANALYZES.labels(table_label(relname)).inc()

    def _vacuum_one(self, quoted: str, *, throttled: bool = True) -> None:
        """One VACUUM in autocommit (it cannot run in a transaction), throttled (a big table) and with the lock
        timeout, the session's own settings put back afterwards (once-mode runs the upkeep on the batches'
        connection)."""
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.VACUUM_SETTINGS_NOW)
            delay, limit, timeout = cursor.fetchone()
            delay_now = VACUUM_COST_DELAY if throttled else "0"
            cursor.execute(maintenance_sql.VACUUM_THROTTLE, [delay_now, VACUUM_COST_LIMIT])
            cursor.execute(maintenance_sql.SET_LOCK_TIMEOUT, [lock_timeout_text(), False])
            self._busy = connection.connection
            try:
                cursor.execute(maintenance_sql.VACUUM_TABLE.format(table=quoted))
            finally:
                self._busy = None
                cursor.execute(maintenance_sql.VACUUM_THROTTLE, [delay, limit])
                cursor.execute(maintenance_sql.SET_LOCK_TIMEOUT, [timeout, False])

    # --- one materializer per task, failures said once ---------------------------------------------------------

    @staticmethod
    def _try_lock(task: str) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.TRY_UPKEEP_LOCK, [f"dispatch_upkeep_{task}"])
            return bool(cursor.fetchone()[0])

    @staticmethod
    def _unlock(task: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.RELEASE_UPKEEP_LOCK, [f"dispatch_upkeep_{task}"])

    def _failed(self, task: str, what: str) -> None:
        counters.UPKEEP_FAILURES.labels(task).inc()
        tries, since = self._failing.get(task, (0, self.clock()))
        self._failing[task] = (tries + 1, since)
        if tries == 0:
            logger.warning(
                "upkeep (%s): %s; trying again every %.0f s (logged once until it succeeds)",
                task,
                what,
                settings.SCHEDULER_UPKEEP_RETRY_SECONDS,
                extra={"action": "upkeep_failed"},
            )

    def _recovered(self, task: str, what: str) -> None:
        tries, since = self._failing.pop(task, (0, 0.0))
        if tries:
            logger.warning(
                "upkeep (%s) recovered after %d failed tries (%.0f s): %s",
                task,
                tries,
                self.clock() - since,
                what,
                extra={"action": "upkeep_recovered"},
            )


def describe_states(states: dict[str, int]) -> str:
    """`{"scheduled": 24}` -> "24 fires (scheduled 24)"."""
    total = sum(states.values())
    return f"{total} fires ({', '.join(f'{state} {count}' for state, count in sorted(states.items()))})"


# --- what /metrics and /healthz say of it ------------------------------------------------------------------------


def upkeep_gauges(cursor) -> Iterator[Metric]:
    """Partitions ready ahead and kept past the retention, autovacuum, and the tables with most dead rows."""
    cursor.execute(maintenance_sql.UPKEEP_FACTS)
    today, autovacuum = cursor.fetchone()
    days_of = {table: existing_partition_days(connection, table) for table in PARTITIONED_TABLES}
    ready = set.intersection(*days_of.values())
    ahead = -1
    while today + timedelta(days=ahead + 1) in ready:
        ahead += 1
    yield GaugeMetricFamily(
        "scheduler_partitions_days_ahead",
        "Days after today (UTC, PostgreSQL's date) whose partitions exist, in a row; -1 when today's is missing.",
        ahead,
    )
    cutoff = today - timedelta(days=settings.SCHEDULER_RETENTION_DAYS)
    yield GaugeMetricFamily(
        "scheduler_partitions_past_retention",
        "Day partitions of occurrences older than SCHEDULER_RETENTION_DAYS still present (holding fires that can "
        "still run, or not dropped yet).",
        sum(1 for day in days_of[OCCURRENCES] if day < cutoff),
    )
    yield GaugeMetricFamily(
        "scheduler_autovacuum_enabled",
        "1 when autovacuum is on on the PostgreSQL server; when off, the materializers' upkeep vacuums busy tables.",
        int(autovacuum),
    )
    cursor.execute(maintenance_sql.DEAD_TUPLES, {"limit": DEAD_TUPLE_SERIES})
    dead = GaugeMetricFamily(
        "scheduler_table_dead_tuples", "Dead row versions of the tables that have the most.", labels=["table"]
    )
    for relname, dead_rows, _live, _looked_after in cursor.fetchall():
        dead.add_metric([relname], dead_rows)
    yield dead
    timed, requested, _ = checkpoint_counts(cursor)
    checkpoints = CounterMetricFamily(
        "scheduler_postgres_checkpoints",
        "The PostgreSQL server's checkpoints by cause: timed (checkpoint_timeout) or requested (mostly the WAL "
        "reaching max_wal_size). Requested ones at a steady rate mean max_wal_size is small for the load.",
        labels=["cause"],
    )
    checkpoints.add_metric(["timed"], timed)
    checkpoints.add_metric(["requested"], requested)
    yield checkpoints


def checkpoint_counts(cursor) -> tuple[int, int, str]:
    """(timed, requested, max_wal_size): the server's checkpoints since its statistics were last reset."""
    since_17 = cursor.connection.info.server_version >= 170000
    cursor.execute(maintenance_sql.CHECKPOINTS_SINCE_17 if since_17 else maintenance_sql.CHECKPOINTS)
    timed, requested, max_wal_size = cursor.fetchone()
    return int(timed), int(requested), max_wal_size


def checkpoint_warning(timed: int, requested: int, max_wal_size: str) -> str | None:
    """What /healthz says when the WAL, not the clock, decides most checkpoints; None when it does not."""
    if requested < CHECKPOINT_WARNING_AFTER or requested <= timed:
        return None
    return (
        f"{requested} of the PostgreSQL server's {timed + requested} checkpoints were forced by WAL volume before "
        f"checkpoint_timeout: max_wal_size ({max_wal_size}) is small for this write load, and every checkpoint "
        "writes whole pages to the WAL again; see docs/SCALING.md (the counts start at the last "
        "pg_stat_reset_shared of the checkpointer's statistics)"
    )


def database_health(cursor) -> tuple[str, list[str], list[str]]:
    """("on" | "off", warnings, reasons): whether the server runs autovacuum; warnings for what /healthz says of it
    when it does not and of a WAL budget the load outgrew; a reason to call the platform degraded when a table
    nothing vacuums is far past its threshold."""
    cursor.execute(maintenance_sql.UPKEEP_FACTS)
    _, autovacuum = cursor.fetchone()
    warnings = []
    if not autovacuum:
        warnings.append(
            "autovacuum is off on the PostgreSQL server: the materializers' upkeep vacuums the busy tables itself "
            f"(past {settings.SCHEDULER_VACUUM_DEAD_TUPLES} dead row versions plus a fifth of their live rows)"
        )
    checkpoints = checkpoint_warning(*checkpoint_counts(cursor))
    if checkpoints:
        warnings.append(checkpoints)
    cursor.execute(maintenance_sql.DEAD_TUPLES, {"limit": 2 * DEAD_TUPLE_SERIES})
    reasons = []
    for relname, dead_rows, live_rows, looked_after in cursor.fetchall():
        threshold = vacuum_threshold(live_rows, HEALTH_BASE_DEAD_TUPLES)
        if not looked_after and dead_rows > BEHIND_FACTOR * threshold:
            reasons.append(
                f"table {relname} has {dead_rows} dead row versions, over {BEHIND_FACTOR} times its vacuum threshold "
                f"({threshold:.0f}), and autovacuum is off for it: nothing vacuums it, or a long transaction keeps "
                "VACUUM from removing them"
            )
    return ("on" if autovacuum else "off"), warnings, reasons
