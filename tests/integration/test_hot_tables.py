"""Room on the hot tables' pages for the updates that follow an insert (dispatch/partitions.py FILLFACTOR, migration
0015): an update that finds room on its row's own page stays there, so one that changes no indexed column is HOT and
writes no index entry, and none logs the whole row again."""

from __future__ import annotations

from datetime import date

import pytest
from django.db import connection

from dispatch import partitions

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
