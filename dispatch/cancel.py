"""The cancel event of each running handler and timer task: a threading.Event that is cheap until a thread waits."""

from __future__ import annotations

import threading


class CancelEvent(threading.Event):
    """A threading.Event (handlers may rely on that: docs/API.md) whose condition is made at the first wait.

    The worker makes one per occurrence it runs and the timer one per task, and nearly all of them end without a
    thread waiting on them. A full threading.Event is a Condition and a lock: at 2,315 fires a second, making them
    was ~9 % of the worker's Python time (sampled, docs/BENCHMARKS.md "Settling a second later"). Cancellation is
    one-way in the engine; `clear` is kept for the interface.
    """

    _making = threading.Lock()

    def __init__(self) -> None:  # not threading.Event's: its condition is made on demand
        self._flag = False
        self._waitable: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        waitable = self._waitable
        if waitable is not None:
            waitable.set()

    def clear(self) -> None:
        self._flag = False
        waitable = self._waitable
        if waitable is not None:
            waitable.clear()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        with CancelEvent._making:
            if self._waitable is None:
                self._waitable = threading.Event()
        waitable = self._waitable
        # A set() before the waitable existed had nothing to wake; its flag is read after the waitable is in place,
        # so either it sees the waitable or this sees its flag.
        if self._flag:
            waitable.set()
        return waitable.wait(timeout)

    def _at_fork_reinit(self) -> None:
        if self._waitable is not None:
            self._waitable = threading.Event()
