"""Operations on schedules from the console: run now, pause with a note, resume, cancel, backfill a range.

Each one calls its service (schedules.services, dispatch.backfill) and never writes a state itself. `perform` is
shared by the change page's buttons and the list's bulk actions, so both refuse and report the same way; each
change is an admin LogEntry (Recent actions, the schedule's history) besides the version the service writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from core.choices import ScheduleState
from dispatch.services import BackfillRefused, ReconcileInputError, backfill_schedule
from scheduler_project.console import operator_actor
from schedules.admin.formatting import format_utc
from schedules.admin.forms import BackfillForm, OperationForm, PauseForm
from schedules.admin.preview import preview_json
from schedules.api.serializers import utc_text
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import Schedule
from schedules.services import CancelResult, cancel_schedule, pause_schedule, resume_schedule, trigger_schedule

# A backfill from the console runs inside the web request; beyond this many fires `manage.py backfill` (its own
# process, its own cap) is the tool. The refusal says so.
CONSOLE_BACKFILL_MAX_FIRES = 10_000


@dataclass(frozen=True)
class Operation:
    verb: str
    button: str
    past: str
    target_state: str
    explain: str
    service: Callable[..., Any]
    takes_note: bool = True


OPERATIONS = {
    "trigger": Operation(
        verb="trigger",
        button="Run now",
        past="triggered",
        target_state="",
        explain="Fires the schedule once now, outside its rhythm, under its current version (a manual occurrence "
        "with its own id). Its cron fires are unchanged.",
        service=trigger_schedule,
        takes_note=False,
    ),
    "pause": Operation(
        verb="pause",
        button="Pause",
        past="paused",
        target_state=ScheduleState.PAUSED,
        explain="No fire happens until it is resumed, by hand or by itself at the instant given below. Fires already "
        "due keep their slot; later unclaimed ones are withdrawn; manual, backfilled and replayed occurrences still "
        "run.",
        service=pause_schedule,
    ),
    "resume": Operation(
        verb="resume",
        button="Resume",
        past="resumed",
        target_state=ScheduleState.ACTIVE,
        explain="Fires again from the next fire after now. Fires that fell in the pause are not caught up.",
        service=resume_schedule,
    ),
    "cancel": Operation(
        verb="cancel",
        button="Cancel schedule",
        past="canceled",
        target_state=ScheduleState.CANCELED,
        explain="Final: the schedule never fires again and cannot be resumed. Occurrences not yet claimed are "
        "withdrawn; running ones may still finish. The row and its history are kept.",
        service=cancel_schedule,
    ),
}


@dataclass(frozen=True)
class Outcome:
    schedule: Schedule
    done: bool
    skipped: str = ""  # why nothing was done
    occurrence_id: uuid.UUID | None = None
    in_flight: int = 0


def perform(
    verb: str,
    schedule: Schedule,
    *,
    actor: str,
    note: str = "",
    trigger_key: str | None = None,
    resume_at: datetime | None = None,
) -> Outcome:
    """Run one operation through its service; a refusal (a canceled schedule, say) is an Outcome, not an error. A
    pause's `resume_at` in the past raises ScheduleInvalid (a form error)."""
    operation = OPERATIONS[verb]
    try:
        if verb == "trigger":
            occurrence_id = trigger_schedule(schedule, actor=actor, trigger_key=trigger_key)
            return Outcome(schedule, True, occurrence_id=occurrence_id)
        if verb == "pause":
            result = pause_schedule(schedule, actor=actor, note=note, resume_at=resume_at)
        else:
            result = operation.service(schedule, actor=actor, note=note)
    except (StateConflict, QuotaExceeded) as exc:
        return Outcome(schedule, False, skipped=exc.message)
    in_flight = 0
    if isinstance(result, CancelResult):
        in_flight = len(result.in_flight)
        result = result.schedule
    # The verbs are idempotent: an unchanged version means there was nothing to do.
    if result.version == schedule.version:
        state = "already " + operation.target_state if result.state == operation.target_state else result.state
        return Outcome(result, False, skipped=state)
    return Outcome(result, True, in_flight=in_flight)


def log_text(verb: str, outcome: Outcome, note: str, *, bulk: bool) -> str:
    """The change message of a LogEntry: what was done, the version it made, the note."""
    how = "by a bulk action" if bulk else "from its page"
    if verb == "trigger":
        return f"Run now {how}: manual occurrence {outcome.occurrence_id}."
    text = f"{OPERATIONS[verb].past.capitalize()} {how} (version {outcome.schedule.version})."
    return f"{text} Note: {note}" if note else text


class ScheduleOperationsMixin:
    """The change page's operation views and the form's live preview, as URLs of the schedule admin."""

    admin_site: Any
    opts: Any

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("preview/", wrap(self.preview_view), name=f"{info}_preview"),
            path("<path:object_id>/operate/<str:verb>/", wrap(self.operation_view), name=f"{info}_operate"),
            path("<path:object_id>/backfill/", wrap(self.backfill_view), name=f"{info}_backfill"),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            return JsonResponse({"detail": "You may not view schedules."}, status=403)
        return preview_json(request)

    def _schedule_or_redirect(self, request: HttpRequest, object_id: str) -> Schedule | HttpResponse:
        schedule = self.get_object(request, object_id)  # type: ignore[attr-defined]
        if schedule is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        if not self.has_change_permission(request, schedule):  # type: ignore[attr-defined]
            if schedule.state == ScheduleState.CANCELED:
                messages.error(request, f"{schedule.name} is canceled: a canceled schedule is final.")
                return HttpResponseRedirect(_change_url(schedule))
            raise PermissionDenied
        return schedule

    def _page(self, request: HttpRequest, schedule: Schedule, template: str, **context: Any) -> TemplateResponse:
        return TemplateResponse(
            request,
            f"admin/schedules/schedule/{template}",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "original": schedule,
                "change_url": _change_url(schedule),
                **context,
            },
        )

    def operation_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """GET: what the operation does, with a note field; POST: do it through the service."""
        if verb not in OPERATIONS:
            messages.error(request, f"Unknown operation {verb[:40]!r}.")
            return HttpResponseRedirect(reverse("admin:schedules_schedule_changelist"))
        found = self._schedule_or_redirect(request, object_id)
        if isinstance(found, HttpResponse):
            return found
        schedule, operation = found, OPERATIONS[verb]
        form = (PauseForm if verb == "pause" else OperationForm)(request.POST if request.method == "POST" else None)
        if not operation.takes_note:
            del form.fields["note"]
        if request.method == "POST" and form.is_valid():
            note = form.cleaned_data.get("note", "")
            key = _trigger_key(request.POST.get("key", ""))
            try:
                outcome = perform(
                    verb,
                    schedule,
                    actor=operator_actor(request),
                    note=note,
                    trigger_key=key,
                    resume_at=form.cleaned_data.get("resume_at"),
                )
            except ScheduleInvalid as exc:
                for field, field_errors in exc.errors.items():
                    form.add_error(field if field in form.fields else None, field_errors)
            else:
                self._report(request, verb, outcome, note)
                return HttpResponseRedirect(_change_url(schedule))
        return self._page(
            request,
            schedule,
            "operation.html",
            title=f"{operation.button}: {schedule.name}",
            operation=operation,
            form=form,
            # Submitting the same page twice (a double click, a reload) meets the same manual occurrence.
            key=uuid.uuid4(),
        )

    def _report(self, request: HttpRequest, verb: str, outcome: Outcome, note: str) -> None:
        schedule = outcome.schedule
        if not outcome.done:
            messages.warning(request, f"Nothing done to {schedule.name}: {outcome.skipped}.")
            return
        self.log_change(request, schedule, log_text(verb, outcome, note, bulk=False))  # type: ignore[attr-defined]
        if verb == "trigger":
            url = reverse("admin:dispatch_occurrence_change", args=[outcome.occurrence_id])
            messages.success(
                request, format_html('Run now: occurrence <a href="{}">{}</a> is queued.', url, outcome.occurrence_id)
            )
            return
        text = f"{schedule.name} {OPERATIONS[verb].past} (version {schedule.version})."
        messages.success(request, f"{text} Note kept on the version: {note}" if note else text)
        if outcome.in_flight:
            messages.warning(request, f"{outcome.in_flight} occurrence(s) were already running and may still finish.")

    def backfill_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a since/until form; POST: create the range's missing fires through dispatch.backfill."""
        found = self._schedule_or_redirect(request, object_id)
        if isinstance(found, HttpResponse):
            return found
        schedule = found
        form = BackfillForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            since, until = form.cleaned_data["since"], form.cleaned_data["until"]
            try:
                result = backfill_schedule(schedule.pk, since=since, until=until, max_fires=CONSOLE_BACKFILL_MAX_FIRES)
            except (BackfillRefused, ReconcileInputError) as exc:
                messages.error(request, f"Backfill refused: {exc}")
            else:
                text = (
                    f"Backfilled {format_utc(since)} .. {format_utc(until)}: expected {result.expected}, "
                    f"created {result.created}, already present {result.already_present}."
                )
                self.log_change(request, schedule, text)  # type: ignore[attr-defined]
                messages.success(request, f"{schedule.name}: {text}")
                return HttpResponseRedirect(occurrences_url(schedule, since=since, until=until))
        return self._page(
            request,
            schedule,
            "backfill.html",
            title=f"Backfill: {schedule.name}",
            form=form,
            max_fires=CONSOLE_BACKFILL_MAX_FIRES,
        )


def _trigger_key(text: str) -> str | None:
    try:
        return f"console/{uuid.UUID(text)}"
    except (ValueError, AttributeError):
        return None


def _change_url(schedule: Schedule) -> str:
    return reverse("admin:schedules_schedule_change", args=[schedule.pk])


def occurrences_url(schedule: Schedule, *, since: datetime | None = None, until: datetime | None = None) -> str:
    """The occurrence list of one schedule (newest first), optionally of one range [since, until)."""
    query = {"schedule": str(schedule.pk)}
    if since is not None:
        query["scheduled_after"] = utc_text(since)
    if until is not None:
        query["scheduled_before"] = utc_text(until)
    return f"{reverse('admin:dispatch_occurrence_changelist')}?{urlencode(query)}"


__all__ = [
    "CONSOLE_BACKFILL_MAX_FIRES",
    "OPERATIONS",
    "Operation",
    "Outcome",
    "ScheduleOperationsMixin",
    "log_text",
    "occurrences_url",
    "operator_actor",
    "perform",
]
