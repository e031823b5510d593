"""A tenant's deletion, which ends its pending work in the same transaction.

Tenant.delete() (tenants/models.py) comes here, so this module does not import the model: it works on the
instance's own class, and the model imports it only when a tenant is deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django_tenants.models import TenantMixin

from dispatch import services as dispatch_services

logger = logging.getLogger(__name__)

# How long the deletion waits for any one lock (a worker completing one of the tenant's occurrences, a materializer
# batch holding its cursors, an API request in its schema) before it gives up whole, instead of queueing behind it.
DELETE_LOCK_TIMEOUT = "10s"


@dataclass(frozen=True)
class DeletedTenant:
    slug: str
    occurrences_canceled: int
    running_canceled: int
    envelopes_withdrawn: int


def delete_tenant(tenant: Any, *, actor: str, drop_schema: bool = True) -> DeletedTenant:
    """Delete a tenant and end everything it still had pending, in one transaction. Every deletion comes here: the
    console's, `Tenant.delete()` and a queryset's delete (tenants/models.py).

    1. The tenant row, its host names and its schedules with their versions and cursors go (django-tenants also
       drops its schema with its users and tokens, unless `drop_schema` is False). The cursors' deletion waits for
       a materializer batch holding them, so what that batch wrote is seen by the step below.
    2. The data plane ends its work (dispatch.services.end_tenant_work): every occurrence of its schedules that has
       not ended is canceled with the reason, running ones too; its envelopes and per-tenant engine rows go.
    Envelopes a racing writer commits after this (a worker's retry) are withdrawn by the relay the same way.
    """
    if tenant.is_public:
        raise ValidationError("The platform's public tenant serves the console: it cannot be deleted.")
    reason = f"tenant {tenant.slug} was deleted by {actor}"
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{DELETE_LOCK_TIMEOUT}'")
        locked = type(tenant).objects.select_for_update().get(pk=tenant.pk)
        schedule_ids = dispatch_services.schedules_of_tenant(locked.pk)
        TenantMixin.delete(locked, force_drop=drop_schema)
        ended = dispatch_services.end_tenant_work(tenant.pk, tenant.slug, schedule_ids, reason=reason)
    tenant.pk = None  # as Model.delete() leaves an instance
    logger.warning(
        "deleted tenant %s (by %s): %d pending occurrences canceled (%d running), %d envelopes withdrawn",
        tenant.slug,
        actor,
        ended.occurrences_canceled,
        ended.running_canceled,
        ended.envelopes_withdrawn,
        extra={"action": "delete_tenant"},
    )
    return DeletedTenant(tenant.slug, ended.occurrences_canceled, ended.running_canceled, ended.envelopes_withdrawn)
