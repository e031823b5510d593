"""Tenants (one PostgreSQL schema each for users and tokens) with their quotas, and the host names that select them."""

from __future__ import annotations

import re

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django_tenants.models import DomainMixin, TenantMixin

PUBLIC_SLUG = "public"
SLUG_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


def schema_name_for(slug: str) -> str:
    """Schema of a tenant: a prefix keeps tenant schemas apart from `public` and PostgreSQL's own `pg_*`."""
    return "t_" + slug.replace("-", "_")


def validate_slug(slug: str) -> None:
    if not SLUG_PATTERN.match(slug or ""):
        raise ValidationError(
            f"Invalid tenant slug {slug!r}: use 1-40 lowercase letters, digits or '-', starting with a letter."
        )
    if slug == PUBLIC_SLUG:
        raise ValidationError("'public' is reserved for the platform itself.")


class TenantQuerySet(models.QuerySet):
    def delete(self) -> tuple[int, dict[str, int]]:
        """Each tenant through Tenant.delete(), so a bulk delete ends their pending work too."""
        deleted = 0
        for tenant in self:
            tenant.delete()
            deleted += 1
        return deleted, {Tenant._meta.label: deleted}

    delete.queryset_only = True  # type: ignore[attr-defined]


class Tenant(TenantMixin):
    """A customer of the platform. Quotas bound what one tenant can take from shared capacity."""

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=200)
    max_schedules = models.PositiveIntegerField(
        default=100_000, help_text="Active plus paused schedules this tenant may hold."
    )
    max_fires_per_second = models.PositiveIntegerField(
        default=10_000,
        help_text="Fires per second the relays dispatch for this tenant (one bucket shared by every relay); more "
        "wait, counted as throttled, never dropped.",
    )
    max_running = models.PositiveIntegerField(
        default=1_000,
        help_text="Occurrences of this tenant that may run at once across all workers; more wait without using "
        "an attempt.",
    )
    max_catchup_per_minute = models.PositiveIntegerField(
        default=600,
        help_text="Late fires kept by a misfire policy (catch_up, fire_once) and backfilled fires released per "
        "minute, one budget for all of this tenant's schedules.",
    )
    max_retries_per_minute = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Retries of failed attempts this tenant may run per minute; more are delayed, not dropped. "
        "0 = unlimited.",
    )
    fairness_weight = models.PositiveSmallIntegerField(
        default=1,
        help_text="Relative share of each relay batch when tenants have fires due at the same instant.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    auto_create_schema = True

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def delete(self, force_drop: bool = False, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        """Every deletion of a tenant goes through tenants.deletion.delete_tenant, which cancels its pending
        occurrences and clears its envelopes and engine rows in the same transaction: left behind, they were never
        granted a fire and counted as due for ever (a relay spun on them). The schema is dropped as django-tenants
        would (`force_drop` or auto_drop_schema)."""
        from tenants.deletion import delete_tenant

        delete_tenant(self, actor="Tenant.delete()", drop_schema=force_drop or self.auto_drop_schema)
        return 1, {self._meta.label: 1}

    @property
    def is_public(self) -> bool:
        return self.schema_name == "public"


class Domain(DomainMixin):
    """A host name that selects a tenant (`acme.localhost`); the public host serves the operator console."""

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return self.domain


class WebhookSecret(models.Model):
    """The tenant's key for signing webhook calls (Standard Webhooks), sealed at rest (core/sealing.py). After a
    rotation the previous key still signs until `previous_until`, so receivers can switch without a gap."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="webhook_secret")
    current = models.TextField(help_text="The secret ('whsec_' + base64 key), sealed.")
    previous = models.TextField(blank=True, default="", help_text="The secret before the last rotation, sealed.")
    previous_until = models.DateTimeField(null=True, blank=True, help_text="Calls carry both signatures until then.")
    created_at = models.DateTimeField()
    rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"webhook secret of tenant {self.tenant_id}"


class OperatorAccess(models.Model):
    """Which tenants a console operator (a staff user who is not a superuser) sees and acts on. Without a row, or
    with no tenant assigned, an operator sees no tenant's rows; `all_tenants` is the platform operator."""

    user = models.OneToOneField("auth.User", on_delete=models.CASCADE, primary_key=True, related_name="operator_access")
    all_tenants = models.BooleanField(
        default=False, help_text="Sees and acts on every tenant, present and future (what a superuser always does)."
    )
    tenants = models.ManyToManyField(
        Tenant, blank=True, related_name="operators", help_text="The tenants this operator sees and acts on."
    )

    class Meta:
        verbose_name = "operator access"
        verbose_name_plural = "operator access"

    def __str__(self) -> str:
        return f"tenant access of {self.user}"


class NotificationEvent(models.TextChoices):
    DEAD = "dead", "dead: attempts or deadline exhausted"
    MISSED = "missed", "missed: later than the schedule accepts"
    STUCK = "stuck", "stuck: unfinished 15 minutes past its time"
    SKIPPED_OVERLAP = "skipped_overlap", "skipped_overlap: the previous run was still going"


class NotificationTarget(models.Model):
    """Where a tenant is told that a fire did not run (docs/API.md, "Notifications"): one signed POST per event
    and occurrence, sent by the workers (dispatch/notifications.py)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="notifications")
    url = models.TextField(help_text="The http(s) URL each notification is POSTed to, signed like a webhook.")
    events = ArrayField(models.CharField(max_length=20, choices=NotificationEvent.choices))
    # Only the schedules whose labels meet it (core/labels.py); empty: every schedule. The parsed form is what the
    # data plane's SQL applies (dispatch migration 0021, dispatch/sql/notifications.py); null when empty.
    selector = models.CharField(max_length=2000, blank=True, default="", db_default="")
    selector_match = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=200)

    def __str__(self) -> str:
        return f"notifications of tenant {self.tenant_id}"
