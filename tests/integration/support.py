"""Helpers shared by integration test modules: the materializer driven with a chosen clock, the console's schedule
change form filled in."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings

from dispatch.engine.materializer import Materializer
from dispatch.models import Occurrence, ProcessHeartbeat, ShardLease
from dispatch.reconcile import reconcile
from schedules.models import Schedule

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


def split_instant(name: str, value: datetime | None) -> dict[str, str]:
    """A date and time field of the console's forms as it renders `value` (UTC), or empty."""
    value = value.astimezone(UTC) if value else None
    return {f"{name}_0": f"{value:%Y-%m-%d}" if value else "", f"{name}_1": f"{value:%H:%M:%S}" if value else ""}


def form_data(schedule: Schedule, **overrides) -> dict:
    """The change form as the console renders it for `schedule`, with `overrides` typed in, submitted with Save."""
    data = {
        "seen_version": schedule.version,
        "name": schedule.name,
        "kind": schedule.kind,
        "cron": schedule.cron or "",
        "run_at_0": "",
        "run_at_1": "",
        "timezone": schedule.timezone,
        "dst_gap": schedule.dst_gap or "",
        "dst_repeat": schedule.dst_repeat or "",
        **split_instant("start_at", schedule.start_at),
        **split_instant("end_at", schedule.end_at),
        "max_runs": schedule.max_runs or "",
        "exclude_calendars": ",".join(schedule.exclude_calendars or []),
        "handler": schedule.handler,
        "payload": "{}",
        "lane": schedule.lane,
        "flexible_window_seconds": schedule.flexible_window_seconds,
        "priority": schedule.priority,
        "misfire_policy": schedule.misfire_policy,
        "max_lateness_seconds": schedule.max_lateness_seconds,
        "catchup_limit": schedule.catchup_limit,
        "overlap_policy": schedule.overlap_policy,
        "max_attempts": schedule.max_attempts,
        "_save": "Save",
    }
    data.update(overrides)
    return data


def materialize_as_previewed(
    name: str, previews: dict[uuid.UUID, list[datetime]], *, since: datetime, until: datetime, tenant_id: int
) -> dict[uuid.UUID, set[str]]:
    """Drive a materializer holding every shard to a minute before each previewed fire, then to `until`, and check
    that each schedule's rows are exactly its previewed fires and that reconcile expects exactly those. A fire the
    materializer found that the preview did not list would be written too (missed, late), and a listed one it skipped
    would be absent. Returns each schedule's row states, for the caller's own check."""
    materializer = materializer_holding_every_shard(name)
    instants = sorted({fire - timedelta(minutes=1) for fires in previews.values() for fire in fires})
    run_materializer(materializer, *instants, until)
    states = {}
    for schedule_id, fires in previews.items():
        rows = Occurrence.objects.filter(schedule_id=schedule_id, scheduled_for__lt=until, manual=False)
        assert list(rows.order_by("scheduled_for").values_list("scheduled_for", flat=True)) == fires, schedule_id
        states[schedule_id] = set(rows.values_list("state", flat=True))
    report = reconcile(since=since, until=until, tenant_id=tenant_id, now=until)
    assert report.ok, report.as_dict(gap_limit=5)
    assert report.expected == sum(len(fires) for fires in previews.values())
    return states
