"""What the OpenAPI document says beyond what drf-spectacular infers: the error answers, the Idempotency-Key
header, the accepted instants, handler names (an enum) and zone names, the cron syntax, and the rule that a `cron`
schedule needs `cron`, a `once` schedule `run_at` and an `interval` schedule `every_seconds`.

The schema is a contract that the fuzz test (tests/integration/test_api_schemathesis.py) holds the API to, so each
rule here states what the API really accepts: a looser schema lets valid-looking input meet a 400, a stricter one
lets input the schema forbids be accepted. Views import this module, which registers the extensions.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from core.cron_syntax import MAX_CRON_LENGTH
from core.labels import CONTROL_CLASS, KEY_REGEX, KEY_RULE, MAX_LABELS, MAX_VALUE_LENGTH, VALUE_RULE
from core.timerules import EVERY_SECONDS_RANGE, zone_names
from dispatch.services import registered_names
from schedules.api.serializers import EARLIEST_INSTANT, LATEST_INSTANT, MAX_IDEMPOTENCY_KEY_LENGTH
from schedules.json_input import MAX_JSON_DEPTH

# --- text --------------------------------------------------------------------------------------------------

# A string without U+0000: PostgreSQL cannot store it, and the API refuses it in every field and query parameter.
NO_NUL = "^[^\\u0000]*$"
# What str.strip() removes: DRF strips text fields before any rule sees them.
_SPACE = "\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
# A required text field: something besides white space, and no U+0000.
NOT_BLANK = f"^[^\\u0000]*[^\\u0000{_SPACE}][^\\u0000]*$"
BLANK = f"^[{_SPACE}]*$"
# The white space that is no control character: what may stand inside a text whose control characters are refused.
_INNER_SPACE = "\\x20\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"


def query_text(max_length: int) -> dict[str, Any]:
    """A free-text query parameter (a list filter): at most `max_length` characters, no U+0000."""
    return {"type": "string", "maxLength": max_length, "pattern": NO_NUL}


def selector_pattern() -> str:
    """A label selector as core.labels.parse_selector reads it: comma-joined `key=value` / `key!=value`, each part
    stripped of white space, a value without '=', ',' or control characters; or nothing at all."""
    value = f"[^,{CONTROL_CLASS}]*"
    requirement = f"[{_INNER_SPACE}]*{KEY_REGEX}[{_INNER_SPACE}]*!?={value}"
    return f"^[{_SPACE}]*(?:{requirement}(?:,{requirement})*)?[{_SPACE}]*$"


# --- instants ----------------------------------------------------------------------------------------------


def _instant_pattern() -> str:
    """RFC 3339 date-times (upper-case T and Z, as Django parses them) from EARLIEST_INSTANT to LATEST_INSTANT.

    A pattern cannot compare instants across offsets, so on the first and the last day of the range it leaves
    out the offsets that could cross the bound; the rest of the range accepts any offset.
    """
    first, last = EARLIEST_INSTANT.year, (LATEST_INSTANT - timedelta(days=1)).year
    assert (first, last) == (1900, 8999), "the year alternatives below spell out 1901-8998"
    months = "(?:0[1-9]|1[0-2])"
    days = "(?:0[1-9]|[12][0-9]|3[01])"
    time = "T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
    offset = "(?:[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
    any_offset = f"(?:Z|{offset})"
    inner_years = "(?:19(?:0[1-9]|[1-9][0-9])|[2-7][0-9]{3}|8(?:[0-8][0-9]{2}|9(?:[0-8][0-9]|9[0-8])))"
    options = [
        f"{inner_years}-{months}-{days}{time}{any_offset}",
        f"1900-(?:(?:0[2-9]|1[0-2])-{days}|01-(?:0[2-9]|[12][0-9]|3[01])){time}{any_offset}",
        f"1900-01-01{time}(?:Z|[+-]00:00|-(?:[01][0-9]|2[0-3]):[0-5][0-9])",
        f"8999-(?:(?:0[1-9]|1[01])-{days}|12-(?:0[1-9]|[12][0-9]|30)){time}{any_offset}",
        f"8999-12-31{time}(?:Z|[+-]00:00|\\+(?:[01][0-9]|2[0-3]):[0-5][0-9])",
    ]
    return f"^(?:{'|'.join(options)})$"


INSTANT = {
    "type": "string",
    "format": "date-time",
    "pattern": _instant_pattern(),
    "description": (
        f"An instant as RFC 3339 with an offset or Z (a time without an offset is refused), from "
        f"{EARLIEST_INSTANT:%Y-%m-%d} up to, not including, {LATEST_INSTANT:%Y-%m-%d} (UTC)."
    ),
}


class AwareDateTimeFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "schedules.api.serializers.AwareDateTimeField"

    def map_serializer_field(self, auto_schema, direction):
        # Answers are always UTC with Z; input is held to the accepted range.
        if direction == "response":
            return {"type": "string", "format": "date-time"}
        return dict(INSTANT)


# --- names and expressions ---------------------------------------------------------------------------------


class HandlerNameFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "schedules.api.serializers.HandlerNameField"

    def map_serializer_field(self, auto_schema, direction):
        # Read when the schema is generated: handler modules register themselves when the apps are ready.
        return {"type": "string", "enum": registered_names()}


def _zone_pattern() -> str:
    """Every name parse_timezone accepts, grouped by area ("Europe/(?:Madrid|...)"), with the white space the
    serializer strips around it.

    A pattern rather than an enum of ~600 names: a client generated from an enum would pin one tzdata release,
    and a fuzzer would spend its time sending each name (schemathesis's coverage phase sends every enum value).
    """
    areas: dict[str, list[str]] = {}
    for name in zone_names():
        area, _, place = name.rpartition("/")
        areas.setdefault(area, []).append(place)
    options = [
        "|".join(map(_literal, places)) if not area else f"{_literal(area)}/(?:{'|'.join(map(_literal, places))})"
        for area, places in sorted(areas.items())
    ]
    return f"^[{_SPACE}]*(?:{'|'.join(options)})[{_SPACE}]*$"


def _literal(text: str) -> str:
    # Zone names hold letters, digits, "_", "-", "/" and "+"; only "+" means something in a pattern.
    return text.replace("+", "\\+")


class TimezoneNameFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "schedules.api.serializers.TimezoneNameField"

    def get_name(self):
        return "TimeZone"

    def map_serializer_field(self, auto_schema, direction):
        return {
            "type": "string",
            "pattern": _zone_pattern(),
            "description": "An IANA time zone name of the server's tzdata (the pattern lists them all).",
            "default": "UTC",
            "examples": ["UTC", "America/New_York", "Europe/Madrid", "Asia/Kolkata"],
        }


CRON_DESCRIPTION = (
    "The grammar, checked by the API (a 400 naming `cron` says what is wrong and where): five fields separated by "
    "spaces, minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or jan-dec) day-of-week (0-7 or sun-sat, 0 "
    "and 7 both Sunday), names in any case; each field a comma list of '*', '*/n', a value, a range 'a-b' or "
    "'a-b/n'; or a macro (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly). A range ascends "
    "('5-3' is refused), and when the day-of-week field starts with '*', a selected day-of-month must occur in a "
    "selected month ('0 0 31 2 *' never fires and is refused). "
    "When both day fields are restricted, a day matching either fires. The day fields also take the calendar "
    "extensions, alone or in a list, never in a range or with a step: day-of-month 'L' (the month's last day) and "
    "'NW' (the weekday nearest day N, within the month: '15W'), day-of-week 'D#N' (the N-th weekday D of the "
    "month, N 1-5: 'fri#2') and 'DL' (the month's last weekday D: '5L'). A weekday nearest a day the month lacks, "
    "or a fifth weekday it lacks, does not fire that month."
)


class CronExpressionFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "schedules.api.serializers.CronExpressionField"

    def get_name(self):
        return "CronExpression"

    def map_serializer_field(self, auto_schema, direction):
        return {
            "type": "string",
            "maxLength": MAX_CRON_LENGTH,
            "description": CRON_DESCRIPTION,
            "example": "30 2 * * *",
        }


class JSONObjectFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "schedules.api.serializers.JSONObjectField"

    def map_serializer_field(self, auto_schema, direction):
        # Any JSON value that PostgreSQL's jsonb stores: no U+0000 in a string or a key.
        value = ResolvedComponent(
            name="PayloadValue",
            type=ResolvedComponent.SCHEMA,
            object="PayloadValue",
            schema={
                "type": ["null", "boolean", "number", "string", "array", "object"],
                "pattern": NO_NUL,
                "items": {"$ref": "#/components/schemas/PayloadValue"},
                "propertyNames": {"pattern": NO_NUL},
                "additionalProperties": {"$ref": "#/components/schemas/PayloadValue"},
            },
        )
        auto_schema.registry.register_on_missing(value)
        return {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": value.ref,
            "description": (
                "A JSON object handed to the handler: at most 64 KiB encoded as UTF-8, nested at most "
                f"{MAX_JSON_DEPTH} levels deep, without U+0000 or unpaired surrogates."
            ),
        }


class LabelsFieldExtension(OpenApiSerializerFieldExtension):
    target_class = "schedules.api.serializers.LabelsField"

    def map_serializer_field(self, auto_schema, direction):
        return {
            "type": "object",
            "maxProperties": MAX_LABELS,
            "propertyNames": {"pattern": f"^{KEY_REGEX}$"},
            "additionalProperties": {
                "type": "string",
                "maxLength": MAX_VALUE_LENGTH,
                "pattern": f"^[^{CONTROL_CLASS}]*$",
            },
            "description": f"At most {MAX_LABELS} labels: a key is {KEY_RULE}; {VALUE_RULE}.",
            "example": {"team": "payments", "env": "prod"},
        }


# --- request bodies ----------------------------------------------------------------------------------------

KIND_RULE = (
    "A schedule of kind `cron` needs `cron`; one of kind `once` needs `run_at`; one of kind `interval` needs "
    "`every_seconds` and takes an optional `anchor_at` (default: the instant it is created, truncated to the second) "
    "and fires at `anchor_at` + k x `every_seconds` (k >= 0) in elapsed time, which clock changes never move. Each "
    "kind refuses the others' time fields. Unknown fields are refused."
)
KINDS = ("cron", "once", "interval")
# A cron schedule's DST policy (null: the default, skip and first); other kinds take neither field.
DST_POLICY_TEXT = {
    "dst_gap": (
        "A local time the clocks skip (spring forward): 'skip' (default) does not fire it that day; 'shift' fires it "
        "at the instant it names with the offset in force before the change (02:30 on New York's spring-forward day "
        "fires at 03:30 EDT)."
    ),
    "dst_repeat": (
        "A local time the clocks repeat (fall back): 'first' (default) fires at its first instant, 'last' at the "
        "second, 'both' at both (two occurrences)."
    ),
}


def _text_rules(serializer: serializers.Serializer, schema: dict[str, Any]) -> None:
    """Patterns for the plain text fields, as DRF reads them: stripped, no U+0000, not blank unless allowed."""
    for name, field in serializer.fields.items():
        if type(field) is serializers.CharField and name in schema["properties"]:
            schema["properties"][name]["pattern"] = NO_NUL if field.allow_blank else NOT_BLANK


class ScheduleInputExtension(OpenApiSerializerExtension):
    """Create (and PATCH) bodies: one object per kind on create, every field optional on PATCH."""

    target_class = "schedules.api.serializers.ScheduleInputSerializer"
    # A create must say what to run and under which name; a preview fills both in.
    required: tuple[str, ...] = ("name", "handler")
    branch_names = {"cron": "CronScheduleInput", "once": "OnceScheduleInput", "interval": "IntervalScheduleInput"}

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        _text_rules(self.target, schema)
        for field in ("start_at", "end_at"):
            # Unbounded unless given. (The rule between the two, end_at not before start_at, is in words.)
            schema["properties"][field]["default"] = None
        schema["additionalProperties"] = False
        if auto_schema.method == "PATCH":
            schema["description"] = (
                "The fields to change. Read-only keys of a GET body (id, state, version, ...) may be sent back "
                "unchanged and are then ignored; a changed value is refused. The merged definition must still keep "
                f"the kind rule: {KIND_RULE}"
            )
            return schema
        branches = {kind: self._branch(auto_schema, schema, kind) for kind in KINDS}
        return {
            "oneOf": [branch.ref for branch in branches.values()],
            "discriminator": {
                "propertyName": "kind",
                "mapping": {kind: branch.ref["$ref"] for kind, branch in branches.items()},
            },
            "description": KIND_RULE,
        }

    def _branch(self, auto_schema, schema: dict[str, Any], kind: str) -> ResolvedComponent:
        branch = copy.deepcopy(schema)
        branch.pop("description", None)
        properties = branch["properties"]
        properties["kind"] = {"type": "string", "const": kind}
        # Another kind's time fields: absent or null (a blank expression counts as none).
        properties["cron"] = {"type": ["string", "null"], "pattern": BLANK}
        for field in ("run_at", "every_seconds", "anchor_at", *DST_POLICY_TEXT):
            properties[field] = {"type": "null"}
        if kind == "cron":
            properties["cron"] = {"$ref": "#/components/schemas/CronExpression"}
            for field, text in DST_POLICY_TEXT.items():
                properties[field] = {**schema["properties"][field], "description": text}
            time_field = "cron"
        elif kind == "once":
            properties["run_at"] = dict(INSTANT)
            time_field = "run_at"
        else:
            low, high = EVERY_SECONDS_RANGE
            properties["every_seconds"] = {
                "type": "integer",
                "minimum": low,
                "maximum": high,
                "description": "Seconds between fires, in elapsed time (1 second to 365 days).",
            }
            properties["anchor_at"] = {
                "anyOf": [dict(INSTANT), {"type": "null"}],
                "description": (
                    "The rhythm's origin: fires at anchor_at + k x every_seconds (k >= 0) that come after the "
                    "schedule is created. Default: the instant it is created, truncated to the second."
                ),
            }
            time_field = "every_seconds"
        branch["required"] = [*self.required, "kind", time_field]
        component = ResolvedComponent(
            name=self.branch_names[kind], type=ResolvedComponent.SCHEMA, object=self.branch_names[kind], schema=branch
        )
        auto_schema.registry.register_on_missing(component)
        return component


class PreviewInputExtension(ScheduleInputExtension):
    target_class = "schedules.api.serializers.PreviewInputSerializer"
    required = ()
    branch_names = {"cron": "CronPreviewInput", "once": "OncePreviewInput", "interval": "IntervalPreviewInput"}


# --- errors ------------------------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    """An error in words: 401, 404, 409, 413, 429, and a 400 that is not about one field."""

    detail = serializers.CharField()


class ValidationErrorSerializer(serializers.Serializer):
    """A 400: `{"field": ["message", ...]}` per field at fault, or `{"detail": "..."}` (malformed JSON)."""


class ValidationErrorExtension(OpenApiSerializerExtension):
    target_class = ValidationErrorSerializer

    def map_serializer(self, auto_schema, direction):
        error = auto_schema.resolve_serializer(ErrorSerializer, "response").ref
        field_errors = {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        }
        return {"anyOf": [error, field_errors], "description": ValidationErrorSerializer.__doc__}


ERROR_DESCRIPTIONS = {
    400: "Invalid input: field errors keyed by the field (or query parameter), or a `detail` for malformed input.",
    401: "No token, an unknown token, or a token of another tenant.",
    404: "No such resource for this tenant (another tenant's id is unknown here), or no such page.",
    409: "The request contradicts the resource's state or an earlier request.",
    413: "The request body is larger than the server accepts.",
    429: "A quota or a request rate is used up; Retry-After says how many seconds to wait.",
}
# Every tenant call can meet these: a query string with U+0000 is refused before routing (400), the token is
# checked and the request rate counted before anything else.
ALWAYS = (400, 401, 429)


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """The error answers of an operation: `codes` and those of ALWAYS, each with its body schema."""
    return {
        code: OpenApiResponse(
            response=ValidationErrorSerializer if code == 400 else ErrorSerializer,
            description=ERROR_DESCRIPTIONS[code],
        )
        for code in sorted({*codes, *ALWAYS})
    }


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "maxLength": MAX_IDEMPOTENCY_KEY_LENGTH},
    OpenApiParameter.HEADER,
    required=False,
    description=(
        "Makes a retry safe: the same key (for this tenant) returns the first answer instead of acting again."
    ),
)


__all__ = ["IDEMPOTENCY_KEY", "INSTANT", "errors", "query_text"]


# A calendar's dates lie in the years of instants, 1900 to 8999.
CALENDAR_DATE_YEARS = "^(19[0-9]{2}|[2-8][0-9]{3})-"


class CalendarInputExtension(OpenApiSerializerExtension):
    """Calendar bodies (create, PATCH) and their ranges: no other keys (an unknown one is a 400 naming it)."""

    target_class = "schedules.api.calendars.CalendarInputSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        _text_rules(self.target, schema)
        schema["additionalProperties"] = False
        if "dates" in schema.get("properties", {}):
            # The years instants may have (see the info section).
            schema["properties"]["dates"]["items"]["pattern"] = CALENDAR_DATE_YEARS
        return schema


class CalendarRangeExtension(CalendarInputExtension):
    target_class = "schedules.api.calendars.RangeSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = super().map_serializer(auto_schema, direction)
        schema["description"] = "A range of instants [start, end): end after start."
        return schema


class TokenInputExtension(OpenApiSerializerExtension):
    """A new token's body: no other keys (an unknown one is a 400 naming it)."""

    target_class = "schedules.api.credentials.TokenInputSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        _text_rules(self.target, schema)
        schema["additionalProperties"] = False
        return schema


class NotificationsInputExtension(TokenInputExtension):
    """A notification target: no other keys; the selector, until schedules carry labels, is empty."""

    target_class = "schedules.api.notifications.NotificationsInputSerializer"

    def map_serializer(self, auto_schema, direction):
        schema = super().map_serializer(auto_schema, direction)
        schema["properties"]["selector"]["maxLength"] = 0
        schema["properties"]["events"]["uniqueItems"] = True
        return schema


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """`Authorization: Token <key>` in the schema (tenants/credentials/authentication.py)."""

    target_class = "tenants.credentials.authentication.DigestTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "'Token ' and the key (docs/API.md, \"Tokens\"). A read token may GET and preview only.",
        }
