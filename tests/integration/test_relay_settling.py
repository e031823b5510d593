"""Settling keeps up with publishing: a real relay process under a steady stream of envelopes for a minute."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from core.clock import db_now
from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from tests.integration.test_faults_connections import Running
from tests.integration.test_relay_process import drain_queue
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RATE = 100  # envelopes a second
SECONDS = 60


def steady_stream(schedule, *, rate: int, seconds: int, lead: float) -> int:
    """`rate` one-fire envelopes a second for `seconds`, the first `lead` seconds from now; returns their count."""
    start = db_now() + timedelta(seconds=lead)
    instants = [start + timedelta(seconds=n / rate) for n in range(rate * seconds)]
    rows = [
        Occurrence(
            occurrence_id=occurrence_id_for(schedule.id, 1, at),
            schedule=schedule,
            tenant_id=schedule.tenant_id,
            schedule_version=1,
            scheduled_for=at,
            available_at=at,
            lane="strict",
        )
        for at in instants
    ]
    Occurrence.objects.bulk_create(rows, batch_size=2000)
    fires = [Fire(r.occurrence_id, r.scheduled_for, schedule.tenant_id, STRICT_QUEUE, r.available_at, 0) for r in rows]
    with connection.cursor() as cursor:
        enqueue(cursor, fires, size=1)
    return len(rows)


def unsettled() -> int:
    return OutboxMessage.objects.filter(published_at__isnull=False).count()


@pytest.mark.exclusive  # its bounds are timings: measured on a box no other test is loading
def test_settling_keeps_up_with_a_hundred_envelopes_a_second_for_a_minute(tenant_a, make_schedule):
    """Before, the relay settled 20 envelopes per step at most once a second: at 40 envelopes a second the unsettled
    rows grew from 181 to 1,524 in 48 s, and at 100 a second they would grow by ~90 a second for the whole minute."""
    drain_queue(STRICT_QUEUE)
    schedule = make_schedule(tenant_a.tenant, name="steady")
    fires = steady_stream(schedule, rate=RATE, seconds=SECONDS, lead=3.0)
    relay = Running("relay", "--name", "steady-relay")
    samples: list[int] = []
    try:
        deadline = time.monotonic() + SECONDS + 5
        while time.monotonic() < deadline:
            samples.append(unsettled())
            time.sleep(0.5)
        wait_for(lambda: not OutboxMessage.objects.exists(), 60, "the outbox to empty once the stream ended")
    finally:
        assert relay.stop() == 0, relay.text()
    # Bounded: never more than five seconds of the stream waits to be settled (it grew without bound before).
    assert max(samples) <= 5 * RATE, f"unsettled envelopes peaked at {max(samples)}: {samples}"
    assert Occurrence.objects.filter(schedule_id=schedule.id, enqueued_at__isnull=True).count() == 0
    assert Occurrence.objects.filter(schedule_id=schedule.id, state="enqueued").count() == fires
    # Every fire on the queue (envelopes due together share messages: count occurrences, not messages).
    assert sum(len(m["occurrences"]) for m in drain_queue(STRICT_QUEUE)) >= fires
