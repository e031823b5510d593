"""Interval schedules through the real materializer with a driven clock: DST nights against the preview and a naive
enumeration, an outage under each misfire policy, a change while behind, reconcile's expected set and backfill."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings

from dispatch.backfill import backfill_schedule
from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OccurrenceState
from dispatch.reconcile import reconcile
from schedules import services
from schedules.models import Schedule
from tests.integration.processes import run_manage
from tests.integration.support import materializer_holding_every_shard, run_materializer
from tests.integration.test_api_schedules import SCHEDULES

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 12, 1, tzinfo=UTC)


def z(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


def every(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    instants = []
    while start <= end:
        instants.append(start)
        start += step
    return instants


def naive_fires(anchor: datetime, every_seconds: int, after: datetime, until: datetime) -> list[datetime]:
    """anchor + k x every_seconds strictly after `after` and before `until`, one k at a time."""
    fires, fire = [], anchor
    while fire < until:
        if fire > after:
            fires.append(fire)
        fire += timedelta(seconds=every_seconds)
    return fires


def fires_of(schedule: Schedule, until: datetime, version: int | None = None) -> list[datetime]:
    rows = Occurrence.objects.filter(schedule=schedule, scheduled_for__lt=until, manual=False)
    if version is not None:
        rows = rows.filter(schedule_version=version)
    return list(rows.order_by("scheduled_for").values_list("scheduled_for", flat=True))


# (zone, the UTC instant of its clock change, how the wall clock moves)
DST_NIGHTS = [
    ("America/New_York", z(2026, 3, 8, 7), "02:00 -> 03:00"),
    ("America/New_York", z(2026, 11, 1, 6), "02:00 -> 01:00"),
    ("Europe/London", z(2026, 10, 25, 1), "02:00 -> 01:00"),
    ("Australia/Lord_Howe", z(2026, 10, 3, 15, 30), "02:00 -> 02:30"),
    ("Pacific/Chatham", z(2026, 4, 4, 14), "03:45 -> 02:45"),
    ("America/Santiago", z(2026, 9, 6, 4), "00:00 -> 01:00"),
]


@pytest.mark.parametrize(
    ("zone_name", "change_at", "change"), DST_NIGHTS, ids=[f"{z_}-{c:%m%d}" for z_, c, _ in DST_NIGHTS]
)
def test_a_dst_night_materialized_as_time_passes_is_exactly_the_preview_and_the_naive_enumeration(
    tenant_a, api_a, make_schedule, zone_name, change_at, change
):
    zone = ZoneInfo(zone_name)
    offset_before = (change_at - timedelta(seconds=1)).astimezone(zone).utcoffset()
    assert offset_before != change_at.astimezone(zone).utcoffset(), f"{zone_name} changes its clock at {change_at}"
    start, end = change_at - timedelta(hours=3), change_at + timedelta(hours=3)
    periods = {
        "quarter hour from a local midnight": (900, datetime(2026, 1, 1, tzinfo=zone).astimezone(UTC)),
        "hourly at an odd second": (3600, change_at - timedelta(days=40, seconds=17)),
        "every 1 h 30 min": (5400, start + timedelta(minutes=7)),
        "every 7 s": (7, start + timedelta(seconds=3, microseconds=250_000)),
    }
    schedules = {
        name: make_schedule(
            tenant_a.tenant,
            now=start,
            name=name,
            kind="interval",
            every_seconds=every_s,
            anchor_at=anchor,
            timezone=zone_name,
        )
        for name, (every_s, anchor) in periods.items()
    }
    # What the API's preview says each schedule will fire, asked before the night.
    previews = {name: _preview(api_a, schedule, after=start, until=end) for name, schedule in schedules.items()}
    materializer = materializer_holding_every_shard("interval-dst-night")
    # Steps shorter than the horizon: every fire is materialized before it is due, none is late.
    run_materializer(materializer, *every(start, end, timedelta(minutes=2)))

    for name, schedule in schedules.items():
        every_s, anchor = periods[name]
        fires = fires_of(schedule, end)
        assert fires == naive_fires(anchor, every_s, start, end), (name, change)
        assert fires == [at for at, _ in previews[name]], (name, change)
        assert all(later - earlier == timedelta(seconds=every_s) for earlier, later in itertools.pairwise(fires)), name
        # The preview's local labels are the zone's wall clock, whose offset changes in the middle of the night.
        # (Compared as text: an aware time in a repeated hour never equals one in another zone, PEP 495.)
        labels = dict(previews[name])
        assert all(labels[at] == at.astimezone(zone).isoformat() for at in fires)
        assert {datetime.fromisoformat(label).utcoffset() for label in labels.values()} == {
            offset_before,
            change_at.astimezone(zone).utcoffset(),
        }, name
        assert set(Occurrence.objects.filter(schedule=schedule).values_list("state", flat=True)) <= {"scheduled"}

    report = reconcile(since=start, until=end, tenant_id=tenant_a.tenant.id, now=LATER)
    assert report.ok, report.as_dict(gap_limit=5)
    assert report.expected == sum(len(fires_of(schedule, end)) for schedule in schedules.values())


def _preview(api, schedule: Schedule, *, after: datetime, until: datetime) -> list[tuple[datetime, str]]:
    """Every fire the API previews in (after, until), paging by the last fire (at most 100 a request)."""
    fires: list[tuple[datetime, str]] = []
    while True:
        response = api.get(f"{SCHEDULES}{schedule.id}/preview/", {"after": after.isoformat(), "count": 100})
        assert response.status_code == 200, response.content
        page = [(datetime.fromisoformat(f["at"]), f["local"]) for f in response.json()["fires"]]
        fires.extend((at, local) for at, local in page if at < until)
        if not page or page[-1][0] >= until:
            return fires
        after = page[-1][0]


@pytest.mark.parametrize(("policy", "kept"), [("skip", 0), ("fire_once", 1), ("catch_up", 4)])
def test_an_outage_leaves_a_row_for_every_fire_and_the_policy_keeps_the_latest_late_ones(
    tenant_a, make_schedule, policy, kept
):
    schedule = make_schedule(
        tenant_a.tenant,
        now=T0,
        kind="interval",
        every_seconds=300,
        anchor_at=T0,
        misfire_policy=policy,
        catchup_limit=4,
    )
    materializer = materializer_holding_every_shard("interval-outage")
    run_materializer(materializer, T0 + timedelta(minutes=1))
    # Down for two hours: 24 fires of every 5 minutes are late when it comes back.
    back = T0 + timedelta(hours=2, minutes=1)
    run_materializer(materializer, back)

    late = naive_fires(T0, 300, T0, back - timedelta(seconds=60))
    rows = {o.scheduled_for: o for o in Occurrence.objects.filter(schedule=schedule)}
    assert [at for at in sorted(rows) if at in late] == late == [T0 + timedelta(minutes=5 * n) for n in range(1, 24)]
    released = [at for at in late if rows[at].state == OccurrenceState.SCHEDULED]
    assert released == late[len(late) - kept :]
    assert all(
        rows[at].state == OccurrenceState.MISSED and "late by" in rows[at].state_reason for at in late[: -kept or None]
    )
    report = reconcile(since=T0, until=back, tenant_id=tenant_a.tenant.id, now=LATER)
    assert report.ok, report.gaps


def test_a_period_change_while_behind_records_the_owed_fires_then_follows_the_new_grid(tenant_a, make_schedule):
    schedule = make_schedule(
        tenant_a.tenant, now=T0, kind="interval", every_seconds=600, anchor_at=T0, misfire_policy="skip"
    )
    materializer = materializer_holding_every_shard("interval-change")
    run_materializer(materializer, T0 + timedelta(minutes=1))
    # The materializer stops; an hour later the period changes to 7 minutes.
    changed_at = T0 + timedelta(hours=1, minutes=3)
    services.update_schedule(schedule, {"every_seconds": 420}, actor="test", now=changed_at)
    run_materializer(materializer, *every(changed_at, changed_at + timedelta(hours=1), timedelta(minutes=2)))

    v1 = fires_of(schedule, LATER, version=1)
    assert v1 == naive_fires(T0, 600, T0, changed_at + timedelta(seconds=1)), "owed up to the change, none after it"
    until = changed_at + timedelta(hours=1)
    assert fires_of(schedule, until, version=2) == naive_fires(T0, 420, changed_at, until), "the new grid, from now"
    report = reconcile(since=T0, until=changed_at + timedelta(hours=1), tenant_id=tenant_a.tenant.id, now=LATER)
    assert report.ok, report.gaps
    assert report.versions == 2


def test_reconcile_expects_each_interval_fire_and_backfill_recreates_the_lost_ones_with_their_ids(
    tenant_a, make_schedule
):
    schedule = make_schedule(tenant_a.tenant, now=T0, kind="interval", every_seconds=1800, anchor_at=T0)
    materializer = materializer_holding_every_shard("interval-backfill")
    run_materializer(materializer, *every(T0, T0 + timedelta(hours=5), timedelta(minutes=20)))
    window = {"since": T0, "until": T0 + timedelta(hours=5), "tenant_id": tenant_a.tenant.id, "now": LATER}
    assert reconcile(**window).ok
    lost = [T0 + timedelta(hours=1, minutes=30), T0 + timedelta(hours=3)]
    ids = [occurrence_id_for(schedule.id, 1, at) for at in lost]
    assert Occurrence.objects.filter(occurrence_id__in=ids).delete()[0] == 2

    report = reconcile(**window)
    assert [(gap.scheduled_for, gap.occurrence_id) for gap in report.gaps] == list(zip(lost, ids, strict=True))
    assert report.expected == 9

    result = backfill_schedule(schedule.id, since=T0, until=T0 + timedelta(hours=5), now=LATER)
    assert (result.expected, result.created) == (9, 2)
    assert set(Occurrence.objects.filter(occurrence_id__in=ids).values_list("scheduled_for", "forced")) == {
        (at, True) for at in lost
    }
    assert backfill_schedule(schedule.id, since=T0, until=T0 + timedelta(hours=5), now=LATER).created == 0
    assert reconcile(**window).ok


def test_the_materializer_never_plans_an_interval_fire_off_its_grid_or_before_creation(tenant_a, make_schedule):
    # Anchored long before creation: only its phase matters, the fires before creation are not owed.
    created_at = T0 + timedelta(seconds=13, microseconds=400_000)
    anchor = z(2026, 5, 1, 0, 0, 5)
    schedule = make_schedule(tenant_a.tenant, now=created_at, kind="interval", every_seconds=11, anchor_at=anchor)
    run_materializer(materializer_holding_every_shard("interval-grid"), created_at, created_at + timedelta(minutes=2))

    fires = fires_of(schedule, LATER)
    assert fires == naive_fires(anchor, 11, created_at, created_at + timedelta(minutes=2) + timedelta(seconds=180))
    assert fires[0] > created_at


@pytest.mark.django_db(transaction=True)
def test_a_real_materializer_process_writes_an_interval_schedules_fires_on_its_grid(tenant_a, api_a):
    response = api_a.post(
        SCHEDULES,
        {"name": "every-7s", "kind": "interval", "every_seconds": 7, "handler": "noop", "timezone": "Asia/Kolkata"},
        format="json",
    )
    assert response.status_code == 201, response.content
    created = response.json()
    anchor, first = (datetime.fromisoformat(created[key]) for key in ("anchor_at", "next_run_at"))

    finished = run_manage("materialize", "--once", "--name", "interval-process")

    assert finished.returncode == 0, finished.stderr[-2000:]
    schedule = Schedule.objects.get(pk=created["id"])
    fires = fires_of(schedule, z(2100, 1, 1))
    # Every fire up to the process's horizon (SCHEDULER_HORIZON_SECONDS after its clock, which is after the
    # creation second), each on the grid, and the cursor on the next one.
    horizon = timedelta(seconds=settings.SCHEDULER_HORIZON_SECONDS)
    assert fires == naive_fires(anchor, 7, anchor, fires[-1] + timedelta(seconds=1))
    assert fires[0] == first
    assert schedule.next_run_at == fires[-1] + timedelta(seconds=7) > anchor + horizon
    assert all(o.state == "scheduled" for o in Occurrence.objects.filter(schedule=schedule))
