"""The fairness benchmark: one big and one small tenant, every fire due at one instant, through the real processes.

What a small tenant pays when it shares the platform with a big one: its fires must leave at their instant, not
behind the big tenant's batch. On top of the burst (dispatch/bench/burst.py):
1. Provision `bench-big` and `bench-small` (equal fairness weights; the big one optionally held to
   `--big-fires-per-second`) and COPY N and M schedules due at T0.
2. Run the materializer and R relays; wait until every fire is confirmed by the broker.
3. Measure each tenant's lag (confirmation - scheduled_for) and lost fires apart; the big tenant's throttled fires
   are reported (their lateness is its own quota, not the platform's lag).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from dispatch.bench.burst import BurstBenchmark, BurstConfig
from dispatch.bench.rows import BENCH_TENANT_PREFIX, UNTHROTTLED
from tenants.models import Tenant
from tenants.services import provision_tenant

BIG = f"{BENCH_TENANT_PREFIX}big"
SMALL = f"{BENCH_TENANT_PREFIX}small"


@dataclass
class FairnessConfig(BurstConfig):
    big: int = 0
    small: int = 0
    big_fires_per_second: int | None = None


class FairnessBenchmark(BurstBenchmark):
    config: FairnessConfig

    def __init__(self, config: FairnessConfig, out=sys.stdout) -> None:
        config.schedules = config.big + config.small
        config.tenants = 2
        if config.big_fires_per_second:
            # A throttled big tenant needs big / rate seconds after T0 to be dispatched.
            config.deadline_seconds += config.big / config.big_fires_per_second
        super().__init__(config, out)
        self.big: Tenant | None = None
        self.small: Tenant | None = None

    def provision(self) -> list[Tenant]:
        big_quotas: dict[str, Any] = dict(UNTHROTTLED)
        if self.config.big_fires_per_second:
            big_quotas["max_fires_per_second"] = self.config.big_fires_per_second
        self.big = provision_tenant(BIG, domain=f"{BIG}.localhost", **big_quotas).tenant
        self.small = provision_tenant(SMALL, domain=f"{SMALL}.localhost", **UNTHROTTLED).tenant
        self.tenant_ids = [self.big.id, self.small.id]
        return [self.big, self.small]

    def copy_schedules(self, tenants: list[Tenant], count: int, fire_at: datetime, *, due: bool) -> None:
        if not due:
            super().copy_schedules(tenants, count, fire_at, due=due)
            return
        assert self.big is not None and self.small is not None
        super().copy_schedules([self.big], self.config.big, fire_at, due=True)
        super().copy_schedules([self.small], self.config.small, fire_at, due=True)

    def _tenant_stats(self, tenant: Tenant, prefix: str, expected: int) -> dict[str, Any]:
        every = self.tenant_ids
        self.tenant_ids = [tenant.id]
        try:
            stats = self.lag_stats("scheduled_for")
        finally:
            self.tenant_ids = every
        with connection.cursor() as cursor:
            cursor.execute("SELECT throttled_fires FROM dispatch_tenant_fire_bucket WHERE tenant_id = %s", [tenant.id])
            row = cursor.fetchone()
        return {
            f"{prefix}_enqueued": stats["enqueued"],
            f"{prefix}_lost": expected - stats["enqueued"],
            f"{prefix}_lag_p50_s": stats["lag_p50_s"],
            f"{prefix}_lag_p99_s": stats["lag_p99_s"],
            f"{prefix}_lag_max_s": stats["lag_max_s"],
            f"{prefix}_throttled_fires": int(row[0]) if row else 0,
        }

    def after_confirmed(self, t0: datetime) -> dict[str, Any]:
        assert self.big is not None and self.small is not None
        return {
            "big": self.config.big,
            "small": self.config.small,
            "big_fires_per_second": self.config.big_fires_per_second,
            **self._tenant_stats(self.big, "big", self.config.big),
            **self._tenant_stats(self.small, "small", self.config.small),
        }
