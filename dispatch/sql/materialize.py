"""Materialization: read due schedule cursors, write occurrences, advance the cursors (ARCHITECTURE rule 3).

Conventions (all of dispatch/sql/): every statement is one round trip for a whole batch (arrays in, `unnest`
inside); rows are claimed with `FOR UPDATE SKIP LOCKED` so concurrent processes split work instead of queueing on
locks; "now" is `clock_timestamp()` (PostgreSQL's clock, the one every node agrees on), never a process clock.
"""

from __future__ import annotations

# One ordered index range per shard (schedule_due_by_shard: (shard, next_run_at) WHERE state = 'active'), read
# through LATERAL with a per-shard LIMIT. A single `shard = ANY(...) ORDER BY next_run_at` looks simpler but makes
# PostgreSQL read and sort every due row of every shard for each batch: quadratic in a top-of-hour burst (measured:
# 500,000 due rows took over three minutes). Idle schedules (next_run_at far ahead) and inactive ones cost nothing.
# SKIP LOCKED: a row an API call is changing is picked up next batch instead of waiting on it.
# The lateral names only the columns planning needs: `SELECT *` carried whole rows (payload and all, ~2.6 kB
# each) through its sort. The tenant's catch-up quota is a scalar subquery, not a join: with a join the planner
# (which takes the tenant table for one row) looped over the tenants outside the shard scans, so each batch scanned
# and locked every due schedule of the leased shards once per tenant before LIMIT could stop it (EXPLAIN ANALYZE at
# 100,000 due: 36,000 rows locked for a batch of 2,000, 146 ms).
SCAN_DUE_SCHEDULES = """
SELECT s.id, s.tenant_id, s.kind, s.cron, s.run_at, s.timezone, s.version, s.next_run_at, s.lane,
       s.flexible_window_seconds, s.priority, s.misfire_policy, s.max_lateness_seconds, s.catchup_limit,
       (SELECT t.max_catchup_per_minute FROM tenants_tenant AS t WHERE t.id = s.tenant_id)
FROM unnest(%(shards)s::int[]) AS mine(shard)
CROSS JOIN LATERAL (
    SELECT due.id, due.tenant_id, due.kind, due.cron, due.run_at, due.timezone, due.version, due.next_run_at,
           due.lane, due.flexible_window_seconds, due.priority, due.misfire_policy, due.max_lateness_seconds,
           due.catchup_limit
    FROM schedules_schedule AS due
    WHERE due.shard = mine.shard AND due.state = 'active' AND due.next_run_at IS NOT NULL
      AND due.next_run_at <= %(horizon_end)s
    ORDER BY due.next_run_at
    LIMIT %(per_shard)s
    FOR UPDATE SKIP LOCKED
) AS s
LIMIT %(limit)s
"""

# ON CONFLICT DO NOTHING on the unique fire (schedule, version, scheduled_for): a second materializer during a
# lease hand-over, a backfill or a replayed batch meets the existing row. RETURNING tells which rows are new, so
# only those get outbox entries. state_reason says why a fire was missed ('' on the ordinary path).
INSERT_OCCURRENCES = """
INSERT INTO dispatch_occurrence (
    occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, available_at, lane, priority,
    manual, state, state_reason, attempt_count, finished_at, created_at)
SELECT u.occurrence_id, u.schedule_id, u.tenant_id, u.version, u.scheduled_for, u.available_at, u.lane,
       u.priority, false, u.state, u.state_reason, 0,
       CASE WHEN u.state = 'missed' THEN %(now)s::timestamptz END, %(now)s::timestamptz
FROM unnest(%(occurrence_ids)s::uuid[], %(schedule_ids)s::uuid[], %(tenant_ids)s::bigint[], %(versions)s::int[],
            %(scheduled_fors)s::timestamptz[], %(available_ats)s::timestamptz[], %(lanes)s::text[],
            %(priorities)s::smallint[], %(states)s::text[], %(state_reasons)s::text[])
     AS u(occurrence_id, schedule_id, tenant_id, version, scheduled_for, available_at, lane, priority, state,
          state_reason)
ON CONFLICT DO NOTHING
RETURNING occurrence_id
"""

# A one-off whose fire was materialized keeps state 'active' (next_run_at NULL) until that occurrence is terminal:
# before that it can still be paused, it still holds its quota slot, and the API does not call it completed while it
# may never run. This pass completes those whose occurrences of the current version all ended. The candidates are
# few and found through the partial index schedule_fired_one_off; SKIP LOCKED leaves a row an API call holds.
COMPLETE_FIRED_ONE_OFFS = """
UPDATE schedules_schedule AS s SET state = 'completed', updated_at = clock_timestamp()
WHERE s.id IN (
    -- The "ended" test comes before the LIMIT: one-offs still running must not fill every pass's page.
    SELECT c.id FROM schedules_schedule AS c
    WHERE c.state = 'active' AND c.next_run_at IS NULL AND c.kind = 'once'
      AND NOT EXISTS (
        SELECT 1 FROM dispatch_occurrence AS o
        WHERE o.schedule_id = c.id AND o.schedule_version = c.version
          AND o.state NOT IN ('succeeded', 'dead', 'missed', 'canceled', 'skipped_overlap'))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING s.id
"""

# Rule 3: the cursor moves only if the version and the old cursor still match, so an old node cannot move a
# cursor backwards or overwrite a newer definition's cursor. (The rows are also locked by the scan.)
ADVANCE_CURSORS = """
UPDATE schedules_schedule AS s
SET next_run_at = u.new_cursor,
    state = CASE WHEN u.completed THEN 'completed' ELSE s.state END
FROM unnest(%(ids)s::uuid[], %(versions)s::int[], %(old_cursors)s::timestamptz[],
            %(new_cursors)s::timestamptz[], %(completed)s::bool[]) AS u(id, version, old_cursor, new_cursor, completed)
WHERE s.id = u.id AND s.version = u.version AND s.next_run_at = u.old_cursor
"""
