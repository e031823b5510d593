"""`manage.py relay [--once]`: the outbox relay loop (publish with confirms, then stamp)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.engine.relay import Relay


class Command(BaseCommand):
    help = "Publish due outbox envelopes to RabbitMQ with publisher confirms; runs until SIGTERM/SIGINT."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="publish and settle what is due now, then exit")
        parser.add_argument("--name", help="process name (default: host-pid-random)")
        parser.add_argument("--batch-size", type=int, help="envelopes per transaction")

    def handle(self, *args, **options) -> None:
        if options["batch_size"] is not None and options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        Relay(options["name"], batch_size=options["batch_size"]).run(once=options["once"])
