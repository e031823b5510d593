"""Tenant quotas of the data plane, the decisions in one place (the statements are in dispatch/sql/quotas.py).

- Weighted fair shares: how many envelopes of a relay batch each tenant gets (weighted water-filling, so a tenant
  that needs less than its share leaves the rest to the others), and the order they leave in (weighted fair
  queueing by fires: a small tenant's envelopes go out among the first of a big tenant's, not after them).
- max_fires_per_second: see dispatch/engine/relay.py (the bucket is reserved before a claim, refunded after).
- max_running: see dispatch/engine/claims.py (a slot is taken with the claim, given back with every exit).
- max_catchup_per_minute: `catch_up_release_times` paces catch-up fires on one budget per tenant and minute.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models.expressions import RawSQL

from dispatch.planning import DueSchedule, PlannedOccurrence
from dispatch.sql import quotas as quota_sql

CATCHUP_WINDOW = timedelta(minutes=1)


@dataclass(frozen=True)
class Demand:
    """What one tenant has due in a relay step: envelopes (of one lane) and its fairness weight."""

    envelopes: int
    weight: int


def fair_shares(demands: Mapping[int, Demand], capacity: int, *, rotation: int = 0) -> dict[int, int]:
    """Envelopes per tenant for a batch of `capacity`: proportional to weight, never more than a tenant has due,
    what one leaves unused going to the others (water-filling). With more tenants than capacity, `capacity` of
    them get one each, starting at `rotation` in tenant order, so every tenant is served within a few batches."""
    wanting = {tenant: d for tenant, d in demands.items() if d.envelopes > 0}
    if capacity <= 0 or not wanting:
        return {}
    if len(wanting) >= capacity:
        order = sorted(wanting)
        start = rotation % len(order)
        return {tenant: 1 for tenant in (order[start:] + order[:start])[:capacity]}
    shares: dict[int, int] = {}
    left = capacity
    while wanting:
        total_weight = sum(max(1, d.weight) for d in wanting.values())
        satisfied = {
            tenant: d.envelopes
            for tenant, d in wanting.items()
            if d.envelopes <= left * max(1, d.weight) / total_weight
        }
        if not satisfied:
            split = {t: max(1, math.floor(left * max(1, d.weight) / total_weight)) for t, d in wanting.items()}
            # Everyone gets at least one envelope; what that costs over the batch comes off the largest shares.
            excess = sum(split.values()) - left
            while excess > 0:
                largest = max(split, key=lambda t: split[t])
                if split[largest] <= 1:
                    break
                split[largest] -= 1
                excess -= 1
            shares.update(split)
            break
        for tenant, envelopes in satisfied.items():
            shares[tenant] = envelopes
            left -= envelopes
            del wanting[tenant]
    return shares


def virtual_finish(fires_so_far: int, weight: int) -> float:
    """Weighted fair queueing's finish tag of an envelope: its tenant's fires up to and including it, over the
    tenant's weight. Releasing in tag order interleaves tenants in proportion to their weights."""
    return fires_so_far / max(1, weight)


def lock_running_rows(cursor, tenant_ids: list[int]) -> None:
    """Lock the running counts of `tenant_ids` in tenant_id order, for a transaction about to give back some tenants'
    slots and take others' (dispatch/sql/quotas.py LOCK_RUNNING_ROWS)."""
    cursor.execute(quota_sql.LOCK_RUNNING_ROWS, {"tenant_ids": sorted(set(tenant_ids))})


def release_running_slots(cursor, tenant_ids: list[int]) -> None:
    """Give back one running slot per entry of `tenant_ids` (a tenant may repeat), in the caller's transaction that
    moved those occurrences out of running; call it as that transaction's last statement (see dispatch/sql/quotas)."""
    if not tenant_ids:
        return
    slots = Counter(tenant_ids)
    tenants = sorted(slots)
    cursor.execute(quota_sql.RELEASE_RUNNING_SLOTS, {"tenant_ids": tenants, "slots": [slots[t] for t in tenants]})


def pace_planned(cursor, planned: list[tuple[DueSchedule, list[PlannedOccurrence]]], *, now: datetime) -> int:
    """Give the catch-up fires among `planned` their release instants on their tenants' budgets, in place (oldest
    fire first); returns how many were paced. The writers call it in the transaction that stores the fires."""
    slots = sorted(
        (
            (schedule, occurrences, index)
            for schedule, occurrences in planned
            for index, o in enumerate(occurrences)
            if o.catch_up
        ),
        key=lambda slot: slot[1][slot[2]].scheduled_for,
    )
    if not slots:
        return 0
    times = pace_catch_up(
        cursor, [(schedule.tenant_id, schedule.catchup_per_minute) for schedule, _, _ in slots], now=now
    )
    for (_, occurrences, index), at in zip(slots, times, strict=True):
        occurrences[index] = dataclasses.replace(occurrences[index], available_at=at)
    return len(slots)


def pace_catch_up(cursor, fires: list[tuple[int, int]], *, now: datetime) -> list[datetime]:
    """Release instants for catch-up fires given as (tenant_id, tenant's max_catchup_per_minute), in their order:
    each tenant's fires take its budget in the order given (the earliest fire first), tenants in tenant_id order."""
    by_tenant: dict[int, list[int]] = {}
    per_minute: dict[int, int] = {}
    for index, (tenant_id, rate) in enumerate(fires):
        by_tenant.setdefault(tenant_id, []).append(index)
        per_minute[tenant_id] = rate
    times: list[datetime] = [now] * len(fires)
    for tenant_id in sorted(by_tenant):
        indexes = by_tenant[tenant_id]
        paced = catch_up_release_times(
            cursor, tenant_id=tenant_id, per_minute=per_minute[tenant_id], count=len(indexes), now=now
        )
        for index, at in zip(indexes, paced, strict=True):
            times[index] = at
    return times


def catch_up_release_times(cursor, *, tenant_id: int, per_minute: int, count: int, now: datetime) -> list[datetime]:
    """Release instants for `count` catch-up fires of one tenant, on its one budget of `per_minute` shared by every
    schedule, batch, materializer and backfill: the current minute's room first, then the following minutes, the
    n-th slot of a minute n/per_minute of the way into it (never before `now`). 0 = unpaced (all at `now`).

    Runs in the caller's transaction, which keeps the minute rows locked to its commit; callers with several
    tenants call it in tenant_id order.
    """
    if count <= 0:
        return []
    if per_minute <= 0:
        return [now] * count
    window = now.replace(second=0, microsecond=0)
    times: list[datetime] = []
    while len(times) < count:
        cursor.execute(quota_sql.LOCK_CATCHUP_WINDOW, {"tenant_id": tenant_id, "window": window})
        used = cursor.fetchone()[0]
        take = min(per_minute - used, count - len(times))
        if take > 0:
            for position in range(used, used + take):
                times.append(max(now, window + CATCHUP_WINDOW * position / per_minute))
            cursor.execute(
                quota_sql.SET_CATCHUP_WINDOW, {"tenant_id": tenant_id, "window": window, "used": used + take}
            )
        window += CATCHUP_WINDOW
    return times


def tenant_quota_columns() -> dict[str, RawSQL]:
    """Each tenant row's quota counters (running now, claims and fires throttled so far) as query columns, for a
    queryset of tenants: the console lists and sorts tenants by them."""
    return {
        "running_now": RawSQL(quota_sql.TENANT_RUNNING_COLUMN, ()),
        "throttled_claims_count": RawSQL(quota_sql.TENANT_THROTTLED_CLAIMS_COLUMN, ()),
        "throttled_fires_count": RawSQL(quota_sql.TENANT_THROTTLED_FIRES_COLUMN, ()),
    }
