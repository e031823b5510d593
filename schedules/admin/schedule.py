"""The schedule ModelAdmin: every tenant's schedules for operators, changed only through schedules.services."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from core.choices import ScheduleState
from dispatch.services import registered_names
from scheduler_project.console import (
    EstimatedCountPaginator,
    PageChangeList,
    SafeActionSelectionMixin,
    log_changes,
    parse_uuid,
)
from schedules.admin.columns import ScheduleColumnsMixin
from schedules.admin.creation import ADD_FIELDSETS, ScheduleAddForm, ScheduleCreationMixin
from schedules.admin.details import schedule_details, version_rows
from schedules.admin.forms import NOTE_MAX_LENGTH, NoteActionForm, ScheduleChangeForm
from schedules.admin.labels import SelectorFilter
from schedules.admin.operations import (
    OPERATIONS,
    Outcome,
    ScheduleOperationsMixin,
    log_text,
    occurrences_url,
    operator_actor,
    perform,
)
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import Schedule
from schedules.services import update_schedule
from tenants.access import scoped
from tenants.filters import TenantFilter

# Named after the package, as before it was split into modules, so log lines keep their logger name.
logger = logging.getLogger("schedules.admin")

# Every schedule in a bulk action is a locked transaction of its own; "select all" over 20 M rows must not
# turn one click into hours of row locks, so larger selections are refused with a hint to filter first.
MAX_BULK_ACTION_SCHEDULES = 1000
# Names quoted per skip reason in a message; the rest are counted.
MAX_NAMES_IN_MESSAGE = 5

__all__ = ["MAX_BULK_ACTION_SCHEDULES", "ScheduleAdmin", "operator_actor"]


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
class ScheduleAdmin(
    ScheduleCreationMixin, ScheduleOperationsMixin, ScheduleColumnsMixin, SafeActionSelectionMixin, admin.ModelAdmin
):
    """Schedules of the operator's tenants.

    Every write goes through schedules.services, so each one is a new, attributed version: a create (for a tenant
    the operator acts on, schedules/admin/creation.py) goes through create_schedule, with the tenant's quota and
    calendars checked as for the API; an edit through update_schedule. Hard delete is disabled: cancel (an action
    here) is the soft delete that keeps the version history the reconciler relies on.
    """

    form = ScheduleChangeForm
    action_form = NoteActionForm
    list_display = (
        "tenant_slug",
        "name",
        "label_list",
        "schedule_text",
        "state_text",
        "last_run",
        "next_fire",
        "version",
        "handler",
        "lane",
    )
    list_display_links = ("name",)
    list_filter = ("state", TenantFilter, SelectorFilter, "kind", "lane", HandlerFilter, "misfire_policy")
    list_select_related = ("tenant", "cursor")
    # Tenant first, so one busy tenant's schedules do not bury the others'; by tenant id rather than slug, an order
    # an index (tenant, name, id) can serve without sorting the table (a slug needs the join, then a sort).
    ordering = ("tenant_id", "name", "pk")
    search_fields = ("name", "=handler", "=tenant__slug", "^timezone")
    search_help_text = (
        "Name (contains), handler or tenant slug (exact), time zone (starts with: Europe/ or America/New_York), "
        "or a schedule id (UUID). Labels: the label selector beside the list."
    )
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facet counts would COUNT(*) every filter choice over 20 M rows on each page view.
    show_facets = admin.ShowFacets.NEVER
    actions = ("trigger_schedules", "pause_schedules", "resume_schedules", "cancel_schedules")
    readonly_fields = (
        "id",
        "tenant",
        "state_text",
        "version",
        "schedule_text",
        "next_fire",
        "materializer_cursor",
        "last_run",
        "shard",
        "created_by",
        "created",
        "updated",
        "idempotency_key",
        "label_set",
    )
    change_form_template = "admin/schedules/schedule/change_form.html"
    object_history_template = "admin/schedules/schedule/object_history.html"

    class Media:
        js = ("schedules/js/preview.js",)

    # -- permissions --

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
        return scoped(request, super().get_queryset(request)).defer("payload", "request_fingerprint")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type:
        return PageChangeList

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        """A UUID is looked up by primary key alone, so pasting an id never scans the table for names."""
        wanted = parse_uuid(search_term)
        if wanted is not None:
            return queryset.filter(pk=wanted), False
        return super().get_search_results(request, queryset, search_term)

    # -- change form --

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None):
        if obj is None:
            return ADD_FIELDSETS
        editable = self.has_change_permission(request, obj)
        definition = [
            *("name", "labels" if editable else "label_set", "kind", "cron", "run_at", "every_seconds", "anchor_at"),
            *("timezone", "dst_gap", "dst_repeat", "start_at", "end_at", "max_runs", "exclude_calendars", "handler"),
            "payload",
        ]
        note = "Read-only: a canceled schedule is final."
        if editable:
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
                        "state_text",
                        "version",
                        "schedule_text",
                        "next_fire",
                        "last_run",
                        "materializer_cursor",
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
                        "retry_base_seconds",
                        "retry_cap_seconds",
                    )
                },
            ),
            (
                "Provenance",
                {"fields": ("created_by", "created", "updated", "idempotency_key"), "classes": ("collapse",)},
            ),
        )

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: ScheduleChangeForm | ScheduleAddForm, change: bool
    ) -> None:
        """Never a raw save: a new schedule was created by create_schedule as its form validated, and a change
        becomes a new version through update_schedule."""
        if isinstance(form, ScheduleAddForm):
            self.saved_by_form(request, form)
            return
        if not change:
            raise PermissionDenied("A schedule is created by its add form, through the schedule service.")
        changes = form.definition_changes()
        if not changes:
            request._schedule_message = (  # type: ignore[attr-defined]  # read by response_change
                messages.INFO,
                f"No definition change: {obj.name} stays at version {obj.version}.",
            )
            return
        try:
            updated = update_schedule(obj, changes, actor=operator_actor(request))
        except (StateConflict, ScheduleInvalid, QuotaExceeded) as exc:
            # Lost a race with a cancel or another update after the form was validated, or a completed one-off
            # given a new run_at would exceed the tenant's schedule quota.
            request._schedule_save_failed = True  # type: ignore[attr-defined]  # read by response_change
            messages.error(request, f"Not saved: {getattr(exc, 'message', None) or exc}")
            return
        for field in Schedule._meta.concrete_fields:
            setattr(obj, field.attname, getattr(updated, field.attname))
        request._schedule_message = (  # type: ignore[attr-defined]
            messages.SUCCESS,
            f"{obj.name} saved as version {updated.version} ({', '.join(sorted(changes))} changed) by the service.",
        )

    def log_change(self, request: HttpRequest, obj: Schedule, message: Any):
        if getattr(request, "_schedule_save_failed", False):
            return None
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: Schedule) -> HttpResponse:
        """One message per save: what the service did, instead of Django's generic "changed successfully"."""
        if getattr(request, "_schedule_save_failed", False):
            return HttpResponseRedirect(request.path)
        message = getattr(request, "_schedule_message", None)
        if message is None:
            return super().response_change(request, obj)
        messages.add_message(request, *message)
        if "_continue" in request.POST:
            return HttpResponseRedirect(request.path)
        return self.response_post_save_change(request, obj)

    def render_change_form(self, request: HttpRequest, context: dict, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            # Read the stored row: the form never copies its input onto `obj`, but a save may have changed it.
            stored = Schedule.objects.defer("payload").select_related("tenant").get(pk=obj.pk)
            context.update(schedule_details(stored))
            context.update(
                operations=self._operation_links(request, stored),
                occurrences_url=occurrences_url(stored),
                # The tenant's calendars decide the fires of a schedule that names some.
                preview_url=f"{reverse('admin:schedules_schedule_preview')}?tenant={stored.tenant_id}",
            )
        elif add:
            # The tenant is the one chosen in the form: preview.js adds it to the URL as it changes.
            context["preview_url"] = reverse("admin:schedules_schedule_preview")
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _operation_links(self, request: HttpRequest, schedule: Schedule) -> list[dict[str, str]]:
        if not self.has_change_permission(request, schedule):
            return []
        verbs = ["trigger"]
        if schedule.state == ScheduleState.ACTIVE:
            verbs.append("pause")
        if schedule.state == ScheduleState.PAUSED:
            verbs.append("resume")
        links = [
            {
                "url": reverse("admin:schedules_schedule_operate", args=[schedule.pk, verb]),
                "label": OPERATIONS[verb].button,
            }
            for verb in verbs
        ]
        links.append({"url": reverse("admin:schedules_schedule_backfill", args=[schedule.pk]), "label": "Backfill"})
        if schedule.state != ScheduleState.COMPLETED:
            cancel = reverse("admin:schedules_schedule_operate", args=[schedule.pk, "cancel"])
            links.append({"url": cancel, "label": OPERATIONS["cancel"].button})
        return links

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict | None = None):
        """Django's history (LogEntry: console changes and bulk actions) with the versions every service wrote."""
        schedule = self.get_object(request, object_id)
        context = {**(extra_context or {})}
        if schedule is not None:
            context["version_rows"] = version_rows(schedule)
        return super().history_view(request, object_id, context)

    # -- bulk actions --

    @admin.action(description="Run selected schedules now (manual fire)", permissions=["change"])
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._apply(request, queryset, "trigger")

    @admin.action(description="Pause selected schedules (with the note)", permissions=["change"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._apply(request, queryset, "pause")

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._apply(request, queryset, "resume")

    @admin.action(description="Cancel selected schedules (final)", permissions=["change"])
    def cancel_schedules(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Cancel cannot be undone, so it asks for confirmation first, like Django's own delete action."""
        note = self._note(request)
        if note is None:
            return None
        selected = self._selection(request, queryset)
        if selected is None:
            return None
        if request.POST.get("confirm") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Cancel schedules?",
                "opts": self.model._meta,
                "schedules": selected,
                "note": note,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/schedules/schedule/cancel_confirmation.html", context)
        self._apply(request, selected, "cancel")
        return None

    def _note(self, request: HttpRequest) -> str | None:
        """The action bar's note; None (with a message) when it is too long to keep."""
        note = request.POST.get("note", "").strip()
        if len(note) > NOTE_MAX_LENGTH:
            messages.error(request, f"Nothing done: the note has {len(note)} characters, at most {NOTE_MAX_LENGTH}.")
            return None
        return note

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

    def _apply(self, request: HttpRequest, queryset: QuerySet | list[Schedule], verb: str) -> None:
        """Run the service verb on each schedule in its own transaction; report what was done and skipped, and log
        each change (Recent actions, the schedule's history)."""
        note = self._note(request)
        if note is None:
            return
        selected = queryset if isinstance(queryset, list) else self._selection(request, queryset)
        if selected is None:
            return
        actor = operator_actor(request)
        operation = OPERATIONS[verb]
        done: list[Outcome] = []
        skipped: dict[str, list[str]] = defaultdict(list)
        for schedule in selected:
            outcome = perform(verb, schedule, actor=actor, note=note if operation.takes_note else "")
            if outcome.done:
                done.append(outcome)
            else:
                skipped[outcome.skipped].append(schedule.name)
        log_changes(
            request,
            [
                (outcome.schedule, log_text(verb, outcome, note if operation.takes_note else "", bulk=True))
                for outcome in done
            ],
        )
        logger.info(
            "%s %s %d schedules from the console, skipped %d",
            actor,
            operation.past,
            len(done),
            sum(len(names) for names in skipped.values()),
            extra={"action": f"console_{operation.past}"},
        )
        if done or not skipped:
            messages.success(request, f"{operation.past.capitalize()} {len(done)} {_schedules(len(done))}.")
        for reason, names in skipped.items():
            messages.warning(request, f"Skipped {len(names)} {_schedules(len(names))} ({reason}): {_names(names)}.")
        in_flight = sum(outcome.in_flight for outcome in done)
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
