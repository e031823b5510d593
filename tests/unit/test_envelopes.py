"""The envelope body (dispatch.wire): what encode_body writes, decode_content reads back (version 2, and the
first version still in queues after an upgrade), and what it refuses."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from dispatch.engine.publishing import CrowdRouter, bundles
from dispatch.engine.relay_claims import StagedEnvelope
from dispatch.outbox import Fire, pack
from dispatch.queues import FLEXIBLE_QUEUE, STRICT_QUEUE, crowd_queue
from dispatch.wire import (
    BODY_VERSION,
    PAIRS_BODY_VERSION,
    MalformedEnvelope,
    bundle_body,
    decode_content,
    encode_body,
    envelope_id_of,
)

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
AN_ID = "0f6c1e1a-3b5d-4c8e-9a7f-2d4b6c8e0a1b"
AN_INSTANT = "2026-06-01T12:00:00.000000Z"


def pairs_at(*instants: datetime) -> list[tuple[uuid.UUID, datetime]]:
    return [(uuid.uuid4(), at) for at in instants]


def argument_of(body: bytes):
    """The single argument of the Celery protocol-2 task call: body = [args, kwargs, embed]."""
    return json.loads(body)[0][0]


def with_fires(fires) -> dict:
    return {"v": BODY_VERSION, "tenant_id": 7, "queue": STRICT_QUEUE, "fires": fires}


def with_occurrences(pairs) -> dict:
    """A body of the first version, as a worker may still find one in a queue after an upgrade."""
    return {"v": PAIRS_BODY_VERSION, "tenant_id": 7, "queue": STRICT_QUEUE, "occurrences": pairs}


# --- encode / decode ------------------------------------------------------------------------------------------


def test_an_encoded_envelope_decodes_to_its_occurrence_ids_and_instants_grouped_by_instant():
    pairs = pairs_at(T0, T0 + timedelta(microseconds=1), T0 - timedelta(days=400, microseconds=999_999), T0)

    decoded = decode_content(argument_of(encode_body(7, STRICT_QUEUE, pairs)))

    # Grouped by instant in order of first appearance, each group in its given order.
    assert decoded == [pairs[0], pairs[3], pairs[1], pairs[2]]
    assert all(isinstance(occurrence_id, uuid.UUID) for occurrence_id, _ in decoded)


def test_instants_of_any_zone_come_back_as_the_same_instant_in_utc():
    local = datetime(2026, 3, 8, 1, 59, 59, 123456, tzinfo=ZoneInfo("America/New_York"))

    [(_, instant)] = decode_content(argument_of(encode_body(7, STRICT_QUEUE, pairs_at(local))))

    assert instant == local
    assert instant.tzinfo is UTC
    assert instant.microsecond == 123456


def test_the_body_is_a_celery_protocol_2_call_with_one_argument_naming_tenant_queue_and_version():
    [(occurrence_id, _)] = pairs = pairs_at(T0)

    args, kwargs, embed = json.loads(encode_body(42, FLEXIBLE_QUEUE, pairs))

    assert len(args) == 1 and kwargs == {}
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    content = args[0]
    assert (content["v"], content["tenant_id"], content["queue"]) == (BODY_VERSION, 42, FLEXIBLE_QUEUE)
    assert content["fires"] == {"2026-06-01T12:00:00.000000Z": [str(occurrence_id)]}


def test_a_strict_envelope_names_its_instant_once_and_is_about_40_bytes_a_fire():
    pairs = pairs_at(*[T0] * 250)

    body = encode_body(7, STRICT_QUEUE, pairs)

    assert body.count(b"2026-06-01T12:00:00.000000Z") == 1
    assert len(body) < 250 * 40 + 200, len(body)


def test_an_envelope_of_the_outbox_carries_the_body_of_its_tenant_queue_and_fires():
    fires = [Fire(uuid.uuid4(), T0 + timedelta(milliseconds=n), 3, FLEXIBLE_QUEUE, T0, 0) for n in range(3)]
    [envelope] = pack(fires, size=3)

    assert envelope.body() == encode_body(3, FLEXIBLE_QUEUE, [(f.occurrence_id, f.scheduled_for) for f in fires])
    assert decode_content(argument_of(envelope.body())) == [(f.occurrence_id, f.scheduled_for) for f in fires]


def test_a_well_formed_body_written_by_hand_decodes():
    assert decode_content(with_fires({AN_INSTANT: [AN_ID]})) == [(uuid.UUID(AN_ID), T0)]


def test_a_body_of_the_first_version_still_decodes_in_order():
    pairs = pairs_at(T0, T0 - timedelta(seconds=1), T0)
    content = with_occurrences(
        [[str(occurrence_id), at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")] for occurrence_id, at in pairs]
    )

    assert decode_content(content) == pairs


# --- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        {"v": BODY_VERSION + 1, "fires": {AN_INSTANT: [AN_ID]}},
        {"v": 0, "occurrences": []},
        {"v": str(BODY_VERSION), "fires": {}},
        {"fires": {AN_INSTANT: [AN_ID]}},
    ],
    ids=["newer", "older", "text", "missing"],
)
def test_an_envelope_of_another_version_is_malformed(content):
    with pytest.raises(MalformedEnvelope, match="not an envelope of version"):
        decode_content(content)


@pytest.mark.parametrize(
    "content",
    [None, "text", 1, [BODY_VERSION, {AN_INSTANT: [AN_ID]}], [with_fires({})]],
    ids=["none", "text", "number", "version-and-fires", "list-of-envelope"],
)
def test_an_argument_that_is_not_a_dict_is_malformed(content):
    with pytest.raises(MalformedEnvelope, match="not an envelope of version"):
        decode_content(content)


@pytest.mark.parametrize("fires", [None, "0f6c1e1a", [[AN_ID, AN_INSTANT]], 5], ids=["null", "text", "list", "number"])
def test_an_envelope_without_a_fires_object_is_malformed(fires):
    with pytest.raises(MalformedEnvelope, match="without a fires object"):
        decode_content(with_fires(fires))


@pytest.mark.parametrize("ids", [AN_ID, None, {AN_ID: 1}, 5], ids=["bare-id", "null", "object", "number"])
def test_an_instant_whose_ids_are_not_a_list_is_malformed(ids):
    with pytest.raises(MalformedEnvelope, match="not a list of ids"):
        decode_content(with_fires({AN_INSTANT: ids}))


@pytest.mark.parametrize("occurrence_id", ["not-a-uuid", "", AN_ID[:-1], AN_ID + "0"])
def test_a_bad_occurrence_id_is_malformed(occurrence_id):
    with pytest.raises(MalformedEnvelope, match="bad occurrence entry"):
        decode_content(with_fires({AN_INSTANT: [AN_ID, occurrence_id]}))


@pytest.mark.parametrize(
    "occurrence_id", [12345, [AN_ID], {"id": AN_ID}, None], ids=["number", "list", "object", "null"]
)
def test_an_occurrence_id_that_is_not_text_is_malformed(occurrence_id):
    with pytest.raises(MalformedEnvelope, match="bad occurrence entry"):
        decode_content(with_fires({AN_INSTANT: [occurrence_id]}))


@pytest.mark.parametrize(
    "scheduled_for",
    ["2026-06-01 12:00:00.000000", "2026-06-01T12:00:00.000000+00:00", "2026-13-01T12:00:00.000000Z", ""],
    ids=["no-T-no-Z", "offset", "month-13", "empty"],
)
def test_a_bad_instant_is_malformed(scheduled_for):
    with pytest.raises(MalformedEnvelope, match="bad occurrence entry"):
        decode_content(with_fires({scheduled_for: [AN_ID]}))


# --- refusals of the first version --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "occurrences", [None, "0f6c1e1a", {AN_ID: AN_INSTANT}, (AN_ID, AN_INSTANT)], ids=["null", "text", "dict", "tuple"]
)
def test_a_first_version_envelope_without_an_occurrences_list_is_malformed(occurrences):
    with pytest.raises(MalformedEnvelope, match="without an occurrences list"):
        decode_content(with_occurrences(occurrences))


@pytest.mark.parametrize("occurrence_id", ["not-a-uuid", "", 12345, [AN_ID], None])
def test_a_first_version_entry_with_a_bad_occurrence_id_is_malformed(occurrence_id):
    with pytest.raises(MalformedEnvelope, match="bad occurrence entry"):
        decode_content(with_occurrences([[AN_ID, AN_INSTANT], [occurrence_id, AN_INSTANT]]))


@pytest.mark.parametrize(
    "scheduled_for",
    ["2026-06-01 12:00:00.000000", "2026-06-01T12:00:00.000000+00:00", "2026-13-01T12:00:00.000000Z", "", None, 0],
    ids=["no-T-no-Z", "offset", "month-13", "empty", "null", "number"],
)
def test_a_first_version_entry_with_a_bad_timestamp_is_malformed(scheduled_for):
    with pytest.raises(MalformedEnvelope, match="bad occurrence entry"):
        decode_content(with_occurrences([[AN_ID, scheduled_for]]))


@pytest.mark.parametrize(
    "entry",
    [[AN_ID], [AN_ID, AN_INSTANT, "extra"], [], AN_ID, 5, None],
    ids=["one", "three", "empty", "bare-id", "number", "null"],
)
def test_a_first_version_entry_that_is_not_an_id_and_instant_pair_is_malformed(entry):
    with pytest.raises(MalformedEnvelope, match="bad occurrence entry"):
        decode_content(with_occurrences([entry]))


# --- bundles (several envelopes as one message) ---------------------------------------------------------------


def test_a_bundle_carries_each_envelopes_content_as_one_argument_and_decodes_to_every_occurrence():
    first, second = pairs_at(T0), pairs_at(T0, T0)
    body = bundle_body([(11, encode_body(1, STRICT_QUEUE, first)), (12, encode_body(2, STRICT_QUEUE, second))])
    args, kwargs, embed = json.loads(body)
    assert [content["tenant_id"] for content in args] == [1, 2]
    assert [pair for content in args for pair in decode_content(content)] == first + second
    assert [kwargs, embed] == json.loads(encode_body(1, STRICT_QUEUE, first))[1:]


def test_each_envelope_in_a_message_names_its_outbox_row_and_is_otherwise_the_stored_content():
    """The worker's completion copies the envelope's stamp by that id; an older worker ignores the key."""
    stored = encode_body(1, STRICT_QUEUE, pairs_at(T0))
    args, kwargs, embed = json.loads(bundle_body([(42, stored)]))
    assert [envelope_id_of(content) for content in args] == [42]
    assert {key: value for key, value in args[0].items() if key != "envelope"} == json.loads(stored)[0][0]
    assert [kwargs, embed] == json.loads(stored)[1:]


@pytest.mark.parametrize("content", [{"v": 2}, {"envelope": "42"}, {"envelope": True}, [42], None])
def test_content_without_an_integer_envelope_id_names_no_outbox_row(content):
    assert envelope_id_of(content) is None


def test_a_body_of_another_shape_is_parsed_into_the_bundle_not_cut_by_bytes():
    spaced = json.dumps([[with_fires({AN_INSTANT: [AN_ID]})], {}, {"chord": None}]).encode()  # not encode_body's
    args = json.loads(bundle_body([(5, spaced), (6, encode_body(2, STRICT_QUEUE, pairs_at(T0)))]))[0]
    assert [content["tenant_id"] for content in args] == [7, 2]
    assert [envelope_id_of(content) for content in args] == [5, 6]


def staged(envelope_id: int, queue: str, fires: int) -> StagedEnvelope:
    return StagedEnvelope(envelope_id, queue, 0, b"", fires, T0, envelope_id, (0, 0.0))


def test_envelopes_due_together_share_messages_of_one_queue_up_to_the_fires_of_an_envelope_in_release_order():
    due = [staged(1, STRICT_QUEUE, 2), staged(2, STRICT_QUEUE, 3), staged(3, STRICT_QUEUE, 250)]
    due += [staged(4, STRICT_QUEUE, 1), staged(5, FLEXIBLE_QUEUE, 1), staged(6, FLEXIBLE_QUEUE, 1)]
    cut = bundles(due, most_fires=250)
    assert [[e.id for e in message.envelopes] for message in cut] == [[1, 2], [3], [4], [5, 6]]
    assert [message.routing_key for message in cut] == [STRICT_QUEUE] * 3 + [FLEXIBLE_QUEUE]
    assert all({e.queue for e in message.envelopes} == {message.routing_key} for message in cut)
    assert bundles(due, most_fires=1)[0].envelopes == [due[0]], "an envelope bigger than the bound still goes, alone"


def test_envelopes_routed_to_different_queues_never_share_a_message():
    due = [staged(1, STRICT_QUEUE, 2), staged(2, STRICT_QUEUE, 3), staged(3, STRICT_QUEUE, 4)]
    cut = bundles(due, most_fires=250, routes={2: crowd_queue(STRICT_QUEUE)})
    assert [(m.routing_key, [e.id for e in m.envelopes]) for m in cut] == [
        (STRICT_QUEUE, [1]),
        (crowd_queue(STRICT_QUEUE), [2]),
        (STRICT_QUEUE, [3]),
    ]


def at(envelope_id: int, queue: str, fires: int, instant: datetime) -> StagedEnvelope:
    return StagedEnvelope(envelope_id, queue, 0, b"", fires, instant, envelope_id, (0, 0.0))


def test_an_instant_with_more_fires_of_a_lane_than_the_crowd_bound_goes_to_the_lanes_crowd_queue():
    router = CrowdRouter(crowd_fires=100)
    later = T0 + timedelta(seconds=1)
    released = [at(1, STRICT_QUEUE, 60, T0), at(2, STRICT_QUEUE, 60, T0), at(3, FLEXIBLE_QUEUE, 60, T0)]
    released += [at(4, STRICT_QUEUE, 60, later)]
    assert router.routes(released) == {
        1: crowd_queue(STRICT_QUEUE),
        2: crowd_queue(STRICT_QUEUE),
        3: FLEXIBLE_QUEUE,  # the other lane's 60 fires of that instant are no crowd
        4: STRICT_QUEUE,  # nor the strict lane's at the next second
    }


def test_the_rest_of_a_crowd_released_in_a_later_step_follows_it_to_the_crowd_queue():
    router = CrowdRouter(crowd_fires=100)
    assert router.routes([at(1, STRICT_QUEUE, 101, T0)]) == {1: crowd_queue(STRICT_QUEUE)}
    assert router.routes([at(2, STRICT_QUEUE, 5, T0)]) == {2: crowd_queue(STRICT_QUEUE)}
    assert router.routes([at(3, STRICT_QUEUE, 5, T0 + timedelta(seconds=1))]) == {3: STRICT_QUEUE}


def test_the_crowd_bound_at_its_limit_or_off_keeps_every_fire_on_its_lanes_queue():
    assert CrowdRouter(crowd_fires=100).routes([at(1, STRICT_QUEUE, 100, T0)]) == {1: STRICT_QUEUE}
    assert CrowdRouter(crowd_fires=0).routes([at(1, STRICT_QUEUE, 10**6, T0)]) == {1: STRICT_QUEUE}


def test_a_relay_remembers_a_bounded_number_of_crowded_instants():
    router = CrowdRouter(crowd_fires=1)
    for n in range(CrowdRouter.REMEMBERED + 10):
        router.routes([at(n, STRICT_QUEUE, 2, T0 + timedelta(seconds=n))])
    assert router.routes([at(0, STRICT_QUEUE, 1, T0)]) == {0: STRICT_QUEUE}, "the oldest instant was forgotten"
    latest = T0 + timedelta(seconds=CrowdRouter.REMEMBERED + 9)
    assert router.routes([at(0, STRICT_QUEUE, 1, latest)]) == {0: crowd_queue(STRICT_QUEUE)}


def test_a_lanes_small_envelopes_share_messages_of_four_envelopes_worth_and_a_crowds_of_one():
    """RabbitMQ alternates the queues a worker consumes by message: bigger lane messages give the lane most fires."""
    steady = [staged(n, STRICT_QUEUE, 10) for n in range(1, 101)]
    assert [len(message.envelopes) for message in bundles(steady, most_fires=250)] == [100], "1,000 fires, one message"
    crowd = {envelope.id: crowd_queue(STRICT_QUEUE) for envelope in steady}
    assert {len(m.envelopes) for m in bundles(steady, most_fires=250, routes=crowd)} == {25}, "250 fires a message"


def test_bigger_envelopes_of_a_lane_keep_messages_of_one_envelopes_worth_to_spread_over_the_workers():
    """A burst below the crowd bound (envelopes of 100 fires, say) is cut as before: more messages, more workers."""
    burst = [staged(n, STRICT_QUEUE, 100) for n in range(1, 11)]
    assert [len(message.envelopes) for message in bundles(burst, most_fires=250)] == [2, 2, 2, 2, 2]
    mixed = [staged(1, STRICT_QUEUE, 200)] + [staged(n, STRICT_QUEUE, 10) for n in range(2, 9)]
    cut = [[e.id for e in m.envelopes] for m in bundles(mixed, most_fires=250)]
    assert cut == [[1, 2, 3, 4, 5, 6], [7, 8]], "a message holding a bigger one stays at one envelope's worth"
