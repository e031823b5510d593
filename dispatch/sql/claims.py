"""The hot SQL of the workers' claim, pre-check and completion, with why each statement is shaped so.

Conventions as in dispatch/sql/__init__.py: the occurrence table is partitioned by scheduled_for, so every statement
names both occurrence_id AND scheduled_for (partition pruning to one index probe); each state change is one conditional
UPDATE whose WHERE names the state (and generation) the caller observed, and the caller checks the row count;
"now" is `COALESCE(%(now)s, clock_timestamp())`: PostgreSQL's clock unless a test drives time.

Lock order, shared with the control plane (schedules/services.py locks the schedule, then updates occurrences):
schedule row first, then the occurrence row. A claim that needs no schedule lock (overlap `allow`) takes just the
occurrence row, so no claim can deadlock with a cancel. A claim that finds an overlap policy on the occurrence's
schedule releases the occurrence row and starts again, taking the schedule row first. A completion holds its own
occurrence row and may then touch a waiting sibling's row or a tenant's retry-budget row; nothing takes those first
and then a running occurrence, so these never form a cycle.
"""

from __future__ import annotations

from dispatch.sql import OWN_VERSION_SNAPSHOT, schedule_of

# --- claim -----------------------------------------------------------------------------------------------------

# Serialises the overlap decision of all occurrences of one schedule: with the row held, two occurrences can never
# both see "no predecessor running" (docs/ARCHITECTURE.md rule 8). Taken only for skip_if_running / queue_one.
LOCK_SCHEDULE = """
SELECT overlap_policy FROM schedules_schedule WHERE id = %(schedule_id)s FOR UPDATE
"""

# What a claim reads of an occurrence and its schedule (LOCK_OCCURRENCE, one row; LOCK_OCCURRENCES, a batch): the
# occurrence's state, the schedule as it is now, the definition of the occurrence's own version (the snapshot joined
# as v by OWN_VERSION_SNAPSHOT, else the schedule row) and the instant the claim decides at.
CLAIM_COLUMNS = """o.state, o.attempt_count, o.lease_expires_at, o.available_at, o.schedule_version, o.tenant_id,
       o.lane, o.priority, o.manual, o.forced, o.kept, o.throttled, s.id, s.state, s.version, s.overlap_policy,
       COALESCE(v.definition ->> 'handler', s.handler),
       COALESCE(v.definition -> 'payload', s.payload),
       COALESCE((v.definition ->> 'max_attempts')::int, s.max_attempts),
       COALESCE(v.definition ->> 'misfire_policy', s.misfire_policy),
       COALESCE((v.definition ->> 'max_lateness_seconds')::int, s.max_lateness_seconds),
       COALESCE((v.definition ->> 'catchup_limit')::int, s.catchup_limit),
       CASE WHEN v.definition ? 'retry_base_seconds' THEN (v.definition ->> 'retry_base_seconds')::int
            ELSE s.retry_base_seconds END,
       CASE WHEN v.definition ? 'retry_cap_seconds' THEN (v.definition ->> 'retry_cap_seconds')::int
            ELSE s.retry_cap_seconds END,
       COALESCE(%(now)s::timestamptz, clock_timestamp())"""

# The occurrence row locked for the claim transaction, with the schedule as it is now (version re-check) and the
# instant every decision of this claim uses.
# The definition it runs under is its own version's: a backfilled or replayed fire of version 1 must not run
# version 3's handler, payload or attempt limit. That is the snapshot in schedules_scheduleversion when the
# occurrence's version is not the schedule's current one, else the schedule row itself (the same definition, with
# no second row to read). OFFSET 0 keeps the planner from flattening the lateral into a join whose filter runs after
# the probe; kept as a subquery, the version comparison becomes a one-time filter in front of it. Measured with
# EXPLAIN ANALYZE on 1.2 M occurrences: an occurrence of the current version (nearly all) never probes
# schedule_version_unique (8 buffers in all, as before this join), an older one probes it once (4 more). A missing
# version row falls back to the schedule row, field by field.
# The overlap policy is the schedule's current one on purpose: it serialises the schedule's occurrences now,
# whatever version each was created under.
LOCK_OCCURRENCE = (
    """
SELECT """
    + CLAIM_COLUMNS
    + """
FROM dispatch_occurrence AS o
JOIN schedules_schedule AS s ON s.id = o.schedule_id
"""
    + OWN_VERSION_SNAPSHOT
    + """WHERE o.occurrence_id = %(occurrence_id)s AND o.scheduled_for = %(scheduled_for)s
FOR UPDATE OF o
"""
)

# The batched claim of an envelope's occurrences (dispatch/engine/envelope_runner.py): the same columns as
# LOCK_OCCURRENCE, keyed by position in the envelope, for every occurrence in one round trip. The rows are locked in
# primary-key order and a held one is waited for, like every statement that changes many occurrences
# (dispatch/sql/__init__.py), so it cannot deadlock with them. The holder is nearly always the relay's settle step
# writing enqueued_at (tens of milliseconds): skipping its rows instead sent ~3 % of the steady bench's fires down the
# one-by-one path, at seven single-row statements each, and that path cost the database more than settling itself
# (pg_stat_statements over a 3-minute `bench steady --rate 2315 --tenants 1000`: 85 s of the top statements' 436 s). A
# row not returned does not exist.
LOCK_OCCURRENCES = (
    """
SELECT mine.position, """
    + CLAIM_COLUMNS
    + """
FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[])
     WITH ORDINALITY AS mine(occurrence_id, scheduled_for, position)
JOIN dispatch_occurrence AS o ON o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
"""
    + schedule_of("o.schedule_id")
    + OWN_VERSION_SNAPSHOT
    + """ORDER BY o.occurrence_id, o.scheduled_for
FOR UPDATE OF o
"""
)

# The claim proper for many rows at once: CLAIM's conditions per row (observed state and generation), one statement.
CLAIM_MANY = """
UPDATE dispatch_occurrence AS o
SET state = 'running', attempt_count = o.attempt_count + 1,
    lease_expires_at = %(now)s::timestamptz + make_interval(secs => %(lease)s),
    state_reason = ''
FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(states)s::text[],
            %(attempt_counts)s::int[]) AS mine(occurrence_id, scheduled_for, state, attempt_count)
WHERE o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
  AND o.state = mine.state AND o.attempt_count = mine.attempt_count
RETURNING o.occurrence_id, o.attempt_count, o.lease_expires_at
"""

# INSERT_ATTEMPT for many rows: one attempt per claimed generation. A conflict (history that contradicts the claim)
# returns fewer rows; the caller then rolls the whole batch back and decides each occurrence alone.
INSERT_ATTEMPTS = """
INSERT INTO dispatch_attempt (occurrence_id, scheduled_for, generation, worker, started_at, heartbeat_at,
                              lease_expires_at, finished_at, outcome, error_class, error)
SELECT u.occurrence_id, u.scheduled_for, u.generation, %(worker)s, %(now)s, %(now)s, u.lease_expires_at,
       NULL, '', '', ''
FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(generations)s::int[],
            %(lease_expires_ats)s::timestamptz[]) AS u(occurrence_id, scheduled_for, generation, lease_expires_at)
ON CONFLICT (occurrence_id, scheduled_for, generation) DO NOTHING
RETURNING occurrence_id, id
"""

# Overlap: another occurrence of the schedule running under a live lease (its id goes into the reason). Read from
# dispatch_occurrence_watch (its index watch_active_by_schedule), which holds the running and waiting occurrences in the
# same transaction as the occurrence table; an expired lease does not count, its occurrence is the reaper's.
SIBLING_RUNNING = """
SELECT occurrence_id FROM dispatch_occurrence_watch
WHERE schedule_id = %(schedule_id)s AND state = 'running' AND lease_expires_at > %(now)s
  AND occurrence_id <> %(occurrence_id)s
LIMIT 1
"""

# queue_one: the occurrence held behind a running predecessor (retry_wait and never attempted; a retry parked by the
# overlap rule has attempt_count > 0 and is not the held one), oldest first so that a newer fire sees it is queued
# behind it. From the watch, like SIBLING_RUNNING.
SIBLING_WAITING = """
SELECT occurrence_id, scheduled_for FROM dispatch_occurrence_watch
WHERE schedule_id = %(schedule_id)s AND state = 'retry_wait' AND attempt_count = 0
  AND occurrence_id <> %(occurrence_id)s
ORDER BY scheduled_for
LIMIT 1
"""

# Misfire at claim time (fire_once): the newest fire of the same rhythm that is newer than this one, due, and not
# dropped. "Not dropped" rather than only "pending": deliveries are unordered, so the newer fire may already be
# running or finished when an older late one is claimed, and it is still the one that was emitted (with "pending"
# only, both would run). Manual triggers are outside the rhythm; forced rows (backfill, replay, fires kept across a
# version change) are fires of it and count. A range scan of occurrence_schedule_recent
# (schedule_id, scheduled_for DESC) between this fire and now; partitions outside that range are pruned.
NEWER_DUE_FIRE = """
SELECT scheduled_for FROM dispatch_occurrence
WHERE schedule_id = %(schedule_id)s AND scheduled_for > %(scheduled_for)s AND scheduled_for <= %(now)s
  AND state IN ('scheduled', 'enqueued', 'retry_wait', 'running', 'succeeded', 'dead')
  AND NOT manual
ORDER BY scheduled_for DESC
LIMIT 1
"""

# Misfire at claim time (catch_up): how many newer fires are late too, counting at most `limit`. A fire is late
# when its release instant (available_at: the fire time, its flexible slot or its paced catch-up slot) is before
# `late_before`; scheduled_for <= available_at always, so `scheduled_for < late_before` bounds the index range.
NEWER_LATE_FIRES = """
SELECT count(*) FROM (
    SELECT 1 FROM dispatch_occurrence
    WHERE schedule_id = %(schedule_id)s AND scheduled_for > %(scheduled_for)s AND scheduled_for < %(late_before)s
      AND available_at < %(late_before)s
      AND state IN ('scheduled', 'enqueued', 'retry_wait', 'running', 'succeeded', 'dead')
      AND NOT manual
    LIMIT %(limit)s
) AS newer
"""

# Side exits of a claim (missed, canceled, skipped_overlap, dead) and parking (retry_wait): one conditional UPDATE on
# the observed state and generation, with the rule that decided it in words. finished_at only for terminal states.
TRANSITION = """
UPDATE dispatch_occurrence
SET state = %(new_state)s::text,
    finished_at = CASE WHEN %(new_state)s::text = 'retry_wait' THEN NULL ELSE %(now)s::timestamptz END,
    available_at = COALESCE(%(available_at)s::timestamptz, available_at),
    lease_expires_at = NULL,
    state_reason = %(reason)s::text
WHERE occurrence_id = %(occurrence_id)s AND scheduled_for = %(scheduled_for)s
  AND state = %(state)s::text AND attempt_count = %(attempt_count)s
"""

# The claim proper. The generation (attempt_count) grows here and only here: it is the fencing token that every
# later heartbeat and completion must present. A reason left by parking no longer holds once it runs.
CLAIM = """
UPDATE dispatch_occurrence
SET state = 'running', attempt_count = attempt_count + 1,
    lease_expires_at = %(now)s::timestamptz + make_interval(secs => %(lease)s),
    state_reason = ''
WHERE occurrence_id = %(occurrence_id)s AND scheduled_for = %(scheduled_for)s
  AND state = %(state)s::text AND attempt_count = %(attempt_count)s
RETURNING attempt_count, lease_expires_at
"""

# One attempt per generation: attempt_generation_unique (occurrence_id, scheduled_for, generation). The claim above
# already serialises generations under the row lock, so a conflict means history that contradicts it (a restored
# backup, a hand-made row); the caller refuses the claim rather than record two attempts as one generation.
INSERT_ATTEMPT = """
INSERT INTO dispatch_attempt (occurrence_id, scheduled_for, generation, worker, started_at, heartbeat_at,
                              lease_expires_at, finished_at, outcome, error_class, error)
VALUES (%(occurrence_id)s, %(scheduled_for)s, %(generation)s, %(worker)s, %(now)s, %(now)s, %(lease_expires_at)s,
        NULL, '', '', '')
ON CONFLICT (occurrence_id, scheduled_for, generation) DO NOTHING
RETURNING id
"""

# A claim over an expired lease closes the dead predecessor's attempt, unless its worker already did.
CLOSE_EXPIRED_ATTEMPT = """
UPDATE dispatch_attempt
SET finished_at = %(now)s, outcome = 'expired', error_class = 'transient', error = 'lease expired'
WHERE occurrence_id = %(occurrence_id)s AND scheduled_for = %(scheduled_for)s AND generation = %(generation)s
  AND finished_at IS NULL
"""

# --- run -------------------------------------------------------------------------------------------------------

# Right before the side effect (docs/ARCHITECTURE.md rule 5): is the schedule still this version and not canceled,
# and is the occurrence still ours (same generation, running)?
PRECHECK = """
SELECT s.state, s.version, o.state, o.attempt_count, o.forced OR o.kept
FROM dispatch_occurrence AS o
JOIN schedules_schedule AS s ON s.id = o.schedule_id
WHERE o.occurrence_id = %(occurrence_id)s AND o.scheduled_for = %(scheduled_for)s
"""


# A batched claim takes the tenant's running slots after its claims (so the counter row is held only to the commit);
# the claims the quota then refused are put back here exactly as they were observed, in the same transaction, and
# their attempts deleted: to every other transaction they were never claimed. The caller parks them next. The held
# state comes in as a column for the reason given at COMPLETE_MANY.
UNCLAIM_MANY = """
WITH restored AS (
    UPDATE dispatch_occurrence AS o
    SET state = mine.state, attempt_count = mine.attempt_count, lease_expires_at = mine.lease_expires_at
    FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(states)s::text[],
                %(attempt_counts)s::int[], %(lease_expires_ats)s::timestamptz[], %(held_states)s::text[])
         AS mine(occurrence_id, scheduled_for, state, attempt_count, lease_expires_at, held_state)
    WHERE o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
      AND o.state = mine.held_state AND o.attempt_count = mine.attempt_count + 1
    RETURNING o.occurrence_id, o.scheduled_for, o.attempt_count + 1 AS generation
)
DELETE FROM dispatch_attempt AS a USING restored AS r
WHERE a.occurrence_id = r.occurrence_id AND a.scheduled_for = r.scheduled_for AND a.generation = r.generation
"""

# PRECHECK for the claims of an envelope, in one round trip right before their handlers start.
PRECHECK_MANY = """
SELECT o.occurrence_id, s.state, s.version, o.state, o.attempt_count, o.forced OR o.kept
FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[]) AS mine(occurrence_id, scheduled_for)
JOIN dispatch_occurrence AS o ON o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
""" + schedule_of("o.schedule_id")

# --- the worker pool's share per tenant (dispatch/engine/pool_share.py) ----------------------------------------

# Parking at claim, for many rows the claim already holds: the tenant's share of this process's pool is held by
# slow handlers, so these wait in retry_wait, attempts untouched, for their own envelope at `available_at` (as a
# claim over max_running waits). Each row only if still as observed, like TRANSITION.
PARK_MANY = """
UPDATE dispatch_occurrence AS o
SET state = 'retry_wait', finished_at = NULL, available_at = %(available_at)s, lease_expires_at = NULL,
    state_reason = %(reason)s
FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(states)s::text[],
            %(attempt_counts)s::int[]) AS mine(occurrence_id, scheduled_for, state, attempt_count)
WHERE o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
  AND o.state = mine.state AND o.attempt_count = mine.attempt_count
RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority, o.available_at
"""

# Handing back claims whose handlers never started (the envelope's turn on the worker ended first): each goes back to
# retry_wait with the generation it had before the claim and its attempt deleted, in one transaction, as a claim
# over the quota is undone (UNCLAIM_MANY): the attempt count is untouched, and the next claim takes the same
# generation again. Fenced on the claim's own generation, still running (nothing else can have taken a live lease).
# Locked in primary-key order, like every statement that changes many occurrences; the held state comes in as a
# column for the reason given at COMPLETE_MANY. The instant is the statement's, not clock_timestamp(): one instant for
# every row, so they leave in one envelope (the subquery may be evaluated again for each row of the join).
HAND_BACK_CLAIMS = """
WITH mine AS (
    SELECT * FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(generations)s::int[],
                         %(held_states)s::text[]) AS m(occurrence_id, scheduled_for, generation, held_state)
), locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN mine ON o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
), moved AS (
    UPDATE dispatch_occurrence AS o
    SET state = 'retry_wait', attempt_count = o.attempt_count - 1, lease_expires_at = NULL, finished_at = NULL,
        available_at = n.now + make_interval(secs => %(delay)s), state_reason = %(reason)s
    FROM mine
    JOIN locked ON locked.occurrence_id = mine.occurrence_id AND locked.scheduled_for = mine.scheduled_for,
         (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now) AS n
    WHERE o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
      AND o.state = mine.held_state AND o.attempt_count = mine.generation
    RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority, o.available_at, mine.generation
), forgotten AS (
    DELETE FROM dispatch_attempt AS a USING moved AS m
    WHERE a.occurrence_id = m.occurrence_id AND a.scheduled_for = m.scheduled_for AND a.generation = m.generation
)
SELECT occurrence_id, scheduled_for, tenant_id, lane, priority, available_at FROM moved
"""

# Handing back occurrences this worker never claimed (the ones an envelope leaves to try_claim: overlap policies
# other than allow): a first delivery or a due retry goes to retry_wait, attempts untouched, with its own envelope. A
# retry not yet due is an early duplicate (its own envelope will come), and anything claimed or ended meanwhile is not
# this delivery's: both are left alone. The lock is waited for here, as try_claim waits for it.
HAND_BACK_UNCLAIMED = """
WITH n AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[]) AS u(occurrence_id, scheduled_for)
      ON o.occurrence_id = u.occurrence_id AND o.scheduled_for = u.scheduled_for
    WHERE o.state IN ('scheduled', 'enqueued', 'retry_wait')
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
)
UPDATE dispatch_occurrence AS o
SET state = 'retry_wait', finished_at = NULL, lease_expires_at = NULL, state_reason = %(reason)s,
    available_at = n.now + make_interval(secs => %(delay)s)
FROM locked, n
WHERE o.occurrence_id = locked.occurrence_id AND o.scheduled_for = locked.scheduled_for
  AND (o.state IN ('scheduled', 'enqueued')
       OR (o.state = 'retry_wait' AND o.available_at <= n.now + make_interval(secs => %(early_tolerance)s)))
RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority, o.available_at
"""

# --- completion ------------------------------------------------------------------------------------------------

# A transient failure is about to become a retry: lock the row while this generation still owns it, so the deadline
# and the tenant's budget are settled for an attempt that is really ours (a fenced one takes no budget slot).
LOCK_RUNNING = """
SELECT COALESCE(%(now)s::timestamptz, clock_timestamp())
FROM dispatch_occurrence
WHERE occurrence_id = %(occurrence_id)s AND scheduled_for = %(scheduled_for)s
  AND state = 'running' AND attempt_count = %(generation)s
FOR UPDATE
"""

# Fencing (docs/ARCHITECTURE.md rule 5): only the current generation, still running, may complete. Zero rows means
# a newer attempt owns the occurrence (or the reaper took it): the completion is refused. The reason of a cancel is
# read from the schedule only on that (rare) path; every other outcome's reason comes from the caller.
COMPLETE = """
UPDATE dispatch_occurrence AS o
SET state = %(new_state)s::text,
    finished_at = CASE WHEN %(new_state)s::text = 'retry_wait' THEN NULL ELSE n.now END,
    available_at = CASE WHEN %(new_state)s::text = 'retry_wait'
                        THEN COALESCE(%(retry_at)s::timestamptz, n.now) ELSE o.available_at END,
    lease_expires_at = NULL,
    state_reason = CASE WHEN %(new_state)s::text = 'canceled'
                        THEN (SELECT CASE WHEN s.state = 'canceled' THEN 'schedule canceled'
                                          ELSE 'schedule changed to version ' || s.version END
                              FROM schedules_schedule AS s WHERE s.id = o.schedule_id)
                        ELSE %(reason)s::text END
FROM (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now) AS n
WHERE o.occurrence_id = %(occurrence_id)s AND o.scheduled_for = %(scheduled_for)s
  AND o.state = 'running' AND o.attempt_count = %(generation)s
RETURNING o.available_at, n.now
"""

# The attempt row is the worker's own: it is finished even when the completion was fenced.
FINISH_ATTEMPT = """
UPDATE dispatch_attempt
SET finished_at = COALESCE(%(now)s::timestamptz, clock_timestamp()), outcome = %(outcome)s,
    error_class = %(error_class)s, error = %(error)s
WHERE id = %(attempt_id)s AND scheduled_for = %(scheduled_for)s
"""

# COMPLETE for many attempts whose outcome needs no retry planning (succeeded, dead, canceled): one statement, each
# row fenced by its own generation. Rows missing from the result were fenced (a newer attempt or the reaper owns
# them); the reason of a cancel is read from the schedule as in COMPLETE.
# The state each row must still be in ('running') comes in as a column (held_state), as the callers of the other
# batched transitions pass it: one shape for every fenced batch, whatever state it holds.
# The rows are locked first in primary-key order (`locked`), the order the relay's settle step locks them in too:
# two statements that each change many occurrences wait for each other's rows, and in different orders they
# deadlocked (seen in a 100,000-fire drain: a settle batch against a completion, one envelope rolled back and retried).
# `envelope_ids` name the envelope each occurrence came in (the message says; NULL when it does not): when the relay
# has stamped it already, the completion copies its confirmation time and throttled mark onto the row it writes anyway,
# and settling later finds nothing left to write (dispatch/sql/outbox.py SETTLE_PUBLISHED). Under steady load that
# is most fires: one write of each occurrence fewer. The envelope is found by its primary key alone, its stamp read
# after: joined on `published_at IS NOT NULL` too, PostgreSQL took the partial index outbox_published (its predicate)
# and filtered every stamped envelope for each occurrence (auto_explain on the steady bench: 82,000 rows and 56,000
# of the statement's 61,000 buffers for 198 completions).
COMPLETE_MANY = """
WITH mine AS (
    SELECT * FROM unnest(%(occurrence_ids)s::uuid[], %(scheduled_fors)s::timestamptz[], %(generations)s::int[],
                         %(new_states)s::text[], %(reasons)s::text[], %(held_states)s::text[],
                         %(envelope_ids)s::bigint[])
         AS m(occurrence_id, scheduled_for, generation, new_state, reason, held_state, envelope_id)
), locked AS (
    SELECT o.occurrence_id, o.scheduled_for FROM dispatch_occurrence AS o
    JOIN mine ON o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
    ORDER BY o.occurrence_id, o.scheduled_for
    FOR UPDATE OF o
)
UPDATE dispatch_occurrence AS o
SET state = mine.new_state,
    finished_at = n.now,
    lease_expires_at = NULL,
    state_reason = CASE WHEN mine.new_state = 'canceled'
                        THEN (SELECT CASE WHEN s.state = 'canceled' THEN 'schedule canceled'
                                          ELSE 'schedule changed to version ' || s.version END
                              FROM schedules_schedule AS s WHERE s.id = o.schedule_id)
                        ELSE mine.reason END,
    enqueued_at = COALESCE(o.enqueued_at, envelope.published_at),
    throttled = o.throttled OR COALESCE(envelope.published_at IS NOT NULL AND envelope.throttled, false)
FROM mine
JOIN locked ON locked.occurrence_id = mine.occurrence_id AND locked.scheduled_for = mine.scheduled_for
LEFT JOIN dispatch_outboxmessage AS envelope ON envelope.id = mine.envelope_id,
     (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS now) AS n
WHERE o.occurrence_id = mine.occurrence_id AND o.scheduled_for = mine.scheduled_for
  AND o.state = mine.held_state AND o.attempt_count = mine.generation
RETURNING o.occurrence_id, n.now
"""

# FINISH_ATTEMPT for many: each attempt row is its worker's own, finished even when its completion was fenced.
FINISH_ATTEMPTS = """
UPDATE dispatch_attempt AS a
SET finished_at = COALESCE(%(now)s::timestamptz, clock_timestamp()), outcome = u.outcome,
    error_class = u.error_class, error = u.error
FROM unnest(%(attempt_ids)s::bigint[], %(scheduled_fors)s::timestamptz[], %(outcomes)s::text[],
            %(error_classes)s::text[], %(errors)s::text[]) AS u(attempt_id, scheduled_for, outcome, error_class, error)
WHERE a.id = u.attempt_id AND a.scheduled_for = u.scheduled_for
"""

# queue_one: the predecessor stopped running, so the occurrence held behind it is due now rather than at its next
# recheck; otherwise a newer fire arriving in between would find nothing running and skip it. The caller writes
# the new envelope for the returned row. The held rows are found in the watch (watch_active_by_schedule); the conditions
# are checked again on the occurrence row itself.
RELEASE_HELD = """
UPDATE dispatch_occurrence AS o
SET available_at = %(now)s
FROM dispatch_occurrence_watch AS w
WHERE w.schedule_id = %(schedule_id)s AND w.state = 'retry_wait' AND w.attempt_count = 0
  AND o.occurrence_id = w.occurrence_id AND o.scheduled_for = w.scheduled_for
  AND o.state = 'retry_wait' AND o.attempt_count = 0 AND o.available_at > %(now)s
RETURNING o.occurrence_id, o.scheduled_for, o.tenant_id, o.lane, o.priority
"""

# --- tenant retry budget ---------------------------------------------------------------------------------------

# Table dispatch_tenant_retry_window (migration 0006): per tenant and UTC minute, how many retries were granted to
# run in it. The tenant's cap, and the minutes from `window` on that are already full (the ones to jump over), in
# one read. A tenant with cap 0 (unlimited) gets no list.
RETRY_BUDGET = """
SELECT t.max_retries_per_minute,
       ARRAY(SELECT w.window_start FROM dispatch_tenant_retry_window AS w
             WHERE w.tenant_id = t.id AND w.window_start >= %(window)s
               AND t.max_retries_per_minute > 0 AND w.used >= t.max_retries_per_minute
             ORDER BY w.window_start
             LIMIT %(scan)s)
FROM tenants_tenant AS t
WHERE t.id = %(tenant_id)s
"""

# Take one slot of a minute, atomically across workers: the row lock of the upsert serialises takers, and the
# conditional DO UPDATE refuses (no row returned) once the minute is full, so the caller moves to the next minute.
# Returns the slot's position in the minute (1..cap).
TAKE_RETRY_SLOT = """
INSERT INTO dispatch_tenant_retry_window AS w (tenant_id, window_start, used)
VALUES (%(tenant_id)s, %(window)s, 1)
ON CONFLICT (tenant_id, window_start) DO UPDATE SET used = w.used + 1
WHERE w.used < %(limit)s
RETURNING w.used
"""

# Minutes long past are of no use to anyone; the lease reaper's pass drops them.
PRUNE_RETRY_WINDOWS = """
DELETE FROM dispatch_tenant_retry_window WHERE window_start < clock_timestamp() - make_interval(secs => %(keep)s)
"""
