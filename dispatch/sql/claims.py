"""The hot SQL of the workers' claim, pre-check and completion, with why each statement is shaped so.

Conventions as in dispatch/sql/__init__.py: the occurrence table is partitioned by scheduled_for, so every statement
names both occurrence_id AND scheduled_for (partition pruning to one index probe); each state change is one conditional
UPDATE whose WHERE names the state (and generation) the caller observed, and the caller checks the row count;
"now" is `COALESCE(%(now)s, clock_timestamp())`: PostgreSQL's clock unless a test drives time.

Lock order, shared with the control plane (schedules/services.py locks the schedule, then updates occurrences):
schedule row first, then the occurrence row. A claim that needs no schedule lock (overlap `allow`) takes just the
occurrence row, so no claim can deadlock with a cancel. A claim that finds an overlap policy on the occurrence's
schedule releases the occurrence row and starts again, taking the schedule row first.
"""

from __future__ import annotations

# --- claim -----------------------------------------------------------------------------------------------------

# Serialises the overlap decision of all occurrences of one schedule: with the row held, two occurrences can never
# both see "no predecessor running" (ARCHITECTURE rule 8). Taken only for skip_if_running / queue_one.
LOCK_SCHEDULE = """
SELECT overlap_policy FROM schedules_schedule WHERE id = %(schedule_id)s FOR UPDATE
"""

# The occurrence row locked for the claim transaction, with the schedule as it is now (version re-check) and the
# instant every decision of this claim uses.
LOCK_OCCURRENCE = """
SELECT o.state, o.attempt_count, o.lease_expires_at, o.available_at, o.schedule_version, o.tenant_id, o.lane,
       o.priority, s.id, s.state, s.version, s.overlap_policy, s.max_attempts, s.handler, s.payload, o.forced,
       COALESCE(%(now)s::timestamptz, clock_timestamp())
FROM dispatch_occurrence AS o
JOIN schedules_schedule AS s ON s.id = o.schedule_id
WHERE o.occurrence_id = %(occurrence_id)s AND o.scheduled_for = %(scheduled_for)s
FOR UPDATE OF o
"""

# Overlap: another occurrence of the schedule running under a live lease. Served by occurrence_schedule_recent
# (schedule_id, scheduled_for); an expired lease does not count, its occurrence is the reaper's.
SIBLING_RUNNING = """
SELECT EXISTS (
    SELECT 1 FROM dispatch_occurrence
    WHERE schedule_id = %(schedule_id)s AND state = 'running' AND lease_expires_at > %(now)s
      AND occurrence_id <> %(occurrence_id)s
)
"""

# queue_one: the one occurrence already parked behind a running predecessor (retry_wait, never attempted).
SIBLING_WAITING = """
SELECT EXISTS (
    SELECT 1 FROM dispatch_occurrence
    WHERE schedule_id = %(schedule_id)s AND state = 'retry_wait' AND attempt_count = 0
      AND occurrence_id <> %(occurrence_id)s
)
"""

# Side exits of a claim (canceled, skipped_overlap, dead) and parking (retry_wait): one conditional UPDATE on the
# observed state and generation. finished_at only for terminal states.
TRANSITION = """
UPDATE dispatch_occurrence
SET state = %(new_state)s::text,
    finished_at = CASE WHEN %(new_state)s::text = 'retry_wait' THEN NULL ELSE %(now)s::timestamptz END,
    available_at = COALESCE(%(available_at)s::timestamptz, available_at),
    lease_expires_at = NULL
WHERE occurrence_id = %(occurrence_id)s AND scheduled_for = %(scheduled_for)s
  AND state = %(state)s::text AND attempt_count = %(attempt_count)s
"""

# The claim proper. The generation (attempt_count) grows here and only here: it is the fencing token that every
# later heartbeat and completion must present.
CLAIM = """
UPDATE dispatch_occurrence
SET state = 'running', attempt_count = attempt_count + 1,
    lease_expires_at = %(now)s::timestamptz + make_interval(secs => %(lease)s)
WHERE occurrence_id = %(occurrence_id)s AND scheduled_for = %(scheduled_for)s
  AND state = %(state)s::text AND attempt_count = %(attempt_count)s
RETURNING attempt_count, lease_expires_at
"""

INSERT_ATTEMPT = """
INSERT INTO dispatch_attempt (occurrence_id, scheduled_for, generation, worker, started_at, heartbeat_at,
                              lease_expires_at, finished_at, outcome, error_class, error)
VALUES (%(occurrence_id)s, %(scheduled_for)s, %(generation)s, %(worker)s, %(now)s, %(now)s, %(lease_expires_at)s,
        NULL, '', '', '')
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

# Right before the side effect (ARCHITECTURE rule 5): is the schedule still this version and not canceled, and is
# the occurrence still ours (same generation, running)?
PRECHECK = """
SELECT s.state, s.version, o.state, o.attempt_count, o.forced
FROM dispatch_occurrence AS o
JOIN schedules_schedule AS s ON s.id = o.schedule_id
WHERE o.occurrence_id = %(occurrence_id)s AND o.scheduled_for = %(scheduled_for)s
"""


# --- completion ------------------------------------------------------------------------------------------------

# Fencing (ARCHITECTURE rule 5): only the current generation, still running, may complete. Zero rows means a
# newer attempt owns the occurrence (or the reaper took it): the completion is refused.
COMPLETE = """
UPDATE dispatch_occurrence AS o
SET state = %(new_state)s::text,
    finished_at = CASE WHEN %(new_state)s::text = 'retry_wait' THEN NULL ELSE n.now END,
    available_at = CASE WHEN %(new_state)s::text = 'retry_wait'
                        THEN n.now + make_interval(secs => %(backoff)s) ELSE o.available_at END,
    lease_expires_at = NULL
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
