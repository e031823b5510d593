"""API tokens (docs/API.md, "Tokens"): issued with a scope and an end, the key shown once and stored only as a
digest; a read token may not write; an expired or revoked key answers 401; versions name the token that acted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django_tenants.utils import schema_context
from rest_framework.authtoken.models import Token

from schedules.models import ScheduleVersion
from tenants.credentials import tokens
from tenants.credentials.models import ApiToken
from tests.conftest import api_client_for

TOKENS = "/api/v1/tokens/"
SCHEDULES = "/api/v1/schedules/"


def issue(api, **body):
    response = api.post(TOKENS, {"name": "ci-deploy", "scope": "write", **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_an_issued_key_is_shown_once_and_stored_only_as_its_digest(api_a, tenant_a):
    issued = issue(api_a, name="reporting", scope="read")
    key = issued["token"]

    assert key.startswith("sch_") and len(key) > 40 and issued["prefix"] == key[:8]
    listed = api_a.get(TOKENS).json()["results"]
    assert "reporting" in [row["name"] for row in listed]
    assert key not in api_a.get(TOKENS).content.decode()
    assert "token" not in api_a.get(f"{TOKENS}{issued['id']}/").json()
    with schema_context(tenant_a.tenant.schema_name), connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(t)::text FROM credentials_apitoken t")
        stored = " ".join(row[0] for row in cursor.fetchall())
        assert key not in stored and key[8:] not in stored
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0
    assert api_client_for(tenant_a, token=key).get(SCHEDULES).status_code == 200


def test_a_read_token_reads_and_previews_but_every_write_is_a_403(api_a, tenant_a, cron_body):
    reader = api_client_for(tenant_a, token=issue(api_a, scope="read")["token"])

    assert reader.get(SCHEDULES).status_code == 200
    assert reader.get(TOKENS).status_code == 200
    preview = reader.post(f"{SCHEDULES}preview/", {**cron_body, "count": 2}, format="json")
    assert preview.status_code == 200, preview.content
    refused = reader.post(SCHEDULES, cron_body, format="json")
    assert refused.status_code == 403 and "read scope" in refused.json()["detail"]
    assert reader.post(TOKENS, {"name": "escalate", "scope": "write"}, format="json").status_code == 403
    own_id = reader.get(TOKENS).json()["results"][-1]["id"]
    assert reader.delete(f"{TOKENS}{own_id}/").status_code == 403


def test_a_revoked_or_expired_key_answers_401(api_a, tenant_a):
    first, second = issue(api_a, name="first"), issue(api_a, name="second")
    assert api_a.delete(f"{TOKENS}{first['id']}/").status_code == 204
    assert api_a.delete(f"{TOKENS}{first['id']}/").status_code == 404

    revoked = api_client_for(tenant_a, token=first["token"]).get(SCHEDULES)
    assert revoked.status_code == 401 and revoked.headers["WWW-Authenticate"] == "Token"
    with schema_context(tenant_a.tenant.schema_name):
        ApiToken.objects.filter(pk=second["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    connection.set_schema_to_public()
    expired = api_client_for(tenant_a, token=second["token"]).get(SCHEDULES)
    assert expired.status_code == 401 and expired.json()["detail"] == "Token expired."


def test_a_token_of_one_tenant_is_unknown_on_another_tenants_host(api_a, tenant_b):
    key = issue(api_a)["token"]

    assert api_client_for(tenant_b, token=key).get(SCHEDULES).status_code == 401


def test_the_version_a_token_writes_names_that_token(api_a, tenant_a, cron_body):
    issued = issue(api_a, name="ci-deploy")
    created = api_client_for(tenant_a, token=issued["token"]).post(SCHEDULES, cron_body, format="json")

    assert created.status_code == 201, created.content
    version = ScheduleVersion.objects.get(schedule_id=created.json()["id"])
    assert version.actor == f"tenant:{tenant_a.tenant.slug}/token:ci-deploy#{issued['id']}"


def test_last_use_is_recorded(api_a, tenant_a):
    issued = issue(api_a)
    assert issued["last_used_at"] is None

    api_client_for(tenant_a, token=issued["token"]).get(SCHEDULES)

    assert api_a.get(f"{TOKENS}{issued['id']}/").json()["last_used_at"] is not None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"expires_at": "2099-01-01T00:00:00Z"}, "expires_at"),
        ({"expires_at": "2027-01-01T00:00:00"}, "expires_at"),
        ({"scope": "admin"}, "scope"),
        ({"name": ""}, "name"),
        ({"name": "line\nbreak"}, "name"),
        ({"name": 5}, "name"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_wrong_field_is_a_400_naming_it(api_a, body, field):
    response = api_a.post(TOKENS, {"name": "ok", "scope": "write", **body}, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()


def test_without_expires_at_a_token_ends_after_the_default_lifetime(api_a, settings):
    issued = issue(api_a)
    ends = timezone.datetime.fromisoformat(issued["expires_at"].replace("Z", "+00:00"))

    expected = timezone.now() + timedelta(days=settings.SCHEDULER_TOKEN_DEFAULT_DAYS)
    assert abs((ends - expected).total_seconds()) < 60


def test_a_tenant_holds_a_bounded_number_of_tokens(api_a, tenant_a, monkeypatch):
    held = len(tokens.tokens_of(tenant_a.tenant))
    monkeypatch.setattr(tokens, "MAX_TOKENS_PER_TENANT", held + 1)
    issue(api_a)

    refused = api_a.post(TOKENS, {"name": "one-more", "scope": "read"}, format="json")

    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1


def test_the_migration_turns_plaintext_keys_into_digests_that_keep_working(tenant_a):
    """credentials migration 0002 on a schema that still holds a plaintext key of rest_framework.authtoken."""
    migration = __import__("tenants.credentials.migrations.0002_tokens_to_digests", fromlist=["keys_to_digests"])
    with schema_context(tenant_a.tenant.schema_name):
        user = get_user_model().objects.create(username="legacy")
        key = Token.objects.create(user=user).key
        migration.keys_to_digests(apps, None)
        assert not Token.objects.exists()
        moved = ApiToken.objects.get(digest=tokens.digest_of(key))
        assert moved.name == "legacy" and moved.scope == "write" and moved.expires_at > timezone.now()
    connection.set_schema_to_public()
    assert api_client_for(tenant_a, token=key).get(SCHEDULES).status_code == 200


def test_a_token_cannot_issue_one_that_outlives_it(api_a, tenant_a):
    ends = timezone.now() + timedelta(days=7)
    short = issue(api_a, name="short-lived", expires_at=ends.isoformat())
    minting = api_client_for(tenant_a, token=short["token"])

    longer = minting.post(
        TOKENS,
        {"name": "longer", "scope": "write", "expires_at": (ends + timedelta(days=1)).isoformat()},
        format="json",
    )
    defaulted = minting.post(TOKENS, {"name": "defaulted", "scope": "read"}, format="json")

    assert longer.status_code == 400 and "issuing token" in longer.json()["expires_at"][0]
    assert defaulted.status_code == 201
    assert defaulted.json()["expires_at"] <= short["expires_at"]


def test_ended_tokens_do_not_count_against_the_bound(api_a, tenant_a, monkeypatch):
    held = len(tokens.tokens_of(tenant_a.tenant))
    monkeypatch.setattr(tokens, "MAX_TOKENS_PER_TENANT", held + 1)
    ended = issue(api_a, name="ended")
    with schema_context(tenant_a.tenant.schema_name):
        ApiToken.objects.filter(pk=ended["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    connection.set_schema_to_public()

    assert api_a.post(TOKENS, {"name": "fresh", "scope": "read"}, format="json").status_code == 201
