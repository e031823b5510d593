"""The console dashboard's statements (dispatch/dashboard.py): what an operator looks at first.

Each is bounded on a platform of 20 M schedules and 200 M occurrences a day: recent occurrences are read through
the day partitions of the window (pruned on scheduled_for) and, once a window holds more than a sample's worth,
through TABLESAMPLE SYSTEM at a percentage the caller computes from the planner's row estimate; schedule cursors
through the per-shard index cursor_due_by_shard_tenant, or a TABLESAMPLE of them when the table is big, grouped by
rule so Python expands each rule once; the quota and liveness tables are small.
"""

from __future__ import annotations

from dispatch.sql import UNRESOLVED_DEAD

# Rows the planner expects in the occurrence partitions overlapping [since, until]: the sample percentage is chosen
# from this (reltuples is -1 before a partition's first ANALYZE; counted as 0, i.e. read it all).
RECENT_ROWS_ESTIMATE = """
SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'dispatch_occurrence'::regclass
  AND c.relname >= 'dispatch_occurrence_p' || to_char(%(since)s::timestamptz AT TIME ZONE 'UTC', 'YYYYMMDD')
  AND c.relname <= 'dispatch_occurrence_p' || to_char(%(until)s::timestamptz AT TIME ZONE 'UTC', 'YYYYMMDD')
"""

# One pass over the window, three groupings: per (minute, lane) the enqueue lag quantiles (confirmation - release
# instant) of fires not held back by their tenant's fire rate; per (minute, state) how many fires; per tenant how
# many, and how many of them reached the broker (enqueued_at is the first publish's stamp: a fire offered again
# after a wait for a running slot or a retry is still one fire here, where the relays' publish counter counts every
# offer). {sample} is "" or a TABLESAMPLE clause. `g` tells the grouping a row belongs to. Here and below,
# %(tenant_ids)s is NULL for every tenant or the tenants a console operator may see (tenants/access.py).
RECENT_BY_MINUTE = """
SELECT GROUPING(date_trunc('minute', o.scheduled_for), o.lane, o.state, o.tenant_id) AS g,
       date_trunc('minute', o.scheduled_for) AS minute, o.lane, o.state, o.tenant_id, count(*),
       count(*) FILTER (WHERE o.enqueued_at IS NOT NULL),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
           FILTER (WHERE o.enqueued_at IS NOT NULL AND NOT o.throttled),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
           FILTER (WHERE o.enqueued_at IS NOT NULL AND NOT o.throttled),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
           FILTER (WHERE o.enqueued_at IS NOT NULL AND NOT o.throttled)
FROM dispatch_occurrence AS o {sample}
WHERE o.scheduled_for >= %(since)s AND o.scheduled_for <= clock_timestamp()
  AND (%(tenant_ids)s::bigint[] IS NULL OR o.tenant_id = ANY(%(tenant_ids)s::bigint[]))
GROUP BY GROUPING SETS ((date_trunc('minute', o.scheduled_for), o.lane),
                        (date_trunc('minute', o.scheduled_for), o.state),
                        (o.tenant_id))
"""

# The lag chart over another window than RECENT_BY_MINUTE's hour (up to 7 days, or a custom range as long): the same
# quantiles per (bucket, lane), buckets of %(bucket)s aligned on midnight UTC (date_bin), through the day partitions of
# [since, until] only (both bounds on the partition key) and {sample} as above.
LAG_BY_BUCKET = """
SELECT date_bin(%(bucket)s::interval, o.scheduled_for, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS bucket, o.lane,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at)),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
FROM dispatch_occurrence AS o {sample}
WHERE o.scheduled_for >= %(since)s AND o.scheduled_for < %(until)s
  AND o.enqueued_at IS NOT NULL AND NOT o.throttled
  AND (%(tenant_ids)s::bigint[] IS NULL OR o.tenant_id = ANY(%(tenant_ids)s::bigint[]))
GROUP BY 1, 2
"""

# Fires due in [now, until), per minute, come from two places that never overlap: a schedule's cursor is its next
# fire NOT yet materialized, so its fires before the cursor are rows in the outbox and its fires from the cursor on
# are not written anywhere yet.
# 1. Materialized fires waiting in unpublished envelopes, by release instant (the partial index outbox_due).
DUE_MATERIALIZED = """
SELECT date_trunc('minute', m.available_at) AS minute, sum(cardinality(m.occurrence_ids))::bigint
FROM dispatch_outboxmessage AS m
WHERE m.published_at IS NULL AND m.available_at >= %(now)s AND m.available_at < %(until)s
GROUP BY 1
"""

# 2. Cursors inside the window, grouped so that Python expands each rule once (dispatch/dashboard.py): one row
# per (cron, zone, first fire to count) with how many schedules share it. One cursor stands for every fire of its
# rule from the cursor to `until` (an every-minute schedule is 60 fires an hour, not one). A cursor behind now
# (the materializer is down or behind) counts from now: its overdue fires are the backlog, not the next hour. A
# one-off's cursor is its only fire, so one-offs are only counted per minute, never expanded; their grouping key
# drops the zone, which would otherwise give a group per zone. An interval's fires from its cursor on are the
# cursor plus whole periods, so it is grouped by (period, its first fire from now on), that fire truncated to the
# second (fires whole periods apart keep their minutes): a period has at most min(period, 3600) groups in the
# hour, each expanded by adding the period. Rows: kind, cron, timezone, every_seconds, first instant, count.
# {source} is DUE_CURSORS_BY_SHARD (one index range per shard on cursor_due_by_shard_tenant) or DUE_CURSORS_SAMPLED.
DUE_CURSOR_GROUPS = """
SELECT c.kind,
       CASE WHEN c.kind = 'cron' THEN c.cron END,
       CASE WHEN c.kind = 'cron' THEN c.timezone END,
       CASE WHEN c.kind = 'interval' THEN c.every_seconds END,
       CASE WHEN c.kind = 'cron' THEN GREATEST(c.next_run_at, %(now)s)
            WHEN c.kind = 'interval' THEN date_trunc('second', c.next_run_at
                + (ceil(GREATEST(0, EXTRACT(EPOCH FROM %(now)s - c.next_run_at)) / c.every_seconds)
                   * c.every_seconds)::float8 * interval '1 second')
            ELSE date_trunc('minute', c.next_run_at) END,
       count(*)
FROM {source}
WHERE c.next_run_at < %(until)s AND (c.kind <> 'once' OR c.next_run_at >= %(now)s)
GROUP BY 1, 2, 3, 4, 5
"""
DUE_CURSORS_BY_SHARD = """generate_series(0, %(shards)s - 1) AS s(shard)
CROSS JOIN LATERAL (
    SELECT kind, cron, timezone, every_seconds, next_run_at FROM schedules_schedulecursor
    WHERE shard = s.shard AND next_run_at < %(until)s
) AS c"""
# Most cursors of a busy platform are inside the hour (the materializer keeps them a horizon ahead of each rule's
# next fire), so above a sample's worth of rows the table is sampled by page and the counts scaled back up.
DUE_CURSORS_SAMPLED = "schedules_schedulecursor AS c TABLESAMPLE SYSTEM ({percent})"

# The planner's row count of the cursor table (reltuples, -1 before the first ANALYZE: counted as 0).
CURSOR_ROWS_ESTIMATE = """
SELECT GREATEST(c.reltuples, 0) FROM pg_class AS c WHERE c.oid = 'schedules_schedulecursor'::regclass
"""

BACKLOG = """
SELECT count(*) FILTER (WHERE published_at IS NULL AND available_at <= clock_timestamp()),
       COALESCE(sum(cardinality(occurrence_ids)) FILTER (WHERE published_at IS NULL
                                                           AND available_at <= clock_timestamp()), 0),
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(available_at) FILTER (WHERE published_at IS NULL)), 0),
       count(*) FILTER (WHERE published_at IS NOT NULL)
FROM dispatch_outboxmessage
"""

# The DLQ tile: what the occurrence list's "in the DLQ" filter (dispatch/dlq.py in_dead_letter_queue) lists, over any
# time, of the operator's tenants: the tile counts exactly the rows its link opens.
DEAD_COUNT = (
    """
SELECT count(*) FROM dispatch_occurrence_watch AS w
WHERE """
    + UNRESOLVED_DEAD
    + """
  AND (%(tenant_ids)s::bigint[] IS NULL OR w.tenant_id = ANY(%(tenant_ids)s::bigint[]))
"""
)

# The missed tile: what the occurrence list filtered on state missed and scheduled_after=now-1h lists, of the
# operator's tenants (the tile counts exactly the rows its link opens). Read only while the hour holds less than a
# sample's worth of rows (dispatch/dashboard.py): the hour's partitions are pruned on scheduled_for, but no index
# names the state, so the count reads every row of the hour.
MISSED_COUNT = """
SELECT count(*) FROM dispatch_occurrence AS o
WHERE o.state = 'missed' AND o.scheduled_for >= %(since)s
  AND (%(tenant_ids)s::bigint[] IS NULL OR o.tenant_id = ANY(%(tenant_ids)s::bigint[]))
"""

# Per tenant: the engine's quota counters (dispatch/sql/quotas.py), busiest first, bounded. dispatched_fires counts
# every publish since the tenant's first (a fire parked for max_running, or retried, is published again and counted
# again): it is the relays' work for the tenant, not a number of fires.
TENANT_USAGE = """
SELECT t.id, t.slug, t.max_fires_per_second, t.max_running,
       COALESCE(b.dispatched_fires, 0), COALESCE(b.throttled_fires, 0),
       COALESCE(r.running, 0), COALESCE(r.throttled_claims, 0)
FROM tenants_tenant AS t
LEFT JOIN dispatch_tenant_fire_bucket AS b ON b.tenant_id = t.id
LEFT JOIN dispatch_tenant_running AS r ON r.tenant_id = t.id
WHERE t.schema_name <> 'public' AND (%(tenant_ids)s::bigint[] IS NULL OR t.id = ANY(%(tenant_ids)s::bigint[]))
ORDER BY COALESCE(b.dispatched_fires, 0) DESC, t.slug
LIMIT %(limit)s
"""

# Process liveness: each process's last heartbeat (PostgreSQL's clock), the shard leases a materializer holds, and
# the running attempts a worker holds (attempt rows not finished, by worker name prefix).
PROCESSES = """
SELECT h.role, h.name, h.started_at, EXTRACT(EPOCH FROM clock_timestamp() - h.heartbeat_at),
       (SELECT count(*) FROM dispatch_shardlease AS l WHERE l.owner = h.name AND l.expires_at > clock_timestamp())
FROM dispatch_processheartbeat AS h
WHERE h.heartbeat_at > clock_timestamp() - make_interval(secs => %(recent)s)
ORDER BY h.role, h.name
"""

RUNNING_BY_WORKER = """
SELECT a.worker, count(*) FROM dispatch_occurrence_watch AS w
JOIN dispatch_attempt AS a ON a.occurrence_id = w.occurrence_id AND a.scheduled_for = w.scheduled_for
     AND a.generation = w.attempt_count
WHERE w.state = 'running'
GROUP BY a.worker
"""
