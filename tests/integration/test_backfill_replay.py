"""Operator repair commands: backfill of past gaps, replay from the DLQ and pruning of old day partitions."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from core.clock import db_now
from dispatch import backfill as backfill_module
from dispatch import partitions
from dispatch.engine.materializer import Materializer
from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OccurrenceState, OutboxMessage
from dispatch.reconcile import reconcile
from schedules import services
from schedules.models import Schedule
from tests.integration.support import materializer_holding_every_shard, run_materializer

ACTOR = "tenant:acme/api"
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 8, 1, tzinfo=UTC)
WINDOW = ("--since", "2026-06-01T12:00:00Z", "--until", "2026-06-01T18:00:00Z")


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


@pytest.fixture
def materializer(tenant_a) -> Materializer:
    return materializer_holding_every_shard("test-backfill")


@pytest.fixture
def create(make_schedule) -> Callable[..., Schedule]:
    """The shared factory as this module calls it: `create(tenant, now, **fields)`, made by ACTOR at `now`."""

    def create(tenant, now: datetime, **fields: Any) -> Schedule:
        return make_schedule(tenant, now=now, actor=ACTOR, **fields)

    return create


def command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def in_outbox(occurrence_id: uuid.UUID) -> bool:
    return OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence_id]).exists()


# --- backfill -----------------------------------------------------------------------------------------------------


@pytest.fixture
def hourly_with_holes(tenant_a, materializer, create) -> tuple[Schedule, list[uuid.UUID]]:
    """An hourly schedule materialized 13:00-17:00, then three of its five rows lost."""
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, *(T0 + timedelta(hours=n) for n in range(1, 7)))
    lost = [occurrence_id_for(schedule.id, 1, T0 + timedelta(hours=n)) for n in (2, 3, 5)]
    assert Occurrence.objects.filter(occurrence_id__in=lost).delete()[0] == 3
    return schedule, lost


def test_backfill_creates_exactly_the_gaps_reconcile_expected(tenant_a, hourly_with_holes):
    schedule, lost = hourly_with_holes
    before = reconcile(since=T0, until=T0 + timedelta(hours=6), tenant_id=tenant_a.tenant.id, now=LATER)
    assert [gap.occurrence_id for gap in before.gaps] == lost
    untouched = dict(Occurrence.objects.filter(schedule=schedule).values_list("occurrence_id", "state"))
    started = db_now()

    out = command("backfill", str(schedule.id), *WINDOW)

    assert "expected 5, created 3, already present 2" in out
    created = Occurrence.objects.filter(occurrence_id__in=lost)
    assert sorted(o.occurrence_id for o in created) == sorted(lost)
    for occurrence in created:
        assert occurrence.state == OccurrenceState.SCHEDULED
        assert occurrence.forced is True
        assert occurrence.manual is False
        assert occurrence.schedule_version == 1
        assert started <= occurrence.available_at <= db_now()  # released now: the fires are already late
        assert in_outbox(occurrence.occurrence_id)
    assert dict(Occurrence.objects.filter(occurrence_id__in=untouched).values_list("occurrence_id", "state")) == (
        untouched
    )
    after = reconcile(since=T0, until=T0 + timedelta(hours=6), tenant_id=tenant_a.tenant.id, now=LATER)
    assert after.ok
    assert after.found == after.expected == 5


def test_backfill_twice_creates_nothing_the_second_time(hourly_with_holes):
    schedule, _ = hourly_with_holes
    command("backfill", str(schedule.id), *WINDOW)
    envelopes = OutboxMessage.objects.count()

    out = command("backfill", str(schedule.id), *WINDOW)

    assert "expected 5, created 0, already present 5" in out
    assert OutboxMessage.objects.count() == envelopes


def test_reconcile_after_backfill_reports_no_gaps_and_exits_zero(hourly_with_holes):
    schedule, _ = hourly_with_holes
    with pytest.raises(SystemExit) as exited:
        command("reconcile", *WINDOW, "--tenant", "acme")
    assert exited.value.code == 1

    command("backfill", str(schedule.id), *WINDOW)

    assert "OK: every expected occurrence is accounted for." in command("reconcile", *WINDOW, "--tenant", "acme")


def test_backfill_uses_the_version_that_was_valid_at_each_fire(tenant_a, materializer, create):
    """v1's 14:00-16:00 rows are lost (deleted) after an update moved the schedule to v2; backfill writes them
    again as v1 fires with their v1 ids."""
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, T0 + timedelta(hours=1, minutes=30))
    services.update_schedule(schedule, {"cron": "30 * * * *"}, actor=ACTOR, now=T0 + timedelta(hours=4, minutes=30))
    run_materializer(materializer, T0 + timedelta(hours=6))
    Occurrence.objects.filter(
        schedule=schedule, schedule_version=1, scheduled_for__in=[T0 + timedelta(hours=n) for n in (2, 3, 4)]
    ).delete()
    gaps = reconcile(since=T0, until=T0 + timedelta(hours=6), tenant_id=tenant_a.tenant.id, now=LATER).gaps

    out = command("backfill", str(schedule.id), *WINDOW)

    assert "expected 5, created 3, already present 2" in out
    rows = Occurrence.objects.filter(occurrence_id__in=[gap.occurrence_id for gap in gaps])
    assert sorted((o.schedule_version, o.scheduled_for) for o in rows) == [
        (1, T0 + timedelta(hours=n)) for n in (2, 3, 4)
    ]
    # The schedule is at v2 now; forced lets the worker run these v1 fires anyway.
    assert all(o.forced for o in rows)


def test_backfill_creates_the_day_partitions_of_an_old_range(tenant_a, create):
    schedule = create(tenant_a.tenant, datetime(2026, 1, 1, tzinfo=UTC), kind="cron", cron="0 */6 * * *")

    out = command("backfill", str(schedule.id), "--since", "2026-01-10T00:00:00Z", "--until", "2026-01-11T00:00:00Z")

    assert "expected 4, created 4" in out
    assert date(2026, 1, 10) in partitions.existing_partition_days(connection, "dispatch_occurrence")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_occurrence_p20260110 WHERE schedule_id = %s", [schedule.id])
        assert cursor.fetchone()[0] == 4


def test_backfill_refuses_a_range_that_reaches_into_the_future(tenant_a, create):
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    until = (db_now() + timedelta(hours=1)).isoformat()

    with pytest.raises(CommandError, match="later than now"):
        command("backfill", str(schedule.id), "--since", "2026-06-01T12:00:00Z", "--until", until)
    assert not Occurrence.objects.filter(schedule=schedule).exists()


def test_backfill_refuses_a_canceled_schedule_and_says_why(tenant_a, create):
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    services.cancel_schedule(schedule, actor=ACTOR, now=T0 + timedelta(hours=3))

    with pytest.raises(CommandError, match="canceled: workers drop the occurrences"):
        command("backfill", str(schedule.id), *WINDOW)


@pytest.mark.parametrize(
    ("schedule_id", "message"),
    [("not-a-uuid", "is not a schedule id"), (str(uuid.UUID(int=7)), "No schedule with id")],
)
def test_backfill_refuses_an_unknown_or_malformed_schedule_id(tenant_a, schedule_id, message):
    with pytest.raises(CommandError, match=message):
        command("backfill", schedule_id, *WINDOW)


def test_backfill_refuses_bad_instants(tenant_a, create):
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    with pytest.raises(CommandError, match="has no offset"):
        command("backfill", str(schedule.id), "--since", "2026-06-01T12:00:00", "--until", "2026-06-01T18:00:00Z")
    with pytest.raises(CommandError, match="must be before"):
        command("backfill", str(schedule.id), "--since", "2026-06-01T18:00:00Z", "--until", "2026-06-01T12:00:00Z")


def test_backfill_over_the_cap_says_how_many_and_where_to_cut(tenant_a, monkeypatch, create):
    monkeypatch.setattr(backfill_module, "MAX_BACKFILL_FIRES", 100)
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="* * * * *")

    with pytest.raises(CommandError) as refused:
        command("backfill", str(schedule.id), "--since", "2026-06-01T12:00:00Z", "--until", "2026-06-01T16:00:00Z")

    message = str(refused.value)
    assert "more than 100 fires (about 240 " in message  # 239 in truth: extrapolated from the first 101
    assert "--until 2026-06-01T13:41:00+00:00" in message
    assert not Occurrence.objects.filter(schedule=schedule).exists()


# --- replay -------------------------------------------------------------------------------------------------------


def kill(schedule: Schedule, *hours: int) -> list[uuid.UUID]:
    """Mark some materialized fires dead, as the worker does when retries are exhausted."""
    ids = [occurrence_id_for(schedule.id, schedule.version, T0 + timedelta(hours=n)) for n in hours]
    assert Occurrence.objects.filter(occurrence_id__in=ids).update(state=OccurrenceState.DEAD, finished_at=T0) == len(
        ids
    )
    return ids


@pytest.fixture
def dead_in_two_tenants(tenant_a, tenant_b, materializer, create) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    acme = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    globex = create(tenant_b.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, *(T0 + timedelta(hours=n) for n in range(1, 4)))
    return kill(acme, 1, 2), kill(globex, 3)


def test_replay_dead_reenqueues_with_the_same_ids_and_forced(dead_in_two_tenants):
    acme_dead, globex_dead = dead_in_two_tenants

    out = command("replay", "--dead", "--tenant", "acme")

    assert "Replayed 2 dead occurrences." in out
    for occurrence in Occurrence.objects.filter(occurrence_id__in=acme_dead):
        assert occurrence.state == OccurrenceState.SCHEDULED
        assert occurrence.forced is True
        assert occurrence.finished_at is None
        assert in_outbox(occurrence.occurrence_id)
    assert Occurrence.objects.get(occurrence_id=globex_dead[0]).state == OccurrenceState.DEAD

    assert "Replayed 1 dead occurrences." in command("replay", "--dead")
    assert Occurrence.objects.get(occurrence_id=globex_dead[0]).state == OccurrenceState.SCHEDULED
    assert "Replayed 0 dead occurrences." in command("replay", "--dead")


def test_replay_dead_leaves_occurrences_of_canceled_schedules_and_says_so(tenant_a, materializer, create):
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, T0 + timedelta(hours=1))
    [dead] = kill(schedule, 1)
    services.cancel_schedule(schedule, actor=ACTOR, now=T0 + timedelta(hours=2))

    out = command("replay", "--dead", "--tenant", "acme")

    assert "Replayed 0 dead occurrences." in out
    assert "Left 1 dead occurrences of canceled schedules" in out
    assert Occurrence.objects.get(occurrence_id=dead).state == OccurrenceState.DEAD


def test_replay_of_one_dead_occurrence_keeps_its_id(dead_in_two_tenants):
    [first, _] = dead_in_two_tenants[0]

    out = command("replay", str(first))

    assert f"Replayed occurrence {first} (now scheduled)." in out
    occurrence = Occurrence.objects.get(occurrence_id=first)
    assert (occurrence.state, occurrence.forced) == (OccurrenceState.SCHEDULED, True)
    assert in_outbox(first)


def test_replay_of_an_occurrence_that_is_not_dead_fails_with_exit_code_one(tenant_a, materializer, create):
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, T0 + timedelta(hours=1))
    occurrence_id = occurrence_id_for(schedule.id, 1, T0 + timedelta(hours=1))

    with pytest.raises(CommandError, match="is scheduled; only a dead occurrence can be replayed") as refused:
        command("replay", str(occurrence_id))
    assert refused.value.returncode == 1


def test_replay_of_a_dead_occurrence_of_a_canceled_schedule_is_refused(tenant_a, materializer, create):
    schedule = create(tenant_a.tenant, T0, kind="cron", cron="0 * * * *")
    run_materializer(materializer, T0 + timedelta(hours=1))
    [dead] = kill(schedule, 1)
    services.cancel_schedule(schedule, actor=ACTOR, now=T0 + timedelta(hours=2))

    with pytest.raises(CommandError, match="is canceled; a replay would not run"):
        command("replay", str(dead))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((str(uuid.UUID(int=9)),), "No occurrence with id"),
        (("nope",), "is not an occurrence id"),
        ((), "exactly one of --dead, --stuck or an occurrence id"),
        ((str(uuid.UUID(int=9)), "--dead"), "exactly one of --dead, --stuck or an occurrence id"),
        (("--dead", "--tenant", "nope"), "Unknown tenant"),
    ],
)
def test_replay_refuses_bad_requests_with_a_clear_message(tenant_a, args, message):
    with pytest.raises(CommandError, match=message):
        command("replay", *args)


# --- prune --------------------------------------------------------------------------------------------------------


@pytest.fixture
def old_partition(db) -> str:
    day = date(2020, 1, 15)
    partitions.ensure_partitions(connection, day, day)
    assert day in partitions.existing_partition_days(connection, "dispatch_occurrence")
    return partitions.partition_name("dispatch_occurrence", day)


def test_prune_dry_run_lists_old_partitions_and_drops_nothing(old_partition):
    out = command("prune_occurrences", "--dry-run")

    assert "(dry run)" in out
    assert old_partition in out
    assert date(2020, 1, 15) in partitions.existing_partition_days(connection, "dispatch_occurrence")


def test_prune_drops_partitions_older_than_the_retention(old_partition):
    recent = db_now().date() - timedelta(days=2)
    partitions.ensure_partitions(connection, recent, recent)

    out = command("prune_occurrences", "--older-than-days", "14")

    assert old_partition in out
    assert "dispatch_attempt_p20200115" in out
    days = partitions.existing_partition_days(connection, "dispatch_occurrence")
    assert date(2020, 1, 15) not in days
    assert recent in days


def test_prune_refuses_a_retention_below_one_day(db):
    with pytest.raises(CommandError, match="at least 1"):
        command("prune_occurrences", "--older-than-days", "0")
