"""`manage.py replay --dead [--tenant SLUG]` or `replay <occurrence_id>`: re-enqueue from the DLQ, same ids."""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.errors import ReplayRefused
from dispatch.occurrences import replay_dead, replay_one
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Re-enqueue dead occurrences under their own occurrence ids: all of them (--dead) or one by id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("occurrence_id", nargs="?", help="replay this one dead occurrence")
        parser.add_argument("--dead", action="store_true", help="replay every dead occurrence")
        parser.add_argument("--tenant", help="with --dead: only this tenant's occurrences (slug)")

    def handle(self, *args, **options) -> None:
        occurrence_text, dead, tenant_slug = options["occurrence_id"], options["dead"], options["tenant"]
        if bool(occurrence_text) == dead:
            raise CommandError("Give exactly one of --dead or an occurrence id.")
        if tenant_slug and not dead:
            raise CommandError("--tenant goes with --dead; an occurrence id already names one occurrence.")

        if occurrence_text:
            try:
                occurrence_id = uuid.UUID(occurrence_text)
            except ValueError:
                raise CommandError(f"{occurrence_text!r} is not an occurrence id (a UUID).") from None
            try:
                occurrence = replay_one(occurrence_id)
            except ReplayRefused as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"Replayed occurrence {occurrence.occurrence_id} (now {occurrence.state}).")
            return

        tenant_id = None
        if tenant_slug:
            tenant = Tenant.objects.filter(slug=tenant_slug).first()
            if tenant is None:
                raise CommandError(f"Unknown tenant {tenant_slug!r}.")
            tenant_id = tenant.id
        result = replay_dead(tenant_id=tenant_id)
        self.stdout.write(f"Replayed {result.replayed} dead occurrences.")
        if result.left_canceled:
            self.stdout.write(
                f"Left {result.left_canceled} dead occurrences of canceled schedules: they would not run."
            )
