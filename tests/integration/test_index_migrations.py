"""The schedule table's indexes added on a live installation (schedules migrations 0019 and 0020) are built
CONCURRENTLY: no reader or writer waits for them, and a transaction left open fails the migration within seconds
instead of stalling it without end; run again, it drops the INVALID index the failed build left and builds it anew."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.databases import admin_connection, manage_on, own_database

INDEXES = ("schedule_tenant_name", "schedule_labels")


@pytest.fixture
def database_before_indexes() -> Iterator[str]:
    with own_database("index_migrations", "schedules", "0018") as name:
        yield name


def _valid(connection) -> dict[str, bool]:
    rows = connection.execute(
        "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = ANY(%s)",
        [list(INDEXES)],
    ).fetchall()
    return dict(rows)


@pytest.mark.slow
def test_an_open_transaction_fails_the_concurrent_build_and_a_second_run_builds_it(database_before_indexes):
    with admin_connection(database_before_indexes) as observer:
        observer.autocommit = True
        with admin_connection(database_before_indexes) as idle:
            # A report's transaction left open on a snapshot it still holds (idle in transaction): a concurrent build
            # must wait for every snapshot older than its own.
            idle.autocommit = False
            idle.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            idle.execute("SELECT count(*) FROM schedules_schedule").fetchone()

            held = manage_on(database_before_indexes, "migrate", "schedules", "--noinput", timeout=120)

            assert held.returncode != 0 and "lock timeout" in held.stderr, held.stderr[-2000:]
            assert _valid(observer) in ({}, {"schedule_tenant_name": False}), "at most an INVALID leftover"
            idle.rollback()

        free = manage_on(database_before_indexes, "migrate", "schedules", "--noinput", timeout=120)

        assert free.returncode == 0, free.stderr[-4000:]
        assert _valid(observer) == dict.fromkeys(INDEXES, True)
