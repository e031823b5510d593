"""Statements of the notification sender (dispatch/notifications.py). The notifications table is small next to the
occurrences (a row per event a tenant asked for); the partial index notification_due finds the sendable ones."""

from __future__ import annotations

# Take up to %(limit)s due notifications, at most %(per_tenant)s of one tenant (a tenant with a backlog does not hold
# the others' back), with the target's URL as it is now. Each is stamped with this take's %(lease)s and its
# next_attempt_at moves ahead by %(lease_seconds)s: a sender that dies mid-send leaves it to another after that, and
# every record below names the lease, so a sender whose lease ran out records nothing. SKIP LOCKED lets several
# workers' senders share the table. clock_timestamp() here and below: the statement's instant, not a transaction's.
TAKE_DUE = """
UPDATE dispatch_notification AS n
SET next_attempt_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s), lease = %(lease)s
FROM (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY tenant_id ORDER BY next_attempt_at, id) AS place
        FROM (
            SELECT id, tenant_id, next_attempt_at FROM dispatch_notification
            WHERE delivered_at IS NULL AND given_up_at IS NULL AND next_attempt_at <= clock_timestamp()
            ORDER BY next_attempt_at, id
            LIMIT %(scan)s
            FOR UPDATE SKIP LOCKED
        ) AS locked
    ) AS ranked
    WHERE place <= %(per_tenant)s
    ORDER BY id
    LIMIT %(limit)s
) AS due
WHERE n.id = due.id
RETURNING n.id, n.tenant_id, n.event, n.occurrence_id, n.scheduled_for, n.schedule_id, n.state, n.state_reason,
          n.attempts, COALESCE(n.first_tried_at, clock_timestamp()),
          (SELECT t.url FROM tenants_notificationtarget AS t WHERE t.tenant_id = n.tenant_id),
          -- What the last attempt said (a dead fire's error): its partition by scheduled_for, its row by key.
          (SELECT a.error FROM dispatch_attempt AS a
           WHERE a.occurrence_id = n.occurrence_id AND a.scheduled_for = n.scheduled_for
           ORDER BY a.generation DESC LIMIT 1)
"""

# A call was made: counted, and the first one's instant kept (giving up is judged from it).
TRIED = """
UPDATE dispatch_notification SET attempts = attempts + 1, first_tried_at = COALESCE(first_tried_at, clock_timestamp())
WHERE id = ANY(%(ids)s) AND lease = %(lease)s
"""

DELIVERED = """
UPDATE dispatch_notification SET delivered_at = clock_timestamp(), last_error = ''
WHERE id = ANY(%(ids)s) AND lease = %(lease)s
"""

# Sent again after %(delay)s seconds.
RETRY_LATER = """
UPDATE dispatch_notification
SET next_attempt_at = clock_timestamp() + make_interval(secs => %(delay)s), last_error = %(error)s
WHERE id = ANY(%(ids)s) AND lease = %(lease)s
"""

GIVE_UP = """
UPDATE dispatch_notification SET given_up_at = clock_timestamp(), last_error = %(error)s
WHERE id = ANY(%(ids)s) AND lease = %(lease)s
"""

# One sender at a time runs the stuck search (a transaction-scoped advisory lock; the others skip it).
STUCK_SEARCH_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('dispatch.notifications.stuck'))"

# The tenants that asked to hear of stuck occurrences.
STUCK_SUBSCRIBERS = "SELECT tenant_id FROM tenants_notificationtarget WHERE 'stuck' = ANY(events)"

# The target's selector (tenants.NotificationTarget.selector_match: the labels a schedule must hold, and the pairs
# it must not) is applied as the row trigger applies it (dispatch migration 0021), by jsonb containment.
RECORD_STUCK = """
INSERT INTO dispatch_notification (tenant_id, event, occurrence_id, scheduled_for, schedule_id, state, state_reason)
SELECT u.* FROM unnest(%(tenant_ids)s::bigint[], %(events)s::text[], %(occurrence_ids)s::uuid[],
                       %(scheduled_fors)s::timestamptz[], %(schedule_ids)s::uuid[], %(states)s::text[],
                       %(reasons)s::text[]) AS u (tenant_id, event, occurrence_id, scheduled_for, schedule_id, state,
                                                 state_reason)
JOIN tenants_notificationtarget AS t ON t.tenant_id = u.tenant_id
WHERE t.selector_match IS NULL OR EXISTS (
    SELECT 1 FROM schedules_schedule AS s
    WHERE s.id = u.schedule_id AND s.labels @> (t.selector_match -> 'equal')
      AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(t.selector_match -> 'not_equal') AS e (pair)
                      WHERE s.labels @> e.pair))
ON CONFLICT (event, occurrence_id) DO NOTHING
"""

# Notifications are kept as long as occurrences (the retention), so an event is never told twice.
FORGET_OLD = "DELETE FROM dispatch_notification WHERE created_at < clock_timestamp() - make_interval(days => %(days)s)"

# What a tenant's notifications are doing, for GET /api/v1/notifications/.
DELIVERY_STATE = """
SELECT count(*) FILTER (WHERE delivered_at IS NULL AND given_up_at IS NULL),
       count(*) FILTER (WHERE given_up_at IS NOT NULL),
       (SELECT last_error FROM dispatch_notification
        WHERE tenant_id = %(tenant_id)s AND last_error <> '' ORDER BY next_attempt_at DESC LIMIT 1)
FROM dispatch_notification WHERE tenant_id = %(tenant_id)s
"""
