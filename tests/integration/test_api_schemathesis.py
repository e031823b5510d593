"""Schemathesis against the tenant API, in process: every operation of the OpenAPI document, with every check.

The document is drf-spectacular's, generated here exactly as /api/v1/schema/ serves it (the last test holds the two
together): schemathesis needs it when tests are collected, before a test database exists to resolve a tenant's
host. Requests go through the WSGI application as the acme persona, with its Host and its token.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient
from schemathesis.config import SchemathesisConfig

from core.cron_syntax import TimeRuleError, cron_pattern, parse_cron
from dispatch.handlers.webhook import payload_problems as webhook_payload_problems
from scheduler_project.wsgi import application
from schedules.api.serializers import parse_instant
from schedules.calendar_names import MAX_CALENDARS_PER_SCHEDULE
from schedules.calendar_names import NAME_PATTERN as CALENDAR_NAME
from schedules.calendars import create_calendar
from tests.conftest import TENANT_A

SPEC = SchemaGenerator().get_schema(request=None, public=True)
# Examples per operation in the fuzzing phase. The coverage phase adds the cases the schema itself implies (each
# boundary, each missing or mistyped field), whatever this says; the whole file takes about a minute.
MAX_EXAMPLES = 20
schema = schemathesis.openapi.from_dict(
    SPEC, config=SchemathesisConfig.from_dict({"generation": {"max-examples": MAX_EXAMPLES}})
)
schema.app = application
BASE_URL = f"http://{TENANT_A[1]}"


@dataclass
class Credentials:
    """The persona's token, known once the test database exists (the fixture fills it in)."""

    token: str = ""


CREDENTIALS = Credentials()


@schema.auth()
class TenantToken:
    """The API's own scheme (`Authorization: Token <key>`), so the auth checks can leave it out or spoil it."""

    def get(self, case, context) -> str:
        return CREDENTIALS.token

    def set(self, case, data, context) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Token {data}"}


# Three rules that the schema states in words because a pattern cannot carry them at a sensible size. Generated
# input that breaks them is answered with the documented 400, which the positive-data check would report as valid
# input refused; these hooks keep such input out of the generation instead.

CRON = re.compile(cron_pattern())


@schema.hook("filter_body")
def a_cron_that_keeps_the_rules_its_pattern_leaves_out(context, body) -> bool:
    """Ranges ascend, and a day-of-month occurs in a selected month (see schedules.api.schema.CRON_DESCRIPTION)."""
    cron = body.get("cron") if isinstance(body, dict) else None
    if not isinstance(cron, str) or not CRON.fullmatch(cron):
        return True
    try:
        parse_cron(cron.strip())
    except TimeRuleError:
        return False
    return True


@schema.hook("filter_body")
def a_window_that_runs_forward_and_holds_a_one_offs_run_at(context, body) -> bool:
    """end_at is not before start_at, and a one-off's run_at lies between them (see the schema's end_at)."""
    if not isinstance(body, dict):
        return True
    try:
        instants = {key: parse_instant(body[key]) for key in ("start_at", "end_at", "run_at") if body.get(key)}
    except (TypeError, ValueError):
        return True
    start, end, run_at = instants.get("start_at"), instants.get("end_at"), instants.get("run_at")
    if start and end and end < start:
        return False
    if body.get("kind") == "once" and run_at:
        return not ((start and run_at < start) or (end and run_at > end))
    return True


# The tenant's one calendar (the fixture creates it). Three more rules the schema cannot state: the calendar names a
# schedule may give are the tenant's own data, a range ends after it starts, and a webhook needs a URL it can call.
# Generated input (the coverage phase's too, which the hooks above do not see) is brought within them before it is
# sent.
FUZZ_CALENDAR = "fuzz-holidays"


def within_the_rules_a_schema_cannot_state(case) -> None:
    """Calendars the tenant has, ranges that run forward, a token's end in the future, and a webhook payload the
    webhook could call (a URL, checked on create: dispatch/handlers/webhook.py payload_problems); any other handler
    runs any payload."""
    body = case.body
    if not isinstance(body, dict):
        return
    payload = body.get("payload", {})
    if body.get("handler") == "webhook" and isinstance(payload, dict) and webhook_payload_problems(payload):
        body = {**body, "handler": "log"}
    names = body.get("exclude_calendars")
    if (
        isinstance(names, list)
        and 0 < len(names) <= MAX_CALENDARS_PER_SCHEDULE
        and all(isinstance(name, str) and CALENDAR_NAME.fullmatch(name) for name in names)
    ):
        body = {**body, "exclude_calendars": [FUZZ_CALENDAR]}
    ranges = body.get("ranges")
    if isinstance(ranges, list):
        body = {**body, "ranges": [_forward(item) for item in ranges]}
    if "events" in body and isinstance(body.get("url"), str):
        # A notification target's URL follows the webhook's rule (a host name that can be one, no credentials...).
        body = {**body, "url": "https://hooks.example.com/alerts"}
    if "expires_at" in body and "scope" in body:
        # A token ends in the future, at most SCHEDULER_TOKEN_MAX_DAYS ahead: a rule relative to now.
        body = {**body, "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat()}
    case.body = body


def _forward(item):
    try:
        start, end = parse_instant(item["start"]), parse_instant(item["end"])
    except (KeyError, TypeError, ValueError):
        return item
    return item if end > start else {**item, "end": (start + timedelta(hours=1)).isoformat()}


@schema.hook("filter_query").apply_to(path="/api/v1/occurrences/", method="GET")
def a_time_range_that_runs_forward(context, query) -> bool:
    """scheduled_after is not later than scheduled_before: OpenAPI has no rule between two parameters."""
    try:
        return parse_instant(query["scheduled_after"]) <= parse_instant(query["scheduled_before"])
    except (KeyError, TypeError, ValueError):
        return True


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
    within_the_rules_a_schema_cannot_state(case)
    case.call_and_validate(base_url=BASE_URL)


def test_the_fuzzed_schema_is_the_one_the_api_serves(tenant_a):
    response = APIClient(HTTP_HOST=tenant_a.domain).get("/api/v1/schema/", {"format": "json"})

    assert response.status_code == 200
    # Other test modules register handlers of their own after this module built SPEC at import: the handler enum
    # may have grown since, and only that may differ.
    served, fuzzed = response.json(), json.loads(json.dumps(SPEC))
    for document in (served, fuzzed):
        document["components"]["schemas"].pop("HandlerEnum", None)
    assert served == fuzzed
