"""`manage.py backfill <schedule_id> --since ISO --until ISO`: create the missing fires of a past range."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.backfill import backfill_schedule, describe, parse_schedule_id
from dispatch.errors import BackfillRefused, ReconcileInputError
from dispatch.reconcile import parse_instant


class Command(BaseCommand):
    help = (
        "Create the fires of a past range of one schedule with their usual occurrence ids (the version valid at "
        "each fire). Existing occurrences are untouched; new ones are forced and released now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("schedule_id", help="the schedule's id (UUID)")
        parser.add_argument("--since", required=True, help="range start, ISO 8601 with offset or Z (inclusive)")
        parser.add_argument("--until", required=True, help="range end, ISO 8601 with offset or Z (exclusive)")

    def handle(self, *args, **options) -> None:
        try:
            schedule_id = parse_schedule_id(options["schedule_id"])
            since = parse_instant(options["since"], "--since")
            until = parse_instant(options["until"], "--until")
            result = backfill_schedule(schedule_id, since=since, until=until)
        except (BackfillRefused, ReconcileInputError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(describe(result))
