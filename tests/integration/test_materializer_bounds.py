"""The materializer after a long outage: bounded batches, every fire recorded once, missed fires say why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch.engine import materializer as materializer_module
from dispatch.models import Occurrence
from schedules.models import Schedule
from tests.integration.support import materializer_holding_every_shard

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
BOUND = 1200
# The policies of the schedules far behind, and how many of their latest late fires each keeps.
POLICIES = {
    "skip": ({"misfire_policy": "skip"}, 0),
    "fire-once": ({"misfire_policy": "fire_once"}, 1),
    "catch-up-10": ({"misfire_policy": "catch_up", "catchup_limit": 10}, 10),
    "catch-up-700": ({"misfire_policy": "catch_up", "catchup_limit": 700}, 700),
}


def fires_of(schedule: Schedule) -> list[datetime]:
    return list(
        Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for").values_list("scheduled_for", flat=True)
    )


def test_no_batch_plans_more_than_the_bound_and_after_enough_batches_every_fire_is_recorded_once(
    monkeypatch, tenant_a, make_schedule
):
    # raising=False: against code without the bound, the test fails on the bound itself, not on a missing name.
    monkeypatch.setattr(materializer_module, "MAX_FIRES_PER_BATCH", BOUND, raising=False)
    # A day's outage: each minutely schedule is ~1,500 fires behind, three chunks of MAX_FIRES_PER_SCHEDULE.
    created_at = NOW - 1500 * MINUTE
    schedules = {
        name: make_schedule(tenant_a.tenant, now=created_at, name=name, **fields)
        for name, (fields, _) in POLICIES.items()
    }
    first_cursors = {name: s.next_run_at for name, s in schedules.items()}
    m = materializer_holding_every_shard("bounded")

    written: list[int] = []
    while True:
        before = Occurrence.objects.count()
        if not m.step(now=NOW):
            break
        written.append(Occurrence.objects.count() - before)
        assert written[-1] <= BOUND, written
        if len(written) == 1:
            cursors = dict(
                Schedule.objects.filter(pk__in=[s.pk for s in schedules.values()]).values_list(
                    "pk", "cursor__next_run_at"
                )
            )
            untouched = [name for name, s in schedules.items() if cursors[s.pk] == first_cursors[name]]
            assert untouched, "the schedules past the bound keep their cursors for the next batch"
        assert len(written) < 50, "the batches converge"

    horizon_end = NOW + m.horizon
    lateness_limit = NOW - timedelta(seconds=60)
    for name, schedule in schedules.items():
        expected = []
        fire = first_cursors[name]
        while fire <= horizon_end:
            expected.append(fire)
            fire += MINUTE
        assert fires_of(schedule) == expected, name
        late = [f for f in expected if f < lateness_limit]
        emitted = list(
            Occurrence.objects.filter(schedule=schedule, scheduled_for__lt=lateness_limit, state="scheduled")
            .order_by("scheduled_for")
            .values_list("scheduled_for", flat=True)
        )
        keep = POLICIES[name][1]
        assert emitted == (late[-keep:] if keep else []), name


def test_a_missed_occurrence_records_in_its_state_reason_which_rule_missed_it(tenant_a, make_schedule):
    schedule = make_schedule(
        tenant_a.tenant, now=NOW - 10 * MINUTE, misfire_policy="catch_up", catchup_limit=2, max_lateness_seconds=120
    )
    materializer_holding_every_shard("reasons").step(now=NOW)

    rows = list(Occurrence.objects.filter(schedule=schedule).order_by("scheduled_for"))
    assert (rows[0].scheduled_for, rows[0].state) == (datetime(2026, 12, 1, 11, 51, tzinfo=UTC), "missed")
    assert rows[0].state_reason == "late by 570 s > max lateness 120 s (catch_up keeps the latest 2 late fires)"
    assert all(r.state_reason.startswith("late by ") for r in rows if r.state == "missed")
    assert [r.state_reason for r in rows if r.state == "scheduled"] == [""] * sum(r.state == "scheduled" for r in rows)
    assert sum(r.state == "missed" for r in rows) == 6, "11:51..11:56 missed, 11:57 and 11:58 caught up"


@pytest.mark.parametrize("bound", [1, 10])
def test_a_bound_smaller_than_one_chunk_still_takes_one_schedule_per_batch(monkeypatch, tenant_a, make_schedule, bound):
    monkeypatch.setattr(materializer_module, "MAX_FIRES_PER_BATCH", bound, raising=False)
    first = make_schedule(tenant_a.tenant, now=NOW - 30 * MINUTE, name="first")
    second = make_schedule(tenant_a.tenant, now=NOW - 30 * MINUTE, name="second")
    m = materializer_holding_every_shard("tiny-bound")
    assert m.step(now=NOW) is True
    moved = [s for s in (first, second) if Schedule.objects.get(pk=s.pk).next_run_at != s.next_run_at]
    assert len(moved) == 1
    while m.step(now=NOW):
        pass
    assert len(fires_of(first)) == len(fires_of(second)) == 33
