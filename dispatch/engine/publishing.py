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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiormq.exceptions import DeliveryError

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


def bundles(envelopes: list[StagedEnvelope], most_fires: int) -> list[list[StagedEnvelope]]:
    """Cut envelopes due at one instant (in release order) into messages: consecutive envelopes of one queue share a
    message while their fires fit in `most_fires`; an envelope that fills it alone goes alone. Release order is kept:
    strict before flexible, tenants interleaved as the fair-queueing tags put them."""
    cut: list[list[StagedEnvelope]] = []
    fires = 0
    for envelope in envelopes:
        current = cut[-1] if cut else None
        if current is not None and current[0].queue == envelope.queue and fires + envelope.fires <= most_fires:
            current.append(envelope)
            fires += envelope.fires
        else:
            cut.append([envelope])
            fires = envelope.fires
    return cut


async def publish(channel: AbstractChannel, bundle: list[StagedEnvelope]) -> float:
    """Publish one message carrying the bundle's envelopes (usually one); resolves when the broker confirmed it,
    returning that monotonic instant."""
    first = bundle[0]
    task_id = task_id_for(first.id) if len(bundle) == 1 else f"{task_id_for(first.id)}+{len(bundle) - 1}"
    message = aio_pika.Message(
        bundle_body([(envelope.id, envelope.body) for envelope in bundle]),
        headers=message_headers(task_id, sum(envelope.fires for envelope in bundle)),
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        correlation_id=task_id,
    )
    # mandatory: an unroutable message comes back as an error instead of vanishing, so it is retried.
    await channel.default_exchange.publish(message, routing_key=first.queue, mandatory=True)
    return time.monotonic()


async def publish_group(
    channel: AbstractChannel,
    broker: AbstractRobustConnection | None,
    messages: list[list[StagedEnvelope]],
    *,
    timeout: float,
) -> list[float | BaseException]:
    """Publish messages (bundles of envelopes) concurrently; each result is its confirmation's monotonic instant or
    its error. A publish not confirmed within `timeout`, or still in flight when RabbitMQ blocks the connection,
    fails."""
    tasks = [asyncio.ensure_future(publish(channel, bundle)) for bundle in messages]
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
    results: list[float | BaseException] = []
    for task in tasks:
        if task.cancelled():
            results.append(failure or asyncio.CancelledError())
        elif (exc := task.exception()) is not None:
            results.append(exc)
        else:
            results.append(task.result())
    return results
