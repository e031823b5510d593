"""The names of what a run and a message come to, compared across the worker's modules instead of string literals."""

from __future__ import annotations

from enum import StrEnum


class RunOutcome(StrEnum):
    """What running one claimed occurrence came to (RunResult.outcome).

    SUCCEEDED, FAILED and CANCELED are also what its attempt records, and FENCED when the completion was refused
    (another generation owns the occurrence). NOT_RUN and ERROR never reach a row: the envelope runner counts them
    (the message goes back to the broker; a bug is left to the reconciler).
    """

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    FENCED = "fenced"
    NOT_RUN = "not_run"
    ERROR = "error"


class ErrorClass(StrEnum):
    """How a failed run may be retried (docs/ARCHITECTURE.md rule 6); recorded on the attempt."""

    NONE = ""
    PERMANENT = "permanent"
    TRANSIENT = "transient"


class Tally(StrEnum):
    """What a message's occurrences came to besides a new state, counted per message (dispatch/tasks.py).

    DB_ERROR and NOT_RUN hand the message back to the broker; the others are ended or left to run on.
    """

    DB_ERROR = "db_error"
    NOT_RUN = "not_run"
    ERROR = "error"
    PARKED = "parked"  # the tenant's share of the pool was full: offered again after a recheck delay
    DROPPED = "dropped"  # not claimable, or ended or claimed elsewhere meanwhile
    HANDED_BACK = "handed_back"  # not started within the message's turn: given back under its own id
    DETACHED = "detached"  # still running when the turn ended: completes itself
