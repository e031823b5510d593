"""Query-string filters of the schedule list (`?state=`, `?handler=`, `?name=`, `?selector=`) and of the occurrence list
(`?state=`, `?schedule=`, `?scheduled_after=`, `?scheduled_before=`), and the rule that a list refuses a parameter
it does not know: `?payload__customer=c-42` or `?search=` answered with everything looked like a working filter."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

import django_filters
from django import forms
from django.db.models import Exists, OuterRef, QuerySet, TextChoices
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend
from rest_framework.settings import api_settings

from core.choices import ScheduleState
from core.labels import MAX_SELECTOR_LENGTH, SELECTOR_RULE, Selector, SelectorInvalid, parse_selector
from dispatch.models import WATCHED_STATES, Occurrence, OccurrenceState, OccurrenceWatch
from schedules.api.schema import INSTANT, query_text, selector_pattern
from schedules.api.serializers import INSTANT_ERRORS, InstantInvalid, parse_instant
from schedules.models import Schedule, ScheduleQuerySet


class KnownParametersOnly(BaseFilterBackend):
    """A list answers 400 naming each query parameter that is neither one of its filters nor `page` (or DRF's
    `format`). Listed after the view's filter backend, in settings and in the views without filters."""

    def filter_queryset(self, request: Any, queryset: QuerySet, view: Any) -> QuerySet:
        if getattr(view, "action", None) != "list":
            return queryset
        known = {"page", api_settings.URL_FORMAT_OVERRIDE}
        filterset_class = getattr(view, "filterset_class", None)
        if filterset_class is not None:
            known |= set(filterset_class.base_filters)
        unknown = sorted(set(request.query_params) - known)
        if unknown:
            allowed = ", ".join(sorted(name for name in known if name))
            raise ValidationError(
                {name[:100]: [f"Unknown query parameter; this list takes {allowed}."] for name in unknown}
            )
        return queryset


def choice_filter(choices: type[TextChoices], **options: Any) -> django_filters.ChoiceFilter:
    # The message names the choices, not the input (Django's default echoes the value back).
    return django_filters.ChoiceFilter(
        choices=choices.choices,
        error_messages={"invalid_choice": f"Must be one of: {', '.join(choices.values)}."},
        **options,
    )


class SelectorFormField(forms.CharField):
    """A label selector (core/labels.py), parsed; its rule is the 400's message."""

    def clean(self, value: Any) -> Selector | None:
        text = super().clean(value)
        if text in self.empty_values:
            return None
        try:
            return parse_selector(text)
        except SelectorInvalid as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None


class SelectorFilter(django_filters.Filter):
    field_class = SelectorFormField

    def filter(self, qs: QuerySet, value: Selector | None) -> QuerySet:
        # The schedule list's queryset is a ScheduleQuerySet (ScheduleViewSet.get_queryset).
        return qs if value is None else cast(ScheduleQuerySet, qs).selected(value)


SELECTOR_SCHEMA = {
    "type": "string",
    "maxLength": MAX_SELECTOR_LENGTH,
    "pattern": selector_pattern(),
    "description": f"Schedules whose labels meet every requirement: {SELECTOR_RULE}. A `!=` requirement also matches "
    "a schedule without that label.",
}


class ScheduleFilter(django_filters.FilterSet):
    state = choice_filter(ScheduleState)
    handler = extend_schema_field(query_text(100))(django_filters.CharFilter(max_length=100))
    name = extend_schema_field(query_text(200))(django_filters.CharFilter(max_length=200))
    selector = extend_schema_field(SELECTOR_SCHEMA)(SelectorFilter(max_length=MAX_SELECTOR_LENGTH))

    class Meta:
        model = Schedule
        fields = ["state", "handler", "name", "selector"]


class InstantFormField(forms.Field):
    """An instant as the API reads one everywhere (schedules.api.serializers.parse_instant): ISO 8601 with an
    offset or Z, 1900-9000. Django's own datetime field would take a naive time as the server's zone."""

    default_error_messages = INSTANT_ERRORS

    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
            return None
        try:
            return parse_instant(value)
        except InstantInvalid as exc:
            raise forms.ValidationError(self.error_messages[exc.code], code=exc.code) from None


class InstantFilter(django_filters.Filter):
    field_class = InstantFormField


def scheduled(lookup_expr: str, description: str) -> InstantFilter:
    """A bound of the range of scheduled_for, documented as the instants the API accepts."""
    schema = {**INSTANT, "description": f"{description} {INSTANT['description']}"}
    return extend_schema_field(schema)(InstantFilter(field_name="scheduled_for", lookup_expr=lookup_expr))


class OccurrenceFilterForm(forms.Form):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        after, before = cleaned.get("scheduled_after"), cleaned.get("scheduled_before")
        if after is not None and before is not None and after > before:
            self.add_error("scheduled_after", "Must not be later than scheduled_before.")
        return cleaned


class OccurrenceFilter(django_filters.FilterSet):
    """The time range compares scheduled_for itself, the partition key, so PostgreSQL scans only the days of
    the range: a tenant's listing of a day stays cheap however many days of occurrences are kept. A state the
    engine watches (running, retry_wait, dead: the DLQ) is found through the watch table, whatever the range."""

    state = choice_filter(OccurrenceState, method="filter_state")
    schedule = django_filters.UUIDFilter(field_name="schedule_id", help_text="The id of one of the schedules.")
    # A half-open range [after, before): consecutive windows neither overlap nor leave a gap.
    scheduled_after = scheduled("gte", "Scheduled at or after this instant.")
    scheduled_before = scheduled("lt", "Scheduled before this instant, which is not earlier than scheduled_after.")

    class Meta:
        model = Occurrence
        fields = ["state", "schedule", "scheduled_after", "scheduled_before"]
        form = OccurrenceFilterForm

    def filter_state(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        queryset = queryset.filter(state=value)
        if value not in WATCHED_STATES:
            return queryset
        # The tenant's watch rows in that state drive the read, each probing its occurrence's primary key (the
        # tenant is named as a constant so the planner starts from them).
        watched = OccurrenceWatch.objects.filter(
            occurrence_id=OuterRef("occurrence_id"),
            scheduled_for=OuterRef("scheduled_for"),
            state=value,
            tenant_id=self.request.tenant.id,
        )
        return queryset.filter(Exists(watched))
