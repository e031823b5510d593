"""The tenant's webhook signing secret (core/webhook_signatures.py says how calls are signed): made the first time
anything needs it, read by the tenant through its API, rotated with ROTATION_OVERLAP during which the previous
secret still signs, so a receiver can switch whenever it likes within that day. Stored sealed (core/sealing.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from core.sealing import seal, unseal
from core.webhook_signatures import ROTATION_OVERLAP, new_secret
from tenants.errors import ChangeRefused
from tenants.models import Tenant, WebhookSecret

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SecretState:
    secret: str
    created_at: datetime
    rotated_at: datetime | None
    previous_until: datetime | None


def _ensure(tenant_id: int, now: datetime) -> None:
    """The tenant's first secret (two racing makers: the first wins; the data plane makes it the same way)."""
    WebhookSecret.objects.bulk_create(
        [WebhookSecret(tenant_id=tenant_id, current=seal(new_secret()), created_at=now)], ignore_conflicts=True
    )


def secret_state(tenant: Tenant, *, now: datetime) -> SecretState:
    """The tenant's current secret (made now if it has none) and when it last changed."""
    _ensure(tenant.pk, now)
    row = WebhookSecret.objects.get(tenant_id=tenant.pk)
    return SecretState(unseal(row.current), row.created_at, row.rotated_at, row.previous_until)


def rotate_secret(tenant: Tenant, *, actor: str, now: datetime) -> SecretState:
    """A new current secret; the one it replaces keeps signing for ROTATION_OVERLAP. Refused (ChangeRefused)
    while the last rotation's overlap runs: receivers still on the oldest secret were promised their whole day."""
    _ensure(tenant.pk, now)
    with transaction.atomic():
        row = WebhookSecret.objects.select_for_update().get(tenant_id=tenant.pk)
        if row.previous_until is not None and row.previous_until > now:
            raise ChangeRefused(
                f"The last rotation's overlap runs until {row.previous_until:%Y-%m-%dT%H:%M:%SZ}: both secrets sign "
                "until then, and a rotation now would end the older one early. Rotate after that."
            )
        row.previous, row.previous_until = row.current, now + ROTATION_OVERLAP
        row.current, row.rotated_at = seal(new_secret()), now
        row.save()
    logger.warning("%s rotated the webhook secret of tenant %s", actor, tenant.slug, extra={"action": "rotate_secret"})
    return SecretState(unseal(row.current), row.created_at, row.rotated_at, row.previous_until)
