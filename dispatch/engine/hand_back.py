"""Handing back work a worker took but will not start now: an envelope whose turn on the worker ended before some of
its occurrences started, or whose tenant cannot start anything here (dispatch/engine/envelope_runner.py).

Nothing handed back ran under the claim that took it, so nothing of it is kept: the attempt goes, the generation the
next claim takes is the same, and the occurrence waits in retry_wait for an envelope of its own, under its own id.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from dispatch import counters
from dispatch.engine.claims import EARLY_TOLERANCE, Claim
from dispatch.models import OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.quotas import release_running_slots
from dispatch.sql import claims as claim_sql

logger = logging.getLogger(__name__)


def hand_back(
    claims: list[Claim],
    unclaimed: list[tuple[uuid.UUID, datetime]],
    *,
    reason: str,
    delay: float = 0.0,
    now: datetime | None = None,
) -> int:
    """Give back what this worker took but will not start now, in one transaction; returns how many went back.

    Claims whose handlers never started return to retry_wait as they were before the claim (attempt deleted, the
    generation the next claim takes unchanged) and give back their running slots; deliveries of the envelope this
    worker never claimed (left to `try_claim`) go to retry_wait as they are. Each gets an envelope `delay` seconds
    on (0: due at once, so it queues behind what other tenants have waiting), under its own id.
    """
    if not claims and not unclaimed:
        return 0
    params: dict[str, Any] = {"reason": reason[:500], "delay": delay, "now": now}
    rows: list[tuple[Any, ...]] = []
    with transaction.atomic(), connection.cursor() as cursor:
        if claims:
            cursor.execute(
                claim_sql.HAND_BACK_CLAIMS,
                {
                    **params,
                    "occurrence_ids": [c.occurrence_id for c in claims],
                    "scheduled_fors": [c.scheduled_for for c in claims],
                    "generations": [c.generation for c in claims],
                    "held_states": [OccurrenceState.RUNNING.value] * len(claims),
                },
            )
            rows += cursor.fetchall()
        released = [row[2] for row in rows]
        if unclaimed:
            cursor.execute(
                claim_sql.HAND_BACK_UNCLAIMED,
                {
                    **params,
                    "occurrence_ids": [pair[0] for pair in unclaimed],
                    "scheduled_fors": [pair[1] for pair in unclaimed],
                    "early_tolerance": EARLY_TOLERANCE.total_seconds(),
                },
            )
            rows += cursor.fetchall()
        enqueue(
            cursor,
            [
                Fire.for_lane(occurrence_id, scheduled_for, tenant_id=tenant_id, lane=lane, available_at=at, priority=p)
                for occurrence_id, scheduled_for, tenant_id, lane, p, at in rows
            ],
        )
        # Last statement: the handed-back claims' running slots go back (see dispatch/sql/quotas.py).
        release_running_slots(cursor, released)
    if rows:
        counters.WORKER_CLAIM_DROPS.labels("handed_back").inc(len(rows))
        logger.info(
            "handed back %d occurrences (%d claimed, unstarted): %s",
            len(rows),
            len(released),
            reason,
            extra={"action": "hand_back", "reason": "handed_back"},
        )
    return len(rows)
