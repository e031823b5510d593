"""Stuck occurrences: non-terminal long after their time. The one definition that reconcile reports and
`replay --stuck` re-drives (docs/ARCHITECTURE.md rule 12).

An occurrence is stuck when it is still `scheduled` or `enqueued` S seconds after its release instant (the relay or
the broker lost it, or nobody consumes its queue), `running` with a lease that expired S seconds ago (its worker died
and nothing reaped it), or `retry_wait` S seconds past its retry time (its retry message is gone).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from dispatch.sql import maintenance as maintenance_sql

# What `reconcile --stuck-after` and `replay --stuck --older-than` use when not told (docs/API.md, "Commands"): long
# enough that a burst, a retry backoff or a relay restart is not reported, short enough to be caught within the hour.
DEFAULT_STUCK_AFTER_SECONDS = 900
# Rows read per query; the scan walks the window in (scheduled_for, occurrence_id) order.
STUCK_PAGE = 1000
_BEFORE_EVERYTHING = (datetime(1, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


@dataclass(frozen=True)
class StuckOccurrence:
    occurrence_id: uuid.UUID
    scheduled_for: datetime
    state: str
    tenant_id: int
    schedule_id: uuid.UUID
    lane: str
    priority: int
    stuck_for_seconds: float  # since its release instant (for a running one: since its lease expired)

    def as_dict(self) -> dict[str, Any]:
        return {
            "occurrence_id": str(self.occurrence_id),
            "schedule_id": str(self.schedule_id),
            "scheduled_for": self.scheduled_for.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "state": self.state,
            "age_seconds": round(self.stuck_for_seconds, 1),
        }


def stuck_pages(
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    stuck_after_seconds: float = DEFAULT_STUCK_AFTER_SECONDS,
    tenant_id: int | None = None,
    tenant_ids: list[int] | None = None,
    page: int = STUCK_PAGE,
) -> Iterator[list[StuckOccurrence]]:
    """Pages of the occurrences scheduled in [since, until) that are stuck at `now`, oldest fire first; of one
    tenant, or of the tenants listed (a console operator's scope), when given."""
    cutoff = now - timedelta(seconds=stuck_after_seconds)
    until = min(until, cutoff)
    after_for, after_id = _BEFORE_EVERYTHING
    while since < until:
        with connection.cursor() as cursor:
            cursor.execute(
                maintenance_sql.FIND_STUCK,
                {
                    "now": now,
                    "since": since,
                    "until": until,
                    "cutoff": cutoff,
                    "tenant_id": tenant_id,
                    "tenant_ids": tenant_ids,
                    "after_for": after_for,
                    "after_id": after_id,
                    "limit": page,
                },
            )
            rows = [
                StuckOccurrence(occurrence_id, scheduled_for, state, tenant, schedule_id, lane, priority, float(age))
                for occurrence_id, scheduled_for, state, tenant, schedule_id, lane, priority, age in cursor.fetchall()
            ]
        if not rows:
            return
        yield rows
        after_for, after_id = rows[-1].scheduled_for, rows[-1].occurrence_id
