"""Webhook signatures in the Standard Webhooks format (https://www.standardwebhooks.com; docs/GUARANTEES.md has the
receiver's recipe), spoken by both planes: the tenant's secret is `whsec_` + base64(key), and a call's
`webhook-signature` is `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")), one per signing key,
space-separated (two during a rotation's overlap)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from datetime import timedelta

SECRET_PREFIX = "whsec_"
KEY_BYTES = 32
# How long the previous secret keeps signing after a rotation.
ROTATION_OVERLAP = timedelta(hours=24)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def key_of(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(keys: list[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header value: one `v1,<base64>` per key, space-separated."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join("v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in keys)
