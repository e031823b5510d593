"""Tenant quotas of the data plane: the dispatch token bucket (relays), the running count (workers) and the
catch-up rate (materializers, owed fires, backfill). Tables in dispatch/migrations/0008_tenant_quotas.py.

Each counter row is changed by one conditional statement, and where a transaction goes on after taking one, it
takes no lock another transaction could hold (its own occurrence row aside): a holder of a counter row never waits
for an occurrence row, so these locks cannot close a cycle with the claim and completion locks (dispatch/sql/claims.py).
Rows of several tenants are always taken in tenant_id order, so two processes never hold them crosswise.
"""

from __future__ import annotations

from dispatch.sql.outbox import CLAIMABLE

# --- max_fires_per_second: the relays' shared token bucket ---------------------------------------------------

# One step's demand and grant, in one short transaction of its own (bucket rows locked only until its commit, never
# while messages are in flight). Demand: per tenant, the fires of the unpublished envelopes due within the staging
# lead, and the envelopes per lane (the fair shares are cut from these). Grant: the bucket is refilled at the
# tenant's rate for the time since its last refill (capped at one second's worth, the burst), then gives
# min(wanted, tokens) when it holds any. A tenant's first step creates its row full. RETURNING can show only new
# values, so the grant is stored in last_granted by the same SET and read back from there.
# Tokens granted ahead of the instant are spent AT the instant: refilled_at moves to the earliest release instant
# of the demand, so the bucket does not refill during the lead (a second relay staging the same burst gets nothing
# more, and the burst at the instant is one second's worth, not two).
# Demand counts only what this relay could claim now (dispatch/sql/outbox.py CLAIMABLE). A tenant in the demand
# without a tenant row (deleted; its envelopes written by a race) is returned with `orphaned` set and no grant: the
# relay withdraws its envelopes (WITHDRAW_ORPHAN_ENVELOPES) instead of counting them due for ever.
RESERVE_FIRES = (
    """
WITH clock AS (SELECT clock_timestamp() AS now),
demand AS (
    SELECT m.tenant_id,
           sum(cardinality(m.occurrence_ids))::bigint AS wanted,
           count(*) FILTER (WHERE m.queue = %(strict_queue)s)::int AS strict_envelopes,
           count(*) FILTER (WHERE m.queue <> %(strict_queue)s)::int AS flexible_envelopes,
           GREATEST(min(clock.now), min(m.available_at)) AS first_release
    FROM dispatch_outboxmessage AS m, clock
    WHERE """
    + CLAIMABLE
    + """
    GROUP BY m.tenant_id
),
reserved AS (
    INSERT INTO dispatch_tenant_fire_bucket AS b (tenant_id, tokens, refilled_at, rate, wanted, last_granted)
    SELECT d.tenant_id, t.max_fires_per_second - LEAST(d.wanted, t.max_fires_per_second), d.first_release,
           t.max_fires_per_second, d.wanted, LEAST(d.wanted, t.max_fires_per_second)
    FROM demand AS d JOIN tenants_tenant AS t ON t.id = d.tenant_id
    ORDER BY d.tenant_id
    ON CONFLICT (tenant_id) DO UPDATE SET
        tokens = LEAST(EXCLUDED.rate, b.tokens + EXCLUDED.rate
                       * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.refilled_at)))
                 - LEAST(EXCLUDED.wanted, GREATEST(0, LEAST(EXCLUDED.rate, b.tokens + EXCLUDED.rate
                       * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.refilled_at))))::bigint),
        last_granted = LEAST(EXCLUDED.wanted, GREATEST(0, LEAST(EXCLUDED.rate, b.tokens + EXCLUDED.rate
                       * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.refilled_at))))::bigint),
        refilled_at = GREATEST(b.refilled_at, EXCLUDED.refilled_at), rate = EXCLUDED.rate, wanted = EXCLUDED.wanted
    RETURNING b.tenant_id, b.last_granted, b.tokens, b.rate, b.refilled_at
)
SELECT d.tenant_id, t.id IS NULL AS orphaned, d.wanted, COALESCE(r.last_granted, 0), COALESCE(t.fairness_weight, 1),
       d.strict_envelopes, d.flexible_envelopes,
       CASE WHEN r.tokens IS NULL OR r.tokens > 0 THEN 0
            ELSE GREATEST(0, EXTRACT(EPOCH FROM r.refilled_at - clock_timestamp()))
                 + (1 - r.tokens) / GREATEST(r.rate, 1) END AS refill_seconds
FROM demand AS d
LEFT JOIN reserved AS r ON r.tenant_id = d.tenant_id
LEFT JOIN tenants_tenant AS t ON t.id = d.tenant_id
ORDER BY d.tenant_id
"""
)

# Envelopes already due whose tenant got no tokens this step are marked throttled, once, with their occurrences,
# and their fires counted on the bucket: the occurrences' lateness is the tenant's own quota (the claim's misfire
# rule does not count it, and it is reported apart from the platform's lag). Its own transaction, after the
# reservation's commit: it may wait on an occurrence row (an API change), and must not hold a bucket row then.
# SKIP LOCKED: an envelope another relay holds is that relay's to publish; this never waits on it.
MARK_THROTTLED = """
WITH marked AS (
    UPDATE dispatch_outboxmessage AS m SET throttled = true
    WHERE m.id IN (
        SELECT id FROM dispatch_outboxmessage
        WHERE tenant_id = ANY(%(tenant_ids)s::bigint[]) AND published_at IS NULL
          AND available_at <= clock_timestamp() AND NOT throttled
        FOR UPDATE SKIP LOCKED)
    RETURNING m.tenant_id, m.occurrence_ids, m.scheduled_fors
), members AS (
    SELECT u.occurrence_id, u.scheduled_for
    FROM marked, unnest(marked.occurrence_ids, marked.scheduled_fors) AS u(occurrence_id, scheduled_for)
), locked AS (
    -- Primary-key order, like every statement that changes many occurrences (dispatch/sql/__init__.py).
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN members AS x ON o.occurrence_id = x.occurrence_id AND o.scheduled_for = x.scheduled_for
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), flagged AS (
    UPDATE dispatch_occurrence AS o SET throttled = true
    FROM locked AS x
    WHERE o.occurrence_id = x.occurrence_id AND o.scheduled_for = x.scheduled_for
)
UPDATE dispatch_tenant_fire_bucket AS b SET throttled_fires = b.throttled_fires + s.fires
FROM (SELECT tenant_id, sum(cardinality(occurrence_ids)) AS fires FROM marked GROUP BY tenant_id
      ORDER BY tenant_id) AS s
WHERE b.tenant_id = s.tenant_id
"""

# The fair claim of one lane: per tenant, its share of the batch (computed by the relay from the weights), its
# claimable envelopes due within the lead in (time, priority) order, leased to this relay (`owner`) for `lease`
# seconds. The per-tenant LATERAL with its own LIMIT is what makes it fair: one ORDER BY over all tenants would
# hand a whole batch to whoever materialized first. SKIP LOCKED inside the LATERAL, before the LIMIT: a second relay
# claiming at the same moment takes the next envelopes of the same tenant instead of none; once committed, the
# lease keeps them apart (CLAIMABLE) while no transaction is open. Served by outbox_due_by_tenant (queue,
# tenant_id, available_at, priority DESC, id); the lease columns are in no index, so the update can stay HOT. The
# chosen rows are updated through an array of their ids, one primary-key probe each: joined to the CTE (estimated at
# every tenant's full share), PostgreSQL hashed a sequential scan of the whole outbox for them (auto_explain on the
# steady bench: 77,000 rows read to lease 1,279).
CLAIM_FAIR_SHARES = (
    """
WITH chosen AS (
    SELECT c.id
    FROM unnest(%(tenant_ids)s::bigint[], %(shares)s::int[]) AS g(tenant_id, share)
    CROSS JOIN LATERAL (
        SELECT m.id FROM dispatch_outboxmessage AS m
        WHERE m.queue = %(queue)s AND m.tenant_id = g.tenant_id AND """
    + CLAIMABLE
    + """
        ORDER BY m.available_at, m.priority DESC, m.id
        LIMIT g.share
        FOR UPDATE SKIP LOCKED
    ) AS c
)
UPDATE dispatch_outboxmessage AS m
SET lease_owner = %(owner)s, lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE m.id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING m.id, m.queue, m.priority, m.body, cardinality(m.occurrence_ids), m.available_at, m.tenant_id
"""
)

# After the step's commit: tokens granted but not used go back (an envelope larger than the rest of a grant was
# still sent whole, so `unused` may be negative: the bucket goes into debt and refills from there).
RETURN_TOKENS = """
UPDATE dispatch_tenant_fire_bucket AS b
SET tokens = LEAST(b.rate, b.tokens + u.unused), dispatched_fires = b.dispatched_fires + u.used
FROM unnest(%(tenant_ids)s::bigint[], %(unused)s::bigint[], %(used)s::bigint[]) AS u(tenant_id, unused, used)
WHERE b.tenant_id = u.tenant_id
"""

# --- max_running: the workers' shared running count ----------------------------------------------------------

# Take a running slot for a claim, before its state change: what the claim does while holding the counter row
# (the conditional UPDATE of its own occurrence row, the attempt insert keyed by it, or parking it) waits on no one.
# No row returned: the tenant is at its quota. max_running = 0 means unlimited (the count is still kept, for the
# console and metrics).
TAKE_RUNNING_SLOT = """
INSERT INTO dispatch_tenant_running AS r (tenant_id, running)
VALUES (%(tenant_id)s, 1)
ON CONFLICT (tenant_id) DO UPDATE SET running = r.running + 1
WHERE r.running < COALESCE((SELECT NULLIF(t.max_running, 0) FROM tenants_tenant AS t WHERE t.id = r.tenant_id),
                           2147483647)
RETURNING r.running
"""

# TAKE_RUNNING_SLOT for up to `wanted` occurrences of each tenant of a message at once (an envelope's claims, or a
# bundle's, dispatch/engine/claims.py `_within_running_quota`): as many as each quota has room for, in one
# statement, the rows taken in tenant_id order (the ORDER BY of the insert's source). RETURNING shows only new
# values, so the number granted is stored in last_taken by the same SET and read back from there (as RESERVE_FIRES
# does with last_granted); EXCLUDED.running is LEAST(wanted, cap), so the update takes LEAST(wanted, cap - running).
_RUNNING_CAP = (
    "(SELECT COALESCE(NULLIF(t.max_running, 0), 2147483647) FROM tenants_tenant AS t WHERE t.id = r.tenant_id)"
)
TAKE_RUNNING_SLOTS_MANY = (
    """
INSERT INTO dispatch_tenant_running AS r (tenant_id, running, last_taken)
SELECT t.id, LEAST(w.wanted, c.cap), LEAST(w.wanted, c.cap)
FROM unnest(%(tenant_ids)s::bigint[], %(wanted)s::int[]) AS w(tenant_id, wanted)
JOIN tenants_tenant AS t ON t.id = w.tenant_id
CROSS JOIN LATERAL (SELECT COALESCE(NULLIF(t.max_running, 0), 2147483647) AS cap) AS c
ORDER BY t.id
ON CONFLICT (tenant_id) DO UPDATE SET
    running = r.running + LEAST(EXCLUDED.running, GREATEST(0, """
    + _RUNNING_CAP
    + """ - r.running)),
    last_taken = LEAST(EXCLUDED.running, GREATEST(0, """
    + _RUNNING_CAP
    + """ - r.running))
RETURNING r.tenant_id, r.last_taken
"""
)

# A claim refused by the quota is counted (the console shows it per tenant). Its own short statement.
COUNT_THROTTLED_CLAIM = """
UPDATE dispatch_tenant_running SET throttled_claims = throttled_claims + 1 WHERE tenant_id = %(tenant_id)s
"""

# A transaction that both gives back and takes slots (a claim batch ending expired runs) locks every counter row it
# will touch first, in tenant_id order: each of its two statements keeps that order, but one after the other they
# need not (give back tenant 9, then take tenant 3).
LOCK_RUNNING_ROWS = """
SELECT tenant_id FROM dispatch_tenant_running WHERE tenant_id = ANY(%(tenant_ids)s::bigint[])
ORDER BY tenant_id
FOR UPDATE
"""

# Give back running slots, per tenant, in the transaction that moved the occurrences out of `running` (a
# completion, a side exit over an expired lease, the reaper), as its last statement.
# The rows are locked first in tenant_id order (`locked`), the order TAKE_RUNNING_SLOTS_MANY's INSERT takes them in:
# an UPDATE ... FROM locks rows in the order its join produces them, and a completion giving back slots of several
# tenants deadlocked against a claim taking slots of the same tenants (`bench steady`, 1,000 tenants, bundles).
RELEASE_RUNNING_SLOTS = """
WITH u AS (
    SELECT * FROM unnest(%(tenant_ids)s::bigint[], %(slots)s::int[]) AS x(tenant_id, slots)
), locked AS (
    SELECT r.tenant_id FROM dispatch_tenant_running AS r
    JOIN u ON u.tenant_id = r.tenant_id
    ORDER BY r.tenant_id
    FOR UPDATE OF r
)
UPDATE dispatch_tenant_running AS r SET running = GREATEST(0, r.running - u.slots)
FROM locked JOIN u ON u.tenant_id = locked.tenant_id
WHERE r.tenant_id = locked.tenant_id
"""

# --- max_catchup_per_minute: one budget per tenant and minute ------------------------------------------------

# The minute's row, created empty if it is new, locked either way, and how much of it is used: the no-op DO UPDATE
# is what locks an existing row and returns its latest value. The caller takes what it needs and writes it back in
# the same transaction (held to commit; callers take tenants in tenant_id order).
LOCK_CATCHUP_WINDOW = """
INSERT INTO dispatch_tenant_catchup_window AS w (tenant_id, window_start, used)
VALUES (%(tenant_id)s, %(window)s, 0)
ON CONFLICT (tenant_id, window_start) DO UPDATE SET used = w.used
RETURNING w.used
"""

SET_CATCHUP_WINDOW = """
UPDATE dispatch_tenant_catchup_window SET used = %(used)s
WHERE tenant_id = %(tenant_id)s AND window_start = %(window)s
"""

# Minutes long past: dropped by the lease reaper's pass, like the retry windows.
PRUNE_CATCHUP_WINDOWS = """
DELETE FROM dispatch_tenant_catchup_window
WHERE window_start < clock_timestamp() - make_interval(secs => %(keep)s)
"""

# --- a deleted tenant ------------------------------------------------------------------------------------------

# The per-tenant engine rows of tenants that no longer exist: fire bucket, running count, catch-up and retry
# windows, the lag-series ranking, and the schedule counter the control plane keeps. Run by the tenant deletion
# (after the tenant row is gone, in its transaction) and by the relay for tenants it finds orphaned (a bucket row a
# reservation wrote in a race with the deletion). The NOT EXISTS keeps it from ever touching a live tenant.
FORGET_DELETED_TENANTS = """
WITH gone AS (
    SELECT x.tenant_id FROM unnest(%(tenant_ids)s::bigint[]) AS x(tenant_id)
    WHERE NOT EXISTS (SELECT 1 FROM tenants_tenant AS t WHERE t.id = x.tenant_id)
), bucket AS (
    DELETE FROM dispatch_tenant_fire_bucket WHERE tenant_id IN (SELECT tenant_id FROM gone)
), running AS (
    DELETE FROM dispatch_tenant_running WHERE tenant_id IN (SELECT tenant_id FROM gone)
), catchup AS (
    DELETE FROM dispatch_tenant_catchup_window WHERE tenant_id IN (SELECT tenant_id FROM gone)
), retries AS (
    DELETE FROM dispatch_tenant_retry_window WHERE tenant_id IN (SELECT tenant_id FROM gone)
), series AS (
    DELETE FROM dispatch_metric_tenant_series WHERE tenant_id IN (SELECT tenant_id FROM gone)
), held AS (
    DELETE FROM schedules_tenant_schedule_count WHERE tenant_id IN (SELECT tenant_id FROM gone)
)
SELECT count(*) FROM gone
"""

# The console's tenant list: each tenant row's engine counters as columns of its query (one primary-key probe per
# tenant on the page), so the list sorts by them. `tenants_tenant.id` is the outer query's row.
TENANT_RUNNING_COLUMN = (
    "COALESCE((SELECT running FROM dispatch_tenant_running r WHERE r.tenant_id = tenants_tenant.id), 0)"
)
TENANT_THROTTLED_CLAIMS_COLUMN = (
    "COALESCE((SELECT throttled_claims FROM dispatch_tenant_running r WHERE r.tenant_id = tenants_tenant.id), 0)"
)
TENANT_THROTTLED_FIRES_COLUMN = (
    "COALESCE((SELECT throttled_fires FROM dispatch_tenant_fire_bucket b WHERE b.tenant_id = tenants_tenant.id), 0)"
)
