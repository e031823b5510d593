"""Every hot statement of the data plane, one module per concern: materialize, outbox, claims, leases, maintenance.

Names are unique across the modules, so a statement is found by name with one grep.
"""

from __future__ import annotations

# An occurrence's own version's definition, as `v`, for an occurrence `o` of schedule `s`: NULL (one filter, no index
# probe) when the occurrence is of the current version, so callers COALESCE each field with the schedule row's.
# OFFSET 0 keeps it a subquery the planner cannot flatten into a probe per row (dispatch/sql/claims.py measures it).
OWN_VERSION_SNAPSHOT = """
LEFT JOIN LATERAL (
    SELECT definition FROM schedules_scheduleversion
    WHERE schedule_id = o.schedule_id AND version = o.schedule_version AND o.schedule_version <> s.version
    OFFSET 0
) AS v ON true
"""

# PostgreSQL's clock: the one every node agrees on (ARCHITECTURE rule 1).
DB_NOW = "SELECT clock_timestamp()"
