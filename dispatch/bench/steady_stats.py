"""The steady benchmark's figures, from the durable record (occurrences, attempts, table sizes) and the sampler.

Lag is the broker's confirmation (`enqueued_at`, or the envelope's `published_at` while it is not settled yet) minus
the due instant. Start lag is the first attempt's start minus the due instant, counted outside the bursts: from a
burst's instant until its last fire has run, the steady fires due meanwhile queue behind it on the workers (the queue
is FIFO, and a burst of 100,000 is seconds of the workers' time), so those are reported apart. Settle lag is how long
a confirmed envelope waited before its occurrences were stamped (the relay's own histogram, over the window and its
last envelopes). Bytes per fire are the
occurrence (with its watch), attempt and outbox tables with their indexes, divided by the occurrences they hold at
the end.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from django.db import connection

from dispatch import counters
from dispatch.bench.sampling import Readings
from dispatch.upkeep import checkpoint_counts


class SteadyRun(Protocol):
    """What the figures read of a finished run (dispatch/bench/steady.py's SteadyBenchmark)."""

    tenant_ids: list[int]
    window_start: datetime | None
    window_end: datetime | None
    bursts: list[datetime]
    settle_before: dict[float, float] | None
    settle_after: dict[float, float] | None

    def expected_fires(self) -> int: ...


# Memory growth is measured from this far into the window (allocators and caches settle first).
GROWTH_FROM_SECONDS = 300.0
# The relay's settle-lag histogram, one stored row per bucket (dispatch/counters.py SETTLE_LAG).
SETTLE_LAG_BUCKETS = f"{counters.SETTLE_LAG.name}_bucket"
TABLES_PER_FIRE = ("dispatch_occurrence", "dispatch_occurrence_watch", "dispatch_attempt", "dispatch_outboxmessage")
POSTGRES_SETTINGS = ("shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_compression", "autovacuum")
POSTGRES_COUNTERS = ("checkpoints_timed", "checkpoints_requested", "wal_bytes", "wal_full_page_images")


def settle_buckets(*, waiting: bool = False) -> dict[float, float]:
    """The relay's settle-lag histogram as stored (one row per bucket, not cumulative): upper bound -> count. Read
    before and after a run, the difference is the run's: every envelope it settled, each counted once. With
    `waiting`, each confirmed envelope not settled yet counts too, in the bucket of the wait it has had so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT labels->>'le', value FROM dispatch_metric_counter WHERE name = %s", [SETTLE_LAG_BUCKETS])
        counts = {float(le): float(value) for le, value in cursor.fetchall()}
        if waiting:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM clock_timestamp() - published_at)::float8 FROM dispatch_outboxmessage"
                " WHERE published_at IS NOT NULL"
            )
            bounds = sorted(counts)
            for (age,) in cursor.fetchall():
                bound = next((b for b in bounds if age <= b), float("inf"))
                counts[bound] = counts.get(bound, 0.0) + 1.0
    return counts


def postgres_facts() -> dict[str, Any]:
    """The server's settings that decide its disk work under this load, and its checkpoint and WAL counters. Read
    before and after a run, `postgres_during` says what the run cost the server (docs/SCALING.md)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
            [list(POSTGRES_SETTINGS)],
        )
        facts: dict[str, Any] = dict(cursor.fetchall())
        facts["checkpoints_timed"], facts["checkpoints_requested"], _ = checkpoint_counts(cursor)
        cursor.execute("SELECT wal_bytes::bigint, wal_fpi FROM pg_stat_wal")
        facts["wal_bytes"], facts["wal_full_page_images"] = cursor.fetchone()
    return facts


def postgres_during(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The settings as they were at the end, and the counters' growth over the run."""
    settings_now = {name: after[name] for name in POSTGRES_SETTINGS}
    grown = {name: after[name] - before[name] for name in POSTGRES_COUNTERS}
    return {**settings_now, **grown, "wal_mb": round(grown.pop("wal_bytes") / 2**20)}


def histogram_quantile(counts: dict[float, float], fraction: float) -> float | None:
    """The quantile of per-bucket counts, interpolated linearly inside its bucket as Prometheus' histogram_quantile
    does (the lowest bucket from 0; the +Inf bucket answers with the highest finite bound)."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = fraction * total
    seen, lower = 0.0, 0.0
    finite = sorted(bound for bound in counts if bound != float("inf"))
    for bound in [*finite, float("inf")]:
        count = counts.get(bound, 0.0)
        if seen + count >= rank and count > 0:
            if bound == float("inf"):
                return finite[-1] if finite else None
            return lower + (bound - lower) * (rank - seen) / count
        seen += count
        lower = bound
    return finite[-1] if finite else None


def steady_stats(bench: SteadyRun, readings: Readings) -> dict[str, Any]:
    params: dict[str, Any] = {
        "t": bench.tenant_ids,
        "start": bench.window_start,
        "end": bench.window_end,
    }
    drains = _burst_drains(bench)
    params["burst_starts"] = [start for start, _ in drains]
    params["burst_ends"] = [end for _, end in drains]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH window_fires AS (
                SELECT occurrence_id, scheduled_for, state, enqueued_at FROM dispatch_occurrence
                WHERE tenant_id = ANY(%(t)s) AND scheduled_for >= %(start)s AND scheduled_for < %(end)s
            ), lags AS (
                SELECT EXTRACT(EPOCH FROM enqueued_at - scheduled_for) AS lag
                FROM window_fires WHERE enqueued_at IS NOT NULL
                UNION ALL
                -- Confirmed but not settled yet: the envelope's stamp is the confirmation.
                SELECT EXTRACT(EPOCH FROM m.published_at - u.scheduled_for)
                FROM dispatch_outboxmessage AS m
                CROSS JOIN LATERAL unnest(m.occurrence_ids, m.scheduled_fors) AS u(occurrence_id, scheduled_for)
                JOIN window_fires AS o ON o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
                WHERE m.tenant_id = ANY(%(t)s) AND m.published_at IS NOT NULL AND o.enqueued_at IS NULL
            )
            SELECT (SELECT count(*) FROM window_fires), (SELECT count(*) FROM window_fires WHERE state = 'succeeded'),
                   count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), max(lag)
            FROM lags
            """,
            params,
        )
        fires, succeeded, confirmed, lag_p50, lag_p99, lag_max = cursor.fetchone()
        cursor.execute(
            """
            SELECT state, count(*) FROM dispatch_occurrence
            WHERE tenant_id = ANY(%(t)s) AND scheduled_for >= %(start)s AND scheduled_for < %(end)s GROUP BY 1
            """,
            params,
        )
        states = dict(cursor.fetchall())
        cursor.execute(
            """
            WITH first AS (
                SELECT a.occurrence_id, a.scheduled_for, min(a.started_at) AS started_at,
                       count(*) FILTER (WHERE a.outcome = 'succeeded') AS successes
                FROM dispatch_attempt AS a
                WHERE a.scheduled_for >= %(start)s AND a.scheduled_for < %(end)s
                GROUP BY 1, 2
            ), lags AS (
                SELECT EXTRACT(EPOCH FROM f.started_at - o.scheduled_for) AS lag, f.successes,
                       EXISTS (SELECT 1 FROM unnest(%(burst_starts)s::timestamptz[], %(burst_ends)s::timestamptz[])
                                                 AS b(starts, ends)
                               WHERE o.scheduled_for >= b.starts AND o.scheduled_for <= b.ends) AS in_burst
                FROM first AS f
                JOIN dispatch_occurrence AS o ON o.occurrence_id = f.occurrence_id AND o.scheduled_for = f.scheduled_for
                WHERE o.tenant_id = ANY(%(t)s)
            )
            SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) FILTER (WHERE NOT in_burst),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) FILTER (WHERE NOT in_burst),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) FILTER (WHERE in_burst),
                   COALESCE(sum(GREATEST(successes - 1, 0)), 0)
            FROM lags
            """,
            params,
        )
        start_p50, start_p99, burst_start_p99, duplicate_effects = cursor.fetchone()
        bytes_per_fire, table_mb = _bytes_per_fire(cursor)
    # The window's settling (dispatch/bench/steady.py SETTLE_GRACE_SECONDS); a run cut short reads it now.
    after = bench.settle_after if bench.settle_after is not None else settle_buckets(waiting=True)
    before = bench.settle_before or {}
    run_counts = {bound: after.get(bound, 0.0) - before.get(bound, 0.0) for bound in after}
    expected = bench.expected_fires()
    outbox = [s.outbox_rows for s in readings.samples]
    return {
        "fires": int(fires),
        "expected": expected,
        "lost": expected - int(succeeded),
        "states": states,
        "duplicate_effects": int(duplicate_effects),
        "lag_p50_s": _round(lag_p50),
        "lag_p99_s": _round(lag_p99),
        "lag_max_s": _round(lag_max),
        "unconfirmed": int(fires) - int(confirmed),
        # Every envelope the relay settled, from its histogram (interpolated within buckets)...
        "settle_lag_p50_s": _round(histogram_quantile(run_counts, 0.5)),
        "settle_lag_p99_s": _round(histogram_quantile(run_counts, 0.99)),
        "settled_envelopes": int(sum(run_counts.values())),
        # ...and, as a check, the longest wait of a confirmed envelope that a poll of the outbox saw (once a second).
        "settle_lag_max_s": round(readings.oldest_unsettled_max, 3),
        "start_lag_p50_s": _round(start_p50),
        "start_lag_p99_s": _round(start_p99),
        "burst_start_lag_p99_s": _round(burst_start_p99),
        "outbox_rows_max": max(outbox, default=0),
        "outbox_rows_end": outbox[-1] if outbox else 0,
        "burst_drain_s": [round((end - start).total_seconds(), 1) for start, end in drains],
        "outbox_after_bursts": _outbox_after_bursts(bench, readings),
        **_memory(readings),
        "dead_tuples_max": readings.dead_tuples_max,
        "host_stalls": [{"at_s": at, "seconds": seconds} for at, seconds in readings.host_stalls],
        "bytes_per_fire": bytes_per_fire,
        "table_mb": table_mb,
    }


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _memory(readings: Readings) -> dict[str, Any]:
    """Peak memory per role and its growth from GROWTH_FROM_SECONDS (or half the window, if shorter) to the end."""
    peak: dict[str, float] = {}
    growth: dict[str, float | None] = {}
    for role, series in readings.rss.items():
        peak[role] = max(mb for _, mb in series)
        in_window = [(at, mb) for at, mb in series if at >= 0]
        if len(in_window) < 2:
            growth[role] = None
            continue
        span = in_window[-1][0]
        base_at = min(GROWTH_FROM_SECONDS, span / 2)
        base = next(mb for at, mb in in_window if at >= base_at)
        growth[role] = round((in_window[-1][1] - base) / base, 3) if base else None
    return {"rss_mb_max": peak, "rss_mb_growth": growth}


def _burst_drains(bench: SteadyRun) -> list[tuple[datetime, datetime]]:
    """Per burst: its instant, and when the last of its fires finished running (the instant itself if none ran)."""
    drains = []
    with connection.cursor() as cursor:
        for burst in bench.bursts:
            cursor.execute(
                """
                SELECT max(o.finished_at) FROM dispatch_occurrence AS o
                JOIN schedules_schedule AS s ON s.id = o.schedule_id AND s.kind = 'cron'
                WHERE o.tenant_id = ANY(%s) AND o.scheduled_for = %s
                """,
                [bench.tenant_ids, burst],
            )
            finished = cursor.fetchone()[0]
            drains.append((burst, max(burst, finished or burst)))
    return drains


def _outbox_after_bursts(bench: SteadyRun, readings: Readings) -> list[dict[str, Any]]:
    """Per burst: the outbox's peak after it, and how long until it held no more than a steady minute's envelopes
    (the largest count sampled in the minute before the burst; None: not within the window)."""
    assert bench.window_start is not None
    found = []
    for burst in bench.bursts:
        at = (burst - bench.window_start).total_seconds()
        before = [s.outbox_rows for s in readings.samples if at - 60 <= s.at < at]
        after = [s for s in readings.samples if s.at >= at]
        baseline = max(before, default=0)
        recovered = next((s.at - at for s in after if s.at > at + 1 and s.outbox_rows <= max(baseline, 1)), None)
        found.append(
            {
                "at": burst.isoformat(),
                "outbox_before_max": baseline,
                "outbox_peak": max((s.outbox_rows for s in after if s.at < at + 120), default=0),
                "back_to_steady_s": None if recovered is None else round(recovered, 1),
            }
        )
    return found


def _bytes_per_fire(cursor) -> tuple[float | None, dict[str, float]]:
    """Bytes of the occurrence (with its watch), attempt and outbox tables (every partition, with indexes and TOAST)
    per occurrence."""
    cursor.execute(
        """
        SELECT COALESCE(parent.relname, c.relname), sum(pg_total_relation_size(c.oid))::bigint
        FROM pg_class AS c
        LEFT JOIN pg_inherits AS i ON i.inhrelid = c.oid
        LEFT JOIN pg_class AS parent ON parent.oid = i.inhparent
        WHERE c.relkind = 'r' AND COALESCE(parent.relname, c.relname) = ANY(%s)
        GROUP BY 1
        """,
        [list(TABLES_PER_FIRE)],
    )
    sizes = dict(cursor.fetchall())
    cursor.execute("SELECT count(*) FROM dispatch_occurrence")
    occurrences = cursor.fetchone()[0]
    total = sum(sizes.values())
    table_mb = {name: round(size / 2**20, 1) for name, size in sizes.items()}
    return (round(total / occurrences, 1) if occurrences else None), table_mb
