"""The schedule admin's status columns: the schedule in words, its state, last run, next fire and cursor, shown on
the list (for the page's rows, with one query) and on the change page."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.choices import ScheduleState
from core.clock import db_now
from schedules.admin.formatting import describe_schedule, format_local, format_utc
from schedules.admin.labels import LIST_CHIPS, label_chips
from schedules.admin.listing import RunStatus, duration_text, run_statuses
from schedules.models import Schedule


class ScheduleColumnsMixin:
    """List and read-only columns of ScheduleAdmin; `annotate_page` is PageChangeList's hook for the page's rows."""

    def annotate_page(self, request: HttpRequest, schedules: list[Schedule]) -> None:
        """Last run, next fire and cursor lag of the page's rows: one query, on the database clock."""
        statuses = run_statuses(schedules, db_now())
        for schedule in schedules:
            schedule.run_status = statuses[schedule.pk]  # type: ignore[attr-defined]

    def _status(self, schedule: Schedule) -> RunStatus:
        status = getattr(schedule, "run_status", None)
        if status is None:  # the change page: one schedule, not a page of them
            status = run_statuses([schedule], db_now())[schedule.pk]
            schedule.run_status = status  # type: ignore[attr-defined]
        return status

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant_slug(self, schedule: Schedule) -> str:
        # Sorted as the list is by default (tenant id, then name), an order an index on the tenant can serve.
        return schedule.tenant.slug

    @admin.display(description="labels")
    def label_list(self, schedule: Schedule) -> SafeString | str:
        """The list's column: a few chips, the rest counted."""
        return label_chips(schedule.labels, limit=LIST_CHIPS)

    @admin.display(description="labels")
    def label_set(self, schedule: Schedule) -> SafeString | str:
        """A read-only schedule page's: every label."""
        return label_chips(schedule.labels)

    @admin.display(description="schedule")
    def schedule_text(self, schedule: Schedule) -> str:
        return describe_schedule(schedule)

    @admin.display(description="state", ordering="state")
    def state_text(self, schedule: Schedule) -> str:
        status = self._status(schedule)
        return format_html(
            '<span class="sched-state sched-state-{}">{}</span>',
            status.state_key(schedule),
            status.state_text(schedule),
        )

    @admin.display(description="last run")
    def last_run(self, schedule: Schedule) -> SafeString | str:
        run = self._status(schedule).last_run
        if run is None:
            return "—"
        url = reverse("admin:dispatch_occurrence_change", args=[run.occurrence_id])
        return format_html(
            '<a href="{}" title="{}">{}</a> <span class="sched-state sched-state-{}">{}</span>{}',
            url,
            run.reason,
            format_utc(run.scheduled_for),
            run.state,
            run.state,
            " (manual)" if run.manual else "",
        )

    @admin.display(description="next fire", ordering="cursor__next_run_at")
    def next_fire(self, schedule: Schedule) -> SafeString | str:
        """From the time rules after now; a warning when the cursor trails now (fires due, not materialized)."""
        status = self._status(schedule)
        warning = ""
        if status.cursor_behind is not None:
            warning = format_html(
                '<br><span class="cursor-behind" title="{}">&#9888; cursor {} behind</span>',
                f"The materializer's cursor is at {format_utc(schedule.next_run_at)}: fires already due have not "
                "been materialized. Is the materializer running?",
                duration_text(status.cursor_behind),
            )
        if status.rule_error:
            return format_html("the rule cannot be evaluated: {}{}", status.rule_error, warning)
        if status.next_fire is None:
            if schedule.state == ScheduleState.ACTIVE:
                return format_html("no fire after now{}", warning)
            return f"— ({schedule.get_state_display().lower()})"
        if schedule.timezone == "UTC":
            return format_html("{}{}", format_utc(status.next_fire), warning)
        return format_html(
            "{}<br><small>{}</small>{}",
            format_local(status.next_fire, schedule.timezone),
            format_utc(status.next_fire),
            warning,
        )

    @admin.display(description="materializer cursor")
    def materializer_cursor(self, schedule: Schedule) -> str:
        if schedule.next_run_at is None:
            return "— (nothing to materialize)"
        behind = self._status(schedule).cursor_behind
        if behind is not None:
            return format_html(
                '{}: <span class="cursor-behind">&#9888; {} behind now</span>. Fires already due have not been '
                "materialized: is the materializer running?",
                format_utc(schedule.next_run_at),
                duration_text(behind),
            )
        return (
            f"{format_utc(schedule.next_run_at)}: the next fire not yet materialized. It runs up to the horizon "
            "ahead of the next fire; it trails now only when the materializer is behind."
        )

    @admin.display(description="created at")
    def created(self, schedule: Schedule) -> str:
        return format_utc(schedule.created_at)

    @admin.display(description="updated at")
    def updated(self, schedule: Schedule) -> str:
        return format_utc(schedule.updated_at)
