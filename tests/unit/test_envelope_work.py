"""A message's pool tasks per tenant: one to begin with, doubling while they run, never past the free slots."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from dispatch.engine.envelope_work import Entry, EnvelopeWork


def work_of(counts: dict[int, int]) -> EnvelopeWork:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    entries: list[tuple[int | None, Entry]] = [
        (tenant, Entry(pair=(uuid.uuid4(), at))) for tenant, count in counts.items() for _ in range(count)
    ]
    return EnvelopeWork(entries, prechecked_at=0.0)


def test_a_tenants_pool_tasks_start_one_at_a_time_then_double_while_they_run():
    work = work_of({1: 20})
    started: list[tuple[str, int]] = []
    per_round = []
    for round_ in range(5):
        # The share's free slots: what the tasks already running do not hold.
        wanted = work.drains_wanted(1, free=8 - len(started))
        per_round.append(wanted)
        scheduled = [("token", round_ * 100 + n) for n in range(wanted)]
        for task_id in scheduled:
            work.drain_scheduled(task_id, 1)
        assert work.drains_wanted(1, free=8 - len(started)) <= 0, "scheduled tasks count before they start"
        for task_id in scheduled:
            work.drain_started(task_id, holding=True)
            started.append(task_id)
    assert per_round == [1, 1, 2, 4, 0], "one, then as many again as run, up to the free slots"
    work.drain_ended(started.pop(), holding=True)
    assert work.drains_wanted(1, free=1) == 1, "a slot freed: one more task"


def test_never_more_tasks_than_occurrences_left_or_free_slots():
    work = work_of({1: 2, 2: 5})
    assert work.drains_wanted(1, free=0) == 0
    for n in range(3):
        work.drain_scheduled(("t", n), 2)
        work.drain_started(("t", n), holding=True)
    assert work.drains_wanted(2, free=8) == 3, "five left, three running: as many again"
    assert work.drains_wanted(2, free=2) == 2, "but no more than the free slots"
    work.take(2)
    work.take(2)
    work.take(2)
    assert work.drains_wanted(2, free=8) == 2, "two left: no more than them"
    assert work.drains_wanted(1, free=8) == 1


def test_a_task_that_ends_before_it_starts_is_no_longer_waiting():
    work = work_of({1: 4})
    work.drain_scheduled(("t", 1), 1)
    assert work.waiting_drains(1) == 1
    work.drain_ended(("t", 1))
    assert work.waiting_drains(1) == 0
    assert work.drains_wanted(1, free=4) == 1
