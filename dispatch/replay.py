"""Replay from the DLQ: dead occurrences go back to the queue under their own ids, one batch per transaction."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from dispatch import services
from dispatch.envelopes import Fire, write_envelopes
from dispatch.models import Occurrence, OccurrenceState
from dispatch.queues import queue_for_lane
from schedules.clock import db_now
from schedules.errors import StateConflict
from schedules.models import Schedule, ScheduleState

logger = logging.getLogger(__name__)

# Dead occurrences replayed per transaction: row locks and the outbox insert stay short.
REPLAY_BATCH = 1000

# The same transition as services.replay_dead_occurrence, for a batch: dead -> scheduled, forced, available now.
# SKIP LOCKED: a row another replay (or the API) holds is left to it. Occurrences of a canceled schedule stay dead
# (workers would drop them), and are counted separately. `o.state = 'dead'` is re-checked in the UPDATE so a row
# that changed since the subquery read it is not touched (ARCHITECTURE: every transition is conditional).
REPLAY_DEAD_BATCH = """
WITH picked AS (
    SELECT o.occurrence_id, o.scheduled_for
    FROM dispatch_occurrence AS o
    JOIN schedules_schedule AS s ON s.id = o.schedule_id
    WHERE o.state = 'dead' AND s.state <> 'canceled'
      AND (%(tenant_id)s::bigint IS NULL OR o.tenant_id = %(tenant_id)s::bigint)
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE dispatch_occurrence AS o
SET state = 'scheduled', available_at = %(now)s, finished_at = NULL, forced = true
FROM picked
WHERE o.occurrence_id = picked.occurrence_id AND o.scheduled_for = picked.scheduled_for AND o.state = 'dead'
RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority
"""

COUNT_DEAD_OF_CANCELED = """
SELECT count(*)
FROM dispatch_occurrence AS o
JOIN schedules_schedule AS s ON s.id = o.schedule_id
WHERE o.state = 'dead' AND s.state = 'canceled'
  AND (%(tenant_id)s::bigint IS NULL OR o.tenant_id = %(tenant_id)s::bigint)
"""


class ReplayRefused(Exception):
    """The replay was not done; the message says why."""


@dataclass(frozen=True)
class ReplayResult:
    replayed: int
    left_canceled: int  # dead occurrences of canceled schedules: not replayed, they would not run


def replay_dead(
    *, tenant_id: int | None = None, now: datetime | None = None, batch: int = REPLAY_BATCH
) -> ReplayResult:
    """Re-enqueue every dead occurrence (of one tenant), same ids, in batches; returns the counts."""
    now = now or db_now()
    replayed = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(REPLAY_DEAD_BATCH, {"tenant_id": tenant_id, "now": now, "limit": batch})
            rows = cursor.fetchall()
            if not rows:
                break
            write_envelopes(
                cursor,
                [
                    Fire(
                        occurrence_id=occurrence_id,
                        scheduled_for=scheduled_for,
                        tenant_id=row_tenant,
                        queue=queue_for_lane(lane),
                        available_at=now,
                        priority=priority,
                    )
                    for occurrence_id, scheduled_for, row_tenant, lane, priority in rows
                ],
            )
        replayed += len(rows)
        logger.info("replayed %d dead occurrences", len(rows), extra={"action": "replay_batch"})
    with connection.cursor() as cursor:
        cursor.execute(COUNT_DEAD_OF_CANCELED, {"tenant_id": tenant_id})
        left_canceled = cursor.fetchone()[0]
    if left_canceled:
        logger.info(
            "left %d dead occurrences of canceled schedules", left_canceled, extra={"action": "replay_skip_canceled"}
        )
    return ReplayResult(replayed=replayed, left_canceled=left_canceled)


def replay_one(occurrence_id: uuid.UUID, *, now: datetime | None = None) -> Occurrence:
    """Re-enqueue one dead occurrence; ReplayRefused names the reason when it is unknown, not dead or canceled."""
    occurrence = Occurrence.objects.filter(occurrence_id=occurrence_id).first()
    if occurrence is None:
        raise ReplayRefused(f"No occurrence with id {occurrence_id}.")
    if occurrence.state != OccurrenceState.DEAD:
        raise ReplayRefused(
            f"Occurrence {occurrence_id} is {occurrence.state}; only a dead occurrence can be replayed."
        )
    if Schedule.objects.filter(pk=occurrence.schedule_id, state=ScheduleState.CANCELED).exists():
        raise ReplayRefused(
            f"The schedule {occurrence.schedule_id} of occurrence {occurrence_id} is canceled; a replay would not run."
        )
    try:
        # The service re-checks both conditions under the row lock: the checks above only make the message precise.
        services.replay_dead_occurrence(occurrence_id, now=now or db_now())
    except StateConflict as exc:
        raise ReplayRefused(f"Occurrence {occurrence_id}: {exc}") from None
    return Occurrence.objects.get(occurrence_id=occurrence_id, scheduled_for=occurrence.scheduled_for)
