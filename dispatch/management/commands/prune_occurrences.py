"""`manage.py prune_occurrences [--older-than-days N] [--dry-run]`: drop whole day partitions past retention."""

from __future__ import annotations

from datetime import date, timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from dispatch.partitions import PARTITIONED_TABLES, drop_partitions_before, existing_partition_days, partition_name
from dispatch.sql import maintenance as maintenance_sql
from schedules.clock import db_now

# Two weeks covers a weekend outage plus the investigation after it; SCHEDULER_RETENTION_DAYS overrides it.
DEFAULT_RETENTION_DAYS = 14


class Command(BaseCommand):
    help = "Drop the occurrence and attempt partitions of days older than the retention (whole tables, no DELETE)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=int,
            help=f"retention in days (default SCHEDULER_RETENTION_DAYS, else {DEFAULT_RETENTION_DAYS}; minimum 1)",
        )
        parser.add_argument("--dry-run", action="store_true", help="list what would be dropped, drop nothing")

    def handle(self, *args, **options) -> None:
        days = options["older_than_days"]
        if days is None:
            days = getattr(settings, "SCHEDULER_RETENTION_DAYS", DEFAULT_RETENTION_DAYS)
        if days < 1:
            # Day 0 would drop today's partition: the one the materializer and workers are writing.
            raise CommandError(f"--older-than-days must be at least 1 (got {days}).")
        # PostgreSQL's date, not this host's: partitions are UTC days of the database's clock.
        cutoff = db_now().date() - timedelta(days=days)

        if options["dry_run"]:
            doomed = [
                partition_name(table, day)
                for table in PARTITIONED_TABLES
                for day in sorted(existing_partition_days(connection, table))
                if day < cutoff
            ]
            self.stdout.write(f"Would drop {len(doomed)} partitions older than {cutoff.isoformat()} (dry run):")
            for name in doomed:
                self.stdout.write(f"  {name}")
            for table in PARTITIONED_TABLES:
                stray = _default_rows_before(table, cutoff)
                if stray:
                    self.stdout.write(f"  and delete {stray} rows of {table}_default older than {cutoff.isoformat()}")
            return

        dropped = drop_partitions_before(connection, cutoff)
        self.stdout.write(f"Dropped {len(dropped)} partitions older than {cutoff.isoformat()}.")
        for name in dropped:
            self.stdout.write(f"  {name}")


def _default_rows_before(table: str, cutoff: date) -> int:
    """Rows of days that had no partition when written (they landed in DEFAULT); pruning deletes them."""
    with connection.cursor() as cursor:
        cursor.execute(maintenance_sql.COUNT_DEFAULT_BEFORE.format(parent=table), [cutoff])
        return cursor.fetchone()[0]
