"""dispatch.outbox.pack and Fire.for_lane: how fires are grouped and cut into envelopes, and when each is released."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from dispatch.outbox import Envelope, Fire, pack
from dispatch.queues import FLEXIBLE_QUEUE, STRICT_QUEUE

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ms = timedelta(milliseconds=1)


def fire(n: int, *, tenant: int = 1, queue: str = STRICT_QUEUE, at: datetime = T0, priority: int = 0) -> Fire:
    """Fire number `n` (its id is n), scheduled for and available at `at`."""
    return Fire(uuid.UUID(int=n), at, tenant, queue, at, priority)


def ids(envelope: Envelope) -> list[int]:
    return [occurrence_id.int for occurrence_id in envelope.occurrence_ids]


# --- grouping -------------------------------------------------------------------------------------------------


def test_no_fires_pack_into_no_envelopes():
    assert pack([], size=10) == []


def test_fires_of_one_tenant_queue_instant_and_priority_share_one_envelope_in_their_order():
    fires = [fire(n) for n in (3, 1, 2)]

    [envelope] = pack(fires, size=10)

    assert (envelope.tenant_id, envelope.queue, envelope.available_at, envelope.priority) == (1, STRICT_QUEUE, T0, 0)
    assert envelope.fires == tuple(fires)
    assert ids(envelope) == [3, 1, 2]
    assert envelope.scheduled_fors == [T0, T0, T0]


@pytest.mark.parametrize(
    "other",
    [
        fire(2, tenant=2),
        fire(2, queue=FLEXIBLE_QUEUE),
        fire(2, at=T0 + timedelta(seconds=1)),
        fire(2, priority=5),
    ],
    ids=["tenant", "queue", "instant", "priority"],
)
def test_fires_that_differ_in_tenant_queue_instant_or_priority_never_share_an_envelope(other):
    envelopes = pack([fire(1), other], size=10)

    assert sorted(ids(e) for e in envelopes) == [[1], [2]]


def test_a_group_is_cut_into_envelopes_of_the_given_size_keeping_the_fire_order():
    envelopes = pack([fire(n) for n in range(7)], size=3)

    assert [ids(e) for e in envelopes] == [[0, 1, 2], [3, 4, 5], [6]]


def test_without_a_size_the_configured_envelope_size_applies(settings):
    settings.SCHEDULER_ENVELOPE_SIZE = 2

    envelopes = pack([fire(n) for n in range(5)])

    assert [len(e.fires) for e in envelopes] == [2, 2, 1]


# --- release instants -----------------------------------------------------------------------------------------


def test_flexible_fires_of_one_second_leave_together_at_the_next_whole_second():
    offsets = [timedelta(microseconds=1), 500 * ms, timedelta(microseconds=999_999)]
    fires = [fire(n, queue=FLEXIBLE_QUEUE, at=T0 + offset) for n, offset in enumerate(offsets)]

    [envelope] = pack(fires, size=10)

    assert envelope.available_at == T0 + timedelta(seconds=1)
    assert all(f.available_at <= envelope.available_at for f in envelope.fires), "none leaves before its own instant"
    assert [f.available_at for f in envelope.fires] == [f.available_at for f in fires], "the fires keep their instants"


def test_a_flexible_fire_on_a_whole_second_is_released_at_that_very_second():
    on_the_second = T0 + timedelta(seconds=1)
    just_before = T0 + 200 * ms

    [envelope] = pack([fire(1, queue=FLEXIBLE_QUEUE, at=on_the_second), fire(2, queue=FLEXIBLE_QUEUE, at=just_before)])

    assert envelope.available_at == on_the_second
    assert ids(envelope) == [1, 2]


def test_flexible_fires_in_different_seconds_leave_at_different_seconds():
    envelopes = pack(
        [fire(1, queue=FLEXIBLE_QUEUE, at=T0 + 100 * ms), fire(2, queue=FLEXIBLE_QUEUE, at=T0 + 1100 * ms)]
    )

    assert [(e.available_at, ids(e)) for e in envelopes] == [
        (T0 + timedelta(seconds=1), [1]),
        (T0 + timedelta(seconds=2), [2]),
    ]


def test_strict_fires_leave_at_their_exact_instant_even_within_one_second():
    envelopes = pack([fire(1, at=T0 + ms), fire(2, at=T0 + 500 * ms)], size=10)

    assert [(e.available_at, ids(e)) for e in envelopes] == [(T0 + ms, [1]), (T0 + 500 * ms, [2])]


# --- order ----------------------------------------------------------------------------------------------------


def test_envelopes_are_ordered_by_release_instant_then_highest_priority_first():
    later = T0 + timedelta(seconds=5)
    fires = [
        fire(1, at=later, priority=0),
        fire(2, at=later, priority=50),
        fire(3, at=T0, priority=-5),
        fire(4, at=later, priority=-100),
        fire(5, queue=FLEXIBLE_QUEUE, at=T0 + 10 * ms, priority=100),  # released at T0 + 1 s
    ]

    envelopes = pack(fires, size=10)

    assert [ids(e) for e in envelopes] == [[3], [5], [2], [1], [4]]
    assert [e.available_at for e in envelopes] == sorted(e.available_at for e in envelopes)


def test_any_mix_of_fires_is_packed_once_each_into_homogeneous_bounded_envelopes_released_no_earlier():
    rng = random.Random(20260601)
    fires = [
        fire(
            n,
            tenant=rng.choice([1, 2, 3]),
            queue=rng.choice([STRICT_QUEUE, FLEXIBLE_QUEUE]),
            at=T0 + timedelta(milliseconds=rng.randrange(0, 4000, rng.choice([1, 250, 1000]))),
            priority=rng.choice([-10, 0, 10]),
        )
        for n in range(500)
    ]

    envelopes = pack(fires, size=7)

    assert sorted(f.occurrence_id.int for e in envelopes for f in e.fires) == list(range(500)), "each fire once"
    for e in envelopes:
        assert 1 <= len(e.fires) <= 7
        assert {(f.tenant_id, f.queue, f.priority) for f in e.fires} == {(e.tenant_id, e.queue, e.priority)}
        for f in e.fires:
            if e.queue == FLEXIBLE_QUEUE:
                assert timedelta(0) <= e.available_at - f.available_at < timedelta(seconds=1)
                assert e.available_at.microsecond == 0
            else:
                assert e.available_at == f.available_at
    keys = [(e.available_at, -e.priority) for e in envelopes]
    assert keys == sorted(keys)


# --- Fire.for_lane --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lane", "queue"), [("strict", STRICT_QUEUE), ("flexible", FLEXIBLE_QUEUE)], ids=["strict", "flexible"]
)
def test_for_lane_puts_a_fire_on_its_lanes_queue_and_keeps_the_rest(lane, queue):
    occurrence_id = uuid.uuid4()
    available_at = T0 + timedelta(seconds=42, milliseconds=7)

    made = Fire.for_lane(occurrence_id, T0, tenant_id=9, lane=lane, available_at=available_at, priority=-3)

    assert made == Fire(occurrence_id, T0, 9, queue, available_at, -3)


def test_strict_and_flexible_lanes_never_share_a_queue():
    strict = Fire.for_lane(uuid.uuid4(), T0, tenant_id=1, lane="strict", available_at=T0, priority=0)
    flexible = Fire.for_lane(uuid.uuid4(), T0, tenant_id=1, lane="flexible", available_at=T0, priority=0)

    assert strict.queue != flexible.queue
    assert len(pack([strict, flexible], size=10)) == 2
