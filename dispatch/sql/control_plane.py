"""What the data plane reads of the control plane's rows: a schedule's state, its version history, a tenant's
schedules and catch-up budget.

The data plane never imports the control plane's code (docs/ARCHITECTURE.md, "Layers"): like the engine's hot
statements, which join `schedules_schedule` and `schedules_schedulecursor`, these read its tables by SQL.
"""

from __future__ import annotations

SCHEDULE_STATE = "SELECT state FROM schedules_schedule WHERE id = %(schedule_id)s"

# A re-run (dispatch/rerun.py) holds its schedule's row while it decides, in the lock order of docs/ARCHITECTURE.md
# (schedule row, then occurrence rows): a cancel, which takes the row FOR UPDATE and then withdraws the unclaimed
# occurrences, serialises with it (canceled first: the re-run is refused; the re-run first: the cancel withdraws it),
# and so does a claim under an overlap policy other than allow, which takes the row FOR UPDATE first too.
SCHEDULE_FOR_RERUN = "SELECT state, overlap_policy FROM schedules_schedule WHERE id = %(schedule_id)s FOR SHARE"

# The versions of these schedules that overlap [since, until), by schedule then version. Only the time fields of the
# snapshot are read out of its JSON: a payload of up to 64 KiB per version would otherwise dominate the reconciler's
# memory. Each is text, as stored in the snapshot; dispatch/history.py parses and checks it.
VERSION_SPANS = """
SELECT schedule_id, tenant_id, version, change, valid_from, valid_to,
       definition ->> 'state' AS state, definition ->> 'kind' AS kind, definition ->> 'cron' AS cron,
       definition ->> 'run_at' AS run_at, definition ->> 'every_seconds' AS every_seconds,
       definition ->> 'anchor_at' AS anchor_at, definition ->> 'timezone' AS timezone, definition ->> 'lane' AS lane,
       definition ->> 'priority' AS priority, definition ->> 'dst_gap' AS dst_gap,
       definition ->> 'dst_repeat' AS dst_repeat, definition ->> 'start_at' AS start_at,
       definition ->> 'end_at' AS end_at, definition ->> 'remaining_runs' AS remaining_runs,
       definition ->> 'exclude_calendars' AS exclude_calendars
FROM schedules_scheduleversion
WHERE schedule_id = ANY(%(schedule_ids)s::uuid[])
  AND valid_from < %(until)s AND (valid_to IS NULL OR valid_to > %(since)s)
ORDER BY schedule_id, version
"""

# The contents the named calendars had over a window (their revisions, kept after a calendar is deleted): what
# reconcile and backfill judge a calendar-excluded fire by (dispatch/history.py calendar_history).
CALENDAR_HISTORY = """
SELECT rev.tenant_id, rev.name, rev.dates::text, rev.ranges::text, rev.valid_from, rev.valid_to
FROM schedules_calendarrevision AS rev
JOIN unnest(%(tenant_ids)s::bigint[], %(names)s::text[]) AS named(tenant_id, name)
  ON rev.tenant_id = named.tenant_id AND rev.name = named.name
WHERE rev.valid_from < %(until)s AND (rev.valid_to IS NULL OR rev.valid_to > %(since)s)
ORDER BY rev.tenant_id, rev.name, rev.valid_from
"""

# One page of the ids of schedules with a version overlapping [since, until), after `after` (keyset pagination, so
# memory stays bounded however many schedules there are), of one tenant or of all.
SCHEDULES_WITH_VERSIONS = """
SELECT DISTINCT schedule_id
FROM schedules_scheduleversion
WHERE valid_from < %(until)s AND (valid_to IS NULL OR valid_to > %(since)s)
  AND (%(tenant_id)s::bigint IS NULL OR tenant_id = %(tenant_id)s::bigint)
  AND (%(after)s::uuid IS NULL OR schedule_id > %(after)s::uuid)
ORDER BY schedule_id
LIMIT %(limit)s
"""

# Every schedule of a tenant, whatever its state: a deleted tenant's occurrences are found through them
# (occurrence_schedule_recent), so their cancel costs the tenant's size, not the table's.
TENANT_SCHEDULE_IDS = "SELECT id FROM schedules_schedule WHERE tenant_id = %(tenant_id)s"

# The catch-up budget of each of these tenants (a backfill's fires are paced on it like any catch-up).
TENANT_CATCHUP_RATES = "SELECT id, max_catchup_per_minute FROM tenants_tenant WHERE id = ANY(%(tenant_ids)s::bigint[])"

# The keys that sign a tenant's webhook calls now (tenants/signing.py keeps them), judged by PostgreSQL's clock: the
# current secret, then the previous one while its rotation overlap lasts. Both sealed (core/sealing.py).
WEBHOOK_SIGNING_SECRETS = """
SELECT current, CASE WHEN previous_until > now() THEN previous ELSE '' END
FROM tenants_webhooksecret WHERE tenant_id = %(tenant_id)s
"""
# A tenant's first secret, made by its first webhook call if nothing made it before (the first maker wins).
MAKE_WEBHOOK_SECRET = """
INSERT INTO tenants_webhooksecret (tenant_id, current, previous, created_at)
VALUES (%(tenant_id)s, %(sealed)s, '', now())
ON CONFLICT (tenant_id) DO NOTHING
"""
