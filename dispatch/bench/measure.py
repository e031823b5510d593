"""What the burst benchmarks measure, read from the durable record and the broker: confirmation lags, lost and
duplicate fires, the materialization rate, and the size of the stored schedules."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from kombu import Connection as BrokerConnection

from dispatch.queues import queue_arguments
from dispatch.wire import decode_content


class BurstMeasurements:
    """Mixed into the burst benchmarks: everything here reads the bench tenants' rows (`tenant_ids`) or queues."""

    config: Any
    tenant_ids: list[int]
    queues: tuple[str, ...]

    def shards_left(self, t0: datetime) -> int:
        """Shards that still hold a bench cursor at T0 or before (a cursor moves in the same transaction as its
        occurrences and envelopes): 0 means every fire has its occurrence. One probe per shard that stops at the
        first such cursor. Counting them all instead read every moved cursor's dead row once a second, 9 % of the
        box's CPU taken from the materializer being measured (perf, 500,000 fires)."""
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT count(*) FROM unnest(%(shards)s::int[]) AS s(shard)
                WHERE EXISTS (SELECT 1 FROM schedules_schedulecursor AS c
                              WHERE c.shard = s.shard AND c.next_run_at <= %(t0)s)
                """,
                {"shards": list(range(settings.SCHEDULER_SHARDS)), "t0": t0},
            )
            return cursor.fetchone()[0]

    @staticmethod
    def occurrences_inserted() -> int:
        """Rows inserted into the occurrence table since the statistics were reset, from PostgreSQL's cumulative
        statistics (each backend reports within about a second): the progress bar's reading, nearly free. The bench
        database is quiet (check_quiet), so the difference across a run is the run's."""
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT coalesce(sum(st.n_tup_ins), 0) FROM pg_inherits AS i
                JOIN pg_stat_user_tables AS st ON st.relid = i.inhrelid
                WHERE i.inhparent = 'dispatch_occurrence'::regclass
                """
            )
            return int(cursor.fetchone()[0])

    def envelope_fires(self) -> dict[int, int]:
        """Occurrences per envelope of the bench tenants. Read once, when everything is materialized: counting
        them means reading every envelope's compressed id array, which a poll every 0.25 s at the hot instant did
        (tens of ms of PostgreSQL's CPU each time, taken from the relay and the broker being measured)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, cardinality(occurrence_ids) FROM dispatch_outboxmessage WHERE tenant_id = ANY(%(t)s)",
                {"t": self.tenant_ids},
            )
            return dict(cursor.fetchall())

    def published_envelopes(self) -> tuple[set[int], int]:
        """(ids of the bench tenants' envelopes the broker confirmed, how many are not published yet): the small
        columns only. Settling deletes confirmed envelopes once nothing is due, so callers keep every id seen."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, published_at IS NOT NULL FROM dispatch_outboxmessage WHERE tenant_id = ANY(%(t)s)",
                {"t": self.tenant_ids},
            )
            rows = cursor.fetchall()
        return {envelope_id for envelope_id, published in rows if published}, sum(1 for _, p in rows if not p)

    @staticmethod
    def _lags_cte(reference: str) -> str:
        """Confirmation stamp minus `reference` (scheduled_for or available_at) per occurrence, from unsettled
        envelopes and settled occurrences alike: the durable broker-confirmation record."""
        return f"""
                WITH lags AS (
                    SELECT EXTRACT(EPOCH FROM (o.enqueued_at - o.{reference})) AS lag
                    FROM dispatch_occurrence o
                    WHERE o.tenant_id = ANY(%(t)s) AND o.enqueued_at IS NOT NULL
                    UNION ALL
                    SELECT EXTRACT(EPOCH FROM (m.published_at - o.{reference}))
                    FROM dispatch_outboxmessage m
                    CROSS JOIN LATERAL unnest(m.occurrence_ids, m.scheduled_fors) AS u(id, sf)
                    JOIN dispatch_occurrence o ON o.occurrence_id = u.id AND o.scheduled_for = u.sf
                    WHERE m.tenant_id = ANY(%(t)s) AND m.published_at IS NOT NULL AND o.enqueued_at IS NULL
                )
                """

    def write_lags(self, path: str) -> None:
        with connection.cursor() as cursor, open(path, "w") as out:
            cursor.execute(
                self._lags_cte("scheduled_for") + "SELECT lag FROM lags ORDER BY lag", {"t": self.tenant_ids}
            )
            for (lag,) in cursor.fetchall():
                out.write(f"{float(lag):.6f}\n")

    def lag_stats(self, reference: str) -> dict[str, float | int]:
        """Percentiles of the lags of `_lags_cte`."""
        with connection.cursor() as cursor:
            cursor.execute(
                self._lags_cte(reference)
                + """
                SELECT count(*),
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
                       percentile_cont(0.95) WITHIN GROUP (ORDER BY lag),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
                       max(lag), min(lag)
                FROM lags
                """,
                {"t": self.tenant_ids},
            )
            count, p50, p95, p99, lag_max, lag_min = cursor.fetchone()
        return {
            "enqueued": int(count),
            "lag_p50_s": round(float(p50 or 0), 3),
            "lag_p95_s": round(float(p95 or 0), 3),
            "lag_p99_s": round(float(p99 or 0), 3),
            "lag_max_s": round(float(lag_max or 0), 3),
            "lag_min_s": round(float(lag_min or 0), 3),
        }

    @staticmethod
    def table_sizes() -> dict[str, float]:
        """The schedule and cursor tables' heaps and indexes, in MiB: what 20 M stored schedules cost."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_table_size('schedules_schedule'), pg_indexes_size('schedules_schedule'),"
                " (SELECT count(*) FROM schedules_schedule),"
                " pg_table_size('schedules_schedulecursor'), pg_indexes_size('schedules_schedulecursor')"
            )
            heap, indexes, rows, cursor_heap, cursor_indexes = cursor.fetchone()
        return {
            "schedule_rows": rows,
            "schedule_table_mb": round(heap / 2**20, 1),
            "schedule_indexes_mb": round(indexes / 2**20, 1),
            "cursor_table_mb": round(cursor_heap / 2**20, 1),
            "cursor_indexes_mb": round(cursor_indexes / 2**20, 1),
        }

    def duplicate_count(self) -> int:
        """Fires that got more than one occurrence row (must be 0: the unique key forbids it)."""
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT count(*) FROM (
                    SELECT schedule_id, scheduled_for FROM dispatch_occurrence
                    WHERE tenant_id = ANY(%s) GROUP BY 1, 2 HAVING count(*) > 1) AS d
                """,
                [self.tenant_ids],
            )
            return cursor.fetchone()[0]

    def audit_queues(self) -> dict[str, int]:
        """Read back every message from the bench queues: the broker's own account of what arrived.

        Returns messages, distinct envelopes, duplicate messages and distinct occurrences found on the queues.
        """
        messages = 0
        envelopes: set[str] = set()
        occurrences: set[str] = set()
        with BrokerConnection(settings.CELERY_BROKER_URL) as broker:
            for queue in self.queues:
                # queue_args, not queue_opts: kombu's SimpleQueue passes queue_arguments itself (a second one raises).
                simple = broker.SimpleQueue(queue, no_ack=True, queue_args=queue_arguments(self.config.queue_type))
                try:
                    while True:
                        try:
                            message = simple.get(block=False)
                        except simple.Empty:
                            break
                        messages += 1
                        envelopes.add(message.headers.get("id"))
                        # A bundle carries several envelopes' contents, one argument each.
                        for content in json.loads(message.body)[0]:
                            occurrences.update(str(occurrence_id) for occurrence_id, _ in decode_content(content))
                finally:
                    simple.close()
        return {
            "messages": messages,
            "envelopes": len(envelopes),
            "duplicate_messages": messages - len(envelopes),
            "occurrences": len(occurrences),
        }

    def _materialize_rate(self) -> float | None:
        """Schedules materialized per second: from the start of the first batch (the occurrences' created_at is the
        batch's clock reading) to the commit of the last envelope (written at clock_timestamp()), all processes."""
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT EXTRACT(EPOCH FROM
                    (SELECT max(created_at) FROM dispatch_outboxmessage WHERE tenant_id = ANY(%(t)s))
                    - (SELECT min(created_at) FROM dispatch_occurrence WHERE tenant_id = ANY(%(t)s)))
                """,
                {"t": self.tenant_ids},
            )
            span = cursor.fetchone()[0]
        return round(self.config.schedules / float(span), 1) if span else None
