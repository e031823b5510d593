"""Occurrences in the console: newest first within a range, searched by id, schedule name or labels, or state
reason (dispatch/admin/search.py), lateness and duration, a timeline of each; replay and resolve from the dead-letter
queue (dispatch/admin/dlq.py), and a missed or skipped fire run again under its own id (dispatch/admin/rerun.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from core.clock import db_now
from core.cron_syntax import TimeRuleError
from core.timerules import local_time
from dispatch.admin.common import (
    AttemptTimesMixin,
    ReadOnlyAdminMixin,
    ShownCountChangeList,
    label_rows,
    labels_of,
    precise_utc,
    utc_column,
)
from dispatch.admin.filters import (
    RANGE_ON_REQUEST,
    DeadLetterFilter,
    LaneFilter,
    ScheduledRangeFilter,
    ScheduleIdFilter,
    StuckFilter,
)
from dispatch.admin.rerun import RerunAdmin
from dispatch.admin.search import HELP_TEXT, search_occurrences
from dispatch.dlq import current_resolution, current_resolutions, resolution_history
from dispatch.models import Attempt, Occurrence, OccurrenceResolution, OccurrenceState
from dispatch.rerun import rerun_history
from dispatch.timeline import occurrence_ids_in, occurrence_timeline, seconds_text, verdict
from scheduler_project.console import EstimatedCountPaginator, PageChangeList
from schedules.models import ScheduleVersion
from tenants.access import scoped
from tenants.filters import TenantFilter


class AttemptInline(AttemptTimesMixin, ReadOnlyAdminMixin, admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "attempt_link",
        "worker",
        "started",
        "heartbeat",
        "lease_expires",
        "finished",
        "duration",
        "outcome",
        "error_class",
        "error",
    )
    readonly_fields = fields

    @admin.display(description="attempt")
    def attempt_link(self, attempt: Attempt) -> str:
        url = reverse("admin:dispatch_attempt_change", args=[attempt.pk])
        return format_html('<a href="{}">#{}</a>', url, attempt.generation)

    @admin.display(description="duration")
    def duration(self, attempt: Attempt) -> str:
        if attempt.finished_at is None:
            return "—"
        return seconds_text(attempt.finished_at - attempt.started_at).lstrip("+")


@dataclass(frozen=True)
class AttemptSpan:
    """What the list needs of an occurrence's attempts: when the first started, when the last ran."""

    first_started: datetime
    last_started: datetime
    last_finished: datetime | None


# The columns the list may be sorted by (besides scheduled for) when its range is bounded: see OccurrenceChangeList.
SORTABLE_IN_A_RANGE = ("scheduled_for_text", "state_text", "attempt_count", "lane", "schedule_version")


class OccurrenceChangeList(ShownCountChangeList, PageChangeList):
    """The page's rows annotated (PageChangeList), a count that says the rows shown (ShownCountChangeList), and the
    sorts that stay bounded.

    No b-tree orders the table by scheduled_for alone (a BRIN keeps the hot insert cheap), so the default newest-first
    list already reads every row of its range and keeps the top of a sort (EXPLAIN: a top-N heapsort over the BRIN's
    bitmap scan of the range's day partitions). Sorting that range by state, attempts, lane or version reads the same
    rows and sorts them the same way: no dearer (measured over the default hour of 270,000 rows, 90,000 in range:
    6,803 buffers and 64 ms newest first, 6,819 and 76 ms by state). When the range is open (one schedule's
    occurrences, or the DLQ, over any time), only scheduled_for has an index that gives its order
    (occurrence_schedule_recent); any other sort would read and sort that schedule's whole history, so it is not
    offered, and a hand-made ?o= naming it is ignored.
    Ties keep the admin's own order (newest first, then the id), so a page never reshuffles between two views.
    """

    def get_ordering(self, request: HttpRequest, queryset: QuerySet) -> list:
        after, _, _ = getattr(request, RANGE_ON_REQUEST, (None, None, None))
        if after is None:
            self.sortable_by = [name for name in self.sortable_by or () if name == "scheduled_for_text"]
        return super().get_ordering(request, queryset)

    def get_ordering_field(self, field_name: Any) -> Any:
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)


@admin.register(Occurrence)
class OccurrenceAdmin(ReadOnlyAdminMixin, RerunAdmin):
    """Occurrences, newest first, each with its timeline; dead ones can be replayed or resolved (DeadLetterAdmin),
    missed and skipped ones run again (RerunAdmin).

    The table takes ~200 M rows a day, partitioned by day on scheduled_for, with no b-tree on scheduled_for alone.
    The list is always bounded in time (ScheduledRangeFilter: the last hour unless told otherwise), so the
    newest-first sort reads the rows of that range only (pruned to its day partitions, found through the BRIN); one
    schedule's occurrences come newest first from its (schedule_id, scheduled_for DESC) index over any range.
    Lateness and duration come from the page's attempts, the schedule's and tenant's names from their tables, each
    read in one query per page (PageChangeList): no join, so a row whose tenant was deleted is listed and counted
    alike (dispatch.admin.common.label_rows).
    """

    list_display = (
        "short_id",
        "tenant_text",
        "schedule_link",
        "schedule_version",
        "scheduled_for_text",
        "state_text",
        "lateness",
        "duration",
        "attempt_count",
        "lane",
    )
    list_filter = (
        ScheduledRangeFilter,
        ScheduleIdFilter,
        DeadLetterFilter,
        StuckFilter,
        "state",
        LaneFilter,
        TenantFilter,
        "manual",
    )
    list_display_links = ("short_id",)
    list_select_related = ()
    # Shows the search box; the search itself is dispatch/admin/search.py (get_search_results).
    search_fields = ("occurrence_id", "schedule__id")
    search_help_text = HELP_TEXT
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facet counts would COUNT(*) every filter choice over the whole table on each page view.
    show_facets = admin.ShowFacets.NEVER
    # Narrowed to scheduled_for alone when the range is open (OccurrenceChangeList says why).
    sortable_by = SORTABLE_IN_A_RANGE
    ordering = ("-scheduled_for",)
    actions = ("replay_dead", "resolve_dead", "rerun_selected")
    inlines = (AttemptInline,)
    change_form_template = "admin/dispatch/occurrence/change_form.html"
    fields = (
        "occurrence_id",
        "tenant_text",
        "schedule_link",
        "schedule_version",
        "origin",
        "scheduled_for_text",
        "available_at_utc",
        "lane",
        "priority",
        "state",
        "state_reason",
        "resolution",
        "attempt_count",
        "lease_expires_at_utc",
        "enqueued_at_utc",
        "finished_at_utc",
        "created_at_utc",
    )
    readonly_fields = fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type:
        return OccurrenceChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return scoped(request, super().get_queryset(request))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        """Ids, schedule names and labels, state reasons: each bounded (dispatch/admin/search.py)."""
        return search_occurrences(request, queryset, search_term), False

    def annotate_page(self, request: HttpRequest | None, occurrences: list[Occurrence]) -> None:
        """The attempts of the page's occurrences in one query (scheduled_for prunes the attempt partitions), their
        schedules' and tenants' names, and the resolutions of its dead ones."""
        spans: dict[Any, AttemptSpan] = {}
        if occurrences:
            rows = (
                Attempt.objects.filter(
                    occurrence_id__in=[o.occurrence_id for o in occurrences],
                    scheduled_for__in={o.scheduled_for for o in occurrences},
                )
                .order_by("occurrence_id", "generation")
                .values_list("occurrence_id", "started_at", "finished_at")
            )
            for occurrence_id, started_at, finished_at in rows:
                first = spans.get(occurrence_id)
                spans[occurrence_id] = AttemptSpan(
                    first_started=first.first_started if first else started_at,
                    last_started=started_at,
                    last_finished=finished_at,
                )
        resolutions = current_resolutions(occurrences)
        for occurrence in occurrences:
            occurrence.attempt_span = spans.get(occurrence.occurrence_id)  # type: ignore[attr-defined]
            occurrence.dlq_resolution = resolutions.get(occurrence.occurrence_id)  # type: ignore[attr-defined]
        label_rows(occurrences)

    @admin.display(description="occurrence")
    def short_id(self, occurrence: Occurrence) -> str:
        """The id's first block (the page and the search take the whole id); the full id on hover."""
        return format_html('<code title="{}">{}&hellip;</code>', occurrence.occurrence_id, str(occurrence.pk)[:8])

    @admin.display(description="tenant")
    def tenant_text(self, occurrence: Occurrence) -> str:
        _, slug = labels_of(occurrence)
        return slug or f"{occurrence.tenant_id} (deleted)"

    @admin.display(description="schedule")
    def schedule_link(self, occurrence: Occurrence) -> str:
        schedule, _ = labels_of(occurrence)
        if schedule is None:
            return format_html("<code>{}</code> (deleted)", occurrence.schedule_id)
        url = reverse("admin:schedules_schedule_change", args=[occurrence.schedule_id])
        return format_html('<a href="{}">{}</a>', url, schedule.name)

    @admin.display(description="scheduled for", ordering="scheduled_for")
    def scheduled_for_text(self, occurrence: Occurrence) -> str:
        """UTC to the millisecond, and the schedule's wall clock, with the zone's abbreviation."""
        schedule, _ = labels_of(occurrence)
        if schedule is None or schedule.timezone == "UTC":
            return precise_utc(occurrence.scheduled_for)
        try:
            local = local_time(occurrence.scheduled_for, schedule.timezone)
        except (TimeRuleError, ValueError):
            return precise_utc(occurrence.scheduled_for)
        return format_html(
            "{}<br><small>{} {} ({})</small>",
            precise_utc(occurrence.scheduled_for),
            local.strftime("%Y-%m-%d %H:%M:%S"),
            local.tzname(),
            schedule.timezone,
        )

    @admin.display(description="state", ordering="state")
    def state_text(self, occurrence: Occurrence) -> str:
        reason = occurrence.state_reason
        shown = reason if len(reason) <= 90 else reason[:87] + "..."
        resolution = self._resolution(occurrence)
        return format_html(
            '<span class="sched-state sched-state-{}">{}</span>{}{}{}',
            occurrence.state,
            occurrence.state,
            format_html('<br><small title="{}">{}</small>', reason, shown) if reason else "",
            format_html("<br><small>{}</small>", "throttled") if occurrence.throttled else "",
            format_html(
                '<br><small class="resolved" title="{}">resolved by {}</small>', resolution.note, resolution.resolved_by
            )
            if resolution is not None
            else "",
        )

    @admin.display(description="resolution")
    def resolution(self, occurrence: Occurrence) -> str:
        """Who set this death aside from the DLQ, when and why; none while it is in the DLQ (or not dead)."""
        found = self._resolution(occurrence)
        if found is None:
            return "—"
        return f"{precise_utc(found.resolved_at)}, {found.resolved_by}: {found.note}"

    def _resolution(self, occurrence: Occurrence) -> OccurrenceResolution | None:
        if not hasattr(occurrence, "dlq_resolution"):  # outside a list page
            occurrence.dlq_resolution = current_resolution(  # type: ignore[attr-defined]
                occurrence, resolution_history(occurrence)
            )
        return occurrence.dlq_resolution  # type: ignore[attr-defined]

    @admin.display(description="late by")
    def lateness(self, occurrence: Occurrence) -> str:
        """enqueued_at - scheduled_for and first start - scheduled_for: where a late fire lost its time."""
        parts = []
        if occurrence.enqueued_at is not None:
            parts.append(f"enqueued {seconds_text(occurrence.enqueued_at - occurrence.scheduled_for)}")
        span = self._span(occurrence)
        if span is not None:
            parts.append(f"started {seconds_text(span.first_started - occurrence.scheduled_for)}")
        return format_html_join(mark_safe("<br>"), "{}", ((part,) for part in parts)) if parts else "—"

    @admin.display(description="duration")
    def duration(self, occurrence: Occurrence) -> str:
        """The last attempt's run time; an unfinished one says so."""
        span = self._span(occurrence)
        if span is None:
            return "—"
        if span.last_finished is None:
            return "running" if occurrence.state == OccurrenceState.RUNNING else "unfinished"
        return seconds_text(span.last_finished - span.last_started).lstrip("+")

    def _span(self, occurrence: Occurrence) -> AttemptSpan | None:
        if not hasattr(occurrence, "attempt_span"):  # outside a list page
            self.annotate_page(None, [occurrence])
        return occurrence.attempt_span  # type: ignore[attr-defined]

    @admin.display(description="origin")
    def origin(self, occurrence: Occurrence) -> str:
        flags = [
            "manual trigger" if occurrence.manual else "",
            "forced (backfill, replay, re-run or manual: runs even after a schedule change)"
            if occurrence.forced
            else "",
            "kept through a schedule change" if occurrence.kept else "",
            "throttled (waited for max_fires_per_second)" if occurrence.throttled else "",
        ]
        return "; ".join(flag for flag in flags if flag) or "the schedule's rhythm"

    available_at_utc = utc_column("available_at", "available at")
    lease_expires_at_utc = utc_column("lease_expires_at", "lease expires at")
    enqueued_at_utc = utc_column("enqueued_at", "enqueued at")
    finished_at_utc = utc_column("finished_at", "finished at")
    created_at_utc = utc_column("created_at", "created at")
    # -- the timeline --

    def render_change_form(self, request: HttpRequest, context: dict, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(timeline_context(obj, highlight=None))
            context.update(self.dead_letter_context(request, obj, self._resolution(obj)))
            context.update(self.rerun_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)


def timeline_context(occurrence: Occurrence, *, highlight: int | None) -> dict[str, Any]:
    """The why box and the timeline of one occurrence, for its page and for its attempts' pages."""
    attempts = list(
        Attempt.objects.filter(occurrence_id=occurrence.occurrence_id, scheduled_for=occurrence.scheduled_for).order_by(
            "generation"
        )
    )
    definition = (
        ScheduleVersion.objects.filter(schedule_id=occurrence.schedule_id, version=occurrence.schedule_version)
        .values_list("definition", flat=True)
        .first()
    )
    now = db_now()
    resolutions = resolution_history(occurrence)
    judged = verdict(
        occurrence, attempts, definition=definition, now=now, resolution=current_resolution(occurrence, resolutions)
    )
    events = occurrence_timeline(
        occurrence, attempts, definition=definition, now=now, resolutions=resolutions, reruns=rerun_history(occurrence)
    )
    attempt_urls = {
        attempt.generation: reverse("admin:dispatch_attempt_change", args=[attempt.pk]) for attempt in attempts
    }
    return {
        "verdict": judged,
        "verdict_links": _occurrence_links(judged.headline),
        "timeline": [
            {
                "at": precise_utc(event.at) if event.at else "—",
                "label": event.label,
                "detail": event.detail,
                "tone": event.tone,
                "attempt_url": attempt_urls.get(event.attempt) if event.attempt else None,
                "highlight": highlight is not None and event.attempt == highlight,
            }
            for event in events
        ],
        "version_rule": definition,
        "schedule_occurrences_url": reverse("admin:dispatch_occurrence_changelist")
        + f"?schedule={occurrence.schedule_id}",
    }


def _occurrence_links(text: str) -> list[dict[str, str]]:
    """Occurrences a reason names (the one an overlap skip waited for), as links."""
    return [
        {"id": found, "url": reverse("admin:dispatch_occurrence_change", args=[found])}
        for found in occurrence_ids_in(text)
    ]
