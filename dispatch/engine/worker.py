"""The worker service: claim an occurrence, run its handler under a renewed lease, complete it with fencing.

1. `claim` locks the occurrence (and, for overlap policies other than allow, its schedule first), drops what is
   not claimable (unknown, terminal, duplicate, early), cancels what the schedule withdrew, applies the overlap
   policy, and otherwise moves it to running with generation = attempt_count + 1 and a lease.
2. `run_claimed` re-checks version and cancel flag right before the side effect, then calls the handler with a
   HandlerContext while the process's LeaseRenewer renews the lease and raises the cancel event if the lease is
   lost or the schedule moved on.
3. `complete` writes the outcome only if the generation still owns the occurrence (fencing); transient failures
   go back to retry_wait with a new outbox envelope in the same transaction.
Lease renewal and the reaper of expired leases are in dispatch/engine/leases.py; the retry policy in retry.py.

Every state change is one conditional UPDATE with a row-count check (ARCHITECTURE rules 5, 6, 8, 9).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from prometheus_client import Counter, Histogram

from dispatch.engine.faults import crash_point
from dispatch.engine.leases import lease_renewer
from dispatch.engine.retry import ERROR_MAX_CHARS, RunResult, backoff_for, classify
from dispatch.handlers import get_handler
from dispatch.models import TERMINAL_STATES, OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.sql import claims as claim_sql
from schedules.models import OverlapPolicy, ScheduleState

logger = logging.getLogger(__name__)

# A retry envelope released by the relay a moment before its available_at (its timer runs on another clock) must
# not be mistaken for an early duplicate and dropped: that would strand the occurrence in retry_wait.
EARLY_TOLERANCE = timedelta(seconds=1)

CLAIMS = Counter("scheduler_worker_claims", "Occurrences claimed by a worker (attempts started).")
DROPS = Counter(
    "scheduler_worker_claim_drops", "Deliveries not run, by reason (duplicate = duplicate claim).", ["reason"]
)
COMPLETIONS = Counter("scheduler_worker_completions", "Attempt completions by resulting state.", ["outcome"])
HANDLER_SECONDS = Histogram("scheduler_worker_handler_seconds", "Handler run time.", ["handler"])


# --- values ---------------------------------------------------------------------------------------------------


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

    @property
    def key(self) -> dict[str, Any]:
        return {"occurrence_id": self.occurrence_id, "scheduled_for": self.scheduled_for}


@dataclass(frozen=True)
class Drop:
    """A delivery that was not run, and why; `state` is the occurrence's state afterwards (None if unknown)."""

    reason: str
    state: str | None


@dataclass(frozen=True)
class HandlerContext:
    """What a handler receives. `occurrence_id` is its idempotency key: the same for every attempt and replay."""

    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    tenant_id: int
    scheduled_for: datetime
    attempt: int
    payload: dict[str, Any]
    handler: str
    cancel_event: threading.Event
    deadline: datetime
    _deadline_monotonic: float = field(default=0.0, repr=False)

    def seconds_left(self) -> float:
        """Time until the deadline on the monotonic clock (never negative)."""
        return max(0.0, self._deadline_monotonic - time.monotonic())


# --- 1. claim ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Observed:
    state: str
    attempt_count: int
    lease_expires_at: datetime | None
    available_at: datetime
    occurrence_version: int
    tenant_id: int
    lane: str
    priority: int
    schedule_id: uuid.UUID
    schedule_state: str
    schedule_version: int
    overlap_policy: str
    max_attempts: int
    handler: str
    payload: Any
    forced: bool
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
        break
    _report_claim(occurrence_id, outcome)
    return outcome


def schedule_withdraws(schedule_state: str, schedule_version: int, occurrence_version: int, *, forced: bool) -> bool:
    """Rule 5's re-check: a canceled schedule withdraws every occurrence; a newer version withdraws those of older
    versions, except forced ones (backfill, replay), which an operator asked for explicitly."""
    if schedule_state == ScheduleState.CANCELED:
        return True
    return schedule_version != occurrence_version and not forced


def _decide(cursor, key: dict[str, Any], o: _Observed, worker_name: str) -> Claim | Drop:
    """The claim decision, holding the occurrence row lock (and the schedule row for overlap policies)."""
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

    def move(new_state: str, reason: str, available_at: datetime | None = None) -> Drop:
        params = {**key, "now": now, "new_state": new_state, "available_at": available_at}
        cursor.execute(claim_sql.TRANSITION, {**params, "state": o.state, "attempt_count": o.attempt_count})
        if cursor.rowcount != 1:  # cannot happen under the row lock; refuse rather than guess
            return Drop("lost_race", None)
        return Drop(reason, new_state)

    if schedule_withdraws(o.schedule_state, o.schedule_version, o.occurrence_version, forced=o.forced):
        return move(OccurrenceState.CANCELED, "schedule_changed")
    if expired_run and o.attempt_count >= o.max_attempts:
        return move(OccurrenceState.DEAD, "attempts_exhausted")
    if o.overlap_policy != OverlapPolicy.ALLOW:
        siblings = {**key, "schedule_id": o.schedule_id, "now": now}
        cursor.execute(claim_sql.SIBLING_RUNNING, siblings)
        if cursor.fetchone()[0]:
            if o.overlap_policy == OverlapPolicy.SKIP_IF_RUNNING:
                return move(OccurrenceState.SKIPPED_OVERLAP, "overlap_skipped")
            cursor.execute(claim_sql.SIBLING_WAITING, siblings)
            if cursor.fetchone()[0]:
                # queue_one holds at most one pending occurrence; the one already waiting will run.
                return move(OccurrenceState.SKIPPED_OVERLAP, "overlap_skipped")
            recheck_at = now + timedelta(seconds=settings.SCHEDULER_OVERLAP_RECHECK_SECONDS)
            drop = move(OccurrenceState.RETRY_WAIT, "overlap_waiting", available_at=recheck_at)
            if drop.state == OccurrenceState.RETRY_WAIT:
                fire = Fire.for_lane(
                    **key, tenant_id=o.tenant_id, lane=o.lane, available_at=recheck_at, priority=o.priority
                )
                enqueue(cursor, [fire])
            return drop

    lease = settings.SCHEDULER_WORKER_LEASE_SECONDS
    cursor.execute(
        claim_sql.CLAIM, {**key, "now": now, "lease": lease, "state": o.state, "attempt_count": o.attempt_count}
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
            "now": now,
            "lease_expires_at": lease_expires_at,
        },
    )
    attempt_id = cursor.fetchone()[0]
    payload = json.loads(o.payload) if isinstance(o.payload, str | bytes) else (o.payload or {})
    return Claim(
        occurrence_id=key["occurrence_id"],
        scheduled_for=key["scheduled_for"],
        tenant_id=o.tenant_id,
        schedule_id=o.schedule_id,
        schedule_version=o.occurrence_version,
        generation=generation,
        attempt_id=attempt_id,
        worker=worker_name,
        handler=o.handler,
        payload=payload,
        max_attempts=o.max_attempts,
        lane=o.lane,
        priority=o.priority,
        claimed_at=now,
        lease_expires_at=lease_expires_at,
    )


def _report_claim(occurrence_id: uuid.UUID, outcome: Claim | Drop) -> None:
    if isinstance(outcome, Claim):
        CLAIMS.inc()
        logger.info(
            "claimed occurrence %s generation %d (%s)",
            occurrence_id,
            outcome.generation,
            outcome.handler,
            extra={"action": "claim", "occurrence_id": str(occurrence_id)},
        )
        return
    DROPS.labels(outcome.reason).inc()
    # Duplicates and overlap skips are expected in an at-least-once system; a vanished id is worth a warning.
    level = logging.WARNING if outcome.reason in ("unknown", "lost_race") else logging.INFO
    logger.log(
        level,
        "dropped delivery of occurrence %s: %s (state %s)",
        occurrence_id,
        outcome.reason,
        outcome.state,
        extra={"action": "claim_drop", "reason": outcome.reason, "occurrence_id": str(occurrence_id)},
    )


# --- 2. run -----------------------------------------------------------------------------------------------------


def run_claimed(claim: Claim, cancel_event: threading.Event | None = None, *, renew_lease: bool = True) -> RunResult:
    """Re-check, then run the handler while the lease is renewed. Never raises for handler errors."""
    cancel_event = cancel_event or threading.Event()
    verdict = _precheck(claim)
    if verdict is not None:
        return verdict
    try:
        fn = get_handler(claim.handler)
    except KeyError:
        return RunResult("failed", "permanent", f"unknown handler {claim.handler!r}")
    # Kept under RabbitMQ's consumer_timeout, which would otherwise close the channel of an unacknowledged envelope.
    timeout = settings.SCHEDULER_HANDLER_TIMEOUT_SECONDS
    context = HandlerContext(
        occurrence_id=claim.occurrence_id,
        schedule_id=claim.schedule_id,
        tenant_id=claim.tenant_id,
        scheduled_for=claim.scheduled_for,
        attempt=claim.generation,
        payload=claim.payload,
        handler=claim.handler,
        cancel_event=cancel_event,
        deadline=claim.claimed_at + timedelta(seconds=timeout),
        _deadline_monotonic=time.monotonic() + timeout,
    )
    ticket = lease_renewer().register(claim, cancel_event, context._deadline_monotonic) if renew_lease else None
    started = time.monotonic()
    try:
        fn(context)
        return RunResult("succeeded")
    except Exception as exc:
        return classify(
            exc,
            handler=claim.handler,
            occurrence_id=claim.occurrence_id,
            cancel_reason=ticket.reason if ticket else None,
        )
    finally:
        HANDLER_SECONDS.labels(claim.handler).observe(time.monotonic() - started)
        if ticket is not None:
            lease_renewer().unregister(ticket)


def _precheck(claim: Claim) -> RunResult | None:
    """A cancel or update between claim and side effect wins; a lost generation runs nothing."""
    with connection.cursor() as cursor:
        cursor.execute(claim_sql.PRECHECK, claim.key)
        row = cursor.fetchone()
    if row is None:
        return RunResult("fenced", "", "occurrence vanished")
    schedule_state, schedule_version, state, attempt_count, forced = row
    if state != OccurrenceState.RUNNING or attempt_count != claim.generation:
        return RunResult("fenced", "", f"occurrence is {state} at generation {attempt_count}")
    if schedule_withdraws(schedule_state, schedule_version, claim.schedule_version, forced=forced):
        return RunResult("canceled", "", f"schedule is {schedule_state} at version {schedule_version}")
    return None


# --- 3. complete ------------------------------------------------------------------------------------------------


def complete(claim: Claim, result: RunResult, now: datetime | None = None) -> str:
    """Record the outcome if this generation still owns the occurrence; returns the new state or "fenced"."""
    if result.outcome == "succeeded":
        new_state, attempt_outcome = OccurrenceState.SUCCEEDED, "succeeded"
    elif result.outcome in ("canceled", "fenced"):
        # A fenced pre-check writes canceled too, but its conditional UPDATE finds no row and is refused.
        new_state, attempt_outcome = OccurrenceState.CANCELED, "canceled"
    elif result.error_class == "transient" and claim.generation < claim.max_attempts:
        new_state, attempt_outcome = OccurrenceState.RETRY_WAIT, "failed"
    else:
        new_state, attempt_outcome = OccurrenceState.DEAD, "failed"
    backoff = backoff_for(result, claim.generation) if new_state == OccurrenceState.RETRY_WAIT else 0.0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            claim_sql.COMPLETE,
            {**claim.key, "now": now, "new_state": new_state, "backoff": backoff, "generation": claim.generation},
        )
        row = cursor.fetchone()
        fenced = row is None
        if not fenced and new_state == OccurrenceState.RETRY_WAIT:
            # The retry's envelope commits with the state change: no retry_wait without a message to end it.
            fire = Fire.for_lane(
                **claim.key, tenant_id=claim.tenant_id, lane=claim.lane, available_at=row[0], priority=claim.priority
            )
            enqueue(cursor, [fire])
        cursor.execute(
            claim_sql.FINISH_ATTEMPT,
            {
                "attempt_id": claim.attempt_id,
                "scheduled_for": claim.scheduled_for,
                "now": row[1] if row else now,
                "outcome": "fenced" if fenced else attempt_outcome,
                "error_class": result.error_class,
                "error": result.error[:ERROR_MAX_CHARS],
            },
        )
    outcome = "fenced" if fenced else str(new_state)
    COMPLETIONS.labels(outcome).inc()
    logger.log(
        logging.WARNING if fenced or new_state == OccurrenceState.DEAD else logging.INFO,
        "occurrence %s generation %d: %s%s",
        claim.occurrence_id,
        claim.generation,
        "completion refused, a newer attempt owns it" if fenced else outcome,
        f" ({result.error_class}: {result.error[:200]})" if result.error_class else "",
        extra={"action": "fenced" if fenced else "complete", "occurrence_id": str(claim.occurrence_id)},
    )
    return outcome


def process_occurrence(
    occurrence_id: uuid.UUID,
    scheduled_for: datetime,
    worker_name: str,
    cancel_event: threading.Event | None = None,
) -> str:
    """Claim, run and complete one delivered occurrence; returns its outcome ("dropped" when not claimed)."""
    outcome = try_claim(occurrence_id, scheduled_for, worker_name)
    if isinstance(outcome, Drop):
        return "dropped"
    crash_point("worker.after_claim")
    result = run_claimed(outcome, cancel_event)
    crash_point("worker.after_effect")
    return complete(outcome, result)
