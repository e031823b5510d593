"""What a schedule definition may say: the defaults, the ranges, each kind's time fields, and the one check of its
rules (clean_definition), which the API, the console and the commands share; and the interval's default anchor."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from core.choices import DstGap, DstRepeat, Kind, Lane, MisfirePolicy, OverlapPolicy
from core.cron_syntax import TimeRuleError, normalize_cron
from core.exclusions import Exclusions
from core.labels import label_problems
from core.timerules import EARLIEST_INSTANT, EVERY_SECONDS_RANGE, LATEST_INSTANT, TimeRule, parse_timezone
from dispatch.services import is_registered, payload_problems, registered_names
from schedules.calendar_names import MAX_CALENDARS_PER_SCHEDULE, NAME_PATTERN, NAME_RULE
from schedules.errors import ScheduleInvalid
from schedules.json_input import storable_json
from schedules.models import DEFINITION_FIELDS

# Ranges of the numeric definition fields: (minimum, maximum). Named so the API, admin and docs agree.
NUMERIC_RANGES: dict[str, tuple[int, int]] = {
    "priority": (-100, 100),
    "flexible_window_seconds": (1, 3600),
    "max_lateness_seconds": (0, 7 * 24 * 3600),
    "catchup_limit": (0, 1000),
    "max_attempts": (1, 100),
}
# A schedule's retry policy (null: the platform's settings): the first wait's scale and the longest wait, in seconds.
RETRY_RANGES: dict[str, tuple[int, int]] = {"retry_base_seconds": (1, 3600), "retry_cap_seconds": (1, 86400)}
DEFAULTS: dict[str, Any] = {
    "cron": None,
    "run_at": None,
    "every_seconds": None,
    "anchor_at": None,
    "timezone": "UTC",
    "dst_gap": None,
    "dst_repeat": None,
    "start_at": None,
    "end_at": None,
    "max_runs": None,
    "exclude_calendars": None,
    "lane": Lane.STRICT,
    "flexible_window_seconds": 300,
    "priority": 0,
    "payload": {},
    "misfire_policy": MisfirePolicy.SKIP,
    "max_lateness_seconds": 60,
    "catchup_limit": 10,
    "overlap_policy": OverlapPolicy.ALLOW,
    "max_attempts": 5,
    "retry_base_seconds": None,
    "retry_cap_seconds": None,
    "labels": {},
}
REQUIRED_FIELDS = ("name", "kind", "handler")
# The largest max_runs: the integer column's range.
MAX_RUNS = 2_147_483_647
# The fields that say when a schedule of each kind fires; another kind's are refused (a blank cron counts as none).
TIME_FIELDS: dict[str, tuple[str, ...]] = {
    Kind.CRON: ("cron", "dst_gap", "dst_repeat"),
    Kind.ONCE: ("run_at",),
    Kind.INTERVAL: ("every_seconds", "anchor_at"),
}


def clean_definition(data: dict[str, Any]) -> dict[str, Any]:
    """Check a complete definition (defaults applied) and return it normalised; raise ScheduleInvalid.

    The API's serializers check types; this checks the rules, so the admin and commands get the same answers.
    """
    errors: dict[str, list[str]] = {}
    definition = {**DEFAULTS, **data}

    for field in REQUIRED_FIELDS:
        if definition.get(field) in (None, ""):
            errors.setdefault(field, []).append("This field is required.")

    kind = definition.get("kind")
    if kind not in (None, "") and kind not in Kind.values:
        errors.setdefault("kind", []).append(f"Must be one of: {', '.join(Kind.values)}.")

    try:
        parse_timezone(definition["timezone"])
    except TimeRuleError as exc:
        errors.setdefault("timezone", []).append(exc.message)

    if kind in TIME_FIELDS:
        for owner, fields in TIME_FIELDS.items():
            for field in fields if owner != kind else ():
                if definition.get(field) not in (None, ""):
                    errors.setdefault(field, []).append(f"Only schedules of kind '{owner}' take {field}.")
                definition[field] = None

    if kind == Kind.CRON:
        if not definition.get("cron"):
            errors.setdefault("cron", []).append("Required for kind 'cron'.")
        else:
            try:
                definition["cron"] = normalize_cron(definition["cron"])
            except TimeRuleError as exc:
                errors.setdefault("cron", []).append(exc.message)
        for field, choices in (("dst_gap", DstGap.values), ("dst_repeat", DstRepeat.values)):
            if definition.get(field) in (None, ""):
                definition[field] = None
            elif definition[field] not in choices:
                errors.setdefault(field, []).append(f"Must be one of: {', '.join(choices)} (or null, the default).")
    elif kind == Kind.ONCE:
        run_at = definition.get("run_at")
        if run_at is None:
            errors.setdefault("run_at", []).append("Required for kind 'once'.")
        elif run_at.tzinfo is None:
            errors.setdefault("run_at", []).append("Give an offset or 'Z' (ISO 8601), e.g. 2026-12-01T09:00:00Z.")
    elif kind == Kind.INTERVAL:
        every, (low, high) = definition.get("every_seconds"), EVERY_SECONDS_RANGE
        if every is None:
            errors.setdefault("every_seconds", []).append("Required for kind 'interval', e.g. 300 (5 minutes).")
        elif not isinstance(every, int) or isinstance(every, bool) or not low <= every <= high:
            errors.setdefault("every_seconds", []).append(f"Must be an integer from {low} to {high}.")
        # No anchor_at is fine here: the caller anchors the schedule at its own "now" (anchored_at_now).
        anchor_at = definition.get("anchor_at")
        if anchor_at is not None and (not isinstance(anchor_at, datetime) or anchor_at.tzinfo is None):
            errors.setdefault("anchor_at", []).append("Give an offset or 'Z' (ISO 8601), e.g. 2026-12-01T09:00:00Z.")

    out_of_range = f"Must be from {EARLIEST_INSTANT.year} up to {LATEST_INSTANT.year} (UTC)."
    for field in ("start_at", "end_at"):
        instant = definition.get(field)
        if instant is not None and (not isinstance(instant, datetime) or instant.tzinfo is None):
            errors.setdefault(field, []).append("Give an offset or 'Z' (ISO 8601), e.g. 2026-12-01T09:00:00Z.")
    for field in ("run_at", "anchor_at", "start_at", "end_at"):
        # The API's serializers hold the same range; the console's date fields reach year 9999, where the zone's
        # local time of a fire overflows.
        instant = definition.get(field)
        if not isinstance(instant, datetime) or instant.tzinfo is None or field in errors:
            continue
        if not EARLIEST_INSTANT <= instant < LATEST_INSTANT:
            errors.setdefault(field, []).append(out_of_range)

    _check_window(definition, errors)
    max_runs = definition.get("max_runs")
    if max_runs is not None and (
        not isinstance(max_runs, int) or isinstance(max_runs, bool) or not 1 <= max_runs <= MAX_RUNS
    ):
        errors.setdefault("max_runs", []).append(f"Must be an integer from 1 to {MAX_RUNS} (or null: no limit).")

    _check_calendar_names(definition, errors)

    handler = definition.get("handler")
    if handler and not is_registered(handler):
        errors.setdefault("handler", []).append(
            f"Unknown handler {handler!r}. Registered: {', '.join(registered_names())}."
        )

    for field, choices in (
        ("lane", Lane.values),
        ("misfire_policy", MisfirePolicy.values),
        ("overlap_policy", OverlapPolicy.values),
    ):
        if definition.get(field) not in choices:
            errors.setdefault(field, []).append(f"Must be one of: {', '.join(choices)}.")

    for field, (low, high) in NUMERIC_RANGES.items():
        value = definition.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            errors.setdefault(field, []).append(f"Must be an integer from {low} to {high}.")

    payload = definition.get("payload")
    if not isinstance(payload, dict):
        errors.setdefault("payload", []).append("Must be a JSON object.")
    else:
        # Real UTF-8 bytes, as stored and shipped: an accented letter is 2 bytes, not a 6-byte \u escape.
        size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if size > settings.SCHEDULER_MAX_PAYLOAD_BYTES:
            errors.setdefault("payload", []).append(
                f"Is {size} bytes encoded; the limit is {settings.SCHEDULER_MAX_PAYLOAD_BYTES} bytes."
            )
        elif not storable_json(payload):
            errors.setdefault("payload", []).append(
                "Contains U+0000 or an unpaired surrogate (U+D800-U+DFFF), which PostgreSQL cannot store."
            )
        elif handler and is_registered(handler):
            # What the handler could never run is refused now, not when it fires (a webhook without a usable URL).
            problems = payload_problems(handler, payload)
            if problems:
                errors.setdefault("payload", []).extend(problems)

    _check_retry(definition, errors)

    problems = label_problems(definition.get("labels"))
    if problems:
        errors.setdefault("labels", []).extend(problems)
    elif definition["labels"] is not None:
        definition["labels"] = dict(sorted(definition["labels"].items()))

    name = definition.get("name")
    if isinstance(name, str) and len(name) > 200:
        errors.setdefault("name", []).append("At most 200 characters.")

    if errors:
        raise ScheduleInvalid(errors)
    return {field: definition[field] for field in DEFINITION_FIELDS}


def _check_retry(definition: dict[str, Any], errors: dict[str, list[str]]) -> None:
    """The retry policy: each null (the platform's) or an integer in its range; a cap not below the base."""
    for field, (low, high) in RETRY_RANGES.items():
        value = definition.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
            errors.setdefault(field, []).append(f"Must be an integer from {low} to {high}, or null (the default).")
    base, cap = definition.get("retry_base_seconds"), definition.get("retry_cap_seconds")
    checked = "retry_base_seconds" not in errors and "retry_cap_seconds" not in errors
    if checked and base is not None and cap is not None and cap < base:
        errors.setdefault("retry_cap_seconds", []).append("Must not be below retry_base_seconds.")


def _check_window(definition: dict[str, Any], errors: dict[str, list[str]]) -> None:
    """end_at not before start_at. (A one-off whose run_at lies outside its window has no fire: it is completed.)"""
    start, end = definition.get("start_at"), definition.get("end_at")
    if "start_at" in errors or "end_at" in errors:
        return
    if start is not None and end is not None and end < start:
        errors.setdefault("end_at", []).append("Must not be before start_at.")


def _check_calendar_names(definition: dict[str, Any], errors: dict[str, list[str]]) -> None:
    """exclude_calendars: null or a list of calendar names, kept sorted and unique (an empty list is null). Whether
    each calendar exists is the tenant's to say (schedules.calendars.check_exclude_calendars)."""
    names = definition.get("exclude_calendars")
    if names in (None, []):
        definition["exclude_calendars"] = None
        return
    if (
        not isinstance(names, list | tuple)
        or not all(isinstance(name, str) and NAME_PATTERN.fullmatch(name) for name in names)
        or len(set(names)) > MAX_CALENDARS_PER_SCHEDULE
    ):
        errors.setdefault("exclude_calendars", []).append(
            f"A list of at most {MAX_CALENDARS_PER_SCHEDULE} calendar names ({NAME_RULE}), or null."
        )
        return
    definition["exclude_calendars"] = sorted(set(names))


def anchored_at_now(definition: dict[str, Any], now: datetime) -> dict[str, Any]:
    """An interval definition without anchor_at, anchored at `now` truncated to the second: the instant it
    is created, or changed to an interval, or previewed. Its fires then fall on whole seconds. Other kinds as given.
    """
    if definition.get("kind") != Kind.INTERVAL or definition.get("anchor_at") is not None:
        return definition
    return {**definition, "anchor_at": now.astimezone(UTC).replace(microsecond=0)}


def time_rule_of(definition: dict[str, Any], exclusions: Exclusions | None = None) -> TimeRule:
    """The time rule of a cleaned definition (an interval's anchor already set), with its calendars' exclusions."""
    return TimeRule(
        kind=definition["kind"],
        timezone=definition["timezone"],
        cron=definition["cron"],
        run_at=definition["run_at"],
        every_seconds=definition["every_seconds"],
        anchor_at=definition["anchor_at"],
        dst_gap=definition["dst_gap"],
        dst_repeat=definition["dst_repeat"],
        start_at=definition["start_at"],
        end_at=definition["end_at"],
        exclusions=exclusions,
    )
