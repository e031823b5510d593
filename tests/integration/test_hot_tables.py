"""Room on the hot tables' pages for the updates that follow an insert (dispatch/partitions.py FILLFACTOR, migration
0015): an update that finds room on its row's own page stays there, so one that changes no indexed column is HOT and
writes no index entry, and none logs the whole row again. Since migration 0017 no index of the occurrence table names
state or lease, so the claim and the completion are such updates too."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from django.db import connection, transaction

from dispatch import partitions
from dispatch.sql import claims as claims_sql

# A day no other test writes to.
DAY = date(2031, 3, 14)


def fillfactor(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT option FROM pg_class AS c, unnest(c.reloptions) AS o(option) WHERE c.relname = %s "
            "AND option LIKE 'fillfactor=%%'",
            [table],
        )
        row = cursor.fetchone()
    return int(row[0].split("=")[1]) if row else 100


@pytest.mark.django_db
def test_the_hot_tables_leave_room_on_their_pages():
    assert fillfactor("dispatch_outboxmessage") == 50
    assert fillfactor("schedules_schedulecursor") == 80
    for parent in partitions.PARTITIONED_TABLES:
        assert fillfactor(f"{parent}_default") == partitions.FILLFACTOR[parent]


@pytest.mark.django_db(transaction=True)
def test_a_new_days_occurrences_are_updated_on_their_own_pages():
    """A fifth of a full day's rows updated in a column no index names (as settling fills enqueued_at): with room
    on every page each new row version stays beside the old one; on pages packed full nearly all moved away."""
    partitions.ensure_partitions(connection, DAY, DAY)
    partition = partitions.partition_name(partitions.OCCURRENCES, DAY)
    assert fillfactor(partition) == partitions.FILLFACTOR[partitions.OCCURRENCES]
    assert fillfactor(partitions.partition_name(partitions.ATTEMPTS, DAY)) == partitions.FILLFACTOR[partitions.ATTEMPTS]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dispatch_occurrence (occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for,
                                             available_at, lane)
            SELECT gen_random_uuid(), gen_random_uuid(), 1, 1, %(at)s::timestamptz + make_interval(secs => n),
                   %(at)s::timestamptz + make_interval(secs => n), 'strict'
            FROM generate_series(1, 2000) AS n
            """,
            {"at": f"{DAY.isoformat()}T00:00:00Z"},
        )
        cursor.execute(f'SELECT occurrence_id, (ctid::text::point)[0] FROM "{partition}" ORDER BY scheduled_for')
        before = dict(cursor.fetchall())
        chosen = list(before)[::5]
        cursor.execute(
            "UPDATE dispatch_occurrence SET enqueued_at = clock_timestamp() WHERE occurrence_id = ANY(%s)", [chosen]
        )
        cursor.execute(
            f'SELECT occurrence_id, (ctid::text::point)[0] FROM "{partition}" WHERE occurrence_id = ANY(%s)',
            [chosen],
        )
        after = dict(cursor.fetchall())
        cursor.execute(f'DROP TABLE "{partition}"')
        cursor.execute(f'DROP TABLE "{partitions.partition_name(partitions.ATTEMPTS, DAY)}"')
    moved = [occurrence_id for occurrence_id in chosen if after[occurrence_id] != before[occurrence_id]]
    assert len(set(before.values())) > 10, "the day's rows fill many pages"
    assert moved == [], f"{len(moved)} of {len(chosen)} updated rows left their page"


def _counted_updates(cursor, partition: str) -> tuple[int, int]:
    """Row updates of the partition in this transaction so far: (all, HOT)."""
    cursor.execute(
        "SELECT pg_stat_get_xact_tuples_updated(%(t)s::regclass), pg_stat_get_xact_tuples_hot_updated(%(t)s::regclass)",
        {"t": f'"public"."{partition}"'},
    )
    return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_a_fires_claim_and_completion_stay_on_its_page_and_the_watch_follows_them():
    """The claim and the completion statements of the worker's hot path change state and lease: with no index of the
    occurrence table naming either, both are HOT updates wherever the page has room (a tenth of a day's rows, as
    the first test's fifth; before migration 0017 none was, whatever the room); the watch table holds each row while
    it runs, and not after it ended."""
    partitions.ensure_partitions(connection, DAY, DAY)
    partition = partitions.partition_name(partitions.OCCURRENCES, DAY)
    rows = 2000
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO dispatch_occurrence (occurrence_id, schedule_id, tenant_id, schedule_version,
                                                 scheduled_for, available_at, lane)
                SELECT gen_random_uuid(), gen_random_uuid(), 1, 1, %(at)s::timestamptz + make_interval(secs => n),
                       %(at)s::timestamptz + make_interval(secs => n), 'strict'
                FROM generate_series(1, %(rows)s) AS n
                """,
                {"at": f"{DAY.isoformat()}T00:00:00Z", "rows": rows},
            )
            cursor.execute(f'SELECT occurrence_id, scheduled_for FROM "{partition}" ORDER BY scheduled_for')
            ids, scheduled_fors = map(list, zip(*cursor.fetchall()[::10], strict=True))
            fires = len(ids)
            now = datetime(DAY.year, DAY.month, DAY.day, 1, tzinfo=UTC)
            cursor.execute(
                claims_sql.CLAIM_MANY,
                {
                    "occurrence_ids": ids,
                    "scheduled_fors": scheduled_fors,
                    "states": ["scheduled"] * fires,
                    "attempt_counts": [0] * fires,
                    "now": now,
                    "lease": 30,
                },
            )
            assert cursor.rowcount == fires
            cursor.execute("SELECT count(*) FROM dispatch_occurrence_watch WHERE state = 'running'")
            assert cursor.fetchone()[0] == fires
            cursor.execute(
                claims_sql.COMPLETE_MANY,
                {
                    "occurrence_ids": ids,
                    "scheduled_fors": scheduled_fors,
                    "generations": [1] * fires,
                    "new_states": ["succeeded"] * fires,
                    "reasons": [""] * fires,
                    "held_states": ["running"] * fires,
                    "envelope_ids": [None] * fires,
                    "now": now,
                },
            )
            assert cursor.rowcount == fires
            updated, hot = _counted_updates(cursor, partition)
            cursor.execute("SELECT count(*) FROM dispatch_occurrence_watch")
            watched = cursor.fetchone()[0]
            cursor.execute(
                f"""SELECT count(*) FROM "{partition}" AS o
                    WHERE o.occurrence_id = ANY(%s) AND o.state = 'succeeded'""",
                [ids],
            )
            succeeded = cursor.fetchone()[0]
        assert (updated, succeeded, watched) == (2 * fires, fires, 0)
        assert hot == updated, f"{updated - hot} of {updated} state changes wrote index entries"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE "{partition}"')
            cursor.execute(f'DROP TABLE "{partitions.partition_name(partitions.ATTEMPTS, DAY)}"')
