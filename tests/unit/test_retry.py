"""The retry policy (dispatch.engine.retry): full-jitter backoff bounds, and what a handler's exception comes to."""

from __future__ import annotations

import logging
import random
import uuid

import pytest

from dispatch.engine.retry import ERROR_MAX_CHARS, RunResult, backoff_for, classify, retry_backoff
from dispatch.errors import CanceledError, PermanentError, TransientError

OCCURRENCE = uuid.UUID("5b0e3c1d-7f2a-4e6b-8c9d-0a1b2c3d4e5f")


class Least:
    """An rng that always draws the low end."""

    def uniform(self, low: float, high: float) -> float:
        return low


class Recorder:
    """An rng that records the range it is asked for and answers its top."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, float]] = []

    def uniform(self, low: float, high: float) -> float:
        self.asked.append((low, high))
        return high


def classified(exc: Exception, cancel_reason: str | None = None) -> RunResult:
    """classify() as the worker calls it: inside the handler's `except`."""
    try:
        raise exc
    except Exception as raised:
        return classify(raised, handler="effect", occurrence_id=OCCURRENCE, cancel_reason=cancel_reason)


# --- retry_backoff --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("base", "cap"), [(1.0, 300.0), (0.25, 10.0), (5.0, 5.0), (2.0, 1000.0)])
def test_equal_jitter_stays_between_half_and_all_of_the_doubling_ceiling_capped(base, cap):
    rng = random.Random(42)
    for attempt in range(1, 16):
        ceiling = min(cap, base * 2 ** (attempt - 1))
        for _ in range(200):
            assert ceiling / 2 <= retry_backoff(attempt, base=base, cap=cap, rng=rng) <= ceiling


def test_the_jitter_is_drawn_uniformly_over_the_upper_half_of_the_ceiling():
    rng = Recorder()

    for attempt in (1, 2, 3, 4, 7, 8, 30):
        retry_backoff(attempt, base=0.5, cap=40, rng=rng)

    assert rng.asked == [(0, 0.25), (0, 0.5), (0, 1.0), (0, 2.0), (0, 16.0), (0, 20), (0, 20)]


def test_the_jitter_spreads_retries_over_the_upper_half():
    rng = random.Random(7)

    waits = [retry_backoff(6, base=1, cap=300, rng=rng) for _ in range(2000)]

    assert min(waits) < 0.55 * 32 and max(waits) > 0.95 * 32, "a burst of failures does not retry in step"
    assert min(waits) >= 16 and len(set(waits)) == len(waits)


def test_the_default_policy_bridges_a_target_down_for_several_seconds(settings):
    """A target restarting for a few seconds must not send the fire to the DLQ: under the defaults (base 2 s, five
    attempts) the fifth attempt comes at least 15 s after the first, whatever the jitter draws (full jitter let all
    four retries land within the first two seconds: "retries 0.4-0.7 s apart")."""
    assert settings.SCHEDULER_RETRY_BASE_SECONDS == 2.0
    least = Least()
    waits = [retry_backoff(n, base=2.0, cap=300.0, rng=least) for n in (1, 2, 3, 4)]
    assert sum(waits) >= 15


def test_a_schedules_own_policy_replaces_the_platform_settings(settings):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 2
    settings.SCHEDULER_RETRY_CAP_SECONDS = 300
    failed = RunResult("failed", "transient", retry_after=None)

    assert all(5 <= backoff_for(failed, attempt=1, base=10, cap=3600) <= 10 for _ in range(50))
    assert all(60 <= backoff_for(failed, attempt=2, base=60, cap=3600) <= 120 for _ in range(50))


def test_an_attempt_below_one_waits_no_longer_than_the_first():
    assert retry_backoff(0, base=3, cap=100, rng=Recorder()) == 3
    assert retry_backoff(-4, base=3, cap=100, rng=Recorder()) == 3


def test_a_zero_cap_means_retry_at_once():
    assert {retry_backoff(n, base=1, cap=0, rng=random.Random(n)) for n in range(1, 10)} == {0}


def test_without_an_rng_the_module_random_stays_inside_the_bounds():
    assert all(4 <= retry_backoff(4, base=1, cap=300) <= 8 for _ in range(500))


def test_a_retry_after_raises_the_backoff_but_never_past_the_cap(settings):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 0
    settings.SCHEDULER_RETRY_CAP_SECONDS = 60

    assert backoff_for(RunResult("failed", "transient", retry_after=None), attempt=3) == 0
    assert backoff_for(RunResult("failed", "transient", retry_after=12.5), attempt=3) == 12.5
    assert backoff_for(RunResult("failed", "transient", retry_after=3600), attempt=3) == 60


# --- classify -------------------------------------------------------------------------------------------------


def test_a_permanent_error_fails_the_attempt_as_permanent():
    assert classified(PermanentError("404 from target")) == RunResult(
        "failed", "permanent", "PermanentError: 404 from target"
    )


def test_a_transient_error_fails_as_transient_and_keeps_its_retry_after():
    result = classified(TransientError("503 from target", retry_after=17.5))

    assert result == RunResult("failed", "transient", "TransientError: 503 from target", retry_after=17.5)


def test_a_transient_error_without_retry_after_has_none():
    assert classified(TransientError("timeout")).retry_after is None


@pytest.mark.parametrize(
    "exc", [CanceledError("stopped early"), ValueError("bug"), KeyError("k"), OSError("refused")], ids=repr
)
def test_a_cancel_or_any_other_exception_fails_as_transient(exc):
    result = classified(exc)

    assert (result.outcome, result.error_class, result.retry_after) == ("failed", "transient", None)
    assert result.error == f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize(
    "exc", [PermanentError("p"), TransientError("t", retry_after=5), CanceledError("c"), ValueError("v")], ids=repr
)
def test_a_handler_stopped_because_its_schedule_changed_is_canceled_whatever_it_raised(exc):
    result = classified(exc, cancel_reason="schedule_changed")

    assert result == RunResult("canceled", "", f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("cancel_reason", ["lease_lost", "deadline", None])
def test_a_cancel_for_any_other_reason_is_a_transient_failure(cancel_reason):
    result = classified(CanceledError("honoured the cancel event"), cancel_reason=cancel_reason)

    assert (result.outcome, result.error_class) == ("failed", "transient")


def test_an_unexpected_exception_is_logged_with_its_traceback_and_occurrence(caplog):
    with caplog.at_level(logging.ERROR, logger="dispatch.engine.retry"):
        classified(ZeroDivisionError("division by zero"))

    [record] = caplog.records
    assert record.exc_info is not None and isinstance(record.exc_info[1], ZeroDivisionError)
    assert record.occurrence_id == str(OCCURRENCE)
    assert "effect" in record.getMessage()


@pytest.mark.parametrize(
    "exc", [PermanentError("p"), TransientError("t"), CanceledError("c")], ids=["permanent", "transient", "canceled"]
)
def test_the_errors_a_handler_raises_on_purpose_are_not_logged_as_crashes(exc, caplog):
    with caplog.at_level(logging.DEBUG, logger="dispatch.engine.retry"):
        classified(exc)

    assert caplog.records == []


def test_the_error_message_is_cut_to_its_head():
    result = classified(ValueError("x" * (3 * ERROR_MAX_CHARS)))

    assert len(result.error) == ERROR_MAX_CHARS
    assert result.error.startswith("ValueError: xxx")


def test_a_schedules_base_above_the_platform_cap_is_not_cut_down_to_it(settings):
    settings.SCHEDULER_RETRY_CAP_SECONDS = 300
    failed = RunResult("failed", "transient", retry_after=None)
    assert all(1800 <= backoff_for(failed, attempt=1, base=3600, cap=None) <= 3600 for _ in range(50))
