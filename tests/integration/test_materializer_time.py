"""Time passing through the real materializer: DST nights in odd zones and a simulated week, against brute force."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db.models import F

from dispatch.models import Occurrence
from dispatch.reconcile import reconcile
from schedules.models import Schedule
from tests.integration.support import materializer_holding_every_shard, run_materializer

# Each cron of the DST nights with the wall-clock times it matches, written out by hand so that the expectation
# owes nothing to the cron parser.
NIGHTLY: dict[str, Callable[[datetime], bool]] = {
    "30 1 * * *": lambda wall: (wall.hour, wall.minute) == (1, 30),
    "30 2 * * *": lambda wall: (wall.hour, wall.minute) == (2, 30),
    "*/15 1-3 * * *": lambda wall: wall.hour in (1, 2, 3) and wall.minute % 15 == 0,
}


def z(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# (zone, local date of the change, the change, fires of "30 1" and "30 2" that night, fires of "*/15 1-3").
DST_NIGHTS = [
    ("America/New_York", date(2026, 3, 8), "02:00 -> 03:00", [z(2026, 3, 8, 6, 30)], [], 8),
    ("America/New_York", date(2026, 11, 1), "02:00 -> 01:00", [z(2026, 11, 1, 5, 30)], [z(2026, 11, 1, 7, 30)], 12),
    ("Europe/London", date(2026, 3, 29), "01:00 -> 02:00", [], [z(2026, 3, 29, 1, 30)], 8),
    ("Europe/London", date(2026, 10, 25), "02:00 -> 01:00", [z(2026, 10, 25, 0, 30)], [z(2026, 10, 25, 2, 30)], 12),
    # Lord Howe Island moves its clocks by 30 minutes.
    ("Australia/Lord_Howe", date(2026, 4, 5), "02:00 -> 01:30", [z(2026, 4, 4, 14, 30)], [z(2026, 4, 4, 16)], 12),
    ("Australia/Lord_Howe", date(2026, 10, 4), "02:00 -> 02:30", [z(2026, 10, 3, 15)], [z(2026, 10, 3, 15, 30)], 10),
]


def brute_force_fires(matches: Callable[[datetime], bool], zone: ZoneInfo, since: datetime, until: datetime):
    """Every UTC minute in (since, until) read on the zone's wall clock: a matching wall time fires at the first
    instant it is shown. A skipped wall time is never shown; a repeated one is shown twice and fires once."""
    fires: list[datetime] = []
    seen: set[datetime] = set()
    instant = since.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while instant < until:
        wall = instant.astimezone(zone).replace(tzinfo=None)
        if matches(wall) and wall not in seen:
            seen.add(wall)
            fires.append(instant)
        instant += timedelta(minutes=1)
    return fires


def every(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    instants = []
    while start <= end:
        instants.append(start)
        start += step
    return instants


def fires_of(schedule: Schedule, until: datetime) -> list[datetime]:
    return list(
        Occurrence.objects.filter(schedule=schedule, scheduled_for__lt=until)
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
    )


@pytest.mark.parametrize(
    ("zone_name", "day", "change", "at_0130", "at_0230", "quarter_hours"),
    DST_NIGHTS,
    ids=[f"{zone}-{day}" for zone, day, *_ in DST_NIGHTS],
)
def test_a_dst_night_materialized_as_time_passes_fires_each_existing_wall_time_once_at_its_first_instant(
    tenant_a, make_schedule, zone_name, day, change, at_0130, at_0230, quarter_hours
):
    zone = ZoneInfo(zone_name)
    # From 22:00 the evening before to 05:00 local, read on a clock that is never ambiguous then.
    start = datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC) - timedelta(hours=2)
    end = datetime(day.year, day.month, day.day, 5, tzinfo=zone).astimezone(UTC)
    schedules = {
        cron: make_schedule(tenant_a.tenant, now=start, name=f"night {cron}", cron=cron, timezone=zone_name)
        for cron in NIGHTLY
    }
    materializer = materializer_holding_every_shard("dst-night")
    # Steps shorter than the horizon: every fire is materialized before it is due, none is late.
    run_materializer(materializer, *every(start, end, timedelta(minutes=2)))

    for cron, schedule in schedules.items():
        fires = fires_of(schedule, end)
        assert fires == brute_force_fires(NIGHTLY[cron], zone, start, end), (cron, change)
        walls = [fire.astimezone(zone).replace(tzinfo=None) for fire in fires]
        assert len(set(walls)) == len(walls), "each (local date, time) fires at most once"
        assert set(Occurrence.objects.filter(schedule=schedule).values_list("state", flat=True)) <= {"scheduled"}
    assert fires_of(schedules["30 1 * * *"], end) == at_0130, "skipped when it does not exist, else its first instant"
    assert fires_of(schedules["30 2 * * *"], end) == at_0230
    assert len(fires_of(schedules["*/15 1-3 * * *"], end)) == quarter_hours


@pytest.mark.slow
def test_a_week_of_simulated_time_leaves_one_occurrence_per_expected_fire_and_reconcile_ok(tenant_a, make_schedule):
    london = ZoneInfo("Europe/London")
    # The week holds London's fall-back night (25 October): 01:00-01:59 is shown twice and fires once.
    start = datetime(2026, 10, 21, 0, 7, 30, tzinfo=UTC)
    end = start + timedelta(days=7)
    minutely = make_schedule(
        tenant_a.tenant,
        now=start,
        name="minutely",
        cron="* * * * *",
        timezone="Europe/London",
        misfire_policy="catch_up",
        catchup_limit=5,
    )
    hourly = make_schedule(
        tenant_a.tenant,
        now=start,
        name="hourly",
        cron="0 * * * *",
        timezone="Europe/London",
        misfire_policy="fire_once",
    )
    materializer = materializer_holding_every_shard("a-week")
    # The materializer wakes every 30 minutes of simulated time: most fires are late by then and the misfire
    # policies decide, but every one of them gets its row.
    run_materializer(materializer, *every(start, end, timedelta(minutes=30)))

    expected = {
        minutely: brute_force_fires(lambda wall: True, london, start, end),
        hourly: brute_force_fires(lambda wall: wall.minute == 0, london, start, end),
    }
    assert len(expected[minutely]) == 7 * 24 * 60 - 60 and len(expected[hourly]) == 7 * 24 - 1
    for schedule, fires in expected.items():
        assert fires_of(schedule, end) == fires, schedule.name
        reasons = Occurrence.objects.filter(schedule=schedule, state="missed").values_list("state_reason", flat=True)
        assert all(reason.startswith("late by ") for reason in reasons), schedule.name
    assert Occurrence.objects.filter(schedule=minutely, state="missed").count() > 6 * 24 * 2 * 20
    # fire_once: the fire at hh:00 is 7 minutes late at hh:07:30 and is released; none is ever missed.
    assert not Occurrence.objects.filter(schedule=hourly, state="missed").exists()
    # catch_up: each wake-up finds the fires since the previous horizon late, and keeps the latest 5 of them.
    wakeups = every(start, end, timedelta(minutes=30))
    kept: list[datetime] = []
    for previous, now in itertools.pairwise(wakeups):
        late = [f for f in expected[minutely] if previous + materializer.horizon < f < now - timedelta(seconds=60)]
        kept.extend(late[-5:])
    caught_up = Occurrence.objects.filter(schedule=minutely, state="scheduled", available_at__gt=F("scheduled_for"))
    assert sorted(caught_up.values_list("scheduled_for", flat=True)) == kept

    report = reconcile(since=start, until=end, now=end, stuck_after_seconds=10**9)
    assert report.ok, report.as_dict(gap_limit=5)
    assert report.expected == sum(1 for fires in expected.values() for fire in fires if fire < report.checked_until)
