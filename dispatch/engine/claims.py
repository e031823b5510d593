"""The claim decision: whether a delivered occurrence runs now and, if it does not, what becomes of it and why.

`try_claim` locks the occurrence (and, for overlap policies other than allow, its schedule first), then decides in
this order, holding those locks:
1. drop what is not claimable: unknown, terminal, a duplicate of a live attempt, a retry delivered early;
2. cancel what the schedule withdrew (canceled, or a newer version for an occurrence that is not forced);
3. end a retry that may not run: attempts exhausted (over an expired lease), or the occurrence deadline passed;
4. apply the misfire policy to a first delivery later than its version's max lateness (docs/ARCHITECTURE.md
   rule 12);
5. apply the overlap policy (rule 8): skip, or park in retry_wait until the running sibling is done;
6. take a running slot of the tenant's max_running; at the quota, park it in retry_wait (attempts untouched, never
   dead for it) to be offered again after a backoff that grows with its wait;
7. otherwise move it to running with generation = attempt_count + 1 and a lease, and record the attempt.
Every exit that is not a claim records the rule that decided it in `state_reason`. The rules of steps 4-6 are in
dispatch/engine/claim_rules.py.

`claim_many` takes the same decisions for an envelope's occurrences in one transaction: one statement locks them all,
one takes the tenant's running slots, one claims and one inserts the attempts, so a hundred occurrences cost about
what one did. It leaves to `try_claim` what needs another lock order (overlap policies other than allow lock the
schedule first) or another transaction's row.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core.choices import OverlapPolicy, ScheduleState
from dispatch import counters
from dispatch.engine.claim_rules import (
    Drop,
    Move,
    Observed,
    misfire_reason,
    overlap_verdict,
    wait_for_pool_share,
    wait_for_running_slot,
)
from dispatch.engine.outcomes import DropReason
from dispatch.engine.retry import attempts_of, deadline_of
from dispatch.models import TERMINAL_STATES, OccurrenceState
from dispatch.quotas import lock_running_rows, release_running_slots
from dispatch.sql import PreparedCursor
from dispatch.sql import claims as claim_sql
from dispatch.sql import quotas as quota_sql

logger = logging.getLogger(__name__)

# A retry envelope released by the relay a moment before its available_at (its timer runs on another clock) must
# not be mistaken for an early duplicate and dropped: that would strand the occurrence in retry_wait.
EARLY_TOLERANCE = timedelta(seconds=1)


@dataclass(frozen=True)
class Claim:
    """A running attempt this worker owns while `generation` is the occurrence's attempt_count."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    tenant_id: int
    schedule_id: uuid.UUID
    schedule_version: int
    generation: int
    attempt_id: int
    worker: str
    handler: str
    payload: dict[str, Any]
    max_attempts: int
    lane: str
    priority: int
    claimed_at: datetime
    lease_expires_at: datetime
    overlap_policy: str = OverlapPolicy.ALLOW
    forced: bool = False
    # The schedule's retry policy (its version's); None: the platform's settings.
    retry_base_seconds: int | None = None
    retry_cap_seconds: int | None = None
    # A first attempt's claim - release instant (None: not counted, as for retries, forced and manual fires).
    start_lag: float | None = None

    @property
    def key(self) -> dict[str, Any]:
        return {"occurrence_id": self.occurrence_id, "scheduled_for": self.scheduled_for}


def try_claim(
    occurrence_id: uuid.UUID, scheduled_for: datetime, worker_name: str, now: datetime | None = None
) -> Claim | Drop:
    """Claim one occurrence for `worker_name`, or tell why the delivery must not run now (logged and counted)."""
    key: dict[str, Any] = {"occurrence_id": occurrence_id, "scheduled_for": scheduled_for}
    outcome: Claim | Drop = Drop(DropReason.UNKNOWN, None)
    schedule_id = None  # known, and locked first, only once an overlap policy asks for it
    for _ in range(2):
        with transaction.atomic(), connection.cursor() as cursor:
            if schedule_id is not None:
                cursor.execute(claim_sql.LOCK_SCHEDULE, {"schedule_id": schedule_id})
            cursor.execute(claim_sql.LOCK_OCCURRENCE, {**key, "now": now})
            locked = cursor.fetchone()
            if locked is None:
                break
            observed = Observed(*locked)
            if observed.overlap_policy != OverlapPolicy.ALLOW and schedule_id is None:
                # Lock order is schedule, then occurrence (as in the control plane): let go of the occurrence and
                # decide again holding both. Schedules with overlap `allow` (most) never pay this second round.
                schedule_id = observed.schedule_id
                continue
            outcome = _decide(cursor, key, observed, worker_name)
            if observed.state == OccurrenceState.RUNNING and _left_running(outcome):
                # The expired run's slot goes back with the transaction that ended it (its last statement).
                release_running_slots(cursor, [observed.tenant_id])
        break
    _report_claim(occurrence_id, outcome)
    return outcome


@dataclass
class EnvelopeClaim:
    """What the batched claim of an envelope came to: the claims to run, the deliveries dropped (with why), and the
    occurrences it left to be decided one by one (`try_claim`): overlap policies other than allow (their lock order
    starts at the schedule row), or everything after a contradicting history."""

    claims: list[Claim] = field(default_factory=list)
    drops: list[tuple[uuid.UUID, Drop]] = field(default_factory=list)
    alone: list[tuple[uuid.UUID, datetime]] = field(default_factory=list)
    tenant_id: int | None = None  # the envelope's tenant, as its rows say (None when no row could be read)
    # When the claim read the rows it decided on (monotonic): the schedule's state and version it checked then are
    # the pre-check of handlers that start soon after (docs/ARCHITECTURE.md rule 5).
    checked_at: float = 0.0


def claim_many(
    pairs: list[tuple[uuid.UUID, datetime]],
    worker_name: str,
    now: datetime | None = None,
    *,
    blocked: Callable[[int], str | None] | None = None,
) -> EnvelopeClaim:
    """Claim an envelope's occurrences in one transaction and a handful of statements, deciding each exactly as
    `try_claim` would (the same steps, the same rules), so a hundred occurrences cost what one used to.

    1. Lock every occurrence of the envelope in one statement, in primary-key order, waiting for a held row.
    2. Decide each locked row's exits (steps 1-5): drops and side exits, one statement each only where they happen.
    3. Where `blocked(tenant)` says why none of the tenant's handlers could start on this worker soon (its share of
       the pool is held by slow handlers), park the rest in one statement instead of claiming them.
    4. Take the tenant's running slots for the rest in one statement; those over the quota are parked.
    5. Move them to running and insert their attempts, one statement each for all.
    The claims' start lag and claim count are left to the caller, which counts a claim once its handler starts
    (`count_started`): a claim handed back unstarted is claimed again later, and counted then.
    """
    result = EnvelopeClaim()
    if not pairs:
        return result
    params: dict[str, Any] = {
        "occurrence_ids": [p[0] for p in pairs],
        "scheduled_fors": [p[1] for p in pairs],
        "now": now,
    }
    with transaction.atomic(), PreparedCursor() as cursor:
        result.checked_at = time.monotonic()
        cursor.execute(claim_sql.LOCK_OCCURRENCES, params)
        locked = {row[0]: Observed(*row[1:]) for row in cursor.fetchall()}
        candidates: list[tuple[dict[str, Any], Observed]] = []
        left_running: list[int] = []
        waiting: dict[int, list[tuple[dict[str, Any], Observed]]] = {}
        why_blocked: dict[int, str | None] = {}
        for position, (occurrence_id, scheduled_for) in enumerate(pairs, start=1):
            o = locked.get(position)
            if o is not None and result.tenant_id is None:
                result.tenant_id = o.tenant_id
            if o is None:
                result.drops.append((occurrence_id, Drop(DropReason.UNKNOWN, None)))
                continue
            if o.overlap_policy != OverlapPolicy.ALLOW:
                result.alone.append((occurrence_id, scheduled_for))
                continue
            key = {"occurrence_id": occurrence_id, "scheduled_for": scheduled_for}
            verdict = _exit(cursor, key, o)
            if verdict is None:
                if blocked is not None and o.state != OccurrenceState.RUNNING:  # a takeover keeps its dead run's slot
                    if o.tenant_id not in why_blocked:
                        why_blocked[o.tenant_id] = blocked(o.tenant_id)
                    if why_blocked[o.tenant_id] is not None:
                        waiting.setdefault(o.tenant_id, []).append((key, o))
                        continue
                candidates.append((key, o))
                continue
            result.drops.append((occurrence_id, verdict))
            if o.state == OccurrenceState.RUNNING and _left_running(verdict):
                left_running.append(o.tenant_id)
        for tenant_id, rows in sorted(waiting.items()):
            parked = wait_for_pool_share(cursor, rows, why_blocked[tenant_id] or "")
            result.drops += [
                (key["occurrence_id"], Drop(DropReason.POOL_SHARE, OccurrenceState.RETRY_WAIT)) for key, _ in rows
            ]
            if len(parked) != len(rows):  # cannot happen under the row locks; refuse rather than guess
                transaction.set_rollback(True)
                return EnvelopeClaim(alone=list(pairs), tenant_id=result.tenant_id)
        claimed = _claim_many(cursor, candidates, worker_name)
        if claimed is None:
            # An attempt of a claimed generation exists already (attempt_generation_unique): history contradicts
            # the claim. Undo the whole batch and let each occurrence be decided alone, as the one-by-one path does.
            transaction.set_rollback(True)
            return EnvelopeClaim(alone=list(pairs), tenant_id=result.tenant_id)
        # The tenants' counter rows last (the expired runs' slots back, then this batch's): they are held only to
        # the commit, not while the claims above are written (see dispatch/sql/quotas.py).
        if left_running:
            lock_running_rows(cursor, left_running + [entry[1].tenant_id for entry in claimed])
        release_running_slots(cursor, left_running)
        result.claims = _within_running_quota(cursor, claimed, result, worker_name)
    for occurrence_id, drop in result.drops:
        if drop.reason != DropReason.POOL_SHARE:
            _report_claim(occurrence_id, drop)
    for tenant_id, rows in waiting.items():
        # One line for the envelope, not one per occurrence: a tenant whose handlers hang sends many.
        counters.WORKER_CLAIM_DROPS.labels(DropReason.POOL_SHARE).inc(len(rows))
        logger.info(
            "parked %d occurrences of tenant %s: %s",
            len(rows),
            tenant_id,
            why_blocked[tenant_id],
            extra={"action": "claim_drop", "reason": DropReason.POOL_SHARE, "tenant_id": tenant_id},
        )
    return result


def count_started(claim: Claim) -> None:
    """Count a batched claim once its handler starts (or its pre-check ends it): claimed, and its start lag."""
    counters.WORKER_CLAIMS.inc()
    if claim.start_lag is not None:
        counters.START_LAG.labels(claim.lane).observe(claim.start_lag)


# A claimed row of the batch before the running quota had its say: the row as observed, and what the claim gave it.
_Claimed = tuple[dict[str, Any], Observed, int, datetime, int]  # key, observed, generation, lease end, attempt id


def _claim_many(cursor, candidates: list[tuple[dict[str, Any], Observed]], worker_name: str) -> list[_Claimed] | None:
    """Step 7 for many: running, generation + 1, a lease and an attempt each; None if an attempt conflicts."""
    if not candidates:
        return []
    now = candidates[0][1].now
    keys = {
        "occurrence_ids": [key["occurrence_id"] for key, _ in candidates],
        "scheduled_fors": [key["scheduled_for"] for key, _ in candidates],
    }
    cursor.execute(
        claim_sql.CLAIM_MANY,
        {
            **keys,
            "states": [o.state for _, o in candidates],
            "attempt_counts": [o.attempt_count for _, o in candidates],
            "now": now,
            "lease": settings.SCHEDULER_WORKER_LEASE_SECONDS,
        },
    )
    moved = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
    if len(moved) != len(candidates):  # cannot happen under the row locks; decide each alone rather than guess
        return None
    cursor.execute(
        claim_sql.INSERT_ATTEMPTS,
        {
            **keys,
            "generations": [moved[key["occurrence_id"]][0] for key, _ in candidates],
            "lease_expires_ats": [moved[key["occurrence_id"]][1] for key, _ in candidates],
            "worker": worker_name[:200],
            "now": now,
        },
    )
    attempts = dict(cursor.fetchall())
    if len(attempts) != len(candidates):
        return None
    return [(key, o, *moved[key["occurrence_id"]], attempts[key["occurrence_id"]]) for key, o in candidates]


def _within_running_quota(cursor, claimed: list[_Claimed], result: EnvelopeClaim, worker_name: str) -> list[Claim]:
    """Step 6 for many, after the claims: one grant of running slots per tenant for all its new claims (a takeover
    of an expired run inherits its slot). Claims beyond the grant are put back as they were observed, attempt and
    all, in this same transaction (nobody saw them), and parked as `try_claim` parks a claim over the quota."""
    kept = [c for c in claimed if c[1].state == OccurrenceState.RUNNING]
    by_tenant: dict[int, list[_Claimed]] = {}
    for entry in claimed:
        if entry[1].state != OccurrenceState.RUNNING:
            by_tenant.setdefault(entry[1].tenant_id, []).append(entry)
    excess: list[_Claimed] = []
    tenants = sorted(by_tenant)  # tenants' counter rows in tenant_id order (dispatch/sql/quotas.py)
    grants: dict[int, int] = {}
    if tenants:
        cursor.execute(
            quota_sql.TAKE_RUNNING_SLOTS_MANY,
            {"tenant_ids": tenants, "wanted": [len(by_tenant[tenant_id]) for tenant_id in tenants]},
        )
        grants = dict(cursor.fetchall())
    for tenant_id in tenants:
        wanting = by_tenant[tenant_id]
        granted = grants.get(tenant_id, 0)
        kept += wanting[:granted]
        excess += wanting[granted:]
    if excess:
        cursor.execute(
            claim_sql.UNCLAIM_MANY,
            {
                "occurrence_ids": [key["occurrence_id"] for key, *_ in excess],
                "scheduled_fors": [key["scheduled_for"] for key, *_ in excess],
                "states": [o.state for _, o, *_ in excess],
                "attempt_counts": [o.attempt_count for _, o, *_ in excess],
                "lease_expires_ats": [o.lease_expires_at for _, o, *_ in excess],
                "held_states": [OccurrenceState.RUNNING.value] * len(excess),
            },
        )
        for key, o, *_ in excess:
            result.drops.append((key["occurrence_id"], wait_for_running_slot(cursor, key, o, _mover(cursor, key, o))))
    return [
        _claim_of(key, o, worker_name, generation=generation, attempt_id=attempt_id, lease_expires_at=lease_end)
        for key, o, generation, lease_end, attempt_id in kept
    ]


def _left_running(outcome: Claim | Drop) -> bool:
    """Whether a decision on an occurrence found `running` (an expired lease) moved it out of running."""
    if not isinstance(outcome, Drop) or outcome.state in (None, OccurrenceState.RUNNING):
        return False
    return outcome.reason not in (DropReason.DUPLICATE, DropReason.DUPLICATE_ATTEMPT, DropReason.LOST_RACE)


def schedule_withdraws(schedule_state: str, schedule_version: int, occurrence_version: int, *, forced: bool) -> bool:
    """Rule 5's re-check: a canceled schedule withdraws every occurrence; a newer version withdraws those of older
    versions, except forced ones (backfill, replay), which an operator asked for explicitly."""
    if schedule_state == ScheduleState.CANCELED:
        return True
    return schedule_version != occurrence_version and not forced


def withdrawal_reason(schedule_state: str, schedule_version: int) -> str:
    if schedule_state == ScheduleState.CANCELED:
        return "schedule canceled"
    return f"schedule changed to version {schedule_version}"


def _decide(cursor, key: dict[str, Any], o: Observed, worker_name: str) -> Claim | Drop:
    """The claim decision (steps 1-7 of the module docstring), holding the occurrence row lock (and the schedule
    row for overlap policies)."""
    verdict = _exit(cursor, key, o)
    if verdict is not None:
        return verdict
    if o.state != OccurrenceState.RUNNING:  # a takeover inherits the dead run's slot
        cursor.execute(quota_sql.TAKE_RUNNING_SLOT, {"tenant_id": o.tenant_id})
        if cursor.fetchone() is None:
            return wait_for_running_slot(cursor, key, o, _mover(cursor, key, o))
    return _claim(cursor, key, o, worker_name)


def _mover(cursor, key: dict[str, Any], o: Observed) -> Move:
    """A side exit or parking of the locked occurrence: one conditional UPDATE on what was observed."""

    def move(new_state: str, reason: DropReason, words: str, available_at: datetime | None = None) -> Drop:
        params = {**key, "now": o.now, "new_state": new_state, "available_at": available_at, "reason": words}
        cursor.execute(claim_sql.TRANSITION, {**params, "state": o.state, "attempt_count": o.attempt_count})
        if cursor.rowcount != 1:  # cannot happen under the row lock; refuse rather than guess
            return Drop(DropReason.LOST_RACE, None)
        return Drop(reason, new_state)

    return move


def _exit(cursor, key: dict[str, Any], o: Observed) -> Drop | None:
    """Steps 1-5 of the module docstring: why the delivery must not run now, or None when only the running quota
    stands between it and a claim."""
    now = o.now
    if o.state in TERMINAL_STATES:
        return Drop(DropReason.TERMINAL, o.state)
    expired_run = o.state == OccurrenceState.RUNNING
    if expired_run and o.lease_expires_at is not None and o.lease_expires_at > now:
        return Drop(DropReason.DUPLICATE, o.state)
    if o.state == OccurrenceState.RETRY_WAIT and o.available_at > now + EARLY_TOLERANCE:
        return Drop(DropReason.EARLY, o.state)
    if expired_run:
        # Its worker died without the reaper noticing yet; close that attempt before taking over.
        cursor.execute(claim_sql.CLOSE_EXPIRED_ATTEMPT, {**key, "now": now, "generation": o.attempt_count})
    move = _mover(cursor, key, o)
    if schedule_withdraws(o.schedule_state, o.schedule_version, o.occurrence_version, forced=o.forced or o.kept):
        return move(
            OccurrenceState.CANCELED,
            DropReason.SCHEDULE_CHANGED,
            withdrawal_reason(o.schedule_state, o.schedule_version),
        )
    if expired_run and o.attempt_count >= o.max_attempts:
        words = f"attempts exhausted ({attempts_of(o.attempt_count, o.max_attempts)})"
        return move(OccurrenceState.DEAD, DropReason.ATTEMPTS_EXHAUSTED, words)
    if o.attempt_count > 0:
        deadline = deadline_of(key["scheduled_for"], forced=o.forced)
        if deadline is not None and now > deadline:
            return move(OccurrenceState.DEAD, DropReason.DEADLINE_PASSED, "deadline passed")
    missed = misfire_reason(cursor, key, o)
    if missed is not None:
        return move(OccurrenceState.MISSED, DropReason.MISSED, missed)
    if o.overlap_policy != OverlapPolicy.ALLOW:
        return overlap_verdict(cursor, key, o, move)
    return None


def _claim(cursor, key: dict[str, Any], o: Observed, worker_name: str) -> Claim | Drop:
    lease = settings.SCHEDULER_WORKER_LEASE_SECONDS
    cursor.execute(
        claim_sql.CLAIM, {**key, "now": o.now, "lease": lease, "state": o.state, "attempt_count": o.attempt_count}
    )
    claimed = cursor.fetchone()
    if claimed is None:
        return Drop(DropReason.LOST_RACE, None)
    generation, lease_expires_at = claimed
    cursor.execute(
        claim_sql.INSERT_ATTEMPT,
        {
            **key,
            "generation": generation,
            "worker": worker_name[:200],
            "now": o.now,
            "lease_expires_at": lease_expires_at,
        },
    )
    attempt = cursor.fetchone()
    if attempt is None:
        # An attempt of this generation exists already (attempt_generation_unique): undo the claim, run nothing.
        transaction.set_rollback(True)
        return Drop(DropReason.DUPLICATE_ATTEMPT, o.state)
    return _claim_of(
        key, o, worker_name, generation=generation, attempt_id=attempt[0], lease_expires_at=lease_expires_at
    )


def _claim_of(
    key: dict[str, Any], o: Observed, worker_name: str, *, generation: int, attempt_id: int, lease_expires_at: datetime
) -> Claim:
    """The Claim of an occurrence just moved to running, with its start lag if it is a first attempt."""
    payload = json.loads(o.payload) if isinstance(o.payload, str | bytes) else (o.payload or {})
    start_lag = None
    if generation == 1 and not (o.forced or o.manual):
        start_lag = max(0.0, (o.now - o.available_at).total_seconds())
    return Claim(
        occurrence_id=key["occurrence_id"],
        scheduled_for=key["scheduled_for"],
        tenant_id=o.tenant_id,
        schedule_id=o.schedule_id,
        schedule_version=o.occurrence_version,
        generation=generation,
        attempt_id=attempt_id,
        worker=worker_name,
        handler=o.handler,
        payload=payload,
        max_attempts=o.max_attempts,
        lane=o.lane,
        priority=o.priority,
        claimed_at=o.now,
        lease_expires_at=lease_expires_at,
        overlap_policy=o.overlap_policy,
        forced=o.forced,
        retry_base_seconds=o.retry_base_seconds,
        retry_cap_seconds=o.retry_cap_seconds,
        start_lag=start_lag,
    )


def _report_claim(occurrence_id: uuid.UUID, outcome: Claim | Drop) -> None:
    if isinstance(outcome, Claim):
        count_started(outcome)  # one by one, the handler starts right after the claim
        logger.debug(
            "claimed occurrence %s generation %d (%s)",
            occurrence_id,
            outcome.generation,
            outcome.handler,
            extra={"action": "claim", "occurrence_id": str(occurrence_id)},
        )
        return
    counters.WORKER_CLAIM_DROPS.labels(outcome.reason).inc()
    if outcome.reason == DropReason.MISSED:
        counters.MISSED.labels("claim").inc()
    elif outcome.reason == DropReason.OVERLAP_SKIPPED:
        counters.SKIPPED_OVERLAP.inc()
    # Duplicates, overlap skips and misfires are expected in an at-least-once system; a vanished id or a
    # contradicting attempt history is worth a warning.
    level = logging.WARNING if outcome.reason.is_suspicious else logging.INFO
    logger.log(
        level,
        "dropped delivery of occurrence %s: %s (state %s)",
        occurrence_id,
        outcome.reason,
        outcome.state,
        extra={"action": "claim_drop", "reason": outcome.reason, "occurrence_id": str(occurrence_id)},
    )
