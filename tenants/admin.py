"""Operator console for tenancy: tenants with their quotas, fairness weight, host names and schedule counts."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from dispatch import services as dispatch_services
from scheduler_project.console import SafeActionSelectionMixin, operator_actor
from tenants import services as tenant_services
from tenants.access import scoped
from tenants.admin_token import TenantTokenMixin
from tenants.deletion import delete_tenant
from tenants.models import Domain, OperatorAccess, Tenant, schema_name_for, validate_slug
from tenants.services import HOST_PATTERN, QUOTA_FIELDS, quota_minimum


class TenantForm(forms.ModelForm):
    """The same slug and quota rules as `provision_tenant`, so both paths accept the same tenants."""

    class Meta:
        model = Tenant
        fields = ("slug", "name", *QUOTA_FIELDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Joined the form after the other quotas: a post without it (a script written before) keeps the value.
        if "max_retries_per_minute" in self.fields:
            self.fields["max_retries_per_minute"].required = False

    def clean_max_retries_per_minute(self) -> int:
        value = self.cleaned_data.get("max_retries_per_minute")
        return self.instance.max_retries_per_minute if value is None else value

    def clean_slug(self) -> str:
        slug = (self.cleaned_data.get("slug") or "").strip()
        validate_slug(slug)
        return slug

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for field in QUOTA_FIELDS:
            value = cleaned.get(field)
            if field in self.fields and value is not None and value < quota_minimum(field):
                self.add_error(field, f"Must be at least {quota_minimum(field)}.")
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
class TenantAdmin(TenantTokenMixin, SafeActionSelectionMixin, admin.ModelAdmin):
    """Tenants and their quotas.

    The recommended way to create a tenant is `manage.py provision_tenant`, which also creates the API user and
    prints its token; adding one here creates the schema and domains only. The schema name is derived from the
    slug (as provision_tenant does) and neither changes afterwards. Deleting is refused for the public tenant
    and for any tenant that still holds schedules: retiring a tenant with data is not a one-click operation, and
    the delete confirmation page would otherwise try to list millions of related rows. A delete that is allowed
    goes through tenants.deletion.delete_tenant (pending work canceled, engine rows cleared, schema dropped).
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
        "max_retries_per_minute",
        "fairness_weight",
        "schedules_held",
        "running",
        "throttled_fires",
        "throttled_claims",
        "created_at",
    )
    list_display_links = ("slug", "name")
    search_fields = ("slug", "name", "domains__domain")
    ordering = ("slug",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Counters kept per tenant, one primary-key probe each per tenant on the page: the schedule count kept by the
        # database (tenants/services.py) and the engine's quota counters (dispatch/services.py); as columns of the
        # query, so the list sorts by them.
        primary = Domain.objects.filter(tenant=OuterRef("pk"), is_primary=True).order_by().values("domain")[:1]
        return scoped(request, super().get_queryset(request), "pk").annotate(
            schedules_held_count=tenant_services.schedules_held_column(),
            **dispatch_services.tenant_quota_columns(),
            primary_domain_name=Subquery(primary),
        )

    @admin.display(description="running now", ordering="running_now")
    def running(self, tenant: Tenant) -> str:
        return f"{getattr(tenant, 'running_now', 0)} of {tenant.max_running}"

    @admin.display(description="throttled fires", ordering="throttled_fires_count")
    def throttled_fires(self, tenant: Tenant) -> int:
        """Fires that waited for max_fires_per_second, since the tenant began."""
        return getattr(tenant, "throttled_fires_count", 0)

    @admin.display(description="claims over max running", ordering="throttled_claims_count")
    def throttled_claims(self, tenant: Tenant) -> int:
        return getattr(tenant, "throttled_claims_count", 0)

    @admin.display(description="primary domain", ordering="primary_domain_name")
    def primary_domain(self, tenant: Tenant) -> str:
        return getattr(tenant, "primary_domain_name", None) or "—"

    @admin.display(description="schedules (active + paused)", ordering="schedules_held_count")
    def schedules_held(self, tenant: Tenant) -> str:
        count = getattr(tenant, "schedules_held_count", None)
        if count is None:
            count = tenant_services.schedules_held(tenant.pk)
        url = reverse("admin:schedules_schedule_changelist") + f"?tenant__id__exact={tenant.pk}"
        return format_html('<a href="{}">{} of {}</a>', url, count, tenant.max_schedules)

    def get_readonly_fields(self, request: HttpRequest, obj: Tenant | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return (
            "slug",
            "schema_name",
            "api_token",
            "schedules_held",
            "running",
            "throttled_fires",
            "throttled_claims",
            "created_at",
            "updated_at",
        )

    def get_fieldsets(self, request: HttpRequest, obj: Tenant | None = None):
        identity = ("slug", "name") if obj is None else ("slug", "name", "schema_name", "schedules_held")
        fieldsets = [
            (None, {"fields": identity}),
            (
                "Quotas",
                {
                    "fields": QUOTA_FIELDS,
                    "description": "Limits on what this tenant may take from shared capacity. "
                    "Max schedules counts active plus paused schedules; max retries per minute 0 is unlimited.",
                },
            ),
        ]
        if obj is not None:
            if not obj.is_public:
                fieldsets.append(("API", {"fields": ("api_token",)}))
            fieldsets.append(("Usage", {"fields": ("running", "throttled_fires", "throttled_claims")}))
            fieldsets.append(("Record", {"fields": ("created_at", "updated_at")}))
        return fieldsets

    def get_actions(self, request: HttpRequest) -> dict:
        # The bulk delete would enumerate every related schedule and occurrence of the selected tenants.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        if obj is not None and (obj.is_public or tenant_services.holds_schedules(obj.pk)):
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Tenant) -> None:
        """Through the service: pending occurrences canceled with the reason, envelopes and engine rows cleared, the
        schema (users, tokens) dropped."""
        deleted = delete_tenant(obj, actor=operator_actor(request))
        messages.info(
            request,
            f"Tenant {deleted.slug} deleted: {deleted.occurrences_canceled} pending occurrences canceled, "
            f"{deleted.envelopes_withdrawn} envelopes withdrawn.",
        )

    def save_model(self, request: HttpRequest, obj: Tenant, form: TenantForm, change: bool) -> None:
        if change:
            obj.save()
            return
        obj.schema_name = schema_name_for(obj.slug)
        # Creates and migrates the tenant's schema (django-tenants), quietly.
        obj.save(verbosity=0)
        messages.info(
            request,
            f"Tenant {obj.slug} created with schema {obj.schema_name}. It has no API token yet: create one from its "
            f"page (API token), or run `manage.py provision_tenant {obj.slug} --domain <host>`.",
        )


class OperatorAccessInline(admin.StackedInline):
    """On a user's page: the tenants an operator who is not a superuser sees and acts on (tenants/access.py)."""

    model = OperatorAccess
    can_delete = False
    filter_horizontal = ("tenants",)
    verbose_name_plural = "Tenant access (for operators who are not superusers; none assigned: no tenant)"

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "tenants":
            kwargs["queryset"] = Tenant.objects.exclude(schema_name="public").order_by("slug")
        return super().formfield_for_manytomany(db_field, request, **kwargs)


if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class OperatorUserAdmin(UserAdmin):
    inlines = [OperatorAccessInline]
