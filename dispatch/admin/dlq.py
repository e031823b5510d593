"""The dead-letter queue in the console: replay and resolve, for one occurrence from its page or for many from the
list. Each is shown for confirmation first (what will be done, to which occurrences, and which will be refused),
each goes through its service (dispatch.occurrences.replay_one, dispatch.dlq.resolve_dead_occurrence) and each is
logged under Recent actions and in the occurrence's history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from core.choices import ScheduleState
from core.clock import db_now
from dispatch.admin.common import label_rows, labels_of, precise_utc
from dispatch.dlq import NOTE_MAX_LENGTH, current_resolutions, resolve_dead_occurrence
from dispatch.errors import ReplayRefused, ResolveRefused
from dispatch.models import Occurrence, OccurrenceResolution, OccurrenceState
from dispatch.occurrences import replay_one
from scheduler_project.console import log_changes, operator_actor

# Occurrences per bulk action: each is a locked transaction of its own, and the confirmation page lists them all.
MAX_BULK = 1000
# Refusals named one by one in the message after a bulk action; the rest are counted.
REFUSALS_NAMED = 5


class ResolveForm(forms.Form):
    """Why nothing more is to be done: kept with the resolution and shown on the occurrence's timeline."""

    note = forms.CharField(
        label="Note (why nothing more is to be done)",
        max_length=NOTE_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )


@dataclass(frozen=True)
class Pending:
    """One selected occurrence on a confirmation page, with why the action will refuse it (empty: it will act)."""

    occurrence: Occurrence
    tenant: str
    schedule: str
    scheduled_for: str
    refusal: str


class DeadLetterAdmin(admin.ModelAdmin):
    """Replay and resolve for the occurrence admin. The model admin is read-only (no change permission by design);
    these are the operator's two transitions, allowed by dispatch.change_occurrence (the Operator group, not the
    Read-only operator group: tenants/access.py), on the occurrences the operator's tenants own (get_queryset)."""

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dispatch.change_occurrence")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dispatch.change_occurrence")

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/replay/", wrap(self.replay_view), name="dispatch_occurrence_replay"),
            path("<path:object_id>/resolve/", wrap(self.resolve_view), name="dispatch_occurrence_resolve"),
            *super().get_urls(),
        ]

    def dead_letter_context(
        self, request: HttpRequest, occurrence: Occurrence, resolution: OccurrenceResolution | None
    ) -> dict[str, Any]:
        """The change page's links: replay any dead occurrence, resolve one still in the DLQ."""
        dead = occurrence.state == OccurrenceState.DEAD
        return {
            "can_replay": dead and self.has_replay_permission(request),
            "replay_url": reverse("admin:dispatch_occurrence_replay", args=[occurrence.pk]),
            "can_resolve": dead and resolution is None and self.has_resolve_permission(request),
            "resolve_url": reverse("admin:dispatch_occurrence_resolve", args=[occurrence.pk]),
        }

    # -- one occurrence, from its page --

    def _own(self, request: HttpRequest, object_id: str, allowed: bool) -> Occurrence | HttpResponse:
        occurrence = self.get_object(request, object_id)
        if occurrence is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        if not allowed:
            raise PermissionDenied
        return occurrence

    def _page(self, request: HttpRequest, template: str, occurrence: Occurrence, **extra: Any) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": occurrence,
            "change_url": reverse("admin:dispatch_occurrence_change", args=[occurrence.pk]),
            **extra,
        }
        return TemplateResponse(request, template, context)

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what a replay does; POST: dispatch.occurrences.replay_one (same id, forced, released now)."""
        occurrence = self._own(request, object_id, self.has_replay_permission(request))
        if isinstance(occurrence, HttpResponse):
            return occurrence
        change_url = reverse("admin:dispatch_occurrence_change", args=[occurrence.pk])
        if request.method == "POST":
            try:
                replay_one(occurrence.occurrence_id)
            except ReplayRefused as exc:
                messages.error(request, f"Not replayed: {exc}")
            else:
                log_changes(request, [(occurrence, "Replayed from the dead-letter queue (same occurrence id).")])
                messages.success(
                    request, f"Occurrence {occurrence.pk} replayed: it is scheduled again, under the same id."
                )
            return HttpResponseRedirect(change_url)
        template = "admin/dispatch/occurrence/replay_confirmation.html"
        return self._page(request, template, occurrence, title=f"Replay occurrence {occurrence.pk}?")

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what resolving does, and the note; POST: dispatch.dlq.resolve_dead_occurrence."""
        occurrence = self._own(request, object_id, self.has_resolve_permission(request))
        if isinstance(occurrence, HttpResponse):
            return occurrence
        form = ResolveForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            note = form.cleaned_data["note"]
            try:
                resolve_dead_occurrence(
                    occurrence.occurrence_id, note=note, actor=operator_actor(request), now=db_now()
                )
            except ResolveRefused as exc:
                messages.error(request, f"Not resolved: {exc}")
            else:
                log_changes(request, [(occurrence, f"Resolved (out of the dead-letter queue): {note}")])
                messages.success(request, f"Occurrence {occurrence.pk} resolved: it left the dead-letter queue.")
            return HttpResponseRedirect(reverse("admin:dispatch_occurrence_change", args=[occurrence.pk]))
        template = "admin/dispatch/occurrence/resolve_confirmation.html"
        return self._page(request, template, occurrence, title=f"Resolve occurrence {occurrence.pk}?", form=form)

    # -- many occurrences, from the list --

    @admin.action(description="Replay selected dead occurrences (same ids)…", permissions=["replay"])
    def replay_dead(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Shows what will be replayed first, as Django's delete action does; replays once confirmed."""
        selected = self._selection(request, queryset)
        if selected is None:
            return None
        if request.POST.get("confirm") != "yes":
            return self._confirmation(request, "replay_dead", selected)
        replayed, refused = each_of(selected, lambda o: replay_one(o.occurrence_id), ReplayRefused)
        log_changes(request, [(o, "Replayed from the dead-letter queue by a bulk action (same id).") for o in replayed])
        if replayed or not refused:
            messages.success(request, f"Replayed {len(replayed)} dead occurrence(s) under their own ids.")
        report_refusals(request, "Not replayed", refused)
        return None

    @admin.action(description="Resolve selected dead occurrences (with a note)…", permissions=["resolve"])
    def resolve_dead(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Shows what will be resolved and takes the note first; resolves once confirmed with a note."""
        selected = self._selection(request, queryset)
        if selected is None:
            return None
        form = ResolveForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if not form.is_valid():
            return self._confirmation(request, "resolve_dead", selected, form=form)
        note, actor, now = form.cleaned_data["note"], operator_actor(request), db_now()
        resolved, refused = each_of(
            selected,
            lambda o: resolve_dead_occurrence(o.occurrence_id, note=note, actor=actor, now=now),
            ResolveRefused,
        )
        log_changes(
            request, [(o, f"Resolved (out of the dead-letter queue) by a bulk action: {note}") for o in resolved]
        )
        if resolved or not refused:
            messages.success(request, f"Resolved {len(resolved)} dead occurrence(s): they left the dead-letter queue.")
        report_refusals(request, "Not resolved", refused)
        return None

    def _selection(self, request: HttpRequest, queryset: QuerySet) -> list[Occurrence] | None:
        selected = list(queryset.order_by("-scheduled_for", "occurrence_id")[: MAX_BULK + 1])
        if len(selected) > MAX_BULK:
            messages.error(request, f"Nothing done: at most {MAX_BULK} occurrences per action; narrow the list.")
            return None
        if request.POST.get("confirm") == "yes":
            # The confirmation posts back to the list's URL, whose range may be relative (the last hour): a listed
            # occurrence that has since left it is named, never dropped in silence.
            posted = set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
            gone = sorted(posted - {str(o.pk) for o in selected})
            if gone:
                shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
                messages.warning(
                    request,
                    f"Nothing done to {len(gone)} listed occurrence(s) that have left the list's range since: {shown}. "
                    "Widen the range and select them again.",
                )
        return selected

    def _confirmation(
        self, request: HttpRequest, action: str, selected: list[Occurrence], form: ResolveForm | None = None
    ) -> TemplateResponse:
        """The list of what the action will do, each with why it will be refused if it will be; Confirm posts the
        same ids back (never "select all" again), so what is done is what was listed."""
        label_rows(selected)
        resolutions = current_resolutions(selected)
        pending = []
        for occurrence in selected:
            schedule, tenant = labels_of(occurrence)
            refusal = ""
            if occurrence.state != OccurrenceState.DEAD:
                refusal = (
                    f"{occurrence.state}: only a dead occurrence can be {'replayed' if form is None else 'resolved'}"
                )
            elif form is None and (schedule is None or schedule.state == ScheduleState.CANCELED):
                gone = "canceled" if schedule is not None else "gone (its tenant was deleted)"
                refusal = f"its schedule is {gone}: a replay would not run (resolve it instead)"
            elif form is not None and occurrence.occurrence_id in resolutions:
                refusal = f"already resolved by {resolutions[occurrence.occurrence_id].resolved_by}"
            pending.append(
                Pending(
                    occurrence,
                    tenant or f"tenant {occurrence.tenant_id} (deleted)",
                    schedule.name if schedule else f"schedule {occurrence.schedule_id} (deleted)",
                    precise_utc(occurrence.scheduled_for),
                    refusal,
                )
            )
        verb = "replay" if form is None else "resolve"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{verb.capitalize()} {len(selected)} occurrence{'s' if len(selected) != 1 else ''}?",
            "verb": verb,
            "done": "replayed" if form is None else "resolved",
            "action": action,
            "pending": pending,
            "acting": sum(1 for p in pending if not p.refusal),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/dispatch/occurrence/dead_letter_confirmation.html", context)


def each_of(
    selected: list[Occurrence], act: Callable[[Occurrence], object], refusal: type[Exception]
) -> tuple[list[Occurrence], list[str]]:
    """A bulk action's service call on each occurrence: those it was done to, and the refusals in words."""
    done: list[Occurrence] = []
    refused: list[str] = []
    for occurrence in selected:
        try:
            act(occurrence)
        except refusal as exc:
            refused.append(str(exc))
        else:
            done.append(occurrence)
    return done, refused


def report_refusals(request: HttpRequest, what: str, refused: list[str]) -> None:
    if not refused:
        return
    shown = " ".join(refused[:REFUSALS_NAMED])
    more = f" And {len(refused) - REFUSALS_NAMED} more." if len(refused) > REFUSALS_NAMED else ""
    messages.warning(request, f"{what}: {len(refused)}. {shown}{more}")
