"""A limited number of runs (max_runs, remaining_runs) through the API, the materializer, the control plane's
changes, reconcile and the console: only the first max_runs fires exist, missed ones count, manual triggers do not,
and at 0 the schedule is completed (docs/API.md, "The time model")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch.models import Occurrence
from dispatch.reconcile import reconcile
from schedules.models import Schedule
from schedules.services import pause_schedule, resume_schedule, update_schedule
from tests.integration.processes import run_manage
from tests.integration.support import (
    TEST_HORIZON_SECONDS,
    form_data,
    materializer_holding_every_shard,
    run_materializer,
)
from tests.integration.test_admin_console import SCHEDULES_URL, change_url
from tests.integration.test_api_schedules import SCHEDULES

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


# Materialized and never run by a worker, every row would be stuck: these tests are about gaps.
pytestmark = pytest.mark.usefixtures("gaps_only")


def every_minute(**fields) -> dict:
    return {"name": "limited", "kind": "cron", "cron": "* * * * *", "handler": "noop", **fields}


def rows_of(schedule_id) -> list[tuple[datetime, str]]:
    rows = Occurrence.objects.filter(schedule_id=schedule_id, manual=False).order_by("scheduled_for")
    return list(rows.values_list("scheduled_for", "state"))


def test_the_limit_and_the_runs_left_are_shown_and_null_without_a_limit(api_a):
    limited = api_a.post(SCHEDULES, every_minute(max_runs=3), format="json")
    plain = api_a.post(SCHEDULES, every_minute(), format="json")

    assert limited.status_code == 201, limited.content
    assert (limited.json()["max_runs"], limited.json()["remaining_runs"]) == (3, 3)
    assert (plain.json()["max_runs"], plain.json()["remaining_runs"]) == (None, None)


@pytest.mark.parametrize("value", [0, -1, "three", 2**31, True])
def test_a_limit_that_is_not_a_positive_integer_is_a_400_naming_max_runs(api_a, value):
    for path in (SCHEDULES, f"{SCHEDULES}preview/"):
        response = api_a.post(path, every_minute(max_runs=value), format="json")

        assert response.status_code == 400, response.content
        assert "max_runs" in response.json()


def test_remaining_runs_is_read_only(api_a):
    created = api_a.post(SCHEDULES, every_minute(max_runs=3), format="json").json()

    response = api_a.patch(f"{SCHEDULES}{created['id']}/", {"remaining_runs": 10}, format="json")

    assert response.status_code == 400
    assert "remaining_runs" in response.json()


def test_the_preview_lists_only_the_fires_left(api_a):
    body = every_minute(max_runs=3, after="2030-01-01T00:00:00Z", count=10)
    fires = api_a.post(f"{SCHEDULES}preview/", body, format="json").json()["fires"]

    assert [fire["at"] for fire in fires] == ["2030-01-01T00:01:00Z", "2030-01-01T00:02:00Z", "2030-01-01T00:03:00Z"]


def test_only_the_first_fires_are_written_then_the_schedule_completes_and_reconcile_expects_no_more(
    tenant_a, make_schedule
):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="* * * * *", max_runs=3)
    materializer = materializer_holding_every_shard("max-runs")

    run_materializer(materializer, *(T0 + MINUTE * step for step in range(10)))

    assert [at for at, _ in rows_of(schedule.id)] == [T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE]
    schedule = Schedule.objects.get(pk=schedule.id)
    assert (schedule.remaining_runs_now, schedule.next_run_at, schedule.state) == (0, None, "active")
    report = reconcile(since=T0, until=T0 + 10 * MINUTE, tenant_id=tenant_a.tenant.id, now=T0 + 10 * MINUTE)
    assert report.ok, report.as_dict(gap_limit=5)
    assert report.expected == 3

    Occurrence.objects.filter(schedule_id=schedule.id).update(state="succeeded", finished_at=T0 + 10 * MINUTE)
    materializer.complete_fired_one_offs()

    schedule = Schedule.objects.get(pk=schedule.id)
    assert (schedule.state, schedule.remaining_runs_now) == ("completed", 0)


def test_missed_fires_take_their_runs(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="* * * * *", max_runs=3, max_lateness_seconds=0)
    materializer = materializer_holding_every_shard("max-runs-missed")

    # The materializer wakes ten minutes late: every fire is past its lateness, recorded missed.
    run_materializer(materializer, T0 + 10 * MINUTE)

    assert rows_of(schedule.id) == [(T0 + MINUTE * k, "missed") for k in (1, 2, 3)]
    assert Schedule.objects.get(pk=schedule.id).remaining_runs_now == 0


def test_a_pause_gives_back_the_runs_of_the_fires_it_withdraws_and_a_resume_goes_on_with_the_rest(
    tenant_a, make_schedule
):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="* * * * *", max_runs=6)
    materializer = materializer_holding_every_shard("max-runs-pause")
    # Written a horizon ahead: at T0 + 1.5 min the fires of the next three minutes are written too.
    run_materializer(materializer, T0 + 1.5 * MINUTE)
    written = len(rows_of(schedule.id))
    assert written == 1 + int(TEST_HORIZON_SECONDS // 60)

    paused = pause_schedule(schedule, actor="test", now=T0 + 1.5 * MINUTE)

    # Only the fire at T0 + 1 min has come; the others were withdrawn and their runs given back.
    assert paused.remaining_runs_now == 5
    resumed = resume_schedule(paused, actor="test", now=T0 + 30 * MINUTE)
    assert resumed.remaining_runs_now == 5
    run_materializer(materializer, *(T0 + 30 * MINUTE + MINUTE * step for step in range(10)))
    happened = [at for at, state in rows_of(schedule.id) if state != "canceled"]
    assert happened == [T0 + MINUTE] + [T0 + 30 * MINUTE + MINUTE * k for k in range(1, 6)]
    report = reconcile(since=T0, until=T0 + 40 * MINUTE, tenant_id=tenant_a.tenant.id, now=T0 + 40 * MINUTE)
    assert report.ok, report.as_dict(gap_limit=5)
    assert report.expected == 6


@pytest.mark.parametrize(("new_limit", "left"), [(8, 7), (2, 1), (1, 0), (None, None)])
def test_a_changed_limit_moves_the_runs_left_by_as_much(tenant_a, make_schedule, new_limit, left):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="0 * * * *", max_runs=5)
    materializer = materializer_holding_every_shard("max-runs-change")
    run_materializer(materializer, T0 + 61 * MINUTE)  # one fire written and come: 4 left

    changed = update_schedule(schedule, {"max_runs": new_limit}, actor="test", now=T0 + 61 * MINUTE)

    assert changed.remaining_runs_now == left
    if left == 0:
        assert changed.next_run_at is None, "no run left: the cursor stops"


def test_a_manual_trigger_takes_no_run(api_a):
    created = api_a.post(SCHEDULES, every_minute(max_runs=2, cron="0 0 1 1 *"), format="json").json()

    triggered = api_a.post(f"{SCHEDULES}{created['id']}/trigger/")

    assert triggered.status_code == 202, triggered.content
    assert api_a.get(f"{SCHEDULES}{created['id']}/").json()["remaining_runs"] == 2


def test_the_change_form_sets_a_limit_and_the_list_shows_the_runs_left(console, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, cron="0 9 * * *")

    response = console.post(change_url(schedule), form_data(schedule, max_runs=4))

    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.max_runs, schedule.remaining_runs_now, schedule.version) == (4, 4, 2)
    assert "4 of 4 runs left" in console.get(SCHEDULES_URL).content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_real_materializer_process_writes_only_the_runs_left(tenant_a, api_a):
    """Its horizon holds far more fires of a 2 s interval than the limit: it writes three, and stops the cursor."""
    response = api_a.post(
        SCHEDULES,
        {"name": "three", "kind": "interval", "every_seconds": 2, "max_runs": 3, "handler": "noop"},
        format="json",
    )
    assert response.status_code == 201, response.content
    created = response.json()

    finished = run_manage("materialize", "--once", "--name", "max-runs-process")

    assert finished.returncode == 0, finished.stderr[-2000:]
    first = datetime.fromisoformat(created["next_run_at"])
    assert [at for at, _ in rows_of(created["id"])] == [first + timedelta(seconds=2 * k) for k in range(3)]
    shown = api_a.get(f"{SCHEDULES}{created['id']}/").json()
    assert shown["remaining_runs"] == 0


def test_a_limit_set_later_counts_from_the_change_not_from_the_fires_written_ahead_without_one(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0, kind="interval", every_seconds=10, anchor_at=T0)
    materializer = materializer_holding_every_shard("max-runs-later")
    run_materializer(materializer, T0 + timedelta(seconds=5))  # a horizon of fires written ahead, no limit
    assert len(rows_of(schedule.id)) > 3

    changed = update_schedule(schedule, {"max_runs": 3}, actor="test", now=T0 + timedelta(seconds=5))

    assert changed.remaining_runs_now == 3
    run_materializer(materializer, *(T0 + timedelta(seconds=10 * step + 5) for step in range(10)))
    happened = [at for at, state in rows_of(schedule.id) if state != "canceled"]
    assert happened == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]


def test_a_lowered_limit_counts_the_fires_it_withdraws_back_first(tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="* * * * *", max_runs=10)
    materializer = materializer_holding_every_shard("max-runs-lower")
    run_materializer(materializer, T0 + 1.5 * MINUTE)  # one come, three written ahead: six left

    changed = update_schedule(schedule, {"max_runs": 4}, actor="test", now=T0 + 1.5 * MINUTE)

    assert changed.remaining_runs_now == 3, "10 - 4 written + 3 given back, lowered by 6"
    run_materializer(materializer, *(T0 + MINUTE * step for step in range(2, 12)))
    assert len([at for at, state in rows_of(schedule.id) if state != "canceled"]) == 4


def test_a_schedule_that_used_up_its_runs_stays_completed_when_changed(api_a, tenant_a, make_schedule):
    schedule = make_schedule(tenant_a.tenant, now=T0, cron="* * * * *", max_runs=1)
    materializer = materializer_holding_every_shard("max-runs-used-up")
    run_materializer(materializer, T0 + MINUTE)
    Occurrence.objects.filter(schedule_id=schedule.id).update(state="succeeded", finished_at=T0 + MINUTE)
    materializer.complete_fired_one_offs()

    changed = update_schedule(Schedule.objects.get(pk=schedule.id), {"name": "renamed"}, actor="t", now=T0 + 2 * MINUTE)

    assert (changed.state, changed.remaining_runs_now, changed.next_run_at) == ("completed", 0, None)
    raised = update_schedule(changed, {"max_runs": 3}, actor="t", now=T0 + 3 * MINUTE)
    assert (raised.state, raised.remaining_runs_now) == ("active", 2), "a raised limit revives it"
