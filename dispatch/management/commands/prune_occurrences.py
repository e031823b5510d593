"""`manage.py prune_occurrences [--older-than-days N] [--dry-run]`: drop whole day partitions past retention.

The materializers' upkeep does the same once an hour with SCHEDULER_RETENTION_DAYS (dispatch/upkeep.py); this
command is for a manual run, another retention, or a look at what would go.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from core.clock import db_now
from dispatch.partitions import PruneReport, prune_partitions
from dispatch.upkeep import describe_states


class Command(BaseCommand):
    help = (
        "Drop the occurrence and attempt partitions of days older than the retention (whole tables, no DELETE). "
        "A day holding fires that can still run is kept, and dropped by a later run once they have finished."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=int,
            help="retention in days (default SCHEDULER_RETENTION_DAYS; minimum 1)",
        )
        parser.add_argument("--dry-run", action="store_true", help="list what would be dropped, drop nothing")

    def handle(self, *args, **options) -> None:
        days = options["older_than_days"]
        if days is None:
            days = settings.SCHEDULER_RETENTION_DAYS
        if days < 1:
            # Day 0 would drop today's partition: the one the materializer and workers are writing.
            raise CommandError(f"--older-than-days must be at least 1 (got {days}).")
        # PostgreSQL's date, not this host's: partitions are UTC days of the database's clock.
        cutoff = db_now().date() - timedelta(days=days)
        dry_run = options["dry_run"]
        report = prune_partitions(connection, cutoff, dry_run=dry_run)
        self._write(report, dry_run)
        if report.busy:
            raise CommandError(
                f"{len(report.busy)} partitions were not dropped: "
                + "; ".join(f"{name}: {why}" for name, why in sorted(report.busy.items()))
                + ". Nothing waited longer than SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS "
                f"({settings.SCHEDULER_UPKEEP_LOCK_TIMEOUT_SECONDS} s); run the command again later."
            )

    def _write(self, report: PruneReport, dry_run: bool) -> None:
        cutoff = report.cutoff.isoformat()
        if dry_run:
            self.stdout.write(f"Would drop {len(report.dropped)} partitions older than {cutoff} (dry run):")
        else:
            self.stdout.write(f"Dropped {len(report.dropped)} partitions older than {cutoff}.")
        for name in report.dropped:
            self.stdout.write(f"  {name}")
        for name, states in sorted(report.kept.items()):
            self.stdout.write(
                f"Kept {name}: {describe_states(states)} can still run; it is dropped once they have finished."
            )
        if report.default_deleted:
            verb = "and delete" if dry_run else "Deleted"
            self.stdout.write(f"  {verb} {report.default_deleted} finished rows of DEFAULT older than {cutoff}")
        if report.default_kept:
            self.stdout.write(f"Kept {report.default_kept} rows of DEFAULT older than {cutoff} that can still run.")
