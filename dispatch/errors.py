"""Errors of the data plane: what a handler raises to steer its retries, and what an operator path refuses."""

from __future__ import annotations


class HandlerError(Exception):
    """Base of the errors with a meaning for the retry policy (docs/ARCHITECTURE.md rule 6)."""


class PermanentError(HandlerError):
    """Retrying cannot help (bad input, 4xx, unknown target): the occurrence goes to DEAD, the DLQ."""


class TransientError(HandlerError):
    """Retrying may help (timeout, 5xx, connection refused): backoff with full jitter, up to max_attempts.

    `retry_after` (seconds) is a floor the target asked for, e.g. an HTTP Retry-After; the retry cap still holds.
    """

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CanceledError(HandlerError):
    """Raised by a handler that honoured its cancel_event (cooperative cancellation, docs/ARCHITECTURE.md rule 5): it
    stopped before finishing."""


# --- refusals of the operator paths (mapped to HTTP codes by schedules/api/errors.py, to messages by commands) ---


class ReplayRefused(Exception):
    """The replay was not done; the message says why (unknown, not dead, or its schedule is canceled)."""


class ResolveRefused(Exception):
    """The resolution was not recorded; the message says why (unknown, not dead, already resolved, no note)."""


class BackfillRefused(Exception):
    """The backfill was not started; the message tells the operator why and what to do instead."""


class ReconcileInputError(ValueError):
    """A window or instant the reconciler (or backfill) cannot work with; the message is for the operator."""


class ShardCountMismatch(Exception):
    """The configured shard count is lower than the one the database already uses: starting would orphan the
    schedules on the missing shards, so the materializer refuses to start."""
