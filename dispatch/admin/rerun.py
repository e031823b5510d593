"""Run a missed or overlap-skipped occurrence again, under its own id, from its page or for many from the list
(dispatch.rerun.rerun_occurrence). Shown for confirmation first, with the note it records, as replay and resolve are
(dispatch/admin/dlq.py), and logged under Recent actions and on the occurrence's timeline."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from core.clock import db_now
from dispatch.admin.common import label_rows, labels_of, precise_utc
from dispatch.admin.dlq import DeadLetterAdmin, Pending, each_of, report_refusals
from dispatch.dlq import NOTE_MAX_LENGTH
from dispatch.models import Occurrence
from dispatch.rerun import RERUNNABLE_STATES, RerunRefused, refusal_of, rerun_occurrence
from scheduler_project.console import log_changes, operator_actor


class RerunForm(forms.Form):
    """Why this fire should run after all: kept with the re-run and shown on the occurrence's timeline."""

    note = forms.CharField(
        label="Note (why it should run now)",
        max_length=NOTE_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )


class RerunAdmin(DeadLetterAdmin):
    """The operator's third transition beside replay and resolve, on the same terms: dispatch.change_occurrence (the
    Operator group, not the Read-only operator group: tenants/access.py), on the occurrences the operator's tenants
    own (get_queryset, through DeadLetterAdmin's page helpers)."""

    def has_rerun_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dispatch.change_occurrence")

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/rerun/", wrap(self.rerun_view), name="dispatch_occurrence_rerun"),
            *super().get_urls(),
        ]

    def rerun_context(self, request: HttpRequest, occurrence: Occurrence) -> dict[str, Any]:
        """The change page's link: offered on a missed or skipped fire whose schedule can still run it."""
        schedule, _ = labels_of(occurrence)
        refusal = refusal_of(occurrence.state, schedule.state if schedule else None)
        return {
            "can_rerun": not refusal and self.has_rerun_permission(request),
            "rerun_url": reverse("admin:dispatch_occurrence_rerun", args=[occurrence.pk]),
        }

    def rerun_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what a re-run does, and the note; POST: dispatch.rerun.rerun_occurrence."""
        occurrence = self._own(request, object_id, self.has_rerun_permission(request))
        if isinstance(occurrence, HttpResponse):
            return occurrence
        form = RerunForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            note = form.cleaned_data["note"]
            try:
                rerun_occurrence(occurrence.occurrence_id, note=note, actor=operator_actor(request), now=db_now())
            except RerunRefused as exc:
                messages.error(request, f"Not run: {exc}")
            else:
                log_changes(request, [(occurrence, f"Run again under the same id (was {occurrence.state}): {note}")])
                messages.success(
                    request,
                    f"Occurrence {occurrence.pk} is scheduled again, under the same id (it was {occurrence.state}).",
                )
            return HttpResponseRedirect(reverse("admin:dispatch_occurrence_change", args=[occurrence.pk]))
        schedule, _ = labels_of(occurrence)
        return self._page(
            request,
            "admin/dispatch/occurrence/rerun_confirmation.html",
            occurrence,
            title=f"Run occurrence {occurrence.pk} again?",
            form=form,
            refusal=refusal_of(occurrence.state, schedule.state if schedule else None),
        )

    @admin.action(description="Run selected missed or skipped occurrences again (same ids)…", permissions=["rerun"])
    def rerun_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Shows what will run again and takes the note first; re-runs once confirmed with a note."""
        selected = self._selection(request, queryset)
        if selected is None:
            return None
        form = RerunForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if not form.is_valid():
            return self._rerun_confirmation(request, selected, form)
        note, actor, now = form.cleaned_data["note"], operator_actor(request), db_now()
        done, refused = each_of(
            selected, lambda o: rerun_occurrence(o.occurrence_id, note=note, actor=actor, now=now), RerunRefused
        )
        log_changes(
            request, [(o, f"Run again under the same id by a bulk action (was {o.state}): {note}") for o in done]
        )
        if done or not refused:
            messages.success(request, f"Scheduled {len(done)} occurrence(s) again under their own ids.")
        report_refusals(request, "Not run", refused)
        return None

    def _rerun_confirmation(
        self, request: HttpRequest, selected: list[Occurrence], form: RerunForm
    ) -> TemplateResponse:
        """What the action will do, each row with why it will be refused if it will be (by its state and its
        schedule's; the overlap rule is asked at the re-run itself); Confirm posts the same ids back."""
        label_rows(selected)
        pending = []
        for occurrence in selected:
            schedule, tenant = labels_of(occurrence)
            pending.append(
                Pending(
                    occurrence,
                    tenant or f"tenant {occurrence.tenant_id} (deleted)",
                    schedule.name if schedule else f"schedule {occurrence.schedule_id} (deleted)",
                    precise_utc(occurrence.scheduled_for),
                    refusal_of(occurrence.state, schedule.state if schedule else None),
                )
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Run {len(selected)} occurrence{'s' if len(selected) != 1 else ''} again?",
            "pending": pending,
            "acting": sum(1 for p in pending if not p.refusal),
            "rerunnable": ", ".join(RERUNNABLE_STATES),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/dispatch/occurrence/rerun_bulk_confirmation.html", context)
