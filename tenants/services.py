"""Provisioning of tenants (schema, host name, created or reused idempotently, and a new API token each time) and their
deletion, which ends their pending work first."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models.expressions import RawSQL

from core.clock import db_now
from tenants.credentials.models import TokenScope
from tenants.credentials.tokens import issue_token
from tenants.models import Domain, Tenant, schema_name_for, validate_slug

logger = logging.getLogger(__name__)

PROVISIONED_TOKEN_NAME = "provisioned"
HOST_PATTERN = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
QUOTA_FIELDS = (
    "max_schedules",
    "max_fires_per_second",
    "max_running",
    "max_catchup_per_minute",
    "max_retries_per_minute",
    "fairness_weight",
)
# The smallest value of each quota: 1, except where 0 means "unlimited" (the retry budget, see its help text).
QUOTA_MINIMUMS = {"max_retries_per_minute": 0}


def quota_minimum(field: str) -> int:
    return QUOTA_MINIMUMS.get(field, 1)


@dataclass(frozen=True)
class Provisioned:
    tenant: Tenant
    domain: str
    token: str
    created: bool


def provision_tenant(slug: str, *, domain: str, name: str | None = None, **quotas: int | None) -> Provisioned:
    """Create the tenant (schema, domain) or reuse it, and issue it a write token; quotas given are applied
    either way."""
    validate_slug(slug)
    domain = domain.strip().lower()
    if not HOST_PATTERN.match(domain):
        raise ValidationError(f"Invalid domain {domain!r}: expected a host name such as 'acme.localhost'.")
    for field, value in quotas.items():
        if field not in QUOTA_FIELDS:
            raise ValidationError(f"Unknown quota {field!r}.")
        if value is not None and value < quota_minimum(field):
            raise ValidationError(f"{field} must be at least {quota_minimum(field)}, got {value}.")
        if value is not None:
            # The column's own range (PositiveSmallIntegerField stops at 32767): refused here, not by PostgreSQL.
            try:
                Tenant._meta.get_field(field).run_validators(value)
            except ValidationError as exc:
                raise ValidationError(f"{field}: {' '.join(exc.messages)}") from None
    name_limit = Tenant._meta.get_field("name").max_length
    if name is not None and len(name) > name_limit:
        raise ValidationError(f"The name is {len(name)} characters long; at most {name_limit} are allowed.")

    owner = Domain.objects.select_related("tenant").filter(domain=domain).first()
    if owner is not None and owner.tenant.slug != slug:
        raise ValidationError(f"Domain {domain!r} already belongs to tenant {owner.tenant.slug!r}.")

    tenant = Tenant.objects.filter(slug=slug).first()
    created = tenant is None
    if tenant is None:
        # Creating the tenant creates and migrates its schema (django-tenants), outside our transaction.
        tenant = Tenant(slug=slug, schema_name=schema_name_for(slug), name=name or slug)
        for field, value in quotas.items():
            if value is not None:
                setattr(tenant, field, value)
        tenant.save(verbosity=0)
    else:
        changed = [field for field, value in quotas.items() if value is not None and getattr(tenant, field) != value]
        for field in changed:
            setattr(tenant, field, quotas[field])
        if name and tenant.name != name:
            tenant.name = name
            changed.append("name")
        if changed:
            tenant.save(update_fields=[*changed, "updated_at"])

    with transaction.atomic():
        if owner is None:
            is_primary = not Domain.objects.filter(tenant=tenant).exists()
            Domain.objects.create(domain=domain, tenant=tenant, is_primary=is_primary)
    # Keys are stored as digests only, so each run issues a new one (shown once, in the result); earlier keys
    # keep working until they end or are revoked.
    token = issue_token(
        tenant,
        name=PROVISIONED_TOKEN_NAME,
        scope=TokenScope.WRITE,
        actor="provision_tenant",
        now=(now := db_now()),
        expires_at=now + timedelta(days=settings.SCHEDULER_TOKEN_MAX_DAYS),
        # An operator's step, run again as often as needed: not bounded by the tenant's count of tokens.
        bounded=False,
    ).key
    logger.info("provisioned tenant %s (created=%s)", slug, created, extra={"action": "provision_tenant"})
    return Provisioned(tenant=tenant, domain=domain, token=token, created=created)


def schedules_held(tenant_id: int) -> int:
    """Active plus paused schedules of a tenant, what its max_schedules bounds: the counter the database keeps
    (schedules migration 0005, a trigger on the schedule table), not a count()."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT held FROM schedules_tenant_schedule_count WHERE tenant_id = %s", [tenant_id])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def holds_schedules(tenant_id: int) -> bool:
    """Whether any schedule of the tenant exists, ended ones too: the console deletes only a tenant without any."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM schedules_schedule WHERE tenant_id = %s)", [tenant_id])
        return bool(cursor.fetchone()[0])


def schedules_held_column() -> RawSQL:
    """schedules_held of each tenant row of a queryset, as a column (the console's tenant list sorts by it)."""
    return RawSQL(
        "COALESCE((SELECT held FROM schedules_tenant_schedule_count c WHERE c.tenant_id = tenants_tenant.id), 0)", ()
    )
