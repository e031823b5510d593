"""The engine's per-step statements read what is due, not the table: each one, run under EXPLAIN ANALYZE on a table
holding far more rows than are due (as the outbox and the cursor table do under steady load), reads a number of rows
near what it returns. Found with auto_explain on the steady bench: each of these read its whole table, or its whole
future, on every step (dispatch/sql/outbox.py CLAIMABLE, dispatch/sql/materialize.py INDEX_READS_ONLY)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from core.clock import db_now
from dispatch.bench.rows import PLANNING, SCHEDULE_COLUMNS, schedule_row
from dispatch.engine.settler import settle_params
from dispatch.models import Occurrence
from dispatch.outbox import Fire, enqueue
from dispatch.sql import claims as claim_sql
from dispatch.sql import materialize as materialize_sql
from dispatch.sql import outbox as outbox_sql
from dispatch.sql import quotas as quota_sql

FUTURE = 4000  # rows not due, many times what is due, as after a horizon's materialization
DUE = 20


def rows_read(sql: str, params: dict[str, Any], table: str) -> int:
    """Rows the statement's scans of `table` read: those they returned plus those their filters dropped."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    total = 0
    stack = [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        if node.get("Relation Name") == table:
            loops = node.get("Actual Loops", 1)
            total += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
        stack.extend(node.get("Plans", []))
    return total


@pytest.fixture
def outbox_mostly_ahead(tenant_a) -> int:
    """DUE envelopes of one tenant due now, and FUTURE more of it due over the next hours."""
    now = db_now()
    tenant_id = tenant_a.tenant.id
    instants = [now - timedelta(seconds=1, milliseconds=n) for n in range(DUE)]
    instants += [now + timedelta(hours=1, milliseconds=n) for n in range(FUTURE)]
    fires = [Fire(uuid.uuid4(), at, tenant_id, settings.SCHEDULER_STRICT_QUEUE, at, 0) for at in instants]
    with connection.cursor() as cursor:
        enqueue(cursor, fires, 1)
        cursor.execute("ANALYZE dispatch_outboxmessage")
    return tenant_id


@pytest.mark.django_db
def test_the_relays_reservation_reads_only_the_due_envelopes(outbox_mostly_ahead):
    params = {"lead": 1.0, "owner": "plan-relay", "strict_queue": settings.SCHEDULER_STRICT_QUEUE}
    read = rows_read(quota_sql.RESERVE_FIRES, params, "dispatch_outboxmessage")
    assert DUE <= read <= 2 * DUE, f"read {read} envelope rows for {DUE} due (of {DUE + FUTURE})"


@pytest.mark.django_db
def test_the_relays_fair_claim_stops_at_a_tenants_first_envelope_not_due(outbox_mostly_ahead):
    # A relay's claim names every tenant with something due; all but one have nothing left here.
    others = [10**9 + n for n in range(999)]
    params = {
        "tenant_ids": [outbox_mostly_ahead, *others],
        "shares": [500] * (1 + len(others)),
        "queue": settings.SCHEDULER_STRICT_QUEUE,
        "lead": 1.0,
        "owner": "plan-relay",
        "lease": 30.0,
    }
    read = rows_read(quota_sql.CLAIM_FAIR_SHARES, params, "dispatch_outboxmessage")
    # DUE claimed, then each one updated (found again by primary key): twice DUE, and not the tenant's future.
    assert DUE <= read <= 3 * DUE, f"read {read} envelope rows for {DUE} due (of {DUE + FUTURE})"


CURSORS = 20_000
SHARDS = 8


@pytest.fixture
def cursors_mostly_ahead(tenant_a) -> None:
    """CURSORS interval schedules over SHARDS shards (COPY, as the benchmarks write them), with a handful of cursors
    due now in each shard and the rest later in the hour."""
    tenant_id, now = tenant_a.tenant.id, db_now()
    with connection.cursor() as wrapper:
        with wrapper.cursor.copy(f"COPY schedules_schedule ({SCHEDULE_COLUMNS}) FROM STDIN") as copy:
            for n in range(CURSORS):
                row = list(
                    schedule_row(
                        uuid.uuid4(), tenant_id, f"plan-{n}", handler="noop", now=now, every_seconds=60, anchor_at=now
                    )
                )
                row[SCHEDULE_COLUMNS.split(", ").index("shard")] = n % SHARDS
                copy.write_row(row)
        wrapper.execute(
            f"""
            INSERT INTO schedules_schedulecursor (schedule_id, tenant_id, shard, version, next_run_at, {PLANNING})
            SELECT id, tenant_id, shard, version,
                   CASE WHEN row_number() OVER (PARTITION BY shard ORDER BY id) <= %(due)s
                        THEN clock_timestamp() - interval '1 second'
                        ELSE clock_timestamp() + make_interval(secs => 60 + (random() * 3600)::int) END,
                   {PLANNING}
            FROM schedules_schedule WHERE tenant_id = %(tenant)s AND name LIKE 'plan-%%'
            """,
            {"tenant": tenant_id, "due": DUE},
        )
        wrapper.execute("ANALYZE schedules_schedulecursor")


def plan_text(sql: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.django_db
def test_the_due_scan_reads_each_shard_in_order_through_its_index(cursors_mostly_ahead):
    """An ordered index scan stops at the limit and marks moved cursors' old entries dead; a bitmap scan, chosen
    for a few due rows a shard, revisits every one of them in the heap on every batch until a VACUUM. PostgreSQL
    chose it from a live table's statistics (many dead entries a shard) that a fresh test table does not have, so
    this holds the plan the batch runs under its own settings rather than reproducing that choice."""
    params = {"shards": list(range(SHARDS)), "horizon_end": db_now(), "limit": 2000, "per_shard": 250}
    with connection.cursor() as cursor:
        cursor.execute(materialize_sql.INDEX_READS_ONLY)  # as the materializer's batch does first
    plan = plan_text(materialize_sql.SCAN_DUE_SCHEDULES, params)
    assert "Bitmap" not in plan and "Index Scan using cursor_due_by_shard_tenant" in plan, plan
    assert "Sort" not in plan, "one instant's cursors come in tenant order from the index itself"


@pytest.mark.django_db
def test_advancing_a_batch_of_cursors_reads_only_their_rows(cursors_mostly_ahead):
    with connection.cursor() as cursor:
        cursor.execute(materialize_sql.INDEX_READS_ONLY)  # as the materializer's batch does first
        cursor.execute(
            "SELECT ctid::text, version, next_run_at FROM schedules_schedulecursor ORDER BY schedule_id LIMIT 500"
        )
        batch = cursor.fetchall()
    params = {
        "rows": [row[0] for row in batch],
        "versions": [row[1] for row in batch],
        "old_cursors": [row[2] for row in batch],
        "new_cursors": [row[2] + timedelta(minutes=1) for row in batch],
        "remaining_runs": [None] * len(batch),
    }
    read = rows_read(materialize_sql.ADVANCE_CURSORS, params, "schedules_schedulecursor")
    assert read <= len(batch), f"read {read} cursor rows to advance {len(batch)} (of {CURSORS})"


STAMPED = 400


@pytest.fixture
def stamped_fires(tenant_a, make_schedule) -> list[tuple[uuid.UUID, datetime, int]]:
    """STAMPED fires of one schedule, each in an envelope of its own that the relay has stamped: (occurrence id,
    instant, envelope id)."""
    schedule = make_schedule(tenant_a.tenant)
    start = db_now() - timedelta(minutes=5)
    rows = [
        Occurrence(
            occurrence_id=uuid.uuid4(),
            schedule=schedule,
            tenant_id=schedule.tenant_id,
            schedule_version=schedule.version,
            scheduled_for=start + timedelta(milliseconds=n),
            available_at=start + timedelta(milliseconds=n),
            lane="strict",
        )
        for n in range(STAMPED)
    ]
    Occurrence.objects.bulk_create(rows)
    fires = [
        Fire(r.occurrence_id, r.scheduled_for, r.tenant_id, settings.SCHEDULER_STRICT_QUEUE, r.available_at, 0)
        for r in rows
    ]
    with connection.cursor() as cursor:
        enqueue(cursor, fires, 1)
        # Statistics from before the relay stamped them, as a live outbox's often are: few envelopes stamped.
        cursor.execute("ANALYZE dispatch_outboxmessage")
        cursor.execute(
            "UPDATE dispatch_outboxmessage SET published_at = clock_timestamp() WHERE occurrence_ids[1] = ANY(%s) "
            "RETURNING occurrence_ids[1], id",
            [[r.occurrence_id for r in rows]],
        )
        envelope_of = dict(cursor.fetchall())
    return [(r.occurrence_id, r.scheduled_for, envelope_of[r.occurrence_id]) for r in rows]


@pytest.mark.django_db
def test_a_completion_reads_only_the_envelopes_its_fires_came_in(stamped_fires):
    """The batched completion copies each fire's stamp from its own envelope, found by its key; joined on the stamp
    too, it filtered every stamped envelope for each fire."""
    mine = stamped_fires[:20]
    Occurrence.objects.filter(occurrence_id__in=[m[0] for m in mine]).update(state="running", attempt_count=1)
    params = {
        "occurrence_ids": [m[0] for m in mine],
        "scheduled_fors": [m[1] for m in mine],
        "generations": [1] * len(mine),
        "new_states": ["succeeded"] * len(mine),
        "reasons": [""] * len(mine),
        "held_states": ["running"] * len(mine),
        "envelope_ids": [m[2] for m in mine],
        "now": None,
    }
    read = rows_read(claim_sql.COMPLETE_MANY, params, "dispatch_outboxmessage")
    assert read <= len(mine), f"read {read} envelope rows to complete {len(mine)} fires (of {STAMPED} stamped)"
    stamped = Occurrence.objects.filter(occurrence_id__in=params["occurrence_ids"], enqueued_at__isnull=False)
    assert stamped.count() == len(mine), "each completion copied its envelope's stamp"


@pytest.mark.django_db
def test_settling_a_batch_sorts_its_locks_in_memory(stamped_fires):
    """Settling orders the rows it locks; each sorted row once carried the batch's four arrays, and a few hundred
    rows spilled megabytes to temporary files. 1 MB of work_mem (a quarter of the default) holds the batch."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '1MB'")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + outbox_sql.SETTLE_PUBLISHED, settle_params(STAMPED, STAMPED, 0))
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "temp read" not in plan and "temp written" not in plan, plan
    settled = Occurrence.objects.filter(occurrence_id__in=[f[0] for f in stamped_fires], state="enqueued")
    assert settled.count() == STAMPED


BATCH = 400
FLEET = 500
FIRES = 40


@pytest.fixture
def a_day_of_a_fleet(tenant_a) -> list[tuple[uuid.UUID, datetime]]:
    """FLEET every-minute schedules and FIRES occurrences of each in the day's partition, analyzed as the upkeep
    leaves a day partition (the partition alone: nothing analyzes the partitioned table itself, not even autovacuum);
    returned, the keys of a batch of BATCH of the latest, as an envelope hands them to a worker."""
    tenant_id = tenant_a.tenant.id
    now = db_now()
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=FIRES)
    fleet = [(uuid.uuid4(), 1) for _ in range(FLEET)]
    with (
        connection.cursor() as wrapper,
        wrapper.cursor.copy(f"COPY schedules_schedule ({SCHEDULE_COLUMNS}) FROM STDIN") as copy,
    ):
        for n, (schedule_id, _) in enumerate(fleet):
            copy.write_row(
                schedule_row(
                    schedule_id, tenant_id, f"fleet-{n}", handler="noop", now=now, every_seconds=60, anchor_at=now
                )
            )
    # One statement on the server, in the order a day fills (fire by fire): building 20,000 rows in Python took
    # most of this fixture's time.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dispatch_occurrence (
                occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, available_at, lane, priority,
                manual, forced, kept, throttled, state, state_reason, attempt_count, created_at)
            SELECT gen_random_uuid(), fleet.id, %(tenant)s, 1, %(minute)s + fire * interval '1 minute',
                   %(minute)s + fire * interval '1 minute', 'strict', 0, false, false, false, false, 'enqueued', '', 0,
                   now()
            FROM generate_series(0, %(fires)s - 1) AS fire
            CROSS JOIN unnest(%(fleet)s::uuid[]) WITH ORDINALITY AS fleet (id, position)
            ORDER BY fire, fleet.position
            """,
            {"tenant": tenant_id, "minute": minute, "fires": FIRES, "fleet": [schedule_id for schedule_id, _ in fleet]},
        )
        # The latest BATCH of them, as an envelope hands them to a worker.
        cursor.execute(
            "SELECT occurrence_id, scheduled_for FROM dispatch_occurrence "
            "WHERE schedule_id = ANY(%s::uuid[]) AND scheduled_for = %s",
            [[schedule_id for schedule_id, _ in fleet[-BATCH:]], minute + timedelta(minutes=FIRES - 1)],
        )
        batch = cursor.fetchall()
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT tableoid::regclass::text FROM dispatch_occurrence")
        for (partition,) in cursor.fetchall():
            cursor.execute(f"ANALYZE {partition}")
        cursor.execute("ANALYZE schedules_schedule")
    return batch


@pytest.mark.django_db
def test_a_batch_probes_the_schedule_of_each_of_its_rows(a_day_of_a_fleet):
    """A batch of keys joined to the partitioned occurrence table, which has no statistics of its own, looks to the
    planner like a share of the day's partition (n_distinct's default of 200 on both sides of each key column), and
    it hashed every schedule there is for each batch: the workers' claim took five times as long ten minutes into a
    steady benchmark (238,900 schedules). Each statement reads one schedule row per occurrence, whatever the guess.
    At this size (20,000 rows, kept small: the rolled-back rows are dead rows /healthz would count) the pre-check's
    plan is the one that hashed; the claim's did from 100,000 rows and 2,000 schedules."""
    params = {
        "occurrence_ids": [key[0] for key in a_day_of_a_fleet],
        "scheduled_fors": [key[1] for key in a_day_of_a_fleet],
        "now": None,
    }
    for name in ("LOCK_OCCURRENCES", "PRECHECK_MANY"):
        read = rows_read(getattr(claim_sql, name), params, "schedules_schedule")
        assert read <= BATCH, f"{name} read {read} schedule rows for a batch of {BATCH} (of {FLEET} schedules)"
