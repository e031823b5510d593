"""`manage.py provision_tenant <slug> --domain <host>`: create or reuse a tenant and print a new API token of it."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.services import provision_tenant


class Command(BaseCommand):
    help = "Create (or reuse) a tenant with its schema and domain, issue it a write token; prints one JSON line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="tenant identifier: lowercase letters, digits and '-'")
        parser.add_argument("--domain", required=True, help="host name that selects the tenant, e.g. acme.localhost")
        parser.add_argument("--name", help="display name (default: the slug)")
        parser.add_argument("--max-schedules", type=int, help="quota: active plus paused schedules")
        parser.add_argument("--max-fires-per-second", type=int, help="quota: dispatch rate before throttling")
        parser.add_argument("--max-running", type=int, help="quota: occurrences running at once")
        parser.add_argument("--max-catchup-per-minute", type=int, help="quota: catch-up fires per minute")
        parser.add_argument(
            "--max-retries-per-minute",
            type=int,
            help="quota: retries of failed attempts per minute, more are delayed (0 = unlimited)",
        )
        parser.add_argument("--fairness-weight", type=int, help="relative share of dispatch capacity")

    def handle(self, *args, **options) -> None:
        try:
            result = provision_tenant(
                options["slug"],
                domain=options["domain"],
                name=options["name"],
                max_schedules=options["max_schedules"],
                max_fires_per_second=options["max_fires_per_second"],
                max_running=options["max_running"],
                max_catchup_per_minute=options["max_catchup_per_minute"],
                max_retries_per_minute=options["max_retries_per_minute"],
                fairness_weight=options["fairness_weight"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(json.dumps({"tenant": result.tenant.slug, "domain": result.domain, "token": result.token}))
