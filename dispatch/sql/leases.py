"""Leases: which materializer owns which shard, which worker owns which running occurrence, and who is alive.

Both kinds are fencing tokens: a shard lease's generation grows on every change of owner, an occurrence's
attempt_count on every claim, and every renewal or commit presents the number it was granted.
"""

from __future__ import annotations

from dispatch.sql import OWN_VERSION_SNAPSHOT, schedule_of

# --- shard leases (materializer) ------------------------------------------------------------------------------

# Rows for every shard exist up front, so claiming is an UPDATE and never races an INSERT.
ENSURE_SHARD_ROWS = """
INSERT INTO dispatch_shardlease (shard, owner, generation, expires_at)
SELECT s, '', 0, NULL FROM generate_series(0, %(shards)s - 1) AS s
ON CONFLICT (shard) DO NOTHING
"""

# The shard count the data already uses: shards that have lease rows, and the highest shard a pending cursor sits
# on (a backward scan of cursor_due_by_shard_tenant, one index probe). A materializer configured with fewer shards
# would leave the schedules of the others unleased: silently never fired.
SHARDS_IN_USE = """
SELECT GREATEST(
    (SELECT coalesce(max(shard) + 1, 0) FROM dispatch_shardlease),
    (SELECT coalesce(max(shard) + 1, 0) FROM (
        SELECT shard FROM schedules_schedulecursor WHERE next_run_at IS NOT NULL
        ORDER BY shard DESC LIMIT 1) AS top))
"""

# Presence of a process (materializers: so a newcomer is counted in the fair share before it holds a shard; relays
# and workers: for /healthz and the console). The process sends its own wall clock: the difference from
# PostgreSQL's is its clock skew (late by the one-way network delay), NULL when it sent none.
PROCESS_HEARTBEAT = """
INSERT INTO dispatch_processheartbeat AS h (name, role, started_at, heartbeat_at, clock_skew_seconds)
VALUES (%(name)s, %(role)s, clock_timestamp(), clock_timestamp(),
        EXTRACT(EPOCH FROM %(process_now)s::timestamptz - clock_timestamp()))
ON CONFLICT (name) DO UPDATE SET heartbeat_at = clock_timestamp(), role = EXCLUDED.role,
                                 clock_skew_seconds = EXCLUDED.clock_skew_seconds
"""

LIVE_PROCESSES = """
SELECT count(*) FROM dispatch_processheartbeat
WHERE role = %(role)s AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)
"""

FORGET_PROCESS = "DELETE FROM dispatch_processheartbeat WHERE name = %(name)s"

# Renewal presents the generation it was granted: a lease taken over meanwhile is not silently resurrected.
RENEW_SHARD_LEASES = """
UPDATE dispatch_shardlease AS l
SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
FROM unnest(%(shards)s::int[], %(generations)s::bigint[]) AS mine(shard, generation)
WHERE l.shard = mine.shard AND l.generation = mine.generation AND l.owner = %(owner)s
RETURNING l.shard, l.generation
"""

# Free or expired shards, lowest first; SKIP LOCKED lets two newcomers claim disjoint sets at the same time.
# The generation grows on every change of owner: that is the fencing token of docs/ARCHITECTURE.md rule 3.
CLAIM_SHARD_LEASES = """
UPDATE dispatch_shardlease AS l
SET owner = %(owner)s, generation = l.generation + 1,
    expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
WHERE l.shard IN (
    SELECT shard FROM dispatch_shardlease
    WHERE expires_at IS NULL OR expires_at < clock_timestamp()
    ORDER BY shard
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING l.shard, l.generation
"""

RELEASE_SHARD_LEASES = """
UPDATE dispatch_shardlease SET owner = '', expires_at = NULL
WHERE owner = %(owner)s AND shard = ANY(%(shards)s::int[])
"""

# Run in each batch transaction for the shards the batch read (right after the scan). FOR SHARE holds the lease rows
# until commit, so a takeover (an UPDATE) waits for this batch to finish; a lease lost before this point excludes
# its shard from the batch.
CONFIRM_SHARD_LEASES = """
SELECT l.shard FROM dispatch_shardlease AS l
JOIN unnest(%(shards)s::int[], %(generations)s::bigint[]) AS mine(shard, generation)
  ON l.shard = mine.shard AND l.generation = mine.generation
WHERE l.owner = %(owner)s AND l.expires_at > clock_timestamp()
FOR SHARE OF l
"""

# --- occurrence leases (workers) ------------------------------------------------------------------------------

# One statement renews every lease this process holds (arrays in). A row is renewed only while it is still
# running under the presented generation: a lease lost to the reaper or a newer claim is not resurrected.
# The result says, per renewed occurrence, whether its schedule is still the claimed version and not canceled.
# Rows missing from the result lost their lease.
# The rows are locked in primary-key order first, like every statement that changes many occurrences
# (dispatch/sql/__init__.py), and the held state comes in as a column (COMPLETE_MANY says why).
RENEW_OCCURRENCE_LEASES = """
WITH mine AS (
    SELECT * FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(generations)s::int[],
                         %(attempt_ids)s::bigint[], %(held_states)s::text[])
         AS m(occurrence_id, scheduled_for, generation, attempt_id, held_state)
), locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN mine ON o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), renewed AS (
    UPDATE dispatch_occurrence AS o
    SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
    FROM mine
    JOIN locked ON locked.occurrence_id = mine.occurrence_id AND locked.scheduled_for = mine.scheduled_for
    WHERE o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
      AND o.state = mine.held_state AND o.attempt_count = mine.generation
    RETURNING o.occurrence_id, o.scheduled_for, o.attempt_count, o.schedule_id, o.schedule_version,
              o.lease_expires_at, mine.attempt_id, o.forced OR o.kept AS forced
), beat AS (
    UPDATE dispatch_attempt AS a
    SET heartbeat_at = clock_timestamp(), lease_expires_at = renewed.lease_expires_at
    FROM renewed
    WHERE a.id = renewed.attempt_id AND a.scheduled_for = renewed.scheduled_for
)
SELECT r.occurrence_id, r.attempt_count, s.state <> 'canceled' AND (s.version = r.schedule_version OR r.forced)
FROM renewed AS r
""" + schedule_of("r.schedule_id")

# Running occurrences whose lease expired (the worker died: SIGKILL, OOM, lost network). Found in
# dispatch_occurrence_watch (its index watch_running_lease), and checked again on the occurrence row, which is the
# one locked. SKIP LOCKED: a live worker completing or renewing one of these rows wins, and several reapers split
# the work. Outcome per row, with its reason in words:
# canceled if the schedule moved on (the claim would cancel it anyway); dead when the attempts of the occurrence's
# own version are used up (its snapshot, read as at claim time: see LOCK_OCCURRENCE in dispatch/sql/claims.py; the
# words are dispatch.engine.retry.attempts_of's, attempts past max_attempts being a replay's) or the
# occurrence deadline has passed (not for forced ones, see dispatch/engine/retry.deadline_of); otherwise
# retry_wait, due at once, with a new envelope written by the caller for the returned rows. A worker's death is
# not its tenant's doing, so these retries take no slot of the tenant's retry budget.
REAP_EXPIRED_LEASES = (
    """
WITH expired AS (
    SELECT o.occurrence_id, o.scheduled_for, o.attempt_count, s.state AS schedule_state,
           s.version AS schedule_version,
           s.version <> o.schedule_version AND NOT (o.forced OR o.kept) AS superseded,
           COALESCE((v.definition ->> 'max_attempts')::int, s.max_attempts) AS max_attempts,
           NOT o.forced AND o.scheduled_for + make_interval(secs => %(deadline)s) < %(now)s AS past_deadline
    FROM dispatch_occurrence_watch AS w
    JOIN dispatch_occurrence AS o ON o.occurrence_id = w.occurrence_id AND o.scheduled_for = w.scheduled_for
    JOIN schedules_schedule AS s ON s.id = o.schedule_id
"""
    + OWN_VERSION_SNAPSHOT
    + """    WHERE w.state = 'running' AND w.lease_expires_at < %(now)s
      AND o.state = 'running' AND o.lease_expires_at < %(now)s
    ORDER BY w.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), verdicts AS (
    SELECT e.occurrence_id, e.scheduled_for, e.attempt_count,
           CASE WHEN e.schedule_state = 'canceled' OR e.superseded THEN 'canceled'
                WHEN e.attempt_count >= e.max_attempts OR e.past_deadline THEN 'dead'
                ELSE 'retry_wait' END AS new_state,
           CASE WHEN e.schedule_state = 'canceled' THEN 'schedule canceled'
                WHEN e.superseded THEN 'schedule changed to version ' || e.schedule_version
                WHEN e.attempt_count > e.max_attempts
                    THEN 'attempts exhausted (' || e.attempt_count || ' of ' || e.attempt_count || ': max_attempts '
                         || e.max_attempts || ' + ' || (e.attempt_count - e.max_attempts) || ' by replay)'
                WHEN e.attempt_count = e.max_attempts
                    THEN 'attempts exhausted (' || e.attempt_count || ' of ' || e.max_attempts || ')'
                WHEN e.past_deadline THEN 'deadline passed'
                ELSE '' END AS reason
    FROM expired AS e
), moved AS (
    UPDATE dispatch_occurrence AS o
    SET state = e.new_state,
        finished_at = CASE WHEN e.new_state = 'retry_wait' THEN NULL ELSE %(now)s END,
        available_at = CASE WHEN e.new_state = 'retry_wait' THEN %(now)s ELSE o.available_at END,
        lease_expires_at = NULL,
        state_reason = e.reason
    FROM verdicts AS e
    WHERE o.occurrence_id = e.occurrence_id AND o.scheduled_for = e.scheduled_for
      AND o.state = 'running' AND o.attempt_count = e.attempt_count
    RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority, o.state, o.attempt_count,
              o.state_reason
), closed AS (
    UPDATE dispatch_attempt AS a
    SET finished_at = %(now)s, outcome = 'expired', error_class = 'transient', error = 'lease expired'
    FROM moved AS m
    WHERE a.occurrence_id = m.occurrence_id AND a.scheduled_for = m.scheduled_for
      AND a.generation = m.attempt_count AND a.finished_at IS NULL
)
SELECT occurrence_id, scheduled_for, tenant_id, lane, priority, state, attempt_count, state_reason FROM moved
"""
)

# Heartbeat rows of processes that stopped writing them long ago (killed, or their host gone): every process has a
# fresh name, so without this the table only grows. A small table: the scan is cheaper than an index to maintain.
PRUNE_PROCESS_HEARTBEATS = """
DELETE FROM dispatch_processheartbeat WHERE heartbeat_at < clock_timestamp() - make_interval(secs => %(older_than)s)
"""
