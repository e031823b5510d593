"""The hot SQL of the data plane, in one place, with why each statement is shaped as it is.

Conventions: every statement is one round trip for a whole batch (arrays in, `unnest` inside); rows are claimed
with `FOR UPDATE SKIP LOCKED` so concurrent processes split work instead of queueing on locks; "now" is
`clock_timestamp()` (PostgreSQL's clock, the one every node agrees on), never a process clock.
"""

from __future__ import annotations

# --- shard leases (materializer) ------------------------------------------------------------------------------

# Rows for every shard exist up front, so claiming is an UPDATE and never races an INSERT.
ENSURE_SHARD_ROWS = """
INSERT INTO dispatch_shardlease (shard, owner, generation, expires_at)
SELECT s, '', 0, NULL FROM generate_series(0, %(shards)s - 1) AS s
ON CONFLICT (shard) DO NOTHING
"""

# Presence of materializer processes, so a newcomer is counted in the fair share before it holds a shard.
HEARTBEAT = """
INSERT INTO dispatch_processheartbeat (name, role, started_at, heartbeat_at)
VALUES (%(name)s, %(role)s, clock_timestamp(), clock_timestamp())
ON CONFLICT (name) DO UPDATE SET heartbeat_at = clock_timestamp(), role = EXCLUDED.role
"""

LIVE_PROCESSES = """
SELECT count(*) FROM dispatch_processheartbeat
WHERE role = %(role)s AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)
"""

FORGET_PROCESS = "DELETE FROM dispatch_processheartbeat WHERE name = %(name)s"

# Renewal presents the generation it was granted: a lease taken over meanwhile is not silently resurrected.
RENEW_LEASES = """
UPDATE dispatch_shardlease AS l
SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
FROM unnest(%(shards)s::int[], %(generations)s::bigint[]) AS mine(shard, generation)
WHERE l.shard = mine.shard AND l.generation = mine.generation AND l.owner = %(owner)s
RETURNING l.shard, l.generation
"""

# Free or expired shards, lowest first; SKIP LOCKED lets two newcomers claim disjoint sets at the same time.
# The generation grows on every change of owner: that is the fencing token of rule 3.
CLAIM_LEASES = """
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

RELEASE_LEASES = """
UPDATE dispatch_shardlease SET owner = '', expires_at = NULL
WHERE owner = %(owner)s AND shard = ANY(%(shards)s::int[])
"""

# Run first in each batch transaction. FOR SHARE holds the lease rows until commit, so a takeover (an UPDATE)
# waits for this batch to finish; a lease lost before this point simply excludes its shard from the batch.
CONFIRM_LEASES = """
SELECT l.shard FROM dispatch_shardlease AS l
JOIN unnest(%(shards)s::int[], %(generations)s::bigint[]) AS mine(shard, generation)
  ON l.shard = mine.shard AND l.generation = mine.generation
WHERE l.owner = %(owner)s AND l.expires_at > clock_timestamp()
FOR SHARE OF l
"""

# --- materialization -------------------------------------------------------------------------------------------

# One ordered index range per shard (schedule_due_by_shard: (shard, next_run_at) WHERE state = 'active'), read
# through LATERAL with a per-shard LIMIT. A single `shard = ANY(...) ORDER BY next_run_at` looks simpler but makes
# PostgreSQL read and sort every due row of every shard for each batch: quadratic in a top-of-hour burst (measured:
# 500,000 due rows took over three minutes). Idle schedules (next_run_at far ahead) and inactive ones cost nothing.
# SKIP LOCKED: a row an API call is changing is picked up next batch instead of waiting on it.
SCAN_DUE_SCHEDULES = """
SELECT s.id, s.tenant_id, s.kind, s.cron, s.run_at, s.timezone, s.version, s.next_run_at, s.lane,
       s.flexible_window_seconds, s.priority, s.misfire_policy, s.max_lateness_seconds, s.catchup_limit,
       t.max_catchup_per_minute
FROM unnest(%(shards)s::int[]) AS mine(shard)
CROSS JOIN LATERAL (
    SELECT * FROM schedules_schedule AS due
    WHERE due.shard = mine.shard AND due.state = 'active' AND due.next_run_at IS NOT NULL
      AND due.next_run_at <= %(horizon_end)s
    ORDER BY due.next_run_at
    LIMIT %(per_shard)s
    FOR UPDATE SKIP LOCKED
) AS s
JOIN tenants_tenant AS t ON t.id = s.tenant_id
LIMIT %(limit)s
"""

# ON CONFLICT DO NOTHING on the unique fire (schedule, version, scheduled_for): a second materializer during a
# lease hand-over, a backfill or a replayed batch meets the existing row. RETURNING tells which rows are new, so
# only those get outbox entries.
INSERT_OCCURRENCES = """
INSERT INTO dispatch_occurrence (
    occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, available_at, lane, priority,
    manual, state, attempt_count, finished_at, created_at)
SELECT u.occurrence_id, u.schedule_id, u.tenant_id, u.version, u.scheduled_for, u.available_at, u.lane,
       u.priority, false, u.state, 0,
       CASE WHEN u.state = 'missed' THEN %(now)s::timestamptz END, %(now)s::timestamptz
FROM unnest(%(occurrence_ids)s::uuid[], %(schedule_ids)s::uuid[], %(tenant_ids)s::bigint[], %(versions)s::int[],
            %(scheduled_fors)s::timestamptz[], %(available_ats)s::timestamptz[], %(lanes)s::text[],
            %(priorities)s::smallint[], %(states)s::text[])
     AS u(occurrence_id, schedule_id, tenant_id, version, scheduled_for, available_at, lane, priority, state)
ON CONFLICT DO NOTHING
RETURNING occurrence_id
"""

INSERT_OUTBOX = """
INSERT INTO dispatch_outboxmessage
    (tenant_id, queue, available_at, priority, occurrence_ids, scheduled_fors, body, published_at, created_at)
VALUES (%s, %s, %s, %s, %s::uuid[], %s::timestamptz[], %s, NULL, clock_timestamp())
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

# --- relay -----------------------------------------------------------------------------------------------------

# Due envelopes in (time, priority) order, locked for the duration of publish + stamp. SKIP LOCKED lets several
# relays share a burst. Served by the partial index outbox_due.
CLAIM_DUE_ENVELOPES = """
SELECT id, queue, priority, body, cardinality(occurrence_ids), available_at
FROM dispatch_outboxmessage
WHERE published_at IS NULL AND available_at <= clock_timestamp() + make_interval(secs => %(lead)s)
ORDER BY available_at, priority DESC, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

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

DB_NOW = "SELECT clock_timestamp()"

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
# enqueued (a worker may already have moved it further; then only enqueued_at is filled), then the envelope
# row goes. The (occurrence_id, scheduled_for) pair lets PostgreSQL prune to one partition per row.
SETTLE_PUBLISHED = """
WITH settled AS (
    DELETE FROM dispatch_outboxmessage
    WHERE id IN (
        SELECT id FROM dispatch_outboxmessage WHERE published_at IS NOT NULL
        ORDER BY published_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING occurrence_ids, scheduled_fors, published_at
), members AS (
    SELECT u.occurrence_id, u.scheduled_for, settled.published_at
    FROM settled, unnest(settled.occurrence_ids, settled.scheduled_fors) AS u(occurrence_id, scheduled_for)
)
UPDATE dispatch_occurrence AS o
SET state = CASE WHEN o.state = 'scheduled' THEN 'enqueued' ELSE o.state END,
    enqueued_at = COALESCE(o.enqueued_at, members.published_at)
FROM members
WHERE o.occurrence_id = members.occurrence_id AND o.scheduled_for = members.scheduled_for
"""
