"""The relay's claim of due envelopes: fire-rate grants, fair shares, leases, and the stamp that ends a claim.

Every function here is one short transaction (or a single autocommitted statement) on the relay's own connection:
nothing stays open while messages are in flight. The statements are in dispatch/sql/quotas.py (grants, the fair
leased claim) and dispatch/sql/outbox.py (the stamp, orphans).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime

import psycopg

from core.clock import DB_NOW
from dispatch.queues import ALL_QUEUES, STRICT_QUEUE
from dispatch.quotas import Demand, fair_shares, virtual_finish
from dispatch.sql import outbox as outbox_sql
from dispatch.sql import quotas as quota_sql

logger = logging.getLogger(__name__)

# A refused publish (nacked or returned by the broker) is tried again after this long, doubled with each refusal
# in a row up to the cap, and jittered to between half and all of it: a queue that refuses everything costs a few
# publishes a minute per envelope, not one per relay step, and envelopes refused together do not return together.
PUBLISH_BACKOFF_FIRST_SECONDS = 0.5
PUBLISH_BACKOFF_MAX_SECONDS = 30.0
# What the occurrences of an envelope whose tenant no longer exists are canceled with.
ORPHAN_REASON = "tenant deleted: its pending work was withdrawn"
# Mapping PostgreSQL's clock onto the monotonic one: a trip this quick is exact enough, else the quickest of a few.
CLOCK_ANCHOR_GOOD_ENOUGH = 0.002
CLOCK_ANCHOR_TRIES = 3
ORPHAN_LOCK_TIMEOUT = "1s"


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


async def reserve(db: psycopg.AsyncConnection, *, owner: str, lead: float) -> tuple[dict[int, Grant], list[int]]:
    """Per due tenant, what it has due and the fires its bucket grants (own short transaction), and the tenants
    that no longer exist (their envelopes are to be withdrawn). Tenants granted nothing have their due envelopes
    marked throttled (another short transaction)."""
    async with db.transaction():
        cursor = await db.execute(quota_sql.RESERVE_FIRES, {"lead": lead, "owner": owner, "strict_queue": STRICT_QUEUE})
        rows = await cursor.fetchall()
    grants = {row[0]: Grant(*row[2:]) for row in rows if not row[1]}
    orphans = [row[0] for row in rows if row[1]]
    starved = [tenant for tenant, grant in grants.items() if grant.granted <= 0]
    if starved:
        async with db.transaction():
            await db.execute(quota_sql.MARK_THROTTLED, {"tenant_ids": starved})
    return grants, orphans


async def withdraw_orphans(db: psycopg.AsyncConnection, tenant_ids: list[int]) -> tuple[int, int]:
    """Withdraw the envelopes of tenants that no longer exist, canceling their unclaimed occurrences with the
    reason; returns (envelopes, occurrences). Envelopes of a deleted tenant are never granted a fire, so left alone
    they would count as due for ever and the relay would never sleep."""
    try:
        async with db.transaction():
            # Its occurrence locks are waited for briefly: a worker holding one is done in milliseconds, and the
            # relay's due work must not stall behind this cleanup; a step that gives up tries again at the next.
            await db.execute(f"SET LOCAL lock_timeout = '{ORPHAN_LOCK_TIMEOUT}'")
            cursor = await db.execute(
                outbox_sql.WITHDRAW_ORPHAN_ENVELOPES, {"tenant_ids": sorted(tenant_ids), "reason": ORPHAN_REASON}
            )
            row = await cursor.fetchone()
            # A reservation that raced the deletion may have written the tenant's bucket row again.
            await db.execute(quota_sql.FORGET_DELETED_TENANTS, {"tenant_ids": sorted(tenant_ids)})
    except psycopg.errors.LockNotAvailable:
        logger.info(
            "envelopes of deleted tenants %s wait for a lock; next step",
            tenant_ids,
            extra={"action": "withdraw_orphans"},
        )
        return 0, 0
    envelopes, occurrences = (row[0], row[1]) if row is not None else (0, 0)
    if envelopes:
        logger.warning(
            "withdrew %d envelopes (%d occurrences canceled) of deleted tenants %s",
            envelopes,
            occurrences,
            tenant_ids,
            extra={"action": "withdraw_orphans"},
        )
    return envelopes, occurrences


def lane_shares(
    grants: dict[int, Grant], *, batch_size: int, flexible_min_share: float, rotation: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Envelopes per tenant for this batch, strict and flexible: weighted fair shares of the batch, each cut to
    about what the tenant's grant covers. Flexible work keeps `flexible_min_share` of the batch when it is due."""
    flexible_due = any(g.flexible_envelopes for g in grants.values())
    floor = math.ceil(batch_size * flexible_min_share) if flexible_due else 0
    strict = fair_shares(
        {t: Demand(g.strict_envelopes, g.weight) for t, g in grants.items() if g.granted > 0},
        batch_size - floor,
        rotation=rotation,
    )
    flexible = fair_shares(
        {t: Demand(g.flexible_envelopes, g.weight) for t, g in grants.items() if g.granted > 0},
        batch_size - sum(strict.values()),
        rotation=rotation,
    )
    for shares in (strict, flexible):
        for tenant, share in shares.items():
            shares[tenant] = min(share, grants[tenant].envelopes_covered)
    return strict, flexible


async def claim(
    db: psycopg.AsyncConnection,
    grants: dict[int, Grant],
    shares: tuple[dict[int, int], dict[int, int]],
    *,
    owner: str,
    lead: float,
    lease: float,
) -> dict[int, StagedEnvelope]:
    """Lease each lane's fair shares to `owner` in one short transaction, and keep per tenant the envelopes its
    grant covers (an envelope is never split: the last one may overdraw the grant). The rest are handed back at
    once (FINISH_CLAIM, unchanged) for a later step."""
    staged: dict[int, StagedEnvelope] = {}
    surplus: list[int] = []
    fires_so_far: dict[int, int] = dict.fromkeys(grants, 0)
    async with db.transaction():
        for lane_rank, (queue, lane) in enumerate(zip(ALL_QUEUES, shares, strict=True)):
            if not lane:
                continue
            tenants = sorted(lane)
            cursor = await db.execute(
                quota_sql.CLAIM_FAIR_SHARES,
                {
                    "tenant_ids": tenants,
                    "shares": [lane[t] for t in tenants],
                    "queue": queue,
                    "lead": lead,
                    "owner": owner,
                    "lease": lease,
                },
            )
            rows = sorted(await cursor.fetchall(), key=lambda r: (r[6], r[5], -r[2], r[0]))
            for envelope_id, queue_name, priority, body, fires, available_at, tenant in rows:
                grant = grants[tenant]
                if fires_so_far[tenant] >= grant.granted:
                    surplus.append(envelope_id)
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
    if surplus:
        await finish(db, {envelope_id: None for envelope_id in surplus}, refused=set(), owner=owner)
    return staged


async def finish(
    db: psycopg.AsyncConnection, stamps: dict[int, datetime | None], *, refused: set[int], owner: str
) -> set[int]:
    """End a claim in one autocommitted statement: stamp each envelope with its confirmation (None: not published),
    back off the `refused` ones, hand the rest back; only rows still leased to `owner`. Returns the ids stamped."""
    if not stamps:
        return set()
    ids = sorted(stamps)
    cursor = await db.execute(
        outbox_sql.FINISH_CLAIM,
        {
            "ids": ids,
            "published_ats": [stamps[i] for i in ids],
            "refused": [i in refused for i in ids],
            "owner": owner,
            "backoff_first": PUBLISH_BACKOFF_FIRST_SECONDS,
            "backoff_max": PUBLISH_BACKOFF_MAX_SECONDS,
        },
    )
    return {envelope_id for envelope_id, stamped in await cursor.fetchall() if stamped}


async def return_tokens(db: psycopg.AsyncConnection, grants: dict[int, Grant], used: dict[int, int]) -> None:
    """Unused tokens back to the buckets. A failure here costs the tenant at most one grant of rate (the bucket
    refills), never a fire, so it is logged and the step goes on."""
    tenants = sorted(tenant for tenant, grant in grants.items() if grant.granted > 0)
    if not tenants:
        return
    try:
        async with db.transaction():
            await db.execute(
                quota_sql.RETURN_TOKENS,
                {
                    "tenant_ids": tenants,
                    "unused": [grants[t].granted - used[t] for t in tenants],
                    "used": [used[t] for t in tenants],
                },
            )
    except psycopg.Error as exc:
        logger.warning("could not return unused tokens: %r", exc, extra={"action": "return_tokens"})


async def clock_anchor(db: psycopg.AsyncConnection) -> tuple[datetime, float]:
    """A PostgreSQL instant and its monotonic reading (the round trip's midpoint; the quickest trip of a few).
    Release instants and confirmation stamps are mapped through it: its error is the SLO metric's error."""
    best: tuple[float, datetime, float] | None = None
    for _ in range(CLOCK_ANCHOR_TRIES):
        sent = time.monotonic()
        row = await (await db.execute(DB_NOW)).fetchone()
        back = time.monotonic()
        assert row is not None
        if best is None or back - sent < best[0]:
            best = (back - sent, row[0], (sent + back) / 2)
        if best[0] <= CLOCK_ANCHOR_GOOD_ENOUGH:
            break
    assert best is not None  # CLOCK_ANCHOR_TRIES >= 1
    return best[1], best[2]
