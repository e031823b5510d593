"""The console dashboard's statements (dispatch/dashboard.py): what an operator looks at first.

Each is bounded on a platform of 20 M schedules and 200 M occurrences a day: recent occurrences are read through
the day partitions of the window (pruned on scheduled_for) and, once a window holds more than a sample's worth,
through TABLESAMPLE SYSTEM at a percentage the caller computes from the planner's row estimate; schedules through
the per-shard index cursor_due_by_shard; the quota and liveness tables are small.
"""

from __future__ import annotations

# Rows the planner expects in the occurrence partitions overlapping [since, now]: the sample percentage is chosen
# from this (reltuples is -1 before a partition's first ANALYZE; counted as 0, i.e. read it all).
RECENT_ROWS_ESTIMATE = """
SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'dispatch_occurrence'::regclass
  AND c.relname >= 'dispatch_occurrence_p' || to_char(%(since)s::timestamptz AT TIME ZONE 'UTC', 'YYYYMMDD')
"""

# One pass over the window, three groupings: per (minute, lane) the enqueue lag quantiles (confirmation - release
# instant) of fires not held back by their tenant's fire rate; per (minute, state) how many fires; per tenant how
# many. {sample} is "" or a TABLESAMPLE clause. `g` tells the grouping a row belongs to.
RECENT_BY_MINUTE = """
SELECT GROUPING(date_trunc('minute', o.scheduled_for), o.lane, o.state, o.tenant_id) AS g,
       date_trunc('minute', o.scheduled_for) AS minute, o.lane, o.state, o.tenant_id, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
           FILTER (WHERE o.enqueued_at IS NOT NULL AND NOT o.throttled),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
           FILTER (WHERE o.enqueued_at IS NOT NULL AND NOT o.throttled),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM o.enqueued_at - o.available_at))
           FILTER (WHERE o.enqueued_at IS NOT NULL AND NOT o.throttled)
FROM dispatch_occurrence AS o {sample}
WHERE o.scheduled_for >= %(since)s AND o.scheduled_for <= clock_timestamp()
GROUP BY GROUPING SETS ((date_trunc('minute', o.scheduled_for), o.lane),
                        (date_trunc('minute', o.scheduled_for), o.state),
                        (o.tenant_id))
"""

# Fires due in the next hour, per minute: materialized ones waiting in the outbox (by release instant), plus the
# schedules whose cursor (next fire not yet materialized) falls in it, one index range per shard.
DUE_NEXT_HOUR = """
SELECT minute, sum(fires)::bigint FROM (
    SELECT date_trunc('minute', m.available_at) AS minute, sum(cardinality(m.occurrence_ids)) AS fires
    FROM dispatch_outboxmessage AS m
    WHERE m.published_at IS NULL AND m.available_at >= clock_timestamp()
      AND m.available_at < clock_timestamp() + interval '60 minutes'
    GROUP BY 1
    UNION ALL
    SELECT date_trunc('minute', d.next_run_at), count(*)
    FROM generate_series(0, %(shards)s - 1) AS s(shard)
    CROSS JOIN LATERAL (
        SELECT next_run_at FROM schedules_schedulecursor
        WHERE shard = s.shard AND next_run_at >= clock_timestamp()
          AND next_run_at < clock_timestamp() + interval '60 minutes'
    ) AS d
    GROUP BY 1
) AS due
GROUP BY minute
ORDER BY minute
"""

BACKLOG = """
SELECT count(*) FILTER (WHERE published_at IS NULL AND available_at <= clock_timestamp()),
       COALESCE(sum(cardinality(occurrence_ids)) FILTER (WHERE published_at IS NULL
                                                           AND available_at <= clock_timestamp()), 0),
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(available_at) FILTER (WHERE published_at IS NULL)), 0),
       count(*) FILTER (WHERE published_at IS NOT NULL)
FROM dispatch_outboxmessage
"""

DEAD_COUNT = "SELECT count(*) FROM dispatch_occurrence WHERE state = 'dead'"

# Per tenant: the engine's quota counters (dispatch/sql/quotas.py), busiest first, bounded.
TENANT_USAGE = """
SELECT t.id, t.slug, t.max_fires_per_second, t.max_running,
       COALESCE(b.dispatched_fires, 0), COALESCE(b.throttled_fires, 0),
       COALESCE(r.running, 0), COALESCE(r.throttled_claims, 0)
FROM tenants_tenant AS t
LEFT JOIN dispatch_tenant_fire_bucket AS b ON b.tenant_id = t.id
LEFT JOIN dispatch_tenant_running AS r ON r.tenant_id = t.id
WHERE t.schema_name <> 'public'
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
SELECT a.worker, count(*) FROM dispatch_occurrence AS o
JOIN dispatch_attempt AS a ON a.occurrence_id = o.occurrence_id AND a.scheduled_for = o.scheduled_for
     AND a.generation = o.attempt_count
WHERE o.state = 'running'
GROUP BY a.worker
"""
