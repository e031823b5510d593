"""The relay: publishes due outbox envelopes to RabbitMQ with publisher confirms, then stamps them (rule 4).

Publish, then forget: the envelope rows stay locked while their messages are in flight; only confirmed ones
are stamped `published_at` before commit. A crash in between leaves the rows unstamped and they are published
again under the same occurrence ids (an intended duplicate); stamping before publishing would lose fires.

It runs on asyncio so hundreds of messages are in flight at once (asynchronous confirms: ~3x the rate of
waiting for each confirm), and talks to PostgreSQL with psycopg's async connection, outside the Django ORM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import aio_pika
import psycopg
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from django.conf import settings
from django.db import connection as django_connection

from dispatch import sql
from dispatch.envelopes import message_headers, task_id_for
from dispatch.loop import StopFlag
from dispatch.materializer import default_process_name
from dispatch.queues import ALL_QUEUES

logger = logging.getLogger(__name__)

ROLE = "relay"


def database_conninfo() -> str:
    """The Django connection's parameters (the test database under pytest) as a libpq conninfo string."""
    params = django_connection.settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=params["NAME"],
        user=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=params.get("HOST") or None,
        port=str(params["PORT"]) if params.get("PORT") else None,
    )


@dataclass
class RelayStats:
    published_envelopes: int = 0
    published_occurrences: int = 0
    failed_publishes: int = 0
    settled_envelopes: int = 0


class Relay:
    def __init__(
        self,
        name: str | None = None,
        *,
        batch_size: int | None = None,
        settle_batch: int | None = None,
        broker_url: str | None = None,
        conninfo: str | None = None,
    ) -> None:
        self.name = name or default_process_name(ROLE)
        self.batch_size = batch_size or settings.SCHEDULER_RELAY_BATCH
        self.settle_batch = settle_batch or settings.SCHEDULER_SETTLE_BATCH
        self.broker_url = broker_url or settings.CELERY_BROKER_URL
        self.conninfo = conninfo or database_conninfo()
        self.max_idle = settings.SCHEDULER_RELAY_MAX_IDLE_SECONDS
        self.stop = StopFlag()
        self.stats = RelayStats()
        self._db: psycopg.AsyncConnection | None = None
        self._broker: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None

    # --- connections -------------------------------------------------------------------------------------------

    async def connect(self) -> None:
        self._db = await psycopg.AsyncConnection.connect(self.conninfo, application_name=self.name)
        self._broker = await aio_pika.connect_robust(self.broker_url, client_properties={"connection_name": self.name})
        self._channel = await self._broker.channel(publisher_confirms=True)
        for queue in ALL_QUEUES:
            # Plain durable classic queues, declared exactly as the Celery workers declare them.
            await self._channel.declare_queue(queue, durable=True)

    async def close(self) -> None:
        if self._broker is not None:
            await self._broker.close()
        if self._db is not None:
            await self._db.close()

    # --- steps -------------------------------------------------------------------------------------------------

    async def step(self) -> bool:
        """Publish what is due; when nothing is, settle published envelopes. True if anything was done."""
        if await self.publish_due():
            return True
        return await self.settle() > 0

    async def publish_due(self) -> int:
        """Claim a batch of due envelopes, publish them concurrently, stamp the confirmed ones; returns count."""
        assert self._db is not None and self._channel is not None
        async with self._db.transaction():
            cursor = await self._db.execute(sql.CLAIM_DUE_ENVELOPES, {"lead": 0, "limit": self.batch_size})
            rows = await cursor.fetchall()
            if not rows:
                return 0
            # Confirmation instants on PostgreSQL's clock: one reading of it, advanced by the monotonic clock.
            anchor_db = (await (await self._db.execute(sql.DB_NOW)).fetchone())[0]
            anchor_mono = time.monotonic()
            results = await asyncio.gather(*(self._publish(row) for row in rows), return_exceptions=True)
            ids, stamps, occurrences = [], [], 0
            for row, result in zip(rows, results, strict=True):
                if isinstance(result, BaseException):
                    self.stats.failed_publishes += 1
                    logger.warning(
                        "publish of envelope %s failed: %r", row[0], result, extra={"action": "publish_failed"}
                    )
                    continue
                ids.append(row[0])
                stamps.append(anchor_db + timedelta(seconds=result - anchor_mono))
                occurrences += row[4]
            if ids:
                await self._db.execute(sql.MARK_PUBLISHED, {"ids": ids, "published_ats": stamps})
        self.stats.published_envelopes += len(ids)
        self.stats.published_occurrences += occurrences
        logger.debug("published %d envelopes (%d occurrences)", len(ids), occurrences, extra={"action": "publish"})
        return len(ids)

    async def _publish(self, row: tuple) -> float:
        """Publish one envelope; resolves when the broker confirmed it, returning that monotonic instant."""
        envelope_id, queue, _priority, body, count = row
        task_id = task_id_for(envelope_id)
        message = aio_pika.Message(
            bytes(body),
            headers=message_headers(task_id, count),
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            correlation_id=task_id,
        )
        # mandatory: an unroutable message comes back as an error instead of vanishing, so it is retried.
        await self._channel.default_exchange.publish(message, routing_key=queue, mandatory=True)
        return time.monotonic()

    async def settle(self) -> int:
        """Copy confirmation stamps onto occurrences (scheduled → enqueued) and drop settled envelopes."""
        assert self._db is not None
        async with self._db.transaction():
            cursor = await self._db.execute(sql.SETTLE_PUBLISHED, {"limit": self.settle_batch})
            settled = cursor.rowcount
        if settled > 0:
            self.stats.settled_envelopes += 1
        return max(settled, 0)

    async def seconds_until_due(self) -> float:
        """How long to sleep: until the earliest unpublished envelope is due (PostgreSQL's clock), capped."""
        assert self._db is not None
        async with self._db.transaction():
            cursor = await self._db.execute(sql.SECONDS_UNTIL_DUE)
            row = await cursor.fetchone()
        if row is None or row[0] is None:
            return self.max_idle
        return min(self.max_idle, max(0.0, float(row[0])))

    # --- process -----------------------------------------------------------------------------------------------

    async def run_async(self, *, once: bool = False) -> None:
        await self.connect()
        logger.info("relay %s started", self.name, extra={"action": "start"})
        try:
            while not self.stop.is_set:
                try:
                    if await self.step():
                        continue
                    if once:
                        return
                    await asyncio.sleep(await self.seconds_until_due())
                except (psycopg.OperationalError, aio_pika.exceptions.AMQPError, ConnectionError) as exc:
                    if once:
                        raise
                    logger.warning("relay step failed (%r); retrying", exc, extra={"action": "step_error"})
                    await asyncio.sleep(1.0)
                    if self._db is None or self._db.closed:
                        self._db = await psycopg.AsyncConnection.connect(self.conninfo, application_name=self.name)
        finally:
            await self.close()
            logger.info("relay %s stopped: %s", self.name, self.stats, extra={"action": "stop"})

    def run(self, *, once: bool = False) -> None:
        self.stop.install()
        asyncio.run(self.run_async(once=once))


def published_at_of(envelope_id: int) -> datetime | None:
    """For tests and tools: an envelope's confirmation stamp (None while unpublished or once settled)."""
    with django_connection.cursor() as cursor:
        cursor.execute("SELECT published_at FROM dispatch_outboxmessage WHERE id = %s", [envelope_id])
        row = cursor.fetchone()
    return row[0] if row else None
