"""The outbox of envelopes: written with the occurrences, claimed and stamped by the relay, settled afterwards."""

from __future__ import annotations

# The settler's two classes of stamped envelopes (dispatch/engine/settler.py): a small one holds at most this many
# fires (a steady second's envelopes hold two or three), a big one more (a burst's, full of fires). Each class has
# a partial index of its own on the stamp (dispatch/models.py), and SETTLE_PUBLISHED names the predicate literally so
# the planner matches it to its index. With one index for both, each small statement walked past every big envelope
# stamped before its own (a burst's ~3,000, their rows fetched to test the class) until the burst's were settled: the
# steady bench's settler log showed small statements 10 times slower per envelope for the six seconds after a burst
# (125 envelopes in 0.14 s against 500 in 0.05 s), its backend at 53 % of a core, and the steady backlog waiting.
SMALL_ENVELOPE_FIRES = 16
SMALL_ENVELOPE = f"cardinality(occurrence_ids) <= {SMALL_ENVELOPE_FIRES}"

# Envelopes are written by COPY (binary): one statement for a batch's envelopes, where an INSERT each was ~134,000
# statements a minute at the seed's steady rate. The other columns take their defaults (unpublished, no lease,
# created_at PostgreSQL's clock).
COPY_OUTBOX = """
COPY dispatch_outboxmessage (tenant_id, queue, available_at, priority, occurrence_ids, scheduled_fors, body)
FROM STDIN (FORMAT BINARY)
"""
COPY_OUTBOX_TYPES = ["int8", "varchar", "timestamptz", "int2", "uuid[]", "timestamptz[]", "bytea"]

# --- relay ----------------------------------------------------------------------------------------------------

# The relay's claim (fair shares per tenant, within each tenant's fire rate) is in dispatch/sql/quotas.py.

# Relays that are connected now, by the application_name each gives its connection (its process name). A relay's
# lease on an envelope names it; a lease of a relay that is no longer connected (killed, its host gone) is taken
# over at once instead of after its expiry. Behind a pooler that hides application names, the expiry still holds.
LIVE_RELAYS = """
SELECT application_name FROM pg_stat_activity
WHERE datname = current_database() AND application_name IS NOT NULL AND application_name <> ''
"""

# An envelope (alias m) a relay may claim now: unpublished, due within the staging lead, past the backoff of its
# last refused publish, and not leased to another live relay. Its own lease (`owner`) is stale by definition: a
# relay claims between steps, and what an earlier step of the same name left leased was never stamped. A relay
# that claims nothing sleeps until the earliest of these conditions changes (SECONDS_UNTIL_DUE), never polls them.
# The bound on available_at is a scalar subquery, read once per statement: a volatile clock_timestamp() compared to
# the column directly can be no index condition, so the reservation read the whole outbox (a sequential scan, 80,000
# rows for 1,300 due) and the per-tenant claim walked each tenant's materialized future (the filter never ends an
# ordered scan). As a subquery it bounds the outbox_due ranges, and each scan stops at the first envelope not due.
CLAIMABLE = (
    """m.published_at IS NULL
      AND m.available_at <= (SELECT clock_timestamp() + make_interval(secs => %(lead)s))
      AND (m.retry_at IS NULL OR m.retry_at <= clock_timestamp())
      AND (m.lease_owner IS NULL OR m.lease_owner = %(owner)s OR m.lease_expires_at < clock_timestamp()
           OR m.lease_owner <> ALL ("""
    + LIVE_RELAYS
    + """))"""
)

# The end of a claim, in one short statement after the publishes, outside any transaction that spanned them: each
# envelope still leased to this relay is stamped with its broker confirmation (one row per envelope at the hot
# instant instead of one UPDATE per occurrence, docs/DESIGN.md "Envelopes"), or handed back: a refused publish
# (nacked or returned by the broker) backs off on its own, capped exponentially and jittered, persisted on the row
# so every relay honours it; an envelope that was not tried or failed with the connection goes back as it was.
# A row whose lease another relay took over meanwhile is left alone: that relay publishes it again under the same
# occurrence ids (the intended at-least-once). Returns the ids stamped.
FINISH_CLAIM = """
UPDATE dispatch_outboxmessage AS m
SET published_at = u.published_at, lease_owner = NULL, lease_expires_at = NULL,
    publish_failures = CASE WHEN u.refused THEN m.publish_failures + 1 ELSE m.publish_failures END,
    retry_at = CASE WHEN u.refused
                    THEN clock_timestamp() + make_interval(secs => LEAST(%(backoff_max)s,
                         %(backoff_first)s * 2 ^ LEAST(m.publish_failures, 30)) * (0.5 + random() / 2))
                    ELSE m.retry_at END
FROM unnest(%(ids)s::bigint[], %(published_ats)s::timestamptz[], %(refused)s::bool[]) AS u(id, published_at, refused)
WHERE m.id = u.id AND m.lease_owner = %(owner)s AND m.published_at IS NULL
RETURNING m.id, u.published_at IS NOT NULL
"""

# Seconds until the relay may have something to claim, on PostgreSQL's clock (zero or negative: now): the earliest
# unpublished envelope's entry into the staging lead, its backoff's end, or the expiry of a live relay's lease on it.
# The expression has no index order, so the scan is bounded: the earliest thousand due (outbox_due) decide.
SECONDS_UNTIL_DUE = (
    """
SELECT EXTRACT(EPOCH FROM (min(GREATEST(
           m.available_at - make_interval(secs => %(lead)s),
           m.retry_at,
           CASE WHEN m.lease_owner IS NOT NULL AND m.lease_owner <> %(owner)s
                     AND m.lease_owner = ANY (ARRAY("""
    + LIVE_RELAYS
    + """)) THEN m.lease_expires_at END)) - clock_timestamp()))
FROM (SELECT available_at, retry_at, lease_owner, lease_expires_at FROM dispatch_outboxmessage
      WHERE published_at IS NULL ORDER BY available_at LIMIT 1000) AS m
"""
)

# Staging: the relay claims envelopes due within the next second or so and releases them at their instant.
# An update, pause or cancel bumps this sequence when it withdraws occurrences; reading it takes no lock.
BUMP_INVALIDATION = "SELECT nextval('dispatch_invalidation_seq')"

INVALIDATION_MARK = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM dispatch_invalidation_seq"

# Staged envelopes none of whose occurrences can still run (all withdrawn while staged), or whose row is gone (its
# tenant deleted): dropped unpublished. Partly withdrawn envelopes are published; the worker's claim is the
# authority for each occurrence.
WITHDRAWN_ENVELOPES = """
SELECT s.id FROM unnest(%(ids)s::bigint[]) AS s(id)
LEFT JOIN dispatch_outboxmessage AS m ON m.id = s.id
WHERE m.id IS NULL OR NOT EXISTS (
    SELECT 1 FROM unnest(m.occurrence_ids, m.scheduled_fors) AS u(occurrence_id, scheduled_for)
    JOIN dispatch_occurrence AS o ON o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
    WHERE o.state IN ('scheduled', 'enqueued', 'retry_wait'))
"""

DELETE_ENVELOPES = "DELETE FROM dispatch_outboxmessage WHERE id = ANY(%(ids)s::bigint[])"

# --- envelopes of deleted tenants -------------------------------------------------------------------------------

# Withdraw every envelope of the given tenants that no longer exist (`tenant_ids` is checked again here, so a
# tenant that is alive is never touched) and cancel their occurrences that no worker claimed yet, with `reason`.
# The relay runs it for envelopes of a tenant it meets in its demand without a tenant row (a row a writer committed
# after the tenant's deletion): it withdraws them instead of counting them due for ever. Occurrences are locked in
# primary-key order (dispatch/sql/__init__.py). Returns (envelopes, occurrences canceled).
WITHDRAW_ORPHAN_ENVELOPES = """
WITH gone AS (
    DELETE FROM dispatch_outboxmessage AS m
    WHERE m.tenant_id = ANY(%(tenant_ids)s::bigint[])
      AND NOT EXISTS (SELECT 1 FROM tenants_tenant AS t WHERE t.id = m.tenant_id)
    RETURNING m.occurrence_ids, m.scheduled_fors
), members AS (
    SELECT u.occurrence_id, u.scheduled_for
    FROM gone, unnest(gone.occurrence_ids, gone.scheduled_fors) AS u(occurrence_id, scheduled_for)
), locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN members AS x ON o.occurrence_id = x.occurrence_id AND o.scheduled_for = x.scheduled_for
    WHERE o.state IN ('scheduled', 'enqueued', 'retry_wait')
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), canceled AS (
    UPDATE dispatch_occurrence AS o
    SET state = 'canceled', finished_at = clock_timestamp(), state_reason = %(reason)s
    FROM locked AS x
    WHERE o.occurrence_id = x.occurrence_id AND o.scheduled_for = x.scheduled_for
      AND o.state IN ('scheduled', 'enqueued', 'retry_wait')
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM canceled)
"""

# Settling copies an envelope's confirmation time onto its occurrences after the hot instant: scheduled →
# enqueued (a worker may already have moved it further; then only enqueued_at is filled), with the envelope's
# throttled mark, then the envelope row goes. The (occurrence_id, scheduled_for) pair lets PostgreSQL prune to one
# partition per row.
# Only envelopes stamped at least `min_age` seconds ago are taken (the settler's SETTLE_AFTER_SECONDS; 0 settles all):
# by then a worker has usually completed the occurrence and, finding the envelope stamped, filled enqueued_at and the
# throttled mark itself in its completion (dispatch/sql/claims.py COMPLETE_MANY): such a row is neither locked nor
# written again here. Only rows still without the stamp (or its throttled mark) as of this statement's snapshot are
# locked, in primary-key order as the workers' batched completion locks them (many-row updates of the same rows in
# different orders deadlock), and the lock returns each one's newest version: one a completion filled meanwhile is
# left as it is, and counted from that version. The rows to lock go through arrays
# (`pending`): joined to the CTE `seen` directly, PostgreSQL misjudged its size and read the whole day partition for
# them (2.2 s a statement, measured on the steady bench's database); from unnest it probes the primary key. The
# arrays go in as scalar subqueries (parameters of the plan), not as columns of a lateral join: as columns, each
# unnested row carried all four arrays through the sort that orders the locks, and a few hundred rows spilled
# megabytes to temporary files (auto_explain on the steady bench: 10 MB written per statement, ~200 ms). An
# occurrence in two of the settled envelopes (a retry's beside its first) is locked once, with the earlier stamp.
# The same statement keeps the enqueue lag histogram (dispatch/counters.py SCHEDULE_LAG and its kin): it visits each
# occurrence once anyway. Only an occurrence's FIRST publish counts: its enqueued_at is this envelope's stamp (a
# retry's or replay's envelope leaves the first stamp in place and is not counted again), as lag = confirmation - the
# envelope's release instant. Rows are aggregated per lane, throttled mark, tenant series and bucket before any JSON
# label is built (one jsonb_build_object per occurrence cost ~30 ms per statement), then added to the stored totals
# in (name, labels) order like every other writer. `bounds` are the buckets' upper bounds and `les` their labels,
# "+Inf" last. Returns the number of the envelopes' occurrences found, and each settled envelope's settle lag (now -
# its confirmation stamp, seconds) for the settler's own histogram, and how many of them were big (below).
# Envelopes are taken oldest stamp first in two classes, each with a batch of its own (dispatch/engine/settler.py):
# up to `limit` small ones (SMALL_ENVELOPE, at the top of this module) and up to `big_limit` big ones, each class
# read through its own partial index. Taken in one line, a 100,000-fire burst's envelopes were 100,000 rows
# to write ahead of every envelope stamped after them: the steady envelopes of every other tenant waited seconds
# behind them (the steady bench: settle lag p99 6.9 s, max 5.5 s). Now a burst's envelopes are settled beside the
# steady ones, and while they wait the workers complete many of their fires and copy the stamp themselves
# (COMPLETE_MANY), which leaves nothing here to write for those rows.
SETTLE_PUBLISHED = (
    """
WITH small AS (
    SELECT id FROM dispatch_outboxmessage
    WHERE published_at IS NOT NULL AND published_at <= clock_timestamp() - make_interval(secs => %(min_age)s)
      AND """
    + SMALL_ENVELOPE
    + """
    ORDER BY published_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), big AS (
    SELECT id FROM dispatch_outboxmessage
    WHERE published_at IS NOT NULL AND published_at <= clock_timestamp() - make_interval(secs => %(min_age)s)
      AND NOT """
    + SMALL_ENVELOPE
    + """
    ORDER BY published_at LIMIT %(big_limit)s FOR UPDATE SKIP LOCKED
), settled AS (
    DELETE FROM dispatch_outboxmessage
    WHERE id IN (SELECT id FROM small UNION ALL SELECT id FROM big)
    RETURNING occurrence_ids, scheduled_fors, published_at, available_at, throttled
), members AS (
    SELECT u.occurrence_id, u.scheduled_for, settled.published_at, settled.available_at AS released_at,
           settled.throttled
    FROM settled, unnest(settled.occurrence_ids, settled.scheduled_fors) AS u(occurrence_id, scheduled_for)
), seen AS (
    SELECT o.occurrence_id, o.scheduled_for, o.lane, o.tenant_id, o.enqueued_at,
           members.published_at, members.released_at, members.throttled,
           o.enqueued_at IS NULL OR o.state = 'scheduled' OR (members.throttled AND NOT o.throttled) AS unsettled
    FROM dispatch_occurrence AS o
    JOIN members ON o.occurrence_id = members.occurrence_id AND o.scheduled_for = members.scheduled_for
), pending AS (
    SELECT array_agg(occurrence_id) AS ids, array_agg(scheduled_for) AS fors, array_agg(published_at) AS stamps,
           array_agg(throttled) AS marks
    FROM (SELECT DISTINCT ON (occurrence_id, scheduled_for) occurrence_id, scheduled_for, published_at, throttled
          FROM seen WHERE unsettled
          ORDER BY occurrence_id, scheduled_for, published_at) AS first_stamp
), locked AS (
    SELECT o.occurrence_id, o.scheduled_for, o.enqueued_at, u.published_at, u.throttled
    FROM unnest((SELECT ids FROM pending), (SELECT fors FROM pending), (SELECT stamps FROM pending),
                (SELECT marks FROM pending)) AS u(occurrence_id, scheduled_for, published_at, throttled)
    JOIN dispatch_occurrence AS o ON o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), moved AS (
    UPDATE dispatch_occurrence AS o
    SET state = CASE WHEN o.state = 'scheduled' THEN 'enqueued' ELSE o.state END,
        enqueued_at = COALESCE(o.enqueued_at, locked.published_at),
        throttled = o.throttled OR locked.throttled
    FROM locked
    WHERE o.occurrence_id = locked.occurrence_id AND o.scheduled_for = locked.scheduled_for
      AND (o.enqueued_at IS NULL OR o.state = 'scheduled' OR (locked.throttled AND NOT o.throttled))
    RETURNING o.occurrence_id, o.scheduled_for, o.enqueued_at
), firsts AS (
    SELECT seen.lane, seen.tenant_id, seen.throttled,
           GREATEST(0, EXTRACT(EPOCH FROM seen.published_at - seen.released_at))::float8 AS lag
    FROM seen
    LEFT JOIN locked ON locked.occurrence_id = seen.occurrence_id AND locked.scheduled_for = seen.scheduled_for
    LEFT JOIN moved ON moved.occurrence_id = seen.occurrence_id AND moved.scheduled_for = seen.scheduled_for
    WHERE COALESCE(moved.enqueued_at, locked.enqueued_at, seen.enqueued_at) = seen.published_at
), bucketed AS (
    SELECT m.lane, m.throttled, m.tenant_id, m.lag,
           1 + (SELECT count(*) FROM unnest(%(bounds)s::float8[]) AS b(bound) WHERE b.bound < m.lag)::int AS bucket
    FROM firsts AS m
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
    RETURNING 1
), written AS (
    -- Read before the clock below: a data-modifying CTE the outer query does not read runs after it, so the settle
    -- lags were taken before the row locks were waited for and the rows written, up to a second too early. (The
    -- watch trigger and the commit still come after the clock.)
    SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM added) AS n
)
SELECT (SELECT count(*) FROM seen),
       (SELECT array_agg(EXTRACT(EPOCH FROM clock_timestamp() - s.published_at)::float8) FROM settled AS s, written),
       (SELECT count(*) FROM settled WHERE NOT """
    + SMALL_ENVELOPE
    + """),
       -- How long the statement held and waited for its row locks, on the server: the settler sizes its next batch
       -- by this rather than by its own wait for the result (dispatch/engine/settler.py).
       (SELECT EXTRACT(EPOCH FROM clock_timestamp() - statement_timestamp())::float8 FROM written)
"""
)

# A deleted tenant's occurrences that have not ended: canceled with `reason`, running ones included (tenants/services.py
# delete_tenant decides why: the reaper and the workers' renewals join the schedule, which is gone with the tenant,
# so a run left behind would stay `running` for ever). Their open attempts are closed with the same reason; the
# worker still running one finds its lease gone and its completion refused (fenced). Found through the tenant's
# schedules (occurrence_schedule_recent), so the cost follows the tenant's size, not the table's. Locked in
# primary-key order like every writer of many occurrences (dispatch/sql/__init__.py).
CANCEL_TENANT_OCCURRENCES = """
WITH locked AS (
    SELECT o.occurrence_id, o.scheduled_for, o.state FROM dispatch_occurrence AS o
    WHERE o.schedule_id = ANY(%(schedule_ids)s::uuid[])
      AND o.state IN ('scheduled', 'enqueued', 'running', 'retry_wait')
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), canceled AS (
    UPDATE dispatch_occurrence AS o
    SET state = 'canceled', finished_at = clock_timestamp(), state_reason = %(reason)s, lease_expires_at = NULL
    FROM locked AS x
    WHERE o.occurrence_id = x.occurrence_id AND o.scheduled_for = x.scheduled_for
    RETURNING o.occurrence_id, o.scheduled_for, x.state AS was
), closed AS (
    UPDATE dispatch_attempt AS a
    SET finished_at = clock_timestamp(), outcome = 'canceled', error = %(reason)s
    FROM canceled AS c
    WHERE c.was = 'running' AND a.occurrence_id = c.occurrence_id AND a.scheduled_for = c.scheduled_for
      AND a.finished_at IS NULL
)
SELECT count(*), count(*) FILTER (WHERE was = 'running') FROM canceled
"""
