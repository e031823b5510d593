"""The workers' batched claim against other writers of the same occurrence rows: it waits for a held row and keeps it
in the batch, and it locks in the primary-key order the relay's settle step uses, so the two never deadlock."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from dispatch.engine.claims import EnvelopeClaim, claim_many
from dispatch.engine.relay import _LAG_BUCKETS, database_conninfo
from dispatch.models import OccurrenceState, OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.sql import outbox as outbox_sql

WORKER = "test-claim-locks"
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)


@pytest.fixture
def fires(transactional_db, tenant_a, make_schedule, make_occurrence):
    """Committed occurrences of one `allow` schedule, not yet settled by the relay (state scheduled)."""

    def make(count: int, first_minute: int = 0):
        schedule = make_schedule(tenant_a.tenant, name=f"locks-{uuid.uuid4().hex[:8]}", max_lateness_seconds=24 * 3600)
        return [
            make_occurrence(schedule, at=BASE + timedelta(minutes=first_minute + n), state=OccurrenceState.SCHEDULED)
            for n in range(count)
        ]

    return make


def claim_in_thread(pairs) -> tuple[threading.Thread, list[EnvelopeClaim]]:
    result: list[EnvelopeClaim] = []

    def body() -> None:
        try:
            result.append(claim_many(pairs, WORKER))
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, result


def test_a_row_another_transaction_holds_is_waited_for_and_claimed_in_the_batch(fires):
    """Held rows used to be skipped and decided one by one afterwards: seven single-row statements each, ~3 % of the
    fires under steady load (the relay's settle step holds them for tens of milliseconds)."""
    occurrences = fires(5)
    held = occurrences[2]
    with psycopg.connect(database_conninfo()) as other:
        other.execute(
            "SELECT 1 FROM dispatch_occurrence WHERE occurrence_id = %s AND scheduled_for = %s FOR UPDATE",
            (held.occurrence_id, held.scheduled_for),
        )
        thread, result = claim_in_thread([(o.occurrence_id, o.scheduled_for) for o in occurrences])
        time.sleep(0.5)
        assert thread.is_alive(), "the claim must wait for the held row, not leave it out"
        other.commit()
    thread.join(timeout=10)

    (claimed,) = result
    assert claimed.alone == [] and claimed.drops == []
    assert sorted(c.occurrence_id for c in claimed.claims) == sorted(o.occurrence_id for o in occurrences)


def test_a_batched_claim_and_the_relay_settling_the_same_occurrences_never_deadlock(fires):
    """Both lock many occurrence rows in one statement; given in opposite orders, each still locks in primary-key
    order, so one waits for the other and both finish with every row."""
    for round_ in range(6):
        occurrences = fires(150, first_minute=1000 * round_)
        with connection.cursor() as cursor:
            enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in occurrences], size=1000)
            cursor.execute("UPDATE dispatch_outboxmessage SET published_at = clock_timestamp()")
        settled: list[int] = []
        barrier = threading.Barrier(2)

        def settle(barrier: threading.Barrier = barrier, settled: list[int] = settled) -> None:
            try:
                barrier.wait(timeout=10)
                with connection.cursor() as cursor:
                    cursor.execute(outbox_sql.SETTLE_PUBLISHED, {"limit": 1000, **_LAG_BUCKETS})
                    settled.append(cursor.fetchone()[0])
            finally:
                connection.close()

        settler = threading.Thread(target=settle)
        settler.start()
        barrier.wait(timeout=10)
        claimed = claim_many([(o.occurrence_id, o.scheduled_for) for o in reversed(occurrences)], WORKER)
        settler.join(timeout=30)

        assert settled == [150]
        assert len(claimed.claims) == 150 and claimed.alone == []
        assert not OutboxMessage.objects.exists()
