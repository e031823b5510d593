"""What the tenant API reads from a request besides its body: who acted, and the Idempotency-Key header."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request

from schedules.api.serializers import MAX_IDEMPOTENCY_KEY_LENGTH


def actor_of(request: Request) -> str:
    """Who acted, as text: tenant users and operators live in different schemas, so ids alone are ambiguous."""
    return f"tenant:{request.tenant.slug}/{request.user.get_username()}"


def idempotency_key_of(request: Request) -> str | None:
    """The Idempotency-Key header, or None; a key its column cannot hold is a 400, not a database error."""
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise serializers.ValidationError({"Idempotency-Key": [f"At most {MAX_IDEMPOTENCY_KEY_LENGTH} characters."]})
    if key is not None and "\x00" in key:
        raise serializers.ValidationError({"Idempotency-Key": ["Null characters are not allowed."]})
    return key
