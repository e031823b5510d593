"""API request rates: a budget per token, a ceiling per tenant, and a per-address budget for requests without a valid
token that never reaches a tenant's or a token's budget. Every refusal is a 429 with Retry-After."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from schedules.api.throttles import TokenRateThrottle
from tenants.credentials.tokens import issue_token
from tests.conftest import api_client_for

SCHEDULES = "/api/v1/schedules/"
SCHEMA = "/api/v1/schema/"
DOCS = "/api/v1/docs/"


def rates(**scopes: str) -> override_settings:
    """The API settings with some throttle rates replaced (scopes: token, tenant, anon)."""
    current = settings.REST_FRAMEWORK
    return override_settings(
        REST_FRAMEWORK={**current, "DEFAULT_THROTTLE_RATES": {**current["DEFAULT_THROTTLE_RATES"], **scopes}}
    )


@pytest.fixture(autouse=True)
def _fresh_counters(db):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM api_rate_counter")
    yield


def anonymous(host: str) -> APIClient:
    return APIClient(HTTP_HOST=host)


def second_token(tenant_a) -> str:
    """Another token of tenant A (in A's schema)."""
    key = issue_token(tenant_a.tenant, name="reporting", scope="write", actor="test", now=timezone.now()).key
    connection.set_schema_to_public()
    return key


def assert_throttled(response) -> None:
    assert response.status_code == 429, response.content
    assert 1 <= int(response.headers["Retry-After"]) <= 60


def test_a_request_spends_one_statement_on_its_budgets_and_every_web_process_sees_the_count(api_a):
    """The token's and the tenant's counts are rows of api_rate_counter (PostgreSQL), one upsert each."""
    with CaptureQueriesContext(connection) as queries:
        assert api_a.get(SCHEDULES).status_code == 200

    counted = [q["sql"] for q in queries.captured_queries if "api_rate_counter" in q["sql"]]
    assert len(counted) == 2 and not [q for q in queries.captured_queries if "scheduler_cache" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, count FROM api_rate_counter ORDER BY key")
        rows = cursor.fetchall()
    assert [key.split(":")[0] for key, _ in rows] == ["tenant", "token"] and {count for _, count in rows} == {1}


class Probe(TokenRateThrottle):
    """The token budget under one fixed key, for requests without a request."""

    def get_cache_key(self, request, view):
        return self.key_for("probe")


@pytest.mark.django_db(transaction=True)
def test_parallel_requests_never_pass_a_budget_together():
    """150 requests at once against a budget of 50: exactly 50 pass (DRF's read-then-write let 94 through)."""
    barrier = threading.Barrier(30)

    def spend(_: int) -> list[bool]:
        barrier.wait()
        try:
            return [Probe().allow_request(None, None) for _ in range(5)]
        finally:
            connection.close()

    try:
        with rates(token="50/min"), ThreadPoolExecutor(max_workers=30) as pool:
            passed = sum(sum(results) for results in pool.map(spend, range(30)))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM api_rate_counter")

    assert passed == 50


def test_anonymous_floods_never_make_a_valid_tokens_request_429(api_a, tenant_a):
    stranger = anonymous(tenant_a.domain)
    with rates(anon="3/min", token="5/min", tenant="5/min"):
        answers = [stranger.get(SCHEMA).status_code for _ in range(4)]
        answers += [stranger.get(SCHEDULES, HTTP_AUTHORIZATION="Token not-a-token").status_code for _ in range(3)]
        answers += [stranger.get(SCHEDULES).status_code for _ in range(3)]

        assert answers[:3] == [200, 200, 200]
        assert set(answers[3:]) == {429}
        # The same address, now with the tenant's token: its budget and the tenant's are untouched.
        assert [api_a.get(SCHEDULES).status_code for _ in range(5)] == [200] * 5
        assert_throttled(api_a.get(SCHEDULES))


def test_two_tokens_of_one_tenant_have_separate_budgets(api_a, tenant_a):
    reporting = api_client_for(tenant_a, token=second_token(tenant_a))
    with rates(token="2/min", tenant="100/min"):
        assert [api_a.get(SCHEDULES).status_code for _ in range(2)] == [200, 200]
        assert_throttled(api_a.get(SCHEDULES))

        assert [reporting.get(SCHEDULES).status_code for _ in range(2)] == [200, 200]
        assert_throttled(reporting.get(SCHEDULES))


def test_the_tenant_ceiling_counts_only_requests_its_tokens_admitted(api_a, tenant_a):
    reporting = api_client_for(tenant_a, token=second_token(tenant_a))
    with rates(token="2/min", tenant="3/min"):
        # Two admitted, five refused by the token's own budget: the refusals spend nothing of the tenant's.
        assert [api_a.get(SCHEDULES).status_code for _ in range(7)] == [200, 200] + [429] * 5

        assert reporting.get(SCHEDULES).status_code == 200
        # Three admitted across the tenant's tokens: the ceiling is reached.
        assert_throttled(reporting.get(SCHEDULES))


def test_one_tenant_at_its_ceiling_leaves_the_other_tenants_budget_alone(api_a, api_b):
    with rates(token="2/min", tenant="2/min"):
        for _ in range(2):
            api_a.get(SCHEDULES)
        assert_throttled(api_a.get(SCHEDULES))

        assert api_b.get(SCHEDULES).status_code == 200


def test_bad_or_missing_tokens_answer_401_until_their_address_budget_is_spent(tenant_a):
    stranger = anonymous(tenant_a.domain)
    with rates(anon="2/min"):
        assert stranger.get(SCHEDULES, HTTP_AUTHORIZATION="Token not-a-token").status_code == 401
        assert stranger.get(SCHEDULES).status_code == 401

        guessed = stranger.get(SCHEDULES, HTTP_AUTHORIZATION="Token another-guess")
        assert_throttled(guessed)
        assert_throttled(stranger.get(SCHEDULES))


def test_the_anonymous_budget_is_per_client_address(tenant_a, tenant_b):
    with rates(anon="2/min"):
        first = anonymous(tenant_a.domain)
        for _ in range(2):
            assert first.get(DOCS, REMOTE_ADDR="198.51.100.1").status_code == 200
        assert_throttled(first.get(SCHEMA, REMOTE_ADDR="198.51.100.1"))
        # The budget is the address's on every tenant host, not a host's.
        assert_throttled(anonymous(tenant_b.domain).get(SCHEMA, REMOTE_ADDR="198.51.100.1"))

        assert first.get(SCHEMA, REMOTE_ADDR="198.51.100.2").status_code == 200


def test_ipv6_clients_are_counted_per_64_network(tenant_a):
    client = anonymous(tenant_a.domain)
    with rates(anon="2/min"):
        assert client.get(SCHEMA, REMOTE_ADDR="2001:db8:1:2::1").status_code == 200
        assert client.get(SCHEMA, REMOTE_ADDR="2001:db8:1:2::ffff").status_code == 200
        assert_throttled(client.get(SCHEMA, REMOTE_ADDR="2001:db8:1:2:aaaa::7"))

        assert client.get(SCHEMA, REMOTE_ADDR="2001:db8:1:3::1").status_code == 200


def test_x_forwarded_for_is_ignored_unless_proxies_are_trusted(tenant_a):
    client = anonymous(tenant_a.domain)
    with rates(anon="2/min"):
        for index in range(2):
            assert client.get(SCHEMA, HTTP_X_FORWARDED_FOR=f"203.0.113.{index}").status_code == 200
        # A new made-up address per request buys nothing: the client is REMOTE_ADDR.
        assert_throttled(client.get(SCHEMA, HTTP_X_FORWARDED_FOR="203.0.113.99"))


def test_behind_a_trusted_proxy_the_address_it_saw_is_the_client(tenant_a):
    client = anonymous(tenant_a.domain)
    with rates(anon="2/min"), override_settings(SCHEDULER_NUM_PROXIES=1):
        # Our proxy appends what it saw (last entry); anything left of it is the client's own claim.
        for spoofed in ("10.0.0.1", "10.0.0.2"):
            forwarded = f"{spoofed}, 203.0.113.7"
            assert client.get(SCHEMA, HTTP_X_FORWARDED_FOR=forwarded).status_code == 200
        assert_throttled(client.get(SCHEMA, HTTP_X_FORWARDED_FOR="10.0.0.3, 203.0.113.7"))

        assert client.get(SCHEMA, HTTP_X_FORWARDED_FOR="203.0.113.8").status_code == 200


def test_a_throttled_token_is_told_how_long_to_wait(api_a):
    with rates(token="1/hour"):
        assert api_a.get(SCHEDULES).status_code == 200

        refused = api_a.get(SCHEDULES)

    assert refused.status_code == 429
    assert 3500 <= int(refused.headers["Retry-After"]) <= 3600
    assert "detail" in refused.json()


def test_the_default_rates_come_from_the_settings():
    configured = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]

    assert configured == {
        "token": settings.SCHEDULER_API_RATE,
        "tenant": settings.SCHEDULER_API_TENANT_RATE,
        "anon": settings.SCHEDULER_API_ANON_RATE,
    }
    assert settings.REST_FRAMEWORK["NUM_PROXIES"] == settings.SCHEDULER_NUM_PROXIES
