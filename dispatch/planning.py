"""Pure rules of materialization: which fires of a due schedule become occurrences now, in which state and at
what instant, and where its cursor moves. No database here; `now` is always passed in (PostgreSQL's clock)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dispatch.identity import occurrence_id_for
from dispatch.models import OccurrenceState
from schedules.timerules import TimeRule


def flexible_offset(occurrence_id: uuid.UUID, window_seconds: int) -> timedelta:
    """Deterministic jitter inside the flexible window: the same occurrence gets the same instant after every
    failover or replay, while correlated fires spread out. Millisecond resolution."""
    window_ms = max(1, window_seconds * 1000)
    return timedelta(milliseconds=occurrence_id.int % window_ms)


def spread(count: int, per_minute: int) -> list[timedelta]:
    """Offsets that pace `count` catch-up fires at `per_minute` (the tenant's catch-up quota)."""
    interval = 60.0 / max(1, per_minute)
    return [timedelta(seconds=math.floor(i * interval * 1000) / 1000) for i in range(count)]


# Upper bound of fires planned for one schedule in one batch: a schedule far behind (after an outage) is
# walked forward in chunks across batches instead of stalling one transaction.
MAX_FIRES_PER_SCHEDULE = 500


@dataclass(frozen=True)
class DueSchedule:
    """The columns of a due schedule row that planning needs."""

    id: uuid.UUID
    tenant_id: int
    kind: str
    cron: str | None
    run_at: datetime | None
    timezone: str
    version: int
    next_run_at: datetime
    lane: str
    flexible_window_seconds: int
    priority: int
    misfire_policy: str
    max_lateness_seconds: int
    catchup_limit: int
    catchup_per_minute: int

    @property
    def rule(self) -> TimeRule:
        return TimeRule(kind=self.kind, timezone=self.timezone, cron=self.cron, run_at=self.run_at)


@dataclass(frozen=True)
class PlannedOccurrence:
    occurrence_id: uuid.UUID
    scheduled_for: datetime
    available_at: datetime
    state: str  # scheduled (goes to the queue) or missed (recorded, never enqueued)


@dataclass
class Plan:
    schedule: DueSchedule
    occurrences: list[PlannedOccurrence] = field(default_factory=list)
    new_cursor: datetime | None = None
    completed: bool = False

    @property
    def to_enqueue(self) -> list[PlannedOccurrence]:
        return [o for o in self.occurrences if o.state == OccurrenceState.SCHEDULED]


def plan_schedule(schedule: DueSchedule, *, now: datetime, horizon: timedelta) -> Plan:
    """Plan the fires of `schedule` from its durable cursor up to now + horizon (ARCHITECTURE rules 2, 7, 10).

    1. Walk fires from the cursor (never from "now": an outage must not silently drop fires) up to the horizon,
       at most MAX_FIRES_PER_SCHEDULE of them.
    2. Fires later than max_lateness are misfires; the policy decides: skip → all missed; fire_once → only the
       latest one is emitted; catch_up → the latest `catchup_limit` are emitted, paced by the tenant quota.
       When the walk was cut short and is still in the past, every fire of this chunk is missed for fire_once and
       catch_up: the emitted ones must be the latest, and those lie in a later chunk.
    3. Emitted fires get available_at = scheduled_for (strict) or + deterministic jitter (flexible); emitted
       misfires are released from now on.
    """
    rule = schedule.rule
    horizon_end = now + horizon
    fires: list[datetime] = []
    cursor: datetime | None = schedule.next_run_at
    while cursor is not None and cursor <= horizon_end and len(fires) < MAX_FIRES_PER_SCHEDULE:
        fires.append(cursor)
        cursor = rule.next_after(cursor) if schedule.kind == "cron" else None

    lateness_limit = now - timedelta(seconds=schedule.max_lateness_seconds)
    late = [fire for fire in fires if fire < lateness_limit]
    truncated_in_past = cursor is not None and cursor < lateness_limit
    emitted_late: list[datetime] = []
    if late and not truncated_in_past:
        if schedule.misfire_policy == "fire_once":
            emitted_late = late[-1:]
        elif schedule.misfire_policy == "catch_up" and schedule.catchup_limit > 0:
            emitted_late = late[-schedule.catchup_limit :]
    late_release = dict(zip(emitted_late, spread(len(emitted_late), schedule.catchup_per_minute), strict=True))

    plan = Plan(schedule=schedule, new_cursor=cursor, completed=cursor is None)
    for fire in fires:
        occurrence_id = occurrence_id_for(schedule.id, schedule.version, fire)
        if fire in late_release:
            plan.occurrences.append(
                PlannedOccurrence(occurrence_id, fire, now + late_release[fire], OccurrenceState.SCHEDULED)
            )
        elif fire < lateness_limit:
            plan.occurrences.append(PlannedOccurrence(occurrence_id, fire, fire, OccurrenceState.MISSED))
        else:
            available_at = fire
            if schedule.lane == "flexible":
                available_at = fire + flexible_offset(occurrence_id, schedule.flexible_window_seconds)
            plan.occurrences.append(PlannedOccurrence(occurrence_id, fire, available_at, OccurrenceState.SCHEDULED))
    return plan
