"""Prometheus metrics read from PostgreSQL at scrape time: the durable record, whichever process did the work.

Every query here is served by a small index (partial, BRIN or per-shard probes): a scrape must stay cheap on a
table of 20 M schedules and a day of 200 M occurrences.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.conf import settings
from django.db import connection
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dispatch.sql import maintenance as maintenance_sql

logger = logging.getLogger(__name__)

# The window of recent fires that lag quantiles and state counts describe.
RECENT_WINDOW_SECONDS = 300
# Per-tenant series are limited to the busiest tenants: label cardinality stays bounded on a large platform.
TENANT_SERIES_LIMIT = 100


class SchedulerCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            yield from self._collect()
        except Exception:
            # A scrape must not fail the endpoint; the gap in the series is the signal.
            logger.exception("metrics collection failed", extra={"action": "metrics"})

    def _collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with connection.cursor() as cursor:
            cursor.execute(maintenance_sql.METRICS_OUTBOX)
            envelopes, occurrences, oldest_age, unsettled = cursor.fetchone()
            yield GaugeMetricFamily("scheduler_outbox_envelopes", "Envelopes waiting to be published.", envelopes)
            yield GaugeMetricFamily(
                "scheduler_outbox_occurrences", "Occurrences waiting in unpublished envelopes.", occurrences
            )
            yield GaugeMetricFamily(
                "scheduler_outbox_oldest_due_age_seconds",
                "How overdue the oldest unpublished envelope is (negative: not due yet).",
                float(oldest_age),
            )
            yield GaugeMetricFamily(
                "scheduler_outbox_unsettled_envelopes", "Published envelopes not yet settled.", unsettled
            )

            cursor.execute(maintenance_sql.METRICS_RECENT_STATES, {"window": RECENT_WINDOW_SECONDS})
            states = GaugeMetricFamily(
                "scheduler_recent_occurrences",
                f"Occurrences scheduled in the last {RECENT_WINDOW_SECONDS} s, by lane and state.",
                labels=["lane", "state"],
            )
            for lane, state, count in cursor.fetchall():
                states.add_metric([lane, state], count)
            yield states

            cursor.execute(maintenance_sql.METRICS_RECENT_LAG, {"window": RECENT_WINDOW_SECONDS})
            lag = GaugeMetricFamily(
                "scheduler_schedule_lag_seconds",
                f"enqueued_at - available_at (the release instant) over the last {RECENT_WINDOW_SECONDS} s, broker "
                "confirmation; fires that waited for their tenant's max_fires_per_second are in "
                "scheduler_throttled_lag_seconds instead.",
                labels=["lane", "quantile"],
            )
            throttled_lag = GaugeMetricFamily(
                "scheduler_throttled_lag_seconds",
                "The same lag for fires held back by their tenant's max_fires_per_second, "
                f"last {RECENT_WINDOW_SECONDS} s.",
                labels=["lane", "quantile"],
            )
            for lane, throttled, p50, p95, p99, lag_max in cursor.fetchall():
                family = throttled_lag if throttled else lag
                for quantile, value in (("0.5", p50), ("0.95", p95), ("0.99", p99), ("1", lag_max)):
                    family.add_metric([lane, quantile], float(value))
            yield lag
            yield throttled_lag

            cursor.execute(maintenance_sql.METRICS_TENANT_QUOTAS, {"limit": TENANT_SERIES_LIMIT})
            dispatched = CounterMetricFamily(
                "scheduler_tenant_dispatched_fires", "Fires the relays sent per tenant.", labels=["tenant"]
            )
            throttled_fires = CounterMetricFamily(
                "scheduler_tenant_throttled_fires",
                "Fires that waited for their tenant's max_fires_per_second.",
                labels=["tenant"],
            )
            running = GaugeMetricFamily(
                "scheduler_tenant_running", "Occurrences of the tenant running now (max_running).", labels=["tenant"]
            )
            throttled_claims = CounterMetricFamily(
                "scheduler_tenant_throttled_claims",
                "Claims that waited because the tenant ran max_running occurrences.",
                labels=["tenant"],
            )
            for slug, sent, waited, now_running, claims_waited in cursor.fetchall():
                dispatched.add_metric([slug], sent)
                throttled_fires.add_metric([slug], waited)
                running.add_metric([slug], now_running)
                throttled_claims.add_metric([slug], claims_waited)
            yield from (dispatched, throttled_fires, running, throttled_claims)

            cursor.execute(maintenance_sql.METRICS_CURSOR_BEHIND, {"shards": settings.SCHEDULER_SHARDS})
            yield GaugeMetricFamily(
                "scheduler_materialization_behind_seconds",
                "How far the earliest active cursor is behind now (0 when materialization is ahead).",
                max(0.0, float(cursor.fetchone()[0])),
            )

            cursor.execute(maintenance_sql.METRICS_DEAD_AND_LEASES)
            dead, running, expired = cursor.fetchone()
            yield GaugeMetricFamily("scheduler_dlq_occurrences", "Occurrences in state dead (the DLQ).", dead)
            yield GaugeMetricFamily("scheduler_running_occurrences", "Occurrences claimed by workers.", running)
            yield GaugeMetricFamily(
                "scheduler_expired_leases", "Running occurrences whose worker lease expired (to be reaped).", expired
            )

            cursor.execute(maintenance_sql.METRICS_LIVE_PROCESSES)
            live = GaugeMetricFamily("scheduler_live_processes", "Processes with a recent heartbeat.", labels=["role"])
            for role, count in cursor.fetchall():
                live.add_metric([role], count)
            yield live
