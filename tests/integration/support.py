"""Helpers shared by integration test modules that drive the materializer with a chosen clock."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from dispatch.engine.materializer import Materializer
from dispatch.models import ProcessHeartbeat, ShardLease

# The horizon the timelines of these tests are drawn for (a fire materialized 90 s ahead, say), whatever the
# deployment's default is.
TEST_HORIZON_SECONDS = 180.0


def materializer_holding_every_shard(name: str) -> Materializer:
    """A materializer that holds every shard: leases and heartbeats left by other processes are cleared first
    (inside the test transaction), so no schedule of the test sits on a shard it does not own."""
    ProcessHeartbeat.objects.all().delete()
    ShardLease.objects.update(owner="", expires_at=None)
    materializer = Materializer(name, horizon_seconds=TEST_HORIZON_SECONDS)
    materializer.maintain_leases()
    assert len(materializer.leases) == settings.SCHEDULER_SHARDS
    return materializer


def run_materializer(materializer: Materializer, *instants: datetime) -> None:
    """Materialize everything due at each instant in turn, as the loop would at those moments."""
    for now in instants:
        while materializer.step(now=now):
            pass
