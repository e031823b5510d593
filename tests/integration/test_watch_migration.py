"""Migration 0017 on a table that already holds fires: the watch starts with exactly the running, waiting and dead
ones, the partial indexes on state are gone (so state changes can be HOT), and going back restores them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.databases import admin_connection, manage_on, own_database

STATES = ("scheduled", "running", "retry_wait", "succeeded", "dead", "canceled")
OLD_INDEXES = {"occurrence_dead", "occurrence_running_lease", "occurrence_active_by_schedule"}


@pytest.fixture
def database_before_the_watch() -> Iterator[str]:
    with own_database("watch_migration", "dispatch", "0016") as name:
        yield name


def _indexes(connection) -> set[str]:
    rows = connection.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'dispatch_occurrence'").fetchall()
    return {row[0] for row in rows}


def test_the_watch_starts_with_the_fires_in_watched_states_and_the_partial_indexes_go(database_before_the_watch):
    with admin_connection(database_before_the_watch) as db:
        db.execute(
            """
            INSERT INTO dispatch_occurrence (occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for,
                                             available_at, lane, state, attempt_count, lease_expires_at)
            SELECT gen_random_uuid(), gen_random_uuid(), 7, 1, now() - make_interval(days => n %% 3), now(),
                   'strict', (%(states)s::text[])[1 + n %% 6], n %% 4, now() + make_interval(secs => n)
            FROM generate_series(0, 59) AS n
            """,
            {"states": list(STATES)},
        )
        assert _indexes(db) >= OLD_INDEXES

        done = manage_on(database_before_the_watch, "migrate", "dispatch", "0017", "--noinput")
        assert done.returncode == 0, done.stderr[-4000:]

        expected = db.execute(
            """SELECT occurrence_id, scheduled_for, schedule_id, tenant_id, state, attempt_count, lease_expires_at
               FROM dispatch_occurrence WHERE state IN ('running', 'retry_wait', 'dead') ORDER BY occurrence_id"""
        ).fetchall()
        watched = db.execute("SELECT * FROM dispatch_occurrence_watch ORDER BY occurrence_id").fetchall()
        assert len(expected) == 30 and watched == expected
        assert not OLD_INDEXES & _indexes(db)

        back = manage_on(database_before_the_watch, "migrate", "dispatch", "0016", "--noinput")
        assert back.returncode == 0, back.stderr[-4000:]
        assert _indexes(db) >= OLD_INDEXES
        assert db.execute("SELECT to_regclass('dispatch_occurrence_watch')").fetchone()[0] is None
