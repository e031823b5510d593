"""Upkeep never stalls due work, with the real processes: a long read of the occurrence table while day partitions
are due costs the fires nothing, and a drop that cannot take its lock gives up instead of queueing every writer.

Each test runs the product's processes against committed rows while another connection holds the table, as a long
report or pg_dump does.
"""

from __future__ import annotations

import sys
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection

from core.clock import db_now
from dispatch import counters, partitions
from dispatch.models import Attempt, Occurrence
from dispatch.queues import STRICT_QUEUE
from tests.integration.processes import ROOT, process_env, run_manage
from tests.integration.test_faults_connections import Running, one_off_in
from tests.integration.test_faults_time import drop_partitions_from
from tests.integration.test_relay_process import drain_queue
from tests.integration.test_upkeep import days_of, long_read
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# How long the read holds the table, and the latest a fire due meanwhile may start.
LONG_READ_SECONDS = 20
START_WITHIN_SECONDS = 10


def start_lag(schedule) -> float | None:
    """Seconds from the one-off's fire time to its first attempt's start, or None before a worker claimed it."""
    occurrence = Occurrence.objects.filter(schedule_id=schedule.id).first()
    if occurrence is None:
        return None
    attempt = Attempt.objects.filter(occurrence_id=occurrence.occurrence_id, generation=1).first()
    return None if attempt is None else (attempt.started_at - occurrence.scheduled_for).total_seconds()


def test_a_long_read_while_partitions_are_due_delays_no_fire_and_the_partitions_follow_when_it_ends(tenant_a):
    """The defect: the day's CREATE TABLE ... PARTITION OF waited behind a 45 s read with no lock_timeout, and every
    COPY, settle and claim queued behind it: fires started 28-37 s late."""
    first_missing = db_now().date() + timedelta(days=2)  # inside the old code's window too (now + horizon + 2 days)
    drop_partitions_from(first_missing)
    drain_queue(STRICT_QUEUE)
    node = f"upkeep-worker-{uuid.uuid4().hex[:6]}@%h"
    worker = Running(
        "worker",
        command=[
            *(sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=solo", "-n", node),
            *("--loglevel=INFO", "--without-mingle", "--without-gossip"),
        ],
        PYTHONPATH=str(ROOT),
    )
    relay = Running("relay", "--name", "upkeep-relay")
    materializer = None
    try:
        wait_for(lambda: "ready" in worker.text(), 60, "the worker to start consuming")
        wait_for(lambda: "queues declared" in relay.text(), 30, "the relay to start")
        # The read starts before the materializer, whose upkeep then finds the days missing and the table held.
        with long_read(seconds=LONG_READ_SECONDS):
            read_ends = time.monotonic() + LONG_READ_SECONDS
            fires = [one_off_in(tenant_a.tenant, seconds, f"during-the-read-{seconds}") for seconds in (6, 8, 10)]
            materializer = Running("materialize", "--name", "upkeep-materializer", SCHEDULER_UPKEEP_RETRY_SECONDS="2")

            # Past the read's end too: on the old code the fires leave only when it has ended.
            started = lambda: all(start_lag(f) is not None for f in fires)  # noqa: E731
            wait_for(started, LONG_READ_SECONDS + 30, "every fire to start")

            lags = [start_lag(f) for f in fires]
            assert max(lags) <= START_WITHIN_SECONDS, lags
            assert time.monotonic() < read_ends - 1, "the fires started while the read held the table"
            assert first_missing not in days_of(), "the read still holds the table: the partition waits for it"
            time.sleep(max(0.0, read_ends - time.monotonic()))
        ahead = settings.SCHEDULER_PARTITION_DAYS_AHEAD
        wanted = {db_now().date() + timedelta(days=n) for n in range(-1, ahead + 1)}
        wait_for(
            lambda: all(wanted <= days_of(table) for table in partitions.PARTITIONED_TABLES),
            120,
            "the day partitions, once the read has ended",
        )
        assert materializer.process.poll() is None and relay.process.poll() is None
    finally:
        for process in (materializer, relay):
            if process is not None:
                process.stop()
        worker.stop()
    log = materializer.text()
    assert log.count("upkeep (partitions): day partitions not created") == 1, f"once per outage:\n{log[-3000:]}"
    assert "upkeep (partitions) recovered after" in log, log[-3000:]
    assert counters.stored_value("scheduler_upkeep_failures", task="partitions") >= 1
    drain_queue(STRICT_QUEUE)


def test_prune_gives_up_on_a_lock_a_long_read_holds_instead_of_queueing_every_writer_behind_it(tenant_a):
    old = db_now().date() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 3)
    partitions.ensure_partitions(connection, old, old)
    name = partitions.partition_name("dispatch_occurrence", old)

    with long_read():
        # Without a lock timeout the DROP waits for the read, and the command with it, past this deadline.
        finished = run_manage("prune_occurrences", env=process_env(SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS="0.2"))
        assert old in days_of()

    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert f"{name}: a lock was busy for more than 200ms" in finished.stderr, finished.stderr
    assert "run the command again later" in finished.stderr
    assert "Traceback" not in finished.stderr
    again = run_manage("prune_occurrences")
    assert again.returncode == 0 and name in again.stdout, again.stdout + again.stderr
    assert old not in days_of()


def test_a_materializer_process_drops_days_past_the_retention_by_itself(tenant_a):
    old = db_now().date() - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 2)
    partitions.ensure_partitions(connection, old, old)

    finished = run_manage("materialize", "--once", "--name", "retention-process")

    assert finished.returncode == 0, finished.stderr[-3000:]
    assert old not in days_of() and old not in days_of("dispatch_attempt")
    assert "dropped 2 partitions older than" in finished.stderr, finished.stderr[-3000:]
