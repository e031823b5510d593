"""The materializers' upkeep (dispatch/upkeep.py): partitions tried again soon when a long read holds their lock,
days past the retention dropped only once their fires have finished, and VACUUM where autovacuum is off.

These tests commit (transaction=True): upkeep runs in autocommit, and a lock another connection holds is only real
on committed tables.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import Client

from core.clock import db_now
from dispatch import counters, partitions
from dispatch import upkeep as upkeep_module
from dispatch.models import Occurrence, OccurrenceWatch, OutboxMessage
from dispatch.upkeep import LARGE_LANE, SMALL_LANE, Upkeep
from tests.integration.processes import process_env, run_manage
from tests.integration.test_faults_time import drop_partitions_from
from tests.integration.test_metrics import scrape
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class DrivenClock:
    """The upkeep's monotonic clock, moved by the test: when a task is due again is what these tests check."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def long_read(table: str = "dispatch_occurrence", seconds: float = 60) -> Iterator[None]:
    """Another connection that has read `table` and stays in its transaction, as a 45-second report or pg_dump does:
    ACCESS SHARE on the table (on a partitioned one, on every partition) until the block ends, or until the server
    ends the read after `seconds` idle in it, whatever the test is doing then (a test thread stuck behind a DDL
    statement must not keep the read open forever)."""
    reader = psycopg.connect(process_env()["DATABASE_URL"])
    try:
        reader.execute(f"SET idle_in_transaction_session_timeout = '{round(seconds * 1000)}ms'")
        reader.execute(f"SELECT count(*) FROM {table}").fetchone()
        yield
    finally:
        reader.close()  # its transaction ends with it (rolled back), if the server has not ended it already


def command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def days_of(table: str = "dispatch_occurrence") -> set:
    return partitions.existing_partition_days(connection, table)


# --- partitions ----------------------------------------------------------------------------------------------------


def test_partitions_a_long_read_holds_up_are_tried_again_soon_and_the_failure_is_logged_once(
    tenant_a, settings, caplog
):
    """The defect: a day whose DDL failed was remembered as known and never tried again by that process."""
    settings.SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS = 0.2
    missing = db_now().date() + timedelta(days=3)
    drop_partitions_from(missing)
    clock = DrivenClock()
    upkeep = Upkeep(clock=clock)
    failures = counters.stored_value("scheduler_upkeep_failures", task="partitions")
    caplog.set_level(logging.INFO, logger="dispatch.upkeep")

    with long_read():
        assert upkeep.run_due(db_now())
        assert missing not in days_of(), "the read holds DEFAULT, which ATTACH must lock"
        tried = counters.stored_value("scheduler_upkeep_failures", task="partitions")
        assert tried == failures + 1
        clock.advance(settings.SCHEDULER_UPKEEP_RETRY_SECONDS - 1)
        upkeep.run_due(db_now())  # other tasks (vacuum) may be due; the partitions are not
        assert counters.stored_value("scheduler_upkeep_failures", task="partitions") == tried, (
            "the partitions are not tried again before the retry interval"
        )
        clock.advance(1)
        assert upkeep.run_due(db_now())
        assert counters.stored_value("scheduler_upkeep_failures", task="partitions") == tried + 1, "tried again"
        assert missing not in days_of()
    clock.advance(settings.SCHEDULER_UPKEEP_RETRY_SECONDS)
    upkeep.run_due(db_now())

    ahead = settings.SCHEDULER_PARTITION_DAYS_AHEAD
    for table in partitions.PARTITIONED_TABLES:
        assert {missing + timedelta(days=n) for n in range(ahead - 2)} <= days_of(table), table
    assert counters.stored_value("scheduler_upkeep_failures", task="partitions") == failures + 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("upkeep (partitions)")]
    assert len(said) == 2, said
    assert "logged once until it succeeds" in said[0] and "a lock was busy for more than 200ms" in said[0]
    assert "recovered after 2 failed tries" in said[1]
    assert scrape()["scheduler_partitions_days_ahead"] >= ahead


# --- retention -----------------------------------------------------------------------------------------------------


def test_pruning_keeps_a_day_a_backfill_left_pending_and_drops_it_once_its_fires_have_finished(tenant_a, make_schedule):
    """The defect: a backfill of a range older than the retention, then prune_occurrences: its pending fires were
    dropped with their partition and nothing said so."""
    old_day = db_now().date() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 6)
    start = datetime(old_day.year, old_day.month, old_day.day, tzinfo=UTC)
    schedule = make_schedule(tenant_a.tenant, name="old-range", cron="0 * * * *", now=start - timedelta(hours=1))
    until = start + timedelta(days=1)
    out = command("backfill", str(schedule.id), "--since", start.isoformat(), "--until", until.isoformat())
    assert "created 24" in out
    name = partitions.partition_name("dispatch_occurrence", old_day)

    out = command("prune_occurrences")

    assert f"Kept {name}: 24 fires (scheduled 24) can still run" in out, out
    assert old_day in days_of() and old_day in days_of("dispatch_attempt")
    assert Occurrence.objects.filter(schedule_id=schedule.id, state="scheduled").count() == 24
    assert scrape()["scheduler_partitions_past_retention"] >= 1

    # The fires run: finished, their envelopes settled away by the relay.
    Occurrence.objects.filter(schedule_id=schedule.id).update(state="succeeded", finished_at=db_now())
    OutboxMessage.objects.filter(scheduled_fors__overlap=[start + timedelta(hours=n) for n in range(24)]).delete()
    out = command("prune_occurrences")

    assert name in out and "Kept" not in out, out
    assert old_day not in days_of() and old_day not in days_of("dispatch_attempt")


def test_the_materializers_upkeep_drops_days_past_the_retention_by_itself_at_most_once_an_hour(tenant_a):
    now = db_now()
    old = now.date() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 5)
    partitions.ensure_partitions(connection, old, old)
    clock = DrivenClock()
    upkeep = Upkeep(clock=clock)
    dropped = counters.stored_value("scheduler_partitions_dropped")

    upkeep.run_due(now)

    assert old not in days_of() and old not in days_of("dispatch_attempt")
    older = old - timedelta(days=1)
    partitions.ensure_partitions(connection, older, older)
    clock.advance(3599)
    upkeep.run_due(now)
    assert older in days_of(), "an hour has not passed since the last pass"
    clock.advance(1)
    upkeep.run_due(now)
    assert older not in days_of()
    assert counters.stored_value("scheduler_partitions_dropped") == dropped + 4


def test_rows_in_default_past_the_retention_go_only_once_finished(tenant_a, make_schedule, make_occurrence):
    """Rows of a day that had no partition sit in DEFAULT; pruning deletes them row by row, the finished ones."""
    old = db_now() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 40)
    assert old.date() not in days_of()
    schedule = make_schedule(tenant_a.tenant, name="in-default")
    pending = make_occurrence(schedule, at=old, state="retry_wait")
    make_occurrence(schedule, at=old + timedelta(minutes=1), state="succeeded")

    out = command("prune_occurrences")

    assert "Deleted 1 finished rows of DEFAULT" in out and "Kept 1 rows of DEFAULT" in out, out
    assert list(Occurrence.objects.filter(schedule_id=schedule.id).values_list("occurrence_id", flat=True)) == [
        pending.occurrence_id
    ]


def watched(schedule_id) -> dict[str, str]:
    """The schedule's occurrences the watch table holds (migration 0017), by id."""
    return {
        str(oid): state
        for oid, state in OccurrenceWatch.objects.filter(schedule_id=schedule_id).values_list("occurrence_id", "state")
    }


def test_a_day_dropped_past_the_retention_takes_its_dead_fires_out_of_the_watch(
    tenant_a, make_schedule, make_occurrence
):
    """A DROP fires no trigger: the dead-letter queue must not keep fires whose rows are gone (replay --dead would
    find nothing to replay, the DLQ count would never come down)."""
    old = db_now() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 7)
    partitions.ensure_partitions(connection, old.date(), old.date())
    schedule = make_schedule(tenant_a.tenant, name="dead-and-gone")
    dead = make_occurrence(schedule, at=old, state="dead")
    kept = make_occurrence(schedule, at=db_now() - timedelta(hours=1), state="dead")
    assert watched(schedule.id) == {str(dead.occurrence_id): "dead", str(kept.occurrence_id): "dead"}

    command("prune_occurrences")

    assert old.date() not in days_of()
    assert watched(schedule.id) == {str(kept.occurrence_id): "dead"}


def test_a_day_with_only_its_attempts_partition_leaves_the_watch_of_its_fires_in_default_alone(
    tenant_a, make_schedule, make_occurrence
):
    """A day whose fires were written to DEFAULT (it had no partition then) gets an attempts partition later but
    never an occurrences one; dropping that attempts partition must leave the day's fires in DEFAULT watched, or a
    fire waiting for its retry would never be released and a dead one never replayed."""
    old = db_now() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 40)
    schedule = make_schedule(tenant_a.tenant, name="attempts-only")
    waiting = make_occurrence(schedule, at=old, state="retry_wait")
    dead = make_occurrence(schedule, at=old + timedelta(minutes=1), state="dead")
    report = partitions.ensure_partitions(connection, old.date(), old.date())
    assert report.refused == [partitions.partition_name(partitions.OCCURRENCES, old.date())]
    assert old.date() in days_of("dispatch_attempt")

    out = command("prune_occurrences")

    assert old.date() not in days_of("dispatch_attempt"), out
    assert watched(schedule.id) == {str(waiting.occurrence_id): "retry_wait"}, "the dead one was deleted from DEFAULT"
    assert not Occurrence.objects.filter(occurrence_id=dead.occurrence_id).exists()


# --- vacuum --------------------------------------------------------------------------------------------------------

CHURNED = "dispatch_tenant_running"
CHURN_ROWS, CHURN_DEAD = 200, 120_000


def dead_tuples(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [table])
        return cursor.fetchone()[0]


@pytest.fixture
def churned_table(tenant_a) -> Iterator[str]:
    """Running counts of 200 tenants (ids no tenant has) left live beside 120,000 deleted ones: 120,000 dead row
    versions (past the health threshold, ten times 10,000 plus a fifth of the live rows), in a table autovacuum is
    told to leave alone (so the test holds on a server that runs autovacuum too). One INSERT and one DELETE make
    them in a second, where as many UPDATEs of the same rows took half a minute."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {CHURNED} SET (autovacuum_enabled = false)")
        cursor.execute(
            f"INSERT INTO {CHURNED} (tenant_id, running) SELECT -n, 0 FROM generate_series(1, %s) AS n",
            [CHURN_ROWS + CHURN_DEAD],
        )
        cursor.execute(f"DELETE FROM {CHURNED} WHERE tenant_id < %s", [-CHURN_ROWS])
        cursor.execute("SELECT pg_stat_force_next_flush()")
    try:
        wait_for(lambda: dead_tuples(CHURNED) >= CHURN_DEAD, 30, "the statistics to count the churn")
        yield CHURNED
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {CHURNED} WHERE tenant_id < 0")
            cursor.execute(f"ALTER TABLE {CHURNED} RESET (autovacuum_enabled)")


def healthz() -> tuple[int, dict]:
    response = Client(HTTP_HOST="localhost").get("/healthz")
    return response.status_code, response.json()


def test_the_upkeep_vacuums_a_churned_table_autovacuum_leaves_alone_and_healthz_says_so_until_then(
    churned_table, settings
):
    threshold = 100  # and a fifth of the live rows: 140 for this table
    settings.SCHEDULER_VACUUM_DEAD_TUPLES = threshold
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')::boolean")
        server_autovacuum = cursor.fetchone()[0]
    status, body = healthz()
    assert status == 503 and body["status"] == "degraded"
    assert any(reason.startswith(f"table {churned_table} has ") for reason in body["reasons"]), body
    assert body["autovacuum"] == ("on" if server_autovacuum else "off")
    assert server_autovacuum or body["warnings"][0].startswith("autovacuum is off on the PostgreSQL server")
    assert scrape()["scheduler_autovacuum_enabled"] == int(server_autovacuum)

    finished = run_manage("materialize", "--once", env=process_env(SCHEDULER_VACUUM_DEAD_TUPLES=str(threshold)))

    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"vacuumed public.{churned_table}: " in finished.stderr, finished.stderr[-3000:]
    assert dead_tuples(churned_table) < threshold + 0.2 * CHURN_ROWS
    _, body = healthz()
    assert not any(churned_table in reason for reason in body["reasons"]), body
    assert counters.stored_value("scheduler_upkeep_vacuums", table=churned_table) >= 1


def test_a_table_grown_by_inserts_since_its_last_analyze_is_analyzed_again(tenant_a, settings):
    """A day partition analyzed while nearly empty kept a plan for a nearly empty table once it held the day's
    fires: the settle statement hashed 196,775 occurrences to find two (1.1 s) instead of probing the key. With
    autovacuum off nothing analyzed it again until its dead rows passed the vacuum threshold; inserts leave none."""
    table = CHURNED
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(f"INSERT INTO {table} (tenant_id, running) SELECT -n, 0 FROM generate_series(1, 5000) AS n")
        cursor.execute("SELECT pg_stat_force_next_flush()")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
            assert cursor.fetchone()[0] < 1000, "the statistics still describe the table before the inserts"
        settings.SCHEDULER_VACUUM_DEAD_TUPLES = 100_000  # no VACUUM: the ANALYZE alone must follow the growth
        analyzed = counters.stored_value("scheduler_upkeep_analyzes", table=table)

        assert Upkeep().vacuum(db_now())

        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
            assert cursor.fetchone()[0] >= 5000
        assert counters.stored_value("scheduler_upkeep_analyzes", table=table) == analyzed + 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE tenant_id < 0")
            cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


LARGE = "upkeep_test_large_table"


def vacuum_running_on(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = %s::regclass)", [f"public.{table}"]
        )
        return cursor.fetchone()[0]


def test_a_long_vacuum_of_a_large_table_holds_up_no_small_tables_vacuum(churned_table, settings, monkeypatch):
    """The defect: one lane vacuumed the small tables, then the day partitions (17-20 s each ten minutes into the
    steady bench, longer as the day grows), and the outbox gathered 80,000 dead rows meanwhile. The large table's
    VACUUM here is made slow as a day partition's is, by its throttle (a nap after every cost unit)."""
    settings.SCHEDULER_VACUUM_DEAD_TUPLES = 100
    monkeypatch.setattr(upkeep_module, "UNTHROTTLED_LIVE_ROWS", 5_000)
    monkeypatch.setattr(upkeep_module, "VACUUM_COST_LIMIT", "1")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {LARGE} (id int PRIMARY KEY, n int) WITH (autovacuum_enabled = false)")
        cursor.execute(f"INSERT INTO {LARGE} SELECT n, 0 FROM generate_series(1, 50000) AS n")
        cursor.execute(f"UPDATE {LARGE} SET n = 1")
        cursor.execute("SELECT pg_stat_force_next_flush()")
    large_lane, small_lane = Upkeep(LARGE_LANE), Upkeep(SMALL_LANE)

    def vacuum_the_large_tables() -> None:
        try:
            large_lane.run_due(db_now())
        finally:
            connection.close()

    large = threading.Thread(target=vacuum_the_large_tables, daemon=True)
    try:
        wait_for(lambda: dead_tuples(LARGE) >= 50_000, 30, "the statistics to count the large table's churn")
        large.start()
        wait_for(lambda: vacuum_running_on(LARGE), 30, "the large table's VACUUM to start")

        assert small_lane.vacuum(db_now())

        assert dead_tuples(churned_table) < 100 + 0.2 * CHURN_ROWS, "the small table is vacuumed meanwhile"
        assert vacuum_running_on(LARGE), "while the large table's VACUUM goes on"
        large.join(timeout=120)
        assert not large.is_alive()
        assert dead_tuples(LARGE) < 100 + 0.2 * 50_000
        assert counters.stored_value("scheduler_upkeep_vacuums", table=LARGE) >= 1
    finally:
        large_lane.interrupt()
        if large.is_alive():
            large.join(timeout=30)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {LARGE}")
