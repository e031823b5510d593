"""The change form's live preview: the API's POST /api/v1/schedules/preview/ rules behind a console URL.

Operators are logged in to the console, not holding a tenant's token, so the form cannot call the tenant API. This
view runs the same steps on the same code: the API's input serializer (types), definitions.clean_definition (rules,
with the API's placeholders for name and handler), services.preview_definition (the fires). It adds what a person
typing needs and a client of the API does not: the fires in words and the DST notes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, JsonResponse

from core.choices import Kind, MisfirePolicy
from core.clock import db_now
from core.cron_syntax import TimeRuleError
from core.dst import preview_notes
from core.timerules import local_time
from schedules.admin.formatting import describe_schedule, format_local, format_utc
from schedules.api.serializers import PreviewInputSerializer, utc_text
from schedules.api.views import PREVIEW_PLACEHOLDERS
from schedules.definitions import anchored_at_now, clean_definition
from schedules.errors import ScheduleInvalid
from schedules.json_input import JSONInputError, loads_strict
from schedules.models import Schedule
from schedules.services import preview_definition
from tenants.access import tenant_scope


def _error(errors: dict[str, Any], status: int = 400) -> JsonResponse:
    return JsonResponse(errors, status=status)


def preview_json(request: HttpRequest) -> JsonResponse:
    """POST a definition as JSON (the API's preview body); 200 with the fires and notes, or 400 with field errors."""
    if request.method != "POST":
        response = _error({"detail": "POST a schedule definition as JSON."}, status=405)
        response["Allow"] = "POST"
        return response
    try:
        body = loads_strict(request.body.decode("utf-8"))
    except (UnicodeDecodeError, JSONInputError) as exc:
        return _error({"detail": f"The body is not JSON: {exc}"})
    if not isinstance(body, dict):
        return _error({"detail": "The body must be a JSON object of schedule fields."})
    serializer = PreviewInputSerializer(data=body)
    if not serializer.is_valid():
        return _error(serializer.errors)
    data = serializer.validated_data
    try:
        definition = clean_definition({**PREVIEW_PLACEHOLDERS, **data["definition"]})
    except ScheduleInvalid as exc:
        return _error(exc.errors)
    now = db_now()
    after: datetime = data["after"] or now
    tenant = request.GET.get("tenant", "")
    if tenant and not (tenant.isascii() and tenant.isdigit() and len(tenant) <= 18):
        return _error({"detail": f"tenant {tenant[:40]!r} is not a tenant id."})
    scope = tenant_scope(request)
    if tenant and scope is not None and int(tenant) not in scope:
        # Another tenant's calendars are not this operator's to read, even as a preview's gaps.
        return _error({"detail": f"tenant {tenant} is not one of yours."})
    try:
        fires = preview_definition(
            definition, after=after, count=data["count"], now=now, tenant_id=int(tenant) if tenant else None
        )
    except TimeRuleError as exc:
        return _error({exc.field: [exc.message]})
    except ScheduleInvalid as exc:
        return _error(exc.errors)
    return JsonResponse(preview_body(definition, fires, after=after, now=now))


# What describe_schedule reads of a definition.
DESCRIBED_FIELDS = (
    *("kind", "cron", "run_at", "every_seconds", "anchor_at", "timezone"),
    *("dst_gap", "dst_repeat", "start_at", "end_at", "max_runs", "exclude_calendars"),
)


def preview_body(definition: dict[str, Any], fires: list[datetime], *, after: datetime, now: datetime) -> dict:
    timezone = definition["timezone"]
    definition = anchored_at_now(definition, now)
    notes, ahead = preview_notes(
        definition["kind"],
        timezone,
        cron=definition["cron"],
        after=after,
        fires=fires,
        dst_gap=definition["dst_gap"],
        dst_repeat=definition["dst_repeat"],
    )
    fire_notes = {fire: note.text for note in notes for fire in note.fires}
    rule = Schedule(**{field: definition[field] for field in DESCRIBED_FIELDS})
    return {
        "summary": describe_schedule(rule),
        "after": utc_text(after),
        "fires": [
            {
                "at": utc_text(fire),
                "local": local_time(fire, timezone).isoformat(),
                "utc_text": format_utc(fire),
                "local_text": format_local(fire, timezone, with_offset=True),
                "note": fire_notes.get(fire, ""),
            }
            for fire in fires
        ],
        "notes": [{"kind": note.kind, "at": utc_text(note.at), "text": note.text} for note in notes],
        # The next clock changes after the last fire listed that touch the rule (within a year).
        "ahead": [{"kind": note.kind, "at": utc_text(note.at), "text": note.text} for note in ahead],
        "empty": "" if fires else _why_empty(definition, now),
    }


def _why_empty(definition: dict[str, Any], now: datetime) -> str:
    run_at = definition["run_at"]
    if definition["kind"] == Kind.ONCE and run_at is not None and run_at <= now:
        policy = definition["misfire_policy"]
        if policy == MisfirePolicy.SKIP:
            return (
                f"run_at ({format_utc(run_at)}) has passed: with misfire policy 'skip' and max lateness "
                f"{definition['max_lateness_seconds']} s it would be recorded missed, not run."
            )
        return f"run_at ({format_utc(run_at)}) has passed."
    end_at = definition.get("end_at")
    if end_at is not None:
        return f"The rule has no fire after this instant up to its end_at ({format_utc(end_at)})."
    return "The rule has no fire after this instant."
