"""The materializer against the real database: batches, leases, fencing, concurrency (driven clock)."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections

from dispatch.engine import loop
from dispatch.engine.materializer import Materializer
from dispatch.models import Occurrence, OutboxMessage, ProcessHeartbeat, ShardLease
from dispatch.outbox import Fire, enqueue
from schedules.models import Schedule, ScheduleCursor
from schedules.services import update_schedule
from tests.conftest import move_cursor

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def make_schedule(make_schedule) -> Callable[..., Schedule]:
    """The shared factory; this module's schedules are named "every-minute" unless a test names them."""
    return functools.partial(make_schedule, name="every-minute")


def materializer(name: str = "m1", **kwargs) -> Materializer:
    m = Materializer(name, horizon_seconds=120, lease_seconds=30, **kwargs)
    m.maintain_leases()
    return m


def test_a_batch_writes_occurrences_envelopes_and_advances_the_cursor(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0 - timedelta(seconds=30))
    m = materializer()
    assert m.step(now=T0) is True
    occurrences = list(Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for"))
    assert [o.scheduled_for for o in occurrences] == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]
    assert {o.state for o in occurrences} == {"scheduled"}
    envelopes = OutboxMessage.objects.filter(tenant_id=tenant_a.tenant.id)
    assert sorted(i for e in envelopes for i in e.occurrence_ids) == sorted(o.occurrence_id for o in occurrences)
    schedule.refresh_from_db()
    assert schedule.next_run_at == T0 + timedelta(minutes=3)
    assert m.step(now=T0) is False, "nothing more is due within the horizon"


def test_a_batch_never_writes_the_schedule_row_only_its_cursor(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0 - timedelta(seconds=30))
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text FROM schedules_schedule WHERE id = %s", [schedule.pk])
        before = cursor.fetchone()[0]
        materializer().step(now=T0)
        cursor.execute("SELECT xmin::text FROM schedules_schedule WHERE id = %s", [schedule.pk])
        assert cursor.fetchone()[0] == before, "the wide schedule row is untouched (no new row version)"
    schedule.refresh_from_db()
    assert schedule.next_run_at == T0 + timedelta(minutes=3)


def test_running_the_same_instant_twice_creates_nothing_new(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0 - timedelta(seconds=30))
    m = materializer()
    m.step(now=T0)
    # Put the cursor back, as a second node with a stale view would have it: the primary key absorbs the replay (the
    # id is derived from the fire).
    move_cursor(schedule.pk, T0)
    m.step(now=T0)
    assert Occurrence.objects.filter(schedule=schedule).count() == 3
    assert sum(len(e.occurrence_ids) for e in OutboxMessage.objects.all()) == 3


def test_a_one_off_is_completed_once_its_occurrence_ended_not_when_it_is_materialized(tenant_a, make_schedule):
    run_at = T0 + timedelta(seconds=45)
    schedule = make_schedule(tenant_a.tenant, now=T0 - timedelta(minutes=5), kind="once", cron=None, run_at=run_at)
    m = materializer()
    m.step(now=T0)
    schedule.refresh_from_db()
    assert schedule.state == "active" and schedule.next_run_at is None, "materialized a horizon ahead, not fired"
    assert list(Occurrence.objects.filter(schedule=schedule).values_list("scheduled_for", flat=True)) == [run_at]

    assert m.complete_fired_one_offs() == 0
    Occurrence.objects.filter(schedule=schedule).update(state="succeeded")
    assert m.complete_fired_one_offs() == 1
    schedule.refresh_from_db()
    assert schedule.state == "completed"


def test_a_materializer_whose_lease_was_taken_over_writes_nothing(tenant_a, make_schedule):
    make_schedule(tenant_a.tenant, now=T0 - timedelta(seconds=30))
    old = materializer("old")
    # The old node stalls past its lease; a new node takes every shard (generation + 1).
    ShardLease.objects.update(expires_at=datetime(2000, 1, 1, tzinfo=UTC))
    ProcessHeartbeat.objects.filter(name="old").delete()
    new = materializer("new")
    assert set(new.leases) == set(old.leases)
    assert old.materialize_batch(T0) == 0, "the fenced node must not write"
    assert Occurrence.objects.count() == 0
    assert new.materialize_batch(T0) == 1


def test_an_update_moves_future_fires_to_the_new_version_and_cancels_unclaimed_old_ones(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0 - timedelta(seconds=30))
    m = materializer()
    m.step(now=T0)
    update_schedule(schedule, {"cron": "*/5 * * * *"}, actor="test", now=T0 + timedelta(seconds=10))
    old = dict(Occurrence.objects.filter(schedule_version=1).values_list("scheduled_for", "state"))
    # The fire already due when the update came keeps its slot; the unclaimed later ones of v1 are canceled.
    assert {at: state for at, state in old.items() if at > T0 + timedelta(seconds=10)}
    assert all(state == "canceled" for at, state in old.items() if at > T0 + timedelta(seconds=10))
    assert all(state == "scheduled" for at, state in old.items() if at <= T0 + timedelta(seconds=10))
    m.step(now=T0 + timedelta(seconds=10))
    v2 = list(Occurrence.objects.filter(schedule_version=2).values_list("scheduled_for", flat=True))
    assert v2 == [T0 + timedelta(minutes=5)] or v2 == []
    schedule.refresh_from_db()
    assert schedule.next_run_at in (T0 + timedelta(minutes=5), T0 + timedelta(minutes=10))


def test_new_york_nightly_cron_skips_the_missing_hour_on_spring_forward_day(tenant_a, make_schedule):
    start = datetime(2026, 3, 6, 12, 0, tzinfo=UTC)
    schedule = make_schedule(tenant_a.tenant, now=start, cron="30 2 * * *", timezone="America/New_York")
    m = Materializer("dst", horizon_seconds=4 * 24 * 3600, lease_seconds=30)
    m.maintain_leases()
    m.step(now=start)
    fires = list(
        Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for").values_list("scheduled_for", flat=True)
    )
    assert fires == [
        datetime(2026, 3, 7, 7, 30, tzinfo=UTC),  # 02:30 EST
        # 2026-03-08 02:30 does not exist in New York: no fire that day.
        datetime(2026, 3, 9, 6, 30, tzinfo=UTC),  # 02:30 EDT
        datetime(2026, 3, 10, 6, 30, tzinfo=UTC),
    ]


def test_two_materializers_share_shards_fairly(tenant_a):
    first = materializer("first")
    second = materializer("second")
    first.maintain_leases()
    second.maintain_leases()
    assert not set(first.leases) & set(second.leases)
    assert len(first.leases) + len(second.leases) == ShardLease.objects.count()
    assert abs(len(first.leases) - len(second.leases)) <= 1


@pytest.mark.django_db(transaction=True)
def test_two_materializers_racing_never_produce_two_occurrences_of_a_fire(tenant_a, make_schedule):
    schedules = [make_schedule(tenant_a.tenant, now=T0 - timedelta(seconds=30), name=f"s{n}") for n in range(60)]
    errors: list[BaseException] = []

    def race(name: str) -> None:
        try:
            m = Materializer(name, horizon_seconds=120, lease_seconds=30)
            # Both claim every shard by force, as two nodes during a hand-over would believe they own them.
            m.maintain_leases()
            for _ in range(5):
                # One row a statement: an UPDATE of many leases holds the ones it took while it waits for one the
                # other thread's batch holds FOR SHARE, and that batch then waits for them (a deadlock of this forced
                # hand-over, not of the materializers).
                taken = ShardLease.objects.filter(owner__in=["a", "b"]).exclude(owner=name)
                for shard in sorted(taken.values_list("shard", flat=True)):
                    ShardLease.objects.filter(shard=shard, owner__in=["a", "b"]).update(owner=name)
                m.leases = dict(ShardLease.objects.filter(owner=name).values_list("shard", "generation"))
                for cursor_reset in range(3):
                    m.materialize_batch(T0)
                    if cursor_reset < 2:
                        move_cursor([s.pk for s in schedules], T0)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM (SELECT schedule_id, scheduled_for FROM dispatch_occurrence"
            " GROUP BY 1, 2 HAVING count(*) > 1) d"
        )
        assert cursor.fetchone()[0] == 0
    assert Occurrence.objects.filter(scheduled_for=T0).count() == 60


def test_one_batch_writes_a_bursts_tenant_whole_so_its_fires_of_an_instant_share_one_envelope(
    tenant_a, tenant_b, make_schedule
):
    """At one instant the due scan reads each shard in tenant order, so a batch is a run of whole tenants. In time
    order alone a batch took a slice of every tenant (its schedules are spread over the shards by id), and a
    100,000-fire burst over 1,000 tenants was ~6,500 envelopes of 14-33 fires; now ~1,600 of ~56."""
    for n in range(6):  # created interleaved, so neither the heap nor the index's ties group them by tenant
        make_schedule(tenant_a.tenant, name=f"a-{n}", now=T0 - timedelta(seconds=30))
        make_schedule(tenant_b.tenant, name=f"b-{n}", now=T0 - timedelta(seconds=30))
    ScheduleCursor.objects.update(shard=5)  # one shard's range: the batch's limit, not the shards, cuts it
    m = materializer(batch_size=6)
    assert m.step(now=T0) is True
    assert m.step(now=T0) is True
    envelopes = list(OutboxMessage.objects.values_list("tenant_id", "available_at", "occurrence_ids"))
    per_instant = {(tenant, at): len(ids) for tenant, at, ids in envelopes}
    assert len(envelopes) == len(per_instant) == 6, "one envelope per tenant and instant (three instants each)"
    assert set(per_instant.values()) == {6}, "each holds all six of its tenant's fires of that instant"


def test_a_full_envelope_is_stored_compressed_with_lz4_where_the_server_offers_it(tenant_a):
    """Migration dispatch 0012: the outbox's large columns use lz4 (pglz was a measurable share of the backends' CPU
    at the top of the hour)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        if not cursor.fetchone()[0]:
            pytest.skip("this PostgreSQL was built without lz4")
        fires = [
            Fire.for_lane(uuid.uuid4(), T0, tenant_id=tenant_a.tenant.id, lane="strict", available_at=T0, priority=0)
            for _ in range(250)
        ]
        assert enqueue(cursor, fires, size=250) == 1
        cursor.execute(
            "SELECT pg_column_compression(body), pg_column_compression(scheduled_fors) FROM dispatch_outboxmessage"
        )
        assert cursor.fetchone() == ("lz4", "lz4")


@pytest.mark.django_db(transaction=True)  # the drain's end closes the thread's connection
def test_the_process_loop_scans_again_at_once_only_while_batches_come_back_full(tenant_a, make_schedule):
    """Under steady load a scan short of its limit found everything due: the main thread naps, and the helper threads
    write batches only while the main thread's come back full (a burst), instead of three threads scanning every
    shard back to back for a few schedules each."""
    for n in range(5):
        make_schedule(tenant_a.tenant, name=f"due-{n}", now=T0 - timedelta(seconds=30))
    m = materializer(batch_size=2, clock=lambda: T0)
    assert m._helper_step() is False, "no burst yet: a helper does not scan"
    assert Occurrence.objects.count() == 0
    assert m._drain_step() is True, "a full batch: more may be due"
    assert m._helper_step() is True, "the helpers join while batches come back full"
    assert m._helper_step() is False, "the fifth schedule alone: the due set is drained"
    assert Occurrence.objects.values("schedule").distinct().count() == 5
    late = make_schedule(tenant_a.tenant, name="due-late", now=T0 - timedelta(seconds=30))
    assert m._helper_step() is False
    assert not Occurrence.objects.filter(schedule=late).exists(), "a helper naps once the due set was drained"
    assert m._drain_step() is False, "the main thread's next scan finds it, and the batch is short"
    assert Occurrence.objects.filter(schedule=late).exists()


@pytest.mark.django_db(transaction=True)  # the drain's end closes the thread's connection
def test_the_memory_of_a_bursts_batches_goes_back_once_the_drain_ends(tenant_a, make_schedule, monkeypatch):
    """A batch of many fires (a burst) has the main thread hand the allocator's free pages back once the due set is
    drained, once; steady batches below the bound leave them (each batch plans a second's worth or so)."""
    trims: list[bool] = []
    monkeypatch.setattr(loop, "return_free_memory", lambda: trims.append(True) or True)
    monkeypatch.setattr(loop, "TRIM_AFTER_FIRES", 6)  # two schedules x three fires in the horizon
    for n in range(3):
        make_schedule(tenant_a.tenant, name=f"due-{n}", now=T0 - timedelta(seconds=30))
    m = materializer(batch_size=2, clock=lambda: T0)
    assert m._drain_step() is True, "a full batch of six fires: more is due"
    assert trims == [], "not while the drain goes on"
    assert connection.connection is not None
    assert m._drain_step() is False
    assert trims == [True], "the drain ended after a batch at the bound"
    assert connection.connection is None, "libpq's buffers, grown by the burst's batches, went with the connection"
    make_schedule(tenant_a.tenant, name="steady", now=T0 - timedelta(seconds=30))
    assert m._drain_step() is False
    assert trims == [True], "three fires: a steady batch keeps its memory"
