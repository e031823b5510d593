"""Two tenant personas: acme (A) and globex (B). B never sees, changes or even confirms the existence of A's rows."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from core.choices import ScheduleState
from dispatch.models import Occurrence
from schedules.models import Schedule
from tenants.models import Tenant
from tests.conftest import api_client_for, mark_completed

SCHEDULES = "/api/v1/schedules/"


@pytest.fixture
def schedule_of_a(api_a, cron_body) -> dict:
    response = api_a.post(SCHEDULES, cron_body, format="json")
    assert response.status_code == 201
    return response.json()


def set_quota(provisioned, max_schedules: int) -> None:
    Tenant.objects.filter(pk=provisioned.tenant.pk).update(max_schedules=max_schedules)


# --- authentication across hosts ------------------------------------------------------------------------


def test_a_token_of_tenant_a_on_tenant_b_host_answers_401(tenant_a, tenant_b):
    client = api_client_for(tenant_b, token=tenant_a.token)

    assert client.get(SCHEDULES).status_code == 401


def test_a_token_of_tenant_a_cannot_create_on_tenant_b_host(tenant_a, tenant_b, cron_body):
    before = Schedule.objects.count()
    client = api_client_for(tenant_b, token=tenant_a.token)

    assert client.post(SCHEDULES, cron_body, format="json").status_code == 401
    assert Schedule.objects.count() == before


def test_the_two_tenants_have_different_tokens(tenant_a, tenant_b):
    assert tenant_a.token != tenant_b.token


# --- A's ids on B's host --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("get", ""),
        ("patch", ""),
        ("delete", ""),
        ("post", "pause/"),
        ("post", "resume/"),
        ("post", "cancel/"),
        ("get", "preview/"),
        ("post", "trigger/"),
        ("get", "occurrences/"),
    ],
)
def test_tenant_b_gets_404_for_every_call_on_an_id_of_tenant_a(api_b, schedule_of_a, method, suffix):
    call = getattr(api_b, method)
    kwargs = {"data": {"priority": 9}, "format": "json"} if method == "patch" else {}

    response = call(f"{SCHEDULES}{schedule_of_a['id']}/{suffix}", **kwargs)

    assert response.status_code == 404
    stored = Schedule.objects.get(pk=schedule_of_a["id"])
    assert (stored.state, stored.version, stored.priority) == (ScheduleState.ACTIVE, 1, 0)
    assert not Occurrence.objects.filter(schedule_id=schedule_of_a["id"]).exists()


def test_tenant_b_gets_404_for_an_occurrence_of_tenant_a(api_a, api_b, schedule_of_a):
    occurrence_id = api_a.post(f"{SCHEDULES}{schedule_of_a['id']}/trigger/").json()["occurrence_id"]

    assert api_b.get(f"/api/v1/occurrences/{occurrence_id}/").status_code == 404
    assert api_b.post(f"/api/v1/occurrences/{occurrence_id}/replay/").status_code == 404
    assert api_a.get(f"/api/v1/occurrences/{occurrence_id}/").status_code == 200


def test_rows_of_tenant_a_never_appear_in_tenant_b_list(api_a, api_b, cron_body):
    for n in range(3):
        api_a.post(SCHEDULES, {**cron_body, "name": f"a-{n}"}, format="json")
    mine = api_b.post(SCHEDULES, {**cron_body, "name": "b-only"}, format="json").json()

    listed_by_b = api_b.get(SCHEDULES).json()
    filtered_by_b = api_b.get(SCHEDULES, {"name": "a-0"}).json()

    assert listed_by_b["count"] == 1
    assert [row["id"] for row in listed_by_b["results"]] == [mine["id"]]
    assert filtered_by_b["count"] == 0
    assert api_a.get(SCHEDULES).json()["count"] == 3


def test_tenant_b_cannot_replay_an_idempotent_create_of_tenant_a(api_a, api_b, cron_body):
    mine = api_a.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="k-1").json()

    theirs = api_b.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")

    assert theirs.status_code == 201
    assert theirs.json()["id"] != mine["id"]
    assert Schedule.objects.get(pk=theirs.json()["id"]).tenant.slug == "globex"


# --- hosts ----------------------------------------------------------------------------------------------


def test_an_unknown_tenant_host_answers_404(tenant_a):
    client = APIClient(HTTP_HOST="nobody.localhost")
    client.credentials(HTTP_AUTHORIZATION=f"Token {tenant_a.token}")

    response = client.get(SCHEDULES)

    assert response.status_code == 404
    assert "nobody.localhost" in response.json()["detail"]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_the_public_host_does_not_serve_the_tenant_api(tenant_a, host):
    client = APIClient(HTTP_HOST=host)
    client.credentials(HTTP_AUTHORIZATION=f"Token {tenant_a.token}")

    assert client.get(SCHEDULES).status_code == 404


def test_the_public_host_and_a_tenant_host_answer_healthz_with_database_and_broker_ok(tenant_a):
    for host in ("localhost", tenant_a.domain):
        body = APIClient(HTTP_HOST=host).get("/healthz").json()

        # No materializer or relay runs in this test: the platform is degraded, its backends answer.
        assert (body["database"], body["broker"], body["status"]) == ("ok", "ok", "degraded")


def test_the_openapi_schema_is_served_on_a_tenant_host(tenant_a):
    response = APIClient(HTTP_HOST=tenant_a.domain).get("/api/v1/schema/", {"format": "json"})

    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert "/api/v1/schedules/" in schema["paths"]
    assert "/api/v1/schedules/{id}/trigger/" in schema["paths"]
    assert "/api/v1/occurrences/{occurrence_id}/replay/" in schema["paths"]


def test_the_interactive_docs_are_served_on_a_tenant_host(tenant_a):
    response = APIClient(HTTP_HOST=tenant_a.domain).get("/api/v1/docs/")

    assert response.status_code == 200
    assert b"swagger" in response.content.lower()


# --- quotas ---------------------------------------------------------------------------------------------


def test_the_schedule_after_the_quota_answers_429_with_retry_after(api_a, tenant_a, cron_body):
    set_quota(tenant_a, 2)
    for n in range(2):
        assert api_a.post(SCHEDULES, {**cron_body, "name": f"q-{n}"}, format="json").status_code == 201

    response = api_a.post(SCHEDULES, {**cron_body, "name": "q-2"}, format="json")

    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) > 0
    assert "quota" in response.json()["detail"]
    assert Schedule.objects.filter(tenant=tenant_a.tenant).count() == 2


def test_a_paused_schedule_still_counts_against_the_quota(api_a, tenant_a, cron_body):
    set_quota(tenant_a, 2)
    first = api_a.post(SCHEDULES, {**cron_body, "name": "q-0"}, format="json").json()
    api_a.post(SCHEDULES, {**cron_body, "name": "q-1"}, format="json")

    api_a.post(f"{SCHEDULES}{first['id']}/pause/")

    assert api_a.post(SCHEDULES, {**cron_body, "name": "q-2"}, format="json").status_code == 429


def test_a_canceled_schedule_frees_its_quota_slot(api_a, tenant_a, cron_body):
    set_quota(tenant_a, 2)
    first = api_a.post(SCHEDULES, {**cron_body, "name": "q-0"}, format="json").json()
    api_a.post(SCHEDULES, {**cron_body, "name": "q-1"}, format="json")

    api_a.post(f"{SCHEDULES}{first['id']}/cancel/")

    assert api_a.post(SCHEDULES, {**cron_body, "name": "q-2"}, format="json").status_code == 201


def test_the_quota_of_tenant_a_does_not_limit_tenant_b(api_a, api_b, tenant_a, cron_body):
    set_quota(tenant_a, 1)
    api_a.post(SCHEDULES, cron_body, format="json")

    assert api_a.post(SCHEDULES, cron_body, format="json").status_code == 429
    assert api_b.post(SCHEDULES, cron_body, format="json").status_code == 201


def test_an_idempotent_retry_at_a_full_quota_returns_the_existing_schedule(api_a, tenant_a, cron_body):
    set_quota(tenant_a, 1)
    first = api_a.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="retry")

    again = api_a.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="retry")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


def test_reactivating_a_completed_one_off_at_a_full_quota_answers_429(api_a, tenant_a, cron_body):
    set_quota(tenant_a, 1)
    once = api_a.post(
        SCHEDULES, {"name": "once", "kind": "once", "run_at": "2030-01-01T00:00:00Z", "handler": "noop"}, format="json"
    ).json()
    # The materializer completes a one-off that fired; it then no longer counts against the quota.
    mark_completed(once["id"])
    assert api_a.post(SCHEDULES, cron_body, format="json").status_code == 201

    response = api_a.patch(f"{SCHEDULES}{once['id']}/", {"run_at": "2031-01-01T00:00:00Z"}, format="json")

    assert response.status_code == 429
    assert "Retry-After" in response.headers
    stored = Schedule.objects.get(pk=once["id"])
    assert (stored.state, stored.version) == (ScheduleState.COMPLETED, 1)
    assert Schedule.objects.filter(tenant=tenant_a.tenant).counted_by_quota().count() == 1


def test_reactivating_a_completed_one_off_with_a_free_slot_makes_it_active(api_a, tenant_a):
    set_quota(tenant_a, 1)
    once = api_a.post(
        SCHEDULES, {"name": "once", "kind": "once", "run_at": "2030-01-01T00:00:00Z", "handler": "noop"}, format="json"
    ).json()
    mark_completed(once["id"])

    response = api_a.patch(f"{SCHEDULES}{once['id']}/", {"run_at": "2031-01-01T00:00:00Z"}, format="json")

    assert response.status_code == 200
    assert (response.json()["state"], response.json()["next_run_at"]) == ("active", "2031-01-01T00:00:00Z")


def test_an_update_of_an_active_schedule_at_a_full_quota_is_allowed(api_a, tenant_a, cron_body):
    set_quota(tenant_a, 1)
    created = api_a.post(SCHEDULES, cron_body, format="json").json()

    response = api_a.patch(f"{SCHEDULES}{created['id']}/", {"priority": 4}, format="json")

    assert response.status_code == 200
    assert response.json()["version"] == 2


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/api/v1/schedules/", "payload__customer=c-42"),
        ("/api/v1/schedules/", "search=report"),
        ("/api/v1/occurrences/", "tenant=2"),
        ("/api/v1/calendars/", "name=x"),
        ("/api/v1/tokens/", "scope=read"),
    ],
)
def test_a_list_refuses_a_query_parameter_it_does_not_know(api_a, path, query):
    response = api_a.get(f"{path}?{query}")

    assert response.status_code == 400, response.content
    assert query.split("=")[0] in response.json()


def test_a_list_takes_its_filters_and_page(api_a):
    assert api_a.get("/api/v1/schedules/?state=active&name=x&handler=log&page=1").status_code == 200
    assert api_a.get("/api/v1/occurrences/?state=dead&scheduled_after=2026-01-01T00:00:00Z").status_code == 200


@pytest.mark.parametrize("host", ["\\w,!?", "a b", "acme.localhost:abc", "[::1", ""])
def test_a_host_header_that_names_no_host_is_a_json_404(db, host):
    response = Client(HTTP_HOST=host).delete("/api/v1/calendars/x/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert "Host header" in response.json()["detail"]
