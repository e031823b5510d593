"""Tenant REST API: parse, call a service, serialize. Tenant scoping happens only in get_queryset()."""

from __future__ import annotations

from datetime import datetime

from django.db.models import OuterRef, Subquery
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from core.choices import ScheduleState
from core.clock import db_now
from dispatch import services as dispatch_services
from dispatch.models import Occurrence
from dispatch.services import pending_fires
from schedules import services
from schedules.api.filters import OccurrenceFilter, ScheduleFilter
from schedules.api.fleet import FleetActions
from schedules.api.parsers import BoundedJSONParser
from schedules.api.requests import actor_of, idempotency_key_of
from schedules.api.schema import IDEMPOTENCY_KEY, errors
from schedules.api.serializers import (
    InFlightSerializer,
    NoteInputSerializer,
    OccurrenceIdSerializer,
    OccurrenceSerializer,
    PauseInputSerializer,
    PreviewInputSerializer,
    PreviewQuerySerializer,
    ScheduleInputSerializer,
    ScheduleSerializer,
    fires_json,
)
from schedules.definitions import time_rule_of
from schedules.models import DEFINITION_FIELDS, Schedule

FiresSerializer = inline_serializer(
    name="Fires",
    fields={
        "fires": inline_serializer(
            name="Fire",
            fields={
                "at": serializers.DateTimeField(help_text="The fire in UTC, with Z."),
                "local": serializers.CharField(help_text="The same instant in the schedule's zone, with its offset."),
                "dst": serializers.ChoiceField(
                    choices=["shifted", "repeated"],
                    required=False,
                    help_text=(
                        "Present on a cron schedule's fire that a clock change touches: 'repeated' when its local "
                        "time occurs twice that day, 'shifted' when it is a skipped local time fired under dst_gap "
                        "'shift'."
                    ),
                ),
            },
            many=True,
        )
    },
)
CancelSerializer = inline_serializer(
    name="CancelResult", fields={"schedule": ScheduleSerializer(), "in_flight": InFlightSerializer(many=True)}
)


PREVIEW_PLACEHOLDERS = {"name": "preview", "handler": "noop"}
PARSERS = [BoundedJSONParser, FormParser, MultiPartParser]


@extend_schema_view(
    list=extend_schema(responses={200: ScheduleSerializer(many=True), **errors(404)}),
    retrieve=extend_schema(responses={200: ScheduleSerializer, **errors(404)}),
)
class ScheduleViewSet(
    FleetActions,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    # For schema generation only (it has no request, so no tenant); every request goes through get_queryset().
    queryset = Schedule.objects.none()
    serializer_class = ScheduleSerializer
    filterset_class = ScheduleFilter
    parser_classes = PARSERS
    # Previews change nothing: a read token may ask for them.
    read_scope_actions = ("preview_unsaved",)

    def get_queryset(self):
        # The next pending fire of each listed schedule in the same query (one index probe per row), not one
        # query per schedule in the serializer.
        pending = pending_fires(db_now()).filter(schedule_id=OuterRef("pk")).order_by("scheduled_for")
        return (
            Schedule.objects.for_tenant(self.request.tenant)
            .select_related("cursor")
            .annotate(next_pending_fire=Subquery(pending.values("scheduled_for")[:1]))
            .order_by("-created_at", "id")
        )

    @extend_schema(
        request=ScheduleInputSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: ScheduleSerializer,
            200: OpenApiResponse(ScheduleSerializer, description="A retry with the same Idempotency-Key and body."),
            **errors(409, 413),
        },
    )
    def create(self, request: Request) -> Response:
        body = ScheduleInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule, created = services.create_schedule(
            tenant=request.tenant,
            data=body.validated_data,
            actor=actor_of(request),
            idempotency_key=idempotency_key_of(request),
            request_fingerprint=services.fingerprint(request.data),
        )
        return Response(
            ScheduleSerializer(schedule).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(
        request=ScheduleInputSerializer,
        responses={200: ScheduleSerializer, **errors(404, 409, 413)},
        description="Changes the fields given; the result is checked as a whole, as a create is. A time field that "
        "the resulting kind does not use (run_at on a cron schedule, cron on a one-off, every_seconds or anchor_at "
        "on either) is a 400 naming it, and so is a new kind without the fields it needs.",
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        schedule = self.get_object()
        body = ScheduleInputSerializer(data=request.data, context={"current": ScheduleSerializer(schedule).data})
        body.is_valid(raise_exception=True)
        schedule = services.update_schedule(schedule, body.validated_data, actor=actor_of(request))
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(request=PauseInputSerializer, responses={200: ScheduleSerializer, **errors(400, 404, 409)})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        body = PauseInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = services.pause_schedule(
            self.get_object(),
            actor=actor_of(request),
            note=body.validated_data["note"],
            resume_at=body.validated_data["resume_at"],
        )
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(request=NoteInputSerializer, responses={200: ScheduleSerializer, **errors(404, 409)})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        body = NoteInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = services.resume_schedule(
            self.get_object(), actor=actor_of(request), note=body.validated_data["note"]
        )
        return Response(ScheduleSerializer(schedule).data)

    @extend_schema(request=NoteInputSerializer, responses={200: CancelSerializer, **errors(404)})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        body = NoteInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        result = services.cancel_schedule(self.get_object(), actor=actor_of(request), note=body.validated_data["note"])
        return Response(
            {
                "schedule": ScheduleSerializer(result.schedule).data,
                "in_flight": InFlightSerializer(result.in_flight, many=True).data,
            }
        )

    @extend_schema(
        request=NoteInputSerializer, responses={200: CancelSerializer, **errors(404)}, description="The same as cancel."
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        return ScheduleViewSet.cancel(self, request, pk)

    @extend_schema(parameters=[PreviewQuerySerializer], responses={200: FiresSerializer, **errors(404)})
    @action(detail=True, methods=["get"])
    def preview(self, request: Request, pk: str | None = None) -> Response:
        schedule = self.get_object()
        query = PreviewQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        now = db_now()
        after: datetime = query.validated_data.get("after") or now
        count = query.validated_data["count"]
        # The fires this schedule will run: none while it is paused, canceled or completed (listing the rule's
        # fires there read as a promise; a resume starts from the next fire after it).
        fires: list[datetime] = []
        if schedule.state == ScheduleState.ACTIVE:
            definition = {field: getattr(schedule, field) for field in DEFINITION_FIELDS}
            runs_left = services.runs_left_after(schedule, after)
            fires = services.preview_definition(
                definition, after=after, count=count, now=now, runs_left=runs_left, tenant_id=schedule.tenant_id
            )
        return Response(fires_json(fires, schedule.time_rule))

    @extend_schema(request=PreviewInputSerializer, responses={200: FiresSerializer, **errors(413)})
    @action(detail=False, methods=["post"], url_path="preview")
    def preview_unsaved(self, request: Request) -> Response:
        body = PreviewInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        # A preview needs only the time fields; name and handler get placeholders when absent.
        definition = services.clean_definition({**PREVIEW_PLACEHOLDERS, **body.validated_data["definition"]})
        now = db_now()
        after = body.validated_data["after"] or now
        fires = services.preview_definition(
            definition, after=after, count=body.validated_data["count"], now=now, tenant_id=request.tenant.pk
        )
        return Response(fires_json(fires, time_rule_of(definition)))

    @extend_schema(
        request=None, parameters=[IDEMPOTENCY_KEY], responses={202: OccurrenceIdSerializer, **errors(404, 409)}
    )
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, pk: str | None = None) -> Response:
        occurrence_id = services.trigger_schedule(
            self.get_object(),
            actor=actor_of(request),
            trigger_key=idempotency_key_of(request),
        )
        return Response({"occurrence_id": str(occurrence_id)}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: OccurrenceSerializer(many=True), **errors(404)}, filters=False)
    @action(detail=True, methods=["get"])
    def occurrences(self, request: Request, pk: str | None = None) -> Response:
        schedule = self.get_object()
        occurrences = (
            Occurrence.objects.for_tenant(request.tenant)
            .filter(schedule=schedule)
            .order_by("-scheduled_for", "occurrence_id")
            .prefetch_related("attempts")
        )
        page = self.paginate_queryset(occurrences)
        return self.get_paginated_response(OccurrenceSerializer(page, many=True).data)

    def filter_queryset(self, queryset):
        # Filters apply to the schedule list only, not to an action's own listing.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)


@extend_schema_view(
    list=extend_schema(responses={200: OccurrenceSerializer(many=True), **errors(404)}),
    retrieve=extend_schema(responses={200: OccurrenceSerializer, **errors(404)}),
)
class OccurrenceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Occurrence.objects.none()  # for schema generation only, as above
    serializer_class = OccurrenceSerializer
    filterset_class = OccurrenceFilter
    lookup_field = "occurrence_id"
    parser_classes = PARSERS

    def get_queryset(self):
        return (
            Occurrence.objects.for_tenant(self.request.tenant)
            .order_by("-scheduled_for", "occurrence_id")
            .prefetch_related("attempts")
        )

    def filter_queryset(self, queryset):
        # Filters apply to the occurrence list only: a detail or a replay finds its row whatever the query says.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)

    @extend_schema(request=None, responses={202: OccurrenceIdSerializer, **errors(404, 409)})
    @action(detail=True, methods=["post"])
    def replay(self, request: Request, occurrence_id: str | None = None) -> Response:
        occurrence = self.get_object()
        dispatch_services.replay_dead_occurrence(occurrence.occurrence_id, now=db_now())
        return Response({"occurrence_id": str(occurrence.occurrence_id)}, status=status.HTTP_202_ACCEPTED)


__all__ = ["OccurrenceViewSet", "ScheduleViewSet"]
