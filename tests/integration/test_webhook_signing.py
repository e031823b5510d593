"""Signed webhook calls (docs/API.md, "Webhook signatures"): every call passes the Standard Webhooks reference
verifier with the tenant's secret, the same webhook-id on every retry, both signatures for a day after a rotation,
and the secret sealed at rest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from standardwebhooks import Webhook, WebhookVerificationError

from core.clock import db_now
from core.sealing import SealBroken, derived_key, unseal
from core.webhook_signatures import ROTATION_OVERLAP
from dispatch.models import OccurrenceState
from tenants.models import WebhookSecret
from tests.conftest import api_client_for
from tests.integration.webhook_target import deliver

SECRET = "/api/v1/webhook-secret/"
ROTATE = "/api/v1/webhook-secret/rotate/"


def verified(secret: str, received) -> object:
    """What the reference library makes of a received call (raises when it does not verify)."""
    headers = {name.lower(): value for name, value in received.headers.items()}
    return Webhook(secret).verify(received.raw, headers)


def test_every_call_verifies_with_the_tenants_secret_and_keeps_its_id_across_retries(
    api_a, tenant, target, webhook_occurrence
):
    secret = api_a.get(SECRET).json()["secret"]
    target.script(503, 200)
    occurrence = webhook_occurrence(tenant, {"url": target.url, "body": {"report": "daily", "é": "ü"}})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT
    occurrence.refresh_from_db()
    assert deliver(occurrence, now=occurrence.available_at) == OccurrenceState.SUCCEEDED

    assert secret.startswith("whsec_")
    assert [verified(secret, call) for call in target.received] == [{"report": "daily", "é": "ü"}] * 2
    assert {call.headers["webhook-id"] for call in target.received} == {str(occurrence.occurrence_id)}


def test_a_call_without_a_body_verifies_too(api_a, tenant, target, webhook_occurrence):
    secret = api_a.get(SECRET).json()["secret"]
    occurrence = webhook_occurrence(tenant, {"url": target.url, "method": "DELETE"})

    assert deliver(occurrence) == OccurrenceState.SUCCEEDED

    (call,) = target.received
    assert call.raw == b""
    # The reference library's verify() also parses the body as JSON, which an empty body is not: its signer says
    # what the signature of this call must be.
    stamp = datetime.fromtimestamp(int(call.headers["webhook-timestamp"]), UTC)
    assert call.headers["webhook-signature"] == Webhook(secret).sign(call.headers["webhook-id"], stamp, "")


def test_another_tenants_secret_or_a_changed_body_does_not_verify(api_a, api_b, tenant, target, webhook_occurrence):
    other = api_b.get(SECRET).json()["secret"]
    own = api_a.get(SECRET).json()["secret"]
    occurrence = webhook_occurrence(tenant, {"url": target.url, "body": {"amount": 10}})
    deliver(occurrence)
    (call,) = target.received
    headers = {k.lower(): v for k, v in call.headers.items()}

    assert own != other
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(call.raw, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(own).verify(call.raw.replace(b"10", b"99"), headers)


def test_after_a_rotation_both_secrets_verify_for_a_day_then_only_the_new_one(
    api_a, tenant, target, webhook_occurrence
):
    old = api_a.get(SECRET).json()["secret"]
    rotated = api_a.post(ROTATE)
    assert rotated.status_code == 200, rotated.content
    new = rotated.json()["secret"]
    assert new != old and api_a.get(SECRET).json()["secret"] == new
    until = rotated.json()["previous_valid_until"]

    deliver(webhook_occurrence(tenant, {"url": target.url, "body": {"n": 1}}))
    during = target.received[-1]
    assert verified(old, during) == verified(new, during) == {"n": 1}
    assert len(during.headers["webhook-signature"].split(" ")) == 2

    # A second rotation within the day would end the oldest secret early: refused, both keep signing.
    again = api_a.post(ROTATE)
    assert again.status_code == 409 and "overlap" in again.json()["detail"]
    assert api_a.get(SECRET).json()["secret"] == new

    # The overlap ends (by PostgreSQL's clock: the row says when).
    WebhookSecret.objects.filter(tenant=tenant).update(previous_until=db_now() - timedelta(seconds=1))
    deliver(webhook_occurrence(tenant, {"url": target.url, "body": {"n": 2}}))
    after = target.received[-1]
    assert verified(new, after) == {"n": 2}
    with pytest.raises(WebhookVerificationError):
        verified(old, after)
    assert until.endswith("Z") and timedelta(hours=24) == ROTATION_OVERLAP


def test_the_secret_is_sealed_at_rest_and_a_wrong_key_cannot_open_it(api_a, tenant, settings):
    secret = api_a.get(SECRET).json()["secret"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(s)::text FROM tenants_webhooksecret s WHERE tenant_id = %s", [tenant.pk])
        stored = cursor.fetchone()[0]
    assert secret not in stored and secret.removeprefix("whsec_") not in stored

    sealed = WebhookSecret.objects.get(tenant=tenant).current
    settings.SCHEDULER_ENCRYPTION_KEYS = [derived_key("another deployment's key")]
    with pytest.raises(SealBroken):
        unseal(sealed)
    # The old key listed second still opens it: keys rotate without a gap.
    settings.SCHEDULER_ENCRYPTION_KEYS = [derived_key("another deployment's key"), derived_key(settings.SECRET_KEY)]
    assert unseal(sealed) == secret


def test_a_read_token_can_neither_read_nor_rotate_the_secret(api_a, tenant_a):
    issued = api_a.post("/api/v1/tokens/", {"name": "viewer", "scope": "read"}, format="json").json()
    reader = api_client_for(tenant_a, token=issued["token"])

    assert reader.get(SECRET).status_code == 403
    assert reader.post(ROTATE).status_code == 403


def test_reseal_moves_every_secret_to_the_first_key_and_refuses_what_no_key_opens(api_a, tenant, settings):
    secret = api_a.get(SECRET).json()["secret"]
    new_key = derived_key("the next key")
    settings.SCHEDULER_ENCRYPTION_KEYS = [new_key, derived_key(settings.SECRET_KEY)]

    call_command("reseal_secrets", stdout=StringIO())

    settings.SCHEDULER_ENCRYPTION_KEYS = [new_key]
    assert unseal(WebhookSecret.objects.get(tenant=tenant).current) == secret
    settings.SCHEDULER_ENCRYPTION_KEYS = [derived_key("a key that never sealed anything")]
    with pytest.raises(CommandError, match="nothing was changed"):
        call_command("reseal_secrets", stdout=StringIO())


def test_rotating_django_secret_key_keeps_secrets_readable_through_its_fallbacks(api_a, tenant, settings):
    secret = api_a.get(SECRET).json()["secret"]
    sealed = WebhookSecret.objects.get(tenant=tenant).current
    settings.SCHEDULER_ENCRYPTION_KEYS = []
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "the-next-secret-key-" + "y" * 40

    assert unseal(sealed) == secret
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(SealBroken):
        unseal(sealed)
