"""The rules that end or park a delivery at claim, on the locked occurrence row as observed: the misfire policy
(docs/ARCHITECTURE.md rule 12), the overlap policy (rule 8), the tenant's running quota (max_running) and its share
of the worker's pool (dispatch/engine/pool_share.py).

dispatch/engine/claims.py applies them, in the order its docstring gives, to one occurrence or to an envelope's.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings

from core.choices import MisfirePolicy, OverlapPolicy
from dispatch.engine.outcomes import DropReason
from dispatch.models import OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.sql import claims as claim_sql
from dispatch.sql import quotas as quota_sql

# First deliveries: the misfire policy may still end them. Parked queue_one occurrences (retry_wait, attempt 0)
# were judged when they were first delivered; what delays them since is the overlap policy, not an outage.
FIRST_DELIVERY_STATES = (OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED)


@dataclass(frozen=True)
class Drop:
    """A delivery that was not run, and why; `state` is the occurrence's state afterwards (None if unknown)."""

    reason: DropReason
    state: str | None


class Observed(NamedTuple):
    """The locked occurrence row, its schedule now, and its own version's definition (dispatch/sql/claims.py).

    A named tuple: the batched claim makes one per occurrence, and as a frozen dataclass each of its 23 fields was
    set through object.__setattr__ (~4 % of the worker's Python time at 2,315 fires a second, sampled)."""

    state: str
    attempt_count: int
    lease_expires_at: datetime | None
    available_at: datetime
    occurrence_version: int
    tenant_id: int
    lane: str
    priority: int
    manual: bool
    forced: bool
    kept: bool
    throttled: bool
    schedule_id: uuid.UUID
    schedule_state: str
    schedule_version: int
    overlap_policy: str
    handler: str
    payload: Any
    max_attempts: int
    misfire_policy: str
    max_lateness_seconds: int
    catchup_limit: int
    retry_base_seconds: int | None
    retry_cap_seconds: int | None
    now: datetime


Move = Callable[..., Drop]


def wait_for_running_slot(cursor, key: dict[str, Any], o: Observed, move: Move) -> Drop:
    """The tenant runs max_running occurrences already: back to retry_wait with its envelope, attempts untouched.

    The wait before it is offered again grows with how long it has waited (`recheck_delay`): a backlog far over
    the quota costs the workers a few offers per occurrence, not one per second each.
    """
    cursor.execute(quota_sql.COUNT_THROTTLED_CLAIM, {"tenant_id": o.tenant_id})
    recheck_at = o.now + timedelta(seconds=recheck_delay((o.now - key["scheduled_for"]).total_seconds()))
    words = "throttled: the tenant's max_running quota is reached"
    drop = move(OccurrenceState.RETRY_WAIT, DropReason.RUNNING_QUOTA, words, recheck_at)
    if drop.state == OccurrenceState.RETRY_WAIT:
        fire = Fire.for_lane(**key, tenant_id=o.tenant_id, lane=o.lane, available_at=recheck_at, priority=o.priority)
        enqueue(cursor, [fire])
    return drop


def wait_for_pool_share(cursor, rows: list[tuple[dict[str, Any], Observed]], why: str) -> set[uuid.UUID]:
    """The tenant's share of this worker's pool (or the whole pool) is held by slow handlers: the rows go back to
    retry_wait, attempts untouched, to be offered again after `recheck_delay` with one envelope for them all (an
    envelope's rows share their tenant and lane), as a claim over max_running waits. Returns the ids parked."""
    now = rows[0][1].now
    oldest = min(key["scheduled_for"] for key, _ in rows)
    cursor.execute(
        claim_sql.PARK_MANY,
        {
            "occurrence_ids": [key["occurrence_id"] for key, _ in rows],
            "scheduled_fors": [key["scheduled_for"] for key, _ in rows],
            "states": [o.state for _, o in rows],
            "attempt_counts": [o.attempt_count for _, o in rows],
            "available_at": now + timedelta(seconds=recheck_delay((now - oldest).total_seconds())),
            "reason": f"waiting for the worker pool: {why}",
        },
    )
    parked = cursor.fetchall()
    enqueue(
        cursor,
        [
            Fire.for_lane(occurrence_id, scheduled_for, tenant_id=tenant_id, lane=lane, available_at=at, priority=p)
            for occurrence_id, scheduled_for, tenant_id, lane, p, at in parked
        ],
    )
    return {row[0] for row in parked}


def recheck_delay(waited_seconds: float) -> float:
    """How long work that waits for room to run (the tenant's max_running, or its share of a worker's pool) waits
    before it is offered again: a quarter of its wait so far, from SCHEDULER_RUNNING_RECHECK_SECONDS up to
    SCHEDULER_RUNNING_RECHECK_MAX_SECONDS, jittered so parked work does not come back in step."""
    base = settings.SCHEDULER_RUNNING_RECHECK_SECONDS
    delay = min(settings.SCHEDULER_RUNNING_RECHECK_MAX_SECONDS, max(base, max(0.0, waited_seconds) / 4))
    return delay * random.uniform(0.75, 1.25)


def misfire_reason(cursor, key: dict[str, Any], o: Observed) -> str | None:
    """Why a first delivery later than its version's max lateness is missed (the reason in words), or None if it
    may run. Retries, manual triggers and forced fires are exempt: someone asked for them after the fact."""
    if o.state not in FIRST_DELIVERY_STATES or o.attempt_count > 0 or o.manual or o.forced or o.throttled:
        return None
    # Lateness counts from the release instant: the nominal fire time on the strict lane, the place in the spread
    # window on the flexible lane, the paced slot of a catch-up fire (already judged late when it was planned, and
    # held back on purpose by the tenant's catch-up budget). A throttled fire (max_fires_per_second) waited for
    # its tenant's own quota: it waits, it is never dropped for it.
    due = o.available_at
    lateness = (o.now - due).total_seconds()
    # The pipeline's own latency (relay, broker, a worker's prefetch) is not an outage: without this grace a
    # schedule with max_lateness_seconds = 0 would never run, since no claim happens at the very instant.
    tolerated = o.max_lateness_seconds + settings.SCHEDULER_CLAIM_LATENESS_GRACE_SECONDS
    if lateness <= tolerated:
        return None
    words = f"late by {int(lateness)} s > max lateness {o.max_lateness_seconds} s"
    siblings = {**key, "schedule_id": o.schedule_id, "now": o.now}
    if o.misfire_policy == MisfirePolicy.FIRE_ONCE:
        cursor.execute(claim_sql.NEWER_DUE_FIRE, siblings)
        newer = cursor.fetchone()
        if newer is None:
            return None  # the latest late fire: the one fire_once emits
        return f"{words} (fire_once keeps only the latest late fire; a newer one at {utc_text(newer[0])} is due)"
    if o.misfire_policy == MisfirePolicy.CATCH_UP:
        keeps = f"catch_up keeps the latest {o.catchup_limit} late fires"
        if o.catchup_limit <= 0:
            return f"{words} ({keeps})"
        late_before = o.now - timedelta(seconds=tolerated)
        cursor.execute(claim_sql.NEWER_LATE_FIRES, {**siblings, "late_before": late_before, "limit": o.catchup_limit})
        if cursor.fetchone()[0] < o.catchup_limit:
            return None  # among the latest `catchup_limit` late fires
        return f"{words} ({keeps}; at least {o.catchup_limit} newer ones exist)"
    return f"{words} ({o.misfire_policy})"


def overlap_verdict(cursor, key: dict[str, Any], o: Observed, move: Move) -> Drop | None:
    """The overlap policy; None lets the claim go ahead.

    A retry (attempt_count > 0) is not a new fire: it is never skipped, only parked until the sibling running
    meanwhile is done. For first attempts, skip_if_running skips while a sibling runs; queue_one holds one
    occurrence behind a running sibling and skips the rest, and a newer fire never overtakes the held one (FIFO),
    even when nothing runs at that instant.
    """
    siblings = {**key, "schedule_id": o.schedule_id, "now": o.now}
    cursor.execute(claim_sql.SIBLING_RUNNING, siblings)
    row = cursor.fetchone()
    running = row[0] if row else None
    policy = o.overlap_policy
    if o.attempt_count > 0:
        return None if running is None else park(cursor, key, o, move, f"waiting for occurrence {running}")
    if policy == OverlapPolicy.SKIP_IF_RUNNING:
        if running is None:
            return None
        return move(
            OccurrenceState.SKIPPED_OVERLAP,
            DropReason.OVERLAP_SKIPPED,
            f"overlap: occurrence {running} still running ({policy})",
        )
    cursor.execute(claim_sql.SIBLING_WAITING, siblings)
    held = cursor.fetchone()
    if held is not None and (held[1], held[0]) < (key["scheduled_for"], key["occurrence_id"]):
        words = f"overlap: occurrence {held[0]} is queued ahead ({policy})"
        return move(OccurrenceState.SKIPPED_OVERLAP, DropReason.OVERLAP_SKIPPED, words)
    if running is None:
        return None
    if held is not None:
        # queue_one holds at most one pending occurrence; the one already waiting will run.
        words = f"overlap: occurrence {running} still running and occurrence {held[0]} already queued ({policy})"
        return move(OccurrenceState.SKIPPED_OVERLAP, DropReason.OVERLAP_SKIPPED, words)
    return park(cursor, key, o, move, f"waiting for occurrence {running}")


def park(cursor, key: dict[str, Any], o: Observed, move: Move, why: str) -> Drop:
    """Back to retry_wait (attempt_count unchanged) with a new envelope for the recheck, in the same transaction."""
    recheck_at = o.now + timedelta(seconds=settings.SCHEDULER_OVERLAP_RECHECK_SECONDS)
    drop = move(
        OccurrenceState.RETRY_WAIT, DropReason.OVERLAP_WAITING, f"overlap: {why} ({o.overlap_policy})", recheck_at
    )
    if drop.state == OccurrenceState.RETRY_WAIT:
        fire = Fire.for_lane(**key, tenant_id=o.tenant_id, lane=o.lane, available_at=recheck_at, priority=o.priority)
        enqueue(cursor, [fire])
    return drop


def utc_text(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
