"""State changes of occurrences that the control plane triggers: invalidation, manual fires, in-flight reports."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from dispatch import sql
from dispatch.envelopes import Fire, write_envelopes
from dispatch.identity import manual_occurrence_id_for, occurrence_id_for
from dispatch.models import IN_FLIGHT_STATES, UNCLAIMED_STATES, Occurrence, OccurrenceState
from dispatch.queues import queue_for_lane
from schedules.errors import StateConflict
from schedules.models import Schedule, ScheduleState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InFlight:
    occurrence_id: uuid.UUID
    state: str


def enqueue_occurrence(occurrence: Occurrence, *, available_at: datetime) -> None:
    """Put one occurrence in the outbox (its own envelope), in the caller's transaction."""
    fire = Fire(
        occurrence_id=occurrence.occurrence_id,
        scheduled_for=occurrence.scheduled_for,
        tenant_id=occurrence.tenant_id,
        queue=queue_for_lane(occurrence.lane),
        available_at=available_at,
        priority=occurrence.priority,
    )
    with connection.cursor() as cursor:
        write_envelopes(cursor, [fire])


def invalidate_unclaimed_occurrences(
    schedule_id: uuid.UUID, below_version: int, now: datetime, *, include_forced: bool = True
) -> int:
    """Cancel occurrences of older versions that no worker has claimed yet (ARCHITECTURE rule 9).

    One conditional UPDATE: a worker's claim (`WHERE state = 'enqueued'`) and this statement serialise on the
    row lock, so an occurrence ends either claimed (and reported in flight) or canceled, never both.
    """
    withdrawn = Occurrence.objects.filter(
        schedule_id=schedule_id, schedule_version__lt=below_version, state__in=UNCLAIMED_STATES
    )
    if not include_forced:
        withdrawn = withdrawn.exclude(forced=True)
    canceled = withdrawn.update(state=OccurrenceState.CANCELED, finished_at=now)
    if canceled:
        with connection.cursor() as cursor:
            cursor.execute(sql.BUMP_INVALIDATION)
        logger.info(
            "canceled %d unclaimed occurrences of schedule %s below version %d",
            canceled,
            schedule_id,
            below_version,
            extra={"action": "invalidate_occurrences"},
        )
    return canceled


# Bound on the owed fires recorded in one API call; a schedule further behind is left to the reconciler.
MAX_OWED_FIRES = 10_000


def record_owed_fires_as_missed(schedule, *, until: datetime) -> int:
    """Record the current version's unmaterialized fires from its cursor up to `until` as missed rows."""
    fires = []
    cursor = schedule.next_run_at
    rule = schedule.time_rule
    while cursor is not None and cursor <= until and len(fires) < MAX_OWED_FIRES:
        fires.append(cursor)
        cursor = rule.next_after(cursor) if schedule.kind == "cron" else None
    rows = [
        Occurrence(
            occurrence_id=occurrence_id_for(schedule.id, schedule.version, fire),
            schedule_id=schedule.id,
            tenant_id=schedule.tenant_id,
            schedule_version=schedule.version,
            scheduled_for=fire,
            available_at=fire,
            lane=schedule.lane,
            priority=schedule.priority,
            state=OccurrenceState.MISSED,
            finished_at=until,
        )
        for fire in fires
    ]
    Occurrence.objects.bulk_create(rows, ignore_conflicts=True)
    if rows:
        logger.warning(
            "schedule %s changed with %d fires not yet materialized; recorded as missed",
            schedule.id,
            len(rows),
            extra={"action": "owed_fires_missed"},
        )
    return len(rows)


def in_flight_occurrences(schedule_id: uuid.UUID) -> list[InFlight]:
    """What a worker has already claimed and may still run; a cancel cannot withdraw it."""
    rows = Occurrence.objects.filter(schedule_id=schedule_id, state__in=IN_FLIGHT_STATES).values_list(
        "occurrence_id", "state"
    )
    return [InFlight(occurrence_id=oid, state=state) for oid, state in rows]


def trigger_manual_occurrence(schedule, *, now: datetime, trigger_key: str | None = None) -> uuid.UUID:
    """A fire now, outside the cron rhythm. With a caller key the same key always yields the same occurrence."""
    key = trigger_key if trigger_key else now.isoformat()
    occurrence_id = manual_occurrence_id_for(schedule.id, schedule.version, key)
    with transaction.atomic():
        occurrence, created = Occurrence.objects.get_or_create(
            occurrence_id=occurrence_id,
            defaults={
                "schedule_id": schedule.id,
                "tenant_id": schedule.tenant_id,
                "schedule_version": schedule.version,
                "scheduled_for": now,
                "available_at": now,
                "lane": schedule.lane,
                "priority": schedule.priority,
                "manual": True,
            },
        )
        if created:
            enqueue_occurrence(occurrence, available_at=now)
    logger.info(
        "manual trigger of schedule %s -> occurrence %s (new=%s)",
        schedule.id,
        occurrence_id,
        created,
        extra={"action": "trigger"},
    )
    return occurrence_id


def replay_dead_occurrence(occurrence_id: uuid.UUID, *, now: datetime) -> None:
    """Re-enqueue a dead occurrence under its own id (the DLQ replay); any other state is a conflict."""
    with transaction.atomic():
        occurrence = Occurrence.objects.select_for_update().filter(occurrence_id=occurrence_id).first()
        if occurrence is None or occurrence.state != OccurrenceState.DEAD:
            state = occurrence.state if occurrence else "unknown"
            raise StateConflict(f"Only a dead occurrence can be replayed; this one is {state}.")
        if Schedule.objects.filter(pk=occurrence.schedule_id, state=ScheduleState.CANCELED).exists():
            raise StateConflict("The schedule of this occurrence is canceled; it would not run.")
        Occurrence.objects.filter(occurrence_id=occurrence_id, state=OccurrenceState.DEAD).update(
            state=OccurrenceState.SCHEDULED, available_at=now, finished_at=None, forced=True
        )
        enqueue_occurrence(occurrence, available_at=now)
    logger.info("replayed dead occurrence %s", occurrence_id, extra={"action": "replay"})
