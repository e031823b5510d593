"""Pure rules of materialization: which fires of a due schedule become occurrences now, in which state and at
what instant, and where its cursor moves. No database here; `now` is always passed in (PostgreSQL's clock)."""

from __future__ import annotations

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


# Upper bound of fires planned for one schedule in one batch: a schedule far behind (after an outage) is
# walked forward in chunks across batches instead of stalling one transaction. A catch-up that keeps more late
# fires than this gets a larger chunk (see fire_cap).
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
    reason: str = ""  # why a fire is missed, in words an operator can act on (Occurrence.state_reason)
    # A late fire the misfire policy keeps: its available_at is `now` here, and the writer paces it on the tenant's
    # catch-up budget (dispatch/quotas.py pace_catch_up) before it is stored.
    catch_up: bool = False


@dataclass
class Plan:
    schedule: DueSchedule
    occurrences: list[PlannedOccurrence] = field(default_factory=list)
    new_cursor: datetime | None = None
    completed: bool = False

    @property
    def to_enqueue(self) -> list[PlannedOccurrence]:
        return [o for o in self.occurrences if o.state == OccurrenceState.SCHEDULED]


def kept_late_fires(schedule: DueSchedule) -> int:
    """How many of the latest late fires the misfire policy emits: none (skip), one (fire_once) or K (catch_up)."""
    if schedule.misfire_policy == "fire_once":
        return 1
    if schedule.misfire_policy == "catch_up":
        return schedule.catchup_limit
    return 0


def fire_cap(schedule: DueSchedule) -> int:
    """The most fires one batch plans for `schedule`. A chunk holds the K kept late fires and one more, so the
    batch that reaches the lateness limit emits (and paces) all K together: split over two batches, each would pace
    its share from its own "now" and the tenant's catch-up rate would be exceeded."""
    return max(MAX_FIRES_PER_SCHEDULE, kept_late_fires(schedule) + 1)


def plan_schedule(schedule: DueSchedule, *, now: datetime, horizon: timedelta) -> Plan:
    """Plan the fires of `schedule` from its durable cursor up to now + horizon (ARCHITECTURE rules 2, 7, 10).

    1. Walk fires from the cursor (never from "now": an outage must not silently drop fires) up to the horizon,
       at most fire_cap of them.
    2. Fires later than max_lateness are misfires; the policy keeps the latest K of them (skip 0, fire_once 1,
       catch_up `catchup_limit`) and records the rest missed, each with its reason.
    3. A walk cut short in the past cannot tell which of its fires are among the latest K, so it looks ahead from
       its end: if fewer than K late fires follow, the chunk ends just before the first kept one. Its fires are
       then certainly not kept (missed), and the next batch walks every kept fire in one chunk.
    4. Emitted fires get available_at = scheduled_for (strict) or + deterministic jitter (flexible); kept
       misfires are marked catch_up and released from now on, paced by the writer on the tenant's one catch-up
       budget (every schedule, batch and process of the tenant shares it).

    Across the batches of one catch-up at one "now", exactly min(K, late fires) are emitted. If "now" moves
    between batches, more fires are late; a fire recorded missed earlier is still not among the latest K.
    """
    rule = schedule.rule
    horizon_end = now + horizon
    lateness_limit = now - timedelta(seconds=schedule.max_lateness_seconds)
    keep = kept_late_fires(schedule)
    cap = fire_cap(schedule)
    fires: list[datetime] = []
    cursor: datetime | None = schedule.next_run_at
    while cursor is not None and cursor <= horizon_end and len(fires) < cap:
        fires.append(cursor)
        cursor = rule.next_after(cursor) if schedule.kind == "cron" else None

    truncated_in_past = cursor is not None and cursor < lateness_limit
    if truncated_in_past and keep:
        following = _count_late_fires(schedule, cursor, lateness_limit, at_most=keep)
        if following < keep:
            # Every walked fire is late here and the chunk is full (cap > keep), so the cut keeps at least one fire:
            # the cursor always moves forward.
            cut = len(fires) - (keep - following)
            fires, cursor = fires[:cut], fires[cut]

    late = [fire for fire in fires if fire < lateness_limit]
    emitted_late = set(late[-keep:] if late and keep and not truncated_in_past else [])

    plan = Plan(schedule=schedule, new_cursor=cursor, completed=cursor is None)
    for fire in fires:
        occurrence_id = occurrence_id_for(schedule.id, schedule.version, fire)
        if fire in emitted_late:
            plan.occurrences.append(
                PlannedOccurrence(occurrence_id, fire, now, OccurrenceState.SCHEDULED, catch_up=True)
            )
        elif fire < lateness_limit:
            plan.occurrences.append(
                PlannedOccurrence(occurrence_id, fire, fire, OccurrenceState.MISSED, _miss_reason(schedule, fire, now))
            )
        else:
            available_at = fire
            if schedule.lane == "flexible":
                available_at = fire + flexible_offset(occurrence_id, schedule.flexible_window_seconds)
            plan.occurrences.append(PlannedOccurrence(occurrence_id, fire, available_at, OccurrenceState.SCHEDULED))
    return plan


def _count_late_fires(schedule: DueSchedule, fire: datetime | None, lateness_limit: datetime, *, at_most: int) -> int:
    """Late fires from `fire` on, counting no further than `at_most`: the look-ahead costs at most K steps."""
    count = 0
    while fire is not None and fire < lateness_limit and count < at_most:
        count += 1
        fire = schedule.rule.next_after(fire)
    return count


def _miss_reason(schedule: DueSchedule, fire: datetime, now: datetime) -> str:
    late_by = f"late by {int((now - fire).total_seconds())} s > max lateness {schedule.max_lateness_seconds} s"
    if schedule.misfire_policy == "fire_once":
        return f"{late_by} (fire_once keeps only the latest late fire)"
    if schedule.misfire_policy == "catch_up":
        return f"{late_by} (catch_up keeps the latest {schedule.catchup_limit} late fires)"
    return f"{late_by} ({schedule.misfire_policy})"
