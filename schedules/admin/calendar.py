"""The calendar ModelAdmin: every tenant's holiday calendars, for operators to read. Like schedules, calendars are
tenant data, created and changed by the tenant through the API (/api/v1/calendars/), where each change is kept as a
revision that reconcile and backfill judge fires by; the console shows them and which schedules name them."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from schedules.admin.formatting import format_utc
from schedules.calendars import schedules_naming
from schedules.models import Calendar
from tenants.access import scoped
from tenants.filters import TenantFilter

# Dates and ranges listed on a calendar's page; a longer calendar says how many more it has.
SHOWN = 400


@admin.register(Calendar)
class CalendarAdmin(admin.ModelAdmin):
    list_display = ("tenant", "name", "date_count", "range_count", "revision", "updated")
    list_display_links = ("name",)
    list_filter = (TenantFilter,)
    list_select_related = ("tenant",)
    search_fields = ("name", "=tenant__slug")
    search_help_text = "Name (contains) or tenant slug (exact)."
    show_facets = admin.ShowFacets.NEVER
    fields = ("tenant", "name", "description", "revision", "updated", "used_by", "date_list", "range_list")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Calendar | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Calendar | None = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return scoped(request, super().get_queryset(request)).order_by("tenant__slug", "name")

    @admin.display(description="dates")
    def date_count(self, calendar: Calendar) -> int:
        return len(calendar.dates)

    @admin.display(description="ranges")
    def range_count(self, calendar: Calendar) -> int:
        return len(calendar.ranges)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, calendar: Calendar) -> str:
        return format_utc(calendar.updated_at)

    @admin.display(description="used by")
    def used_by(self, calendar: Calendar) -> str:
        count = schedules_naming(calendar.tenant_id, calendar.name).count()
        if not count:
            return "No active or paused schedule names it."
        url = f"{reverse('admin:schedules_schedule_changelist')}?tenant__id__exact={calendar.tenant_id}"
        noun = "schedule" if count == 1 else "schedules"
        return format_html('{} active or paused {} (<a href="{}">the tenant\'s schedules</a>)', count, noun, url)

    @admin.display(description="dates (local date of each schedule)")
    def date_list(self, calendar: Calendar) -> str:
        return _listed(calendar.dates)

    @admin.display(description="ranges [start, end) UTC")
    def range_list(self, calendar: Calendar) -> str:
        return _listed([f"{r['start']} to {r['end']}" for r in calendar.ranges])


def _listed(items: list[str]) -> str:
    if not items:
        return "None."
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return format_html(
        '<ul class="calendar-list">{}</ul>{}', format_html_join("", "<li>{}</li>", ((i,) for i in items[:SHOWN])), more
    )
