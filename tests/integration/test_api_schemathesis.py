"""Schemathesis against the tenant API, in process: every operation of the OpenAPI document, with every check.

The document is drf-spectacular's, generated here exactly as /api/v1/schema/ serves it (the last test holds the two
together): schemathesis needs it when tests are collected, before a test database exists to resolve a tenant's
host. Requests go through the WSGI application as the acme persona, with its Host and its token.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections, transaction
from django.utils import timezone
from django_tenants.utils import schema_context
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, settings
from rest_framework.test import APIClient
from schemathesis.config import SchemathesisConfig

from scheduler_project.wsgi import application
from schedules.calendars import create_calendar
from tenants.credentials.models import ApiToken
from tenants.credentials.tokens import digest_of, issue_token
from tests.conftest import TENANT_A

SPEC = SchemaGenerator().get_schema(request=None, public=True)
# Examples per operation in the fuzzing phase, of valid and of invalid data alike ("all"). The coverage phase adds
# the cases the schema itself implies (each boundary, each missing or mistyped field), whatever this says; the
# stateful test chains operations by the links schemathesis infers. The whole file takes about two minutes.
MAX_EXAMPLES = 20
STATEFUL_STEPS = 10
# Operations with rules the schema states in words (in the descriptions below) because no JSON Schema keyword
# carries them: for data that breaks one, the documented 400 naming the field is the right answer, so the check
# that valid data is accepted takes 400 there too. Every other check (a 5xx, an answer outside the schema, invalid
# data accepted, a missing or spoiled token accepted) applies to them as to every operation. No input is filtered
# or adjusted before it is sent.
RULES_IN_WORDS = {
    ("POST", "/api/v1/schedules/"): "cron grammar; window order; calendars the tenant has; the handler's payload",
    ("PATCH", "/api/v1/schedules/{id}/"): "the same, and the fields of the resulting kind",
    ("POST", "/api/v1/schedules/preview/"): "the same as a create",
    ("POST", "/api/v1/calendars/"): "a range ends after it starts",
    ("PATCH", "/api/v1/calendars/{name}/"): "a range ends after it starts",
    ("GET", "/api/v1/occurrences/"): "scheduled_after is not later than scheduled_before",
    ("POST", "/api/v1/tokens/"): "expires_at lies in the future, at most SCHEDULER_TOKEN_MAX_DAYS ahead",
    ("PUT", "/api/v1/notifications/"): "the webhook's URL rule; a selector names each key once with `=`",
    ("GET", "/api/v1/schedules/"): "a selector names each key once with `=`",
    ("GET", "/api/v1/schedules/export/"): "a selector names each key once with `=`",
    ("POST", "/api/v1/schedules/bulk/"): "a selector or ids, not both; a selector names each key once with `=`",
    ("POST", "/api/v1/schedules/apply/"): "each document as a create; names unique; a selector as above",
    ("POST", "/api/v1/schedules/{id}/backfill/"): "since before until, until not later than now",
}
ACCEPTED_FOR_VALID_DATA = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
CONFIG = {
    "base-url": f"http://{TENANT_A[1]}",
    "generation": {"max-examples": MAX_EXAMPLES, "mode": "all"},
    # The chains carry the persona's token on every call (InProcess below); whether a missing or spoiled token is
    # refused is checked on every operation by the test that fuzzes them one by one.
    # Chains of valid calls (invalid data is the other test's, operation by operation): their strategies then stay
    # the same from one chain to the next, which Hypothesis requires.
    "phases": {
        "stateful": {
            "max-steps": STATEFUL_STEPS,
            "generation": {"mode": "positive"},
            "checks": {"ignored_auth": {"enabled": False}},
        }
    },
    "operations": [
        {
            "include-method": method,
            "include-path": path,
            "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED_FOR_VALID_DATA, "400"]}},
        }
        for method, path in RULES_IN_WORDS
    ]
    + [
        {
            # DELETE of a schedule cancels it (docs/API.md): a canceled schedule stays readable with its history
            # and occurrences, so reading it after the DELETE is right, not a use after free.
            "include-path-regex": "^/api/v1/schedules/\\{id\\}/",
            "checks": {"use_after_free": {"enabled": False}},
        }
    ],
}
# A copy: schemathesis adds the links it infers for the stateful phase to the document it is given.
schema = schemathesis.openapi.from_dict(copy.deepcopy(SPEC), config=SchemathesisConfig.from_dict(CONFIG))
schema.app = application
BASE_URL = f"http://{TENANT_A[1]}"


@dataclass
class Credentials:
    """The persona's token and tenant, known once the test database exists (the fixture fills them in)."""

    token: str = ""
    tenant: Any = None


CREDENTIALS = Credentials()


@schema.auth()
class TenantToken:
    """The API's own scheme (`Authorization: Token <key>`), so the auth checks can leave it out or spoil it."""

    def get(self, case, context) -> str:
        return CREDENTIALS.token

    def set(self, case, data, context) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Token {data}"}


# The tenant's one calendar (the fixture creates it), for the examples that name it.
FUZZ_CALENDAR = "fuzz-holidays"


@pytest.fixture
def as_tenant(db, tenant_a, settings):
    """The acme persona, its requests served on the test's own connection.

    The WSGI application runs in this thread, so each request uses the test's connection inside the transaction
    pytest-django rolls back afterwards: every test starts from the same rows, and no TRUNCATE of the whole
    database follows each operation's test (transaction=True would cost seconds per operation). Django's request
    signals would close that connection in the middle of the transaction, so they are detached meanwhile, as
    django.test.Client does.

    The fuzz sends thousands of requests a minute from one address and largely without a token: the rates are
    lifted, and counted in memory instead of the database table, so that no answer becomes a 429 (the throttles
    have tests of their own).
    """
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {scope: "1000000/min" for scope in rates},
    }
    CREDENTIALS.token = tenant_a.token
    CREDENTIALS.tenant = tenant_a.tenant
    create_calendar(tenant=tenant_a.tenant, data={"name": FUZZ_CALENDAR, "dates": ["2030-12-25"]}, actor="fuzz")
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@schema.parametrize()
# The fixture is meant to persist across the examples of one operation: schedules created by earlier examples stay
# (and can meet later ones) until the test's transaction is rolled back.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_api_keeps_to_its_schema(case, as_tenant):
    case.call_and_validate(base_url=BASE_URL)


CALLS: list[tuple[str, str, int]] = []


def token_is_live(key: str) -> bool:
    with schema_context(CREDENTIALS.tenant.schema_name):
        return ApiToken.objects.filter(digest=digest_of(key)).exists()


def test_chains_of_calls_keep_to_the_schema(as_tenant):
    """The stateful phase: a schedule created, then read, changed, paused, previewed, canceled by its id; a token
    issued, then read and revoked; a calendar created, then changed and deleted."""

    class InProcess(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case):
            # Through the WSGI application, as the acme persona (its host, its token): every call and every
            # check's re-send (the auth checks take the header out or spoil it).
            return {"base_url": BASE_URL}

        def setup(self):
            # Each chain starts from the same rows (a savepoint of the test's transaction, rolled back after it):
            # Hypothesis requires a chain replayed to meet what it met the first time.
            self.savepoint = transaction.savepoint()
            self.token = CREDENTIALS.token

        def teardown(self):
            transaction.savepoint_rollback(self.savepoint)
            CREDENTIALS.token = self.token

        def before_call(self, case):
            # A chain may revoke the very token it runs under (DELETE /tokens/{id}/): a new one then carries on.
            if not token_is_live(CREDENTIALS.token):
                CREDENTIALS.token = issue_token(
                    CREDENTIALS.tenant, name="fuzz", scope="write", actor="fuzz", now=timezone.now()
                ).key
            case.headers = {**(case.headers or {}), "Authorization": f"Token {CREDENTIALS.token}"}

        def after_call(self, response, case):
            super().after_call(response, case)
            CALLS.append((case.method, case.path, response.status_code))

    # No shrinking or replay: the chains change the database they run on, so a replayed chain meets other rows
    # (Hypothesis would call that flaky data generation); a failure is reported as it was found.
    InProcess.run(
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            database=None,
            phases=[Phase.generate],
        )
    )
    # The chains reached past creation: something created was then read, changed or deleted by its id.
    followed = {(method, path) for method, path, status in CALLS if "{" in path and 200 <= status < 300}
    assert followed, sorted(set(CALLS))


def test_every_rule_left_to_words_names_an_operation_of_the_schema():
    operations = {(method.upper(), path) for path, item in SPEC["paths"].items() for method in item}
    assert set(RULES_IN_WORDS) <= operations


def test_the_fuzzed_schema_is_the_one_the_api_serves(tenant_a):
    response = APIClient(HTTP_HOST=tenant_a.domain).get("/api/v1/schema/", {"format": "json"})

    assert response.status_code == 200
    # Other test modules register handlers of their own after this module built SPEC at import: the handler enum
    # may have grown since, and only that may differ.
    served, fuzzed = response.json(), json.loads(json.dumps(SPEC))
    for document in (served, fuzzed):
        document["components"]["schemas"].pop("HandlerEnum", None)
    assert served == fuzzed
