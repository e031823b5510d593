"""`manage.py reseal_secrets`: seal every stored secret again under the first key of SCHEDULER_ENCRYPTION_KEYS, the
step between adding a new key first and removing the old one (docs/API.md, "Configuration")."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.sealing import SealBroken, reseal
from tenants.models import WebhookSecret


class Command(BaseCommand):
    help = "Re-encrypt every webhook secret under the first key of SCHEDULER_ENCRYPTION_KEYS."

    def handle(self, *args, **options) -> None:
        count = 0
        try:
            with transaction.atomic():
                for row in WebhookSecret.objects.select_for_update().order_by("tenant_id"):
                    row.current = reseal(row.current)
                    row.previous = reseal(row.previous) if row.previous else ""
                    row.save(update_fields=["current", "previous"])
                    count += 1
        except SealBroken as exc:
            raise CommandError(
                f"{exc}; nothing was changed. Keep the old key in the list until this succeeds."
            ) from None
        self.stdout.write(f"Resealed the webhook secrets of {count} tenant(s) under the first key.")
