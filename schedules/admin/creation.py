"""Creating a schedule in the console, for one of the operator's tenants, through create_schedule.

Operators used to need a tenant's token and the API for this. The add page is the change page's form with a tenant
to choose (only those the operator may act on, tenants/access.py) and the same live preview; the schedule is made
by the service behind POST /api/v1/schedules/, so the quota is counted under the tenant's lock, the calendars are
checked and version 1 names the operator as its actor.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, cast

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from core.choices import Kind
from dispatch.services import registered_names
from scheduler_project.console import operator_actor
from schedules.admin.forms import ScheduleDefinitionForm
from schedules.api.serializers import InstantInvalid, parse_instant
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import Schedule
from schedules.services import create_schedule
from tenants.access import scoped, tenant_scope
from tenants.models import Tenant

ADD_FIELDSETS = (
    (
        "Schedule",
        {
            "fields": ("tenant",),
            "description": "Only the tenants you act on are offered. The schedule counts against the tenant's quota "
            "and may name only that tenant's calendars.",
        },
    ),
    (
        "Definition",
        {
            "fields": (
                *("request_key", "name", "labels", "kind", "cron", "run_at", "every_seconds", "anchor_at"),
                *("timezone", "dst_gap", "dst_repeat", "start_at", "end_at", "max_runs", "exclude_calendars"),
                *("handler", "payload"),
            ),
            "description": "Saving creates the schedule through the schedule service, as the API does: version 1, "
            "with you as its actor. Nothing fires before you save.",
        },
    ),
    (
        "Delivery",
        {
            "fields": (
                *("lane", "flexible_window_seconds", "priority", "misfire_policy", "max_lateness_seconds"),
                *("catchup_limit", "overlap_policy", "max_attempts", "retry_base_seconds", "retry_cap_seconds"),
            )
        },
    ),
)


class TenantChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return obj.slug if obj.name in ("", obj.slug) else f"{obj.slug} ({obj.name})"


class ScheduleAddForm(ScheduleDefinitionForm):
    """A new schedule's definition and tenant, created by create_schedule when the form validates.

    The service runs in `_post_clean`, where a ModelForm builds its instance, inside the admin view's transaction:
    what it refuses (the quota, a calendar deleted meanwhile) becomes an error on this form instead of a 500 after
    it, and a failure later in the request undoes the create. ScheduleAdmin.save_model has nothing left to save.
    """

    # The operator's name in versions and logs; set per request by `for_operator`.
    actor: ClassVar[str] = ""
    tenant = TenantChoiceField(queryset=Tenant.objects.none())
    # The page's idempotency key: submitting it twice (a double click, a reload) meets the schedule it created.
    request_key = forms.UUIDField(required=False, widget=forms.HiddenInput)

    @classmethod
    def for_operator(cls, tenants: QuerySet, actor: str) -> type[ScheduleAddForm]:
        """The form offering `tenants`, creating as `actor`: a class per request, because a declared field is shared
        by every form of its class, so the request's queryset cannot be set on this one."""
        attributes = {"__module__": cls.__module__, "actor": actor, "tenant": TenantChoiceField(queryset=tenants)}
        return type(cls.__name__, (cls,), attributes)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.created = False
        self.fields["request_key"].initial = uuid.uuid4()
        # A ModelForm without an instance starts from its fields' initial values: the model's defaults, except on
        # the declared fields (payload, timezone), and none for kind. The query string (?tenant=3) still wins.
        for name, value in (("kind", Kind.CRON), ("timezone", "UTC"), ("payload", {})):
            self.initial.setdefault(name, value)
        # Chosen on purpose, not left at the first handler of the list.
        handlers = [(name, name) for name in sorted(registered_names())]
        cast(forms.ChoiceField, self.fields["handler"]).choices = [("", "---------"), *handlers]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # A bad tenant alone still lets the definition be checked, so every problem shows on the first round.
        if not set(self.errors) - {"tenant", "request_key"}:
            tenant = cleaned.get("tenant")
            self.check_definition(cleaned, tenant.pk if tenant is not None else None)
        return cleaned

    def _post_clean(self) -> None:
        """Create the schedule through the service once every field is valid (see the class docstring)."""
        if self.errors:
            return
        key = self.cleaned_data.get("request_key")
        try:
            self.instance, self.created = create_schedule(
                tenant=self.cleaned_data["tenant"],
                data=self.definition,
                actor=self.actor,
                idempotency_key=f"console/{key}" if key else None,
            )
        except ScheduleInvalid as exc:
            self.add_refusal(exc)
        except QuotaExceeded as exc:
            self.add_error("tenant", exc.message)
        except StateConflict:
            self.add_error(
                None,
                "This page already created a schedule with other values. Open Add schedule again to create another.",
            )


# The definition's instants, which the add page's date-time widgets show.
INSTANT_FIELDS = ("run_at", "anchor_at", "start_at", "end_at")


class ScheduleCreationMixin:
    """The schedule admin's add page: who may use it, its form and fields, and where a save lands."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        # The Operator group holds change_schedule, not add_schedule: an operator who may change a tenant's
        # schedules may create them too, and one without a tenant to act on has nothing to create them for.
        return self.has_change_permission(request) and tenant_scope(request) != frozenset()  # type: ignore[attr-defined]

    def get_form(self, request: HttpRequest, obj: Schedule | None = None, change: bool = False, **kwargs: Any):
        if obj is None:
            tenants = scoped(request, Tenant.objects.exclude(schema_name="public"), "pk").order_by("slug")
            kwargs["form"] = ScheduleAddForm.for_operator(tenants, operator_actor(request))
        return super().get_form(request, obj, change, **kwargs)  # type: ignore[misc]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """Starting values from the query string (?name=...). An instant is taken only when it reads as one the
        API accepts (the date-time widget would fail on any other text); anything else is left out."""
        initial = super().get_changeform_initial_data(request)  # type: ignore[misc]
        for field in INSTANT_FIELDS:
            if field in initial:
                try:
                    initial[field] = parse_instant(initial[field])
                except InstantInvalid:
                    del initial[field]
        return initial

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        # On the add page the tenant is chosen; the stored row's other read-only fields do not exist yet.
        return () if obj is None else super().get_readonly_fields(request, obj)  # type: ignore[misc]

    def saved_by_form(self, request: HttpRequest, form: ScheduleAddForm) -> None:
        """What the add form's create came to, for log_addition and response_add."""
        schedule = form.instance
        if form.created:
            text = (
                f"{schedule.name} created for tenant {schedule.tenant.slug} as version {schedule.version} by the "
                "schedule service."
            )
            request._schedule_message = (messages.SUCCESS, text)  # type: ignore[attr-defined]
        else:
            text = f"{schedule.name} was already created from this page: nothing new was created."
            request._schedule_message = (messages.INFO, text)  # type: ignore[attr-defined]
            request._schedule_repeated = True  # type: ignore[attr-defined]

    def log_addition(self, request: HttpRequest, obj: Schedule, message: Any):
        if getattr(request, "_schedule_repeated", False):
            return None
        return super().log_addition(request, obj, message)  # type: ignore[misc]

    def response_add(self, request: HttpRequest, obj: Schedule, post_url_continue: str | None = None) -> HttpResponse:
        """The new schedule's page, where its next fires and version 1 are, with one message saying what was done."""
        message = getattr(request, "_schedule_message", None)
        if message is not None:
            messages.add_message(request, *message)
        if "_addanother" in request.POST:
            return HttpResponseRedirect(request.path)
        return HttpResponseRedirect(reverse("admin:schedules_schedule_change", args=[obj.pk]))
