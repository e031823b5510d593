"""Three RabbitMQ nodes with the lanes' queue type (quorum): the cluster forms, a quorum queue lives on every node, and
losing the node that leads it costs a few seconds of publishing, never a confirmed message; the node comes back."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from dispatch.engine.brokers import broker_urls, connect_first
from tests.cluster.conftest import RABBIT_NODES, RabbitCluster, measured, wait_until

pytestmark = pytest.mark.cluster

MESSAGES = 1_000
KILL_AFTER = 300
CONFIRM_TIMEOUT = 10.0


def test_the_three_nodes_run_as_one_cluster(rabbit_cluster: RabbitCluster):
    everyone = sorted(rabbit_cluster.name(node) for node in RABBIT_NODES)

    for node in RABBIT_NODES:
        assert rabbit_cluster.running_nodes(node) == everyone, f"as node {node} sees it"


def test_a_quorum_queue_has_a_member_on_every_node(rabbit_cluster: RabbitCluster):
    queue = f"cluster-test-members-{uuid.uuid4().hex[:8]}"

    async def declare() -> None:
        connection = await aio_pika.connect(rabbit_cluster.url(2))
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})

    asyncio.run(declare())
    try:
        row = rabbit_cluster.queue(1, queue)
        assert row["type"] == "quorum"
        assert sorted(row["members"]) == sorted(rabbit_cluster.name(node) for node in RABBIT_NODES)
        assert sorted(row["online"]) == sorted(row["members"])
    finally:
        rabbit_cluster.ctl(1, "delete_queue", queue)


class ConfirmingPublisher:
    """Publishes with publisher confirms over the cluster's nodes, as the relay does: a publish counts only once it
    is confirmed; an unconfirmed one is published again (same body) on the next node that answers."""

    def __init__(self, urls: str, queue: str, first_node: int) -> None:
        self.urls = broker_urls(urls)
        self.index = first_node - 1
        self.queue = queue
        self.connection: AbstractConnection | None = None
        self.channel: AbstractChannel | None = None
        self.reconnects = 0

    async def _open(self, url: str) -> AbstractConnection:
        return await aio_pika.connect(url, timeout=CONFIRM_TIMEOUT)

    async def connect(self) -> None:
        self.index, self.connection = await connect_first(self.urls, self.index, self._open)
        self.channel = await self.connection.channel(publisher_confirms=True)
        await self.channel.declare_queue(self.queue, durable=True, arguments={"x-queue-type": "quorum"})

    async def publish(self, body: bytes) -> None:
        """Until confirmed; on a lost node, the next one."""
        while True:
            try:
                if self.channel is None or self.channel.is_closed:
                    await self.connect()
                assert self.channel is not None
                await self.channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=self.queue,
                    timeout=CONFIRM_TIMEOUT,
                )
                return
            except (TimeoutError, aio_pika.exceptions.AMQPError, ConnectionError, OSError):
                self.reconnects += 1
                await self.close()
                self.index = (self.index + 1) % len(self.urls)
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        connection, self.connection, self.channel = self.connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # the node is gone: nothing to close
                await asyncio.wait_for(connection.close(), timeout=5)


async def drain(url: str, queue: str, expected: int, seconds: float) -> list[str]:
    """Every message body of the queue (acked), until `expected` distinct ones arrived or `seconds` passed."""
    bodies: list[str] = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=500)
        declared = await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        deadline = time.monotonic() + seconds
        async with declared.iterator() as messages:
            while len(set(bodies)) < expected and time.monotonic() < deadline:
                try:
                    message = await asyncio.wait_for(
                        messages.__anext__(), timeout=max(0.1, deadline - time.monotonic())
                    )
                except TimeoutError:
                    break
                bodies.append(message.body.decode())
                await message.ack()
    return bodies


def test_killing_the_leader_of_a_quorum_queue_loses_no_confirmed_message_and_the_node_rejoins(
    rabbit_cluster: RabbitCluster,
):
    rabbit_cluster.assert_whole()
    queue = f"cluster-test-leader-{uuid.uuid4().hex[:8]}"
    expected = [f"message-{i}" for i in range(MESSAGES)]

    async def declare() -> None:
        connection = await aio_pika.connect(rabbit_cluster.url(1))
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})

    asyncio.run(declare())
    leader = rabbit_cluster.node_of(rabbit_cluster.queue(1, queue)["leader"])
    survivor = next(node for node in RABBIT_NODES if node != leader)
    timings: dict[str, float] = {}

    async def publish_all() -> int:
        # Connected to the leader's own node: its loss takes the publisher's connection and the queue's leader at once.
        publisher = ConfirmingPublisher(rabbit_cluster.urls, queue, first_node=leader)
        await publisher.connect()
        started = time.monotonic()
        for number, body in enumerate(expected):
            if number == KILL_AFTER:
                await asyncio.to_thread(rabbit_cluster.kill, leader)
                timings["killed"] = time.monotonic()
            sent = time.monotonic()
            await publisher.publish(body.encode())
            if number == KILL_AFTER:
                timings["first_confirm_after_kill"] = time.monotonic() - sent
        timings["publish_seconds"] = time.monotonic() - started
        await publisher.close()
        return publisher.reconnects

    reconnects = asyncio.run(publish_all())
    try:
        row = wait_until(
            lambda: (r := rabbit_cluster.queue(survivor, queue))["leader"] != rabbit_cluster.name(leader) and r,
            30,
            "a new leader",
        )
        bodies = asyncio.run(drain(rabbit_cluster.url(survivor), queue, MESSAGES, 60))
        lost = set(expected) - set(bodies)
        duplicates = len(bodies) - len(set(bodies))
        measured(
            "rabbitmq leader SIGKILL mid-publish",
            messages=MESSAGES,
            lost=len(lost),
            duplicates=duplicates,
            reconnects=reconnects,
            seconds_to_first_confirm_after_kill=round(timings["first_confirm_after_kill"], 3),
            publish_seconds=round(timings["publish_seconds"], 3),
            new_leader=row["leader"],
        )
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
        assert set(bodies) <= set(expected)

        rejoin_started = time.monotonic()
        rabbit_cluster.rejoin(leader)
        everyone = sorted(rabbit_cluster.name(node) for node in RABBIT_NODES)
        wait_until(lambda: rabbit_cluster.running_nodes(survivor) == everyone, 60, "the killed node to rejoin")
        wait_until(
            lambda: sorted(rabbit_cluster.queue(survivor, queue)["online"]) == everyone,
            60,
            "the queue's member on the killed node to come back online",
        )
        measured("rabbitmq node rejoin", seconds=round(time.monotonic() - rejoin_started, 1))
    finally:
        rabbit_cluster.rejoin(leader)  # a no-op when it already runs: later tests need three nodes
        rabbit_cluster.ctl(survivor, "delete_queue", queue)
