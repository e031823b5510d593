"""Fleet operations of the tenant API (docs/API.md, "Fleet operations"): bulk changes, export and apply, a schedule's
version history and backfill. Parse, call schedules.fleet or a service, serialize; ScheduleViewSet mixes these in."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.choices import ScheduleState
from core.labels import MAX_SELECTOR_LENGTH, SELECTOR_RULE, Selector, SelectorInvalid, parse_selector
from dispatch.services import BackfillRefused, backfill_schedule
from schedules import documents, fleet
from schedules.api.requests import actor_of, idempotency_key_of
from schedules.api.schema import errors, selector_pattern
from schedules.api.serializers import (
    AwareDateTimeField,
    FlatListField,
    ScheduleInputSerializer,
    ScheduleSerializer,
    of_its_json_type,
)
from schedules.errors import StateConflict
from schedules.models import DEFINITION_FIELDS


def selector_of(text: Any, key: str = "selector") -> Selector:
    try:
        return parse_selector(text)
    except SelectorInvalid as exc:
        raise serializers.ValidationError({key: [str(exc)]}) from None


class StrictSerializer(serializers.Serializer):
    """A JSON body whose keys are exactly the fields, each of its own JSON type: an unknown key, or `0` for a
    boolean, is a 400 naming it (DRF alone would ignore the one and read the other as false)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key)[:100] for key in set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
            wrong = [
                name
                for name, field in self.fields.items()
                if data.get(name) is not None and not of_its_json_type(field, data[name])
            ]
            if wrong:
                raise serializers.ValidationError({name: ["Not of this field's JSON type."] for name in wrong})
        return super().to_internal_value(data)


class SelectorField(serializers.CharField):
    """A label selector (core/labels.py)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_SELECTOR_LENGTH)
        kwargs.setdefault("help_text", f"Schedules whose labels meet every requirement: {SELECTOR_RULE}.")
        super().__init__(**kwargs)


class UUIDTextField(serializers.UUIDField):
    """A UUID as JSON text only: DRF's own field also takes the integer 1 as ...0001."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value="")
        return super().to_internal_value(data)


def refuse_unknown_parameters(request: Request, known: set[str]) -> None:
    """A 400 naming each query parameter the call does not take (as the lists do: schedules.api.filters)."""
    unknown = sorted(set(request.query_params) - known - {"format"})
    if unknown:
        takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
        raise serializers.ValidationError({key[:100]: [f"Unknown query parameter; {takes}."] for key in unknown})


class BulkInputSerializer(StrictSerializer):
    action = serializers.ChoiceField(choices=[(verb, verb) for verb in fleet.BULK_VERBS])
    selector = SelectorField(required=False, allow_blank=False)
    ids = FlatListField(child=UUIDTextField(), required=False, min_length=1, max_length=fleet.MAX_FLEET)
    note = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")
    dry_run = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("selector" in attrs) == ("ids" in attrs):
            raise serializers.ValidationError({"selector": ["Give a selector or ids, not both and not neither."]})
        if "selector" in attrs:
            attrs["selector"] = selector_of(attrs["selector"])
            if attrs["selector"].empty:
                raise serializers.ValidationError({"selector": ["Give at least one requirement."]})
        return attrs


class BulkOutcomeSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField(allow_null=True, help_text="The schedule's state after the call; null: no such id.")
    error = serializers.CharField(allow_null=True, help_text="Why it was not changed; null when it was, or had been.")
    changed = serializers.BooleanField()
    occurrence_id = serializers.UUIDField(allow_null=True, help_text="The occurrence a trigger created.")

    def to_representation(self, instance: fleet.BulkOutcome) -> dict[str, Any]:
        shown = super().to_representation(instance)
        shown["error"] = instance.error or None
        return shown


class BulkResultSerializer(serializers.Serializer):
    matched = serializers.IntegerField()
    changed = serializers.IntegerField()
    results = BulkOutcomeSerializer(many=True)


class ScheduleDocumentSerializer(ScheduleSerializer):
    """A schedule as a declarative document: its definition, without id, state, version or times of its own."""

    class Meta(ScheduleSerializer.Meta):
        fields = list(DEFINITION_FIELDS)
        read_only_fields = fields


class ExportSerializer(serializers.Serializer):
    schedules = ScheduleDocumentSerializer(many=True)


class ApplyInputSerializer(StrictSerializer):
    schedules = FlatListField(
        child=serializers.DictField(),
        max_length=fleet.MAX_FLEET,
        help_text="Schedule definitions as the export gives them (or create bodies), by name.",
    )
    selector = SelectorField(required=False, allow_blank=True, default="")
    prune = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Cancel the schedules the selector picks (all of the tenant's without one) that are not canceled "
        "and not in the document.",
    )
    dry_run = serializers.BooleanField(required=False, default=False)

    def validate_schedules(self, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each document's types, as a create body's (rules come after, in schedules.fleet)."""
        checked: list[dict[str, Any]] = []
        problems: list[str] = []
        for index, document in enumerate(documents):
            body = ScheduleInputSerializer(data=document)
            if body.is_valid():
                checked.append(body.validated_data)
                continue
            name = document.get("name") if isinstance(document.get("name"), str) else None
            for key, messages in body.errors.items():
                problems.extend(f"item {index} ({name!r}): {key}: {message}" for message in messages)
        if problems:
            raise serializers.ValidationError(problems[:100])
        return checked


class ApplyResultSerializer(serializers.Serializer):
    created = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())
    canceled = serializers.ListField(child=serializers.CharField())
    failed = serializers.ListField(
        child=inline_serializer("ApplyFailure", {"name": serializers.CharField(), "error": serializers.CharField()}),
        help_text="Changes refused while applying (a concurrent change the checks could not see); nothing is pruned "
        "then. Empty when the document applied whole.",
    )


class VersionSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    created_at = AwareDateTimeField(source="valid_from", help_text="When this version began.")
    actor = serializers.CharField()
    note = serializers.CharField()
    change = serializers.CharField(help_text="What made it: create, update, pause, resume or cancel.")
    definition = serializers.DictField(help_text="The definition and state the version began with.")


class BackfillInputSerializer(StrictSerializer):
    since = AwareDateTimeField(help_text="Range start (included).")
    until = AwareDateTimeField(help_text="Range end (excluded); not later than now.")


class BackfillResultSerializer(serializers.Serializer):
    expected = serializers.IntegerField()
    created = serializers.IntegerField()
    already_present = serializers.IntegerField()


EXPORT_SELECTOR = OpenApiParameter(
    "selector",
    {"type": "string", "maxLength": MAX_SELECTOR_LENGTH, "pattern": selector_pattern()},
    description=f"Only the schedules whose labels meet it: {SELECTOR_RULE}.",
)
# A backfill through the API runs inside the request, as the console's does: beyond this many fires the command
# `manage.py backfill` (its own process and cap) is the tool, and the refusal says so.
API_BACKFILL_MAX_FIRES = 10_000


class FleetActions:
    """The fleet's routes on ScheduleViewSet (which provides get_object, request.tenant and actor_of)."""

    @extend_schema(request=BulkInputSerializer, responses={200: BulkResultSerializer, **errors(413)})
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request) -> Response:
        body = BulkInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = fleet.bulk_change(
            request.tenant,
            data["action"],
            selector=data.get("selector"),
            ids=data.get("ids"),
            note=data["note"],
            dry_run=data["dry_run"],
            actor=actor_of(request),
            trigger_key=idempotency_key_of(request),
        )
        return Response(BulkResultSerializer(result).data)

    @extend_schema(parameters=[EXPORT_SELECTOR], responses={200: ExportSerializer, **errors()}, filters=False)
    @action(detail=False, methods=["get"])
    def export(self, request: Request) -> Response:
        refuse_unknown_parameters(request, {"selector"})
        selector = selector_of(request.query_params.get("selector"))
        schedules = documents.export_schedules(request.tenant, selector)
        return Response({"schedules": schedules})

    @extend_schema(request=ApplyInputSerializer, responses={200: ApplyResultSerializer, **errors(413)})
    @action(detail=False, methods=["post"])
    def apply(self, request: Request) -> Response:
        body = ApplyInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = documents.apply_schedules(
            request.tenant,
            data["schedules"],
            selector=selector_of(data["selector"]),
            prune=data["prune"],
            dry_run=data["dry_run"],
            actor=actor_of(request),
        )
        return Response(ApplyResultSerializer(result).data)

    @extend_schema(responses={200: VersionSerializer(many=True), **errors(404)}, filters=False)
    @action(detail=True, methods=["get"], pagination_class=None)
    def versions(self, request: Request, pk: str | None = None) -> Response:
        refuse_unknown_parameters(request, set())
        schedule = self.get_object()  # type: ignore[attr-defined]
        versions = schedule.versions.order_by("-version")
        return Response(VersionSerializer(versions, many=True).data)

    @extend_schema(request=BackfillInputSerializer, responses={202: BackfillResultSerializer, **errors(404, 409)})
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, pk: str | None = None) -> Response:
        schedule = self.get_object()  # type: ignore[attr-defined]
        body = BackfillInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if schedule.state == ScheduleState.CANCELED:
            raise StateConflict("A canceled schedule cannot be backfilled: workers drop its occurrences.")
        try:
            result = backfill_schedule(
                schedule.pk,
                since=body.validated_data["since"],
                until=body.validated_data["until"],
                max_fires=API_BACKFILL_MAX_FIRES,
            )
        except BackfillRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        shown = {"expected": result.expected, "created": result.created, "already_present": result.already_present}
        return Response(shown, status=status.HTTP_202_ACCEPTED)
