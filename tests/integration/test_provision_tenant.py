"""`manage.py provision_tenant`: one JSON line, idempotent, clear errors, quotas applied."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tenants.models import Domain, Tenant
from tests.conftest import api_client_for
from tests.integration.processes import run_manage

# Unique to this module: creating a tenant creates (and migrates) a schema, so the suite makes just this one.
NEW_SLUG = "initech-provision"
NEW_HOST = "initech-provision.localhost"


def provision(*args: str) -> dict:
    out = StringIO()
    call_command("provision_tenant", *args, stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    return json.loads(lines[0])


def test_provisioning_a_new_tenant_prints_one_json_line_and_its_token_works(db):
    printed = provision(NEW_SLUG, "--domain", NEW_HOST, "--name", "Initech", "--max-schedules", "3")

    assert set(printed) == {"tenant", "domain", "token"}
    assert printed["tenant"] == NEW_SLUG
    assert printed["domain"] == NEW_HOST
    tenant = Tenant.objects.get(slug=NEW_SLUG)
    assert tenant.name == "Initech"
    assert tenant.max_schedules == 3
    assert tenant.schema_name == "t_initech_provision"
    assert Domain.objects.get(domain=NEW_HOST).tenant == tenant

    again = provision(NEW_SLUG, "--domain", NEW_HOST)

    # Keys are stored as digests only: a second run issues a new one, and the first keeps working.
    assert {**again, "token": None} == {**printed, "token": None} and again["token"] != printed["token"]
    assert Tenant.objects.filter(slug=NEW_SLUG).count() == 1
    connection.set_schema_to_public()
    for key in (printed["token"], again["token"]):
        client = api_client_for(type("Provisioned", (), {"domain": NEW_HOST, "token": key})())
        response = client.get("/api/v1/schedules/")
        assert response.status_code == 200
        assert response.json()["count"] == 0


def test_re_provisioning_an_existing_tenant_issues_a_new_token_and_keeps_the_old_one(tenant_a):
    printed = provision("acme", "--domain", tenant_a.domain)

    assert {**printed, "token": None} == {"tenant": "acme", "domain": "acme.localhost", "token": None}
    connection.set_schema_to_public()
    for key in (printed["token"], tenant_a.token):
        assert api_client_for(tenant_a, key).get("/api/v1/schedules/").status_code == 200


def test_re_provisioning_applies_the_quota_options_given(tenant_a):
    provision(
        "acme",
        "--domain",
        tenant_a.domain,
        "--max-schedules",
        "7",
        "--max-fires-per-second",
        "11",
        "--max-running",
        "13",
        "--max-catchup-per-minute",
        "17",
        "--max-retries-per-minute",
        "19",
        "--fairness-weight",
        "3",
    )

    tenant = Tenant.objects.get(slug="acme")
    assert (
        tenant.max_schedules,
        tenant.max_fires_per_second,
        tenant.max_running,
        tenant.max_catchup_per_minute,
        tenant.max_retries_per_minute,
        tenant.fairness_weight,
    ) == (7, 11, 13, 17, 19, 3)


def test_a_retry_budget_of_zero_means_unlimited_and_is_accepted(tenant_a):
    Tenant.objects.filter(slug="acme").update(max_retries_per_minute=5)

    provision("acme", "--domain", tenant_a.domain, "--max-retries-per-minute", "0")

    assert Tenant.objects.get(slug="acme").max_retries_per_minute == 0


def test_re_provisioning_without_quota_options_keeps_the_quotas(tenant_a):
    Tenant.objects.filter(slug="acme").update(max_schedules=42)

    provision("acme", "--domain", tenant_a.domain)

    assert Tenant.objects.get(slug="acme").max_schedules == 42


def test_a_second_domain_for_an_existing_tenant_is_added_but_not_primary(tenant_a):
    printed = provision("acme", "--domain", "acme-alt.localhost")

    assert printed["token"].startswith("sch_")
    alternate = Domain.objects.get(domain="acme-alt.localhost")
    assert alternate.tenant.slug == "acme"
    assert not alternate.is_primary
    connection.set_schema_to_public()
    client = api_client_for(type("Provisioned", (), {"domain": "acme-alt.localhost", "token": tenant_a.token})())
    assert client.get("/api/v1/schedules/").status_code == 200


def test_the_domain_is_normalised_to_lowercase(tenant_a):
    printed = provision("acme", "--domain", "  ACME.localhost ")

    assert printed["domain"] == "acme.localhost"
    assert Domain.objects.filter(domain__iexact="acme.localhost").count() == 1


@pytest.mark.parametrize("slug", ["Acme", "1acme", "ac_me", "public", "", "a" * 41, "acme corp"])
def test_a_bad_slug_is_a_command_error_naming_the_slug_rule(db, slug):
    with pytest.raises(CommandError, match=r"slug|reserved"):
        provision(slug, "--domain", "bad-slug.localhost")

    assert not Domain.objects.filter(domain="bad-slug.localhost").exists()


@pytest.mark.parametrize("domain", ["not a host", "-acme.localhost", "acme..localhost", "acme.localhost/api", ""])
def test_a_bad_domain_is_a_command_error(tenant_a, domain):
    with pytest.raises(CommandError, match="domain"):
        provision("acme", "--domain", domain)


def test_a_domain_owned_by_another_tenant_is_a_command_error_naming_the_owner(tenant_a, tenant_b):
    with pytest.raises(CommandError, match="globex"):
        provision("acme", "--domain", tenant_b.domain)

    assert Domain.objects.get(domain=tenant_b.domain).tenant.slug == "globex"


def test_the_public_host_cannot_be_given_to_a_tenant(tenant_a):
    with pytest.raises(CommandError, match="public"):
        provision("acme", "--domain", "localhost")


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_quota_below_one_is_a_command_error(tenant_a, value):
    before = Tenant.objects.get(slug="acme").max_schedules

    with pytest.raises(CommandError, match="max_schedules"):
        provision("acme", "--domain", tenant_a.domain, "--max-schedules", value)

    assert Tenant.objects.get(slug="acme").max_schedules == before


@pytest.mark.parametrize(
    ("option", "field"), [("--max-schedules", "max_schedules"), ("--fairness-weight", "fairness_weight")]
)
def test_a_quota_too_large_for_its_column_is_a_command_error_not_a_database_error(tenant_a, option, field):
    before = Tenant.objects.get(slug="acme").max_schedules

    with pytest.raises(CommandError, match=field):
        provision("acme", "--domain", tenant_a.domain, option, str(2**40))

    assert Tenant.objects.get(slug="acme").max_schedules == before


def test_a_name_too_long_for_its_column_is_a_command_error(tenant_a):
    before = Tenant.objects.get(slug="acme").name

    with pytest.raises(CommandError, match="name"):
        provision("acme", "--domain", tenant_a.domain, "--name", "N" * 201)

    assert Tenant.objects.get(slug="acme").name == before


QUOTA_OPTIONS = [
    ("--max-schedules", "max_schedules", 1),
    ("--max-fires-per-second", "max_fires_per_second", 1),
    ("--max-running", "max_running", 1),
    ("--max-catchup-per-minute", "max_catchup_per_minute", 1),
    ("--max-retries-per-minute", "max_retries_per_minute", 0),
    ("--fairness-weight", "fairness_weight", 1),
]


@pytest.mark.parametrize(("option", "field", "minimum"), QUOTA_OPTIONS)
def test_every_quota_below_its_minimum_is_a_command_error_naming_it(tenant_a, option, field, minimum):
    before = getattr(Tenant.objects.get(slug="acme"), field)

    with pytest.raises(CommandError, match=rf"{field} must be at least {minimum}, got -3"):
        provision("acme", "--domain", tenant_a.domain, option, "-3")

    assert getattr(Tenant.objects.get(slug="acme"), field) == before


@pytest.mark.parametrize(("option", "field", "minimum"), QUOTA_OPTIONS)
@pytest.mark.parametrize("value", ["many", "1.5", ""])
def test_every_non_integer_quota_is_a_command_error_naming_the_option(tenant_a, option, field, minimum, value):
    with pytest.raises(CommandError, match=rf"{option}: invalid int value"):
        provision("acme", "--domain", tenant_a.domain, option, value)


@pytest.mark.parametrize(("value", "exit_code", "message"), [("-1", 1, "at least 0"), ("lots", 2, "invalid int value")])
def test_a_bad_retry_budget_on_the_command_line_is_a_message_not_a_traceback(db, value, exit_code, message):
    done = run_manage("provision_tenant", "acme", "--domain", "acme.localhost", "--max-retries-per-minute", value)

    assert done.returncode == exit_code
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_the_domain_option_is_required(db):
    with pytest.raises(CommandError, match="domain"):
        provision("acme")
