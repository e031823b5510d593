"""Materialization: read due schedule cursors, write occurrences, advance the cursors (docs/ARCHITECTURE.md rule 3).

Conventions (all of dispatch/sql/): every statement is one round trip for a whole batch (arrays in, `unnest`
inside); rows are claimed with `FOR UPDATE SKIP LOCKED` so concurrent processes split work instead of queueing on
locks; "now" is `clock_timestamp()` (PostgreSQL's clock, the one every node agrees on), never a process clock.
"""

from __future__ import annotations

# One ordered index range per shard (cursor_due_by_shard_tenant: (shard, next_run_at, tenant_id) WHERE next_run_at IS
# NOT NULL), read through LATERAL with a per-shard LIMIT. A single `shard = ANY(...) ORDER BY next_run_at` looks
# simpler but makes PostgreSQL read and sort every due row of every shard for each batch: quadratic in a top-of-hour
# burst (measured: 500,000 due rows took over three minutes). Idle cursors (next_run_at far ahead) cost nothing;
# inactive schedules have no cursor row at all.
# At one instant each shard's range comes in tenant order, and a batch takes an equal share of every leased shard
# (dispatch/engine/materializer.py), so every shard hands the batch the same run of tenants: a burst's tenant is
# written whole by one batch, one envelope (its fires are spread over every shard by schedule id). In time order
# alone, a batch took whole shards, a fifth of every tenant's fires: a 100,000-fire burst over 1,000 tenants was
# ~6,500 envelopes of 14-33 fires, about 1 % of a steady half hour's envelopes on their own (now ~1,600 of ~56).
# Only the cursor rows are read and locked: they carry the definition the planning needs (ScheduleCursor), so the
# wide schedule table is not touched at all. SKIP LOCKED: a cursor a schedule change holds is picked up next batch
# instead of waited for (the control plane locks the schedule, then its cursor; the materializer never waits).
# The tenant's catch-up quota is a scalar subquery, not a join: with a join the planner (which takes the tenant
# table for one row) looped over the tenants outside the shard scans, so each batch scanned and locked every due
# cursor of the leased shards once per tenant before LIMIT could stop it (EXPLAIN ANALYZE at 100,000 due: 36,000
# rows locked for a batch of 2,000, 146 ms).
# The schedule id comes twice: as a uuid for the rows written, and as text, the first half of each fire's id name
# (dispatch/identity.py), which PostgreSQL formats in C for a tenth of what Python's str(uuid) costs.
# A batch reads cursors only through an index or by their address, never by a scan of the table: its transaction
# turns the other plans off for itself first (set_config(..., true) ends with the transaction).
# - The due scan must read each shard's range with an ordered index scan: it stops at the limit, needs no sort, and
#   marks the index entries of cursors already moved (each advance is a new entry: next_run_at is indexed) as dead,
#   so the next scan skips them. A bitmap scan does neither: it visits every such entry's heap page again on every
#   batch until a VACUUM. Under steady load PostgreSQL estimated a few rows a shard and chose the bitmap scan whatever
#   the limit (auto_explain on the steady bench: 145 index entries and 141 heap pages a shard for 9 due cursors,
#   31,000 pages and ~200 ms a batch of 2,000; 62 ms with this).
# - ADVANCE_CURSORS must find its rows by address: at 139,000 cursors PostgreSQL costed 2,000 row fetches above one
#   sequential read of the table, which grows with every schedule (20 M cursors: the whole table, every batch).
INDEX_READS_ONLY = "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)"

SCAN_DUE_SCHEDULES = """
SELECT c.schedule_id, c.tenant_id, c.kind, c.cron, c.run_at, c.timezone, c.version, c.next_run_at, c.lane,
       c.flexible_window_seconds, c.priority, c.misfire_policy, c.max_lateness_seconds, c.catchup_limit,
       (SELECT t.max_catchup_per_minute FROM tenants_tenant AS t WHERE t.id = c.tenant_id), c.every_seconds,
       c.anchor_at, c.dst_gap, c.dst_repeat, c.start_at, c.end_at, c.remaining_runs, c.exclude_calendars, c.shard,
       c.ctid::text, c.schedule_id::text
FROM unnest(%(shards)s::int[]) AS mine(shard)
CROSS JOIN LATERAL (
    SELECT due.schedule_id, due.tenant_id, due.kind, due.cron, due.run_at, due.timezone, due.version,
           due.next_run_at, due.lane, due.flexible_window_seconds, due.priority, due.misfire_policy,
           due.max_lateness_seconds, due.catchup_limit, due.every_seconds, due.anchor_at, due.dst_gap,
           due.dst_repeat, due.start_at, due.end_at, due.remaining_runs, due.exclude_calendars, due.shard, due.ctid
    FROM schedules_schedulecursor AS due
    WHERE due.shard = mine.shard AND due.next_run_at IS NOT NULL AND due.next_run_at <= %(horizon_end)s
    ORDER BY due.next_run_at, due.tenant_id
    LIMIT %(per_shard)s
    FOR UPDATE SKIP LOCKED
) AS c
LIMIT %(limit)s
"""

# The calendars a batch's schedules name (few batches name any): their revisions first, so a calendar's dates and
# ranges (up to thousands) are read again only when it has changed or is new (dispatch/calendars.py keeps them parsed).
CALENDAR_REVISIONS = """
SELECT cal.tenant_id, cal.name, cal.id, cal.revision
FROM schedules_calendar AS cal
JOIN unnest(%(tenant_ids)s::bigint[], %(names)s::text[]) AS named(tenant_id, name)
  ON cal.tenant_id = named.tenant_id AND cal.name = named.name
"""
CALENDAR_CONTENTS = """
SELECT cal.tenant_id, cal.name, cal.id, cal.revision, cal.dates::text, cal.ranges::text
FROM schedules_calendar AS cal
JOIN unnest(%(tenant_ids)s::bigint[], %(names)s::text[]) AS named(tenant_id, name)
  ON cal.tenant_id = named.tenant_id AND cal.name = named.name
"""

# The occurrences of a batch, streamed with COPY: half the cost of INSERT ... SELECT FROM unnest(...) per row
# (measured: 25 -> 12 us at 100,000 fires), most of the batch's database time before the cursor table. COPY has no
# ON CONFLICT, so the batch writes under a savepoint and, if one of its fires already has its row (a backfill ran
# ahead of the cursor, say), rolls back to it and writes the batch again with INSERT_OCCURRENCES, which skips the
# existing rows. Missed fires carry finished_at; the other columns take their defaults (attempt_count 0, manual and
# forced false, created_at the transaction's start).
COPY_OCCURRENCES = """
COPY dispatch_occurrence (occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, available_at, lane,
                          priority, state, state_reason, finished_at)
FROM STDIN (FORMAT BINARY)
"""
COPY_OCCURRENCE_TYPES = [
    "uuid",
    "uuid",
    "int8",
    "int4",
    "timestamptz",
    "timestamptz",
    "text",
    "int2",
    "text",
    "text",
    "timestamptz",
]

# The batch again when its COPY met an existing row. ON CONFLICT DO NOTHING on the primary key (occurrence_id,
# scheduled_for), which is the unique fire: the id is derived from (schedule, version, scheduled_for), so a backfill
# ahead of the cursor or a replayed batch meets the existing row. RETURNING tells which
# rows are new, so only those get outbox entries. state_reason says why a fire was missed ('' on the ordinary path).
# `kept` (a change's owed fires, dispatch/occurrence_rows.py) marks the delivered ones, which the change that follows
# must not withdraw.
INSERT_OCCURRENCES = """
INSERT INTO dispatch_occurrence (
    occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, available_at, lane, priority,
    manual, state, state_reason, attempt_count, finished_at, created_at, kept)
SELECT u.occurrence_id, u.schedule_id, u.tenant_id, u.version, u.scheduled_for, u.available_at, u.lane,
       u.priority, false, u.state, u.state_reason, 0,
       CASE WHEN u.state = 'missed' THEN %(now)s::timestamptz END, %(now)s::timestamptz,
       %(kept)s::boolean AND u.state = 'scheduled'
FROM unnest(%(occurrence_ids)s::uuid[], %(schedule_ids)s::uuid[], %(tenant_ids)s::bigint[], %(versions)s::int[],
            %(scheduled_fors)s::timestamptz[], %(available_ats)s::timestamptz[], %(lanes)s::text[],
            %(priorities)s::smallint[], %(states)s::text[], %(state_reasons)s::text[])
     AS u(occurrence_id, schedule_id, tenant_id, version, scheduled_for, available_at, lane, priority, state,
          state_reason)
ON CONFLICT DO NOTHING
RETURNING occurrence_id
"""

# A one-off whose fire was materialized keeps its cursor row, with next_run_at NULL, until that occurrence is
# terminal: before that it can still be paused, it still holds its quota slot, and the API does not call it
# completed while it may never run. This pass completes those whose occurrences of the current version all ended,
# and deletes their cursor rows. The candidates are few and found through the partial index cursor_fired_one_off.
# Lock order as the control plane's: the schedule row first (SKIP LOCKED leaves one a change holds), then the cursor
# row. The version must still match: a change that gave the one-off a new run_at since the candidates were read
# bumped it, and its cursor is a live one.
COMPLETE_FIRED_ONE_OFFS = """
WITH ended AS (
    -- The "ended" test comes before the LIMIT: one-offs still running must not fill every pass's page.
    SELECT c.schedule_id, c.version, c.remaining_runs FROM schedules_schedulecursor AS c
    WHERE c.next_run_at IS NULL
      -- A rule that ran out before its end_at (no fire left in the window) completes once end_at has passed; a
      -- one-off whose fire has ended, or a rule that used up its max_runs, at once.
      AND (c.kind = 'once' OR c.end_at IS NULL OR c.end_at <= clock_timestamp() OR c.remaining_runs = 0)
      AND NOT EXISTS (
        SELECT 1 FROM dispatch_occurrence AS o
        WHERE o.schedule_id = c.schedule_id AND o.schedule_version = c.version
          AND o.state NOT IN ('succeeded', 'dead', 'missed', 'canceled', 'skipped_overlap'))
    LIMIT %(limit)s
), locked AS (
    SELECT s.id, ended.version, ended.remaining_runs FROM schedules_schedule AS s
    JOIN ended ON ended.schedule_id = s.id AND ended.version = s.version
    WHERE s.state = 'active'
    FOR UPDATE OF s SKIP LOCKED
), completed AS (
    -- The runs left move to the schedule row with the cursor gone (0 for one that used up its max_runs).
    UPDATE schedules_schedule AS s
    SET state = 'completed', updated_at = clock_timestamp(), remaining_runs = locked.remaining_runs
    FROM locked WHERE s.id = locked.id
    RETURNING s.id
)
DELETE FROM schedules_schedulecursor AS c
USING locked
WHERE c.schedule_id = locked.id AND c.version = locked.version AND c.next_run_at IS NULL
  AND c.schedule_id IN (SELECT id FROM completed)
RETURNING c.schedule_id
"""

# Rule 3: the cursor moves only if the version and the old cursor still match, so an old node cannot move a
# cursor backwards or overwrite a newer definition's cursor. (The rows are also locked by the scan.)
# The rows are found by the physical address the scan returned (ctid; stable while the batch holds their lock): a
# TID scan per row, no index probe at all. Joined by id alone, the planner read the whole table for every batch (a
# hash join, or a sequential scan filtered by `= ANY(ids)`: 36 ms a batch of 2,000 at 300,000 cursors, half the
# batch), and with `ctid = ANY(rows)` beside the join it read the table too, filtering every row against the
# 2,000-element array (auto_explain on the steady bench: 137,000 rows read for 2,000 written, 140-215 ms a batch).
# The batch's transaction therefore allows no sequential scan (INDEX_READS_ONLY): one TID scan per row.
# A one-off's cursor becomes NULL here; the maintenance pass above completes the schedule. The schedule row itself
# is never written by a batch: that would take locks in the opposite order to the control plane's.
ADVANCE_CURSORS = """
UPDATE schedules_schedulecursor AS c
SET next_run_at = u.new_cursor, remaining_runs = u.remaining_runs
FROM unnest(%(rows)s::text[]::tid[], %(versions)s::int[], %(old_cursors)s::timestamptz[],
            %(new_cursors)s::timestamptz[], %(remaining_runs)s::int[])
     AS u(row, version, old_cursor, new_cursor, remaining_runs)
WHERE c.ctid = u.row AND c.version = u.version AND c.next_run_at = u.old_cursor
"""
