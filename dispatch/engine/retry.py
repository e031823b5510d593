"""Retry policy (ARCHITECTURE rule 6): what a handler's outcome means, and how long a transient failure waits."""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass

from django.conf import settings

from dispatch.errors import CanceledError, PermanentError, TransientError

logger = logging.getLogger(__name__)

# Attempt.error keeps the head of the message: enough to diagnose, bounded for a table of millions of rows.
ERROR_MAX_CHARS = 2000


@dataclass(frozen=True)
class RunResult:
    """What running the handler came to: succeeded, failed (error_class permanent|transient), canceled, fenced."""

    outcome: str
    error_class: str = ""
    error: str = ""
    retry_after: float | None = None


def retry_backoff(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))], so a burst of failures does not retry in step."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0, ceiling)


def backoff_for(result: RunResult, attempt: int) -> float:
    """Seconds before the next attempt: full jitter, raised to a Retry-After the target asked for, capped."""
    cap = settings.SCHEDULER_RETRY_CAP_SECONDS
    backoff = retry_backoff(attempt, base=settings.SCHEDULER_RETRY_BASE_SECONDS, cap=cap)
    if result.retry_after:
        backoff = max(backoff, min(result.retry_after, cap))
    return backoff


def classify(exc: Exception, *, handler: str, occurrence_id: uuid.UUID, cancel_reason: str | None) -> RunResult:
    """The RunResult of a handler that raised `exc`; `cancel_reason` is why its cancel event was raised, if it was."""
    message = f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS]
    if cancel_reason == "schedule_changed":
        return RunResult("canceled", "", message)
    if isinstance(exc, PermanentError):
        return RunResult("failed", "permanent", message)
    if isinstance(exc, TransientError):
        return RunResult("failed", "transient", message, retry_after=exc.retry_after)
    if not isinstance(exc, CanceledError):
        # Unexpected exceptions are treated as transient: a bug fixed and deployed gets its retries.
        logger.exception(
            "handler %s raised for occurrence %s",
            handler,
            occurrence_id,
            extra={"action": "handler_error", "occurrence_id": str(occurrence_id)},
        )
    return RunResult("failed", "transient", message)
