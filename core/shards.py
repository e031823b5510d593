"""Logical shards: the unit a materializer leases, so several can share the schedules without meeting."""

from __future__ import annotations

import uuid

from django.conf import settings


def shard_for(schedule_id: uuid.UUID) -> int:
    """Logical shard of a schedule: uuid4 bits are uniform, so `id mod N` spreads schedules evenly."""
    return schedule_id.int % settings.SCHEDULER_SHARDS
