"""Helpers shared by integration test modules that drive the materializer with a chosen clock."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from dispatch.engine.materializer import Materializer
from dispatch.models import ProcessHeartbeat, ShardLease


def materializer_holding_every_shard(name: str) -> Materializer:
    """A materializer that holds every shard: leases and heartbeats left by other processes are cleared first
    (inside the test transaction), so no schedule of the test sits on a shard it does not own."""
    ProcessHeartbeat.objects.all().delete()
    ShardLease.objects.update(owner="", expires_at=None)
    materializer = Materializer(name)
    materializer.maintain_leases()
    assert len(materializer.leases) == settings.SCHEDULER_SHARDS
    return materializer


def run_materializer(materializer: Materializer, *instants: datetime) -> None:
    """Materialize everything due at each instant in turn, as the loop would at those moments."""
    for now in instants:
        while materializer.step(now=now):
            pass


def occurrence_row(schedule, *, at: datetime, version: int | None = None, state: str = "scheduled", **fields):
    """An occurrence of `schedule` at `at` with its deterministic id, written directly (no materializer)."""
    from dispatch.identity import occurrence_id_for
    from dispatch.models import Occurrence

    version = schedule.version if version is None else version
    return Occurrence.objects.create(
        occurrence_id=occurrence_id_for(schedule.id, version, at),
        schedule=schedule,
        tenant_id=schedule.tenant_id,
        schedule_version=version,
        scheduled_for=at,
        available_at=at,
        lane=schedule.lane,
        priority=schedule.priority,
        state=state,
        **fields,
    )
