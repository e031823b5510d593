"""Shared fixtures: two tenant personas (acme and globex) with API clients bound to their own hosts."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from tenants.models import Domain, Tenant
from tenants.services import Provisioned, provision_tenant

TENANT_A = ("acme", "acme.localhost")
TENANT_B = ("globex", "globex.localhost")


def ensure_platform_rows() -> dict[str, Provisioned]:
    """The public tenant with its hosts, and the two personas. Cheap when present.

    Transactional tests (real processes need committed rows) end with a TRUNCATE of the public tables, which
    also removes these rows; the tenant schemas, users and tokens survive it, so re-provisioning is fast and
    returns the same tokens.
    """
    public, _ = Tenant.objects.get_or_create(
        schema_name="public", defaults={"slug": "public", "name": "Platform operators"}
    )
    for index, host in enumerate(settings.SCHEDULER_PUBLIC_HOSTS):
        Domain.objects.get_or_create(domain=host, defaults={"tenant": public, "is_primary": index == 0})
    provisioned = {
        slug: provision_tenant(slug, domain=domain, name=slug.title()) for slug, domain in (TENANT_A, TENANT_B)
    }
    connection.set_schema_to_public()
    return provisioned


@pytest.fixture(scope="session", autouse=True)
def _tenant_schemas(django_db_setup, django_db_blocker) -> None:
    """Create the personas' schemas once per test database: schema creation is the slow part."""
    with django_db_blocker.unblock():
        ensure_platform_rows()


@pytest.fixture
def tenants(db) -> dict[str, Provisioned]:
    return ensure_platform_rows()


@pytest.fixture
def tenant_a(tenants) -> Provisioned:
    return tenants[TENANT_A[0]]


@pytest.fixture
def tenant_b(tenants) -> Provisioned:
    return tenants[TENANT_B[0]]


def api_client_for(provisioned: Provisioned, token: str | None = None) -> APIClient:
    client = APIClient(HTTP_HOST=provisioned.domain)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token or provisioned.token}")
    return client


@pytest.fixture
def api_a(tenant_a) -> APIClient:
    return api_client_for(tenant_a)


@pytest.fixture
def api_b(tenant_b) -> APIClient:
    return api_client_for(tenant_b)


@pytest.fixture(autouse=True)
def _public_schema_after_each_test():
    """A request leaves the connection on its tenant's schema; later ORM use must start from public."""
    yield
    connection.set_schema_to_public()


@pytest.fixture
def cron_body() -> dict:
    return {
        "name": "nightly-report",
        "kind": "cron",
        "cron": "30 2 * * *",
        "timezone": "America/New_York",
        "handler": "noop",
    }
