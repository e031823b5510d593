"""The relay: publishes due outbox envelopes to RabbitMQ with publisher confirms, then stamps them
(docs/ARCHITECTURE.md rule 4).

Publish, then forget, without a transaction open while messages are in flight (docs/DESIGN.md "Relay leases"):
1. claim due envelopes in a short transaction that leases them to this relay (owner + expiry on the row), commit;
2. stage them in memory and publish each at its instant, every publish bounded by a timeout;
3. stamp `published_at` on the confirmed ones still leased to this relay, and hand the others back, in one short
   statement.
A crash anywhere leaves the rows unstamped and they are published again under the same occurrence ids (an intended
duplicate), at once if this relay is gone from PostgreSQL, else when its lease expires; stamping before publishing
would lose fires. Settling the stamps onto the occurrences runs beside it (dispatch/engine/settler.py).

It runs on asyncio so hundreds of messages are in flight at once (asynchronous confirms: ~3x the rate of
waiting for each confirm), and talks to PostgreSQL with psycopg's async connection, outside the Django ORM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import psycopg
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from django.conf import settings

from dispatch import counters
from dispatch.engine import loop, relay_claims
from dispatch.engine.brokers import BrokerNodes
from dispatch.engine.faults import crash_point
from dispatch.engine.loop import Outage, StopFlag, default_process_name, run_loop_async
from dispatch.engine.publishing import (
    BrokerBlocked,
    CrowdRouter,
    PublishFailed,
    QueueRefusals,
    broker_blocked,
    bundles,
    publish_group,
    refused_by_broker,
)
from dispatch.engine.relay_claims import Grant, StagedEnvelope
from dispatch.engine.settler import Settler
from dispatch.queues import CONSUMED_QUEUES, queue_arguments
from dispatch.sql import database_conninfo
from dispatch.sql import leases as lease_sql
from dispatch.sql import outbox as outbox_sql
from dispatch.timer import RUNNING, Claimed, PriorityTimer

logger = logging.getLogger(__name__)

ROLE = "relay"


@dataclass
class RelayStats:
    published_envelopes: int = 0
    published_occurrences: int = 0
    failed_publishes: int = 0
    settled_envelopes: int = 0
    withdrawn_envelopes: int = 0
    throttled_steps: int = 0


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
        self.conninfo = conninfo or database_conninfo()
        self.max_idle = settings.SCHEDULER_RELAY_MAX_IDLE_SECONDS
        self.stage_seconds = settings.SCHEDULER_RELAY_STAGE_SECONDS
        self.flexible_min_share = settings.SCHEDULER_FLEXIBLE_MIN_SHARE
        self.publish_timeout = settings.SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS
        # One node, or a cluster's nodes `;`-separated: the relay moves to the next one when its node is lost.
        self.brokers = BrokerNodes(
            broker_url or settings.CELERY_BROKER_URL, self._open_broker, close_timeout=self.publish_timeout
        )
        # The most fires one message carries when small envelopes due together share it (an envelope's own size).
        self.bundle_fires = settings.SCHEDULER_ENVELOPE_SIZE
        self.lease_seconds = settings.SCHEDULER_RELAY_LEASE_SECONDS
        # The lease owner: this relay's connection's application_name as PostgreSQL keeps it (cut to 63 bytes), so
        # other relays can tell from pg_stat_activity whether the owner is still connected. Read at connect.
        self.owner = self.name
        self._rotation = 0
        # Set by a step in which every due envelope waited for its tenant's tokens: how long to nap.
        self._throttled_for: float | None = None
        self._invalidation_mark: int | None = None
        self.stop = StopFlag()
        self.stats = RelayStats()
        self.refusals = QueueRefusals()
        self.crowds = CrowdRouter(settings.SCHEDULER_CROWD_FIRES)
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
            # Autocommit: a statement outside `transaction()` commits at once, so the relay can never be left idle
            # in a transaction while it waits for the broker.
            self._db = await psycopg.AsyncConnection.connect(self.conninfo, application_name=self.name, autocommit=True)
            self.owner = await self._scalar("SELECT current_setting('application_name')")
            self._invalidation_mark = await self._scalar(outbox_sql.INVALIDATION_MARK)
        # With a cluster: the robust connection would wait for its own lost node forever; another node serves now.
        if self._broker is not None and self.brokers.must_leave(self._broker):
            lost, self._broker, self._channel, self._queues_declared = self._broker, None, None, False
            await self.brokers.leave(lost)
        if self._broker is None:
            self._broker = await self.brokers.connect()
        if broker_blocked(self._broker):
            raise BrokerBlocked("RabbitMQ has blocked the relay's connection (a memory or disk alarm)")
        if self._channel is None or self._channel.is_closed:
            # on_return_raises: a message the broker could not route (its queue was deleted) comes back as an error
            # of its publish, never as a confirmation: the envelope stays unstamped and is published again.
            self._channel = await asyncio.wait_for(
                self._broker.channel(publisher_confirms=True, on_return_raises=True), timeout=self.publish_timeout
            )
            self._queues_declared = False
        if not self._queues_declared:
            await self.declare_queues()
            self._queues_declared = True
            logger.info("relay %s connected; queues declared", self.name, extra={"action": "connect"})

    async def _open_broker(self, url: str) -> AbstractRobustConnection:
        return await aio_pika.connect_robust(
            url, client_properties={"connection_name": self.name}, timeout=self.publish_timeout
        )

    async def declare_queues(self) -> None:
        """Declare the lanes' queues (idempotent): also after a failed publish, since a deleted queue is the
        usual reason a message comes back. Bounded like a publish: a blocked broker answers nothing."""
        for queue in CONSUMED_QUEUES:
            # Durable, with the same arguments as the Celery workers declare them (dispatch.queues.queue_arguments).
            arguments: Any = queue_arguments() or None
            await self.channel.declare_queue(queue, durable=True, arguments=arguments, timeout=self.publish_timeout)

    async def close(self) -> None:
        await self.settler.close()
        if self._broker is not None:
            await self._broker.close()
        if self._db is not None:
            await self._db.close()

    # --- steps -------------------------------------------------------------------------------------------------

    async def step(self) -> bool:
        """Publish what is due; True if anything was done. Settling runs beside it (dispatch/engine/settler.py).

        Raises PublishFailed when envelopes were due and none could be published for the broker's sake (down,
        blocked, every publish timed out), so the loop backs off instead of spinning on a dead channel.
        """
        published_before = self.stats.published_occurrences
        done = await self.publish_due()
        if self.stats.published_occurrences - published_before >= loop.TRIM_AFTER_FIRES:
            loop.return_free_memory()  # a burst's staged bodies are out: their pages go back (dispatch/engine/loop.py)
        # A full batch means a burst: more is due at once, and the settler holds back while it is released.
        if done >= self.batch_size:
            self.settler.hold_back()
        else:
            self.settler.go_ahead()
        return done > 0

    async def publish_due(self) -> int:
        """Claim envelopes due within the staging lead, fairly across tenants and within their fire rates, release
        each at its instant, stamp the confirmed ones; returns the envelopes claimed or withdrawn.

        1. Reserve (own short transaction): each due tenant's bucket is refilled and grants up to what it has due
           (max_fires_per_second, shared by every relay); tenants granted nothing have their due envelopes marked
           throttled. Envelopes of tenants that no longer exist are withdrawn, their occurrences canceled.
        2. Claim each lane's envelopes by weighted fair shares of the batch (strict first; flexible work keeps
           SCHEDULER_FLEXIBLE_MIN_SHARE of it so it is never starved), SKIP LOCKED, leased to this relay in a short
           transaction; per tenant only what its grant covers is kept. Stage them in a PriorityTimer keyed by
           (available_at, -priority, sequence), mapped onto the monotonic clock through one reading of PostgreSQL's.
        3. At each instant publish every due entry concurrently, strict before flexible and tenants interleaved
           by weighted fair queueing; nothing is published before its available_at. Before each release, if the
           invalidation mark moved, drop staged envelopes whose occurrences were all withdrawn meanwhile. No
           transaction is open; each publish has SCHEDULER_RELAY_PUBLISH_TIMEOUT_SECONDS to be confirmed.
        4. Stamp the confirmed envelopes still leased to this relay and hand the others back (a refused one with
           its own backoff), in one statement; give back the tokens of what was granted and not sent.
        """
        self._throttled_for = None
        if broker_blocked(self._broker):
            raise BrokerBlocked("RabbitMQ has blocked the relay's connection (a memory or disk alarm)")
        grants, orphans = await relay_claims.reserve(self.db, owner=self.owner, lead=self.stage_seconds)
        withdrawn = 0
        if orphans:
            withdrawn, _ = await relay_claims.withdraw_orphans(self.db, orphans)
            self.stats.withdrawn_envelopes += withdrawn
            counters.RELAY_WITHDRAWN_ENVELOPES.inc(withdrawn)
        if any(grant.granted <= 0 for grant in grants.values()):
            self.stats.throttled_steps += 1
        if not grants:
            return withdrawn
        used: dict[int, int] = dict.fromkeys(grants, 0)
        try:
            claimed = await self._publish_claimed(grants, used)
        finally:
            await relay_claims.return_tokens(self.db, grants, used)
        if not claimed:
            starved = [g.refill_seconds for g in grants.values() if g.granted <= 0]
            if starved:
                # Everything due waits for tokens: sleep until the first bucket refills instead of polling.
                self._throttled_for = min(self.max_idle, max(0.005, min(starved)))
        return claimed + withdrawn

    async def _publish_claimed(self, grants: dict[int, Grant], used: dict[int, int]) -> int:
        """Steps 2 to 4 of publish_due: stage, release, stamp. Adds the fires sent per tenant to `used`; returns the
        envelopes claimed."""
        claim_started = time.monotonic()
        staged = await self._stage(grants)
        if not staged:
            return 0
        stamps: dict[int, datetime | None] = dict.fromkeys(staged)
        refused: set[int] = set()
        broken: list[BaseException] = []
        try:
            await self._release(staged, stamps, refused, broken)
        finally:
            # Whatever ended the release (done, stopped, blocked, cancelled), the claim ends in one short statement:
            # the confirmed envelopes stamped, the others handed back. If this statement fails, the lease does it.
            stamped = await self._stamp(stamps, refused)
        published = [staged[envelope_id] for envelope_id, stamp in stamps.items() if stamp is not None]
        for envelope in published:
            used[envelope.tenant_id] += envelope.fires
        self._count(published, refused, broken)
        blocked = next((exc for exc in broken if isinstance(exc, BrokerBlocked)), None)
        if blocked is not None:
            raise blocked
        if broken and not published:
            raise PublishFailed(f"none of {len(staged)} due envelopes could be published: {broken[0]!r}")
        if broken:
            if any(isinstance(exc, TimeoutError) for exc in broken):  # it confirmed some, then froze
                self.brokers.unconfirmed()
            logger.warning(
                "%d publishes failed with the broker connection (first: %r); their envelopes go out again",
                len(broken),
                broken[0],
                extra={"action": "publish_failed"},
            )
        logger.debug(
            "published %d envelopes (%d stamped); %.3f s after the claim",
            len(published),
            len(stamped),
            time.monotonic() - claim_started,
            extra={"action": "publish"},
        )
        return len(staged)

    async def _stage(self, grants: dict[int, Grant]) -> dict[int, StagedEnvelope]:
        """Step 2: claim each lane's envelopes by weighted fair shares of the batch, leased to this relay."""
        self._rotation += 1
        shares = relay_claims.lane_shares(
            grants, batch_size=self.batch_size, flexible_min_share=self.flexible_min_share, rotation=self._rotation
        )
        started = time.monotonic()
        staged = await relay_claims.claim(
            self.db, grants, shares, owner=self.owner, lead=self.stage_seconds, lease=self.lease_seconds
        )
        if staged:
            logger.debug(
                "claimed %d envelopes in %.3f s", len(staged), time.monotonic() - started, extra={"action": "claim"}
            )
        return staged

    async def _stamp(self, stamps: dict[int, datetime | None], refused: set[int]) -> set[int]:
        """Step 4: stamp the confirmed envelopes still leased to this relay, hand the others back (a refused one
        with its own backoff), in one statement; the settler is told of the new stamps."""
        if any(stamp is not None for stamp in stamps.values()):
            crash_point("relay.after_publish")
        stamped = await relay_claims.finish(self.db, stamps, refused=refused, owner=self.owner)
        if stamped:
            crash_point("relay.after_stamp")
            self.settler.note_stamped()
        return stamped

    def _count(self, published: list[StagedEnvelope], refused: set[int], broken: list[BaseException]) -> None:
        occurrences = sum(envelope.fires for envelope in published)
        self.stats.published_envelopes += len(published)
        self.stats.published_occurrences += occurrences
        counters.RELAY_PUBLISHED_ENVELOPES.inc(len(published))
        counters.RELAY_PUBLISHED_OCCURRENCES.inc(occurrences)
        counters.RELAY_FAILED_PUBLISHES.inc(len(refused) + len(broken))
        if refused or broken:
            # A returned message usually means its queue is gone: declare the queues again before the next step,
            # also when other envelopes of this step went through.
            self._queues_declared = False

    async def _release(
        self,
        staged: dict[int, StagedEnvelope],
        stamps: dict[int, datetime | None],
        refused: set[int],
        broken: list[BaseException],
    ) -> None:
        """Step 3: publish each staged envelope at its instant. Fills `stamps` (confirmation instants), `refused`
        (nacked or returned: backs off alone) and `broken` (the connection's failures: the release stops there)."""
        anchor_db, anchor_mono = await relay_claims.clock_anchor(self.db)
        timer = PriorityTimer(workers=1)
        for envelope in staged.values():
            release_at = anchor_mono + (envelope.available_at - anchor_db).total_seconds()
            timer.schedule(envelope.id, release_at, envelope.priority, _published_by_relay)
        while not broken:
            due: list[Claimed] = []
            wait = timer.next()
            while isinstance(wait, Claimed):
                due.append(wait)
                wait = timer.next()
            if due:
                for envelope_id in await self._drop_withdrawn(timer, due):
                    stamps.pop(envelope_id, None)
                # Strict before flexible, then tenants interleaved by their fair-queueing tags: the order the
                # messages take on the channel, and so in the queues.
                live = sorted(
                    (claim for claim in due if timer.state(claim.task_id) == RUNNING),
                    key=lambda claim: staged[_envelope_id(claim)].release_key,
                )
                released = [staged[_envelope_id(claim)] for claim in live]
                messages = bundles(released, self.bundle_fires, self.crowds.routes(released))
                by_envelope = await publish_group(self.channel, self._broker, messages, timeout=self.publish_timeout)
                for claim in live:
                    envelope = staged[_envelope_id(claim)]
                    result = by_envelope[envelope.id]
                    timer.complete(claim, ok=not isinstance(result, BaseException))
                    if isinstance(result, BaseException):
                        self.stats.failed_publishes += 1
                        if refused_by_broker(result):
                            refused.add(envelope.id)
                            self.refusals.refused(envelope.queue, result)
                            counters.RELAY_PUBLISH_BACKOFFS.labels(envelope.queue).inc()
                        else:
                            broken.append(result)
                        continue
                    self.refusals.accepted(envelope.queue)
                    stamps[envelope.id] = anchor_db + timedelta(seconds=result - anchor_mono)
                continue
            if wait is None or self.stop.is_set:
                break
            await loop.idle_sleep(wait)

    async def _drop_withdrawn(self, timer: PriorityTimer, due: list[Claimed]) -> list[int]:
        """Delete due envelopes all of whose occurrences were withdrawn since staging, or whose row is gone (rare:
        checked only when an update, pause, cancel or tenant deletion moved the invalidation mark)."""
        mark = await self._scalar(outbox_sql.INVALIDATION_MARK)
        if mark == self._invalidation_mark:
            return []
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
        return withdrawn

    async def seconds_until_due(self) -> float:
        """How long to sleep: until something may be claimable (PostgreSQL's clock: an envelope entering the
        staging lead, a backoff or another live relay's lease ending), capped."""
        seconds = await self._scalar(outbox_sql.SECONDS_UNTIL_DUE, {"lead": self.stage_seconds, "owner": self.owner})
        if seconds is None:
            return self.max_idle
        return min(self.max_idle, max(0.0, float(seconds)))

    async def heartbeat(self) -> None:
        """Every SCHEDULER_HEARTBEAT_SECONDS, in a short transaction of its own: this relay's loop is alive (the
        console and /healthz read it), with its clock skew. Written by the loop itself (also while it backs off
        from an outage), so a frozen loop goes silent."""
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
        """Step until stopped (dispatch/engine/loop.py, its async face). A failure (PostgreSQL or the broker
        restarting, a blocked connection, a deleted queue, publishes timing out) ends no process: the relay backs
        off (capped, logged once per outage), reconnects what broke, re-declares its queues and goes on; the
        unstamped envelopes are simply published again. Settling runs beside it on a thread of its own."""
        logger.info("relay %s started", self.name, extra={"action": "start"})
        if not once:
            self.settler.start_thread()
        try:
            ended_idle = await run_loop_async(
                self._connected_step,
                self.stop,
                idle_seconds=self._idle_seconds,
                once=once,
                on_error=self._forget_broken,
                outage=Outage(),
                while_out=self._heartbeat_if_connected,
            )
            if ended_idle:  # --once: everything it stamped is settled before it exits
                await self.settler.settle_all()
        finally:
            if not once:
                await asyncio.to_thread(self.settler.stop_thread)
            await self.forget_heartbeat()
            await self.close()
            logger.info("relay %s stopped: %s", self.name, self.stats, extra={"action": "stop"})

    async def _connected_step(self) -> bool:
        self.settler.ensure_running()
        await self.connect()
        await self.heartbeat()
        return await self.step()

    async def _idle_seconds(self) -> float:
        """Until something may be due, and no sooner than the first starved tenant's bucket refills."""
        wait = await self.seconds_until_due()
        return wait if self._throttled_for is None else max(wait, self._throttled_for)

    def _forget_broken(self, exc: BaseException) -> None:
        """After a failed step: declare the queues again, reopen a closed channel; with a cluster, leave a node that
        confirmed nothing or timed out (a frozen or partitioned node keeps its TCP connection open, silent)."""
        self._queues_declared = False
        if isinstance(exc, PublishFailed | TimeoutError) and not isinstance(exc, BrokerBlocked):
            self.brokers.unconfirmed()
        if self._channel is not None and self._channel.is_closed:
            self._channel = None

    async def _heartbeat_if_connected(self) -> None:
        """Backing off from an outage, the loop still writes its heartbeat when PostgreSQL answers: alive, waiting."""
        if self._db is not None and not self._db.closed and not self._db.broken:
            try:
                await self.heartbeat()
            except psycopg.Error:
                logger.debug("heartbeat during an outage failed", exc_info=True)

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
