"""Retry policy (docs/ARCHITECTURE.md rule 6): what a handler's outcome means, how long a transient failure waits,
and what bounds its retries besides max attempts: the occurrence deadline and the tenant's retry budget."""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from dispatch import counters
from dispatch.engine.outcomes import CancelReason, ErrorClass, RunOutcome
from dispatch.errors import CanceledError, PermanentError, TransientError
from dispatch.models import OccurrenceState
from dispatch.sql import claims as claim_sql

logger = logging.getLogger(__name__)

# Attempt.error keeps the head of the message: enough to diagnose, bounded for a table of millions of rows.
ERROR_MAX_CHARS = 2000
# The budget's unit of time: a tenant's cap counts the retries granted to run in one UTC minute.
BUDGET_WINDOW = timedelta(minutes=1)
# Full minutes read ahead in one query when looking for the first one with room (a day at most): after a retry
# storm the next free minute may lie far ahead, and probing minute by minute would cost a round trip each.
BUDGET_SCAN_MINUTES = 1440


@dataclass(frozen=True)
class RunResult:
    """What running the handler came to: succeeded, failed (error_class permanent|transient), canceled, fenced."""

    outcome: RunOutcome
    error_class: ErrorClass = ErrorClass.NONE
    error: str = ""
    retry_after: float | None = None


@dataclass(frozen=True)
class RetryPlan:
    """What becomes of a transient failure with attempts left: retry_wait at `retry_at`, or dead; and why."""

    state: str
    retry_at: datetime | None
    reason: str = ""


def retry_backoff(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Equal jitter: uniform in [c/2, c], c = min(cap, base * 2**(attempt-1)).

    Half of each wait is certain, so retries bridge an ordinary blip of the target: with full jitter (uniform in
    [0, c]) four retries could all land in the first two seconds of a restart and send the fire to the DLQ. The other
    half is random, so a burst of failures does not retry in step."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


def backoff_for(result: RunResult, attempt: int, *, base: float | None = None, cap: float | None = None) -> float:
    """Seconds before the next attempt: the schedule's policy (`base`, `cap`; None: the platform's settings) with
    equal jitter, raised to a Retry-After the target asked for, capped."""
    base = settings.SCHEDULER_RETRY_BASE_SECONDS if base is None else base
    # A schedule's base above the platform's cap, under no cap of its own, is not cut down to that cap.
    cap = max(settings.SCHEDULER_RETRY_CAP_SECONDS, base) if cap is None else cap
    backoff = retry_backoff(attempt, base=base, cap=cap)
    if result.retry_after:
        backoff = max(backoff, min(result.retry_after, cap))
    return backoff


def attempts_of(generation: int, max_attempts: int) -> str:
    """The attempts made of the attempts allowed, for a reason an operator reads: "3 of 5".

    The generation is the occurrence's fencing token, so it counts every attempt of its life; max_attempts is its own
    version's (the definition it runs). A replay from the DLQ keeps the generation and runs the occurrence again past
    max_attempts: each attempt beyond it was allowed by a replay, and is said so ("3 of 3: max_attempts 1 + 2 by
    replay") instead of "3 of 1". dispatch/sql/leases.py REAP_EXPIRED_LEASES writes the same words.
    """
    if generation <= max_attempts:
        return f"{generation} of {max_attempts}"
    return f"{generation} of {generation}: max_attempts {max_attempts} + {generation - max_attempts} by replay"


def deadline_of(scheduled_for: datetime, *, forced: bool) -> datetime | None:
    """The instant after which no retry of the occurrence runs, or None for forced occurrences.

    Backfill and replay re-drive fires long after their scheduled_for (days, for a backfill): a deadline counted
    from it would send their first transient failure straight to dead. Max attempts still bounds them.
    """
    if forced:
        return None
    return scheduled_for + timedelta(seconds=settings.SCHEDULER_OCCURRENCE_DEADLINE_SECONDS)


def plan_retry(cursor, *, tenant_id: int, scheduled_for: datetime, forced: bool, desired: datetime) -> RetryPlan:
    """Settle when a transient failure retries, in the completion's transaction (the occurrence row locked).

    1. A retry wanted after the occurrence deadline is not scheduled: dead, "deadline passed".
    2. The tenant's retry budget grants it a slot: at `desired` if its minute has room, else in the first later
       minute that has, paced evenly inside it (delayed, never dropped).
    3. A slot that lands past the deadline ends the occurrence the same way.
    """
    deadline = deadline_of(scheduled_for, forced=forced)
    if deadline is not None and desired > deadline:
        counters.WORKER_RETRIES_LIMITED.labels("deadline").inc()
        return RetryPlan(OccurrenceState.DEAD, None, "deadline passed")
    retry_at, cap = take_retry_slot(cursor, tenant_id=tenant_id, desired=desired)
    if deadline is not None and retry_at > deadline:
        # The slot taken stays counted: the minute is one retry stricter than it needs to be, never looser.
        counters.WORKER_RETRIES_LIMITED.labels("deadline").inc()
        return RetryPlan(OccurrenceState.DEAD, None, "deadline passed")
    if retry_at > desired:
        counters.WORKER_RETRIES_LIMITED.labels("tenant_budget").inc()
        logger.info(
            "retry of tenant %s delayed %.1f s by its budget of %d per minute",
            tenant_id,
            (retry_at - desired).total_seconds(),
            cap,
            extra={"action": "retry_budget", "tenant_id": tenant_id},
        )
        return RetryPlan(
            OccurrenceState.RETRY_WAIT, retry_at, f"retry delayed by the tenant's retry budget ({cap} per minute)"
        )
    return RetryPlan(OccurrenceState.RETRY_WAIT, retry_at)


def take_retry_slot(cursor, *, tenant_id: int, desired: datetime) -> tuple[datetime, int]:
    """(when the retry may run, the tenant's cap per minute); (`desired`, 0) for a tenant without a cap.

    A counter row per tenant and minute in PostgreSQL (dispatch_tenant_retry_window) makes the cap hold across
    every worker: a slot is taken by one conditional upsert, and a minute filled meanwhile by another worker is
    simply refused, so the loop moves on to the next minute.
    """
    window = _minute_of(desired)
    cursor.execute(claim_sql.RETRY_BUDGET, {"tenant_id": tenant_id, "window": window, "scan": BUDGET_SCAN_MINUTES})
    row = cursor.fetchone()
    if row is None or not row[0]:
        return desired, 0
    cap, full = row[0], set(row[1] or ())
    while True:
        while window in full:
            window += BUDGET_WINDOW
        cursor.execute(claim_sql.TAKE_RETRY_SLOT, {"tenant_id": tenant_id, "window": window, "limit": cap})
        taken = cursor.fetchone()
        if taken is not None:
            break
        full.add(window)
    if window == _minute_of(desired):
        return desired, cap
    # Pushed to a later minute: the n-th slot of that minute runs n/cap of the way into it, so the delayed
    # retries of a storm do not all land on the minute's first instant.
    position = taken[0] - 1
    return window + BUDGET_WINDOW * position / cap, cap


def _minute_of(instant: datetime) -> datetime:
    return instant.replace(second=0, microsecond=0)


def classify(exc: Exception, *, handler: str, occurrence_id: uuid.UUID, cancel_reason: str | None) -> RunResult:
    """The RunResult of a handler that raised `exc`; `cancel_reason` is why its cancel event was raised, if it was."""
    message = f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS]
    if cancel_reason == CancelReason.SCHEDULE_CHANGED:
        return RunResult(RunOutcome.CANCELED, ErrorClass.NONE, message)
    if isinstance(exc, PermanentError):
        return RunResult(RunOutcome.FAILED, ErrorClass.PERMANENT, message)
    if isinstance(exc, TransientError):
        return RunResult(RunOutcome.FAILED, ErrorClass.TRANSIENT, message, retry_after=exc.retry_after)
    if not isinstance(exc, CanceledError):
        # Unexpected exceptions are treated as transient: a bug fixed and deployed gets its retries.
        logger.exception(
            "handler %s raised for occurrence %s",
            handler,
            occurrence_id,
            extra={"action": "handler_error", "occurrence_id": str(occurrence_id)},
        )
    return RunResult(RunOutcome.FAILED, ErrorClass.TRANSIENT, message)
