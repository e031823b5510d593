"""Errors a handler raises to tell the worker what to do with the occurrence: retry, give up, or stop."""

from __future__ import annotations


class HandlerError(Exception):
    """Base of the errors with a meaning for the retry policy (ARCHITECTURE rule 6)."""


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
    """Raised by a handler that honoured its cancel_event (seed 004's AbortSignal): it stopped before finishing."""
