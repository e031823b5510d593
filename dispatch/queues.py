"""Queue names per lane: strict work never waits behind flexible work because they never share a queue.

Names come from settings so a benchmark (or a second deployment on one broker) can use its own queues.
"""

from __future__ import annotations

from django.conf import settings

STRICT_QUEUE: str = settings.SCHEDULER_STRICT_QUEUE
FLEXIBLE_QUEUE: str = settings.SCHEDULER_FLEXIBLE_QUEUE
ALL_QUEUES = (STRICT_QUEUE, FLEXIBLE_QUEUE)


def queue_for_lane(lane: str) -> str:
    return FLEXIBLE_QUEUE if lane == "flexible" else STRICT_QUEUE
