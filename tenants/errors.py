"""The refusals of the tenant services (tokens, webhook secrets, notifications); the API maps each to one status, as
it maps the control plane's own (schedules/errors.py, which this layer sits below)."""

from __future__ import annotations


class FieldsInvalid(Exception):
    """Fields break a rule; `errors` maps each field to its messages (a 400)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


class LimitReached(Exception):
    """A tenant holds the most it may (a 429 with Retry-After)."""

    def __init__(self, message: str, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_seconds = retry_after_seconds


class ChangeRefused(Exception):
    """The change contradicts the current state (a 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
