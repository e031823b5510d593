"""List filters of the data plane that never scan the big tables: choices from code, ids and ranges on indexes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from core.choices import Lane
from core.clock import db_now
from dispatch.admin.common import precise_utc
from dispatch.dlq import in_dead_letter_queue, resolved_dead
from dispatch.queues import ALL_QUEUES
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS, STUCK_PAGE, stuck_pages
from scheduler_project.console import EARLIEST_INSTANT, parse_instant_text, parse_uuid
from schedules.models import Schedule
from tenants.access import scope_list, scoped, tenant_scope


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


class ScheduleIdFilter(admin.SimpleListFilter):
    """One schedule's occurrences (?schedule=<id>), newest first from its (schedule_id, scheduled_for) index; the
    schedule's change page links here."""

    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        # Only the schedule asked for: listing 20 M schedules as choices is not a filter.
        value = self.value() or ""
        wanted = parse_uuid(value)
        if wanted is None:
            if value:
                messages.error(request, f"{value[:40]!r} is not a schedule id (a UUID): no occurrence matches.")
            return []
        # Only a schedule the operator may see is named (tenants/access.py); another's id shows as the id alone.
        name = scoped(request, Schedule.objects.filter(pk=wanted)).values_list("name", flat=True).first()
        return [(str(wanted), name or str(wanted))]

    def has_output(self) -> bool:
        # Shown (and applied: the changelist applies only the filters it shows) whenever a value was given.
        return bool(self.value())

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        wanted = parse_uuid(value)
        return queryset.none() if wanted is None else queryset.filter(schedule_id=wanted)


# Without a schedule to narrow it, the newest-first list covers this much before its upper bound (now): "why didn't
# 09:00 run?" is asked soon after 09:00. There is no b-tree on scheduled_for alone (a BRIN: the hot insert stays
# cheap), so the sort reads every row of the range: at 200 M fires a day ~8 M rows an hour, where the whole table
# is days of 200 M. One schedule's occurrences (?schedule=) come from its own index over any range.
DEFAULT_WINDOW = timedelta(hours=1)
# Where ScheduledRangeFilter leaves its bounds and clock on the request, for the filters that need the same range.
RANGE_ON_REQUEST = "occurrence_range"
RELATIVE_PATTERN = re.compile(r"^now-(\d{1,6})([mhd])$")
RELATIVE_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
DEFAULT_PRESET = "now-1h"
RANGE_PRESETS = (
    ("now-15m", "Last 15 minutes"),
    (DEFAULT_PRESET, "Last hour"),
    ("now-24h", "Last 24 hours"),
    ("now-7d", "Last 7 days"),
)


class ScheduledRangeFilter(admin.ListFilter):
    """A range [scheduled_after, scheduled_before) on scheduled_for, the partition key (the API's parameter names).

    Values: ISO 8601 (an offset or Z; without one, UTC), a date, or relative to now ("now-24h", "now-30m",
    "now-7d"). A bad value is reported and ignored, never a 500. Without a schedule filter the lower bound is never
    open: it defaults to DEFAULT_WINDOW before the upper bound, so the sort reads recent rows only.
    """

    title = "scheduled for (UTC)"
    template = "admin/dispatch/occurrence/range_filter.html"
    parameters = ("scheduled_after", "scheduled_before")

    def __init__(self, request: HttpRequest, params: dict, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        self.now = db_now()
        self.values: dict[str, datetime] = {}
        errors = []
        for name in self.parameters:
            if name not in params:
                continue
            raw = params.pop(name)[-1]
            self.used_parameters[name] = raw
            try:
                self.values[name] = self._parse(raw)
            except ValueError as exc:
                errors.append(f"{name}: {exc}")
        after, before = self.values.get("scheduled_after"), self.values.get("scheduled_before")
        if after is not None and before is not None and after >= before:
            errors.append("scheduled_after must be earlier than scheduled_before")
        if errors:
            self.values = {}
            messages.error(request, f"Range ignored ({'; '.join(errors)}); showing the default range instead.")
        # One schedule (its own index) or the dead-letter queue (the watch's dead rows) drives the read over any time.
        self.by_schedule = any(parse_uuid(request.GET.get(name, "")) is not None for name in ("schedule", "q"))
        self.narrowed = self.by_schedule or request.GET.get(DeadLetterFilter.parameter_name) in DeadLetterFilter.VALUES
        setattr(request, RANGE_ON_REQUEST, (*self.bounds(), self.now))

    def _parse(self, raw: str) -> datetime:
        relative = RELATIVE_PATTERN.match(raw.strip())
        if not relative:
            return parse_instant_text(raw)
        try:
            value = self.now - timedelta(**{RELATIVE_UNITS[relative.group(2)]: int(relative.group(1))})
        except OverflowError:
            value = datetime.min.replace(tzinfo=UTC)
        if value < EARLIEST_INSTANT:
            raise ValueError(f"{raw[:20]!r} reaches back before {EARLIEST_INSTANT.year}.")
        return value

    def bounds(self) -> tuple[datetime | None, datetime | None]:
        after, before = self.values.get("scheduled_after"), self.values.get("scheduled_before")
        if after is None and not self.narrowed:
            after = (before or self.now) - DEFAULT_WINDOW
        return after, before

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return list(self.parameters)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        after, before = self.bounds()
        if after is not None:
            queryset = queryset.filter(scheduled_for__gte=after)
        if before is not None:
            queryset = queryset.filter(scheduled_for__lt=before)
        return queryset

    def choices(self, changelist: Any):
        raw_after = self.used_parameters.get("scheduled_after") if self.values else None
        explicit = bool(self.values)
        for token, label in RANGE_PRESETS:
            yield {
                "selected": raw_after == token or (not explicit and not self.narrowed and token == DEFAULT_PRESET),
                "query_string": changelist.get_query_string({"scheduled_after": token}, remove=["scheduled_before"]),
                "display": label,
            }
        if self.narrowed:
            yield {
                "selected": not explicit,
                "query_string": changelist.get_query_string(remove=list(self.parameters)),
                "display": "Any time (this schedule)" if self.by_schedule else "Any time (the dead-letter queue)",
            }
        after, before = self.bounds()
        yield {
            "form": True,
            "after": self.used_parameters.get("scheduled_after", ""),
            "before": self.used_parameters.get("scheduled_before", ""),
            "hidden": [(key, value) for key, value in changelist.params.items() if key not in self.parameters],
            "since": precise_utc(after) if after else "",
            "until": precise_utc(before) if before else "",
            "narrowed": self.narrowed,
        }


class DeadLetterFilter(admin.SimpleListFilter):
    """The dead-letter queue (dispatch/dlq.py): dead occurrences no operator resolved, over any time unless a range
    is given (the watch's dead rows drive the read). The dashboard's DLQ tile counts exactly this list; resolved ones
    are listed apart, where a replay still reaches them."""

    title = "dead-letter queue"
    parameter_name = "dlq"
    VALUES = ("1", "resolved")

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("1", "In the DLQ (dead, not resolved)"), ("resolved", "Resolved (dead, set aside)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "1":
            return in_dead_letter_queue(queryset)
        if self.value() == "resolved":
            return resolved_dead(queryset)
        return queryset  # any other value is not a choice: ignored, as the admin ignores unknown choices


# A schedule's list may cover any time; stuck occurrences are looked for over this much of it (the dashboard's tile
# counts the same day), since the stuck scan reads every non-terminal row of its range, not one schedule's index.
STUCK_WINDOW_WITHOUT_RANGE = timedelta(days=1)


class StuckFilter(admin.SimpleListFilter):
    """Occurrences stuck now, as dispatch.stuck defines them (the definition reconcile reports and `replay --stuck`
    re-drives), within the list's range: the dashboard's "stuck" tile links here.

    The stuck scan walks the range in (scheduled_for, occurrence_id) order on the day partitions, like the list
    itself; its first page (the oldest STUCK_PAGE) is listed, and more than that is said, not read.
    """

    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("1", f"Stuck (> {DEFAULT_STUCK_AFTER_SECONDS // 60} min past due)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() != "1":
            return queryset  # any other value is not a choice: ignored, as the admin ignores unknown choices
        after, before, now = getattr(request, RANGE_ON_REQUEST, (None, None, db_now()))
        until = before or now
        if after is None:
            after = until - STUCK_WINDOW_WITHOUT_RANGE
            messages.info(request, "Stuck occurrences are looked for in the 24 hours before the end of the range.")
        tenant = request.GET.get("tenant__id__exact", "")
        page = next(
            stuck_pages(
                since=after,
                until=until,
                now=now,
                stuck_after_seconds=DEFAULT_STUCK_AFTER_SECONDS,
                tenant_id=int(tenant) if tenant.isascii() and tenant.isdigit() and len(tenant) < 19 else None,
                tenant_ids=scope_list(tenant_scope(request)),
            ),
            [],
        )
        if len(page) >= STUCK_PAGE:
            messages.warning(
                request, f"More than {STUCK_PAGE} stuck occurrences in this range: the oldest {STUCK_PAGE} are listed."
            )
        # The range filter already bounds scheduled_for (and so the partitions read); the ids pick the stuck rows.
        return queryset.filter(occurrence_id__in=[row.occurrence_id for row in page])
