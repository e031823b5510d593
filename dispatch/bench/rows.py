"""What the benchmarks share: their tenants' names and quotas, their queues, and the schedule rows they COPY."""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings

from core.shards import shard_for
from schedules.models import PLANNING_FIELDS

BENCH_TENANT_PREFIX = "bench-"
# Named after the database: two benches (or a bench and a test run) on one broker, each on its own database, must
# never share a queue (one's workers would consume, and drop, the other's envelopes; its cleanup would delete them).
_BENCH_DB = str(settings.DATABASES["default"]["NAME"])
BENCH_STRICT_QUEUE = f"bench.{_BENCH_DB}.strict"
BENCH_FLEXIBLE_QUEUE = f"bench.{_BENCH_DB}.flexible"
# Bench tenants' quotas, far above anything a run reaches.
UNTHROTTLED: dict[str, Any] = {
    "max_schedules": 10**9,
    "max_fires_per_second": 10**9,
    "max_running": 10**9,
    "max_catchup_per_minute": 10**9,
}


PLANNING = ", ".join(PLANNING_FIELDS)
# The columns of the schedule rows the benchmarks COPY (schedule_row), in this order.
SCHEDULE_COLUMNS = (
    "id, tenant_id, name, kind, cron, every_seconds, anchor_at, timezone, lane, flexible_window_seconds, priority, "
    "handler, payload, misfire_policy, max_lateness_seconds, catchup_limit, overlap_policy, max_attempts, state, "
    "version, shard, created_by, created_at, updated_at"
)
# The API's largest max lateness (a week): the benches measure delivery and execution, not the misfire rule, so a
# fire still queued behind a burst when a worker claims it must run, not end missed.
BENCH_MAX_LATENESS_SECONDS = 7 * 24 * 3600


def schedule_row(
    schedule_id: uuid.UUID,
    tenant_id: int,
    name: str,
    *,
    handler: str,
    now: datetime,
    cron: str | None = None,
    every_seconds: int | None = None,
    anchor_at: datetime | None = None,
    lane: str = "strict",
    flexible_window_seconds: int = 300,
) -> tuple:
    """One active schedule row in SCHEDULE_COLUMNS order, as the API would have written it (version 1, UTC)."""
    return (
        schedule_id,
        tenant_id,
        name,
        "interval" if every_seconds is not None else "cron",
        cron,
        every_seconds,
        anchor_at,
        "UTC",
        lane,
        flexible_window_seconds,
        0,
        handler,
        "{}",
        "skip",
        BENCH_MAX_LATENESS_SECONDS,
        10,
        "allow",
        5,
        "active",
        1,
        shard_for(schedule_id),
        "bench",
        now,
        now,
    )


class BenchRefused(Exception):
    """The benchmark would disturb real work; the message says what to do instead."""


# The holiday calendar each bench tenant gets under `bench burst --calendar-dates`.
BENCH_CALENDAR = "bench-holidays"


def name_holiday_calendars(cursor: Any, tenant_ids: list[int], first: date, count: int) -> None:
    """A calendar per tenant of `count` days from `first`, as the API would have written it (with its first
    revision), named by each of the tenant's due schedules (before their cursors are written from them)."""
    dates = json.dumps([(first + timedelta(days=n)).isoformat() for n in range(count)])
    # An earlier run's, where its tenants were kept (--keep-idle).
    cursor.execute(
        "DELETE FROM schedules_calendar WHERE tenant_id = ANY(%s) AND name = %s", [tenant_ids, BENCH_CALENDAR]
    )
    for tenant_id in tenant_ids:
        cursor.execute(
            "INSERT INTO schedules_calendar (tenant_id, name, dates, ranges, description, revision, created_at,"
            " updated_at) VALUES (%s, %s, %s, '[]', '', 1, now(), now())",
            [tenant_id, BENCH_CALENDAR, dates],
        )
        cursor.execute(
            "INSERT INTO schedules_calendarrevision (tenant_id, name, revision, dates, ranges, valid_from)"
            " VALUES (%s, %s, 1, %s, '[]', now())",
            [tenant_id, BENCH_CALENDAR, dates],
        )
    cursor.execute(
        "UPDATE schedules_schedule SET exclude_calendars = %s WHERE tenant_id = ANY(%s) AND name LIKE 'bench-due-%%'",
        [[BENCH_CALENDAR], tenant_ids],
    )
