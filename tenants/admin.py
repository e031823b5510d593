"""Operator console for tenancy: tenants with their quotas, fairness weight, host names and schedule counts."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from scheduler_project.console import SafeActionSelectionMixin
from schedules.models import Schedule
from tenants.models import Domain, Tenant, schema_name_for, validate_slug
from tenants.services import HOST_PATTERN, QUOTA_FIELDS


class TenantForm(forms.ModelForm):
    """The same slug and quota rules as `provision_tenant`, so both paths accept the same tenants."""

    class Meta:
        model = Tenant
        fields = ("slug", "name", *QUOTA_FIELDS)

    def clean_slug(self) -> str:
        slug = (self.cleaned_data.get("slug") or "").strip()
        validate_slug(slug)
        return slug

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for field in QUOTA_FIELDS:
            value = cleaned.get(field)
            if field in self.fields and value is not None and value < 1:
                self.add_error(field, "Must be at least 1.")
        return cleaned


class DomainForm(forms.ModelForm):
    class Meta:
        model = Domain
        fields = ("domain", "is_primary")

    def clean_domain(self) -> str:
        domain = (self.cleaned_data.get("domain") or "").strip().lower()
        if not HOST_PATTERN.match(domain):
            raise ValidationError(f"Invalid host name {domain!r}: expected e.g. 'acme.localhost'.")
        return domain


class DomainInline(admin.TabularInline):
    """Host names of a tenant. The public tenant's hosts serve this console, so they are shown read-only."""

    model = Domain
    form = DomainForm
    fields = ("domain", "is_primary")

    def get_extra(self, request: HttpRequest, obj: Tenant | None = None, **kwargs: Any) -> int:
        return 0 if obj is not None else 1

    def has_add_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return not _is_public(obj) and super().has_add_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return not _is_public(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return not _is_public(obj) and super().has_delete_permission(request, obj)


def _is_public(tenant: Tenant | None) -> bool:
    return tenant is not None and tenant.is_public


@admin.register(Tenant)
class TenantAdmin(SafeActionSelectionMixin, admin.ModelAdmin):
    """Tenants and their quotas.

    The recommended way to create a tenant is `manage.py provision_tenant`, which also creates the API user and
    prints its token; adding one here creates the schema and domains only. The schema name is derived from the
    slug (as provision_tenant does) and neither changes afterwards. Deleting is refused for the public tenant
    and for any tenant that still holds schedules: retiring a tenant with data is not a one-click operation, and
    the delete confirmation page would otherwise try to list millions of related rows.
    """

    form = TenantForm
    inlines = (DomainInline,)
    list_display = (
        "slug",
        "name",
        "schema_name",
        "primary_domain",
        "max_schedules",
        "max_fires_per_second",
        "max_running",
        "max_catchup_per_minute",
        "fairness_weight",
        "schedules_held",
        "created_at",
    )
    list_display_links = ("slug", "name")
    search_fields = ("slug", "name", "domains__domain")
    ordering = ("slug",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Per-row subqueries run only for the tenants on the page, and the count reads the (tenant, state)
        # index; a JOIN + GROUP BY would aggregate all 20 M schedules before the LIMIT.
        held = (
            Schedule.objects.filter(tenant=OuterRef("pk"))
            .counted_by_quota()
            .order_by()
            .values("tenant")
            .annotate(held=Count("pk"))
            .values("held")
        )
        primary = Domain.objects.filter(tenant=OuterRef("pk"), is_primary=True).order_by().values("domain")[:1]
        return (
            super()
            .get_queryset(request)
            .annotate(
                schedules_held_count=Coalesce(Subquery(held, output_field=IntegerField()), Value(0)),
                primary_domain_name=Subquery(primary),
            )
        )

    @admin.display(description="primary domain", ordering="primary_domain_name")
    def primary_domain(self, tenant: Tenant) -> str:
        return getattr(tenant, "primary_domain_name", None) or "—"

    @admin.display(description="schedules (active + paused)", ordering="schedules_held_count")
    def schedules_held(self, tenant: Tenant) -> str:
        count = getattr(tenant, "schedules_held_count", None)
        if count is None:
            count = Schedule.objects.for_tenant(tenant).counted_by_quota().count()
        url = reverse("admin:schedules_schedule_changelist") + f"?tenant__id__exact={tenant.pk}"
        return format_html('<a href="{}">{} of {}</a>', url, count, tenant.max_schedules)

    def get_readonly_fields(self, request: HttpRequest, obj: Tenant | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("slug", "schema_name", "schedules_held", "created_at", "updated_at")

    def get_fieldsets(self, request: HttpRequest, obj: Tenant | None = None):
        identity = ("slug", "name") if obj is None else ("slug", "name", "schema_name", "schedules_held")
        fieldsets = [
            (None, {"fields": identity}),
            (
                "Quotas",
                {
                    "fields": QUOTA_FIELDS,
                    "description": "Limits on what this tenant may take from shared capacity. "
                    "Max schedules counts active plus paused schedules.",
                },
            ),
        ]
        if obj is not None:
            fieldsets.append(("Record", {"fields": ("created_at", "updated_at")}))
        return fieldsets

    def get_actions(self, request: HttpRequest) -> dict:
        # The bulk delete would enumerate every related schedule and occurrence of the selected tenants.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        if obj is not None and (obj.is_public or Schedule.objects.for_tenant(obj).exists()):
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Tenant, form: TenantForm, change: bool) -> None:
        if change:
            obj.save()
            return
        obj.schema_name = schema_name_for(obj.slug)
        # Creates and migrates the tenant's schema (django-tenants), quietly.
        obj.save(verbosity=0)
        messages.info(
            request,
            f"Tenant {obj.slug} created with schema {obj.schema_name}. It has no API token yet: run "
            f"`manage.py provision_tenant {obj.slug} --domain <host>` to create its API user and print the token.",
        )
