"""The reconciler against histories written by the real materializer with a driven clock: clean runs, gaps, versions."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core.clock import db_now
from dispatch import reconcile as reconcile_module
from dispatch.engine.materializer import Materializer
from dispatch.history import VersionSpan, expected_fires, version_spans
from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OccurrenceState
from dispatch.reconcile import reconcile
from schedules import services
from schedules.models import Schedule, ScheduleVersion
from tests.integration.support import materializer_holding_every_shard, run_materializer

ACTOR = "tenant:acme/api"
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
# The reconciler's driven "now": long after every history below, so the grace period cuts nothing.
LATER = datetime(2026, 8, 1, tzinfo=UTC)
NEW_YORK = ZoneInfo("America/New_York")


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


@pytest.fixture
def materializer(tenant_a) -> Materializer:
    return materializer_holding_every_shard("test-reconcile")


def every(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    instants = []
    while start <= end:
        instants.append(start)
        start += step
    return instants


@pytest.fixture
def create(make_schedule) -> Callable[..., Schedule]:
    """The shared factory as this module calls it: `create(tenant, now, **fields)`, made by ACTOR at `now`."""

    def create(tenant, now: datetime, **fields: Any) -> Schedule:
        return make_schedule(tenant, now=now, actor=ACTOR, **fields)

    return create


def rows_in(schedules: list[Schedule], since: datetime, until: datetime):
    return Occurrence.objects.filter(
        schedule__in=schedules, scheduled_for__gte=since, scheduled_for__lt=until, manual=False
    )


def run_command(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("reconcile", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


# --- clean histories and gaps ---------------------------------------------------------------------------------


@pytest.fixture
def clean_history(tenant_a, materializer, create) -> list[Schedule]:
    """Three rhythms materialized every 30 minutes for six hours: on-time fires, late ones (missed), a one-off."""
    tenant = tenant_a.tenant
    schedules = [
        create(tenant, T0, kind="cron", cron="0 * * * *"),
        create(tenant, T0, kind="cron", cron="15 */2 * * *", timezone="Asia/Kolkata", lane="flexible"),
        create(tenant, T0, kind="once", run_at=T0 + timedelta(hours=3)),
    ]
    run_materializer(materializer, *every(T0, T0 + timedelta(hours=6), timedelta(minutes=30)))
    return schedules


def test_a_clean_materialized_history_has_no_gaps(tenant_a, clean_history):
    until = T0 + timedelta(hours=6)

    report = reconcile(since=T0, until=until, tenant_id=tenant_a.tenant.id, now=LATER)

    assert report.ok
    assert report.missing == 0
    assert report.expected == rows_in(clean_history, T0, until).count()
    # 13:00..17:00 hourly (12:00 is the creation instant: a cron version fires strictly after it), three Kolkata
    # fires at 12:45, 14:45, 16:45 UTC (local 18:15, 20:15, 22:15 at +05:30) and the one-off.
    assert report.expected == 5 + 3 + 1
    assert report.found == report.expected
    assert report.found_by_state[OccurrenceState.SCHEDULED] > 0
    assert report.found_by_state[OccurrenceState.MISSED] > 0
    assert report.unexpected == 0


def test_reconcile_command_exits_zero_on_a_clean_history(clean_history):
    code, out = run_command("--since", "2026-06-01T12:00:00Z", "--until", "2026-06-01T18:00:00Z", "--tenant", "acme")

    assert code == 0
    assert "expected 9, found 9" in out
    assert "missing 0" in out
    assert "OK: every expected occurrence is accounted for." in out


def test_deleting_one_occurrence_is_reported_as_exactly_that_gap(tenant_a, clean_history):
    hourly = clean_history[0]
    lost_at = T0 + timedelta(hours=3)
    lost_id = occurrence_id_for(hourly.id, 1, lost_at)
    assert Occurrence.objects.filter(occurrence_id=lost_id, scheduled_for=lost_at).delete()[0] == 1

    report = reconcile(since=T0, until=T0 + timedelta(hours=6), tenant_id=tenant_a.tenant.id, now=LATER)

    assert report.missing == 1
    assert report.schedules_with_gaps == 1
    [gap] = report.gaps
    assert (gap.schedule_id, gap.version, gap.scheduled_for, gap.occurrence_id) == (hourly.id, 1, lost_at, lost_id)


def test_a_second_row_of_a_fire_under_another_id_is_reported_unexpected(tenant_a, clean_history):
    """The primary key holds the unique fire because every writer derives the id from the fire (dispatch migration
    0011). A row of the same fire under any other id is the one thing the key cannot refuse, and reconciliation
    reports it."""
    hourly = clean_history[0]
    at = T0 + timedelta(hours=3)
    original = Occurrence.objects.get(occurrence_id=occurrence_id_for(hourly.id, 1, at), scheduled_for=at)
    stray = uuid.uuid4()
    Occurrence.objects.bulk_create(
        [
            Occurrence(
                occurrence_id=stray,
                schedule_id=hourly.id,
                tenant_id=original.tenant_id,
                schedule_version=1,
                scheduled_for=at,
                available_at=at,
                lane=original.lane,
            )
        ]
    )

    report = reconcile(since=T0, until=T0 + timedelta(hours=6), tenant_id=tenant_a.tenant.id, now=LATER)

    assert report.missing == 0
    assert report.unexpected == 1
    [row] = report.unexpected_samples
    assert (row.occurrence_id, row.version, row.scheduled_for) == (stray, 1, at)


def test_reconcile_command_lists_the_gap_and_exits_one(clean_history):
    hourly = clean_history[0]
    lost_at = T0 + timedelta(hours=3)
    lost_id = occurrence_id_for(hourly.id, 1, lost_at)
    Occurrence.objects.filter(occurrence_id=lost_id).delete()
    window = ("--since", "2026-06-01T12:00:00Z", "--until", "2026-06-01T18:00:00Z", "--tenant", "acme")

    code, out = run_command(*window)
    json_code, json_out = run_command(*window, "--json")

    assert code == 1
    assert f"schedule {hourly.id} v1 at 2026-06-01T15:00:00Z -> occurrence {lost_id}" in out
    assert "GAPS: 1 expected occurrences have no row" in out
    assert json_code == 1
    payload = json.loads(json_out)
    assert payload["missing"] == 1
    assert payload["ok"] is False
    assert payload["gaps"] == [
        {
            "schedule_id": str(hourly.id),
            "tenant_id": hourly.tenant_id,
            "version": 1,
            "scheduled_for": "2026-06-01T15:00:00Z",
            "occurrence_id": str(lost_id),
        }
    ]


def test_small_batches_and_chunks_give_the_same_report(tenant_a, clean_history, monkeypatch):
    Occurrence.objects.filter(schedule=clean_history[1]).order_by("scheduled_for").first().delete()
    window = {"since": T0, "until": T0 + timedelta(hours=6), "tenant_id": tenant_a.tenant.id, "now": LATER}
    whole = reconcile(**window)

    monkeypatch.setattr(reconcile_module, "EXPECTED_CHUNK", 2)
    pieces = reconcile(**window, batch_size=1)

    assert pieces.schedules == whole.schedules == 3
    assert (pieces.expected, pieces.found_by_state, pieces.missing) == (whole.expected, whole.found_by_state, 1)
    assert pieces.gaps == whole.gaps


def test_fires_younger_than_the_grace_period_are_not_gaps(tenant_a, create):
    now = T0 + timedelta(hours=2)
    create(tenant_a.tenant, T0, kind="cron", cron="* * * * *")  # nothing materialized at all

    report = reconcile(since=now - timedelta(minutes=10), until=now, tenant_id=tenant_a.tenant.id, now=now)

    assert report.checked_until == now - timedelta(seconds=reconcile_module.RECONCILE_GRACE_SECONDS)
    # Minutes 13:50..13:57: the last two minutes are within the grace period.
    assert report.expected == report.missing == 8


def test_the_command_checks_up_to_until_with_no_grace(tenant_a, create):
    """After a burst every process has caught up with, an operator reconciles the last minutes with --grace 0."""
    now = db_now()
    create(tenant_a.tenant, now - timedelta(hours=1), kind="cron", cron="* * * * *")  # nothing materialized
    window = ("--since", (now - timedelta(minutes=10)).isoformat(), "--until", now.isoformat(), "--json")

    _, default = run_command(*window)
    _, no_grace = run_command(*window, "--grace", "0")

    assert json.loads(default)["checked_until"] < json.loads(no_grace)["checked_until"] == json.loads(no_grace)["until"]
    # The two minutes the default grace leaves out are gaps too (nothing was ever materialized).
    assert json.loads(no_grace)["missing"] == json.loads(default)["missing"] + 2


def test_other_tenants_are_left_out_when_a_tenant_is_given(tenant_a, tenant_b, create):
    create(tenant_b.tenant, T0, kind="cron", cron="0 * * * *")  # never materialized: globex is all gaps

    acme = reconcile(since=T0, until=T0 + timedelta(hours=3), tenant_id=tenant_a.tenant.id, now=LATER)
    globex = reconcile(since=T0, until=T0 + timedelta(hours=3), tenant_id=tenant_b.tenant.id, now=LATER)

    assert acme.expected == 0
    assert acme.ok
    assert globex.missing == 2
    assert {gap.tenant_id for gap in globex.gaps} == {tenant_b.tenant.id}


# --- versions ---------------------------------------------------------------------------------------------------


def test_update_pause_and_resume_are_reconciled_without_false_gaps(tenant_a, materializer, create):
    """v1 hourly at :00, v2 at :15 from 14:59, paused 16:30-18:40 (v3), resumed (v4) at 18:40."""
    tenant = tenant_a.tenant
    schedule = create(tenant, T0, kind="cron", cron="0 * * * *")
    # 14:58:30 materializes 13:00, 14:00 and, one horizon ahead, 15:00 under v1; the update cancels that one.
    run_materializer(materializer, T0 + timedelta(hours=1), T0 + timedelta(hours=2), T0 + timedelta(minutes=178.5))
    services.update_schedule(schedule, {"cron": "15 * * * *"}, actor=ACTOR, now=T0 + timedelta(minutes=179))
    run_materializer(materializer, T0 + timedelta(hours=3, minutes=15), T0 + timedelta(hours=4, minutes=15))
    services.pause_schedule(schedule, actor=ACTOR, now=T0 + timedelta(hours=4, minutes=30))
    run_materializer(materializer, T0 + timedelta(hours=5, minutes=15), T0 + timedelta(hours=6, minutes=15))
    services.resume_schedule(schedule, actor=ACTOR, now=T0 + timedelta(hours=6, minutes=40))
    run_materializer(materializer, T0 + timedelta(hours=7, minutes=15), T0 + timedelta(hours=8, minutes=15))

    report = reconcile(since=T0, until=T0 + timedelta(hours=9), tenant_id=tenant.id, now=LATER)

    assert report.versions == 4
    assert report.ok, report.gaps
    expected = {
        (1, T0 + timedelta(hours=1)),
        (1, T0 + timedelta(hours=2)),
        (2, T0 + timedelta(hours=3, minutes=15)),
        (2, T0 + timedelta(hours=4, minutes=15)),
        # 17:15 and 18:15 fall in the pause: nothing owed, nothing caught up after the resume.
        (4, T0 + timedelta(hours=7, minutes=15)),
        (4, T0 + timedelta(hours=8, minutes=15)),
    }
    assert report.expected == len(expected)
    rows = set(rows_in([schedule], T0, T0 + timedelta(hours=9)).values_list("schedule_version", "scheduled_for"))
    assert rows == expected | {(1, T0 + timedelta(hours=3))}
    # Nothing relayed them; each was already due when the next version change came, so it kept its slot (a change
    # affects only the fires after it): owed, and accounted for.
    assert report.found_by_state == {OccurrenceState.SCHEDULED: 6}
    # The v1 fire at 15:00 was materialized ahead and withdrawn by the update: reported, not a gap.
    assert report.unexpected == 1
    assert report.unexpected_by_state == {OccurrenceState.CANCELED: 1}
    [row] = report.unexpected_samples
    assert (row.version, row.scheduled_for, row.state) == (1, T0 + timedelta(hours=3), OccurrenceState.CANCELED)


def test_an_update_during_a_materializer_outage_records_the_owed_fires_as_missed(tenant_a, materializer, create):
    """The materializer is down from 13:30; the update at 16:30 moves the cursor to v2. The fires v1 still owed
    (14:00-16:00) get `missed` rows before the cursor moves, so nothing is silently omitted."""
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, T0 + timedelta(hours=1, minutes=30))
    services.update_schedule(schedule, {"cron": "30 * * * *"}, actor=ACTOR, now=T0 + timedelta(hours=4, minutes=30))
    run_materializer(materializer, T0 + timedelta(hours=6))

    report = reconcile(since=T0, until=T0 + timedelta(hours=6), tenant_id=tenant_a.tenant.id, now=LATER)

    assert report.ok, report.gaps
    owed = Occurrence.objects.filter(schedule=schedule, schedule_version=1, state=OccurrenceState.MISSED)
    assert {T0 + timedelta(hours=n) for n in (2, 3, 4)} <= set(owed.values_list("scheduled_for", flat=True))


def test_one_off_versions_owe_their_run_at_only_where_they_could_still_reach_it(tenant_a, materializer, create):
    tenant = tenant_a.tenant
    past = create(tenant, T0, kind="once", run_at=T0 - timedelta(hours=1))  # past at creation: still owed
    moved = create(tenant, T0, kind="once", run_at=T0 + timedelta(hours=2))
    services.update_schedule(moved, {"run_at": T0 + timedelta(hours=3)}, actor=ACTOR, now=T0 + timedelta(hours=1))
    run_materializer(materializer, T0 + timedelta(minutes=1), T0 + timedelta(hours=3))

    report = reconcile(since=T0 - timedelta(hours=2), until=T0 + timedelta(hours=4), tenant_id=tenant.id, now=LATER)

    assert report.ok, report.gaps
    assert report.expected == 2
    assert Occurrence.objects.get(schedule=past).state == OccurrenceState.MISSED
    assert Occurrence.objects.get(schedule=moved).schedule_version == 2


# --- time rules -------------------------------------------------------------------------------------------------


def test_new_york_0230_expects_no_fire_on_the_spring_forward_day(tenant_a, materializer, create):
    schedule = create(tenant_a.tenant, datetime(2026, 2, 20, tzinfo=UTC), kind="cron", cron="30 2 * * *",
                      timezone="America/New_York")  # fmt: skip
    since, until = datetime(2026, 3, 1, 5, tzinfo=UTC), datetime(2026, 4, 1, 4, tzinfo=UTC)  # local March
    [span] = version_spans([schedule.id], since, until)

    fires = list(expected_fires(span, since, until))

    local_days = [fire.scheduled_for.astimezone(NEW_YORK).day for fire in fires]
    assert local_days == [day for day in range(1, 32) if day != 8]
    assert {fire.scheduled_for.astimezone(NEW_YORK).strftime("%H:%M") for fire in fires} == {"02:30"}
    assert fires[6].scheduled_for == datetime(2026, 3, 7, 7, 30, tzinfo=UTC)  # EST
    assert fires[7].scheduled_for == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)  # EDT
    # And the materializer agrees: a month materialized in one late step reconciles without gaps.
    run_materializer(materializer, datetime(2026, 4, 2, tzinfo=UTC))
    report = reconcile(since=since, until=until, tenant_id=tenant_a.tenant.id, now=LATER)
    assert (report.expected, report.missing) == (30, 0)


def test_new_york_0130_expects_one_fire_on_the_fall_back_day():
    span = VersionSpan(
        schedule_id=uuid.UUID(int=1),
        tenant_id=1,
        version=1,
        change="create",
        state="active",
        kind="cron",
        cron="30 1 * * *",
        run_at=None,
        timezone="America/New_York",
        lane="strict",
        priority=0,
        valid_from=datetime(2026, 10, 1, tzinfo=UTC),
        valid_to=None,
    )
    since, until = datetime(2026, 11, 1, 4, tzinfo=UTC), datetime(2026, 11, 2, 5, tzinfo=UTC)  # local Nov 1

    fires = [fire.scheduled_for for fire in expected_fires(span, since, until)]

    assert fires == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC)]  # 01:30 EDT, the first of the two 01:30s


# --- command input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--since", "yesterday", "--until", "2026-06-02T00:00:00Z"), "not an ISO 8601 instant"),
        (("--since", "2026-06-01T00:00:00", "--until", "2026-06-02T00:00:00Z"), "has no offset"),
        (("--since", "2026-06-02T00:00:00Z", "--until", "2026-06-01T00:00:00Z"), "must be before"),
        (("--since", "2026-06-01T00:00:00Z", "--until", "2026-06-01T00:00:00+00:00"), "must be before"),
        (("--since", "2026-06-01T00:00:00Z", "--until", "2026-06-02T00:00:00Z", "--tenant", "nope"), "Unknown tenant"),
        (("--since", "2026-06-01T00:00:00Z", "--until", "2026-06-02T00:00:00Z", "--grace", "-1"), "--grace must be"),
        (("--since", "2026-06-01T00:00:00Z", "--until", "2026-06-02T00:00:00Z", "--grace", "inf"), "--grace must be"),
    ],
)
def test_reconcile_command_refuses_bad_input_with_a_clear_message(tenant_a, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("reconcile", *args, stdout=io.StringIO())


def test_an_unreadable_version_fails_the_run_without_hiding_other_gaps(tenant_a, create):
    broken = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    healthy = create(tenant_a.tenant, T0, kind="cron", cron="30 * * * *")  # never materialized: gaps
    version = ScheduleVersion.objects.get(schedule=broken)
    version.definition = {**version.definition, "cron": "every hour"}
    version.save()

    report = reconcile(since=T0, until=T0 + timedelta(hours=3), tenant_id=tenant_a.tenant.id, now=LATER)

    assert not report.ok
    [unreadable] = report.unreadable_versions
    assert (unreadable.schedule_id, unreadable.version) == (broken.id, 1)
    assert report.missing == 3
    assert {gap.schedule_id for gap in report.gaps} == {healthy.id}
