"""The SQL of the operator paths (replay, backfill, reconcile, metrics, partition upkeep): not hot, but in one
place with the rest, so every statement that touches the engine tables is found under dispatch/sql/.
"""

from __future__ import annotations

from dispatch.sql import UNRESOLVED_DEAD

# --- replay (DLQ) --------------------------------------------------------------------------------------------------

# The same transition as services.replay_dead_occurrence, for a batch: dead -> scheduled, forced, available now.
# SKIP LOCKED: a row another replay (or the API) holds is left to it. Occurrences of a canceled schedule stay dead
# (workers would drop them), and are counted separately. The DLQ only: a dead occurrence an operator resolved is
# left (replay it by its id to run it again). `o.state = 'dead'` is re-checked in the UPDATE so a row that changed
# since the subquery read it is not touched (docs/ARCHITECTURE.md rule 14: every transition is conditional).
REPLAY_DEAD_BATCH = (
    """
WITH picked AS (
    SELECT o.occurrence_id, o.scheduled_for
    FROM dispatch_occurrence_watch AS w
    JOIN dispatch_occurrence AS o ON o.occurrence_id = w.occurrence_id AND o.scheduled_for = w.scheduled_for
    JOIN schedules_schedule AS s ON s.id = o.schedule_id
    WHERE """
    + UNRESOLVED_DEAD
    + """ AND o.state = 'dead' AND s.state <> 'canceled'
      AND (%(tenant_id)s::bigint IS NULL OR w.tenant_id = %(tenant_id)s::bigint)
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE dispatch_occurrence AS o
SET state = 'scheduled', available_at = %(now)s, finished_at = NULL, forced = true
FROM picked
WHERE o.occurrence_id = picked.occurrence_id AND o.scheduled_for = picked.scheduled_for AND o.state = 'dead'
RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority
"""
)

# The DLQ's occurrences of canceled schedules: what `replay --dead` leaves, for an operator to resolve.
COUNT_DEAD_OF_CANCELED = (
    """
SELECT count(*)
FROM dispatch_occurrence_watch AS w
JOIN schedules_schedule AS s ON s.id = w.schedule_id
WHERE """
    + UNRESOLVED_DEAD
    + """ AND s.state = 'canceled'
  AND (%(tenant_id)s::bigint IS NULL OR w.tenant_id = %(tenant_id)s::bigint)
"""
)

# --- backfill ------------------------------------------------------------------------------------------------------

# ON CONFLICT DO NOTHING on the primary key (occurrence_id, scheduled_for), which is the unique fire (its id is
# derived from schedule, version and instant): a row the materializer, a replay or an earlier backfill wrote is left
# exactly as it is. `forced`: the operator asked for this very fire, so the worker runs it even though the
# schedule has a newer version now. RETURNING names the new rows: only they get envelopes.
INSERT_BACKFILL = """
INSERT INTO dispatch_occurrence (
    occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, available_at, lane, priority,
    manual, forced, state, attempt_count, created_at)
SELECT u.occurrence_id, u.schedule_id, u.tenant_id, u.version, u.scheduled_for, %(now)s::timestamptz, u.lane,
       u.priority, false, true, 'scheduled', 0, %(now)s::timestamptz
FROM unnest(%(occurrence_ids)s::uuid[], %(schedule_ids)s::uuid[], %(tenant_ids)s::bigint[], %(versions)s::int[],
            %(scheduled_fors)s::timestamptz[], %(lanes)s::text[], %(priorities)s::smallint[])
     AS u(occurrence_id, schedule_id, tenant_id, version, scheduled_for, lane, priority)
ON CONFLICT DO NOTHING
RETURNING occurrence_id
"""

# Backfilled fires paced past "now" by their tenant's catch-up budget: the row says when it is released, so
# stuck detection and the console measure from that instant.
DELAY_BACKFILLED = """
UPDATE dispatch_occurrence AS o SET available_at = u.available_at
FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(available_ats)s::timestamptz[])
     AS u(occurrence_id, scheduled_for, available_at)
WHERE o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
"""

# --- reconcile -----------------------------------------------------------------------------------------------------

# Expected fires of one chunk that have a row. Both columns are matched: the table is partitioned by
# scheduled_for, and the explicit range lets PostgreSQL prune to the chunk's days before probing each
# partition's primary key (occurrence_id, scheduled_for).
RECONCILE_FIND_EXPECTED = """
SELECT o.occurrence_id, o.state
FROM dispatch_occurrence AS o
JOIN unnest(%(ids)s::uuid[], %(fors)s::timestamptz[]) AS e(occurrence_id, scheduled_for)
  ON o.occurrence_id = e.occurrence_id AND o.scheduled_for = e.scheduled_for
WHERE o.scheduled_for >= %(low)s AND o.scheduled_for <= %(high)s
"""

# Every non-manual row of a batch of schedules in the window, counted per (schedule, version, state); minus the
# rows matched above this leaves the unexpected ones. Served by occurrence_schedule_recent.
RECONCILE_COUNT_ROWS = """
SELECT schedule_id, schedule_version, state, count(*)
FROM dispatch_occurrence
WHERE schedule_id = ANY(%(schedule_ids)s::uuid[])
  AND scheduled_for >= %(since)s AND scheduled_for < %(until)s
  AND NOT manual
GROUP BY schedule_id, schedule_version, state
"""

RECONCILE_SAMPLE_ROWS = """
SELECT occurrence_id, scheduled_for, state
FROM dispatch_occurrence
WHERE schedule_id = %(schedule_id)s AND schedule_version = %(version)s
  AND scheduled_for >= %(since)s AND scheduled_for < %(until)s
  AND NOT manual
ORDER BY scheduled_for
LIMIT %(limit)s
"""

# --- day partitions (dispatch/partitions.py) ---------------------------------------------------------------------

# The day partitions of a parent table, by name (`<table>_pYYYYMMDD`); the DEFAULT partition does not match.
PARTITION_CHILDREN = """
SELECT child.relname
FROM pg_inherits
JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
JOIN pg_class child ON child.oid = pg_inherits.inhrelid
JOIN pg_namespace ns ON ns.oid = parent.relnamespace
WHERE parent.relname = %s AND ns.nspname = 'public'
"""

# Every upkeep transaction bounds its lock waits (SET LOCAL semantics: is_local true), and puts the caller's value
# back when it is done, so a migration that calls it keeps its own setting for what follows.
CURRENT_LOCK_TIMEOUT = "SELECT current_setting('lock_timeout')"
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, %s)"

# Identifiers cannot be parameters: {partition} and {parent} are formatted in from names partitions.py builds
# (table names from a fixed tuple, days from dates), never from input.
#
# A day is made in two statements, not `CREATE TABLE ... PARTITION OF`, which takes ACCESS EXCLUSIVE on the parent:
# while that waits behind a long read, every COPY, settle and claim queues behind it. LIKE takes ACCESS SHARE on the
# parent; ATTACH takes SHARE UPDATE EXCLUSIVE on it (no read or write conflicts with that), ACCESS EXCLUSIVE on the
# new table (nobody uses it yet) and on DEFAULT, which it scans for rows of the day (docs/DESIGN.md, "Upkeep": the
# locks measured in pg_locks). The attach builds the parent's indexes and constraints on the empty table.
CREATE_DAY_TABLE = (
    'CREATE TABLE IF NOT EXISTS "public"."{partition}" '
    '(LIKE "public"."{parent}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = {fillfactor})'
)
ATTACH_DAY_PARTITION = (
    'ALTER TABLE "public"."{parent}" ATTACH PARTITION "public"."{partition}" FOR VALUES FROM (%s) TO (%s)'
)
# Whether DEFAULT holds rows of a day (PostgreSQL would refuse its partition): read without a conflicting lock.
DEFAULT_HOLDS_RANGE = (
    'SELECT EXISTS (SELECT 1 FROM "public"."{parent}_default" WHERE scheduled_for >= %s AND scheduled_for < %s)'
)

# This connection's own writes go into the statistics PARTITION_WRITES reads before the next statement, not seconds
# later: the first reading then already counts them.
FLUSH_OWN_STATISTICS = "SELECT pg_stat_force_next_flush()"
# A day's fires that can still run, by state: a full read of the partition (no index has every unfinished state),
# under ACCESS SHARE only, so no writer waits for it.
UNFINISHED_BY_STATE = 'SELECT state, count(*) FROM "public"."{partition}" WHERE state = ANY(%s) GROUP BY state'
# Rows inserted, updated or deleted in a table so far (the statistics PostgreSQL keeps): read before the check above
# and again under the drop's locks, it shows that something wrote to the day in between. Backends report their
# counts when they go idle, within seconds; the outbox and the watch of DAY_REOPENED cover those seconds.
PARTITION_WRITES = """
SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_all_tables WHERE relid = %s::regclass
"""
# Under the drop's locks: a fire of the day re-opened since the check (a replay, a backfill, a catch-up) is still
# in the outbox, or already claimed (running, retry_wait: the fires in flight, through the watch's partial index
# watch_active_by_schedule, rather than a read of the whole day while its locks are held).
DAY_REOPENED = """
SELECT EXISTS (SELECT 1 FROM dispatch_occurrence_watch
               WHERE state IN ('running', 'retry_wait') AND scheduled_for >= %(start)s AND scheduled_for < %(end)s)
    OR EXISTS (SELECT 1 FROM dispatch_outboxmessage AS m, unnest(m.scheduled_fors) AS f(scheduled_for)
               WHERE f.scheduled_for >= %(start)s AND f.scheduled_for < %(end)s)
"""
# Parent before partition, occurrences before attempts: the order PostgreSQL's own DROP of a partition locks them in.
# A writer holding the attempt table and waiting for the occurrence table closes a cycle with this; the lock timeout
# (shorter than deadlock_timeout) ends it on this side.
LOCK_PARENT_ONLY = 'LOCK TABLE ONLY "public"."{parent}" IN ACCESS EXCLUSIVE MODE'
LOCK_PARTITION = 'LOCK TABLE "public"."{partition}" IN ACCESS EXCLUSIVE MODE'
DROP_PARTITION = 'DROP TABLE IF EXISTS "public"."{partition}"'
# A dropped day's dead fires leave the watch with it (a DROP fires no trigger); DAY_REOPENED found none of its fires
# in the other watched states. Through watch_dead_by_day. The resolutions of its dead fires go too (resolution_by_day),
# and the re-runs of its fires (rerun_by_day).
FORGET_WATCHED_DAY = """
WITH unresolved AS (
    DELETE FROM dispatch_occurrence_resolution WHERE scheduled_for >= %(start)s AND scheduled_for < %(end)s
), unrerun AS (
    DELETE FROM dispatch_occurrence_rerun WHERE scheduled_for >= %(start)s AND scheduled_for < %(end)s
)
DELETE FROM dispatch_occurrence_watch WHERE state = 'dead' AND scheduled_for >= %(start)s AND scheduled_for < %(end)s
"""

# Rows older than the retention that sat in DEFAULT (no partition existed for their day when written): finished
# occurrences, unfinished ones (kept), and the attempts that may go (those of no unfinished occurrence).
COUNT_DEFAULT_BEFORE = """
SELECT (SELECT count(*) FROM dispatch_occurrence_default
        WHERE scheduled_for < %(cutoff)s AND NOT state = ANY(%(unfinished)s)),
       (SELECT count(*) FROM dispatch_occurrence_default
        WHERE scheduled_for < %(cutoff)s AND state = ANY(%(unfinished)s)),
       (SELECT count(*) FROM dispatch_attempt_default AS a
        WHERE a.scheduled_for < %(cutoff)s AND NOT EXISTS (
            SELECT 1 FROM dispatch_occurrence AS o
            WHERE o.occurrence_id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
              AND o.state = ANY(%(unfinished)s)))
"""
# The state is re-checked on each row as it is deleted (READ COMMITTED re-reads a row changed meanwhile), so a fire
# re-opened while this runs stays. A DELETE on the partition itself fires no trigger of the parent: the deleted dead
# rows leave the watch here, and the resolutions and re-runs of the deleted rows go with them. Returns how many rows
# were deleted.
DELETE_FINISHED_DEFAULT_OCCURRENCES = """
WITH deleted AS (
    DELETE FROM dispatch_occurrence_default WHERE scheduled_for < %(cutoff)s AND NOT state = ANY(%(unfinished)s)
    RETURNING occurrence_id, scheduled_for, state
), unwatched AS (
    DELETE FROM dispatch_occurrence_watch AS w USING deleted AS d
    WHERE d.state = 'dead' AND w.occurrence_id = d.occurrence_id AND w.scheduled_for = d.scheduled_for
), unresolved AS (
    DELETE FROM dispatch_occurrence_resolution AS r USING deleted AS d
    WHERE d.state = 'dead' AND r.occurrence_id = d.occurrence_id AND r.scheduled_for = d.scheduled_for
), unrerun AS (
    DELETE FROM dispatch_occurrence_rerun AS r USING deleted AS d
    WHERE r.occurrence_id = d.occurrence_id AND r.scheduled_for = d.scheduled_for
)
SELECT count(*) FROM deleted
"""
DELETE_DEFAULT_ATTEMPTS = """
DELETE FROM dispatch_attempt_default AS a
WHERE a.scheduled_for < %(cutoff)s AND NOT EXISTS (
    SELECT 1 FROM dispatch_occurrence AS o
    WHERE o.occurrence_id = a.occurrence_id AND o.scheduled_for = a.scheduled_for AND o.state = ANY(%(unfinished)s))
"""

# --- vacuum where autovacuum is off (dispatch/upkeep.py) ----------------------------------------------------------

# The tables autovacuum does not look after (off on the server, or autovacuum_enabled=false on the table) whose dead
# row versions passed the threshold: `base` plus `scale` of their live rows, autovacuum's own formula. The name comes
# quoted by PostgreSQL (format %I), ready for VACUUM. Every schema: the engine tables and tenants' own alike.
# The tables autovacuum does not look after that are due: a VACUUM (ANALYZE) once their dead row versions pass
# `base` plus `scale` of their live rows, or an ANALYZE alone once the rows changed since the last one pass
# `analyze_base` plus `analyze_scale` of them (autovacuum's two rules). The second matters for a table that grows by
# inserts: a day partition analyzed while nearly empty keeps a plan for a nearly empty table, and the settle statement
# took 1.1 s to find two occurrences by hashing the whole day instead of probing its primary key (bench steady).
# Smallest first: the hot queue-like tables are small, and their VACUUM must not wait behind a day partition's.
VACUUM_CANDIDATES = """
SELECT format('%%I.%%I', s.schemaname, s.relname), s.relname, s.n_dead_tup, s.n_live_tup,
       s.n_dead_tup > %(base)s + %(scale)s * s.n_live_tup AS vacuum
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
WHERE (s.n_dead_tup > %(base)s + %(scale)s * s.n_live_tup
       OR s.n_mod_since_analyze > %(analyze_base)s + %(analyze_scale)s * s.n_live_tup)
  AND c.relkind = 'r'
  AND (NOT current_setting('autovacuum')::boolean
       OR EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o(option)
                  WHERE split_part(o.option, '=', 1) = 'autovacuum_enabled'
                    AND NOT split_part(o.option, '=', 2)::boolean))
ORDER BY s.n_live_tup
"""
# Throttled as autovacuum is by default (2 ms after every 200 cost units), so it shares the disk with the hot path
# instead of taking it; SKIP_LOCKED skips a table whose lock is taken (another VACUUM, a migration); no truncation,
# whose ACCESS EXCLUSIVE lock would pause every writer of the table. ANALYZE too: autovacuum's other half.
VACUUM_THROTTLE = "SELECT set_config('vacuum_cost_delay', %s, false), set_config('vacuum_cost_limit', %s, false)"
VACUUM_SETTINGS_NOW = (
    "SELECT current_setting('vacuum_cost_delay'), current_setting('vacuum_cost_limit'), current_setting('lock_timeout')"
)
VACUUM_TABLE = "VACUUM (SKIP_LOCKED, TRUNCATE false, ANALYZE) {table}"
ANALYZE_TABLE = "ANALYZE (SKIP_LOCKED) {table}"
DEAD_TUPLES_OF = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass"

# Each task of the upkeep runs in one materializer at a time (a session lock, tried, never waited for).
TRY_UPKEEP_LOCK = "SELECT pg_try_advisory_lock(hashtext(%s))"
RELEASE_UPKEEP_LOCK = "SELECT pg_advisory_unlock(hashtext(%s))"

# --- what /metrics and /healthz say of the upkeep -----------------------------------------------------------------

UPKEEP_FACTS = """
SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date, current_setting('autovacuum')::boolean
"""
# The server's checkpoints so far, by cause: timed (checkpoint_timeout passed) or requested (mostly the WAL reaching
# max_wal_size; an explicit CHECKPOINT counts too). PostgreSQL 17 moved them from pg_stat_bgwriter to
# pg_stat_checkpointer.
CHECKPOINTS = """
SELECT checkpoints_timed, checkpoints_req, current_setting('max_wal_size') FROM pg_stat_bgwriter
"""
CHECKPOINTS_SINCE_17 = """
SELECT num_timed, num_requested, current_setting('max_wal_size') FROM pg_stat_checkpointer
"""
# The engine's tables with the most dead row versions, and whether autovacuum looks after each (the public schema
# only: a scrape must not read the statistics of every tenant schema's tables).
DEAD_TUPLES = """
SELECT s.relname, s.n_dead_tup, s.n_live_tup,
       current_setting('autovacuum')::boolean
       AND NOT EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o(option)
                       WHERE split_part(o.option, '=', 1) = 'autovacuum_enabled'
                         AND NOT split_part(o.option, '=', 2)::boolean)
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
WHERE s.schemaname = 'public'
ORDER BY s.n_dead_tup DESC
LIMIT %(limit)s
"""


# --- stuck occurrences (dispatch/stuck.py) -------------------------------------------------------------------------

# "Stuck" (docs/API.md, "Commands"): still scheduled or enqueued S seconds after its release instant, running with a
# lease that expired S seconds ago, or in retry_wait S seconds past its retry time. The scheduled_for range bounds the
# scan to the window's day partitions (BRIN occurrence_scheduled_brin); scheduled_for <= available_at always, so
# nothing stuck lies after the cutoff. Keyset pagination on (scheduled_for, occurrence_id) keeps pages cheap.
FIND_STUCK = """
SELECT o.occurrence_id, o.scheduled_for, o.state, o.tenant_id, o.schedule_id, o.lane, o.priority,
       EXTRACT(EPOCH FROM %(now)s::timestamptz
                          - CASE WHEN o.state = 'running' THEN o.lease_expires_at ELSE o.available_at END)
FROM dispatch_occurrence AS o
WHERE o.scheduled_for >= %(since)s AND o.scheduled_for < %(until)s
  AND (o.scheduled_for, o.occurrence_id) > (%(after_for)s::timestamptz, %(after_id)s::uuid)
  AND (%(tenant_id)s::bigint IS NULL OR o.tenant_id = %(tenant_id)s::bigint)
  AND (%(tenant_ids)s::bigint[] IS NULL OR o.tenant_id = ANY(%(tenant_ids)s::bigint[]))
  AND ((o.state IN ('scheduled', 'enqueued', 'retry_wait') AND o.available_at < %(cutoff)s)
       OR (o.state = 'running' AND o.lease_expires_at < %(cutoff)s))
ORDER BY o.scheduled_for, o.occurrence_id
LIMIT %(limit)s
"""

# `replay --stuck` re-drives what it found: each occurrence still unfinished is marked forced, as a DLQ replay marks
# it, so the claim runs it however late it now is (the misfire rule exempts forced fires) and under its own version;
# a canceled schedule still withdraws it. Only the flag changes: the state stays the claim's to decide. Rows that
# ended meanwhile are left out, and get no envelope. Locked in primary-key order, like every statement that changes
# many occurrences (dispatch/sql/__init__.py).
FORCE_STUCK = """
WITH locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[]) AS u(occurrence_id, scheduled_for)
      ON o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
    WHERE o.state IN ('scheduled', 'enqueued', 'running', 'retry_wait')
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
)
UPDATE dispatch_occurrence AS o SET forced = true
FROM locked
WHERE o.occurrence_id = locked.occurrence_id AND o.scheduled_for = locked.scheduled_for
  AND o.state IN ('scheduled', 'enqueued', 'running', 'retry_wait')
RETURNING o.occurrence_id
"""
