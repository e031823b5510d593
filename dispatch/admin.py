"""Operator console for the data plane: read-only views of occurrences, attempts and the outbox."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.db.models import F, Func, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from dispatch.models import Attempt, Occurrence, OutboxMessage
from dispatch.queues import ALL_QUEUES
from scheduler_project.console import (
    EXACT_COUNT_LIMIT,
    EstimatedCountPaginator,
    SafeActionSelectionMixin,
    TenantFilter,
    bounded_count,
    parse_uuid,
)
from schedules.clock import db_now
from schedules.models import Lane
from tenants.models import Tenant

# --- filters that never scan the big tables ---------------------------------------------------------------


class LaneFilter(admin.SimpleListFilter):
    """Lanes from the model's choices; the default filter would run SELECT DISTINCT over every occurrence."""

    title = "lane"
    parameter_name = "lane"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return list(Lane.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(lane=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(name, name) for name in ALL_QUEUES]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(queue=self.value()) if self.value() else queryset


def precise_utc(value: datetime | None) -> str:
    """Milliseconds matter here: enqueue lag is judged against a 5-second budget."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


class ReadOnlyAdminMixin(SafeActionSelectionMixin):
    """The data plane changes only through its services (materializer, relay, workers): never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- occurrences ------------------------------------------------------------------------------------------


class AttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "generation",
        "worker",
        "started_at",
        "heartbeat_at",
        "lease_expires_at",
        "finished_at",
        "outcome",
        "error_class",
        "error",
    )
    readonly_fields = fields


@admin.register(Occurrence)
class OccurrenceAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Occurrences, read-only.

    The table takes ~200 M rows a day, partitioned by day on scheduled_for, with no index on scheduled_for
    alone. So the unfiltered list is ordered by occurrence id (the primary-key index of every partition, merged:
    the first page costs a few index pages), not newest-first, which would sort a whole day of rows. Searching
    a schedule id lists that schedule's occurrences newest first from its (schedule_id, scheduled_for) index.
    """

    list_display = (
        "occurrence_id",
        "tenant",
        "schedule_link",
        "schedule_version",
        "scheduled_for_utc",
        "available_at_utc",
        "lane",
        "state",
        "attempt_count",
        "enqueued_at_utc",
        "finished_at_utc",
    )
    list_filter = ("state", LaneFilter, TenantFilter, "manual")
    list_select_related = ("tenant", "schedule")
    search_fields = ("occurrence_id", "schedule__id")
    search_help_text = "An occurrence id or a schedule id (exact UUID)."
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facet counts would COUNT(*) every filter choice over the whole table on each page view.
    show_facets = admin.ShowFacets.NEVER
    inlines = (AttemptInline,)
    fields = (
        "occurrence_id",
        "tenant",
        "schedule",
        "schedule_version",
        "manual",
        "scheduled_for",
        "available_at",
        "lane",
        "priority",
        "state",
        "attempt_count",
        "lease_expires_at",
        "enqueued_at",
        "finished_at",
        "created_at",
    )
    readonly_fields = fields

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        if parse_uuid(request.GET.get("q", "")) is not None:
            return ("-scheduled_for",)
        return ("-occurrence_id",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Payloads may be 64 KiB each; the list shows only the schedule's name.
        return (
            super()
            .get_queryset(request)
            .select_related("tenant", "schedule")
            .defer("schedule__payload", "schedule__request_fingerprint")
        )

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        """Only exact ids: a substring search over hundreds of millions of UUIDs would scan the table."""
        if not search_term.strip():
            return queryset, False
        wanted = parse_uuid(search_term)
        if wanted is None:
            return queryset.none(), False
        return queryset.filter(Q(occurrence_id=wanted) | Q(schedule_id=wanted)), False

    @admin.display(description="schedule", ordering="schedule__name")
    def schedule_link(self, occurrence: Occurrence) -> str:
        url = reverse("admin:schedules_schedule_change", args=[occurrence.schedule_id])
        return format_html('<a href="{}">{}</a>', url, occurrence.schedule.name)

    @admin.display(description="scheduled for", ordering="scheduled_for")
    def scheduled_for_utc(self, occurrence: Occurrence) -> str:
        return precise_utc(occurrence.scheduled_for)

    @admin.display(description="available at", ordering="available_at")
    def available_at_utc(self, occurrence: Occurrence) -> str:
        return precise_utc(occurrence.available_at)

    @admin.display(description="enqueued at", ordering="enqueued_at")
    def enqueued_at_utc(self, occurrence: Occurrence) -> str:
        return precise_utc(occurrence.enqueued_at)

    @admin.display(description="finished at", ordering="finished_at")
    def finished_at_utc(self, occurrence: Occurrence) -> str:
        return precise_utc(occurrence.finished_at)


# --- outbox -----------------------------------------------------------------------------------------------


class PublishedFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("pending", "waiting to be published"), ("published", "published, not yet settled")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "pending":
            return queryset.filter(published_at__isnull=True)
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

    @admin.display(description="available at", ordering="available_at")
    def available_at_utc(self, message: OutboxMessage) -> str:
        return precise_utc(message.available_at)

    @admin.display(description="published at", ordering="published_at")
    def published_at_utc(self, message: OutboxMessage) -> str:
        return precise_utc(message.published_at)

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
