"""Tenant API for notifications, /api/v1/notifications/: the target (PUT to set, GET, DELETE) and how delivery
fares. The rules are tenants/notifications.py's; sending is the data plane's (dispatch/notifications.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.clock import db_now
from core.labels import MAX_SELECTOR_LENGTH, SELECTOR_RULE
from dispatch.services import notification_delivery
from schedules.api.requests import actor_of
from schedules.api.schema import errors
from schedules.api.serializers import AwareDateTimeField, FlatListField
from tenants import notifications
from tenants.models import NotificationEvent, NotificationTarget

TARGET_KEYS = {"url", "events", "selector"}


class NotificationsInputSerializer(serializers.Serializer):
    url = serializers.CharField(
        help_text="http(s) URL each notification is POSTed to, signed like a webhook; the webhook's URL rule applies "
        "(a host, no credentials, no refused address as a literal): a URL it refuses is a 400 naming url."
    )
    events = FlatListField(child=serializers.ChoiceField(choices=NotificationEvent.choices), min_length=1, max_length=4)
    selector = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        max_length=MAX_SELECTOR_LENGTH,
        help_text=f"Only fires of the schedules whose labels meet it: {SELECTOR_RULE}. Empty: every schedule.",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in set(data) - TARGET_KEYS)
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
            if data.get("url") is not None and not isinstance(data["url"], str):
                raise serializers.ValidationError({"url": ["Not a valid string."]})
        return super().to_internal_value(data)


class NotificationsSerializer(serializers.Serializer):
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.ChoiceField(choices=NotificationEvent.choices))
    selector = serializers.CharField(help_text="The selector in its normal form; empty: every schedule of the tenant.")
    updated_at = AwareDateTimeField()
    updated_by = serializers.CharField()
    pending = serializers.IntegerField(help_text="Notifications not yet delivered (being tried).")
    given_up = serializers.IntegerField(help_text="Notifications no longer tried (refused, or a day of failures).")
    last_error = serializers.CharField(help_text="The latest failure, in words; empty when none.")


def target_json(target: NotificationTarget) -> dict[str, Any]:
    delivery = notification_delivery(target.tenant_id)
    return NotificationsSerializer(
        {
            "url": target.url,
            "events": target.events,
            "selector": target.selector,
            "updated_at": target.updated_at,
            "updated_by": target.updated_by,
            "pending": delivery.pending,
            "given_up": delivery.given_up,
            "last_error": delivery.last_error,
        }
    ).data


class NotificationsView(APIView):
    @extend_schema(operation_id="notifications_retrieve", responses={200: NotificationsSerializer, **errors(404)})
    def get(self, request: Request) -> Response:
        target = notifications.target_of(request.tenant)
        if target is None:
            raise NotFound("No notification target: PUT one.")
        return Response(target_json(target))

    @extend_schema(
        operation_id="notifications_update",
        request=NotificationsInputSerializer,
        responses={200: NotificationsSerializer, **errors()},
    )
    def put(self, request: Request) -> Response:
        body = NotificationsInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        target = notifications.set_target(
            request.tenant,
            url=body.validated_data["url"],
            events=body.validated_data["events"],
            selector=body.validated_data.get("selector"),
            actor=actor_of(request),
            now=db_now(),
        )
        return Response(target_json(target))

    @extend_schema(operation_id="notifications_destroy", request=None, responses={204: None, **errors(404)})
    def delete(self, request: Request) -> Response:
        if not notifications.clear_target(request.tenant, actor=actor_of(request)):
            raise NotFound("No notification target.")
        return Response(status=status.HTTP_204_NO_CONTENT)
