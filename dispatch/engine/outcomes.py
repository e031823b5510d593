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


class DropReason(StrEnum):
    """Why a delivery was not run (Drop.reason): the worker's claim-drop metric label and log field."""

    UNKNOWN = "unknown"  # the claim's own statement failed: the reconciler decides
    LOST_RACE = "lost_race"  # the row changed under a conditional update that the lock should have prevented
    TERMINAL = "terminal"
    DUPLICATE = "duplicate"  # another attempt holds a live lease
    DUPLICATE_ATTEMPT = "duplicate_attempt"  # this generation's attempt row already exists
    EARLY = "early"  # a retry delivered before its available_at
    POOL_SHARE = "pool_share"  # the tenant's share of the worker pool was full: parked, offered again
    RUNNING_QUOTA = "running_quota"
    SCHEDULE_CHANGED = "schedule_changed"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    DEADLINE_PASSED = "deadline_passed"
    MISSED = "missed"
    OVERLAP_SKIPPED = "overlap_skipped"
    OVERLAP_WAITING = "overlap_waiting"

    @property
    def is_suspicious(self) -> bool:
        """A drop that points at a bug or a race rather than a rule: logged as a warning."""
        return self in (DropReason.UNKNOWN, DropReason.LOST_RACE, DropReason.DUPLICATE_ATTEMPT)


class CancelReason(StrEnum):
    """Why a running handler's cancel event was set (its lease ticket's reason)."""

    DEADLINE = "deadline"
    LEASE_MAX_LIFETIME = "lease_max_lifetime"
    LEASE_LOST = "lease_lost"
    SCHEDULE_CHANGED = "schedule_changed"
