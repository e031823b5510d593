"""The in-process priority timer (docs/ARCHITECTURE.md, "The priority timer") under the name the public contract
gives it (`dispatch.timer`, docs/API.md "Python: the priority timer").

It lives with the processes that use it, in dispatch/engine/timer.py; this module only hands its names on.
"""

from __future__ import annotations

from dispatch.engine.timer import (
    CANCELLED,
    COMPLETED,
    FAILED,
    HEAP_FACTOR,
    HEAP_SLACK,
    PENDING,
    RUNNING,
    Claimed,
    PriorityTimer,
    State,
    TimerClosed,
)

__all__ = [
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "HEAP_FACTOR",
    "HEAP_SLACK",
    "PENDING",
    "RUNNING",
    "Claimed",
    "PriorityTimer",
    "State",
    "TimerClosed",
]
