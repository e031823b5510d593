"""Backfill: create the missing fires of a past range with their usual ids, exactly as the reconciler expects."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connection, transaction

from core.choices import ScheduleState
from core.clock import db_now
from core.cron_syntax import TimeRuleError
from dispatch.errors import BackfillRefused
from dispatch.history import ExpectedFire, expected_fires, version_spans
from dispatch.occurrences import schedule_state
from dispatch.outbox import Fire, enqueue
from dispatch.partitions import ensure_partitions
from dispatch.quotas import pace_catch_up
from dispatch.sql import control_plane as control_plane_sql
from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

# One operator command must not become the next outage (replaying every fire missed in a long outage at once would
# flood the queues with stale work and cause a second one): above this many fires the operator splits the range and
# watches the queues.
MAX_BACKFILL_FIRES = 100_000
# Occurrences (and their envelopes) written per transaction: short transactions, bounded memory.
BACKFILL_CHUNK = 1000


@dataclass(frozen=True)
class BackfillResult:
    schedule_id: uuid.UUID
    since: datetime
    until: datetime
    expected: int
    created: int

    @property
    def already_present(self) -> int:
        return self.expected - self.created


def parse_schedule_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise BackfillRefused(f"{text!r} is not a schedule id (a UUID such as 1b4e28ba-2fa1-...).") from None


def backfill_schedule(
    schedule_id: uuid.UUID,
    *,
    since: datetime,
    until: datetime,
    now: datetime | None = None,
    max_fires: int | None = None,
) -> BackfillResult:
    """Create the missing fires of one schedule in [since, until) under the version valid at each fire.

    1. Refuse what would surprise: a future range, an unknown or canceled schedule, more than `max_fires` fires.
    2. Insert chunk by chunk, one transaction each, after ensuring the day partitions the chunk writes into (old
       days must not pile up in DEFAULT, where pruning is a DELETE).
    3. New rows are scheduled, forced and available now, each with an outbox envelope; existing rows are untouched,
       so running it twice creates nothing the second time.
    """
    if since >= until:
        raise BackfillRefused(f"since ({since.isoformat()}) must be before until ({until.isoformat()}).")
    now = now or db_now()
    if until > now:
        raise BackfillRefused(
            f"until ({until.isoformat()}) is later than now ({now.isoformat()}): backfill only creates past fires; "
            "future ones are the materializer's."
        )
    state = schedule_state(schedule_id)
    if state is None:
        raise BackfillRefused(f"No schedule with id {schedule_id}.")
    if state == ScheduleState.CANCELED:
        raise BackfillRefused(
            f"Schedule {schedule_id} is canceled: workers drop the occurrences of a canceled schedule, so a backfill "
            "would create rows that never run."
        )

    expected = _count_or_refuse(schedule_id, since, until, max_fires or MAX_BACKFILL_FIRES)
    created = 0
    fires = _fires(schedule_id, since, until)
    while chunk := list(itertools.islice(fires, BACKFILL_CHUNK)):
        _ensure_day_partitions(chunk)
        created += _write_chunk(chunk, now)
    logger.info(
        "backfilled schedule %s %s..%s: expected %d, created %d",
        schedule_id,
        since.isoformat(),
        until.isoformat(),
        expected,
        created,
        extra={"action": "backfill"},
    )
    return BackfillResult(schedule_id=schedule_id, since=since, until=until, expected=expected, created=created)


def _fires(schedule_id: uuid.UUID, since: datetime, until: datetime) -> Iterator[ExpectedFire]:
    for span in version_spans([schedule_id], since, until):
        try:
            yield from expected_fires(span, since, until)
        except (TimeRuleError, ValueError) as exc:
            # Counting walks every version before anything is written, so this refuses before any insert.
            raise BackfillRefused(f"Version {span.version} of schedule {schedule_id} cannot be read: {exc}.") from None


def _count_or_refuse(schedule_id: uuid.UUID, since: datetime, until: datetime, max_fires: int) -> int:
    """Count the fires, stopping one past the cap; over it, estimate the total and suggest where to cut."""
    count = 0
    for fire in _fires(schedule_id, since, until):
        count += 1
        if count > max_fires:
            # Versions follow each other in time, so fires come out in time order: everything before this fire
            # fits under the cap, and the share of the range covered so far extrapolates the total.
            covered = (fire.scheduled_for - since) / (until - since) if until > since else 1.0
            estimate = int(count / covered) if covered > 0 else count
            raise BackfillRefused(
                f"The range holds more than {max_fires:,} fires (about {estimate:,} at this rhythm); the cap is "
                f"{max_fires:,} per run. Use a smaller range, e.g. --until {fire.scheduled_for.isoformat()} (the first "
                f"{max_fires:,} fires), then continue from there."
            )
    return count


def _ensure_day_partitions(chunk: list[ExpectedFire]) -> None:
    """Create the day partitions this chunk writes into, in runs of consecutive days.

    Only days that hold fires: a daily rhythm over years must not create a partition per empty day. Done before the
    insert, outside its transaction: partition DDL locks the parent table, so each day commits on its own.
    """
    days = sorted({fire.scheduled_for.astimezone(UTC).date() for fire in chunk})
    runs: list[list[date]] = []
    for day in days:
        if runs and day - runs[-1][-1] == timedelta(days=1):
            runs[-1].append(day)
        else:
            runs.append([day])
    for run in runs:
        ensure_partitions(connection, run[0], run[-1])


def _write_chunk(chunk: list[ExpectedFire], now: datetime) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            maintenance_sql.INSERT_BACKFILL,
            {
                "now": now,
                "occurrence_ids": [f.occurrence_id for f in chunk],
                "schedule_ids": [f.schedule_id for f in chunk],
                "tenant_ids": [f.tenant_id for f in chunk],
                "versions": [f.version for f in chunk],
                "scheduled_fors": [f.scheduled_for for f in chunk],
                "lanes": [f.lane for f in chunk],
                "priorities": [f.priority for f in chunk],
            },
        )
        new_ids = {row[0] for row in cursor.fetchall()}
        # Released from now on, paced on the tenant's catch-up budget like any catch-up (only the new rows take
        # it); the lane's queue keeps strict and flexible work apart.
        fresh = [f for f in chunk if f.occurrence_id in new_ids]
        cursor.execute(control_plane_sql.TENANT_CATCHUP_RATES, {"tenant_ids": list({f.tenant_id for f in fresh})})
        rates = dict(cursor.fetchall())
        times = pace_catch_up(cursor, [(f.tenant_id, rates.get(f.tenant_id, 0)) for f in fresh], now=now)
        later = [(f, at) for f, at in zip(fresh, times, strict=True) if at > now]
        if later:
            cursor.execute(
                maintenance_sql.DELAY_BACKFILLED,
                {
                    "occurrence_ids": [f.occurrence_id for f, _ in later],
                    "scheduled_fors": [f.scheduled_for for f, _ in later],
                    "available_ats": [at for _, at in later],
                },
            )
        enqueue(cursor, [Fire.of(f, available_at=at) for f, at in zip(fresh, times, strict=True)])
    return len(new_ids)


def describe(result: BackfillResult) -> str:
    return (
        f"Backfill of schedule {result.schedule_id} for {result.since.isoformat()} .. {result.until.isoformat()}: "
        f"expected {result.expected}, created {result.created}, already present {result.already_present}."
    )
