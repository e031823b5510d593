"""The relay's staging through the PriorityTimer: release at the instant, priority first, withdrawn dropped."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from core.clock import db_now
from dispatch.engine import loop
from dispatch.engine.relay import Relay
from dispatch.models import Occurrence, OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from schedules.services import cancel_schedule
from tests.integration.test_relay_process import drain_queue
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staged_fire(make_schedule, make_occurrence):
    """A strict occurrence at `at` of a new schedule of that priority, with its envelope on the outbox."""

    def stage(tenant, name: str, *, at, priority: int = 0):
        schedule = make_schedule(tenant, name=name, priority=priority)
        occurrence = make_occurrence(schedule, at=at, version=1, lane="strict", priority=priority)
        with connection.cursor() as cursor:
            enqueue(cursor, [Fire(occurrence.occurrence_id, at, tenant.id, STRICT_QUEUE, at, priority)])
        return schedule, occurrence

    return stage


def run_relay_once(relay: Relay, *, whole_step: bool = False) -> None:
    """One publish pass of the relay (with `whole_step`, its loop's whole step: the pass and what follows it)."""

    async def once() -> None:
        await relay.connect()
        try:
            await (relay.step() if whole_step else relay.publish_due())
        finally:
            await relay.close()

    asyncio.run(once())


def test_staged_envelopes_leave_at_their_instant_in_priority_order(tenant_a, staged_fire):
    drain_queue(STRICT_QUEUE)
    at = db_now() + timedelta(seconds=0.6)
    _, low = staged_fire(tenant_a.tenant, "low", at=at, priority=-5)
    _, high = staged_fire(tenant_a.tenant, "high", at=at, priority=50)
    _, middle = staged_fire(tenant_a.tenant, "middle", at=at, priority=0)
    run_relay_once(Relay("staging-test"))
    stamps = list(OutboxMessage.objects.values_list("published_at", flat=True))
    assert len(stamps) == 3 and all(stamp >= at for stamp in stamps), "nothing is published before its instant"
    # The order a worker meets them in: messages in queue order, and within a message (envelopes due together share
    # one) its envelopes in release order.
    order = [occurrence for m in drain_queue(STRICT_QUEUE) for occurrence in m["occurrences"]]
    assert order == [str(high.occurrence_id), str(middle.occurrence_id), str(low.occurrence_id)]


def test_a_staged_envelope_whose_occurrences_were_withdrawn_is_dropped_unpublished(tenant_a, staged_fire, settings):
    # A lead long enough to see the relay claim both and withdraw one before their instant, on a busy box too.
    settings.SCHEDULER_RELAY_STAGE_SECONDS = 3.0
    drain_queue(STRICT_QUEUE)
    at = db_now() + timedelta(seconds=2.5)
    doomed_schedule, doomed = staged_fire(tenant_a.tenant, "doomed", at=at)
    _, kept = staged_fire(tenant_a.tenant, "kept", at=at)
    relay = Relay("withdraw-test")
    thread = threading.Thread(target=lambda: (run_relay_once(relay), connections.close_all()))
    thread.start()
    claimed = OutboxMessage.objects.filter(lease_owner__isnull=False)
    wait_for(lambda: claimed.count() == 2, 10, "the relay to claim and stage both")
    cancel_schedule(doomed_schedule, actor="test")
    assert db_now() < at, "withdrawn before the instant (else the test proves nothing)"
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert relay.stats.withdrawn_envelopes == 1
    delivered = [m["occurrences"][0] for m in drain_queue(STRICT_QUEUE)]
    assert delivered == [str(kept.occurrence_id)]
    assert Occurrence.objects.get(pk=doomed.pk).state == "canceled"


def test_a_step_that_published_a_bursts_fires_hands_their_memory_back_and_a_steady_one_keeps_it(
    tenant_a, staged_fire, monkeypatch
):
    """A burst's staged bodies are freed once published, but the allocator keeps their pages unless told."""
    trims: list[bool] = []
    monkeypatch.setattr(loop, "return_free_memory", lambda: trims.append(True) or True)
    monkeypatch.setattr(loop, "TRIM_AFTER_FIRES", 2)
    drain_queue(STRICT_QUEUE)

    def step_with(fires: int) -> Relay:
        at = db_now()
        for n in range(fires):
            staged_fire(tenant_a.tenant, f"due-{fires}-{n}", at=at)
        relay = Relay(f"trim-test-{fires}")
        run_relay_once(relay, whole_step=True)
        return relay

    assert step_with(2).stats.published_occurrences == 2
    assert trims == [True], "two fires at the bound: trimmed once"
    assert step_with(1).stats.published_occurrences == 1
    assert trims == [True], "one fire: the steady step keeps its pages"
    drain_queue(STRICT_QUEUE)
