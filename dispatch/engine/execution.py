"""The worker service: claim an occurrence, run its handler under a renewed lease, complete it with fencing.

1. `try_claim` (dispatch/engine/claims.py) decides, holding the occurrence's row lock, whether the delivery runs:
   what is not claimable is dropped, what the schedule withdrew is canceled, the misfire and overlap policies are
   applied, and otherwise the occurrence moves to running with generation = attempt_count + 1 and a lease.
2. `run_claimed` re-checks version and cancel flag right before the side effect, then calls the handler with a
   HandlerContext while the process's LeaseRenewer renews the lease and raises the cancel event if the lease is
   lost or the schedule moved on.
3. `complete` writes the outcome only if the generation still owns the occurrence (fencing); transient failures
   go back to retry_wait, within the occurrence deadline and the tenant's retry budget, with a new outbox envelope
   in the same transaction.
Lease renewal and the reaper of expired leases are in dispatch/engine/leases.py; the retry policy in retry.py.
An envelope's occurrences go through the same three steps in batches (dispatch/engine/envelope_runner.py): `claim_many`,
`precheck_many` and `complete_many` take the same decisions for many rows in one statement each.

Every state change is one conditional UPDATE with a row-count check (docs/ARCHITECTURE.md rules 5, 6, 8, 9 and 14).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core.choices import OverlapPolicy
from dispatch import counters
from dispatch.cancel import CancelEvent
from dispatch.engine.claims import Claim, Drop, schedule_withdraws, try_claim, withdrawal_reason
from dispatch.engine.faults import crash_point
from dispatch.engine.leases import Ticket, lease_renewer
from dispatch.engine.outcomes import ErrorClass, RunOutcome, Tally
from dispatch.engine.retry import ERROR_MAX_CHARS, RunResult, attempts_of, backoff_for, classify, plan_retry
from dispatch.handlers import get_handler
from dispatch.models import OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.quotas import release_running_slots
from dispatch.sql import PreparedCursor
from dispatch.sql import claims as claim_sql

logger = logging.getLogger(__name__)


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


# --- 2. run -----------------------------------------------------------------------------------------------------


def run_claimed(claim: Claim, cancel_event: threading.Event | None = None, *, renew_lease: bool = True) -> RunResult:
    """Re-check, then run the handler while the lease is renewed. Never raises for handler errors."""
    verdict = precheck(claim)
    if verdict is not None:
        return verdict
    cancel_event = cancel_event or CancelEvent()
    ticket = lease_renewer().register(claim, cancel_event, handler_deadline()) if renew_lease else None
    try:
        return run_handler(claim, cancel_event, ticket)
    finally:
        if ticket is not None:
            lease_renewer().unregister(ticket)


def handler_deadline() -> float:
    """The monotonic instant a handler started now must be done by. Kept under RabbitMQ's consumer_timeout, which
    would otherwise close the channel of an unacknowledged envelope."""
    return time.monotonic() + settings.SCHEDULER_HANDLER_TIMEOUT_SECONDS


def run_handler(claim: Claim, cancel_event: threading.Event, ticket: Ticket | None) -> RunResult:
    """The side effect itself, after the re-check: the handler with its context. Never raises for handler errors."""
    try:
        fn = get_handler(claim.handler)
    except KeyError:
        return RunResult(RunOutcome.FAILED, ErrorClass.PERMANENT, f"unknown handler {claim.handler!r}")
    deadline = ticket.deadline if ticket is not None else handler_deadline()
    context = HandlerContext(
        occurrence_id=claim.occurrence_id,
        schedule_id=claim.schedule_id,
        tenant_id=claim.tenant_id,
        scheduled_for=claim.scheduled_for,
        attempt=claim.generation,
        payload=claim.payload,
        handler=claim.handler,
        cancel_event=cancel_event,
        deadline=claim.claimed_at + timedelta(seconds=settings.SCHEDULER_HANDLER_TIMEOUT_SECONDS),
        _deadline_monotonic=deadline,
    )
    started = time.monotonic()
    try:
        fn(context)
        return RunResult(RunOutcome.SUCCEEDED)
    except Exception as exc:
        return classify(
            exc,
            handler=claim.handler,
            occurrence_id=claim.occurrence_id,
            cancel_reason=ticket.reason if ticket else None,
        )
    finally:
        counters.WORKER_HANDLER_SECONDS.labels(claim.handler).observe(time.monotonic() - started)


def precheck(claim: Claim) -> RunResult | None:
    """A cancel or update between claim and side effect wins; a lost generation runs nothing."""
    with connection.cursor() as cursor:
        cursor.execute(claim_sql.PRECHECK, claim.key)
        row = cursor.fetchone()
    return _precheck_verdict(claim, row)


def precheck_many(claims: list[Claim]) -> dict[uuid.UUID, RunResult]:
    """`precheck` for many claims in one statement: the verdict of each claim that must not run (the others may)."""
    if not claims:
        return {}
    with PreparedCursor() as cursor:
        cursor.execute(
            claim_sql.PRECHECK_MANY,
            {"occurrence_ids": [c.occurrence_id for c in claims], "scheduled_fors": [c.scheduled_for for c in claims]},
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    verdicts = {}
    for claim in claims:
        verdict = _precheck_verdict(claim, rows.get(claim.occurrence_id))
        if verdict is not None:
            verdicts[claim.occurrence_id] = verdict
    return verdicts


def _precheck_verdict(claim: Claim, row: tuple | None) -> RunResult | None:
    if row is None:
        return RunResult(RunOutcome.FENCED, ErrorClass.NONE, "occurrence vanished")
    schedule_state, schedule_version, state, attempt_count, forced = row
    if state != OccurrenceState.RUNNING or attempt_count != claim.generation:
        return RunResult(RunOutcome.FENCED, ErrorClass.NONE, f"occurrence is {state} at generation {attempt_count}")
    if schedule_withdraws(schedule_state, schedule_version, claim.schedule_version, forced=forced):
        return RunResult(RunOutcome.CANCELED, ErrorClass.NONE, withdrawal_reason(schedule_state, schedule_version))
    return None


# --- 3. complete ------------------------------------------------------------------------------------------------


def _outcome(claim: Claim, result: RunResult) -> tuple[str, str, str]:
    """(new occurrence state, attempt outcome, reason in words) before the retry limits are applied."""
    if result.outcome == RunOutcome.SUCCEEDED:
        return OccurrenceState.SUCCEEDED, RunOutcome.SUCCEEDED, ""
    if result.outcome in (RunOutcome.CANCELED, RunOutcome.FENCED):
        # A fenced pre-check writes canceled too, but its conditional UPDATE finds no row and is refused. The
        # reason of a cancel is read from the schedule by the UPDATE itself.
        return OccurrenceState.CANCELED, RunOutcome.CANCELED, ""
    if result.error_class == ErrorClass.TRANSIENT and claim.generation < claim.max_attempts:
        return OccurrenceState.RETRY_WAIT, RunOutcome.FAILED, ""
    if result.error_class == ErrorClass.TRANSIENT:
        return (
            OccurrenceState.DEAD,
            RunOutcome.FAILED,
            f"attempts exhausted ({attempts_of(claim.generation, claim.max_attempts)})",
        )
    return (
        OccurrenceState.DEAD,
        RunOutcome.FAILED,
        f"permanent error (attempt {attempts_of(claim.generation, claim.max_attempts)})",
    )


def complete(claim: Claim, result: RunResult, now: datetime | None = None) -> str:
    """Record the outcome if this generation still owns the occurrence; returns the new state or "fenced"."""
    new_state, attempt_outcome, reason = _outcome(claim, result)
    retry_at = None
    with transaction.atomic(), connection.cursor() as cursor:
        if new_state == OccurrenceState.RETRY_WAIT:
            cursor.execute(claim_sql.LOCK_RUNNING, {**claim.key, "now": now, "generation": claim.generation})
            owned = cursor.fetchone()
            if owned is not None:  # a fenced completion takes no budget slot; its UPDATE below is refused
                wait = backoff_for(result, claim.generation, base=claim.retry_base_seconds, cap=claim.retry_cap_seconds)
                desired = owned[0] + timedelta(seconds=wait)
                plan = plan_retry(
                    cursor,
                    tenant_id=claim.tenant_id,
                    scheduled_for=claim.scheduled_for,
                    forced=claim.forced,
                    desired=desired,
                )
                new_state, retry_at, reason = plan.state, plan.retry_at, plan.reason
        cursor.execute(
            claim_sql.COMPLETE,
            {
                **claim.key,
                "now": now,
                "new_state": new_state,
                "retry_at": retry_at,
                "reason": reason,
                "generation": claim.generation,
            },
        )
        row = cursor.fetchone()
        fenced = row is None
        if not fenced and new_state == OccurrenceState.RETRY_WAIT:
            # The retry's envelope commits with the state change: no retry_wait without a message to end it.
            fire = Fire.for_lane(
                **claim.key, tenant_id=claim.tenant_id, lane=claim.lane, available_at=row[0], priority=claim.priority
            )
            enqueue(cursor, [fire])
        if not fenced and claim.overlap_policy == OverlapPolicy.QUEUE_ONE:
            _release_held(cursor, claim, row[1])
        cursor.execute(
            claim_sql.FINISH_ATTEMPT,
            {
                "attempt_id": claim.attempt_id,
                "scheduled_for": claim.scheduled_for,
                "now": row[1] if row else now,
                "outcome": RunOutcome.FENCED if fenced else attempt_outcome,
                "error_class": result.error_class,
                "error": result.error[:ERROR_MAX_CHARS],
            },
        )
        if not fenced:
            # Last statement: the tenant's running slot goes back with the state change (see dispatch/sql/quotas).
            release_running_slots(cursor, [claim.tenant_id])
    return _report_completion(claim, result, None if fenced else new_state, reason)


def complete_many(
    results: list[tuple[Claim, RunResult]],
    now: datetime | None = None,
    envelopes: Mapping[uuid.UUID, int] | None = None,
) -> dict[uuid.UUID, str]:
    """`complete` for many attempts at once; returns each occurrence's new state or "fenced". `envelopes` names the
    envelope each occurrence came in, where the message said: a stamped one's confirmation is copied at once.

    Outcomes that need nothing but their own row (succeeded, dead, canceled) are written for all in one
    transaction, one statement each for the occurrences, the attempts and the running slots; a retry (its budget,
    its envelope) or a queue_one completion (the held sibling) goes through `complete` alone.
    """
    outcomes: dict[uuid.UUID, str] = {}
    batch, alone = [], []
    for claim, result in results:
        new_state, attempt_outcome, reason = _outcome(claim, result)
        if new_state == OccurrenceState.RETRY_WAIT or claim.overlap_policy == OverlapPolicy.QUEUE_ONE:
            alone.append((claim, result))
        else:
            batch.append((claim, result, new_state, attempt_outcome, reason))
    if batch:
        with transaction.atomic(), PreparedCursor() as cursor:
            cursor.execute(
                claim_sql.COMPLETE_MANY,
                {
                    "occurrence_ids": [c.occurrence_id for c, *_ in batch],
                    "scheduled_fors": [c.scheduled_for for c, *_ in batch],
                    "generations": [c.generation for c, *_ in batch],
                    "new_states": [str(state) for _, _, state, _, _ in batch],
                    "reasons": [reason for *_, reason in batch],
                    "held_states": [OccurrenceState.RUNNING.value] * len(batch),
                    "envelope_ids": [envelopes.get(c.occurrence_id) if envelopes else None for c, *_ in batch],
                    "now": now,
                },
            )
            done = dict(cursor.fetchall())
            cursor.execute(
                claim_sql.FINISH_ATTEMPTS,
                {
                    "attempt_ids": [c.attempt_id for c, *_ in batch],
                    "scheduled_fors": [c.scheduled_for for c, *_ in batch],
                    "outcomes": [
                        attempt_outcome if c.occurrence_id in done else RunOutcome.FENCED
                        for c, _, _, attempt_outcome, _ in batch
                    ],
                    "error_classes": [r.error_class for _, r, *_ in batch],
                    "errors": [r.error[:ERROR_MAX_CHARS] for _, r, *_ in batch],
                    "now": next(iter(done.values()), now),
                },
            )
            # Last statement: the running slots go back with the state changes (see dispatch/sql/quotas).
            release_running_slots(cursor, [c.tenant_id for c, *_ in batch if c.occurrence_id in done])
        for claim, result, new_state, _, reason in batch:
            fenced = claim.occurrence_id not in done
            outcomes[claim.occurrence_id] = _report_completion(claim, result, None if fenced else new_state, reason)
    for claim, result in alone:
        outcomes[claim.occurrence_id] = complete(claim, result, now)
    return outcomes


def _report_completion(claim: Claim, result: RunResult, new_state: str | None, reason: str) -> str:
    """Count and log one completion (`new_state` None: fenced); returns its outcome."""
    fenced = new_state is None
    outcome = RunOutcome.FENCED if new_state is None else str(new_state)
    counters.WORKER_COMPLETIONS.labels(outcome).inc()
    if outcome == OccurrenceState.RETRY_WAIT:
        counters.WORKER_RETRIES.inc()
    # Each ordinary completion at DEBUG: at thousands a second, a line each would cost more than the work.
    level = logging.WARNING if fenced or new_state == OccurrenceState.DEAD else logging.DEBUG
    if outcome == OccurrenceState.RETRY_WAIT:
        level = logging.INFO
    logger.log(
        level,
        "occurrence %s generation %d: %s%s%s",
        claim.occurrence_id,
        claim.generation,
        "completion refused, a newer attempt owns it" if fenced else outcome,
        f" ({result.error_class}: {result.error[:200]})" if result.error_class else "",
        f" [{reason}]" if reason and not fenced else "",
        extra={"action": "fenced" if fenced else "complete", "occurrence_id": str(claim.occurrence_id)},
    )
    return outcome


def _release_held(cursor, claim: Claim, now: datetime) -> None:
    """queue_one: the occurrence held behind this one is due now, with its envelope (see RELEASE_HELD)."""
    cursor.execute(claim_sql.RELEASE_HELD, {"schedule_id": claim.schedule_id, "now": now})
    fires = [
        Fire.for_lane(occurrence_id, scheduled_for, tenant_id=tenant_id, lane=lane, available_at=now, priority=priority)
        for occurrence_id, scheduled_for, tenant_id, lane, priority in cursor.fetchall()
    ]
    enqueue(cursor, fires)


def process_occurrence(
    occurrence_id: uuid.UUID,
    scheduled_for: datetime,
    worker_name: str,
    cancel_event: threading.Event | None = None,
    on_claimed: Callable[[], None] | None = None,
) -> str:
    """Claim, run and complete one delivered occurrence; returns its outcome ("dropped" when not claimed).
    `on_claimed` is told when the claim is decided, either way (the envelope runner waits for that before it lets
    the rest run on without it)."""
    try:
        outcome = try_claim(occurrence_id, scheduled_for, worker_name)
    finally:
        if on_claimed is not None:
            on_claimed()
    if isinstance(outcome, Drop):
        return Tally.DROPPED
    crash_point("worker.after_claim")
    result = run_claimed(outcome, cancel_event)
    crash_point("worker.after_effect")
    return complete(outcome, result)
