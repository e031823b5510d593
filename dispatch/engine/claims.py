"""The claim decision: whether a delivered occurrence runs now and, if it does not, what becomes of it and why.

`try_claim` locks the occurrence (and, for overlap policies other than allow, its schedule first), then decides in
this order, holding those locks:
1. drop what is not claimable: unknown, terminal, a duplicate of a live attempt, a retry delivered early;
2. cancel what the schedule withdrew (canceled, or a newer version for an occurrence that is not forced);
3. end a retry that may not run: attempts exhausted (over an expired lease), or the occurrence deadline passed;
4. apply the misfire policy to a first delivery later than its version's max lateness (ARCHITECTURE rule 12);
5. apply the overlap policy (rule 8): skip, or park in retry_wait until the running sibling is done;
6. take a running slot of the tenant's max_running; at the quota, park it in retry_wait (attempts untouched, never
   dead for it) to be offered again after a backoff that grows with its wait;
7. otherwise move it to running with generation = attempt_count + 1 and a lease, and record the attempt.
Every exit that is not a claim records the rule that decided it in `state_reason`.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from dispatch import counters
from dispatch.engine.retry import deadline_of
from dispatch.models import TERMINAL_STATES, OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.quotas import release_running_slots
from dispatch.sql import claims as claim_sql
from dispatch.sql import quotas as quota_sql
from schedules.models import MisfirePolicy, OverlapPolicy, ScheduleState

logger = logging.getLogger(__name__)

# A retry envelope released by the relay a moment before its available_at (its timer runs on another clock) must
# not be mistaken for an early duplicate and dropped: that would strand the occurrence in retry_wait.
EARLY_TOLERANCE = timedelta(seconds=1)

# First deliveries: the misfire policy may still end them. Parked queue_one occurrences (retry_wait, attempt 0)
# were judged when they were first delivered; what delays them since is the overlap policy, not an outage.
FIRST_DELIVERY_STATES = (OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED)


@dataclass(frozen=True)
class Claim:
    """A running attempt this worker owns while `generation` is the occurrence's attempt_count."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    tenant_id: int
    schedule_id: uuid.UUID
    schedule_version: int
    generation: int
    attempt_id: int
    worker: str
    handler: str
    payload: dict[str, Any]
    max_attempts: int
    lane: str
    priority: int
    claimed_at: datetime
    lease_expires_at: datetime
    overlap_policy: str = OverlapPolicy.ALLOW
    forced: bool = False

    @property
    def key(self) -> dict[str, Any]:
        return {"occurrence_id": self.occurrence_id, "scheduled_for": self.scheduled_for}


@dataclass(frozen=True)
class Drop:
    """A delivery that was not run, and why; `state` is the occurrence's state afterwards (None if unknown)."""

    reason: str
    state: str | None


@dataclass(frozen=True)
class _Observed:
    """The locked occurrence row, its schedule now, and its own version's definition (dispatch/sql/claims.py)."""

    state: str
    attempt_count: int
    lease_expires_at: datetime | None
    available_at: datetime
    occurrence_version: int
    tenant_id: int
    lane: str
    priority: int
    manual: bool
    forced: bool
    kept: bool
    throttled: bool
    schedule_id: uuid.UUID
    schedule_state: str
    schedule_version: int
    overlap_policy: str
    handler: str
    payload: Any
    max_attempts: int
    misfire_policy: str
    max_lateness_seconds: int
    catchup_limit: int
    now: datetime


def try_claim(
    occurrence_id: uuid.UUID, scheduled_for: datetime, worker_name: str, now: datetime | None = None
) -> Claim | Drop:
    """Claim one occurrence for `worker_name`, or tell why the delivery must not run now (logged and counted)."""
    key: dict[str, Any] = {"occurrence_id": occurrence_id, "scheduled_for": scheduled_for}
    outcome: Claim | Drop = Drop("unknown", None)
    schedule_id = None  # known, and locked first, only once an overlap policy asks for it
    for _ in range(2):
        with transaction.atomic(), connection.cursor() as cursor:
            if schedule_id is not None:
                cursor.execute(claim_sql.LOCK_SCHEDULE, {"schedule_id": schedule_id})
            cursor.execute(claim_sql.LOCK_OCCURRENCE, {**key, "now": now})
            locked = cursor.fetchone()
            if locked is None:
                break
            observed = _Observed(*locked)
            if observed.overlap_policy != OverlapPolicy.ALLOW and schedule_id is None:
                # Lock order is schedule, then occurrence (as in the control plane): let go of the occurrence and
                # decide again holding both. Schedules with overlap `allow` (most) never pay this second round.
                schedule_id = observed.schedule_id
                continue
            outcome = _decide(cursor, key, observed, worker_name)
            if observed.state == OccurrenceState.RUNNING and _left_running(outcome):
                # The expired run's slot goes back with the transaction that ended it (its last statement).
                release_running_slots(cursor, [observed.tenant_id])
        break
    _report_claim(occurrence_id, outcome)
    return outcome


def _left_running(outcome: Claim | Drop) -> bool:
    """Whether a decision on an occurrence found `running` (an expired lease) moved it out of running."""
    if not isinstance(outcome, Drop) or outcome.state in (None, OccurrenceState.RUNNING):
        return False
    return outcome.reason not in ("duplicate", "duplicate_attempt", "lost_race")


def schedule_withdraws(schedule_state: str, schedule_version: int, occurrence_version: int, *, forced: bool) -> bool:
    """Rule 5's re-check: a canceled schedule withdraws every occurrence; a newer version withdraws those of older
    versions, except forced ones (backfill, replay), which an operator asked for explicitly."""
    if schedule_state == ScheduleState.CANCELED:
        return True
    return schedule_version != occurrence_version and not forced


def withdrawal_reason(schedule_state: str, schedule_version: int) -> str:
    if schedule_state == ScheduleState.CANCELED:
        return "schedule canceled"
    return f"schedule changed to version {schedule_version}"


Move = Callable[..., Drop]


def _decide(cursor, key: dict[str, Any], o: _Observed, worker_name: str) -> Claim | Drop:
    """The claim decision (steps 1-6 of the module docstring), holding the occurrence row lock (and the schedule
    row for overlap policies)."""
    now = o.now
    if o.state in TERMINAL_STATES:
        return Drop("terminal", o.state)
    expired_run = o.state == OccurrenceState.RUNNING
    if expired_run and o.lease_expires_at is not None and o.lease_expires_at > now:
        return Drop("duplicate", o.state)
    if o.state == OccurrenceState.RETRY_WAIT and o.available_at > now + EARLY_TOLERANCE:
        return Drop("early", o.state)
    if expired_run:
        # Its worker died without the reaper noticing yet; close that attempt before taking over.
        cursor.execute(claim_sql.CLOSE_EXPIRED_ATTEMPT, {**key, "now": now, "generation": o.attempt_count})

    def move(new_state: str, reason: str, words: str, available_at: datetime | None = None) -> Drop:
        params = {**key, "now": now, "new_state": new_state, "available_at": available_at, "reason": words}
        cursor.execute(claim_sql.TRANSITION, {**params, "state": o.state, "attempt_count": o.attempt_count})
        if cursor.rowcount != 1:  # cannot happen under the row lock; refuse rather than guess
            return Drop("lost_race", None)
        return Drop(reason, new_state)

    if schedule_withdraws(o.schedule_state, o.schedule_version, o.occurrence_version, forced=o.forced or o.kept):
        return move(
            OccurrenceState.CANCELED, "schedule_changed", withdrawal_reason(o.schedule_state, o.schedule_version)
        )
    if expired_run and o.attempt_count >= o.max_attempts:
        words = f"attempts exhausted ({o.attempt_count} of {o.max_attempts})"
        return move(OccurrenceState.DEAD, "attempts_exhausted", words)
    deadline = deadline_of(key["scheduled_for"], forced=o.forced)
    if o.attempt_count > 0 and deadline is not None and now > deadline:
        return move(OccurrenceState.DEAD, "deadline_passed", "deadline passed")
    missed = _misfire(cursor, key, o)
    if missed is not None:
        return move(OccurrenceState.MISSED, "missed", missed)
    if o.overlap_policy != OverlapPolicy.ALLOW:
        verdict = _overlap(cursor, key, o, move)
        if verdict is not None:
            return verdict
    if not expired_run:  # a takeover inherits the dead run's slot
        cursor.execute(quota_sql.TAKE_RUNNING_SLOT, {"tenant_id": o.tenant_id})
        if cursor.fetchone() is None:
            return _wait_for_running_slot(cursor, key, o, move)
    return _claim(cursor, key, o, worker_name)


def _wait_for_running_slot(cursor, key: dict[str, Any], o: _Observed, move: Move) -> Drop:
    """The tenant runs max_running occurrences already: back to retry_wait with its envelope, attempts untouched.

    The wait before it is offered again grows with how long it has waited (a quarter of it, from
    SCHEDULER_RUNNING_RECHECK_SECONDS up to SCHEDULER_RUNNING_RECHECK_MAX_SECONDS, jittered): a backlog far over
    the quota costs the workers a few offers per occurrence, not one per second each.
    """
    cursor.execute(quota_sql.COUNT_THROTTLED_CLAIM, {"tenant_id": o.tenant_id})
    waited = max(0.0, (o.now - key["scheduled_for"]).total_seconds())
    base = settings.SCHEDULER_RUNNING_RECHECK_SECONDS
    delay = min(settings.SCHEDULER_RUNNING_RECHECK_MAX_SECONDS, max(base, waited / 4)) * random.uniform(0.75, 1.25)
    recheck_at = o.now + timedelta(seconds=delay)
    words = "throttled: the tenant's max_running quota is reached"
    drop = move(OccurrenceState.RETRY_WAIT, "running_quota", words, recheck_at)
    if drop.state == OccurrenceState.RETRY_WAIT:
        fire = Fire.for_lane(**key, tenant_id=o.tenant_id, lane=o.lane, available_at=recheck_at, priority=o.priority)
        enqueue(cursor, [fire])
    return drop


def _misfire(cursor, key: dict[str, Any], o: _Observed) -> str | None:
    """Why a first delivery later than its version's max lateness is missed (the reason in words), or None if it
    may run. Retries, manual triggers and forced fires are exempt: someone asked for them after the fact."""
    if o.state not in FIRST_DELIVERY_STATES or o.attempt_count > 0 or o.manual or o.forced or o.throttled:
        return None
    # Lateness counts from the release instant: the nominal fire time on the strict lane, the place in the spread
    # window on the flexible lane, the paced slot of a catch-up fire (already judged late when it was planned, and
    # held back on purpose by the tenant's catch-up budget). A throttled fire (max_fires_per_second) waited for
    # its tenant's own quota: it waits, it is never dropped for it.
    due = o.available_at
    lateness = (o.now - due).total_seconds()
    # The pipeline's own latency (relay, broker, a worker's prefetch) is not an outage: without this grace a
    # schedule with max_lateness_seconds = 0 would never run, since no claim happens at the very instant.
    tolerated = o.max_lateness_seconds + settings.SCHEDULER_CLAIM_LATENESS_GRACE_SECONDS
    if lateness <= tolerated:
        return None
    words = f"late by {int(lateness)} s > max lateness {o.max_lateness_seconds} s"
    siblings = {**key, "schedule_id": o.schedule_id, "now": o.now}
    if o.misfire_policy == MisfirePolicy.FIRE_ONCE:
        cursor.execute(claim_sql.NEWER_DUE_FIRE, siblings)
        newer = cursor.fetchone()
        if newer is None:
            return None  # the latest late fire: the one fire_once emits
        return f"{words} (fire_once keeps only the latest late fire; a newer one at {_utc(newer[0])} is due)"
    if o.misfire_policy == MisfirePolicy.CATCH_UP:
        keeps = f"catch_up keeps the latest {o.catchup_limit} late fires"
        if o.catchup_limit <= 0:
            return f"{words} ({keeps})"
        late_before = o.now - timedelta(seconds=tolerated)
        cursor.execute(claim_sql.NEWER_LATE_FIRES, {**siblings, "late_before": late_before, "limit": o.catchup_limit})
        if cursor.fetchone()[0] < o.catchup_limit:
            return None  # among the latest `catchup_limit` late fires
        return f"{words} ({keeps}; at least {o.catchup_limit} newer ones exist)"
    return f"{words} ({o.misfire_policy})"


def _overlap(cursor, key: dict[str, Any], o: _Observed, move: Move) -> Drop | None:
    """The overlap policy; None lets the claim go ahead.

    A retry (attempt_count > 0) is not a new fire: it is never skipped, only parked until the sibling running
    meanwhile is done. For first attempts, skip_if_running skips while a sibling runs; queue_one holds one
    occurrence behind a running sibling and skips the rest, and a newer fire never overtakes the held one (FIFO),
    even when nothing runs at that instant.
    """
    siblings = {**key, "schedule_id": o.schedule_id, "now": o.now}
    cursor.execute(claim_sql.SIBLING_RUNNING, siblings)
    row = cursor.fetchone()
    running = row[0] if row else None
    policy = o.overlap_policy
    if o.attempt_count > 0:
        return None if running is None else _park(cursor, key, o, move, f"waiting for occurrence {running}")
    if policy == OverlapPolicy.SKIP_IF_RUNNING:
        if running is None:
            return None
        return move(
            OccurrenceState.SKIPPED_OVERLAP,
            "overlap_skipped",
            f"overlap: occurrence {running} still running ({policy})",
        )
    cursor.execute(claim_sql.SIBLING_WAITING, siblings)
    held = cursor.fetchone()
    if held is not None and (held[1], held[0]) < (key["scheduled_for"], key["occurrence_id"]):
        words = f"overlap: occurrence {held[0]} is queued ahead ({policy})"
        return move(OccurrenceState.SKIPPED_OVERLAP, "overlap_skipped", words)
    if running is None:
        return None
    if held is not None:
        # queue_one holds at most one pending occurrence; the one already waiting will run.
        words = f"overlap: occurrence {running} still running and occurrence {held[0]} already queued ({policy})"
        return move(OccurrenceState.SKIPPED_OVERLAP, "overlap_skipped", words)
    return _park(cursor, key, o, move, f"waiting for occurrence {running}")


def _park(cursor, key: dict[str, Any], o: _Observed, move: Move, why: str) -> Drop:
    """Back to retry_wait (attempt_count unchanged) with a new envelope for the recheck, in the same transaction."""
    recheck_at = o.now + timedelta(seconds=settings.SCHEDULER_OVERLAP_RECHECK_SECONDS)
    drop = move(OccurrenceState.RETRY_WAIT, "overlap_waiting", f"overlap: {why} ({o.overlap_policy})", recheck_at)
    if drop.state == OccurrenceState.RETRY_WAIT:
        fire = Fire.for_lane(**key, tenant_id=o.tenant_id, lane=o.lane, available_at=recheck_at, priority=o.priority)
        enqueue(cursor, [fire])
    return drop


def _claim(cursor, key: dict[str, Any], o: _Observed, worker_name: str) -> Claim | Drop:
    lease = settings.SCHEDULER_WORKER_LEASE_SECONDS
    cursor.execute(
        claim_sql.CLAIM, {**key, "now": o.now, "lease": lease, "state": o.state, "attempt_count": o.attempt_count}
    )
    claimed = cursor.fetchone()
    if claimed is None:
        return Drop("lost_race", None)
    generation, lease_expires_at = claimed
    cursor.execute(
        claim_sql.INSERT_ATTEMPT,
        {
            **key,
            "generation": generation,
            "worker": worker_name[:200],
            "now": o.now,
            "lease_expires_at": lease_expires_at,
        },
    )
    attempt = cursor.fetchone()
    if attempt is None:
        # An attempt of this generation exists already (attempt_generation_unique): undo the claim, run nothing.
        transaction.set_rollback(True)
        return Drop("duplicate_attempt", o.state)
    payload = json.loads(o.payload) if isinstance(o.payload, str | bytes) else (o.payload or {})
    if generation == 1 and not (o.forced or o.manual):
        counters.START_LAG.labels(o.lane).observe(max(0.0, (o.now - o.available_at).total_seconds()))
    return Claim(
        occurrence_id=key["occurrence_id"],
        scheduled_for=key["scheduled_for"],
        tenant_id=o.tenant_id,
        schedule_id=o.schedule_id,
        schedule_version=o.occurrence_version,
        generation=generation,
        attempt_id=attempt[0],
        worker=worker_name,
        handler=o.handler,
        payload=payload,
        max_attempts=o.max_attempts,
        lane=o.lane,
        priority=o.priority,
        claimed_at=o.now,
        lease_expires_at=lease_expires_at,
        overlap_policy=o.overlap_policy,
        forced=o.forced,
    )


def _utc(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _report_claim(occurrence_id: uuid.UUID, outcome: Claim | Drop) -> None:
    if isinstance(outcome, Claim):
        counters.WORKER_CLAIMS.inc()
        logger.info(
            "claimed occurrence %s generation %d (%s)",
            occurrence_id,
            outcome.generation,
            outcome.handler,
            extra={"action": "claim", "occurrence_id": str(occurrence_id)},
        )
        return
    counters.WORKER_CLAIM_DROPS.labels(outcome.reason).inc()
    if outcome.reason == "missed":
        counters.MISSED.labels("claim").inc()
    elif outcome.reason == "overlap_skipped":
        counters.SKIPPED_OVERLAP.inc()
    # Duplicates, overlap skips and misfires are expected in an at-least-once system; a vanished id or a
    # contradicting attempt history is worth a warning.
    level = logging.WARNING if outcome.reason in ("unknown", "lost_race", "duplicate_attempt") else logging.INFO
    logger.log(
        level,
        "dropped delivery of occurrence %s: %s (state %s)",
        occurrence_id,
        outcome.reason,
        outcome.state,
        extra={"action": "claim_drop", "reason": outcome.reason, "occurrence_id": str(occurrence_id)},
    )
