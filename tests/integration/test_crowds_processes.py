"""A fire due alone after a crowded instant does not wait for the whole crowd: a real relay routes the crowd to the
lane's crowd queue, and a real `celery worker` consuming both queues takes the lone fire in its turn."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from core.clock import db_now
from dispatch.models import TERMINAL_STATES, Attempt, Occurrence, OccurrenceState
from dispatch.queues import crowd_queue
from tests import handlers  # noqa: F401  (registers "sleep" here too: the schedule names it)
from tests.integration.fleet import Fleet, queue_depth, running_fleet
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CROWD_FIRES = 100
# The crowd: 40 envelopes of 3 fires of 0.1 s each, one message each (the relay bundles at most an envelope's size),
# 120 fires in all: about 12 s of a worker that runs one handler at a time.
CROWD_ENVELOPES, FIRES_PER_ENVELOPE, HANDLER_SECONDS = 40, 3, 0.1


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with running_fleet("crowds") as running:
        yield running


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def finished(occurrences: list[Occurrence]) -> bool:
    ids = [o.occurrence_id for o in occurrences]
    return not Occurrence.objects.filter(occurrence_id__in=ids).exclude(state__in=TERMINAL_STATES).exists()


@pytest.mark.exclusive  # its bounds are timings: measured on a box no other test is loading
def test_a_fire_due_alone_after_a_crowd_starts_in_its_turn_not_after_the_whole_crowd(
    tenant_a, tenant_b, make_schedule, fleet
):
    fleet.relay(SCHEDULER_CROWD_FIRES=str(CROWD_FIRES), SCHEDULER_ENVELOPE_SIZE=str(FIRES_PER_ENVELOPE))
    # One process, one handler at a time, no hand-back: the order the worker takes messages in is all there is.
    worker = fleet.worker(concurrency=1, SCHEDULER_WORKER_THREADS="1", SCHEDULER_ENVELOPE_SLICE_SECONDS="60")
    fleet.wait_consuming()
    # The handlers run below the relay's CPU priority, in the worker and its pool process alike.
    pids = [worker.pid, *children_of(worker.pid)]
    assert len(pids) == 2, pids
    for pid in pids:
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 5, pid
    t0 = db_now().replace(microsecond=0) + timedelta(seconds=2)
    crowd = fleet.due(
        make_schedule,
        tenant_a.tenant,
        CROWD_ENVELOPES * FIRES_PER_ENVELOPE,
        t0,
        envelope=FIRES_PER_ENVELOPE,
        handler="sleep",
        payload={"seconds": HANDLER_SECONDS},
    )
    lone = fleet.due(make_schedule, tenant_b.tenant, 1, t0 + timedelta(seconds=2), envelope=FIRES_PER_ENVELOPE)

    wait_for(lambda: finished(lone), 60, "the lone fire to run")
    # The crowd went to the lane's crowd queue, and most of it is still waiting there when the lone fire has run.
    waiting = queue_depth(crowd_queue(fleet.strict))
    assert waiting >= CROWD_ENVELOPES // 4, waiting
    wait_for(lambda: finished(crowd), 90, "the crowd to run")

    lone_attempt = Attempt.objects.get(occurrence_id=lone[0].occurrence_id)
    assert lone_attempt.outcome == "succeeded"
    late = (lone_attempt.started_at - lone[0].available_at).total_seconds()
    # Behind the whole crowd it would start ~10 s late; in its turn it waits for the crowd's envelope in hand and the
    # few RabbitMQ hands out before it (each queue has an even chance at every free slot).
    assert late <= 4.0, late
    crowd_starts = sorted(
        Attempt.objects.filter(occurrence_id__in=[o.occurrence_id for o in crowd]).values_list("started_at", flat=True)
    )
    assert len(crowd_starts) == len(crowd)
    after_lone = [start for start in crowd_starts if start > lone_attempt.started_at]
    assert len(after_lone) >= len(crowd) // 4, "most of the crowd ran after the lone fire"
    assert set(Occurrence.objects.filter(pk__in=[o.pk for o in crowd]).values_list("state", flat=True)) == {
        OccurrenceState.SUCCEEDED
    }
