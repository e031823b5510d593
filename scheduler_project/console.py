"""Operator-console helpers shared by every app's admin: counts that never scan big tables, tenant filter, ids."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, time
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.functional import cached_property

__all__ = [
    "EXACT_COUNT_LIMIT",
    "EstimatedCountPaginator",
    "InstantField",
    "PageChangeList",
    "bounded_count",
    "estimated_table_rows",
    "log_changes",
    "parse_instant_text",
    "parse_uuid",
    "planner_estimate",
]

# Below this many rows an exact COUNT(*) costs milliseconds; above it the engine tables (20 M schedules,
# 200 M occurrences a day) would make every changelist page pay for a full scan, so the count is estimated.
EXACT_COUNT_LIMIT = 100_000


# --- counting big tables ----------------------------------------------------------------------------------


def operator_actor(request: HttpRequest) -> str:
    """Who acted, as versions and logs name an operator (tenant tokens are 'tenant:<slug>/token:…')."""
    return f"operator:{request.user.get_username()}"


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
    plan = json.loads(queryset.order_by().values("pk").explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def bounded_count(queryset: QuerySet, limit: int) -> int:
    """COUNT(*) that stops after `limit + 1` rows: exact below the limit, "more than limit" above it."""
    # values("pk") keeps per-row annotations (the outbox's tenant slug) out of the counted subquery.
    return queryset.order_by().values("pk")[: limit + 1].count()


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


# --- filters and search ----------------------------------------------------------------------------------


BIGINT_MAX = 2**63 - 1


def parse_uuid(text: str) -> uuid.UUID | None:
    """The UUID in `text` (surrounding whitespace ignored), or None when it is not one."""
    try:
        return uuid.UUID(text.strip())
    except (ValueError, AttributeError):
        return None


class SafeActionSelectionMixin:
    """Bulk actions over ids the request names: one id that is not a valid primary key (a tampered or stale
    form) refuses the whole action with a message, instead of a ValidationError from the database layer."""

    def response_action(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        pk = self.model._meta.pk  # type: ignore[attr-defined]
        for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
            try:
                pk.to_python(value)
            except ValidationError:
                self.message_user(  # type: ignore[attr-defined]
                    request, f"Nothing done: {value!r} is not a valid id.", messages.ERROR
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset)  # type: ignore[misc]


# --- the rows of one page ---------------------------------------------------------------------------------


class PageChangeList(ChangeList):
    """A changelist that lets its ModelAdmin add per-row facts for the rows of the page only.

    Columns such as a schedule's last run need a subquery per row. As an annotation of the list's queryset they
    would also run for every row an OFFSET skips (PostgreSQL projects a row before LIMIT/OFFSET discards it when
    an index gives the order): page 500 would pay for 50,000 rows. Here the page is fetched first and
    `model_admin.annotate_page(request, rows)` adds its facts with one query over those rows.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        self.model_admin.annotate_page(request, rows)  # type: ignore[attr-defined]
        self.result_list = rows


# --- recent actions -----------------------------------------------------------------------------------------


def log_changes(request: HttpRequest, entries: Iterable[tuple[Model, str]]) -> None:
    """One admin LogEntry per (object, message), in one INSERT: bulk actions appear under Recent actions and in
    each object's history page like a change made in its form."""
    rows = [
        LogEntry(
            user_id=request.user.pk or 0,  # the admin views behind this require a signed-in operator
            content_type_id=ContentType.objects.get_for_model(obj, for_concrete_model=False).pk,
            object_id=str(obj.pk),
            object_repr=str(obj)[:200],
            action_flag=CHANGE,
            change_message=message,
        )
        for obj, message in entries
    ]
    if rows:
        LogEntry.objects.bulk_create(rows)


# --- instants typed by an operator -----------------------------------------------------------------------

# The instants an operator may type: beyond them zone conversion overflows datetime (the API uses the same range).
EARLIEST_INSTANT = datetime(1900, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)
INSTANT_HINT = "e.g. 2026-12-01 09:00 (UTC) or 2026-12-01T09:00:00+01:00"


def parse_instant_text(text: Any) -> datetime:
    """An instant from a form or query string: ISO 8601 with an offset or Z, or without one read as UTC (the
    console labels its time inputs UTC), or a date alone (its midnight, UTC). Raises ValueError with the reason."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Enter a date and time, {INSTANT_HINT}.")
    text = text.strip()
    try:
        value = parse_datetime(text.replace(" ", "T", 1) if "T" not in text else text)
        day = None if value is not None else parse_date(text)
    except ValueError:
        value = day = None
    if value is None and day is not None:
        value = datetime.combine(day, time(0))
    if value is None:
        raise ValueError(f"{text[:40]!r} is not a date and time; {INSTANT_HINT}.")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    out_of_range = f"Must be from {EARLIEST_INSTANT.year} up to {LATEST_INSTANT.year} (UTC)."
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 with an offset
        raise ValueError(out_of_range) from None
    if not EARLIEST_INSTANT <= value < LATEST_INSTANT:
        raise ValueError(out_of_range)
    return value


class InstantField(forms.CharField):
    """A text input for one instant (see parse_instant_text); cleans to an aware UTC datetime."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 64)
        kwargs.setdefault("widget", forms.TextInput(attrs={"placeholder": "2026-12-01 09:00", "size": 28}))
        super().__init__(**kwargs)

    def clean(self, value: Any) -> datetime | None:
        text = super().clean(value)
        if text in self.empty_values:
            return None
        try:
            return parse_instant_text(text)
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from None
