"""Publishing a group of envelopes with confirms, bounded in time, and what a failed publish means to the relay.

Every publish is bounded: SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS to be confirmed, and abandoned at once when
RabbitMQ blocks the connection (a memory or disk alarm stops the broker reading it: nothing would be confirmed).
A failure is one of two kinds:
- a refusal (the broker nacked the message, or returned it as unroutable) is about that envelope's queue: the
  envelope backs off on its own (dispatch/sql/outbox.py FINISH_CLAIM), the rest of the traffic goes on;
- anything else (a timeout, a closed channel or connection, a connection RabbitMQ blocked) is about the broker:
  the relay's step fails and the loop backs off like in any outage.

Refusals are logged once per queue per outage: the first one with its error, then one line when the queue accepts
again, with how many publishes it refused meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiormq.exceptions import DeliveryError

from dispatch.queues import crowd_queue
from dispatch.wire import bundle_body, message_headers, task_id_for

if TYPE_CHECKING:
    from dispatch.engine.relay_claims import StagedEnvelope

logger = logging.getLogger(__name__)

# While publishes are in flight, how often the relay looks whether RabbitMQ blocked its connection meanwhile.
BLOCKED_CHECK_SECONDS = 0.1


class PublishFailed(Exception):
    """Envelopes were due and none could be published (broker down, blocked, or every publish timed out)."""


class BrokerBlocked(PublishFailed):
    """RabbitMQ blocked the relay's connection (connection.blocked: a memory or disk alarm): publishes would hang."""


def refused_by_broker(exc: BaseException) -> bool:
    """The broker answered this publish with a nack or a return: a fault of the envelope's queue, not an outage."""
    return isinstance(exc, DeliveryError)


def broker_blocked(connection: AbstractRobustConnection | None) -> bool:
    """Whether RabbitMQ has blocked this connection (connection.blocked, until connection.unblocked).

    aiormq tracks it (it asks for the capability) but keeps the state private: its writer waits on an "unblocked"
    event. Read that event here; a version without it reads as never blocked, and publishes then fail by their
    timeout instead, which is slower but the same outcome.
    """
    transport = getattr(connection, "transport", None)
    amqp = getattr(transport, "connection", None)
    unblocked = getattr(amqp, "_Connection__connection_unblocked", None)
    return unblocked is not None and getattr(amqp, "is_opened", False) and not unblocked.is_set()


@dataclass
class _Refusals:
    first_error: str
    started: float
    publishes: int = 0


class QueueRefusals:
    """Refused publishes per queue, logged once per outage with their counts."""

    def __init__(self) -> None:
        self._open: dict[str, _Refusals] = {}

    def refused(self, queue: str, exc: BaseException) -> None:
        refusals = self._open.get(queue)
        if refusals is None:
            refusals = self._open[queue] = _Refusals(repr(exc), time.monotonic())
            logger.warning(
                "the broker refuses publishes to %s: %s; each refused envelope backs off on its own "
                "(logged once until the queue accepts again)",
                queue,
                refusals.first_error,
                extra={"action": "publish_refused", "queue": queue},
            )
        refusals.publishes += 1

    def accepted(self, queue: str) -> None:
        refusals = self._open.pop(queue, None)
        if refusals is not None:
            logger.warning(
                "%s accepts publishes again after %d refused publishes over %.1f s",
                queue,
                refusals.publishes,
                time.monotonic() - refusals.started,
                extra={"action": "publish_accepted", "queue": queue},
            )

    def refusing(self) -> dict[str, int]:
        """Queues refusing now, with their refused publishes so far."""
        return {queue: refusals.publishes for queue, refusals in self._open.items()}


class Message(NamedTuple):
    """One AMQP message: the envelopes it carries (usually one) and the queue it goes to."""

    routing_key: str
    envelopes: list[StagedEnvelope]


class CrowdRouter:
    """The queue of each released envelope: its lane's, or the lane's crowd queue (dispatch/queues.py) when more than
    `crowd_fires` fires of that lane are released for one instant (SCHEDULER_CROWD_FIRES).

    Why: a lane's queue is FIFO. A top-of-hour burst of 100,000 fires is tens of seconds of the workers' time, and the
    fires due alone in the seconds after it used to wait behind all of it (the steady bench: start lag p99 14-15 s
    outside the bursts, docs/BENCHMARKS.md). Workers consume both queues, RabbitMQ hands out the messages of the queues
    a channel consumes in turn, and a lane's messages bundle more fires than a crowd's (LANE_MESSAGE_SHARE), so the
    lone fires get most of the pool while a crowd drains. A crowd that a relay claims over several steps
    (SCHEDULER_RELAY_BATCH envelopes each) stays one: its instants are remembered. Each relay counts what it
    releases, so with several relays a crowd is seen per relay's share of it.
    """

    # Crowded (queue, instant) pairs remembered; an instant's late steps come within seconds of its first.
    REMEMBERED = 64

    def __init__(self, crowd_fires: int) -> None:
        self.crowd_fires = crowd_fires
        self._crowded: dict[tuple[str, datetime], None] = {}  # insertion-ordered: the oldest is dropped first

    def routes(self, envelopes: Iterable[StagedEnvelope]) -> dict[int, str]:
        """Envelope id -> the queue its message goes to, for envelopes released together."""
        envelopes = list(envelopes)
        if self.crowd_fires > 0:
            fires: Counter[tuple[str, datetime]] = Counter()
            for envelope in envelopes:
                fires[(envelope.queue, envelope.available_at)] += envelope.fires
            for instant, count in fires.items():
                if count > self.crowd_fires and instant not in self._crowded:
                    self._crowded[instant] = None
                    if len(self._crowded) > self.REMEMBERED:
                        del self._crowded[next(iter(self._crowded))]
        return {
            envelope.id: (
                crowd_queue(envelope.queue)
                if (envelope.queue, envelope.available_at) in self._crowded
                else envelope.queue
            )
            for envelope in envelopes
        }


# A lane queue's message bundles small envelopes (a steady second's, of a few fires each) up to this many envelopes'
# worth of fires (SCHEDULER_ENVELOPE_SIZE each); a crowd queue's message carries one envelope's worth (`bundles`).
# RabbitMQ hands a worker the messages of the queues it consumes in turn, one message each, so while both queues hold
# a backlog the lane's share of the fires run is its message size over both. Two cores run ~4,000 fires a second
# while a crowd drains and a steady day needs 2,315 of them for the lane (the steady bench); with equal messages the
# lane got half, its backlog grew for the whole drain, and the fires due in the minute after a 100,000-fire burst
# started 9-12 s late (docs/BENCHMARKS.md). At four to one the lane gets four fifths while both are busy, and all of
# the pool once the crowd is gone. Cutting the crowd's messages to a
# quarter instead gave the same share but four times the publishes at the burst's instant (its enqueue lag p99 went
# from 0.9 to 2.0 s); bundling the lane's small envelopes four times as far costs nothing at the instant and fewer
# tasks a second (a steady second's 2,315 fires are three messages).
LANE_MESSAGE_SHARE = 4


def bundles(envelopes: list[StagedEnvelope], most_fires: int, routes: Mapping[int, str] | None = None) -> list[Message]:
    """Cut envelopes due at one instant (in release order) into messages: consecutive envelopes routed to one queue
    (`routes`, by envelope id; their own queue when absent) share a message while their fires fit in `most_fires`, an
    envelope's most; an envelope that fills it alone goes alone. Small envelopes of a lane's own queue (a steady
    second's: at most a LANE_MESSAGE_SHARE-th of `most_fires` each) share a message of up to LANE_MESSAGE_SHARE times
    that; bigger ones keep messages of one envelope's worth, so a burst below the crowd bound still spreads over as
    many workers as before. Release order is kept: strict before flexible, tenants interleaved as the fair-queueing
    tags put them."""
    cut: list[Message] = []
    fires = 0
    small_only = False  # the current message holds only small envelopes of a lane's own queue
    for envelope in envelopes:
        queue = routes.get(envelope.id, envelope.queue) if routes else envelope.queue
        # Routed away from its lane's queue (to the crowd queue), an envelope is never a small one.
        small = queue == envelope.queue and envelope.fires * LANE_MESSAGE_SHARE <= most_fires
        limit = most_fires * LANE_MESSAGE_SHARE if small and small_only else most_fires
        current = cut[-1] if cut else None
        if current is not None and current.routing_key == queue and fires + envelope.fires <= limit:
            current.envelopes.append(envelope)
            fires += envelope.fires
            small_only = small_only and small
        else:
            cut.append(Message(queue, [envelope]))
            fires = envelope.fires
            small_only = small
    return cut


async def publish(channel: AbstractChannel, message: Message) -> float:
    """Publish one message carrying its envelopes (usually one); resolves when the broker confirmed it, returning
    that monotonic instant."""
    bundle = message.envelopes
    first = bundle[0]
    task_id = task_id_for(first.id) if len(bundle) == 1 else f"{task_id_for(first.id)}+{len(bundle) - 1}"
    amqp_message = aio_pika.Message(
        bundle_body([(envelope.id, envelope.body) for envelope in bundle]),
        headers=message_headers(task_id, sum(envelope.fires for envelope in bundle)),
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        correlation_id=task_id,
    )
    # mandatory: an unroutable message comes back as an error instead of vanishing, so it is retried.
    await channel.default_exchange.publish(amqp_message, routing_key=message.routing_key, mandatory=True)
    return time.monotonic()


async def publish_group(
    channel: AbstractChannel,
    broker: AbstractRobustConnection | None,
    messages: list[Message],
    *,
    timeout: float,
) -> dict[int, float | BaseException]:
    """Publish messages (bundles of envelopes) concurrently; returns, per envelope id, its message's confirmation
    (a monotonic instant) or error. A publish not confirmed within `timeout`, or still in flight when RabbitMQ blocks
    the connection, fails."""
    tasks = [asyncio.ensure_future(publish(channel, message)) for message in messages]
    deadline = time.monotonic() + timeout
    pending: set[asyncio.Future[float]] = set(tasks)
    failure: BaseException | None = None
    while pending:
        _, pending = await asyncio.wait(pending, timeout=min(BLOCKED_CHECK_SECONDS, timeout))
        if not pending:
            break
        if broker_blocked(broker):
            failure = BrokerBlocked("RabbitMQ blocked the relay's connection while publishes were in flight")
        elif time.monotonic() >= deadline:
            failure = TimeoutError(f"publish not confirmed within {timeout:g} s")
        if failure is not None:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            break
    results: dict[int, float | BaseException] = {}
    for message, task in zip(messages, tasks, strict=True):
        result: float | BaseException
        if task.cancelled():
            result = failure or asyncio.CancelledError()
        elif (exc := task.exception()) is not None:
            result = exc
        else:
            result = task.result()
        results.update(dict.fromkeys((envelope.id for envelope in message.envelopes), result))
    return results
