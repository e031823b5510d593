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
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import psycopg
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from django.conf import settings
from django.db import connection as django_connection

from dispatch import counters
from dispatch.engine.faults import crash_point
from dispatch.engine.loop import Outage, StopFlag, default_process_name
from dispatch.engine.settler import LAG_BUCKETS, Settler
from dispatch.engine.timer import Claimed, PriorityTimer
from dispatch.envelopes import message_headers, task_id_for
from dispatch.queues import ALL_QUEUES, STRICT_QUEUE, queue_arguments
from dispatch.quotas import Demand, fair_shares, virtual_finish
from dispatch.sql import DB_NOW
from dispatch.sql import leases as lease_sql
from dispatch.sql import outbox as outbox_sql
from dispatch.sql import quotas as quota_sql

logger = logging.getLogger(__name__)

ROLE = "relay"
# The settle statement's parameters (tests settle by hand with them).
_LAG_BUCKETS = LAG_BUCKETS


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


class PublishFailed(Exception):
    """Envelopes were due and none could be published (broker down, queue deleted, messages returned)."""


@dataclass
class RelayStats:
    published_envelopes: int = 0
    published_occurrences: int = 0
    failed_publishes: int = 0
    settled_envelopes: int = 0
    withdrawn_envelopes: int = 0
    throttled_steps: int = 0


@dataclass(frozen=True)
class Grant:
    """One tenant's due work in a relay step and the fires its bucket granted (dispatch/sql/quotas.py)."""

    wanted: int
    granted: int
    weight: int
    strict_envelopes: int
    flexible_envelopes: int
    # How long until its bucket holds a token again (0 when it holds some now).
    refill_seconds: float = 0.0

    @property
    def envelopes_covered(self) -> int:
        """About how many of its envelopes the grant pays for (at least one when it granted anything)."""
        envelopes = self.strict_envelopes + self.flexible_envelopes
        if self.granted >= self.wanted or self.wanted <= 0:
            return envelopes
        return max(1, math.ceil(self.granted * envelopes / self.wanted))


@dataclass(frozen=True)
class StagedEnvelope:
    """A claimed envelope waiting for its instant; release_key orders envelopes due at the same instant."""

    id: int
    queue: str
    priority: int
    body: bytes
    fires: int
    available_at: datetime
    tenant_id: int
    release_key: tuple[int, float]


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
        self.stage_seconds = settings.SCHEDULER_RELAY_STAGE_SECONDS
        self.flexible_min_share = settings.SCHEDULER_FLEXIBLE_MIN_SHARE
        self._rotation = 0
        # Set by a step in which every due envelope waited for its tenant's tokens: how long to nap.
        self._throttled_for: float | None = None
        self._invalidation_mark: int | None = None
        self.stop = StopFlag()
        self.stats = RelayStats()
        self._db: psycopg.AsyncConnection | None = None
        self._broker: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._queues_declared = False
        self._next_heartbeat = 0.0
        self.settler = Settler(self.name, self.conninfo, most=self.settle_batch, stats=self.stats)

    # --- connections -------------------------------------------------------------------------------------------

    @property
    def db(self) -> psycopg.AsyncConnection:
        if self._db is None:
            raise RuntimeError("the relay is not connected to PostgreSQL")
        return self._db

    @property
    def channel(self) -> AbstractChannel:
        if self._channel is None:
            raise RuntimeError("the relay is not connected to the broker")
        return self._channel

    async def _scalar(self, query: str, params: dict | None = None) -> Any:
        """The first column of the first row of a one-row query."""
        row = await (await self.db.execute(query, params)).fetchone()
        return row[0] if row is not None else None

    async def connect(self) -> None:
        """Open what is not open (or broken): PostgreSQL, the broker, a confirming channel, the lanes' queues."""
        if self._db is None or self._db.closed or self._db.broken:
            if self._db is not None:
                await self._db.close()
            self._db = await psycopg.AsyncConnection.connect(self.conninfo, application_name=self.name)
            self._invalidation_mark = await self._scalar(outbox_sql.INVALIDATION_MARK)
            await self.db.commit()
        if self._broker is None:
            self._broker = await aio_pika.connect_robust(
                self.broker_url, client_properties={"connection_name": self.name}
            )
        if self._channel is None or self._channel.is_closed:
            # on_return_raises: a message the broker could not route (its queue was deleted) comes back as an error
            # of its publish, never as a confirmation: the envelope stays unstamped and is published again.
            self._channel = await self._broker.channel(publisher_confirms=True, on_return_raises=True)
            self._queues_declared = False
        if not self._queues_declared:
            await self.declare_queues()
            self._queues_declared = True
            logger.info("relay %s connected; queues declared", self.name, extra={"action": "connect"})

    async def declare_queues(self) -> None:
        """Declare the lanes' queues (idempotent): also after a failed publish, since a deleted queue is the
        usual reason a message comes back."""
        for queue in ALL_QUEUES:
            # Durable, with the same arguments as the Celery workers declare them (dispatch.queues.queue_arguments).
            arguments: Any = queue_arguments() or None
            await self.channel.declare_queue(queue, durable=True, arguments=arguments)

    async def close(self) -> None:
        await self.settler.close()
        if self._broker is not None:
            await self._broker.close()
        if self._db is not None:
            await self._db.close()

    # --- steps -------------------------------------------------------------------------------------------------

    async def step(self) -> bool:
        """Publish what is due; True if anything was claimed. Settling runs beside it (dispatch/engine/settler.py).

        Raises PublishFailed when envelopes were due and none could be published, so the loop backs off instead of
        spinning on a dead channel.
        """
        claimed = await self.publish_due()
        # A full batch means a burst: more is due at once, and the settler holds back while it is released.
        if claimed >= self.batch_size:
            self.settler.quiet.clear()
        else:
            self.settler.quiet.set()
        return claimed > 0

    async def publish_due(self) -> int:
        """Claim envelopes due within the staging lead, fairly across tenants and within their fire rates, release
        each at its instant, stamp the confirmed ones.

        1. Reserve (own short transaction): each due tenant's bucket is refilled and grants up to what it has due
           (max_fires_per_second, shared by every relay); tenants granted nothing have their due envelopes marked
           throttled.
        2. Claim each lane's envelopes by weighted fair shares of the batch (strict first; flexible work keeps
           SCHEDULER_FLEXIBLE_MIN_SHARE of it so it is never starved), SKIP LOCKED, and keep per tenant what its
           grant covers. Stage them in a PriorityTimer keyed by (available_at, -priority, sequence), mapped onto
           the monotonic clock through one reading of PostgreSQL's clock.
        3. At each instant publish every due entry concurrently, strict before flexible and tenants interleaved
           by weighted fair queueing; nothing is published before its available_at. Before each release, if the
           invalidation mark moved, drop staged envelopes whose occurrences were all withdrawn meanwhile. Stamp the
           confirmed envelopes and commit; the locks end with the transaction.
        4. Give back the tokens of what was granted and not sent (own short transaction).
        """
        self._throttled_for = None
        grants = await self._reserve()
        if not grants:
            return 0
        used: dict[int, int] = dict.fromkeys(grants, 0)
        try:
            claimed = await self._publish_claimed(grants, used)
        finally:
            await self._return_tokens(grants, used)
        if not claimed:
            starved = [g.refill_seconds for g in grants.values() if g.granted <= 0]
            if starved:
                # Everything due waits for tokens: sleep until the first bucket refills instead of polling.
                self._throttled_for = min(self.max_idle, max(0.005, min(starved)))
        return claimed

    async def _reserve(self) -> dict[int, Grant]:
        """Step 1 of publish_due: per due tenant, what it has due and the fires its bucket grants."""
        async with self.db.transaction():
            cursor = await self.db.execute(
                quota_sql.RESERVE_FIRES, {"lead": self.stage_seconds, "strict_queue": STRICT_QUEUE}
            )
            grants = {row[0]: Grant(*row[1:]) for row in await cursor.fetchall()}
        starved = [tenant for tenant, grant in grants.items() if grant.granted <= 0]
        if starved:
            async with self.db.transaction():
                await self.db.execute(quota_sql.MARK_THROTTLED, {"tenant_ids": starved})
            self.stats.throttled_steps += 1
        return grants

    async def _return_tokens(self, grants: dict[int, Grant], used: dict[int, int]) -> None:
        """Step 4: unused tokens back to the buckets. A failure here costs the tenant at most one grant of rate
        (the bucket refills), never a fire, so it is logged and the step goes on."""
        tenants = sorted(tenant for tenant, grant in grants.items() if grant.granted > 0)
        if not tenants:
            return
        try:
            async with self.db.transaction():
                await self.db.execute(
                    quota_sql.RETURN_TOKENS,
                    {
                        "tenant_ids": tenants,
                        "unused": [grants[t].granted - used[t] for t in tenants],
                        "used": [used[t] for t in tenants],
                    },
                )
        except psycopg.Error as exc:
            logger.warning("could not return unused tokens: %r", exc, extra={"action": "return_tokens"})

    def _lane_shares(self, grants: dict[int, Grant]) -> tuple[dict[int, int], dict[int, int]]:
        """Envelopes per tenant for this batch, strict and flexible: weighted fair shares of the batch, each cut
        to about what the tenant's grant covers."""
        self._rotation += 1
        flexible_due = any(g.flexible_envelopes for g in grants.values())
        floor = math.ceil(self.batch_size * self.flexible_min_share) if flexible_due else 0
        strict = fair_shares(
            {t: Demand(g.strict_envelopes, g.weight) for t, g in grants.items() if g.granted > 0},
            self.batch_size - floor,
            rotation=self._rotation,
        )
        flexible = fair_shares(
            {t: Demand(g.flexible_envelopes, g.weight) for t, g in grants.items() if g.granted > 0},
            self.batch_size - sum(strict.values()),
            rotation=self._rotation,
        )
        for shares in (strict, flexible):
            for tenant, share in shares.items():
                shares[tenant] = min(share, grants[tenant].envelopes_covered)
        return strict, flexible

    async def _claim(self, grants: dict[int, Grant]) -> dict[int, StagedEnvelope]:
        """Step 2: lock each lane's fair shares and keep, per tenant, the envelopes its grant covers (an envelope
        is never split: the last one may overdraw the grant). The others stay unpublished for a later step."""
        staged: dict[int, StagedEnvelope] = {}
        fires_so_far: dict[int, int] = dict.fromkeys(grants, 0)
        for lane_rank, (queue, shares) in enumerate(zip(ALL_QUEUES, self._lane_shares(grants), strict=True)):
            if not shares:
                continue
            tenants = sorted(shares)
            cursor = await self.db.execute(
                quota_sql.CLAIM_FAIR_SHARES,
                {
                    "tenant_ids": tenants,
                    "shares": [shares[t] for t in tenants],
                    "queue": queue,
                    "lead": self.stage_seconds,
                },
            )
            rows = sorted(await cursor.fetchall(), key=lambda r: (r[6], r[5], -r[2], r[0]))
            for envelope_id, queue_name, priority, body, fires, available_at, tenant in rows:
                grant = grants[tenant]
                if fires_so_far[tenant] >= grant.granted:
                    continue
                fires_so_far[tenant] += fires
                staged[envelope_id] = StagedEnvelope(
                    envelope_id,
                    queue_name,
                    priority,
                    body,
                    fires,
                    available_at,
                    tenant,
                    (lane_rank, virtual_finish(fires_so_far[tenant], grant.weight)),
                )
        return staged

    async def _publish_claimed(self, grants: dict[int, Grant], used: dict[int, int]) -> int:
        """Steps 2 and 3 of publish_due, in the claim transaction. Adds the fires sent per tenant to `used`."""
        async with self.db.transaction():
            claim_started = time.monotonic()
            staged = await self._claim(grants)
            if not staged:
                return 0
            claim_seconds = time.monotonic() - claim_started
            logger.debug("claimed %d envelopes in %.3f s", len(staged), claim_seconds, extra={"action": "claim"})
            anchor_db = await self._scalar(DB_NOW)
            anchor_mono = time.monotonic()
            timer = PriorityTimer(workers=1)
            for envelope in staged.values():
                release_at = anchor_mono + (envelope.available_at - anchor_db).total_seconds()
                timer.schedule(envelope.id, release_at, envelope.priority, _published_by_relay)
            ids, stamps, occurrences, failed = [], [], 0, 0
            while True:
                due: list[Claimed] = []
                wait = timer.next()
                while isinstance(wait, Claimed):
                    due.append(wait)
                    wait = timer.next()
                if due:
                    await self._drop_withdrawn(timer, due)
                    # Strict before flexible, then tenants interleaved by their fair-queueing tags: the order the
                    # messages take on the channel, and so in the queues.
                    live = sorted(
                        (claim for claim in due if timer.state(claim.task_id) == "running"),
                        key=lambda claim: staged[_envelope_id(claim)].release_key,
                    )
                    results = await asyncio.gather(
                        *(self._publish(staged[_envelope_id(claim)]) for claim in live), return_exceptions=True
                    )
                    for claim, result in zip(live, results, strict=True):
                        timer.complete(claim, ok=not isinstance(result, BaseException))
                        if isinstance(result, BaseException):
                            failed += 1
                            self.stats.failed_publishes += 1
                            logger.warning(
                                "publish of envelope %s failed: %r",
                                claim.task_id,
                                result,
                                extra={"action": "publish_failed"},
                            )
                            continue
                        envelope = staged[_envelope_id(claim)]
                        ids.append(envelope.id)
                        stamps.append(anchor_db + timedelta(seconds=result - anchor_mono))
                        occurrences += envelope.fires
                        used[envelope.tenant_id] += envelope.fires
                    continue
                if wait is None or self.stop.is_set:
                    break
                await asyncio.sleep(wait)
            if ids:
                crash_point("relay.after_publish")
                await self.db.execute(outbox_sql.MARK_PUBLISHED, {"ids": ids, "published_ats": stamps})
        if ids:
            crash_point("relay.after_stamp")
            self.settler.stamped.set()
        else:
            # Nothing was stamped: the commit above kept nothing of this step, so no tokens were used either.
            used.update(dict.fromkeys(used, 0))
        if failed:
            # A returned message usually means its queue is gone: declare the queues again before the next step,
            # also when other envelopes of this step went through.
            self._queues_declared = False
        if failed and not ids:
            raise PublishFailed(f"none of {failed} due envelopes could be published")
        self.stats.published_envelopes += len(ids)
        self.stats.published_occurrences += occurrences
        counters.RELAY_PUBLISHED_ENVELOPES.inc(len(ids))
        counters.RELAY_PUBLISHED_OCCURRENCES.inc(occurrences)
        counters.RELAY_FAILED_PUBLISHES.inc(failed)
        logger.debug(
            "published %d envelopes (%d occurrences); stamped %.3f s after the claim",
            len(ids),
            occurrences,
            time.monotonic() - claim_started,
            extra={"action": "publish"},
        )
        return len(staged)

    async def _drop_withdrawn(self, timer: PriorityTimer, due: list[Claimed]) -> None:
        """Delete due envelopes all of whose occurrences were withdrawn since staging (rare: checked only when
        an update, pause or cancel moved the invalidation mark)."""
        mark = await self._scalar(outbox_sql.INVALIDATION_MARK)
        if mark == self._invalidation_mark:
            return
        self._invalidation_mark = mark
        cursor = await self.db.execute(outbox_sql.WITHDRAWN_ENVELOPES, {"ids": [claim.task_id for claim in due]})
        withdrawn = [row[0] for row in await cursor.fetchall()]
        if withdrawn:
            await self.db.execute(outbox_sql.DELETE_ENVELOPES, {"ids": withdrawn})
            for claim in due:
                if claim.task_id in withdrawn:
                    timer.complete(claim, ok=False)
            self.stats.withdrawn_envelopes += len(withdrawn)
            counters.RELAY_WITHDRAWN_ENVELOPES.inc(len(withdrawn))
            logger.info("dropped %d withdrawn envelopes", len(withdrawn), extra={"action": "drop_withdrawn"})

    async def _publish(self, envelope: StagedEnvelope) -> float:
        """Publish one envelope; resolves when the broker confirmed it, returning that monotonic instant."""
        task_id = task_id_for(envelope.id)
        message = aio_pika.Message(
            bytes(envelope.body),
            headers=message_headers(task_id, envelope.fires),
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            correlation_id=task_id,
        )
        # mandatory: an unroutable message comes back as an error instead of vanishing, so it is retried.
        await self.channel.default_exchange.publish(message, routing_key=envelope.queue, mandatory=True)
        return time.monotonic()

    async def seconds_until_due(self) -> float:
        """How long to sleep: until the earliest unpublished envelope is due (PostgreSQL's clock), capped."""
        async with self.db.transaction():
            cursor = await self.db.execute(outbox_sql.SECONDS_UNTIL_DUE)
            row = await cursor.fetchone()
        if row is None or row[0] is None:
            return self.max_idle
        # Wake when the earliest envelope enters the staging lead, so it is in memory before its instant.
        return min(self.max_idle, max(0.0, float(row[0]) - self.stage_seconds))

    async def heartbeat(self) -> None:
        """Every SCHEDULER_HEARTBEAT_SECONDS, in a short transaction of its own: this relay's loop is alive (the
        console and /healthz read it), with its clock skew. Written by the loop itself, so a frozen loop goes
        silent."""
        if time.monotonic() < self._next_heartbeat:
            return
        async with self.db.transaction():
            await self.db.execute(
                lease_sql.PROCESS_HEARTBEAT,
                {"name": self.name, "role": ROLE, "process_now": datetime.now(UTC)},
            )
        self._next_heartbeat = time.monotonic() + settings.SCHEDULER_HEARTBEAT_SECONDS

    async def forget_heartbeat(self) -> None:
        if self._db is None or self._db.closed or self._db.broken:
            return
        try:
            async with self.db.transaction():
                await self.db.execute(lease_sql.FORGET_PROCESS, {"name": self.name})
        except psycopg.Error:
            logger.debug("could not forget the heartbeat of %s", self.name, exc_info=True)

    # --- process -----------------------------------------------------------------------------------------------

    async def run_async(self, *, once: bool = False) -> None:
        """Step until stopped. A failure (PostgreSQL or the broker restarting, a deleted queue, a nacked or
        returned publish) ends no process: the relay backs off (capped, logged once per outage), reconnects what
        broke, re-declares its queues and goes on; the unstamped envelopes are simply published again."""
        outage = Outage()
        logger.info("relay %s started", self.name, extra={"action": "start"})
        settling = None if once else asyncio.create_task(self.settler.run(self.stop))
        try:
            while not self.stop.is_set:
                try:
                    await self.connect()
                    await self.heartbeat()
                    did_work = await self.step()
                    outage.succeeded()
                    if did_work:
                        continue
                    if once:
                        await self.settler.settle_all()
                        return
                    wait = await self.seconds_until_due()
                    if self._throttled_for is not None:
                        wait = max(wait, self._throttled_for)
                    await self._nap(wait)
                except Exception as exc:
                    if once:
                        raise
                    await self._nap(outage.failed(exc))
                    # Reconnect what broke and declare the queues again before the next try.
                    self._queues_declared = False
                    if self._channel is not None and self._channel.is_closed:
                        self._channel = None
        finally:
            if settling is not None:
                settling.cancel()
                await asyncio.gather(settling, return_exceptions=True)
            await self.forget_heartbeat()
            await self.close()
            logger.info("relay %s stopped: %s", self.name, self.stats, extra={"action": "stop"})

    async def _nap(self, seconds: float) -> None:
        """Sleep in short slices so SIGTERM ends even a long backoff at once."""
        deadline = time.monotonic() + seconds
        while not self.stop.is_set and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.25))

    def run(self, *, once: bool = False) -> None:
        self.stop.install()
        counters.start_flushing(settings.SCHEDULER_HEARTBEAT_SECONDS)
        try:
            asyncio.run(self.run_async(once=once))
        finally:
            counters.stop_flushing()


def _envelope_id(claim: Claimed) -> int:
    """The timer's task ids are the staged envelopes' ids."""
    assert isinstance(claim.task_id, int)
    return claim.task_id


def _published_by_relay(cancel_event: object) -> None:
    """The timer entries are only ordering keys: the relay publishes claimed entries itself (manual mode)."""
