"""The one service for occurrence state changes outside the engine's hot loops.

The control plane calls it for invalidation, owed fires, in-flight reports and manual triggers; the API, the
console and the `replay` command for the DLQ. Every transition is a conditional UPDATE on the expected state.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import QuerySet

from core.choices import ScheduleState
from core.clock import db_now
from dispatch.errors import ReplayRefused
from dispatch.identity import manual_occurrence_id_for, occurrence_id_for
from dispatch.models import IN_FLIGHT_STATES, UNCLAIMED_STATES, Occurrence, OccurrenceState, OccurrenceWatch
from dispatch.occurrence_rows import write_envelopes, write_occurrences
from dispatch.outbox import Fire, enqueue
from dispatch.planning import MISSED, Plan, PlannedOccurrence, due_schedule_of, plan_schedule
from dispatch.quotas import pace_planned
from dispatch.sql import PreparedCursor
from dispatch.sql import control_plane as control_plane_sql
from dispatch.sql import maintenance as maintenance_sql
from dispatch.sql import metrics as metrics_sql
from dispatch.sql import outbox as outbox_sql
from dispatch.sql import quotas as quota_sql
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS, stuck_pages

logger = logging.getLogger(__name__)


def schedule_state(schedule_id: uuid.UUID) -> str | None:
    """The schedule's state, None if it does not exist (read by SQL: the data plane imports no control-plane code)."""
    with connection.cursor() as cursor:
        cursor.execute(control_plane_sql.SCHEDULE_STATE, {"schedule_id": schedule_id})
        row = cursor.fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class InFlight:
    occurrence_id: uuid.UUID
    state: str


def _enqueue_one(occurrence: Occurrence, *, available_at: datetime) -> None:
    """Put one occurrence in the outbox (its own envelope), in the caller's transaction."""
    with connection.cursor() as cursor:
        enqueue(cursor, [Fire.of(occurrence, available_at=available_at)])


def invalidate_unclaimed_occurrences(
    schedule_id: uuid.UUID,
    below_version: int,
    now: datetime,
    *,
    include_forced: bool = True,
    reason: str = "",
    keep_due_at: datetime | None = None,
) -> int:
    """Cancel occurrences of older versions that no worker has claimed yet (docs/ARCHITECTURE.md rule 9).

    One conditional UPDATE: a worker's claim (`WHERE state = 'enqueued'`) and this statement serialise on the
    row lock, so an occurrence ends either claimed (and reported in flight) or canceled, never both.
    """
    withdrawn = Occurrence.objects.filter(
        schedule_id=schedule_id, schedule_version__lt=below_version, state__in=UNCLAIMED_STATES
    )
    # Locked in primary-key order before they change, as every writer of many occurrences locks them
    # (dispatch/sql/__init__.py): the relay settling the same rows must not deadlock with this.
    list(withdrawn.order_by("occurrence_id", "scheduled_for").select_for_update().values_list("occurrence_id"))
    if keep_due_at is not None:
        # Fires due by then keep their slot: kept, so the worker's version re-check lets them run (its misfire and
        # deadline rules still apply).
        withdrawn.filter(scheduled_for__lte=keep_due_at).update(kept=True)
        withdrawn = withdrawn.filter(scheduled_for__gt=keep_due_at)
    if not include_forced:
        withdrawn = withdrawn.exclude(forced=True)
    canceled = withdrawn.update(state=OccurrenceState.CANCELED, finished_at=now, state_reason=reason)
    if canceled:
        with connection.cursor() as cursor:
            cursor.execute(outbox_sql.BUMP_INVALIDATION)
        logger.info(
            "canceled %d unclaimed occurrences of schedule %s below version %d",
            canceled,
            schedule_id,
            below_version,
            extra={"action": "invalidate_occurrences"},
        )
    return canceled


# Bound on the owed fires produced in one API call; a schedule further behind is left to the reconciler.
MAX_OWED_FIRES = 10_000


class OwedFires(NamedTuple):
    written: int  # rows written
    remaining_runs: int | None  # runs left under max_runs once they are written (None: no limit)


def materialize_owed_fires(schedule, *, now: datetime) -> OwedFires:
    """Produce the fires the current version still owes up to `now` (the materializer was behind) before a change
    moves the cursor on, exactly as the materializer would have: the misfire policy decides which are delivered
    and which are recorded missed (with the reason), and each takes one of the runs left under max_runs. Delivered
    ones are kept, so the change that follows does not withdraw them: they were due before it.

    The caller holds the schedule's row lock, so the materializer (SKIP LOCKED) cannot plan this schedule at the
    same time; fires it already wrote keep their rows.
    """
    due = due_schedule_of(
        vars(schedule),
        next_run_at=schedule.next_run_at,
        catchup_per_minute=schedule.tenant.max_catchup_per_minute,
        remaining_runs=schedule.remaining_runs_now,
        exclusions=schedule.time_rule.exclusions,
    )
    plans: list[Plan] = []
    planned = 0
    remaining_runs = due.remaining_runs
    while due.next_run_at is not None and due.next_run_at <= now and planned < MAX_OWED_FIRES:
        plan = plan_schedule(due, now=now, horizon=timedelta(0))
        plans.append(plan)
        planned += len(plan.occurrences)
        remaining_runs = plan.remaining_runs
        if plan.new_cursor is None or plan.new_cursor == due.next_run_at:
            break
        due = due._replace(next_run_at=plan.new_cursor, remaining_runs=plan.remaining_runs)
    if due.next_run_at is not None and due.next_run_at <= now and planned >= MAX_OWED_FIRES:
        # Further behind than one call may write: the rest has no row, and reconcile will report it as gaps.
        logger.error(
            "schedule %s is more than %d fires behind; fires from %s on are left to reconcile and backfill",
            schedule.id,
            MAX_OWED_FIRES,
            due.next_run_at.isoformat(),
            extra={"action": "owed_fires_truncated"},
        )
    # Fires the materializer already wrote keep their rows and take no catch-up budget: only the new ones are paced
    # and written, by the materializer's own writer (dispatch/occurrence_rows.py), kept, so the change that follows
    # does not withdraw them.
    existing = set(
        Occurrence.objects.filter(
            occurrence_id__in=[o.occurrence_id for p in plans for o in p.occurrences]
        ).values_list("occurrence_id", flat=True)
    )
    for plan in plans:
        plan.occurrences = [o for o in plan.occurrences if o.occurrence_id not in existing]
    with transaction.atomic(), PreparedCursor() as cursor:
        pace_planned(cursor, [(p.schedule, p.occurrences) for p in plans if p.catch_up], now=now)
        new_ids = write_occurrences(cursor, plans, now, kept=True)
        write_envelopes(cursor, plans, new_ids)
    new = planned if new_ids is None else len(new_ids)
    delivered = sum(1 for p in plans for o in p.to_enqueue if new_ids is None or o.occurrence_id in new_ids)
    if new:
        logger.warning(
            "schedule %s changed with %d fires not yet materialized: %d delivered, %d missed by its misfire policy",
            schedule.id,
            new,
            delivered,
            new - delivered,
            extra={"action": "owed_fires"},
        )
    return OwedFires(new, remaining_runs)


def record_missed_fire(schedule, *, at: datetime, now: datetime, reason: str) -> bool:
    """Record one fire of the current version as missed, with why (a one-off whose time passed in a pause), unless
    that fire already has a live row of an earlier version (kept through the pause, it still runs or ran)."""
    if (
        Occurrence.objects.filter(schedule_id=schedule.id, scheduled_for=at, manual=False)
        .exclude(state=OccurrenceState.CANCELED)
        .exists()
    ):
        return False
    missed = PlannedOccurrence(occurrence_id_for(schedule.id, schedule.version, at), at, at, MISSED, reason)
    # Through the materializer's writer too: one path writes occurrences (an existing row is left as it is).
    plan = Plan(due_schedule_of(vars(schedule), next_run_at=at, catchup_per_minute=0, exclusions=None), [missed])
    with transaction.atomic(), PreparedCursor() as cursor:
        write_occurrences(cursor, [plan], now)
    return True


# Pending fires older than this are stuck (dispatch/stuck.py) rather than "next": they are reported there, and the
# bound keeps the lookup to the recent end of the schedule's index.
PENDING_LOOKBACK = timedelta(seconds=DEFAULT_STUCK_AFTER_SECONDS)


def pending_fires(now: datetime) -> QuerySet[Occurrence]:
    """Fires materialized but not yet handed to the broker (state scheduled), recent enough not to be stuck;
    served by occurrence_schedule_recent (schedule_id, scheduled_for)."""
    return Occurrence.objects.filter(state=OccurrenceState.SCHEDULED, scheduled_for__gte=now - PENDING_LOOKBACK)


def fires_written_after(schedule_id: uuid.UUID, after: datetime) -> int:
    """The schedule's fires of its rhythm already written for after `after` and not withdrawn: under max_runs they
    have taken their runs, and still happen (a preview counts them with the runs left)."""
    return (
        Occurrence.objects.filter(schedule_id=schedule_id, manual=False, scheduled_for__gt=after)
        .exclude(state=OccurrenceState.CANCELED)
        .count()
    )


def earliest_pending_fire(schedule_id: uuid.UUID, now: datetime) -> datetime | None:
    return (
        pending_fires(now)
        .filter(schedule_id=schedule_id)
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
        .first()
    )


def in_flight_occurrences(schedule_id: uuid.UUID) -> list[InFlight]:
    """What a worker has already claimed and may still run; a cancel cannot withdraw it. From the watch table
    (its index watch_active_by_schedule), not the schedule's whole history."""
    rows = OccurrenceWatch.objects.filter(schedule_id=schedule_id, state__in=IN_FLIGHT_STATES).values_list(
        "occurrence_id", "state"
    )
    return [InFlight(occurrence_id=oid, state=state) for oid, state in rows]


def trigger_manual_occurrence(schedule, *, now: datetime, trigger_key: str | None = None) -> uuid.UUID:
    """A fire now, outside the cron rhythm. With a caller key the same key always yields the same occurrence."""
    key = trigger_key if trigger_key else now.isoformat()
    occurrence_id = manual_occurrence_id_for(schedule.id, key)
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
                # Accepted with 202, it is not an older version's future fire: an update or pause does not withdraw
                # it and the worker runs it under its own version; only a cancel does (and says so).
                "forced": True,
            },
        )
        if created:
            _enqueue_one(occurrence, available_at=now)
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
            raise ReplayRefused(f"Only a dead occurrence can be replayed; this one is {state}.")
        state = schedule_state(occurrence.schedule_id)
        if state == ScheduleState.CANCELED:
            raise ReplayRefused("The schedule of this occurrence is canceled; it would not run.")
        if state is None:
            # Its tenant was deleted with its schedules: no worker could claim it, it would stay scheduled for ever.
            raise ReplayRefused("The schedule of this occurrence no longer exists (its tenant was deleted).")
        Occurrence.objects.filter(occurrence_id=occurrence_id, state=OccurrenceState.DEAD).update(
            state=OccurrenceState.SCHEDULED, available_at=now, finished_at=None, forced=True
        )
        _enqueue_one(occurrence, available_at=now)
    logger.info("replayed dead occurrence %s", occurrence_id, extra={"action": "replay"})


# --- replay from the DLQ -----------------------------------------------------------------------------------------

# Dead occurrences replayed per transaction: row locks and the outbox insert stay short.
REPLAY_BATCH = 1000


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
            cursor.execute(maintenance_sql.REPLAY_DEAD_BATCH, {"tenant_id": tenant_id, "now": now, "limit": batch})
            rows = cursor.fetchall()
            if not rows:
                break
            fires = [
                Fire.for_lane(
                    occurrence_id, scheduled_for, tenant_id=row_tenant, lane=lane, available_at=now, priority=priority
                )
                for occurrence_id, scheduled_for, row_tenant, lane, priority in rows
            ]
            enqueue(cursor, fires)
        replayed += len(rows)
        logger.info("replayed %d dead occurrences", len(rows), extra={"action": "replay_batch"})
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.COUNT_DEAD_OF_CANCELED, {"tenant_id": tenant_id})
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
    state = schedule_state(occurrence.schedule_id)
    if state == ScheduleState.CANCELED:
        raise ReplayRefused(
            f"The schedule {occurrence.schedule_id} of occurrence {occurrence_id} is canceled; a replay would not run."
        )
    if state is None:
        raise ReplayRefused(
            f"The schedule {occurrence.schedule_id} of occurrence {occurrence_id} no longer exists (its tenant was "
            "deleted); a replay would not run."
        )
    try:
        # The service re-checks both conditions under the row lock: the checks above only make the message precise.
        replay_dead_occurrence(occurrence_id, now=now or db_now())
    except ReplayRefused as exc:
        raise ReplayRefused(f"Occurrence {occurrence_id}: {exc}") from None
    return Occurrence.objects.get(occurrence_id=occurrence_id, scheduled_for=occurrence.scheduled_for)


@dataclass(frozen=True)
class StuckReplay:
    republished: int
    by_state: dict[str, int]


def replay_stuck(
    *,
    older_than_seconds: float = DEFAULT_STUCK_AFTER_SECONDS,
    since: datetime,
    tenant_id: int | None = None,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> StuckReplay:
    """Re-publish every stuck occurrence (dispatch/stuck.py) scheduled since `since`, under its own id.

    One transaction per page: each occurrence still unfinished is marked `forced` (an operator asked for this very
    fire, as with a DLQ replay: it runs however late it now is, under its own version, unless its schedule was
    canceled) and gets a new envelope. Its state is left as it is, so the worker's claim stays the one authority (a
    duplicate delivery of something that meanwhile ran is dropped as terminal; a running one with an expired lease
    is taken over with the next generation; a canceled schedule's is canceled).
    """
    now = now or db_now()
    by_state: Counter[str] = Counter()
    for page in stuck_pages(
        since=since, until=now, now=now, stuck_after_seconds=older_than_seconds, tenant_id=tenant_id
    ):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                maintenance_sql.FORCE_STUCK,
                {
                    "occurrence_ids": [row.occurrence_id for row in page],
                    "scheduled_fors": [row.scheduled_for for row in page],
                },
            )
            still_stuck = {row[0] for row in cursor.fetchall()}
            redriven = [row for row in page if row.occurrence_id in still_stuck]
            enqueue(cursor, [Fire.of(row, available_at=now) for row in redriven])
        by_state.update(row.state for row in redriven)
        if progress is not None:
            progress(len(page))
        logger.info("re-published %d stuck occurrences", len(redriven), extra={"action": "replay_stuck"})
    return StuckReplay(republished=sum(by_state.values()), by_state=dict(sorted(by_state.items())))


# --- a deleted tenant --------------------------------------------------------------------------------------------


def schedules_of_tenant(tenant_id: int) -> list[uuid.UUID]:
    """Every schedule of the tenant, read before it is deleted: its occurrences are found through them."""
    with connection.cursor() as cursor:
        cursor.execute(control_plane_sql.TENANT_SCHEDULE_IDS, {"tenant_id": tenant_id})
        return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class EndedWork:
    occurrences_canceled: int
    running_canceled: int
    envelopes_withdrawn: int


def end_tenant_work(tenant_id: int, slug: str, schedule_ids: list[uuid.UUID], *, reason: str) -> EndedWork:
    """End what a deleted tenant still had pending, in the caller's transaction (docs/DESIGN.md "A deleted
    tenant"): every occurrence of its schedules that has not ended is canceled with the reason, running ones too
    (the reaper and the workers' renewals join the schedule, gone with the tenant, so a run left behind would stay
    `running` for ever); its envelopes go, published or not, and so do its per-tenant engine rows (fire bucket,
    running count, catch-up and retry windows, lag-series ranking and series); the invalidation mark moves, so what
    a relay has staged is dropped at its instant."""
    with connection.cursor() as cursor:
        cursor.execute(outbox_sql.CANCEL_TENANT_OCCURRENCES, {"schedule_ids": schedule_ids, "reason": reason})
        canceled, running = cursor.fetchone()
        cursor.execute(outbox_sql.WITHDRAW_ORPHAN_ENVELOPES, {"tenant_ids": [tenant_id], "reason": reason})
        envelopes, _ = cursor.fetchone()
        cursor.execute(quota_sql.FORGET_DELETED_TENANTS, {"tenant_ids": [tenant_id]})
        cursor.execute(metrics_sql.FORGET_TENANT_LAG_SERIES, {"slug": slug})
        cursor.execute(outbox_sql.BUMP_INVALIDATION)
    return EndedWork(canceled, running, envelopes)
