"""Operator console for the data plane: read-only views of occurrences, attempts and the outbox."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from dispatch.models import Attempt, Occurrence, OutboxMessage
from dispatch.queues import ALL_QUEUES
from schedules.clock import db_now
from schedules.models import Lane
from tenants.models import Tenant

# Below this many rows an exact COUNT(*) costs milliseconds; above it the engine tables (20 M schedules,
# 200 M occurrences a day) would make every changelist page pay for a full scan, so the count is estimated.
EXACT_COUNT_LIMIT = 100_000


# --- counting big tables ----------------------------------------------------------------------------------


def estimated_table_rows(queryset: QuerySet) -> int:
    """The planner's row estimate for the whole table (and its partitions, should it be partitioned).

    `reltuples` is refreshed by VACUUM/ANALYZE (autovacuum), is -1 before the first one, and costs nothing.
    """
    table = queryset.model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT COALESCE(SUM(GREATEST(c.reltuples, 0)), 0)::bigint
            FROM pg_class c
            WHERE c.oid = to_regclass(%s)
               OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(%s))
            """,
            [table, table],
        )
        return int(cursor.fetchone()[0])


def planner_estimate(queryset: QuerySet) -> int:
    """Rows the planner expects a filtered query to return (EXPLAIN, nothing is executed)."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def bounded_count(queryset: QuerySet, limit: int) -> int:
    """COUNT(*) that stops after `limit + 1` rows: exact below the limit, "more than limit" above it."""
    return queryset.order_by()[: limit + 1].count()


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to EXACT_COUNT_LIMIT rows and estimates beyond, so no page does a full COUNT(*).

    1. Unfiltered and the table statistics say it is big: take `pg_class.reltuples`.
    2. Otherwise count at most EXACT_COUNT_LIMIT + 1 rows.
    3. If that count overflows, take the larger of it and the planner's estimate for the filtered query.

    `estimated` tells the pagination template to mark the total as approximate. With an estimate a page
    number near the end may come back empty or the last few rows may need a narrower filter to reach: the
    price of not scanning 20 M rows per page view.
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        unfiltered = not queryset.query.where
        if unfiltered:
            estimate = estimated_table_rows(queryset)
            if estimate > EXACT_COUNT_LIMIT:
                self.estimated = True
                return estimate
        counted = bounded_count(queryset, EXACT_COUNT_LIMIT)
        if counted <= EXACT_COUNT_LIMIT:
            return counted
        self.estimated = True
        estimate = estimated_table_rows(queryset) if unfiltered else planner_estimate(queryset)
        return max(counted, estimate)


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


def parse_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text.strip())
    except (ValueError, AttributeError):
        return None


class ReadOnlyAdminMixin:
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
    list_display = (
        "occurrence_id",
        "tenant",
        "schedule_link",
        "schedule_version",
        "scheduled_for",
        "available_at",
        "lane",
        "state",
        "attempt_count",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("state", LaneFilter, "tenant", "manual")
    list_select_related = ("tenant", "schedule")
    search_fields = ("occurrence_id", "schedule__id")
    search_help_text = "An occurrence id or a schedule id (exact UUID)."
    ordering = ("-scheduled_for",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
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
        "enqueued_at",
        "finished_at",
        "created_at",
    )
    readonly_fields = fields

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


# --- outbox -----------------------------------------------------------------------------------------------


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The outbox is the relay's backlog: its depth and oldest due row say whether publishing keeps up."""

    list_display = ("id", "occurrence_link", "tenant_slug", "queue", "available_at", "priority")
    list_filter = (QueueFilter,)
    search_fields = ("occurrence_id",)
    search_help_text = "An occurrence id (exact UUID)."
    # Matches the relay's index (available_at, -priority): the first page is an index scan, never a sort.
    ordering = ("available_at", "-priority")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    change_list_template = "admin/dispatch/outboxmessage/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # tenant_id is a plain column (the relay must not join), so the slug comes from a per-row subquery.
        slug = Tenant.objects.filter(pk=OuterRef("tenant_id")).values("slug")[:1]
        return super().get_queryset(request).annotate(tenant_slug=Subquery(slug))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        if not search_term.strip():
            return queryset, False
        wanted = parse_uuid(search_term)
        return (queryset.none() if wanted is None else queryset.filter(occurrence_id=wanted)), False

    @admin.display(description="occurrence")
    def occurrence_link(self, message: OutboxMessage) -> str:
        url = reverse("admin:dispatch_occurrence_change", args=[message.occurrence_id])
        return format_html('<a href="{}">{}</a>', url, message.occurrence_id)

    @admin.display(description="tenant")
    def tenant_slug(self, message: OutboxMessage) -> str:
        return getattr(message, "tenant_slug", None) or str(message.tenant_id)

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        return super().changelist_view(request, {**outbox_summary(), **(extra_context or {})})


def outbox_summary() -> dict[str, Any]:
    """Depth, rows already due and the age of the oldest due row, each from an index or the statistics."""
    now = db_now()
    rows = OutboxMessage.objects.all()
    depth_paginator = EstimatedCountPaginator(rows, 1)
    depth = depth_paginator.count
    due = bounded_count(rows.filter(available_at__lte=now), EXACT_COUNT_LIMIT)
    oldest = rows.order_by("available_at").values_list("available_at", flat=True).first()
    lag = (now - oldest).total_seconds() if oldest is not None and oldest <= now else 0.0
    return {
        "outbox_depth": f"{depth:,}",
        "outbox_depth_estimated": depth_paginator.estimated,
        "outbox_due": f"{min(due, EXACT_COUNT_LIMIT):,}",
        "outbox_due_capped": due > EXACT_COUNT_LIMIT,
        "outbox_oldest": oldest,
        "outbox_lag_seconds": lag,
        "outbox_now": now,
    }
