"""The OpenAPI document says what the API does: errors with bodies, headers, required fields, enums, limits."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator

from core.timerules import zone_names
from dispatch.handlers import registered_names
from dispatch.models import OccurrenceState


@pytest.fixture(scope="module")
def spec() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def operation(spec: dict, method: str, path: str) -> dict:
    return spec["paths"][f"/api/v1/{path}"][method]


def component(spec: dict, name: str) -> dict:
    return spec["components"]["schemas"][name]


def parameters(op: dict, where: str) -> dict[str, dict]:
    return {parameter["name"]: parameter for parameter in op.get("parameters", []) if parameter["in"] == where}


def test_the_schema_validates_without_a_warning(tmp_path):
    # Raises SchemaGenerationError on any warning or error, enum name collisions included.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


def test_component_names_carry_no_hash_suffixes(spec):
    for name in spec["components"]["schemas"]:
        assert not re.search(r"[0-9a-f]{3}Enum$", name), name


@pytest.mark.parametrize(
    ("method", "path", "codes"),
    [
        ("get", "schedules/", {"200", "400", "401", "404", "429"}),
        ("post", "schedules/", {"200", "201", "400", "401", "409", "413", "429"}),
        ("patch", "schedules/{id}/", {"200", "400", "401", "404", "409", "413", "429"}),
        ("delete", "schedules/{id}/", {"200", "400", "401", "404", "429"}),
        ("post", "schedules/{id}/pause/", {"200", "400", "401", "404", "409", "429"}),
        ("post", "schedules/{id}/trigger/", {"202", "400", "401", "404", "409", "429"}),
        ("post", "schedules/preview/", {"200", "400", "401", "413", "429"}),
        ("get", "occurrences/", {"200", "400", "401", "404", "429"}),
        ("post", "occurrences/{occurrence_id}/replay/", {"202", "400", "401", "404", "409", "429"}),
    ],
)
def test_each_operation_documents_the_answers_it_gives_with_a_body(spec, method, path, codes):
    responses = operation(spec, method, path)["responses"]

    assert set(responses) == codes
    for code, response in responses.items():
        assert response["content"]["application/json"]["schema"], code


def test_error_answers_have_their_bodies_and_headers(spec):
    responses = operation(spec, "post", "schedules/")["responses"]

    assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ValidationError"}
    assert responses["409"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert responses["429"]["headers"]["Retry-After"]["required"] is True
    assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert component(spec, "Error")["required"] == ["detail"]


def test_delete_answers_200_with_the_same_body_as_cancel(spec):
    delete = operation(spec, "delete", "schedules/{id}/")["responses"]["200"]
    cancel = operation(spec, "post", "schedules/{id}/cancel/")["responses"]["200"]

    assert delete["content"] == cancel["content"]
    assert set(component(spec, "CancelResult")["properties"]) == {"schedule", "in_flight"}


@pytest.mark.parametrize(("method", "path"), [("post", "schedules/"), ("post", "schedules/{id}/trigger/")])
def test_create_and_trigger_take_an_idempotency_key_header(spec, method, path):
    header = parameters(operation(spec, method, path), "header")["Idempotency-Key"]

    assert not header.get("required", False)
    assert header["schema"] == {"type": "string", "maxLength": 255}


@pytest.mark.parametrize(
    ("path", "name"),
    [("schedules/{id}/", "id"), ("schedules/{id}/pause/", "id"), ("occurrences/{occurrence_id}/", "occurrence_id")],
)
def test_path_ids_are_uuids(spec, path, name):
    for op in spec["paths"][f"/api/v1/{path}"].values():
        assert parameters(op, "path")[name]["schema"] == {"type": "string", "format": "uuid"}


def test_a_create_body_is_one_object_per_kind_with_its_required_fields(spec):
    body = operation(spec, "post", "schedules/")["requestBody"]
    create = component(spec, "ScheduleInput")
    cron, once = component(spec, "CronScheduleInput"), component(spec, "OnceScheduleInput")

    assert body["required"] is True
    assert set(body["content"]) == {"application/json"}
    assert create["discriminator"]["propertyName"] == "kind"
    assert set(cron["required"]) == {"name", "kind", "handler", "cron"}
    assert set(once["required"]) == {"name", "kind", "handler", "run_at"}
    assert cron["properties"]["kind"] == {"type": "string", "const": "cron"}
    assert cron["properties"]["run_at"] == {"type": "null"}
    assert "kind `cron` needs `cron`" in create["description"]
    assert "kind `once` needs `run_at`" in create["description"]


def test_an_interval_body_needs_its_period_and_refuses_the_other_kinds_time_fields(spec):
    create = component(spec, "ScheduleInput")
    interval = component(spec, "IntervalScheduleInput")
    properties = interval["properties"]

    assert create["discriminator"]["mapping"]["interval"] == "#/components/schemas/IntervalScheduleInput"
    assert set(interval["required"]) == {"name", "kind", "handler", "every_seconds"}
    assert properties["every_seconds"]["type"] == "integer"
    assert (properties["every_seconds"]["minimum"], properties["every_seconds"]["maximum"]) == (1, 31_536_000)
    assert {"type": "null"} in properties["anchor_at"]["anyOf"]
    assert properties["run_at"] == {"type": "null"}
    for other in ("CronScheduleInput", "OnceScheduleInput"):
        assert component(spec, other)["properties"]["every_seconds"] == {"type": "null"}
        assert component(spec, other)["properties"]["anchor_at"] == {"type": "null"}
    assert "kind `interval` needs `every_seconds`" in create["description"]
    assert component(spec, "IntervalPreviewInput")["required"] == ["kind", "every_seconds"]
    schedule = component(spec, "Schedule")["properties"]
    assert schedule["every_seconds"]["type"] == ["integer", "null"] and "anchor_at" in schedule


def test_input_bodies_refuse_unknown_fields(spec):
    for name in [
        "CronScheduleInput",
        "OnceScheduleInput",
        "IntervalScheduleInput",
        "PatchedScheduleInput",
        "CronPreviewInput",
        "IntervalPreviewInput",
    ]:
        assert component(spec, name)["additionalProperties"] is False, name


def test_handler_names_are_an_enum_of_the_registry(spec):
    assert component(spec, "HandlerEnum")["enum"] == registered_names()
    assert {"noop", "log"} <= set(registered_names())


def test_time_zones_are_exactly_the_accepted_names(spec):
    zone = re.compile(component(spec, "TimeZone")["pattern"])

    assert all(zone.fullmatch(name) for name in zone_names())
    assert not zone.fullmatch("Mars/Olympus_Mons")
    assert not zone.fullmatch("localtime")


def test_instants_carry_the_accepted_range(spec):
    run_at = component(spec, "OnceScheduleInput")["properties"]["run_at"]
    pattern = re.compile(run_at["pattern"])

    assert run_at["format"] == "date-time"
    assert "1900" in run_at["description"] and "9000" in run_at["description"]
    assert pattern.fullmatch("2026-12-01T09:00:00Z")
    assert not pattern.fullmatch("9000-01-01T00:00:00Z")
    assert not pattern.fullmatch("1899-12-31T23:59:59Z")


def test_list_filters_are_documented(spec):
    schedules = parameters(operation(spec, "get", "schedules/"), "query")
    occurrences = parameters(operation(spec, "get", "occurrences/"), "query")

    assert set(schedules) == {"state", "handler", "name", "selector", "page"}
    assert set(occurrences) == {"state", "schedule", "scheduled_after", "scheduled_before", "page"}
    assert set(occurrences["state"]["schema"]["enum"]) == set(OccurrenceState.values)
    assert occurrences["schedule"]["schema"] == {"type": "string", "format": "uuid"}
    assert occurrences["scheduled_after"]["schema"]["format"] == "date-time"
    # An empty value is ignored, as if the parameter were not given.
    assert all(parameter["allowEmptyValue"] for parameter in occurrences.values())


def test_a_paginated_answer_may_have_no_next_page(spec):
    page = component(spec, "PaginatedOccurrenceList")["properties"]

    assert page["next"]["type"] == ["string", "null"]
    assert "nullable" not in page["next"]
