"""Running counts are locked in tenant_id order by every statement that may wait for them (docs/ARCHITECTURE.md,
"Lock order"): a completion giving back slots of many tenants deadlocked against a claim taking slots of the same
tenants when the give-back locked them in the order its join produced (`bench steady`, 1,000 tenants)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, transaction

from dispatch.quotas import lock_running_rows, release_running_slots
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Ids no tenant has, so the rows belong to this test alone; the counter table has no foreign key to tenants.
FIRST_ID, COUNT = 9_100_001, 1_000
ALL_IDS = list(range(FIRST_ID, FIRST_ID + COUNT))
# A completion's bundle: a few dozen of the thousand tenants. (Giving back all of them, PostgreSQL merged the two in
# key order; a few dozen it hashed and scanned the table in its physical order.)
IDS = ALL_IDS[::25]


def raw_connection() -> psycopg.Connection:
    settings = connection.settings_dict
    return psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"], port=settings["PORT"] or 5432
    )


@pytest.fixture
def counters_in_reverse_order():
    """Running counts of 1,000 tenants written highest id first, so the table's physical order is the reverse of the
    key order (as rows created in the order tenants first ran), with statistics that make a join scan the table."""
    with raw_connection() as setup:
        setup.execute(
            "INSERT INTO dispatch_tenant_running (tenant_id, running, last_taken) "
            "SELECT id, 5, 0 FROM unnest(%s::bigint[]) AS x(id) ORDER BY id DESC",
            [ALL_IDS],
        )
        setup.execute("ANALYZE dispatch_tenant_running")
    yield
    with raw_connection() as cleanup:
        cleanup.execute("DELETE FROM dispatch_tenant_running WHERE tenant_id = ANY(%s)", [ALL_IDS])


def waits_on_a_lock(pid: int) -> bool:
    with raw_connection() as probe:
        row = probe.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return row is not None and row[0] == "Lock"


def locked_elsewhere(tenant_id: int) -> bool:
    with raw_connection() as probe:
        try:
            probe.execute("SELECT 1 FROM dispatch_tenant_running WHERE tenant_id = %s FOR UPDATE NOWAIT", [tenant_id])
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def run_holding_the_highest(statement) -> None:
    """Hold the highest tenant's row elsewhere, run `statement(cursor)` in a thread, and check that once it waits, it
    holds the lowest tenant's row: it takes the rows in key order, so nobody taking them in that order can hold one
    it wants while waiting for one it holds."""
    holder = raw_connection()
    holder.execute("SELECT 1 FROM dispatch_tenant_running WHERE tenant_id = %s FOR UPDATE", [IDS[-1]])
    state: dict = {}

    def run() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                state["pid"] = cursor.fetchone()[0]
                statement(cursor)
        finally:
            connection.close()

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait_for(lambda: "pid" in state and waits_on_a_lock(state["pid"]), 10, "the statement to wait for the row")
        assert locked_elsewhere(IDS[0]), "it waits for the highest row without holding the lowest: out of order"
    finally:
        holder.rollback()
        holder.close()
        worker.join(timeout=10)
    assert not worker.is_alive()


def test_giving_back_slots_of_many_tenants_locks_their_counts_in_tenant_order(counters_in_reverse_order):
    run_holding_the_highest(lambda cursor: release_running_slots(cursor, IDS))
    with raw_connection() as check:
        running = check.execute(
            "SELECT DISTINCT running FROM dispatch_tenant_running WHERE tenant_id = ANY(%s)", [IDS]
        ).fetchall()
    assert running == [(4,)], "every tenant gave back its one slot"


def test_a_claim_batch_giving_back_and_taking_slots_locks_every_count_first_in_tenant_order(
    counters_in_reverse_order,
):
    run_holding_the_highest(lambda cursor: lock_running_rows(cursor, IDS[::-1]))
