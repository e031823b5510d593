"""Planned fires written as occurrence rows and their envelopes: the one path by which fires become occurrences.

The materializer writes its batches through it, and so does a schedule change that finds fires the materializer
still owed (dispatch/occurrences.py materialize_owed_fires), so both write the same rows in the same way. Backfill
and manual triggers create fires outside any plan and write their own.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.db import IntegrityError, transaction

from dispatch.outbox import Fire, enqueue
from dispatch.planning import MISSED, Plan
from dispatch.queues import queue_for_lane
from dispatch.sql import PreparedCursor
from dispatch.sql import materialize as materialize_sql

logger = logging.getLogger(__name__)


def write_occurrences(
    cursor: PreparedCursor, plans: list[Plan], now: datetime, *, kept: bool = False
) -> set[uuid.UUID] | None:
    """Write the plans' occurrences; returns the ids that are new (only those get an envelope), or None when
    every planned one is.

    COPY first, under a savepoint: in the materializer's ordinary batch every fire is new. If one already has its
    row (a backfill ahead of the cursor, a replayed batch), the batch is written again with ON CONFLICT DO NOTHING.
    `kept` marks the rows as fires a schedule change must not withdraw (a change's owed fires, due before it):
    those go straight to the INSERT, which carries the flag; the hot COPY does not.
    """
    rows = [
        (
            occurrence.occurrence_id,
            plan.schedule.id,
            plan.schedule.tenant_id,
            plan.schedule.version,
            occurrence.scheduled_for,
            occurrence.available_at,
            plan.schedule.lane,
            plan.schedule.priority,
            occurrence.state,
            occurrence.reason,
            now if occurrence.state == MISSED else None,
        )
        for plan in plans
        for occurrence in plan.occurrences
    ]
    if not rows:
        return None
    if not kept:
        try:
            with transaction.atomic():
                cursor.copy_rows(materialize_sql.COPY_OCCURRENCES, materialize_sql.COPY_OCCURRENCE_TYPES, rows)
            return None
        except IntegrityError:
            logger.info("a fire of this batch already has its row: writing it again past the existing rows")
    columns = list(zip(*rows, strict=True))
    cursor.execute(
        materialize_sql.INSERT_OCCURRENCES,
        {
            "occurrence_ids": list(columns[0]),
            "schedule_ids": list(columns[1]),
            "tenant_ids": list(columns[2]),
            "versions": list(columns[3]),
            "scheduled_fors": list(columns[4]),
            "available_ats": list(columns[5]),
            "lanes": list(columns[6]),
            "priorities": list(columns[7]),
            "states": list(columns[8]),
            "state_reasons": list(columns[9]),
            "kept": kept,
            "now": now,
        },
    )
    return {row[0] for row in cursor.fetchall()}


def write_envelopes(cursor: PreparedCursor, plans: list[Plan], new_ids: set[uuid.UUID] | None) -> int:
    """Envelopes for the new fires to deliver (`new_ids` None: every planned fire is new)."""
    fires = []
    for plan in plans:
        schedule = plan.schedule
        # Fire.for_lane, with the lane's queue looked up once per schedule instead of once per fire.
        queue = queue_for_lane(schedule.lane)
        for o in plan.to_enqueue:
            if new_ids is None or o.occurrence_id in new_ids:
                fires.append(
                    Fire(
                        o.occurrence_id,
                        o.scheduled_for,
                        schedule.tenant_id,
                        queue,
                        o.available_at,
                        schedule.priority,
                    )
                )
    return enqueue(cursor, fires)
