"""Relay leases on envelopes: who may claim an envelope, who may stamp it, and a refused publish's backoff, as two
relays (two PostgreSQL connections) see them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.db import connection

from core.clock import db_now
from dispatch.engine import relay_claims
from dispatch.engine.relay import Relay
from dispatch.models import OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.queues import STRICT_QUEUE

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def due_envelope(make_schedule, make_occurrence, tenant_a) -> int:
    """One strict envelope due a second ago; its id."""
    schedule = make_schedule(tenant_a.tenant, name="leased")
    at = db_now() - timedelta(seconds=1)
    occurrence = make_occurrence(schedule, at=at, version=1, lane="strict")
    with connection.cursor() as cursor:
        enqueue(cursor, [Fire(occurrence.occurrence_id, at, tenant_a.tenant.id, STRICT_QUEUE, at, 0)])
    return OutboxMessage.objects.get().id


async def claim(relay: Relay) -> set[int]:
    """What `relay` claims now: its fair shares of every due tenant's envelopes, leased to it."""
    grants, _ = await relay_claims.reserve(relay.db, owner=relay.owner, lead=relay.stage_seconds)
    shares = relay_claims.lane_shares(grants, batch_size=relay.batch_size, flexible_min_share=0.1, rotation=0)
    staged = await relay_claims.claim(
        relay.db, grants, shares, owner=relay.owner, lead=relay.stage_seconds, lease=relay.lease_seconds
    )
    return set(staged)


def with_relays(*names: str):
    """Run `scenario(relays...)` with connected relays (each its own PostgreSQL connection), closing them after."""

    def run(scenario) -> None:
        async def main() -> None:
            relays = [Relay(name) for name in names]
            try:
                for relay in relays:
                    await relay.connect()
                await scenario(*relays)
            finally:
                for relay in relays:
                    await relay.close()

        asyncio.run(main())

    return run


def test_an_envelope_leased_to_a_live_relay_is_not_claimed_by_another_and_its_stamp_is_the_holder_s(due_envelope):
    async def scenario(first: Relay, second: Relay) -> None:
        assert await claim(first) == {due_envelope}
        assert await claim(second) == set(), "leased to a relay that is connected"
        assert await second.seconds_until_due() > 0, "and the other relay sleeps instead of polling it"
        now = await first._scalar("SELECT clock_timestamp()")
        assert await relay_claims.finish(second.db, {due_envelope: now}, refused=set(), owner=second.owner) == set()
        assert await relay_claims.finish(first.db, {due_envelope: now}, refused=set(), owner=first.owner) == {
            due_envelope
        }

    with_relays("lease-a", "lease-b")(scenario)
    envelope = OutboxMessage.objects.get()
    assert envelope.published_at is not None and envelope.lease_owner is None


def test_an_expired_lease_is_taken_over_and_the_old_holder_can_no_longer_stamp(due_envelope):
    async def scenario(first: Relay, second: Relay) -> None:
        assert await claim(first) == {due_envelope}
        await first.db.execute(
            "UPDATE dispatch_outboxmessage SET lease_expires_at = clock_timestamp() - interval '1 second'"
        )
        assert await claim(second) == {due_envelope}, "an expired lease is claimable"
        now = await first._scalar("SELECT clock_timestamp()")
        # The first relay's publish went out (a duplicate under the same ids): its stamp no longer lands.
        assert await relay_claims.finish(first.db, {due_envelope: now}, refused=set(), owner=first.owner) == set()

    with_relays("expiring-a", "expiring-b")(scenario)
    envelope = OutboxMessage.objects.get()
    assert envelope.lease_owner == "expiring-b" and envelope.published_at is None


def test_a_lease_of_a_relay_no_longer_connected_is_taken_over_at_once(due_envelope):
    OutboxMessage.objects.update(lease_owner="relay-that-was-killed", lease_expires_at=db_now() + timedelta(minutes=5))

    async def scenario(survivor: Relay) -> None:
        assert await claim(survivor) == {due_envelope}

    with_relays("survivor")(scenario)


def test_a_refused_publish_backs_off_on_the_row_and_every_relay_honours_it(due_envelope):
    async def scenario(first: Relay, second: Relay) -> None:
        assert await claim(first) == {due_envelope}
        await relay_claims.finish(first.db, {due_envelope: None}, refused={due_envelope}, owner=first.owner)
        assert await claim(second) == set(), "backing off"
        assert await claim(first) == set(), "for its own relay too"
        assert 0 < await second.seconds_until_due() <= second.max_idle
        await second.db.execute("UPDATE dispatch_outboxmessage SET retry_at = clock_timestamp()")
        assert await claim(second) == {due_envelope}, "claimable again once the backoff ends"

    with_relays("refused-a", "refused-b")(scenario)
    envelope = OutboxMessage.objects.get()
    assert envelope.publish_failures == 1 and envelope.published_at is None


def test_the_backoff_grows_with_each_refusal_up_to_its_cap(due_envelope):
    async def scenario(relay: Relay) -> list[float]:
        waits = []
        for _ in range(10):
            await relay.db.execute("UPDATE dispatch_outboxmessage SET retry_at = NULL")
            assert await claim(relay) == {due_envelope}
            await relay_claims.finish(relay.db, {due_envelope: None}, refused={due_envelope}, owner=relay.owner)
            waits.append(
                await relay._scalar(
                    "SELECT EXTRACT(EPOCH FROM retry_at - clock_timestamp())::float8 FROM dispatch_outboxmessage"
                )
            )
        return waits

    waits: list[float] = []

    async def record(relay: Relay) -> None:
        waits.extend(await scenario(relay))

    with_relays("growing")(record)
    first, cap = relay_claims.PUBLISH_BACKOFF_FIRST_SECONDS, relay_claims.PUBLISH_BACKOFF_MAX_SECONDS
    for failures, wait in enumerate(waits):
        bound = min(cap, first * 2**failures)
        assert bound / 2 - 0.1 <= wait <= bound, (failures, wait, waits)
    assert max(waits) <= cap
