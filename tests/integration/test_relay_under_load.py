"""The relay under continuous traffic and with its channel gone: settling keeps up, failures back off."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from django.db import connection

from core.clock import db_now
from dispatch.engine.publishing import PublishFailed
from dispatch.engine.relay import Relay
from dispatch.models import OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE
from tests.integration.test_relay_process import drain_queue

pytestmark = pytest.mark.django_db(transaction=True)


def stream_of_envelopes(make_schedule, make_occurrence, tenant, *, count: int, every: float) -> None:
    """`count` one-occurrence envelopes, one due every `every` seconds from now on: continuous traffic."""
    schedule = make_schedule(tenant, name="stream")
    start = db_now()
    fires = []
    for n in range(count):
        at = start + timedelta(seconds=every * n)
        occurrence = make_occurrence(schedule, at=at, version=1, lane="strict")
        fires.append(Fire(occurrence.occurrence_id, at, tenant.id, STRICT_QUEUE, at, 0))
    with connection.cursor() as cursor:
        enqueue(cursor, fires, size=1)


def test_settling_progresses_while_envelopes_keep_falling_due(tenant_a, make_schedule, make_occurrence):
    drain_queue(STRICT_QUEUE)
    stream_of_envelopes(make_schedule, make_occurrence, tenant_a.tenant, count=40, every=0.1)
    relay = Relay("stream-relay")

    async def drive() -> int:
        await relay.connect()
        # Settling runs beside the publishing steps, as in the relay process.
        settling = asyncio.create_task(relay.settler.run(relay.stop))
        try:
            # Stop half a second before the last envelope falls due: the stream is still flowing then.
            stop_at = time.monotonic() + 3.4
            while time.monotonic() < stop_at:
                if not await relay.step():
                    await asyncio.sleep(0.02)
            return relay.stats.settled_envelopes
        finally:
            settling.cancel()
            await asyncio.gather(settling, return_exceptions=True)
            await relay.close()

    settled_while_streaming = asyncio.run(drive())

    assert relay.stats.published_envelopes >= 30
    assert settled_while_streaming > 0, "settling must not wait for a quiet moment that never comes"
    drain_queue(STRICT_QUEUE)


def test_a_batch_that_could_not_be_published_raises_so_the_relay_backs_off(tenant_a, make_schedule, make_occurrence):
    drain_queue(STRICT_QUEUE)
    stream_of_envelopes(make_schedule, make_occurrence, tenant_a.tenant, count=3, every=0.001)
    relay = Relay("dead-channel-relay")

    async def publish_on_a_closed_channel() -> None:
        await relay.connect()
        try:
            await relay.channel.close()
            with pytest.raises(PublishFailed):
                await relay.publish_due()
        finally:
            await relay.close()

    asyncio.run(publish_on_a_closed_channel())

    assert OutboxMessage.objects.filter(published_at__isnull=True).count() == 3, "nothing stamped unsent"
    assert relay.stats.failed_publishes == 3


def test_settling_goes_on_while_the_publishers_loop_is_busy(tenant_a, make_schedule, make_occurrence):
    """The settler has a thread and an event loop of its own: the publisher's loop held for seconds (a burst's
    thousands of publish callbacks) does not hold back settling what was already stamped. On the publisher's loop,
    nothing was settled until the loop was free again."""
    drain_queue(STRICT_QUEUE)
    stream_of_envelopes(make_schedule, make_occurrence, tenant_a.tenant, count=20, every=0.001)
    relay = Relay("busy-loop-relay")

    async def drive() -> int:
        await relay.connect()
        relay.settler.start_thread()
        try:
            while relay.stats.published_envelopes < 20:
                await relay.step()
            busy_until = time.monotonic() + 5.0
            while time.monotonic() < busy_until and relay.stats.settled_envelopes < 20:
                sum(range(1000))  # the publisher's loop busy with work of its own: it never yields
            return relay.stats.settled_envelopes
        finally:
            await asyncio.to_thread(relay.settler.stop_thread)
            await relay.close()

    settled_while_busy = asyncio.run(drive())

    assert settled_while_busy == 20, "every stamped envelope was settled while the publisher's loop was busy"
    assert OutboxMessage.objects.count() == 0
    drain_queue(STRICT_QUEUE)
