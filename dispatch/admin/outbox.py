"""The outbox in the console: the relay's backlog of envelopes, read from its partial indexes."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import F, Func, IntegerField, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from core.clock import db_now
from dispatch.admin.common import ReadOnlyAdminMixin, ShownCountChangeList, utc_column
from dispatch.admin.filters import QueueFilter
from dispatch.models import OutboxMessage
from scheduler_project.console import EXACT_COUNT_LIMIT, EstimatedCountPaginator, bounded_count, parse_uuid
from tenants.access import sees_every_tenant
from tenants.models import Tenant

# --- outbox -----------------------------------------------------------------------------------------------


class PublishedFilter(admin.SimpleListFilter):
    """Where an envelope stands; the dashboard's backlog tiles link to "due" and "published" and count what they
    list (dispatch/sql/dashboard.py BACKLOG)."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [
            ("pending", "waiting to be published"),
            ("due", "due now, not yet published"),
            ("published", "published, not yet settled"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "pending":
            return queryset.filter(published_at__isnull=True)
        if self.value() == "due":
            # The partial index outbox_due (available_at) WHERE published_at IS NULL serves it.
            return queryset.filter(published_at__isnull=True, available_at__lte=db_now())
        if self.value() == "published":
            return queryset.filter(published_at__isnull=False)
        return queryset


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The outbox of envelopes is the relay's backlog: its depth and oldest due row say whether publishing keeps
    up. Bodies (serialised task calls) are never loaded here."""

    list_display = (
        "id",
        "tenant_slug",
        "queue",
        "available_at_utc",
        "priority",
        "size",
        "published_at_utc",
        "created_at",
    )
    list_filter = (PublishedFilter, QueueFilter)
    search_fields = ("occurrence_ids",)
    search_help_text = "An occurrence id (exact UUID): the envelopes that carry it."
    # Matches the relay's index (available_at, -priority): the first page is an index scan, never a sort.
    ordering = ("available_at", "-priority")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    change_list_template = "admin/dispatch/outboxmessage/change_list.html"
    fields = (
        "id",
        "tenant_slug",
        "queue",
        "available_at",
        "priority",
        "size",
        "occurrence_list",
        "published_at",
        "created_at",
    )
    readonly_fields = fields

    # The relay's backlog mixes every tenant's envelopes and its figures count them all: an operator who sees
    # every tenant reads it; a tenant-scoped one does not see it (tenants/access.py).
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return sees_every_tenant(request) and super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return sees_every_tenant(request) and super().has_module_permission(request)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type:
        return ShownCountChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # tenant_id is a plain column (the relay must not join), so the slug comes from a per-row subquery.
        slug = Tenant.objects.filter(pk=OuterRef("tenant_id")).values("slug")[:1]
        return (
            super()
            .get_queryset(request)
            .defer("body", "scheduled_fors")
            .annotate(
                tenant_slug=Subquery(slug),
                size=Func(F("occurrence_ids"), function="cardinality", output_field=IntegerField()),
            )
        )

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        if not search_term.strip():
            return queryset, False
        wanted = parse_uuid(search_term)
        return (queryset.none() if wanted is None else queryset.filter(occurrence_ids__contains=[wanted])), False

    @admin.display(description="tenant")
    def tenant_slug(self, message: OutboxMessage) -> str:
        return getattr(message, "tenant_slug", None) or str(message.tenant_id)

    available_at_utc = utc_column("available_at", "available at", ordering="available_at")

    published_at_utc = utc_column("published_at", "published at", ordering="published_at")

    @admin.display(description="occurrences")
    def size(self, message: OutboxMessage) -> int:
        return getattr(message, "size", None) or len(message.occurrence_ids)

    @admin.display(description="occurrence ids")
    def occurrence_list(self, message: OutboxMessage) -> str:
        links = [
            format_html('<a href="{}">{}</a>', reverse("admin:dispatch_occurrence_change", args=[oid]), oid)
            for oid in message.occurrence_ids
        ]
        return format_html_join(mark_safe("<br>"), "{}", ((link,) for link in links))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        return super().changelist_view(request, {**outbox_summary(), **(extra_context or {})})


def outbox_summary() -> dict[str, Any]:
    """Envelopes waiting, already due, and the age of the oldest due one: each from an index or the statistics."""
    now = db_now()
    pending = OutboxMessage.objects.filter(published_at__isnull=True)
    depth = bounded_count(pending, EXACT_COUNT_LIMIT)
    due = bounded_count(pending.filter(available_at__lte=now), EXACT_COUNT_LIMIT)
    unsettled = bounded_count(OutboxMessage.objects.filter(published_at__isnull=False), EXACT_COUNT_LIMIT)
    # The partial index outbox_due (available_at, -priority) WHERE published_at IS NULL serves this directly.
    oldest = pending.order_by("available_at").values_list("available_at", flat=True).first()
    lag = (now - oldest).total_seconds() if oldest is not None and oldest <= now else 0.0
    return {
        "outbox_depth": _at_most(depth),
        "outbox_due": _at_most(due),
        "outbox_unsettled": _at_most(unsettled),
        "outbox_oldest": oldest,
        "outbox_lag_seconds": lag,
        "outbox_now": now,
    }


def _at_most(count: int) -> str:
    return f"{EXACT_COUNT_LIMIT:,}+" if count > EXACT_COUNT_LIMIT else f"{count:,}"
