"""The relay's broker addresses: one node, or the nodes of a RabbitMQ cluster in kombu's failover syntax.

CELERY_BROKER_URL may name several nodes separated by `;` (`amqp://h1:5672//;amqp://h2:5672//`): Celery's workers
(kombu) then move to the next node by themselves when theirs goes away. The relay's own client, aio-pika, takes one
address, and its robust connection retries that one address forever; so the relay keeps the list, connects to the
first node that answers, and when its node is lost (the connection is down, or no publish of a step could be
confirmed) starts again from the next node (docs/DEPLOYMENT.md). Publisher confirms stay the only proof of enqueue:
a message in flight when its node went away is unconfirmed, its envelope unstamped, and it is published again under
the same occurrence ids.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from yarl import URL

logger = logging.getLogger(__name__)

T = TypeVar("T")


def broker_urls(setting: str) -> list[str]:
    """The `;`-separated addresses of a broker URL setting, in order (kombu's failover syntax)."""
    urls = [url.strip() for url in setting.split(";") if url.strip()]
    if not urls:
        raise ValueError("the broker URL names no broker")
    return urls


def safe(url: str) -> str:
    """The address without its password, for logs."""
    parsed = URL(url)
    return str(parsed.with_password("******")) if parsed.password else url


async def connect_first(urls: Sequence[str], start: int, connect: Callable[[str], Awaitable[T]]) -> tuple[int, T]:
    """Connect to the first of `urls` that answers, trying them in turn from `start` (wrapping around); its index and
    the connection. Raises the last failure when none answers."""
    failure: Exception | None = None
    for step in range(len(urls)):
        index = (start + step) % len(urls)
        try:
            return index, await connect(urls[index])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failure = exc
            if len(urls) > 1:
                logger.warning(
                    "broker %s does not answer (%r); trying the next one",
                    safe(urls[index]),
                    exc,
                    extra={"action": "broker_failover"},
                )
    assert failure is not None  # urls is never empty (broker_urls)
    raise failure


class BrokerNodes:
    """The relay's broker nodes and the one it uses now.

    `open` makes a connection to one address (aio-pika's robust connection in the relay). With one node nothing is
    ever left: the robust connection retries its address by itself. With several, a connection that is down, or a
    step none of whose publishes was confirmed (`unconfirmed`), makes the next `leave` drop it and the next
    `connect` start from the node after it.
    """

    def __init__(self, setting: str, open: Callable[[str], Awaitable[Any]], *, close_timeout: float) -> None:
        self.urls = broker_urls(setting)
        self.open = open
        self.close_timeout = close_timeout
        self.index = 0
        self._unconfirmed = False
        self._closing: set[asyncio.Task] = set()

    @property
    def clustered(self) -> bool:
        return len(self.urls) > 1

    @property
    def current(self) -> str:
        return self.urls[self.index]

    async def connect(self) -> Any:
        """A connection to the first node that answers, from the current one on."""
        self.index, connection = await connect_first(self.urls, self.index, self.open)
        logger.info("connected to broker %s", safe(self.current), extra={"action": "connect"})
        return connection

    def unconfirmed(self) -> None:
        """A step's publishes all went unconfirmed without an alarm: a frozen or partitioned node keeps its TCP
        connection open and confirms nothing, so with a cluster the node is left at the next connect."""
        self._unconfirmed = self.clustered

    def must_leave(self, connection: Any) -> bool:
        """Whether `connection` is to a node lost to this process (a cluster only)."""
        lost = self.clustered and (self._unconfirmed or not connection.connected.is_set())
        self._unconfirmed = False
        return lost

    async def leave(self, connection: Any) -> None:
        """Move on to the next node at once, and close the connection to the lost one beside it: a frozen node
        answers no close either, and waiting for it (up to close_timeout) would hold every fire of the next step."""
        logger.warning("leaving broker %s", safe(self.current), extra={"action": "broker_failover"})
        self.index = (self.index + 1) % len(self.urls)
        closing = asyncio.create_task(self._close(connection))
        self._closing.add(closing)  # a reference until it is done: the event loop keeps only a weak one
        closing.add_done_callback(self._closing.discard)

    async def _close(self, connection: Any) -> None:
        try:
            await asyncio.wait_for(connection.close(), timeout=self.close_timeout)
        except Exception:
            logger.debug("closing the lost broker connection failed", exc_info=True)
