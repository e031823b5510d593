"""The steady benchmark's stall watch: a host that stood still is reported with the run, not taken for its lag."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from dispatch.bench import sampling


class SteppingClock:
    """A monotonic clock that reads out the given instants and stops the sampler it watches at the last one."""

    def __init__(self, instants: list[float], stop: threading.Event) -> None:
        self.instants = list(instants)
        self.stop = stop

    def __call__(self) -> float:
        if len(self.instants) == 1:
            self.stop.set()
        return self.instants.pop(0)


def test_the_stall_watch_reports_a_wake_up_two_seconds_late_and_nothing_for_ordinary_ticks(monkeypatch):
    sampler = sampling.Sampler("", {}, window_start=datetime.now(UTC))
    monkeypatch.setattr(sampling.time, "monotonic", SteppingClock([0.0, 0.2, 0.45, 3.65, 3.85], sampler._stop))
    monkeypatch.setattr(sampling, "STALL_TICK_SECONDS", 0.0)

    sampler._watch_stalls()

    stalls = sampler.readings.host_stalls
    assert [seconds for _, seconds in stalls] == [3.2], "one stall: the tick from 0.45 to 3.65 s"
