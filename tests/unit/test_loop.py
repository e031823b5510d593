"""run_loop and StopFlag: step while busy, nap when idle, outlive failing steps, stop when told."""

from __future__ import annotations

import logging
import platform
import threading
import time

import pytest

from dispatch.engine.loop import (
    MAX_ERROR_BACKOFF_SECONDS,
    TRIM_NAP_AT_LEAST,
    IdleTrim,
    StopFlag,
    return_free_memory,
    run_loop,
)


class RecordingStop(StopFlag):
    """A real StopFlag that records every nap the loop asks for instead of taking it."""

    def __init__(self) -> None:
        super().__init__()
        self.naps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)


class Script:
    """A fake step that plays its outcomes in turn (a bool is returned, an exception raised) and sets the stop flag
    as it plays the last one."""

    def __init__(self, stop: StopFlag, *outcomes: bool | Exception) -> None:
        self.stop = stop
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if not self.outcomes:
            self.stop.set()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


@pytest.fixture
def stop() -> RecordingStop:
    return RecordingStop()


def boom() -> RuntimeError:
    return RuntimeError("database went away")


# --- busy and idle --------------------------------------------------------------------------------------------


def test_the_loop_steps_again_at_once_while_the_step_reports_work(stop):
    step = Script(stop, True, True, True, False)

    run_loop(step, stop, idle_seconds=60, once=True)

    assert step.calls == 4
    assert stop.naps == [], "a busy loop never naps"


def test_with_once_the_loop_returns_at_the_first_idle_step(stop):
    step = Script(stop, False, True)  # the second outcome would only be played by a loop that went on

    run_loop(step, stop, idle_seconds=60, once=True)

    assert step.calls == 1
    assert not stop.is_set


def test_without_once_an_idle_loop_naps_idle_seconds_and_steps_again(stop):
    step = Script(stop, False, True, False, True)

    run_loop(step, stop, idle_seconds=0.25)

    assert step.calls == 4
    assert stop.naps == [0.25, 0.25]


def test_idle_seconds_may_be_a_callable_that_is_asked_at_each_idle_step(stop):
    asked = iter([0.1, 0.2, 0.3])
    step = Script(stop, False, False, True)

    run_loop(step, stop, idle_seconds=lambda: next(asked))

    assert stop.naps == [0.1, 0.2]


# --- failing steps --------------------------------------------------------------------------------------------


def test_a_failing_step_is_retried_after_the_backoff_instead_of_ending_the_loop(stop):
    step = Script(stop, boom(), True)

    run_loop(step, stop, idle_seconds=60, error_backoff_seconds=0.5)

    assert step.calls == 2
    assert stop.naps == [0.5]


def test_with_once_a_failing_step_raises_and_is_not_retried(stop):
    step = Script(stop, boom(), True)

    with pytest.raises(RuntimeError, match="database went away"):
        run_loop(step, stop, idle_seconds=60, once=True, error_backoff_seconds=0.5)

    assert step.calls == 1
    assert stop.naps == []


def test_consecutive_failures_double_the_backoff_and_a_good_step_starts_it_over(stop):
    step = Script(stop, boom(), boom(), boom(), True, boom(), True)

    run_loop(step, stop, idle_seconds=60, error_backoff_seconds=1.0)

    assert stop.naps == [1.0, 2.0, 4.0, 1.0]


def test_the_backoff_of_a_long_outage_stops_growing_at_the_cap(stop):
    step = Script(stop, *(boom() for _ in range(8)), True)

    run_loop(step, stop, idle_seconds=60, error_backoff_seconds=10.0)

    assert stop.naps == [10.0, 20.0] + [MAX_ERROR_BACKOFF_SECONDS] * 6


def test_an_outage_of_more_than_a_thousand_failed_steps_does_not_end_the_loop(stop):
    step = Script(stop, *(boom() for _ in range(1100)), True)

    run_loop(step, stop, idle_seconds=60, error_backoff_seconds=1.0)

    assert step.calls == 1101
    assert max(stop.naps) == MAX_ERROR_BACKOFF_SECONDS


def test_on_error_gets_each_failure_before_the_retry(stop):
    failures = [boom(), ValueError("bad row")]
    seen: list[BaseException] = []
    step = Script(stop, *failures, True)

    run_loop(step, stop, idle_seconds=60, error_backoff_seconds=0.5, on_error=seen.append)

    assert seen == failures


def test_a_failing_on_error_does_not_end_the_loop_either(stop):
    def on_error(exc: BaseException) -> None:
        raise OSError("cannot even close the connection")

    step = Script(stop, boom(), True)

    run_loop(step, stop, idle_seconds=60, error_backoff_seconds=0.5, on_error=on_error)

    assert step.calls == 2
    assert stop.naps == [0.5]


def test_an_outage_is_logged_once_with_its_traceback_and_once_when_it_ends(stop, caplog):
    step = Script(stop, boom(), boom(), boom(), True)

    with caplog.at_level(logging.DEBUG, logger="dispatch.engine.loop"):
        run_loop(step, stop, idle_seconds=60, error_backoff_seconds=0.5)

    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.exc_info is not None
    assert str(error.exc_info[1]) == "database went away", "the first failure is logged with its traceback"
    [recovered] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "recovered after 3 failed steps" in recovered.getMessage()


# --- stopping -------------------------------------------------------------------------------------------------


def test_a_loop_whose_stop_flag_is_already_set_runs_no_step(stop):
    stop.set()
    step = Script(stop, True)

    run_loop(step, stop, idle_seconds=60)

    assert step.calls == 0


def test_setting_the_stop_flag_during_a_busy_step_ends_the_loop_after_that_step(stop):
    calls = []

    def step() -> bool:
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        return True

    run_loop(step, stop, idle_seconds=60)

    assert len(calls) == 3


def test_a_stop_from_another_thread_wakes_an_idle_loop_at_once():
    stop = StopFlag()
    calls = []

    def step() -> bool:
        calls.append(1)
        return False

    threading.Timer(0.05, stop.set).start()
    started = time.monotonic()
    run_loop(step, stop, idle_seconds=30)

    assert time.monotonic() - started < 5, "the 30 s nap was cut short by the flag"
    assert calls == [1]


def test_a_stop_flag_naps_not_at_all_for_a_negative_time_or_once_it_is_set():
    stop = StopFlag()
    started = time.monotonic()
    stop.sleep(-5)
    stop.set()
    stop.sleep(30)

    assert stop.is_set
    assert time.monotonic() - started < 1


def test_free_memory_goes_back_through_the_c_allocator():
    assert return_free_memory() is (platform.libc_ver()[0] == "glibc"), "malloc_trim runs wherever glibc does"


def test_an_idle_trim_waits_for_its_interval_and_for_a_nap_long_enough_to_hold_it():
    now = [100.0]
    trim = IdleTrim(every=60.0, clock=lambda: now[0])

    assert not trim.before_nap(5.0), "not before the first interval has passed"
    now[0] += 60.0
    assert not trim.before_nap(TRIM_NAP_AT_LEAST / 2), "a short nap is left alone: due work follows it"
    trim.before_nap(1.0)
    assert trim.trims == 1
    now[0] += 59.0
    trim.before_nap(1.0)
    assert trim.trims == 1, "at most one trim an interval"
    now[0] += 1.0
    trim.before_nap(1.0)
    assert trim.trims == 2
