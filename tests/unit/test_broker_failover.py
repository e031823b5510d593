"""The relay over a RabbitMQ cluster's nodes (dispatch/engine/brokers.py): it connects to the first node that answers,
leaves a lost node for the next one, and with one node keeps the robust connection's own retries as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch.engine import relay as relay_module
from dispatch.engine.brokers import broker_urls, connect_first, safe
from dispatch.engine.publishing import BrokerBlocked, PublishFailed

NODES = "amqp://guest:guest@127.0.0.1:5681//;amqp://guest:guest@127.0.0.1:5682//;amqp://guest:guest@127.0.0.1:5683//"


def test_broker_urls_splits_kombus_failover_syntax():
    assert broker_urls(NODES) == [
        "amqp://guest:guest@127.0.0.1:5681//",
        "amqp://guest:guest@127.0.0.1:5682//",
        "amqp://guest:guest@127.0.0.1:5683//",
    ]
    assert broker_urls(" amqp://a// ; ") == ["amqp://a//"]
    with pytest.raises(ValueError, match="names no broker"):
        broker_urls(" ; ")


def test_safe_hides_the_password():
    assert safe("amqp://guest:guest@127.0.0.1:5681//") == "amqp://guest:******@127.0.0.1:5681//"
    assert safe("amqp://127.0.0.1:5681//") == "amqp://127.0.0.1:5681//"


def test_connect_first_tries_each_node_from_the_start_index_and_wraps():
    tried: list[str] = []

    async def connect(url: str) -> str:
        tried.append(url)
        if url != "a":
            raise ConnectionRefusedError(url)
        return f"connection to {url}"

    assert asyncio.run(connect_first(["a", "b", "c"], 1, connect)) == (0, "connection to a")
    assert tried == ["b", "c", "a"]


def test_connect_first_raises_the_last_failure_when_no_node_answers():
    async def connect(url: str) -> str:
        raise ConnectionRefusedError(url)

    with pytest.raises(ConnectionRefusedError, match="b"):
        asyncio.run(connect_first(["a", "b"], 0, connect))


class FakeChannel:
    is_closed = False


class FakeBroker:
    """What the relay's connect() reads of an aio-pika robust connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connected = asyncio.Event()
        self.connected.set()
        self.closed = False

    async def channel(self, **_: Any) -> FakeChannel:
        return FakeChannel()

    async def close(self) -> None:
        self.closed = True


class FakeDatabase:
    closed = False
    broken = False


@pytest.fixture
def relay_on(monkeypatch):
    """A relay whose PostgreSQL is taken as connected and whose broker connections are fakes; `down` holds the
    addresses that refuse."""

    def make(setting: str, down: set[str]) -> tuple[relay_module.Relay, list[FakeBroker]]:
        relay = relay_module.Relay("failover-test", broker_url=setting, conninfo="dbname=unused")
        opened: list[FakeBroker] = []

        async def open_broker(url: str) -> FakeBroker:
            if url in down:
                raise ConnectionRefusedError(url)
            opened.append(FakeBroker(url))
            return opened[-1]

        async def declare_queues() -> None:
            return None

        monkeypatch.setattr(relay.brokers, "open", open_broker)
        monkeypatch.setattr(relay, "declare_queues", declare_queues)
        relay._db = FakeDatabase()  # type: ignore[assignment]
        return relay, opened

    return make


def test_the_relay_connects_to_the_first_node_that_answers(relay_on):
    urls = broker_urls(NODES)
    relay, opened = relay_on(NODES, down={urls[0]})

    asyncio.run(relay.connect())

    assert [broker.url for broker in opened] == [urls[1]]


def test_the_relay_leaves_a_lost_node_for_the_next_one(relay_on):
    urls = broker_urls(NODES)
    relay, opened = relay_on(NODES, down=set())

    async def scenario() -> None:
        await relay.connect()
        opened[0].connected.clear()  # the node went away; the robust connection would retry it alone
        await relay.connect()
        await asyncio.sleep(0)  # the lost connection is closed beside the relay's work

    asyncio.run(scenario())

    assert [broker.url for broker in opened] == [urls[0], urls[1]]
    assert opened[0].closed


def test_leaving_a_frozen_node_does_not_wait_for_its_close(relay_on):
    """A frozen (partitioned) node answers no close either: the relay is on the next node before the close ends."""
    urls = broker_urls(NODES)
    relay, opened = relay_on(NODES, down=set())

    async def never() -> None:
        await asyncio.Event().wait()

    async def scenario() -> float:
        await relay.connect()
        opened[0].close = never  # type: ignore[method-assign]
        relay._forget_broken(PublishFailed("none of 3 due envelopes could be confirmed"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(relay.connect(), timeout=5)
        return loop.time() - started

    assert asyncio.run(scenario()) < 1.0
    assert [broker.url for broker in opened] == [urls[0], urls[1]]


@pytest.mark.parametrize(
    ("failure", "moves"),
    [
        (PublishFailed("none of 3 due envelopes could be published"), True),
        (TimeoutError(), True),  # declaring the queues or opening a channel on a frozen node
        (BrokerBlocked("a memory alarm"), False),
        (RuntimeError("PostgreSQL went away"), False),
    ],
)
def test_a_step_that_published_nothing_leaves_the_node_but_an_alarm_does_not(relay_on, failure, moves):
    """A frozen or partitioned node keeps its connection open and confirms nothing; an alarm blocks every node."""
    urls = broker_urls(NODES)
    relay, opened = relay_on(NODES, down=set())

    async def scenario() -> None:
        await relay.connect()
        relay._forget_broken(failure)
        await relay.connect()

    asyncio.run(scenario())

    assert [broker.url for broker in opened] == ([urls[0], urls[1]] if moves else [urls[0]])


def test_with_one_node_the_robust_connection_keeps_its_own_retries(relay_on):
    relay, opened = relay_on("amqp://guest:guest@127.0.0.1:5672//", down=set())

    async def scenario() -> None:
        await relay.connect()
        opened[0].connected.clear()
        relay._forget_broken(PublishFailed("down"))
        await relay.connect()

    asyncio.run(scenario())

    assert len(opened) == 1 and not opened[0].closed
