"""The control-plane verbs called directly with a driven `now`: version history, invalidation, cursors, races."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.choices import ScheduleState
from dispatch.models import Occurrence, OccurrenceState
from schedules import services
from schedules.errors import ScheduleInvalid, StateConflict
from schedules.models import PLANNING_FIELDS, Schedule, ScheduleCursor, ScheduleVersion, VersionChange
from tenants.credentials.tokens import digest_of, tokens_of

ACTOR = "tenant:acme/api"
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def hourly(tenant) -> Schedule:
    schedule, created = services.create_schedule(
        tenant=tenant,
        data={"name": "hourly", "kind": "cron", "cron": "0 * * * *", "handler": "noop"},
        actor=ACTOR,
        now=T0,
    )
    assert created
    return schedule


def states_by_id(schedule: Schedule) -> dict:
    return dict(Occurrence.objects.filter(schedule=schedule).values_list("occurrence_id", "state"))


# --- version history ------------------------------------------------------------------------------------


def test_create_records_version_one_with_a_snapshot_and_the_actor(hourly):
    version = ScheduleVersion.objects.get(schedule=hourly)

    assert version.version == 1
    assert version.change == VersionChange.CREATE
    assert version.actor == ACTOR
    assert version.valid_from == T0
    assert version.valid_to is None
    assert version.definition["cron"] == "0 * * * *"
    assert version.definition["timezone"] == "UTC"
    assert version.definition["state"] == "active"
    assert version.tenant_id == hourly.tenant_id


def test_every_verb_writes_a_version_and_closes_the_previous_one(hourly):
    times = [T0 + timedelta(minutes=n) for n in (10, 20, 30, 40)]
    services.update_schedule(hourly, {"cron": "30 * * * *"}, actor=ACTOR, now=times[0])
    services.pause_schedule(hourly, actor=ACTOR, now=times[1])
    services.resume_schedule(hourly, actor=ACTOR, now=times[2])
    services.cancel_schedule(hourly, actor=ACTOR, now=times[3])

    versions = list(ScheduleVersion.objects.filter(schedule=hourly).order_by("version"))

    assert [(v.version, v.change) for v in versions] == [
        (1, "create"),
        (2, "update"),
        (3, "pause"),
        (4, "resume"),
        (5, "cancel"),
    ]
    assert [v.valid_from for v in versions] == [T0, *times]
    assert [v.valid_to for v in versions] == [*times, None]
    assert [v.definition["state"] for v in versions] == ["active", "active", "paused", "active", "canceled"]
    assert versions[0].definition["cron"] == "0 * * * *"
    assert versions[1].definition["cron"] == "30 * * * *"
    assert {v.actor for v in versions} == {ACTOR}
    hourly.refresh_from_db()
    assert hourly.version == 5


def test_the_api_records_its_actor_as_tenant_slug_and_token(api_a, tenant_a, cron_body):
    created = api_a.post("/api/v1/schedules/", cron_body, format="json").json()
    api_a.patch(f"/api/v1/schedules/{created['id']}/", {"priority": 3}, format="json")

    actors = set(ScheduleVersion.objects.filter(schedule_id=created["id"]).values_list("actor", flat=True))

    (token,) = [t for t in tokens_of(tenant_a.tenant) if t.digest == digest_of(tenant_a.token)]
    assert actors == {f"tenant:acme/token:provisioned#{token.pk}"}


def test_a_once_snapshot_stores_run_at_as_iso_text(tenant):
    schedule, _ = services.create_schedule(
        tenant=tenant,
        data={"name": "once", "kind": "once", "run_at": T0 + timedelta(days=1), "handler": "noop"},
        actor=ACTOR,
        now=T0,
    )

    snapshot = ScheduleVersion.objects.get(schedule=schedule).definition

    assert snapshot["run_at"] == "2026-06-02T12:00:00+00:00"
    assert snapshot["cron"] is None


# --- invalidation of older versions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "verb",
    [
        lambda s, now: services.update_schedule(s, {"priority": 1}, actor=ACTOR, now=now),
        lambda s, now: services.pause_schedule(s, actor=ACTOR, now=now),
        lambda s, now: services.cancel_schedule(s, actor=ACTOR, now=now),
    ],
    ids=["update", "pause", "cancel"],
)
def test_a_new_version_cancels_unclaimed_occurrences_and_spares_claimed_or_finished_ones(hourly, verb, make_occurrence):
    at = T0 + timedelta(hours=1)
    now = T0 + timedelta(minutes=59)
    unclaimed = {
        state: make_occurrence(hourly, version=1, at=at + timedelta(seconds=n), state=state)
        for n, state in enumerate(
            [OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED, OccurrenceState.RETRY_WAIT], start=1
        )
    }
    kept = {
        state: make_occurrence(hourly, version=1, at=at - timedelta(minutes=n), state=state)
        for n, state in enumerate([OccurrenceState.RUNNING, OccurrenceState.SUCCEEDED, OccurrenceState.DEAD], start=1)
    }

    verb(hourly, now)

    states = states_by_id(hourly)
    assert {states[o.occurrence_id] for o in unclaimed.values()} == {OccurrenceState.CANCELED}
    assert {state: states[o.occurrence_id] for state, o in kept.items()} == {state: state for state in kept}
    assert Occurrence.objects.get(pk=unclaimed[OccurrenceState.SCHEDULED].pk).finished_at == now


def test_cancel_reports_the_running_occurrence_in_flight_and_leaves_it_running(hourly, make_occurrence):
    running = make_occurrence(hourly, version=1, at=T0 + timedelta(hours=1), state=OccurrenceState.RUNNING)
    waiting = make_occurrence(hourly, version=1, at=T0 + timedelta(hours=2), state=OccurrenceState.SCHEDULED)

    result = services.cancel_schedule(hourly, actor=ACTOR, now=T0 + timedelta(hours=1, seconds=5))

    assert result.schedule.state == ScheduleState.CANCELED
    assert [(i.occurrence_id, i.state) for i in result.in_flight] == [(running.occurrence_id, "running")]
    assert states_by_id(hourly) == {
        running.occurrence_id: OccurrenceState.RUNNING,
        waiting.occurrence_id: OccurrenceState.CANCELED,
    }


def test_invalidation_spares_occurrences_that_already_carry_the_new_version(hourly, make_occurrence):
    older = make_occurrence(hourly, version=1, at=T0 + timedelta(hours=1), state=OccurrenceState.SCHEDULED)
    newer = make_occurrence(hourly, version=2, at=T0 + timedelta(hours=2), state=OccurrenceState.SCHEDULED)

    services.update_schedule(hourly, {"priority": 2}, actor=ACTOR, now=T0)

    assert states_by_id(hourly) == {
        older.occurrence_id: OccurrenceState.CANCELED,
        newer.occurrence_id: OccurrenceState.SCHEDULED,
    }


def test_resume_of_an_active_schedule_writes_no_version(hourly):
    services.resume_schedule(hourly, actor=ACTOR, now=T0)

    hourly.refresh_from_db()
    assert hourly.version == 1
    assert ScheduleVersion.objects.filter(schedule=hourly).count() == 1


# --- cursors with a driven clock ------------------------------------------------------------------------


def test_create_sets_the_cursor_to_the_first_fire_after_now(hourly):
    assert hourly.next_run_at == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)
    assert hourly.state == ScheduleState.ACTIVE


def test_resume_does_not_catch_up_the_fires_of_the_pause(hourly):
    services.pause_schedule(hourly, actor=ACTOR, now=T0 + timedelta(minutes=5))
    resumed_at = T0 + timedelta(hours=5, minutes=30)

    resumed = services.resume_schedule(hourly, actor=ACTOR, now=resumed_at)

    assert resumed.state == ScheduleState.ACTIVE
    assert resumed.next_run_at == datetime(2026, 6, 1, 18, 0, tzinfo=UTC)


def test_pause_clears_the_cursor_and_is_idempotent(hourly):
    paused = services.pause_schedule(hourly, actor=ACTOR, now=T0)
    again = services.pause_schedule(paused, actor=ACTOR, now=T0 + timedelta(minutes=1))

    assert again.state == ScheduleState.PAUSED
    assert again.next_run_at is None
    assert again.version == 2


def stored_cursor(schedule: Schedule) -> dict | None:
    """The schedule's cursor row as the materializer reads it, or None when it has none."""
    return ScheduleCursor.objects.filter(schedule_id=schedule.pk).values().first()


def test_the_cursor_row_carries_the_definition_the_materializer_plans_from_through_every_verb(hourly):
    def assert_follows(schedule: Schedule) -> None:
        schedule.refresh_from_db()
        row = stored_cursor(schedule)
        assert row is not None, "an active schedule has its cursor row"
        assert {field: row[field] for field in PLANNING_FIELDS} == {f: getattr(schedule, f) for f in PLANNING_FIELDS}
        assert (row["version"], row["tenant_id"], row["shard"]) == (
            schedule.version,
            schedule.tenant_id,
            schedule.shard,
        )
        assert row["next_run_at"] == schedule.next_run_at

    assert_follows(hourly)
    updated = services.update_schedule(
        hourly, {"cron": "30 * * * *", "timezone": "Asia/Kolkata", "lane": "flexible"}, actor=ACTOR, now=T0
    )
    assert_follows(updated)
    # Minute 30 in Kolkata (+05:30) is minute 0 in UTC: the next after 12:00 UTC (17:30 there) is 13:00 UTC.
    assert stored_cursor(updated)["next_run_at"] == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)

    paused = services.pause_schedule(updated, actor=ACTOR, now=T0 + timedelta(minutes=1))
    assert stored_cursor(paused) is None, "a paused schedule has nothing for the materializer"
    resumed = services.resume_schedule(paused, actor=ACTOR, now=T0 + timedelta(hours=2))
    assert_follows(resumed)
    assert stored_cursor(resumed)["next_run_at"] == datetime(2026, 6, 1, 15, 0, tzinfo=UTC)

    services.cancel_schedule(resumed, actor=ACTOR, now=T0 + timedelta(hours=3))
    assert stored_cursor(resumed) is None


def test_a_save_without_a_new_cursor_keeps_where_the_materializer_stands(hourly):
    # The materializer moved the cursor after this instance was loaded; a save of the definition must not put it back.
    ScheduleCursor.objects.filter(schedule_id=hourly.pk).update(next_run_at=T0 + timedelta(hours=3))
    hourly.name = "renamed"
    hourly.save()
    assert stored_cursor(hourly)["next_run_at"] == T0 + timedelta(hours=3)


def test_pause_of_a_canceled_schedule_is_a_conflict(hourly):
    services.cancel_schedule(hourly, actor=ACTOR, now=T0)

    with pytest.raises(StateConflict):
        services.pause_schedule(hourly, actor=ACTOR, now=T0)


def test_a_once_schedule_whose_run_at_passed_keeps_run_at_as_its_cursor_on_create(tenant):
    run_at = T0 - timedelta(minutes=3)

    schedule, _ = services.create_schedule(
        tenant=tenant,
        data={"name": "late", "kind": "once", "run_at": run_at, "handler": "noop"},
        actor=ACTOR,
        now=T0,
    )

    assert schedule.next_run_at == run_at
    assert schedule.state == ScheduleState.ACTIVE


def test_a_once_schedule_in_the_future_has_its_run_at_as_cursor(tenant):
    run_at = T0 + timedelta(days=3)

    schedule, _ = services.create_schedule(
        tenant=tenant,
        data={"name": "later", "kind": "once", "run_at": run_at, "handler": "noop"},
        actor=ACTOR,
        now=T0,
    )

    assert schedule.next_run_at == run_at


def test_update_switching_kind_from_cron_to_once_drops_the_cron(hourly):
    run_at = T0 + timedelta(days=1)

    updated = services.update_schedule(hourly, {"kind": "once", "run_at": run_at}, actor=ACTOR, now=T0)

    assert updated.kind == "once"
    assert updated.cron is None
    assert updated.run_at == run_at
    assert updated.next_run_at == run_at
    stored = Schedule.objects.get(pk=hourly.pk)
    assert (stored.kind, stored.cron) == ("once", None)


def test_update_switching_kind_from_once_to_cron_drops_run_at(tenant):
    schedule, _ = services.create_schedule(
        tenant=tenant,
        data={"name": "once", "kind": "once", "run_at": T0 + timedelta(days=1), "handler": "noop"},
        actor=ACTOR,
        now=T0,
    )

    updated = services.update_schedule(schedule, {"kind": "cron", "cron": "*/15 * * * *"}, actor=ACTOR, now=T0)

    assert updated.run_at is None
    assert updated.next_run_at == T0 + timedelta(minutes=15)


def test_update_of_the_zone_affects_only_fires_after_now(tenant):
    schedule, _ = services.create_schedule(
        tenant=tenant,
        data={"name": "nine", "kind": "cron", "cron": "0 9 * * *", "timezone": "Europe/Madrid", "handler": "noop"},
        actor=ACTOR,
        now=T0,
    )
    assert schedule.next_run_at == datetime(2026, 6, 2, 7, 0, tzinfo=UTC)  # 09:00 CEST

    updated = services.update_schedule(schedule, {"timezone": "Australia/Adelaide"}, actor=ACTOR, now=T0)

    assert updated.next_run_at == datetime(2026, 6, 1, 23, 30, tzinfo=UTC)  # 09:00 ACST (+09:30)
    assert updated.version == 2


def test_update_with_an_invalid_change_raises_and_leaves_the_schedule(hourly):
    with pytest.raises(ScheduleInvalid) as caught:
        services.update_schedule(hourly, {"timezone": "Nowhere/City"}, actor=ACTOR, now=T0)

    assert "timezone" in caught.value.errors
    hourly.refresh_from_db()
    assert (hourly.version, hourly.timezone) == (1, "UTC")
    assert ScheduleVersion.objects.filter(schedule=hourly).count() == 1


def test_trigger_without_a_key_uses_the_instant_so_two_triggers_are_two_occurrences(hourly):
    first = services.trigger_schedule(hourly, actor=ACTOR, now=T0 + timedelta(seconds=1))
    second = services.trigger_schedule(hourly, actor=ACTOR, now=T0 + timedelta(seconds=2))
    repeated = services.trigger_schedule(hourly, actor=ACTOR, now=T0 + timedelta(seconds=3), trigger_key="k")
    same = services.trigger_schedule(hourly, actor=ACTOR, now=T0 + timedelta(seconds=4), trigger_key="k")

    assert len({first, second, repeated}) == 3
    assert repeated == same
    assert Occurrence.objects.filter(schedule=hourly, manual=True).count() == 3


# --- idempotent create under a race ---------------------------------------------------------------------


def test_a_create_that_loses_the_idempotency_race_returns_the_winner(tenant, monkeypatch):
    data = {"name": "raced", "kind": "cron", "cron": "0 * * * *", "handler": "noop"}
    winner, created = services.create_schedule(tenant=tenant, data=data, actor=ACTOR, idempotency_key="race", now=T0)
    assert created
    real_lookup = services._existing_for_key
    calls = []

    def lookup_that_misses_first(*args):
        # The loser's first look happens before the winner commits, so it sees nothing.
        calls.append(args)
        return None if len(calls) == 1 else real_lookup(*args)

    monkeypatch.setattr(services, "_existing_for_key", lookup_that_misses_first)

    loser, created = services.create_schedule(tenant=tenant, data=data, actor=ACTOR, idempotency_key="race", now=T0)

    assert not created
    assert loser.pk == winner.pk
    assert len(calls) == 2  # the second look is the IntegrityError path
    assert Schedule.objects.filter(tenant=tenant, idempotency_key="race").count() == 1
    assert ScheduleVersion.objects.filter(schedule=winner).count() == 1


def test_a_create_that_loses_the_race_with_another_body_is_a_conflict(tenant, monkeypatch):
    data = {"name": "raced", "kind": "cron", "cron": "0 * * * *", "handler": "noop"}
    services.create_schedule(tenant=tenant, data=data, actor=ACTOR, idempotency_key="race-2", now=T0)
    real_lookup = services._existing_for_key
    calls = []

    def lookup_that_misses_first(*args):
        calls.append(args)
        return None if len(calls) == 1 else real_lookup(*args)

    monkeypatch.setattr(services, "_existing_for_key", lookup_that_misses_first)

    with pytest.raises(StateConflict):
        services.create_schedule(
            tenant=tenant, data={**data, "name": "other"}, actor=ACTOR, idempotency_key="race-2", now=T0
        )
    assert Schedule.objects.filter(tenant=tenant, idempotency_key="race-2").count() == 1


def test_clean_definition_reports_every_broken_rule_at_once():
    with pytest.raises(ScheduleInvalid) as caught:
        services.clean_definition({"kind": "cron", "cron": "99 * * * *", "timezone": "Nowhere", "priority": 500})

    assert {"name", "handler", "cron", "timezone", "priority"} <= set(caught.value.errors)


def test_fingerprint_ignores_key_order_but_not_values():
    assert services.fingerprint({"a": 1, "b": [1, 2]}) == services.fingerprint({"b": [1, 2], "a": 1})
    assert services.fingerprint({"a": 1}) != services.fingerprint({"a": 2})
