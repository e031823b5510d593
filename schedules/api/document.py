"""The OpenAPI document as a whole: drf-spectacular's postprocessing hook (settings SPECTACULAR_SETTINGS) that
finishes what the per-field schemas (schedules/api/schema.py) and the list filters (schedules/api/filters.py) say."""

from __future__ import annotations

import copy
from typing import Any

from schedules.api.filters import OccurrenceFilter, ScheduleFilter

# Headers every answer with that status carries (OpenApiResponse has no headers of its own).
ERROR_HEADERS = {
    "401": {
        "WWW-Authenticate": {
            "required": True,
            "schema": {"type": "string"},
            "description": "`Token`: send `Authorization: Token <key>`.",
        }
    },
    "429": {
        "Retry-After": {
            "required": True,
            "schema": {"type": "integer", "minimum": 1},
            "description": "Seconds to wait before trying again.",
        }
    },
}


def _null_as_type(schema: Any) -> None:
    """OpenAPI 3.0's `nullable: true` as 3.1 says it (DRF's pagination schema still writes the former, which a
    3.1 validator ignores, so `"next": null` would break the documented shape)."""
    if isinstance(schema, list):
        for item in schema:
            _null_as_type(item)
    elif isinstance(schema, dict):
        if schema.pop("nullable", False) and isinstance(schema.get("type"), str):
            schema["type"] = [schema["type"], "null"]
        for value in schema.values():
            _null_as_type(value)


def _ignored_when_empty() -> set[str]:
    """Query parameters that an empty value leaves out (`?state=`): django-filter's filters and the page number
    read "" as not given. Other parameters (a preview's `after`, `count`) refuse it."""
    return {"page", *ScheduleFilter.base_filters, *OccurrenceFilter.base_filters}


def finish(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """Postprocessing hook, after drf-spectacular's enum hook: `nullable` as a type, bodies required, empty list
    filters, and the headers of the error answers."""
    _null_as_type(result.get("components", {}))
    optional_when_empty = _ignored_when_empty()
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if "requestBody" in operation and method != "patch":
                # A create or a preview without a body misses its required fields; a PATCH may send none.
                operation["requestBody"]["required"] = True
            for parameter in operation.get("parameters", []):
                if method == "get" and parameter["in"] == "query" and parameter["name"] in optional_when_empty:
                    parameter["allowEmptyValue"] = True
            for status_code, headers in ERROR_HEADERS.items():
                response = operation.get("responses", {}).get(status_code)
                if response is not None:
                    response.setdefault("headers", {}).update(copy.deepcopy(headers))
    return result
