"""The materializers' upkeep: day partitions a week ahead, and retention, without ever stalling due work.

It runs on a thread of its own in every materializer (`Materializer.keep_up`), on a connection of its own, in
autocommit: never inside a batch transaction, and never on the thread that renews the shard leases, so a read of an
old partition holds up neither. Every lock it takes waits at most SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS; a task that
gave up is tried again after SCHEDULER_UPKEEP_RETRY_SECONDS, and said once per streak of failures in the log, every
time in `scheduler_upkeep_failures_total` (docs/DESIGN.md, "Upkeep").

1. **Partitions**: every day from yesterday to SCHEDULER_PARTITION_DAYS_AHEAD after today (PostgreSQL's date).
2. **Retention**: at most once an hour, the days older than SCHEDULER_RETENTION_DAYS whose fires have all finished
   are dropped (dispatch/partitions.py); a day holding one that can still run is kept and said so.
Each task runs in one materializer at a time (an advisory lock, tried, never waited for).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from prometheus_client.core import GaugeMetricFamily, Metric

from dispatch import counters
from dispatch.engine.loop import monotonic
from dispatch.partitions import (
    OCCURRENCES,
    PARTITIONED_TABLES,
    ensure_partitions,
    existing_partition_days,
    prune_partitions,
)
from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

PARTITIONS, RETENTION = "partitions", "retention"
# How often each task looks again after a pass that succeeded. Partitions: a new day is wanted once a day and is made
# a week early, so ten minutes is plenty. Retention: at most once an hour (each pass reads every day past it).
EVERY_SECONDS = {PARTITIONS: 600.0, RETENTION: 3600.0}


class Upkeep:
    """The upkeep of one materializer process: which task is due when, and the streak of failures of each."""

    def __init__(self, *, clock: Callable[[], float] = monotonic) -> None:
        self.clock = clock  # monotonic seconds: when each task is due again
        self._due = dict.fromkeys(EVERY_SECONDS, 0.0)
        self._failing: dict[str, tuple[int, float]] = {}  # task -> (failed tries in a row, clock at the first)
        self._stopping = threading.Event()

    def run_due(self, now: datetime) -> bool:
        """Run each task that is due, in order (partitions first: they are what the data plane needs); `now` is
        PostgreSQL's instant (its UTC date is "today"). True if any task was due."""
        ran = False
        tasks: dict[str, Callable[[datetime], bool]] = {
            PARTITIONS: self.make_partitions,
            RETENTION: self.enforce_retention,
        }
        for task, work in tasks.items():
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
        """The process is stopping: start no further task."""
        self._stopping.set()

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


# --- what /metrics says of it ------------------------------------------------------------------------------------


def upkeep_gauges(cursor) -> Iterator[Metric]:
    """Partitions ready ahead and kept past the retention."""
    cursor.execute(maintenance_sql.UPKEEP_FACTS)
    (today,) = cursor.fetchone()
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
