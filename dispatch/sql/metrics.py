"""The SQL of /metrics and /healthz: the stored counters every process adds to, and gauges read at scrape time.

Every read is served by a small table or index (partial, BRIN or per-shard probes): a scrape must stay cheap on a
table of 20 M schedules and a day of 200 M occurrences.
"""

from __future__ import annotations

from dispatch.sql import UNRESOLVED_DEAD

# --- stored counters (dispatch/counters.py) ------------------------------------------------------------------------

# A process's pending deltas, added to the totals. The rows come in (name, labels) order, the order every writer
# uses (the settle step's lag histogram too), so two concurrent flushes lock shared rows in the same order and never
# deadlock. A row is created by its first delta.
ADD_TO_COUNTERS = """
INSERT INTO dispatch_metric_counter AS c (name, labels, value)
SELECT u.name, u.labels::jsonb, u.delta
FROM unnest(%(names)s::text[], %(labels)s::text[], %(deltas)s::float8[]) AS u(name, labels, delta)
ORDER BY u.name, u.labels::jsonb
ON CONFLICT (name, labels) DO UPDATE SET value = c.value + EXCLUDED.value
"""

COUNTER_VALUE = "SELECT value FROM dispatch_metric_counter WHERE name = %(name)s AND labels = %(labels)s::jsonb"

# Every stored sample, for the scrape (a few hundred rows: bounded label sets only).
READ_COUNTERS = "SELECT name, labels, value FROM dispatch_metric_counter ORDER BY name, labels"

# The tenants with lag series of their own: the `limit` busiest by fires dispatched, re-ranked at most every
# `every` seconds by whichever scrape comes first: the advisory lock (held to the end of the scrape's transaction)
# lets one scrape rank while the others keep the current ranking. A tenant that leaves the top is no longer served;
# its later fires count under "other", so no served series ever goes down.
RANK_LAG_TENANTS_DUE = """
SELECT pg_try_advisory_xact_lock(hashtext('dispatch_metric_tenant_series'))
WHERE coalesce((SELECT max(ranked_at) FROM dispatch_metric_tenant_series), '-infinity')
      < clock_timestamp() - make_interval(secs => %(every)s)
"""

FORGET_LAG_TENANTS = "DELETE FROM dispatch_metric_tenant_series"

RANK_LAG_TENANTS = """
INSERT INTO dispatch_metric_tenant_series (tenant_id, slug, ranked_at)
SELECT b.tenant_id, t.slug, clock_timestamp() FROM dispatch_tenant_fire_bucket AS b
JOIN tenants_tenant AS t ON t.id = b.tenant_id
WHERE b.dispatched_fires > 0
ORDER BY b.dispatched_fires DESC, b.tenant_id
LIMIT %(limit)s
"""

LAG_TENANTS = "SELECT slug FROM dispatch_metric_tenant_series"

# A deleted tenant's own lag series (tenant="<slug>"), dropped with it: a later tenant of the same slug starts from
# zero (a counter reset, which Prometheus handles) instead of inheriting them. "other" is every unranked tenant's.
FORGET_TENANT_LAG_SERIES = """
DELETE FROM dispatch_metric_counter WHERE labels ->> 'tenant' = %(slug)s AND %(slug)s <> 'other'
"""

# --- gauges read at scrape time ------------------------------------------------------------------------------------

# The outbox's backlog: what waits to be published, and what was published but not yet settled (a settler falling
# behind shows here first, and in scheduler_settle_lag_seconds).
METRICS_OUTBOX = """
SELECT count(*) FILTER (WHERE published_at IS NULL),
       coalesce(sum(cardinality(occurrence_ids)) FILTER (WHERE published_at IS NULL), 0),
       coalesce(EXTRACT(EPOCH FROM clock_timestamp() - min(available_at) FILTER (WHERE published_at IS NULL)), 0),
       count(*) FILTER (WHERE published_at IS NOT NULL),
       coalesce(EXTRACT(EPOCH FROM clock_timestamp() - min(published_at)), 0)
FROM dispatch_outboxmessage
"""

METRICS_RECENT_STATES = """
SELECT lane, state, count(*) FROM dispatch_occurrence
WHERE scheduled_for >= clock_timestamp() - make_interval(secs => %(window)s) AND scheduled_for <= clock_timestamp()
GROUP BY lane, state
"""

# The tenants' quota counters (dispatch/sql/quotas.py), busiest first and bounded: a label per tenant is fine for
# the tenants that are throttled or running now, not for every tenant of a large platform.
METRICS_TENANT_QUOTAS = """
SELECT t.slug, COALESCE(b.dispatched_fires, 0), COALESCE(b.throttled_fires, 0), COALESCE(r.running, 0),
       COALESCE(r.throttled_claims, 0)
FROM tenants_tenant AS t
LEFT JOIN dispatch_tenant_fire_bucket AS b ON b.tenant_id = t.id
LEFT JOIN dispatch_tenant_running AS r ON r.tenant_id = t.id
WHERE b.tenant_id IS NOT NULL OR r.tenant_id IS NOT NULL
ORDER BY COALESCE(b.throttled_fires, 0) + COALESCE(r.throttled_claims, 0) DESC, COALESCE(r.running, 0) DESC, t.slug
LIMIT %(limit)s
"""

# Loose index scan: one probe per shard on cursor_due_by_shard_tenant instead of a scan of every cursor.
METRICS_CURSOR_BEHIND = """
SELECT coalesce(EXTRACT(EPOCH FROM clock_timestamp() - min(first_due)), 0)
FROM generate_series(0, %(shards)s - 1) AS s(shard),
LATERAL (SELECT next_run_at AS first_due FROM schedules_schedulecursor
         WHERE shard = s.shard AND next_run_at IS NOT NULL
         ORDER BY next_run_at LIMIT 1) AS f
"""

# The DLQ's size is its unresolved dead rows (dispatch/dlq.py): an alert on it clears once operators resolve them.
METRICS_DEAD_AND_LEASES = (
    """
SELECT (SELECT count(*) FROM dispatch_occurrence_watch AS w WHERE """
    + UNRESOLVED_DEAD
    + """),
       (SELECT count(*) FROM dispatch_occurrence_watch WHERE state = 'running'),
       (SELECT count(*) FROM dispatch_occurrence_watch WHERE state = 'running' AND lease_expires_at < clock_timestamp())
"""
)

METRICS_LIVE_PROCESSES = """
SELECT role, count(*) FROM dispatch_processheartbeat
WHERE heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s) GROUP BY role
"""

# Per role, the live process whose clock is furthest from PostgreSQL's (signed: process - database).
METRICS_CLOCK_SKEW = """
SELECT DISTINCT ON (role) role, clock_skew_seconds FROM dispatch_processheartbeat
WHERE heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s) AND clock_skew_seconds IS NOT NULL
ORDER BY role, abs(clock_skew_seconds) DESC
"""

# /healthz (and the console's health banner) in one round trip: live materializers and relays (heartbeats within
# `ttl`), how far the earliest active cursor is behind now (the per-shard loose index scan of METRICS_CURSOR_BEHIND:
# cheap on 20 M schedules), how long ago the latest materializer and relay heartbeat on record was written (NULL when
# none is: the table holds one small row per process, pruned), and how long the oldest due envelope not held back by
# its tenant's fire rate has waited to be published (the partial index outbox_due, read from its oldest entry: the
# bound is `(SELECT clock_timestamp())`, a value computed once, so it is an index condition; clock_timestamp() itself
# is volatile, re-evaluated per row, and walked every future envelope when none was due: 200,000 rows, 80 ms).
HEALTH_PROBE = (
    """
SELECT count(*) FILTER (WHERE role = 'materializer'
                         AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)),
       count(*) FILTER (WHERE role = 'relay' AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)),
       (SELECT behind FROM ("""
    + METRICS_CURSOR_BEHIND
    + """) AS b(behind)),
       EXTRACT(EPOCH FROM clock_timestamp() - max(heartbeat_at) FILTER (WHERE role = 'materializer')),
       EXTRACT(EPOCH FROM clock_timestamp() - max(heartbeat_at) FILTER (WHERE role = 'relay')),
       (SELECT EXTRACT(EPOCH FROM clock_timestamp() - min(m.available_at)) FROM dispatch_outboxmessage AS m
        WHERE m.published_at IS NULL AND m.available_at <= (SELECT clock_timestamp()) AND NOT m.throttled)
FROM dispatch_processheartbeat
"""
)
