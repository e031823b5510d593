"""`manage.py materialize [--once]`: the materializer loop (shard leases, bounded horizon)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.engine.materializer import Materializer
from dispatch.errors import ShardCountMismatch
from schedules.services import resume_due_pauses


class Command(BaseCommand):
    help = "Turn due schedules into occurrences and outbox envelopes; runs until SIGTERM/SIGINT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="materialize what is due now, then exit")
        parser.add_argument("--name", help="process name in leases (default: host-pid-random)")
        parser.add_argument("--batch-size", type=int, help="schedules per transaction")

    def handle(self, *args, **options) -> None:
        if options["batch_size"] is not None and options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            # The pauses whose resume_at has come end with each maintenance pass (the engine never imports the control
            # plane: it is handed the duty).
            materializer = Materializer(options["name"], batch_size=options["batch_size"], duties=[resume_due_pauses])
            materializer.run(once=options["once"])
        except ShardCountMismatch as exc:
            raise CommandError(str(exc)) from None
