"""The schedule ModelAdmin: every tenant's schedules for operators, changed only through schedules.services."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from dispatch.handlers import registered_names
from scheduler_project.console import EstimatedCountPaginator, SafeActionSelectionMixin, TenantFilter, parse_uuid
from schedules.admin.details import schedule_details
from schedules.admin.formatting import describe_schedule, format_local, format_utc
from schedules.admin.forms import ScheduleChangeForm
from schedules.errors import ScheduleInvalid, StateConflict
from schedules.models import Schedule, ScheduleState
from schedules.services import (
    CancelResult,
    cancel_schedule,
    pause_schedule,
    resume_schedule,
    update_schedule,
)

# Named after the package, as before it was split into modules, so log lines keep their logger name.
logger = logging.getLogger("schedules.admin")

# Every schedule in a bulk action is a locked transaction of its own; "select all" over 20 M rows must not
# turn one click into hours of row locks, so larger selections are refused with a hint to filter first.
MAX_BULK_ACTION_SCHEDULES = 1000
# Names quoted per skip reason in a message; the rest are counted.
MAX_NAMES_IN_MESSAGE = 5


def operator_actor(request: HttpRequest) -> str:
    return f"operator:{request.user.get_username()}"


# --- filters --------------------------------------------------------------------------------------------


class HandlerFilter(admin.SimpleListFilter):
    """Handlers from the registry; the default filter would run SELECT DISTINCT over every schedule."""

    title = "handler"
    parameter_name = "handler"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(name, name) for name in registered_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(handler=self.value()) if self.value() else queryset


# --- the admin --------------------------------------------------------------------------------------------


@admin.register(Schedule)
class ScheduleAdmin(SafeActionSelectionMixin, admin.ModelAdmin):
    """Schedules of every tenant, for operators.

    Adding is disabled: a schedule is tenant data, created by the tenant through the API, where the quota is
    checked under a tenant lock, an Idempotency-Key makes retries safe and the tenant's own actor is recorded.
    An operator creating work on a tenant's behalf would bypass that contract. Hard delete is disabled too:
    cancel (an action here) is the soft delete that keeps the version history the reconciler relies on.
    Every change goes through schedules.services, so each one is a new, attributed version.
    """

    form = ScheduleChangeForm
    list_display = (
        "tenant",
        "name",
        "schedule_text",
        "state",
        "next_run_local",
        "next_run_utc",
        "version",
        "handler",
        "lane",
    )
    list_display_links = ("name",)
    list_filter = ("state", TenantFilter, "kind", "lane", HandlerFilter, "misfire_policy")
    list_select_related = ("tenant",)
    search_fields = ("name", "=handler", "=tenant__slug")
    search_help_text = "Name (contains), handler or tenant slug (exact), or a schedule id (UUID)."
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facet counts would COUNT(*) every filter choice over 20 M rows on each page view.
    show_facets = admin.ShowFacets.NEVER
    actions = ("pause_schedules", "resume_schedules", "cancel_schedules")
    readonly_fields = (
        "id",
        "tenant",
        "state",
        "version",
        "schedule_text",
        "next_run_local",
        "next_run_utc",
        "shard",
        "created_by",
        "created",
        "updated",
        "idempotency_key",
    )
    change_form_template = "admin/schedules/schedule/change_form.html"

    # -- permissions --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A canceled schedule is final (the services refuse changes); its page is shown read-only.
        if obj is not None and obj.state == ScheduleState.CANCELED:
            return False
        return super().has_change_permission(request, obj)

    # -- list --

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Payloads may be 64 KiB each and no list column shows them; the change form loads it on demand.
        return super().get_queryset(request).defer("payload", "request_fingerprint")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        """A UUID is looked up by primary key alone, so pasting an id never scans the table for names."""
        wanted = parse_uuid(search_term)
        if wanted is not None:
            return queryset.filter(pk=wanted), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="schedule")
    def schedule_text(self, schedule: Schedule) -> str:
        return describe_schedule(schedule)

    @admin.display(description="next run (local)", ordering="next_run_at")
    def next_run_local(self, schedule: Schedule) -> str:
        return format_local(schedule.next_run_at, schedule.timezone)

    @admin.display(description="next run (UTC)", ordering="next_run_at")
    def next_run_utc(self, schedule: Schedule) -> str:
        return format_utc(schedule.next_run_at)

    @admin.display(description="created at")
    def created(self, schedule: Schedule) -> str:
        return format_utc(schedule.created_at)

    @admin.display(description="updated at")
    def updated(self, schedule: Schedule) -> str:
        return format_utc(schedule.updated_at)

    # -- change form --

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None):
        definition = ["name", "kind", "cron", "run_at", "timezone", "handler", "payload"]
        note = "Read-only: a canceled schedule is final."
        if self.has_change_permission(request, obj):
            definition.insert(0, "seen_version")
            note = (
                "Saving writes a new version through the schedule service: future fires follow it and "
                "unclaimed occurrences of older versions are withdrawn."
            )
        return (
            (
                "Schedule",
                {
                    "fields": (
                        "id",
                        "tenant",
                        "state",
                        "version",
                        "schedule_text",
                        ("next_run_local", "next_run_utc"),
                        "shard",
                    )
                },
            ),
            (
                "Definition",
                {
                    "fields": definition,
                    "description": note,
                },
            ),
            (
                "Delivery",
                {
                    "fields": (
                        "lane",
                        "flexible_window_seconds",
                        "priority",
                        "misfire_policy",
                        "max_lateness_seconds",
                        "catchup_limit",
                        "overlap_policy",
                        "max_attempts",
                    )
                },
            ),
            (
                "Provenance",
                {"fields": ("created_by", "created", "updated", "idempotency_key"), "classes": ("collapse",)},
            ),
        )

    def save_model(self, request: HttpRequest, obj: Schedule, form: ScheduleChangeForm, change: bool) -> None:
        """Never a raw save: the form's changes become a new version through update_schedule."""
        if not change:
            raise PermissionDenied("Schedules are created by tenants through the API.")
        changes = form.definition_changes()
        if not changes:
            messages.info(request, f"No definition change: {obj.name} stays at version {obj.version}.")
            return
        try:
            updated = update_schedule(obj, changes, actor=operator_actor(request))
        except (StateConflict, ScheduleInvalid) as exc:
            # Lost a race with a cancel or another update after the form was validated.
            request._schedule_save_failed = True  # type: ignore[attr-defined]  # read by response_change
            messages.error(request, f"Not saved: {getattr(exc, 'message', None) or exc}")
            return
        for field in Schedule._meta.concrete_fields:
            setattr(obj, field.attname, getattr(updated, field.attname))
        messages.info(
            request, f"Saved as version {updated.version} ({', '.join(sorted(changes))} changed) by the service."
        )

    def log_change(self, request: HttpRequest, obj: Schedule, message: Any):
        if getattr(request, "_schedule_save_failed", False):
            return None
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: Schedule) -> HttpResponse:
        if getattr(request, "_schedule_save_failed", False):
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)

    def render_change_form(self, request: HttpRequest, context: dict, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            # Read the stored row: on a rejected POST `obj` carries the operator's unsaved input.
            stored = Schedule.objects.defer("payload").select_related("tenant").get(pk=obj.pk)
            context.update(schedule_details(stored))
        return super().render_change_form(request, context, add, change, form_url, obj)

    # -- bulk actions --

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._apply(request, queryset, pause_schedule, "paused", ScheduleState.PAUSED)

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._apply(request, queryset, resume_schedule, "resumed", ScheduleState.ACTIVE)

    @admin.action(description="Cancel selected schedules (final)", permissions=["change"])
    def cancel_schedules(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Cancel cannot be undone, so it asks for confirmation first, like Django's own delete action."""
        selected = self._selection(request, queryset)
        if selected is None:
            return None
        if request.POST.get("confirm") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Cancel schedules?",
                "opts": self.model._meta,
                "schedules": selected,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/schedules/schedule/cancel_confirmation.html", context)
        self._apply(request, selected, cancel_schedule, "canceled", ScheduleState.CANCELED)
        return None

    def _selection(self, request: HttpRequest, queryset: QuerySet) -> list[Schedule] | None:
        selected = list(
            queryset.select_related("tenant").order_by("tenant__slug", "name")[: MAX_BULK_ACTION_SCHEDULES + 1]
        )
        if len(selected) > MAX_BULK_ACTION_SCHEDULES:
            messages.error(
                request,
                f"Nothing done: bulk actions take at most {MAX_BULK_ACTION_SCHEDULES} schedules at a time. "
                "Narrow the selection with filters or search.",
            )
            return None
        return selected

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet | list[Schedule],
        verb: Callable[..., Schedule | CancelResult],
        past_tense: str,
        target_state: str,
    ) -> None:
        """Run the service verb on each schedule in its own transaction; report what was done and skipped."""
        selected = queryset if isinstance(queryset, list) else self._selection(request, queryset)
        if selected is None:
            return
        actor = operator_actor(request)
        done = 0
        in_flight = 0
        skipped: dict[str, list[str]] = defaultdict(list)
        for schedule in selected:
            try:
                result = verb(schedule, actor=actor)
            except StateConflict as exc:
                skipped[exc.message].append(schedule.name)
                continue
            if isinstance(result, CancelResult):
                in_flight += len(result.in_flight)
                result = result.schedule
            # The verbs are idempotent: an unchanged version means the schedule was already there.
            if result.version == schedule.version:
                skipped[f"already {target_state}"].append(schedule.name)
            else:
                done += 1
        logger.info(
            "%s %s %d schedules from the console, skipped %d",
            actor,
            past_tense,
            done,
            sum(len(names) for names in skipped.values()),
            extra={"action": f"console_{past_tense}"},
        )
        if done or not skipped:
            messages.success(request, f"{past_tense.capitalize()} {done} {_schedules(done)}.")
        for reason, names in skipped.items():
            messages.warning(request, f"Skipped {len(names)} {_schedules(len(names))} ({reason}): {_names(names)}.")
        if in_flight:
            messages.warning(
                request,
                f"{in_flight} occurrence(s) were already running and may still finish; see Dispatch > Occurrences.",
            )


def _schedules(count: int) -> str:
    return "schedule" if count == 1 else "schedules"


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_IN_MESSAGE])
    if len(names) > MAX_NAMES_IN_MESSAGE:
        shown += f" and {len(names) - MAX_NAMES_IN_MESSAGE} more"
    return shown
