"""An outage of a long-running process: capped exponential backoff, one log line when it starts and one when it ends."""

from __future__ import annotations

import logging

from dispatch.engine.loop import MAX_ERROR_BACKOFF_SECONDS, Outage, StopFlag, run_loop


def test_backoff_doubles_from_the_first_wait_up_to_the_cap():
    outage = Outage(first_backoff_seconds=1.0)
    waits = [outage.failed(ConnectionError("down")) for _ in range(8)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_ERROR_BACKOFF_SECONDS, MAX_ERROR_BACKOFF_SECONDS, 30.0]


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(caplog):
    outage = Outage(first_backoff_seconds=0.0)
    with caplog.at_level(logging.DEBUG, logger="dispatch.engine.loop"):
        for _ in range(50):
            outage.failed(ConnectionError("the connection is closed"))
        outage.succeeded()
        outage.succeeded()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    recoveries = [r for r in caplog.records if "recovered after" in r.getMessage()]
    assert len(errors) == 1 and errors[0].exc_info is not None, "the first failure carries its traceback"
    assert len(recoveries) == 1 and "50 failed steps" in recoveries[0].getMessage()


def test_after_a_recovery_the_next_outage_starts_again_from_the_first_wait():
    outage = Outage(first_backoff_seconds=0.5)
    outage.failed(OSError())
    outage.failed(OSError())
    outage.succeeded()
    assert outage.failed(OSError()) == 0.5


def test_run_loop_resets_what_the_step_depends_on_after_each_failure_and_keeps_going():
    stop = StopFlag()
    calls: list[str] = []
    resets: list[BaseException] = []

    def step() -> bool:
        calls.append("step")
        if len(calls) <= 3:
            raise ConnectionError("the connection is closed")
        stop.set()
        return False

    run_loop(step, stop, idle_seconds=0.0, error_backoff_seconds=0.001, on_error=resets.append)

    assert len(calls) == 4, "three failures did not end the loop"
    assert len(resets) == 3 and all(isinstance(exc, ConnectionError) for exc in resets)
