"""Tenant API for its credentials. /api/v1/tokens/: issue (the key in the 201 only), list, read, revoke; the rules
and the storage (digests only) are tenants.credentials.tokens'. /api/v1/webhook-secret/: the key webhook calls are
signed with, and its rotation (tenants/signing.py). A read token may list tokens; everything else here needs a
write token, reading the secret included (whoever holds it can forge calls)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.clock import db_now
from schedules.api.filters import KnownParametersOnly
from schedules.api.requests import actor_of
from schedules.api.schema import errors
from schedules.api.serializers import AwareDateTimeField
from tenants import signing
from tenants.credentials import tokens
from tenants.credentials.authentication import WriteScopeOnly
from tenants.credentials.models import ApiToken, TokenScope

TOKEN_KEYS = {"name", "scope", "expires_at"}


class TokenSerializer(serializers.ModelSerializer):
    created_at = AwareDateTimeField()
    expires_at = AwareDateTimeField()
    last_used_at = AwareDateTimeField(allow_null=True)
    prefix = serializers.CharField(help_text="The key's first characters; the key itself is never shown again.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "scope", "prefix", "created_at", "created_by", "expires_at", "last_used_at"]
        read_only_fields = fields


class IssuedTokenSerializer(TokenSerializer):
    token = serializers.CharField(help_text="The key, shown in this answer only: use it as 'Authorization: Token …'.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class TokenInputSerializer(serializers.Serializer):
    name = serializers.RegexField(tokens.NAME_PATTERN, max_length=100, help_text=tokens.NAME_RULE)
    scope = serializers.ChoiceField(choices=TokenScope.choices, help_text="read: GET and previews; write: every call.")
    expires_at = AwareDateTimeField(
        required=False,
        help_text="When the key stops working. Default: 90 days from now (SCHEDULER_TOKEN_DEFAULT_DAYS); at most "
        "365 days ahead (SCHEDULER_TOKEN_MAX_DAYS).",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in set(data) - TOKEN_KEYS)
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
            if data.get("name") is not None and not isinstance(data["name"], str):
                raise serializers.ValidationError({"name": ["Not a valid string."]})
        return super().to_internal_value(data)


@extend_schema_view(
    list=extend_schema(responses={200: TokenSerializer(many=True), **errors(404)}),
    retrieve=extend_schema(responses={200: TokenSerializer, **errors(404)}),
)
class TokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = ApiToken.objects.none()
    serializer_class = TokenSerializer
    filter_backends = [KnownParametersOnly]

    def get_queryset(self):
        # The request's schema is its tenant's (django-tenants): these are that tenant's tokens and no others.
        return ApiToken.objects.order_by("created_at", "id")

    @extend_schema(request=TokenInputSerializer, responses={201: IssuedTokenSerializer, **errors(429)})
    def create(self, request: Request) -> Response:
        body = TokenInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = tokens.issue_token(
            request.tenant,
            name=body.validated_data["name"],
            scope=body.validated_data["scope"],
            expires_at=body.validated_data.get("expires_at"),
            actor=actor_of(request),
            now=db_now(),
            not_after=getattr(request.user, "expires_at", None),
        )
        data = {**TokenSerializer(issued.token).data, "token": issued.key}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None, **errors(404)})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        token = self.get_object()
        tokens.revoke_token(request.tenant, token.pk, actor=actor_of(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookSecretSerializer(serializers.Serializer):
    secret = serializers.CharField(help_text="'whsec_' and the base64 key: what a Standard Webhooks verifier takes.")
    created_at = AwareDateTimeField()
    rotated_at = AwareDateTimeField(allow_null=True)
    previous_valid_until = AwareDateTimeField(
        allow_null=True, help_text="Until then calls carry the previous secret's signature too."
    )


def secret_json(state: signing.SecretState) -> dict[str, Any]:
    return WebhookSecretSerializer(
        {
            "secret": state.secret,
            "created_at": state.created_at,
            "rotated_at": state.rotated_at,
            "previous_valid_until": state.previous_until,
        }
    ).data


class WebhookSecretView(APIView):
    permission_classes = [*APIView.permission_classes, WriteScopeOnly]

    @extend_schema(operation_id="webhook_secret_retrieve", responses={200: WebhookSecretSerializer, **errors()})
    def get(self, request: Request) -> Response:
        return Response(secret_json(signing.secret_state(request.tenant, now=db_now())))


class WebhookSecretRotateView(APIView):
    permission_classes = [*APIView.permission_classes, WriteScopeOnly]

    @extend_schema(
        operation_id="webhook_secret_rotate",
        request=None,
        responses={200: WebhookSecretSerializer, **errors(409)},
        description="A new secret; the old one keeps signing for 24 hours. 409 while the last rotation's 24 hours "
        "run (both secrets sign until previous_valid_until).",
    )
    def post(self, request: Request) -> Response:
        state = signing.rotate_secret(request.tenant, actor=actor_of(request), now=db_now())
        return Response(secret_json(state))
