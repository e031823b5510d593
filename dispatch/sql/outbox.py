"""The outbox of envelopes: written with the occurrences, claimed and stamped by the relay, settled afterwards."""

from __future__ import annotations

INSERT_OUTBOX = """
INSERT INTO dispatch_outboxmessage
    (tenant_id, queue, available_at, priority, occurrence_ids, scheduled_fors, body, published_at, created_at)
VALUES (%s, %s, %s, %s, %s::uuid[], %s::timestamptz[], %s, NULL, clock_timestamp())
"""

# --- relay ----------------------------------------------------------------------------------------------------

# The relay's claim (fair shares per tenant, within each tenant's fire rate) is in dispatch/sql/quotas.py.

# One row per envelope at the hot instant instead of one UPDATE per occurrence (ARCHITECTURE.md "Measured").
MARK_PUBLISHED = """
UPDATE dispatch_outboxmessage AS m SET published_at = u.published_at
FROM unnest(%(ids)s::bigint[], %(published_ats)s::timestamptz[]) AS u(id, published_at)
WHERE m.id = u.id
"""

# Seconds until the earliest unpublished envelope is due, on PostgreSQL's clock (negative: overdue).
SECONDS_UNTIL_DUE = """
SELECT EXTRACT(EPOCH FROM (min(available_at) - clock_timestamp()))
FROM dispatch_outboxmessage WHERE published_at IS NULL
"""

# Staging: the relay claims envelopes due within the next second or so and releases them at their instant.
# An update, pause or cancel bumps this sequence when it withdraws occurrences; reading it takes no lock.
BUMP_INVALIDATION = "SELECT nextval('dispatch_invalidation_seq')"

INVALIDATION_MARK = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM dispatch_invalidation_seq"

# Staged envelopes none of whose occurrences can still run (all withdrawn while staged): dropped unpublished.
# Partly withdrawn envelopes are published; the worker's claim is the authority for each occurrence.
WITHDRAWN_ENVELOPES = """
SELECT m.id FROM dispatch_outboxmessage AS m
WHERE m.id = ANY(%(ids)s::bigint[])
  AND NOT EXISTS (
    SELECT 1 FROM unnest(m.occurrence_ids, m.scheduled_fors) AS u(occurrence_id, scheduled_for)
    JOIN dispatch_occurrence AS o ON o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
    WHERE o.state IN ('scheduled', 'enqueued', 'retry_wait'))
"""

DELETE_ENVELOPES = "DELETE FROM dispatch_outboxmessage WHERE id = ANY(%(ids)s::bigint[])"

# Settling copies an envelope's confirmation time onto its occurrences after the hot instant: scheduled →
# enqueued (a worker may already have moved it further; then only enqueued_at is filled), with the envelope's
# throttled mark, then the envelope row goes. The (occurrence_id, scheduled_for) pair lets PostgreSQL prune to one
# partition per row.
# The same statement keeps the enqueue lag histogram (dispatch/counters.py SCHEDULE_LAG and its kin): it visits each
# occurrence once anyway. Only an occurrence's FIRST settle counts (after the update its enqueued_at is this
# envelope's stamp; a retry's or replay's envelope leaves the first stamp in place and is not counted again), as
# lag = confirmation - the envelope's release instant. Rows are aggregated per lane, throttled mark, tenant series
# and bucket before any JSON label is built (one jsonb_build_object per occurrence cost ~30 ms per statement), then
# added to the stored totals in (name, labels) order like every other writer. `bounds` are the buckets' upper
# bounds and `les` their labels, "+Inf" last. Returns the number of occurrences settled, and each settled envelope's
# settle lag (now - its confirmation stamp, seconds) for the settler's own histogram.
# The occurrences are locked in primary-key order first, as the workers' batched completion locks them: many-row
# updates of the same rows in different orders deadlock (dispatch/sql/claims.py COMPLETE_MANY).
SETTLE_PUBLISHED = """
WITH settled AS (
    DELETE FROM dispatch_outboxmessage
    WHERE id IN (
        SELECT id FROM dispatch_outboxmessage WHERE published_at IS NOT NULL
        ORDER BY published_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING occurrence_ids, scheduled_fors, published_at, available_at, throttled
), members AS (
    SELECT u.occurrence_id, u.scheduled_for, settled.published_at, settled.available_at AS released_at,
           settled.throttled
    FROM settled, unnest(settled.occurrence_ids, settled.scheduled_fors) AS u(occurrence_id, scheduled_for)
), locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN members ON o.occurrence_id = members.occurrence_id AND o.scheduled_for = members.scheduled_for
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), moved AS (
    UPDATE dispatch_occurrence AS o
    SET state = CASE WHEN o.state = 'scheduled' THEN 'enqueued' ELSE o.state END,
        enqueued_at = COALESCE(o.enqueued_at, members.published_at),
        throttled = o.throttled OR members.throttled
    FROM members
    JOIN locked ON locked.occurrence_id = members.occurrence_id AND locked.scheduled_for = members.scheduled_for
    WHERE o.occurrence_id = members.occurrence_id AND o.scheduled_for = members.scheduled_for
    RETURNING o.lane, o.tenant_id, members.throttled, o.enqueued_at = members.published_at AS first_publish,
              GREATEST(0, EXTRACT(EPOCH FROM members.published_at - members.released_at))::float8 AS lag
), bucketed AS (
    SELECT m.lane, m.throttled, m.tenant_id, m.lag,
           1 + (SELECT count(*) FROM unnest(%(bounds)s::float8[]) AS b(bound) WHERE b.bound < m.lag)::int AS bucket
    FROM moved AS m WHERE m.first_publish
), observed AS (
    SELECT m.lane, m.throttled, COALESCE(ts.slug, 'other') AS tenant, m.bucket, count(*) AS n, sum(m.lag) AS total
    FROM bucketed AS m
    LEFT JOIN dispatch_metric_tenant_series AS ts ON ts.tenant_id = m.tenant_id
    GROUP BY 1, 2, 3, 4
), samples AS (
    SELECT CASE WHEN throttled THEN 'scheduler_throttled_lag_seconds' ELSE 'scheduler_schedule_lag_seconds' END
               AS family, jsonb_build_object('lane', lane) AS labels, bucket, sum(n) AS n, sum(total) AS total
    FROM observed GROUP BY 1, 2, 3
    UNION ALL
    SELECT 'scheduler_tenant_schedule_lag_seconds', jsonb_build_object('lane', lane, 'tenant', tenant), bucket,
           sum(n), sum(total)
    FROM observed WHERE NOT throttled GROUP BY 1, 2, 3
), additions AS (
    SELECT family || '_bucket' AS name, labels || jsonb_build_object('le', (%(les)s::text[])[bucket]) AS labels,
           sum(n)::float8 AS delta
    FROM samples GROUP BY 1, 2
    UNION ALL
    SELECT family || '_count', labels, sum(n)::float8 FROM samples GROUP BY 1, 2
    UNION ALL
    SELECT family || '_sum', labels, sum(total)::float8 FROM samples GROUP BY 1, 2
), added AS (
    INSERT INTO dispatch_metric_counter AS c (name, labels, value)
    SELECT name, labels, delta FROM additions ORDER BY name, labels
    ON CONFLICT (name, labels) DO UPDATE SET value = c.value + EXCLUDED.value
)
SELECT (SELECT count(*) FROM moved),
       (SELECT array_agg(EXTRACT(EPOCH FROM clock_timestamp() - published_at)::float8) FROM settled)
"""
