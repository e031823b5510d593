"""The change page's detail tables: next fires from the database clock, version history, recent occurrences."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.urls import reverse

from core.choices import ScheduleState
from core.clock import db_now
from core.cron_syntax import TimeRuleError
from core.dst import preview_notes
from dispatch.models import Occurrence
from schedules.admin.formatting import format_local, format_utc, summarize_definition
from schedules.models import Schedule, ScheduleVersion
from schedules.services import preview_fires, runs_left_after

PREVIEW_FIRES = 10
RECENT_OCCURRENCES = 20
VERSION_HISTORY_LIMIT = 50


def schedule_details(schedule: Schedule) -> dict[str, Any]:
    """Context for the change page: next fires from the database clock, version history, recent occurrences."""
    now = db_now()
    return {
        "preview_now": format_utc(now),
        **_next_fires(schedule, now),
        "version_rows": version_rows(schedule),
        "version_limit": VERSION_HISTORY_LIMIT,
        "recent_occurrences": _recent_occurrences(schedule),
        "recent_limit": RECENT_OCCURRENCES,
    }


def _next_fires(schedule: Schedule, now: datetime) -> dict[str, Any]:
    if schedule.state in (ScheduleState.CANCELED, ScheduleState.COMPLETED):
        return {"next_fires": [], "fires_note": f"No upcoming fires: the schedule is {schedule.state}."}
    runs_left = runs_left_after(schedule, now)
    count = PREVIEW_FIRES if runs_left is None else min(PREVIEW_FIRES, runs_left)
    try:
        fires = preview_fires(schedule.time_rule, after=now, count=count) if count > 0 else []
    except TimeRuleError as exc:
        return {"next_fires": [], "fires_note": f"The time rule cannot be evaluated: {exc.message}"}
    note = ""
    if schedule.state == ScheduleState.PAUSED:
        note = "Paused: these are the fires the rule describes; none happens until the schedule is resumed."
    elif not fires:
        note = "The rule has no fire after now."
    notes, ahead = preview_notes(
        schedule.kind,
        schedule.timezone,
        cron=schedule.cron,
        after=now,
        fires=fires,
        dst_gap=schedule.dst_gap,
        dst_repeat=schedule.dst_repeat,
    )
    by_fire = {fire: dst.text for dst in notes for fire in dst.fires}
    rows = [
        {
            "utc": format_utc(fire),
            "local": format_local(fire, schedule.timezone, with_offset=True),
            "note": by_fire.get(fire, ""),
        }
        for fire in fires
    ]
    return {
        "next_fires": rows,
        "fires_note": note,
        "dst_notes": [dst.text for dst in notes],
        "dst_ahead": [dst.text for dst in ahead],
    }


def version_rows(schedule: Schedule) -> list[dict[str, Any]]:
    """The newest versions, each with what changed from the one before, who changed it and why (the note)."""
    versions = list(
        ScheduleVersion.objects.filter(schedule_id=schedule.pk).order_by("-version")[: VERSION_HISTORY_LIMIT + 1]
    )
    rows = []
    for index, version in enumerate(versions[:VERSION_HISTORY_LIMIT]):
        older = versions[index + 1] if index + 1 < len(versions) else None
        changed = []
        if older is not None:
            changed = sorted(
                key
                for key in set(version.definition) | set(older.definition)
                if version.definition.get(key) != older.definition.get(key)
            )
        rows.append(
            {
                "version": version.version,
                "change": version.get_change_display(),
                "valid_from": format_utc(version.valid_from),
                "valid_to": format_utc(version.valid_to) if version.valid_to else "current",
                "actor": version.actor,
                "note": version.note,
                "summary": summarize_definition(version.definition),
                "changed": ", ".join(changed),
            }
        )
    return rows


def _recent_occurrences(schedule: Schedule) -> list[dict[str, Any]]:
    # Served by the index (schedule, -scheduled_for).
    occurrences = Occurrence.objects.filter(schedule_id=schedule.pk).order_by("-scheduled_for")[:RECENT_OCCURRENCES]
    return [
        {
            "url": reverse("admin:dispatch_occurrence_change", args=[occurrence.occurrence_id]),
            "occurrence_id": occurrence.occurrence_id,
            "version": occurrence.schedule_version,
            "state": occurrence.state,
            "manual": occurrence.manual,
            "scheduled_for": format_utc(occurrence.scheduled_for),
            "scheduled_for_local": format_local(occurrence.scheduled_for, schedule.timezone),
            "enqueued_at": format_utc(occurrence.enqueued_at),
            "finished_at": format_utc(occurrence.finished_at),
            "attempt_count": occurrence.attempt_count,
            "reason": occurrence.state_reason,
        }
        for occurrence in occurrences
    ]
