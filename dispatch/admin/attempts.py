"""One attempt in the console: its fields, inside the timeline of its occurrence."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from dispatch.admin.common import AttemptTimesMixin, ReadOnlyAdminMixin
from dispatch.admin.occurrences import timeline_context
from dispatch.models import Attempt, Occurrence
from scheduler_project.console import BIGINT_MAX
from tenants.access import tenant_scope


@admin.register(Attempt)
class AttemptAdmin(AttemptTimesMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """One attempt, with its occurrence's timeline around it. Attempts are listed on their occurrence's page, so
    there is no list of its own (and no entry on the index)."""

    change_form_template = "admin/dispatch/attempt/change_form.html"
    fields = (
        "occurrence_link",
        "generation",
        "worker",
        "started",
        "heartbeat",
        "lease_expires",
        "finished",
        "outcome",
        "error_class",
        "error",
    )
    readonly_fields = fields

    def has_module_permission(self, request: HttpRequest) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        scope = tenant_scope(request)
        if scope is None:
            return super().get_queryset(request)
        # Attempts carry no tenant: their occurrence does (same id and partition key).
        theirs = Occurrence.objects.filter(
            occurrence_id=OuterRef("occurrence_id"), scheduled_for=OuterRef("scheduled_for"), tenant_id__in=scope
        )
        return super().get_queryset(request).filter(Exists(theirs))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        messages.info(request, "Attempts are listed on their occurrence's page.")
        return HttpResponseRedirect(reverse("admin:dispatch_occurrence_changelist"))

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Attempt | None:
        if not (object_id.isascii() and object_id.isdigit()) or int(object_id) > BIGINT_MAX:
            return None
        return super().get_object(request, object_id, from_field)

    @admin.display(description="occurrence")
    def occurrence_link(self, attempt: Attempt) -> str:
        url = reverse("admin:dispatch_occurrence_change", args=[attempt.occurrence_id])
        return format_html('<a href="{}">{}</a>', url, attempt.occurrence_id)

    def render_change_form(self, request: HttpRequest, context: dict, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            # No join to the schedule: a deleted tenant's attempts keep their occurrence's timeline.
            occurrence = Occurrence.objects.filter(
                occurrence_id=obj.occurrence_id, scheduled_for=obj.scheduled_for
            ).first()
            if occurrence is not None:
                context.update(timeline_context(occurrence, highlight=obj.generation))
                context["occurrence"] = occurrence
        return super().render_change_form(request, context, add, change, form_url, obj)
