"""Queue names per lane: strict work never waits behind flexible work because they never share a queue, and within
a lane a fire due alone never waits behind a whole crowd, which goes to the lane's crowd queue.

Names come from settings so a benchmark (or a second deployment on one broker) can use its own queues.
"""

from __future__ import annotations

from django.conf import settings

from core.choices import Lane

STRICT_QUEUE: str = settings.SCHEDULER_STRICT_QUEUE
FLEXIBLE_QUEUE: str = settings.SCHEDULER_FLEXIBLE_QUEUE
ALL_QUEUES = (STRICT_QUEUE, FLEXIBLE_QUEUE)
# What a crowd queue's name adds to its lane's (dispatch/engine/publishing.py CrowdRouter).
CROWD_SUFFIX = ".crowd"


def crowd_queue(queue: str) -> str:
    """The queue beside a lane's queue that a crowded instant's messages go to (SCHEDULER_CROWD_FIRES)."""
    return f"{queue}{CROWD_SUFFIX}"


def with_crowds(*queues: str) -> tuple[str, ...]:
    """Each lane queue followed by its crowd queue: what a worker consumes, a relay declares, a cleanup deletes."""
    return tuple(name for queue in queues for name in (queue, crowd_queue(queue)))


# Every queue the relays publish to and the workers consume.
CONSUMED_QUEUES = with_crowds(*ALL_QUEUES)


def queue_arguments(queue_type: str | None = None) -> dict[str, str]:
    """The x-arguments every declaration of the lanes' queues carries (relay, workers, benchmarks alike): RabbitMQ
    refuses a redeclaration whose arguments differ. Classic queues have none; quorum queues (replicated with Raft
    across a cluster's nodes, the type a production cluster uses) are `x-queue-type: quorum`."""
    queue_type = queue_type or settings.SCHEDULER_QUEUE_TYPE
    return {"x-queue-type": "quorum"} if queue_type == "quorum" else {}


def queue_for_lane(lane: str) -> str:
    return FLEXIBLE_QUEUE if lane == Lane.FLEXIBLE else STRICT_QUEUE
