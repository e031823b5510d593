"""Prometheus metrics at scrape time: the stored counters of every process (dispatch/counters.py), gauges read from
the durable record, and the lanes' queues as the broker sees them.

Every query here is served by a small table or index (partial, BRIN or per-shard probes): a scrape must stay cheap on
a table of 20 M schedules and a day of 200 M occurrences.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from kombu import Connection
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatch import counters
from dispatch.queues import FLEXIBLE_QUEUE, STRICT_QUEUE, with_crowds
from dispatch.sql import metrics as metrics_sql
from dispatch.upkeep import upkeep_gauges

logger = logging.getLogger(__name__)

# The window of recent fires that state counts describe.
RECENT_WINDOW_SECONDS = 300
# Per-tenant quota series are limited to the busiest tenants: label cardinality stays bounded on a large platform.
TENANT_SERIES_LIMIT = 100
# Tenants with lag histograms of their own (each is ~17 series per lane), re-ranked at most this often.
LAG_TENANT_SERIES = 20
RANK_LAG_TENANTS_EVERY_SECONDS = 600
# A scrape must not hang on a broker that does not answer: connect, read and write are bounded.
BROKER_TIMEOUT_SECONDS = 2.0


class SchedulerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect_database()
        except Exception:
            # A scrape must not fail the endpoint; the gap in the series is the signal.
            logger.exception("metrics collection failed", extra={"action": "metrics"})
        yield from collect_queues()

    def _collect_database(self) -> Iterator[Metric]:
        # This process's own pending counts (a web process has few) go in first, so the scrape sees them.
        counters.flush()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(metrics_sql.RANK_LAG_TENANTS_DUE, {"every": RANK_LAG_TENANTS_EVERY_SECONDS})
            row = cursor.fetchone()
            if row is not None and row[0]:
                cursor.execute(metrics_sql.FORGET_LAG_TENANTS)
                cursor.execute(metrics_sql.RANK_LAG_TENANTS, {"limit": LAG_TENANT_SERIES})
            cursor.execute(metrics_sql.LAG_TENANTS)
            served_tenants = {slug for (slug,) in cursor.fetchall()} | {"other"}
            cursor.execute(metrics_sql.READ_COUNTERS)
            yield from stored_families(cursor.fetchall(), served_tenants)
        with connection.cursor() as cursor:
            yield from _gauges(cursor)


def stored_families(rows: list[tuple[str, Any, float]], served_tenants: set[str]) -> Iterator[Metric]:
    """The catalogue's families from the stored samples: counters as they are, histograms cumulated per bound."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for name, labels, value in rows:
        # Django's cursor hands jsonb over as its text.
        samples[name].append((json.loads(labels) if isinstance(labels, str) else labels, float(value)))
    for family in counters.FAMILIES.values():
        if isinstance(family, counters.Counter):
            metric = CounterMetricFamily(family.name, family.documentation, labels=family.labelnames)
            stored = samples.get(family.name, [])
            for labels, value in stored:
                metric.add_metric([labels.get(n, "") for n in family.labelnames], value)
            if not stored and not family.labelnames:
                # A counter without labels has exactly one series, and it exists from the start: Prometheus expects
                # `name_total 0` before the first increment (rate() and absent() need the sample, not a bare TYPE).
                metric.add_metric([], 0.0)
            yield metric
        elif isinstance(family, counters.Histogram):
            yield _histogram(family, samples, served_tenants)


def _histogram(
    family: counters.Histogram, samples: dict[str, list[tuple[dict[str, str], float]]], served_tenants: set[str]
) -> HistogramMetricFamily:
    metric = HistogramMetricFamily(family.name, family.documentation, labels=family.labelnames)
    les = family.bucket_labels()
    per_series: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get(f"{family.name}_bucket", []):
        key = tuple(labels.get(n, "") for n in family.labelnames)
        per_series[key][labels.get("le", "+Inf")] = value
    sums = {
        tuple(labels.get(n, "") for n in family.labelnames): value
        for labels, value in samples.get(f"{family.name}_sum", [])
    }
    if not per_series and not family.labelnames:
        per_series[()] = {}  # its one series exists before the first observation: every bucket, count and sum 0
    for key, buckets in sorted(per_series.items()):
        if "tenant" in family.labelnames and key[family.labelnames.index("tenant")] not in served_tenants:
            continue  # a tenant that left the busiest: its frozen series is no longer served
        running, cumulative = 0.0, []
        for le in les:
            running += buckets.get(le, 0.0)
            cumulative.append((le, running))
        metric.add_metric(list(key), cumulative, sums.get(key, 0.0))
    return metric


def _gauges(cursor) -> Iterator[Metric]:
    cursor.execute(metrics_sql.METRICS_OUTBOX)
    envelopes, occurrences, oldest_age, unsettled, oldest_unsettled_age = cursor.fetchone()
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
        "scheduler_outbox_unsettled_envelopes",
        "Published envelopes whose confirmation is not yet settled onto their occurrences.",
        unsettled,
    )
    yield GaugeMetricFamily(
        "scheduler_outbox_oldest_unsettled_age_seconds",
        "How long ago the oldest unsettled envelope was confirmed (0 when none waits): its occurrences show no "
        "enqueued_at and the lag histograms do not count them yet.",
        float(oldest_unsettled_age),
    )

    cursor.execute(metrics_sql.METRICS_RECENT_STATES, {"window": RECENT_WINDOW_SECONDS})
    states = GaugeMetricFamily(
        "scheduler_recent_occurrences",
        f"Occurrences scheduled in the last {RECENT_WINDOW_SECONDS} s, by lane and state.",
        labels=["lane", "state"],
    )
    for lane, state, count in cursor.fetchall():
        states.add_metric([lane, state], count)
    yield states

    cursor.execute(metrics_sql.METRICS_TENANT_QUOTAS, {"limit": TENANT_SERIES_LIMIT})
    dispatched = CounterMetricFamily(
        "scheduler_tenant_dispatched_fires",
        "Publishes of the tenant's fires by the relays; a fire offered again (parked for max_running, retried) counts "
        "again.",
        labels=["tenant"],
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
        "Claims that waited because the tenant ran max_running.",
        labels=["tenant"],
    )
    total_throttled_fires = total_throttled_claims = 0
    for slug, sent, waited, now_running, claims_waited in cursor.fetchall():
        dispatched.add_metric([slug], sent)
        throttled_fires.add_metric([slug], waited)
        running.add_metric([slug], now_running)
        throttled_claims.add_metric([slug], claims_waited)
        total_throttled_fires += waited
        total_throttled_claims += claims_waited
    yield from (dispatched, throttled_fires, running, throttled_claims)
    yield CounterMetricFamily(
        "scheduler_throttled_fires",
        "Fires that waited for their tenant's fire rate (busiest tenants).",
        total_throttled_fires,
    )
    yield CounterMetricFamily(
        "scheduler_throttled_claims",
        "Claims that waited for their tenant's running quota (busiest tenants).",
        total_throttled_claims,
    )

    cursor.execute(metrics_sql.METRICS_CURSOR_BEHIND, {"shards": settings.SCHEDULER_SHARDS})
    yield GaugeMetricFamily(
        "scheduler_materialization_behind_seconds",
        "How far the earliest active cursor is behind now (0 when materialization is ahead).",
        max(0.0, float(cursor.fetchone()[0])),
    )

    cursor.execute(metrics_sql.METRICS_DEAD_AND_LEASES)
    dead, now_running, expired = cursor.fetchone()
    yield GaugeMetricFamily("scheduler_dlq_occurrences", "Dead occurrences no operator resolved (the DLQ).", dead)
    yield GaugeMetricFamily("scheduler_running_occurrences", "Occurrences claimed by workers.", now_running)
    yield GaugeMetricFamily(
        "scheduler_expired_leases", "Running occurrences whose worker lease expired (to be reaped).", expired
    )

    ttl = live_heartbeat_seconds()
    cursor.execute(metrics_sql.METRICS_LIVE_PROCESSES, {"ttl": ttl})
    live = GaugeMetricFamily("scheduler_live_processes", "Processes with a recent heartbeat.", labels=["role"])
    for role, count in cursor.fetchall():
        live.add_metric([role], count)
    yield live

    cursor.execute(metrics_sql.METRICS_CLOCK_SKEW, {"ttl": ttl})
    skew = GaugeMetricFamily(
        "scheduler_clock_skew_seconds",
        "Per role, the live process whose wall clock is furthest from PostgreSQL's (process - database).",
        labels=["role"],
    )
    for role, seconds in cursor.fetchall():
        skew.add_metric([role], float(seconds))
    yield skew

    yield from upkeep_gauges(cursor)


def live_heartbeat_seconds() -> float:
    """A heartbeat counts as live for two shard leases (the materializers' fair share uses the same rule)."""
    return 2 * max(settings.SCHEDULER_LEASE_SECONDS, settings.SCHEDULER_HEARTBEAT_SECONDS)


def collect_queues() -> Iterator[Metric]:
    """Messages ready and consumers per lane queue (a passive declare: nothing is created), and whether the broker
    answered at all."""
    messages = GaugeMetricFamily(
        "scheduler_queue_messages",
        "Messages ready in the queue (a lane's, or its crowd queue).",
        labels=["queue", "lane"],
    )
    consumers = GaugeMetricFamily(
        "scheduler_queue_consumers", "Consumers of the queue (a lane's, or its crowd queue).", labels=["queue", "lane"]
    )
    up = 1
    try:
        with Connection(
            settings.CELERY_BROKER_URL,
            connect_timeout=BROKER_TIMEOUT_SECONDS,
            transport_options={"read_timeout": BROKER_TIMEOUT_SECONDS, "write_timeout": BROKER_TIMEOUT_SECONDS},
        ) as broker:
            broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
            lanes = ((STRICT_QUEUE, "strict"), (FLEXIBLE_QUEUE, "flexible"))
            for queue, lane in [(name, lane) for lane_queue, lane in lanes for name in with_crowds(lane_queue)]:
                channel = broker.channel()
                try:
                    _, ready, consuming = channel.queue_declare(queue=queue, passive=True)
                except Exception:
                    continue  # not declared yet: no relay or worker has run
                finally:
                    try:
                        channel.close()
                    except Exception:
                        logger.debug("closing a metrics channel failed", exc_info=True)
                messages.add_metric([queue, lane], ready)
                consumers.add_metric([queue, lane], consuming)
    except Exception:
        logger.warning("metrics: the broker did not answer", exc_info=True, extra={"action": "metrics"})
        up = 0
    yield messages
    yield consumers
    yield GaugeMetricFamily("scheduler_broker_up", "1 when the broker answered this scrape.", up)
