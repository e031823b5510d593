"""Tenant API for holiday calendars, /api/v1/calendars/ (addressed by name): parse, call schedules/calendars.py,
serialize. Tenant scoping happens only in get_queryset()."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from schedules import calendars
from schedules.api.filters import KnownParametersOnly
from schedules.api.requests import actor_of
from schedules.api.schema import errors
from schedules.api.serializers import AwareDateTimeField, FlatListField
from schedules.calendar_names import NAME_REGEX
from schedules.models import Calendar

CALENDAR_KEYS = {"name", "dates", "ranges", "description"}


class RangeSerializer(serializers.Serializer):
    start = AwareDateTimeField(help_text="First excluded instant (included).")
    end = AwareDateTimeField(help_text="End of the range (not included); after start.")

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and set(data) - {"start", "end"}:
            raise serializers.ValidationError(["A range has only start and end."])
        return super().to_internal_value(data)


@extend_schema_field(OpenApiTypes.DATETIME)
class StoredInstantField(serializers.CharField):
    """An instant as the calendar stores it: ISO 8601 in UTC with Z."""


class StoredRangeSerializer(serializers.Serializer):
    start = StoredInstantField(help_text="First excluded instant (included), UTC.")
    end = StoredInstantField(help_text="End of the range (not included), UTC.")


class CalendarSerializer(serializers.ModelSerializer):
    dates = serializers.ListField(
        child=serializers.DateField(),
        help_text="Excluded dates, each in the local date of the schedule that names the calendar.",
    )
    ranges = StoredRangeSerializer(many=True, help_text="Excluded ranges of instants, [start, end), in time order.")
    created_at = AwareDateTimeField()
    updated_at = AwareDateTimeField()

    class Meta:
        model = Calendar
        fields = ["name", "description", "dates", "ranges", "revision", "created_at", "updated_at"]
        read_only_fields = fields


class CalendarInputSerializer(serializers.Serializer):
    """Create and PATCH bodies; the rules (formats, bounds, order) are the service's, so the console and the API
    give one answer."""

    name = serializers.RegexField(NAME_REGEX, required=False, max_length=63)
    description = serializers.CharField(required=False, allow_blank=True, max_length=calendars.MAX_DESCRIPTION)
    dates = FlatListField(
        child=serializers.DateField(), required=False, max_length=calendars.MAX_DATES, help_text="YYYY-MM-DD."
    )
    ranges = FlatListField(child=RangeSerializer(), required=False, max_length=calendars.MAX_RANGES)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in set(data) - CALENDAR_KEYS)
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
            # JSON types as the schema states them: DRF alone would read the number 5 as the text "5".
            wrong = [
                key for key in ("name", "description") if data.get(key) is not None and not isinstance(data[key], str)
            ]
            if wrong:
                raise serializers.ValidationError({key: ["Not a valid string."] for key in wrong})
            if (
                "dates" in data
                and isinstance(data["dates"], list)
                and not all(isinstance(d, str) for d in data["dates"])
            ):
                raise serializers.ValidationError({"dates": ["Each date is a string YYYY-MM-DD."]})
        values = super().to_internal_value(data)
        # The service reads the stored (JSON) forms.
        if "dates" in values:
            values["dates"] = [day.isoformat() for day in values["dates"]]
        if "ranges" in values:
            values["ranges"] = [
                {"start": r["start"].isoformat(), "end": r["end"].isoformat()} for r in values["ranges"]
            ]
        return values


class CalendarCreateSerializer(CalendarInputSerializer):
    name = serializers.RegexField(NAME_REGEX, max_length=63, help_text="Unique in the tenant; never changes.")


@extend_schema_view(
    list=extend_schema(responses={200: CalendarSerializer(many=True), **errors(404)}),
    retrieve=extend_schema(responses={200: CalendarSerializer, **errors(404)}),
)
class CalendarViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Calendar.objects.none()
    serializer_class = CalendarSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    filter_backends = [KnownParametersOnly]

    def get_queryset(self):
        return Calendar.objects.filter(tenant=self.request.tenant).order_by("name")

    @extend_schema(request=CalendarCreateSerializer, responses={201: CalendarSerializer, **errors(409, 429)})
    def create(self, request: Request) -> Response:
        body = CalendarCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        calendar = calendars.create_calendar(tenant=request.tenant, data=body.validated_data, actor=actor_of(request))
        return Response(CalendarSerializer(calendar).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=CalendarInputSerializer, responses={200: CalendarSerializer, **errors(404)})
    def partial_update(self, request: Request, name: str | None = None) -> Response:
        calendar = self.get_object()
        body = CalendarInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        calendar = calendars.update_calendar(calendar, body.validated_data, actor=actor_of(request))
        return Response(CalendarSerializer(calendar).data)

    @extend_schema(request=None, responses={204: None, **errors(404, 409)})
    def destroy(self, request: Request, name: str | None = None) -> Response:
        calendars.delete_calendar(self.get_object(), actor=actor_of(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
