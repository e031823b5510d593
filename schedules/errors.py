"""Domain errors raised by the services of both planes; the API maps each to one HTTP status."""

from __future__ import annotations


class ScheduleInvalid(Exception):
    """The definition breaks a rule; `errors` maps each field to its messages (rendered as a 400)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


class QuotaExceeded(Exception):
    """A tenant quota is used up (429 with Retry-After)."""

    def __init__(self, message: str, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_seconds = retry_after_seconds


class StateConflict(Exception):
    """The request is valid but contradicts the current state or an earlier request (409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Gone(Exception):
    """What the request named was deleted by another request meanwhile (404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
