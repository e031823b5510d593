"""The operator console never answers bad input with a 500: filters, bulk actions and the change form refuse it."""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth import get_user_model
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules.models import Schedule
from schedules.services import create_schedule
from tests.support import examples

LISTS = ("/admin/schedules/schedule/", "/admin/dispatch/occurrence/", "/admin/dispatch/outboxmessage/")
FILTER_KEYS = (
    "tenant__id__exact",
    "handler",
    "state",
    "state__exact",
    "lane",
    "lane__exact",
    "queue",
    "kind__exact",
    "manual__exact",
    "schedule",
    "scheduled_after",
    "scheduled_before",
    "q",
    "o",
    "p",
)


@pytest.fixture
def console(db) -> Client:
    operator = get_user_model().objects.create_superuser("fuzz", "fuzz@example.com", "operator-password")
    client = Client(HTTP_HOST="localhost")
    client.force_login(operator)
    return client


@pytest.fixture
def schedule(tenant_a) -> Schedule:
    created, _ = create_schedule(
        tenant=tenant_a.tenant,
        data={"name": "fuzzed", "kind": "cron", "cron": "*/5 * * * *", "handler": "noop"},
        actor="test",
    )
    return created


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(
    "query",
    [
        {"tenant__id__exact": "abc"},
        {"tenant__id__exact": "99999999999999999999999"},
        {"tenant__id__exact": "\u00b2"},  # a digit to str.isdigit(), not to int()
        {"q": "\u00b2"},
        {"handler": "no\x00op"},
        {"state": "act\x00ive"},
        {"state__exact": "\x00"},
        {"lane": "str\x00ict"},
        {"q": "\x00"},
        {"p": "-1"},
        {"o": "abc"},
        {"scheduled_after": "not a time"},
        {"scheduled_after": "now-999999d"},
        {"scheduled_before": "0001-01-01T00:00:00+05:00"},
        {"schedule": "not-a-uuid"},
    ],
)
def test_a_bad_filter_value_is_refused_or_ignored_never_a_500(console, path, query):
    response = console.get(path, query)
    assert response.status_code < 500, (path, query)


@pytest.mark.parametrize("field", ["run_at", "anchor_at", "start_at", "end_at"])
@pytest.mark.parametrize("value", ["2026-12-06", "x", "2026-12-06T09:00:00Z", "\u00b2"])
def test_the_add_page_takes_any_starting_value_in_its_query_string_without_a_500(console, field, value):
    assert console.get("/admin/schedules/schedule/add/", {field: value}).status_code == 200, (field, value)


def test_the_token_admin_of_the_public_schema_is_not_offered(console):
    """Tokens live in each tenant's schema; the public schema has no token table to list."""
    assert console.get("/admin/authtoken/tokenproxy/").status_code == 404
    assert b"authtoken/tokenproxy" not in console.get("/admin/").content


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "", "\x00", "1' OR '1'='1"])
def test_a_bulk_action_with_a_malformed_id_is_refused_with_a_message(console, schedule, bad_id):
    response = console.post(
        "/admin/schedules/schedule/",
        {"action": "pause_schedules", ACTION_CHECKBOX_NAME: [str(schedule.pk), bad_id]},
        follow=True,
    )
    assert response.status_code < 500
    schedule.refresh_from_db()
    assert schedule.state == "active", "nothing done on a request that named a malformed id"


def change_form(schedule: Schedule, **overrides: str) -> dict[str, str]:
    data = {
        "seen_version": str(schedule.version),
        "name": schedule.name,
        "kind": schedule.kind,
        "cron": schedule.cron or "",
        "run_at": "",
        "timezone": schedule.timezone,
        "lane": schedule.lane,
        "flexible_window_seconds": str(schedule.flexible_window_seconds),
        "priority": str(schedule.priority),
        "handler": schedule.handler,
        "payload": "{}",
        "misfire_policy": schedule.misfire_policy,
        "max_lateness_seconds": str(schedule.max_lateness_seconds),
        "catchup_limit": str(schedule.catchup_limit),
        "overlap_policy": schedule.overlap_policy,
        "max_attempts": str(schedule.max_attempts),
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    "payload",
    [
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a": 1e999}',
        '{"a": -1e999}',
        "[" * 3000 + "]" * 3000,
        '{"a": ' + "[" * 3000 + "]" * 3000 + "}",
        '{"a": "\\ud800"}',
        '{"a": "\\u0000"}',
        "not json",
        "[]",
        "",
    ],
)
def test_a_payload_the_api_refuses_is_a_form_error_in_the_console_too(console, schedule, payload):
    response = console.post(f"/admin/schedules/schedule/{schedule.pk}/change/", change_form(schedule, payload=payload))
    assert response.status_code == 200, "the form is shown again with its errors"
    assert b"errorlist" in response.content
    schedule.refresh_from_db()
    assert schedule.version == 1 and schedule.payload == {}


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(FILTER_KEYS),
    value=st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(["\x00", "-1", "1e999"]),
    path=st.sampled_from(LISTS),
)
def test_no_filter_value_on_any_list_is_a_500(console, key, value, path):
    assert console.get(path, {key: value}).status_code < 500, (path, key, value)


# --- the console's own views: preview, operations, backfill, replay, token ------------------------------------------

PREVIEW_URL = "/admin/schedules/schedule/preview/"
PREVIEW_KEYS = ("kind", "cron", "run_at", "timezone", "after", "count", "lane", "misfire_policy", "priority", "name")
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.dictionaries(st.sampled_from(PREVIEW_KEYS), JSON_VALUES | st.sampled_from(["* * * * *", "cron", "once"]))
)
def test_no_preview_body_is_a_500(console, body):
    response = console.post(PREVIEW_URL, json.dumps(body), content_type="application/json")
    assert response.status_code in (200, 400), (body, response.content[:300])
    assert response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00", b"{", b'{"kind": "cron", "cron": "\\u0000"}', b'{"kind": "cron", "cron": "\\ud800"}', b"[" * 5000],
)
def test_a_malformed_preview_body_is_a_400(console, raw):
    response = console.post(PREVIEW_URL, raw, content_type="application/json")
    assert response.status_code == 400, response.content[:300]


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "1' OR '1'='1", "%00"])
@pytest.mark.parametrize(
    "suffix",
    ["operate/pause/", "operate/trigger/", "operate/explode/", "backfill/"],
)
def test_a_schedule_operation_on_a_bad_id_is_refused_never_a_500(console, bad_id, suffix):
    for method in (console.get, console.post):
        assert method(f"/admin/schedules/schedule/{bad_id}/{suffix}").status_code < 500


@pytest.mark.parametrize(
    "path",
    [
        "/admin/dispatch/occurrence/{bad}/replay/",
        "/admin/dispatch/occurrence/{bad}/resolve/",
        "/admin/dispatch/occurrence/{bad}/change/",
        "/admin/dispatch/attempt/{bad}/change/",
        "/admin/tenants/tenant/{bad}/token/",
    ],
)
@pytest.mark.parametrize("bad", ["not-an-id", "99999999999999999999999", "00000000-0000-0000-0000-000000000000"])
def test_a_dispatch_or_tenant_view_on_a_bad_id_is_refused_never_a_500(console, tenants, path, bad):
    for method in (console.get, console.post):
        assert method(path.format(bad=bad)).status_code < 500


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    since=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
    | st.sampled_from(["2026-01-01", "0001-01-01T00:00:00+14:00", "9999-12-31 23:59", "now-1h", "2026-02-30 00:00"]),
    until=st.sampled_from(["", "2026-01-02 00:00", "9999-12-31T23:59:59-14:00", "x"]),
)
def test_no_backfill_form_input_is_a_500(console, schedule, since, until):
    response = console.post(f"/admin/schedules/schedule/{schedule.pk}/backfill/", {"since": since, "until": until})
    assert response.status_code in (200, 302), (since, until)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(note=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=600))
def test_no_note_is_a_500(console, schedule, note):
    response = console.post(f"/admin/schedules/schedule/{schedule.pk}/operate/resume/", {"note": note})
    assert response.status_code in (200, 302)
    response = console.post(
        "/admin/schedules/schedule/",
        {"action": "resume_schedules", ACTION_CHECKBOX_NAME: [str(schedule.pk)], "note": note},
    )
    assert response.status_code in (200, 302)
