"""Every hot statement of the data plane, one module per concern: materialize, outbox, claims, leases, maintenance.

Names are unique across the modules, so a statement is found by name with one grep.

Lock order of occurrence rows: a statement that changes many occurrences and may wait for their locks (the relay's
settle and throttle marking, the workers' batched claim, completion and lease renewal, a schedule change withdrawing
its occurrences) locks them in primary-key order first, `ORDER BY occurrence_id, scheduled_for FOR UPDATE`. Two such
statements over the same rows then wait for each other instead of deadlocking; in the order their join happened to
produce they did (seen at 100,000 fires: settle against completion, settle against renewal). Statements that never
wait (the reaper's SKIP LOCKED) need no order.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import psycopg


# The schedule `s` of each row of a batch, probed by its primary key. A batch's keys come from unnest() joined to the
# partitioned occurrence table, and the partitioned table has no statistics of its own (nothing analyzes it, not even
# autovacuum): the planner takes n_distinct's default of 200 on both sides of each key column, so a batch looks like a
# share of the whole day (58,000 rows for 772 keys in a 3 M-row partition), and it hashes the whole schedule table
# instead of probing it (238,900 schedules read in sequence, the hash spilled to disk: the workers' claim went from 22
# to 104 ms a batch on average, ten minutes into a steady benchmark). A lateral subquery that names the row's
# schedule, kept apart by OFFSET 0, can only be probed once per row.
def schedule_of(schedule_id: str) -> str:
    return f"CROSS JOIN LATERAL (SELECT * FROM schedules_schedule WHERE id = {schedule_id} OFFSET 0) AS s\n"


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


# The dead-letter queue, as a condition on a watch row `w`: dead, and that death not resolved by an operator
# (dispatch/dlq.py). A resolution names the generation the occurrence died at, so one replayed that dies again is in
# the queue again. The resolution table is small (operators' decisions): the planner hashes it once per statement.
UNRESOLVED_DEAD = """w.state = 'dead' AND NOT EXISTS (
    SELECT 1 FROM dispatch_occurrence_resolution AS r
    WHERE r.occurrence_id = w.occurrence_id AND r.scheduled_for = w.scheduled_for
      AND r.attempt_count = w.attempt_count)"""


class PreparedCursor:
    """A cursor on Django's connection (same transaction) that has PostgreSQL keep the plan of each statement.

    Django's psycopg cursors bind parameters on the client, so the server parses and plans every statement anew: for
    the workers' batched statements on the partitioned occurrence table that planning cost as much as running them
    (~8 ms of 16, EXPLAIN ANALYZE at 100,000 rows: every partition and its indexes, and the planner's probes of
    index ends full of dead tuples during a burst). These statements are bound on the server and prepared once per
    connection instead. It also skips django-tenants' `SET search_path` that each new Django cursor sends (the engine
    tables are in the public schema, the connection's default). Errors are Django's (DatabaseError and kin).
    """

    def __init__(self) -> None:
        from django.db import connection

        connection.ensure_connection()
        self._django = connection
        self._cursor = psycopg.Cursor(connection.connection)

    def execute(self, query: str, params: Any = None) -> None:
        with self._django.wrap_database_errors:
            # Binary results too: timestamps and uuids are unpacked instead of parsed from text.
            self._cursor.execute(_binary(query), params, prepare=True, binary=True)

    def executemany(self, query: str, params_seq: Any) -> None:
        with self._django.wrap_database_errors:
            self._cursor.executemany(_binary(query), params_seq)

    def copy_rows(self, statement: str, types: list[str], rows: Any) -> None:
        """COPY `rows` in binary with `statement` (COPY ... FROM STDIN (FORMAT BINARY)), in the same transaction."""
        copy_rows(self, statement, types, rows)

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def __enter__(self) -> PreparedCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()


def copy_rows(cursor: Any, statement: str, types: list[str], rows: Any) -> None:
    """COPY `rows` in binary on the caller's cursor, a PreparedCursor or a Django cursor, in its transaction."""
    from django.db import connection

    raw = cursor._cursor if isinstance(cursor, PreparedCursor) else cursor.cursor
    with connection.wrap_database_errors, raw.copy(statement) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


@functools.lru_cache(maxsize=256)
def _binary(query: str) -> str:
    """The query with its placeholders asking for binary parameters (`%b`): arrays of a thousand uuids and instants
    are packed as bytes instead of quoted text element by element (a fifth of the materializer's CPU)."""
    return _PLACEHOLDER.sub(lambda m: m.group(0)[:-1] + "b", query)


# `%s` and `%(name)s`, not preceded by another `%` (a literal `%%s` stays text).
_PLACEHOLDER = re.compile(r"(?<!%)%(?:\(\w+\))?s")


def database_conninfo() -> str:
    """The Django connection's parameters (the test database under pytest) as a libpq conninfo string: the relay's
    and the settler's own connections, outside the ORM, take the same options, and the same servers the same way (a
    multi-host HOST with target_session_attrs follows the primary after a failover, docs/DEPLOYMENT.md)."""
    from django.db import connection

    from scheduler_project.database_url import libpq_parameters

    params = connection.settings_dict
    options = params.get("OPTIONS", {})
    # The libpq parameters among OPTIONS (target_session_attrs, connect_timeout, sslmode...); Django's own keys
    # (isolation_level, pool...) are not libpq's and stay out.
    libpq = {key: str(value) for key, value in options.items() if key in libpq_parameters()}
    return psycopg.conninfo.make_conninfo(
        dbname=params["NAME"],
        user=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=params.get("HOST") or None,
        port=str(params["PORT"]) if params.get("PORT") else None,
        options=options.get("options") or None,
        **libpq,
    )
