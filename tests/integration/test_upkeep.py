"""The materializers' upkeep (dispatch/upkeep.py): partitions tried again soon when a long read holds their lock.

These tests commit (transaction=True): upkeep runs in autocommit, and a lock another connection holds is only real
on committed tables.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from dispatch import counters, partitions
from dispatch.upkeep import Upkeep
from schedules.clock import db_now
from tests.integration.processes import process_env
from tests.integration.test_faults_time import drop_partitions_from
from tests.integration.test_metrics import scrape

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


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


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
        clock.advance(settings.SCHEDULER_UPKEEP_RETRY_SECONDS - 1)
        assert not upkeep.run_due(db_now()), "nothing is due before the retry interval"
        clock.advance(1)
        assert upkeep.run_due(db_now())
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
