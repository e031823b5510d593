"""The console's tenant filter, shared by the schedule and occurrence lists."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest

from scheduler_project.console import BIGINT_MAX
from tenants.access import scoped
from tenants.models import Tenant


class TenantFilter(admin.SimpleListFilter):
    """Tenants that can own engine rows: the platform's own public tenant never does."""

    title = "tenant"
    parameter_name = "tenant__id__exact"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        tenants = scoped(request, Tenant.objects.exclude(schema_name="public"), "pk").order_by("slug")
        return [(str(pk), slug) for pk, slug in tenants.values_list("pk", "slug")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if not (value.isascii() and value.isdigit()) or int(value) > BIGINT_MAX:
            # The admin answers this with its own "invalid filter" page (?e=1), not a database error.
            raise IncorrectLookupParameters(f"{value!r} is not a tenant id")
        return queryset.filter(tenant_id=int(value))
