"""Queue names per lane: strict work never waits behind flexible work because they never share a queue."""

from __future__ import annotations

STRICT_QUEUE = "scheduler.strict"
FLEXIBLE_QUEUE = "scheduler.flexible"
ALL_QUEUES = (STRICT_QUEUE, FLEXIBLE_QUEUE)


def queue_for_lane(lane: str) -> str:
    return FLEXIBLE_QUEUE if lane == "flexible" else STRICT_QUEUE
