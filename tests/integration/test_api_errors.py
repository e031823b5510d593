"""Bad input is answered with 400/401/413 and field errors keyed by the field, never with a 500."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from schedules.models import Schedule

SCHEDULES = "/api/v1/schedules/"


@pytest.fixture
def api(api_a) -> APIClient:
    # A 500 must show up as a status code to assert on, not as an exception raised into the test.
    api_a.raise_request_exception = False
    return api_a


def post_raw(api: APIClient, text: str, path: str = SCHEDULES):
    return api.post(path, data=text, content_type="application/json")


def assert_field_error(response, field: str) -> None:
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body, body
    assert isinstance(body[field], list) and body[field], body


# --- malformed bodies -----------------------------------------------------------------------------------


def test_malformed_json_answers_400(api):
    before = Schedule.objects.count()
    response = post_raw(api, '{"name": "x",')

    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]
    assert Schedule.objects.count() == before


def test_a_json_array_body_answers_400(api, cron_body):
    response = post_raw(api, json.dumps([cron_body]))

    assert response.status_code == 400
    assert "non_field_errors" in response.json()


@pytest.mark.parametrize("text", ["null", '"schedule"', "42"])
def test_a_json_scalar_body_answers_400(api, text):
    assert post_raw(api, text).status_code == 400


def test_nan_in_json_answers_400(api):
    assert post_raw(api, '{"name": NaN}').status_code == 400


def test_a_body_nested_beyond_the_depth_limit_answers_400_not_a_recursion_error(api, cron_body):
    deep = "[" * 100_000 + "]" * 100_000

    response = post_raw(api, json.dumps(cron_body)[:-1] + f', "payload": {{"a": {deep}}}}}')

    assert response.status_code == 400
    assert "nested" in response.json()["detail"]


def test_a_payload_nested_a_few_hundred_levels_answers_400(api, cron_body):
    nested = "[" * 900 + "]" * 900

    response = post_raw(api, json.dumps(cron_body)[:-1] + f', "payload": {{"a": {nested}}}}}')

    assert response.status_code == 400


def test_a_deep_payload_sent_as_form_text_answers_400(api):
    form = {"name": "f", "kind": "cron", "cron": "0 * * * *", "handler": "noop", "payload": "[" * 5000 + "]" * 5000}

    response = api.post(SCHEDULES, form)

    assert_field_error(response, "payload")


def test_an_unsupported_media_type_answers_415(api):
    assert api.post(SCHEDULES, data="name=x", content_type="text/plain").status_code == 415


# --- wrong types and unknown fields ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", "high"),
        ("priority", 1.5),
        ("priority", True),
        ("cron", 5),
        ("cron", ["0", "*", "*", "*", "*"]),
        ("name", {"first": "x"}),
        ("name", ""),
        ("kind", "weekly"),
        ("lane", "fast"),
        ("misfire_policy", "retry"),
        ("overlap_policy", "never"),
        ("timezone", 3),
        ("max_attempts", "five"),
        ("handler", None),
    ],
)
def test_a_wrong_type_or_choice_answers_400_keyed_by_the_field(api, cron_body, field, value):
    assert_field_error(api.post(SCHEDULES, {**cron_body, field: value}, format="json"), field)


def test_unknown_fields_are_refused_by_name(api, cron_body):
    response = api.post(SCHEDULES, {**cron_body, "colour": "blue", "retries": 3}, format="json")

    assert response.status_code == 400
    assert response.json() == {"colour": ["Unknown field."], "retries": ["Unknown field."]}


# --- rules of the definition ----------------------------------------------------------------------------


@pytest.mark.parametrize("zone", ["Mars/Olympus", "america/new_york", "../../etc/passwd", "localtime", "UTC+2"])
def test_an_unknown_time_zone_answers_400(api, cron_body, zone):
    assert_field_error(api.post(SCHEDULES, {**cron_body, "timezone": zone}, format="json"), "timezone")


@pytest.mark.parametrize(
    "cron",
    [
        "0 30 2 * * *",  # six fields (seconds)
        "61 * * * *",
        "L",
        "0 0 L-2 * *",  # L takes no range
        "L 0 * * *",  # L in the wrong field
        "0 0 * * L",  # a weekday's L needs the weekday
        "0 0 LW * *",
        "0 0 * * 1#6",
        "@reboot",
        "",
        "   ",
        "* * * *",
        "0 0 31 2 *",  # never fires
        "0 0 ? * MON#2",
    ],
)
def test_a_bad_cron_expression_answers_400(api, cron_body, cron):
    assert_field_error(api.post(SCHEDULES, {**cron_body, "cron": cron}, format="json"), "cron")


def test_an_unknown_handler_answers_400_naming_the_registered_ones(api, cron_body):
    response = api.post(SCHEDULES, {**cron_body, "handler": "rm-rf"}, format="json")

    assert_field_error(response, "handler")
    assert "noop" in response.json()["handler"][0]


@pytest.mark.parametrize("field", ["name", "kind", "handler"])
def test_a_missing_required_field_answers_400(api, cron_body, field):
    del cron_body[field]

    assert_field_error(api.post(SCHEDULES, cron_body, format="json"), field)


def test_all_missing_fields_are_reported_at_once(api):
    response = api.post(SCHEDULES, {}, format="json")

    assert response.status_code == 400
    assert {"name", "kind", "handler"} <= set(response.json())


def test_kind_cron_without_cron_answers_400(api, cron_body):
    del cron_body["cron"]

    assert_field_error(api.post(SCHEDULES, cron_body, format="json"), "cron")


def test_kind_once_without_run_at_answers_400(api):
    body = {"name": "once", "kind": "once", "handler": "noop"}

    assert_field_error(api.post(SCHEDULES, body, format="json"), "run_at")


def test_kind_cron_with_run_at_answers_400(api, cron_body):
    body = {**cron_body, "run_at": "2030-01-01T00:00:00Z"}

    assert_field_error(api.post(SCHEDULES, body, format="json"), "run_at")


@pytest.mark.parametrize(
    "run_at",
    [
        "2030-01-01T09:00:00",  # naive
        "tomorrow at nine",
        "2030-02-30T09:00:00Z",
        "",
        1893488400,
        "0001-01-01T00:00:00+01:00",  # overflows on conversion to UTC
        "9999-12-31T23:59:59-01:00",
    ],
)
def test_a_bad_run_at_answers_400(api, run_at):
    body = {"name": "once", "kind": "once", "handler": "noop", "run_at": run_at}

    assert_field_error(api.post(SCHEDULES, body, format="json"), "run_at")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 101),
        ("priority", -101),
        ("priority", 10**30),
        ("max_attempts", 0),
        ("max_attempts", 101),
        ("flexible_window_seconds", 0),
        ("catchup_limit", -1),
        ("max_lateness_seconds", -5),
    ],
)
def test_an_out_of_range_number_answers_400(api, cron_body, field, value):
    assert_field_error(api.post(SCHEDULES, {**cron_body, field: value}, format="json"), field)


@pytest.mark.parametrize("value", [100, -100])
def test_priority_accepts_both_ends_of_its_range(api, cron_body, value):
    response = api.post(SCHEDULES, {**cron_body, "priority": value}, format="json")

    assert response.status_code == 201
    assert response.json()["priority"] == value


@pytest.mark.parametrize("payload", [[1, 2], "text", 7, True])
def test_a_payload_that_is_not_an_object_answers_400(api, cron_body, payload):
    assert_field_error(api.post(SCHEDULES, {**cron_body, "payload": payload}, format="json"), "payload")


def test_a_payload_over_64_kib_answers_400(api, cron_body):
    before = Schedule.objects.count()
    response = api.post(SCHEDULES, {**cron_body, "payload": {"blob": "x" * (64 * 1024)}}, format="json")

    assert response.status_code in (400, 413)
    if response.status_code == 400:
        assert "payload" in response.json()
    assert Schedule.objects.count() == before


def test_a_payload_just_under_64_kib_is_accepted(api, cron_body):
    payload = {"blob": "x" * (64 * 1024 - 20)}

    assert api.post(SCHEDULES, {**cron_body, "payload": payload}, format="json").status_code == 201


@pytest.mark.parametrize("payload", [{"text": "a\u0000b"}, {"\u0000": 1}])
def test_a_payload_with_a_nul_character_answers_400_not_a_database_error(api, cron_body, payload):
    assert_field_error(api.post(SCHEDULES, {**cron_body, "payload": payload}, format="json"), "payload")


def test_a_payload_with_an_unpaired_surrogate_answers_400_not_a_database_error(api, cron_body):
    text = json.dumps({**cron_body, "payload": {"text": "SURROGATE"}}).replace("SURROGATE", "\\ud800")

    assert_field_error(post_raw(api, text), "payload")


def test_a_payload_with_an_escaped_backslash_u0000_text_is_stored_verbatim(api, cron_body):
    payload = {"text": "\\u0000 is how JSON writes NUL", "emoji": "\U0001f600"}

    response = api.post(SCHEDULES, {**cron_body, "payload": payload}, format="json")

    assert response.status_code == 201
    assert Schedule.objects.get(pk=response.json()["id"]).payload == payload


def test_a_body_over_256_kib_answers_413(api, cron_body):
    before = Schedule.objects.count()
    response = api.post(SCHEDULES, {**cron_body, "payload": {"blob": "x" * (300 * 1024)}}, format="json")

    assert response.status_code == 413
    assert Schedule.objects.count() == before


def test_a_name_over_200_characters_answers_400(api, cron_body):
    assert_field_error(api.post(SCHEDULES, {**cron_body, "name": "n" * 201}, format="json"), "name")


def test_a_name_of_exactly_200_characters_is_accepted(api, cron_body):
    assert api.post(SCHEDULES, {**cron_body, "name": "n" * 200}, format="json").status_code == 201


def test_a_name_with_a_nul_character_answers_400(api, cron_body):
    assert_field_error(api.post(SCHEDULES, {**cron_body, "name": "a\u0000b"}, format="json"), "name")


def test_an_idempotency_key_longer_than_255_characters_answers_400(api, cron_body):
    before = Schedule.objects.count()
    response = api.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="k" * 256)

    assert_field_error(response, "Idempotency-Key")
    assert Schedule.objects.count() == before


def test_an_idempotency_key_with_a_nul_character_answers_400(api, cron_body):
    response = api.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="a\x00b")

    assert_field_error(response, "Idempotency-Key")


def test_a_trigger_key_longer_than_255_characters_answers_400(api, cron_body):
    created = api.post(SCHEDULES, cron_body, format="json").json()

    response = api.post(f"{SCHEDULES}{created['id']}/trigger/", HTTP_IDEMPOTENCY_KEY="k" * 256)

    assert_field_error(response, "Idempotency-Key")


def test_a_non_ascii_idempotency_key_is_accepted_and_honoured(api, cron_body):
    first = api.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="clé-ключ")
    again = api.post(SCHEDULES, cron_body, format="json", HTTP_IDEMPOTENCY_KEY="clé-ключ")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]


# --- verbatim storage of odd but valid text -------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Robert'); DROP TABLE schedules_schedule;--",
        "1' OR '1'='1",
        "informe-diario-ñandú",
        "夜间报告 🌙",
        "שלום",
        "<script>alert(1)</script>",
    ],
)
def test_odd_names_are_stored_and_returned_verbatim(api, cron_body, name):
    response = api.post(SCHEDULES, {**cron_body, "name": name}, format="json")

    assert response.status_code == 201
    assert response.json()["name"] == name
    assert api.get(SCHEDULES, {"name": name}).json()["results"][0]["name"] == name


@pytest.mark.parametrize(
    "query",
    [
        {"name": "x' OR 1=1 --"},
        {"handler": "noop'; DELETE FROM schedules_schedule; --"},
        {"name": "%"},
        {"name": "a\u0000b"},
    ],
)
def test_sql_looking_filters_match_nothing_and_harm_nothing(api, cron_body, query):
    before = Schedule.objects.count()
    api.post(SCHEDULES, cron_body, format="json")

    response = api.get(SCHEDULES, query)

    assert response.status_code in (200, 400)
    if response.status_code == 200:
        assert response.json()["count"] == 0
    assert Schedule.objects.count() == before + 1


# --- authentication -------------------------------------------------------------------------------------


def test_a_request_without_a_token_answers_401(tenant_a):
    client = APIClient(HTTP_HOST=tenant_a.domain)

    response = client.get(SCHEDULES)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Token")


def test_a_request_with_a_bad_token_answers_401(tenant_a):
    client = APIClient(HTTP_HOST=tenant_a.domain)
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)

    assert client.get(SCHEDULES).status_code == 401


@pytest.mark.parametrize("header", ["Token", "Bearer abc", "Token a b"])
def test_a_malformed_authorization_header_answers_401(tenant_a, header):
    client = APIClient(HTTP_HOST=tenant_a.domain)
    client.credentials(HTTP_AUTHORIZATION=header)

    assert client.get(SCHEDULES).status_code == 401


def test_a_create_without_a_token_writes_nothing(tenant_a, cron_body):
    before = Schedule.objects.count()
    client = APIClient(HTTP_HOST=tenant_a.domain)

    assert client.post(SCHEDULES, cron_body, format="json").status_code == 401
    assert Schedule.objects.count() == before


@pytest.mark.parametrize("field", ["kind", "lane", "misfire_policy", "overlap_policy"])
def test_a_choice_given_as_an_unpaired_surrogate_answers_400_not_a_rendering_error(api, cron_body, field):
    text = json.dumps({**cron_body, field: "SURROGATE"}).replace("SURROGATE", "\\ud800")

    response = post_raw(api, text)

    assert_field_error(response, field)
    assert "Must be one of" in response.json()[field][0]


def test_an_unknown_field_named_with_an_unpaired_surrogate_answers_400(api, cron_body):
    text = json.dumps({**cron_body, "SURROGATE": 1}).replace("SURROGATE", "\\ud800")

    response = post_raw(api, text)

    assert response.status_code == 400
    assert list(response.json().values()) == [["Unknown field."]]


# --- JSON types (the API schema's promise) ---------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("name", 5), ("cron", 30), ("handler", 1.5), ("timezone", ["UTC"])])
def test_a_text_field_given_another_json_type_answers_400(api, cron_body, field, value):
    response = api.post(SCHEDULES, {**cron_body, field: value}, format="json")

    assert_field_error(response, field)


@pytest.mark.parametrize(("field", "value"), [("priority", "5"), ("max_attempts", True), ("catchup_limit", 2.5)])
def test_an_integer_field_given_another_json_type_answers_400(api, cron_body, field, value):
    response = api.post(SCHEDULES, {**cron_body, field: value}, format="json")

    assert_field_error(response, field)


def test_an_integer_written_with_a_zero_fraction_is_an_integer(api, cron_body):
    response = api.post(SCHEDULES, {**cron_body, "priority": 5.0}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["priority"] == 5


# --- answers in JSON, whatever failed --------------------------------------------------------------------


def test_a_multipart_body_without_a_boundary_answers_400_in_json(api):
    response = api.post(SCHEDULES, data=b"name=x", content_type="multipart/form-data")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert "detail" in response.json()


@pytest.mark.parametrize("path", ["/api/v1/schedules/0.5/", "/api/v1/occurrences/a.b/replay/", "/api/v2/"])
def test_a_path_no_route_matches_answers_404_in_json(api, path):
    response = api.get(path)

    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}
