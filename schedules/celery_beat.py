"""The celery-beat importer's mapping: django-celery-beat's periodic tasks, read with plain SQL from the database
they live in, become schedules of one tenant, created and changed through schedules.services only.

The rules, and why each is what it is, are in the command's docstring (schedules/management/commands/
import_celery_beat.py) and docs/API.md ("Importing from celery-beat"). django-celery-beat need not be installed:
its tables are read, its models never loaded. celery is, and its own crontab parser says what a beat row means.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from celery.schedules import ParseException
from celery.schedules import crontab as celery_crontab
from django.db import transaction
from psycopg.rows import dict_row

from core.choices import Kind, ScheduleState
from core.clock import db_now
from core.cron_syntax import TimeRuleError, parse_cron
from dispatch.services import is_registered, registered_names
from schedules.definitions import clean_definition
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import Schedule, ScheduleVersion, VersionChange
from schedules.services import create_schedule, pause_schedule, resume_schedule, update_schedule
from tenants.models import Tenant

ACTOR = "import:celery-beat"
PERIOD_SECONDS = {"days": 86_400, "hours": 3_600, "minutes": 60, "seconds": 1}
# The definition fields a periodic task decides; the rest (lane, misfire policy, retries...) are the product's
# defaults at creation, then the operator's: a later import never resets them.
OWNED_FIELDS = (
    "kind",
    "cron",
    "run_at",
    "every_seconds",
    "anchor_at",
    "timezone",
    "start_at",
    "end_at",
    "max_runs",
    "handler",
    "payload",
)
# Cron's five fields in order: (beat's column, celery's max_ and min_, the whole range).
CRON_FIELDS = (
    ("minute", 60, 0),
    ("hour", 24, 0),
    ("day_of_month", 31, 1),
    ("month_of_year", 12, 1),
    ("day_of_week", 7, 0),
)
READ_TASKS = """
SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers, t.priority,
       t.expires, t.expire_seconds, t.one_off, t.start_time, t.enabled,
       t.interval_id, i.every, i.period,
       t.crontab_id, c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week, c.timezone,
       t.solar_id, s.event, s.latitude, s.longitude,
       t.clocked_id, k.clocked_time
FROM django_celery_beat_periodictask t
LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id
LEFT JOIN django_celery_beat_crontabschedule c ON c.id = t.crontab_id
LEFT JOIN django_celery_beat_solarschedule s ON s.id = t.solar_id
LEFT JOIN django_celery_beat_clockedschedule k ON k.id = t.clocked_id
ORDER BY t.id
"""
CONNECT_TIMEOUT_SECONDS = 10


class BeatSourceError(Exception):
    """The beat database cannot be read (URL, connection, tables); the message is one line for the operator."""


class Untranslatable(Exception):
    """A task that has no faithful schedule here; the message is the skip reason."""


@dataclass(frozen=True)
class Mapped:
    """A periodic task as a cleaned schedule definition, whether beat has it enabled, and what was left behind."""

    definition: dict[str, Any]
    enabled: bool
    warnings: list[str]


@dataclass
class ImportReport:
    """What an import did (or, in a dry run, would do), task by task."""

    dry_run: bool
    imported: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def record(self, outcome: str, name: str, detail: str = "") -> None:
        getattr(self, outcome).append(name)
        verb = (
            {"imported": "would import", "updated": "would update"}.get(outcome, outcome) if self.dry_run else outcome
        )
        self.lines.append(f"{verb} {name}{f': {detail}' if detail else ''}")

    def skip(self, name: str, reason: str) -> None:
        self.skipped.append({"name": name, "reason": reason})
        self.lines.append(f"skipped {name}: {reason}")

    def warn(self, name: str, warnings: list[str]) -> None:
        for warning in warnings:
            self.warnings.append({"name": name, "warning": warning})
            self.lines.append(f"  warning {name}: {warning}")

    def as_json(self) -> dict[str, Any]:
        return {
            "imported": len(self.imported),
            "updated": len(self.updated),
            "skipped": self.skipped,
            "unchanged": len(self.unchanged),
            "warnings": self.warnings,
            "dry_run": self.dry_run,
        }


# --- reading ----------------------------------------------------------------------------------------------


def shown_url(url: str) -> str:
    """The URL as messages show it: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc}"))


def read_beat_tasks(url: str) -> list[dict[str, Any]]:
    """Every periodic task with its schedule row, in id order: one read-only query, so one consistent snapshot."""
    if urlsplit(url).scheme not in ("postgres", "postgresql"):
        raise BeatSourceError(
            f"--from-database must be a PostgreSQL URL (postgres://user@host:5432/name), not {shown_url(url)!r}."
        )
    where = shown_url(url)
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_SECONDS, row_factory=dict_row) as conn:
            conn.read_only = True
            return conn.execute(READ_TASKS).fetchall()
    except psycopg.errors.UndefinedTable as exc:
        raise BeatSourceError(
            f"No django-celery-beat tables in {where} ({_first_line(exc)}): is it the celery-beat project's database "
            "(and schema: add ?options=-csearch_path%3DNAME to the URL)?"
        ) from None
    except psycopg.errors.UndefinedColumn as exc:
        raise BeatSourceError(
            f"The django-celery-beat tables in {where} are older than 2.0 ({_first_line(exc)}): migrate them first."
        ) from None
    except psycopg.Error as exc:
        raise BeatSourceError(f"Cannot read {where}: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- mapping ----------------------------------------------------------------------------------------------


def map_task(row: dict[str, Any], handler_map: dict[str, str], now: datetime) -> Mapped | str:
    """The schedule definition a periodic task maps to (cleaned by the product's own rules), or why it has none."""
    warnings: list[str] = []
    try:
        timing = _timing(row, warnings)
        handler = handler_map.get(row["task"]) or (row["task"] if is_registered(row["task"]) else None)
        if handler is None:
            raise Untranslatable(
                f"task {row['task']!r} is not a registered handler; map it with --handler-map "
                f"{row['task']}=HANDLER (registered: {', '.join(registered_names())})"
            )
        payload = {"args": _json_column(row, "args", list), "kwargs": _json_column(row, "kwargs", dict)}
    except Untranslatable as exc:
        return str(exc)
    data = {
        "name": row["name"],
        "handler": handler,
        "payload": payload,
        "start_at": _aware(row["start_time"], warnings),
        "end_at": _aware(row["expires"], warnings),
        **timing,
    }
    if row["one_off"] and data["kind"] != Kind.ONCE:
        data["max_runs"] = 1  # beat disables a one-off after its first run; a clocked task is once anyway
    try:
        definition = clean_definition(data)
    except ScheduleInvalid as exc:
        return describe_invalid(exc)
    if definition["kind"] == Kind.ONCE and definition["run_at"] <= now:
        if not row["enabled"]:
            return f"its clocked time {_iso(definition['run_at'])} has passed and it is disabled: nothing left to run"
        warnings.append(
            f"its clocked time {_iso(definition['run_at'])} has passed: the misfire policy "
            f"({definition['misfire_policy']}, {definition['max_lateness_seconds']} s) decides whether it runs now"
        )
    return Mapped(definition, bool(row["enabled"]), warnings + _ignored_options(row))


def _timing(row: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The kind and time fields; beat's own precedence when a row sets several schedules (interval first)."""
    kinds = [kind for kind in ("interval", "crontab", "solar", "clocked") if row[f"{kind}_id"] is not None]
    if not kinds:
        raise Untranslatable("it has no schedule (interval, crontab, solar or clocked)")
    if len(kinds) > 1:
        warnings.append(f"it sets {' and '.join(kinds)}; celery-beat follows the {kinds[0]}, and so does the import")
    if kinds[0] == "interval":
        return {
            "kind": Kind.INTERVAL,
            "every_seconds": _interval_seconds(row["every"], row["period"]),
            # Beat counts from the last run; here the phase is fixed: start_time, or the import instant.
            "anchor_at": _aware(row["start_time"], warnings),
        }
    if kinds[0] == "crontab":
        columns = (row[column] for column, _, _ in CRON_FIELDS)
        return {"kind": Kind.CRON, "cron": crontab_expression(*columns), "timezone": str(row["timezone"] or "UTC")}
    if kinds[0] == "solar":
        raise Untranslatable(
            f"solar schedule ({row['event']} at latitude {row['latitude']}, longitude {row['longitude']}) has no "
            "equivalent: schedules here fire by cron, once or interval"
        )
    return {"kind": Kind.ONCE, "run_at": _aware(row["clocked_time"], warnings)}


def _interval_seconds(every: int, period: str) -> int:
    if period == "microseconds":
        if every % 1_000_000:
            raise Untranslatable(f"it runs every {every} microseconds: periods here are whole seconds")
        return every // 1_000_000
    if period not in PERIOD_SECONDS:
        raise Untranslatable(f"unknown interval period {period!r}")
    return every * PERIOD_SECONDS[period]


def crontab_expression(minute: str, hour: str, day_of_month: str, month_of_year: str, day_of_week: str) -> str:
    """The cron expression that fires when beat's crontab does, or Untranslatable.

    Celery reads the fields first (its parser, what beat runs by). Each field's own text is kept when this product
    reads it as the same values ("*/15", "mon-fri"); otherwise it is written out as a list ("fri-mon", which wraps
    in celery, becomes "0-1,5-6"). Celery fires on days matching day_of_month AND day_of_week; cron (Vixie) on days
    matching either once both are restricted, so such a pair is kept only when one of them is every day."""
    texts = (minute, hour, day_of_month, month_of_year, day_of_week)
    try:
        beat = celery_crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year, day_of_week=day_of_week
        )
    except (ValueError, TypeError, ParseException) as exc:
        raise Untranslatable(f"celery cannot read its crontab either ({exc})") from None
    values = (beat.minute, beat.hour, beat.day_of_month, beat.month_of_year, beat.day_of_week)
    fields = [_cron_field(text, set(read), index) for index, (text, read) in enumerate(zip(texts, values, strict=True))]
    if not fields[2].startswith("*") and not fields[4].startswith("*"):
        if set(beat.day_of_week) == set(range(7)):
            fields[4] = "*"
        elif set(beat.day_of_month) == set(range(1, 32)):
            fields[2] = "*"
        else:
            raise Untranslatable(
                f"celery-beat fires on days matching both day_of_month {day_of_month!r} and day_of_week "
                f"{day_of_week!r}; a cron expression fires on days matching either, so it cannot say this"
            )
    return " ".join(fields)


def _cron_field(text: str, values: set[int], index: int) -> str:
    candidate = str(text or "*").replace(" ", "").lower() or "*"
    probe = ["*"] * 5
    probe[index] = candidate
    try:
        spec = parse_cron(" ".join(probe))
        read = (spec.minute, spec.hour, spec.dom, spec.month, spec.dow)[index]
        if read.values == values and not read.specials:
            return candidate
    except TimeRuleError:
        pass
    _, size, low = CRON_FIELDS[index]
    if values == set(range(low, low + size)):
        return "*"
    return ",".join(f"{first}-{last}" if last > first else str(first) for first, last in _runs(sorted(values)))


def _runs(ordered: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for value in ordered:
        if runs and runs[-1][1] == value - 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def _json_column(row: dict[str, Any], column: str, kind: type) -> Any:
    """args or kwargs as beat loads them (an empty text is none); NaN and Infinity are refused, as jsonb does."""
    try:
        value = json.loads(row[column] or ("[]" if kind is list else "{}"), parse_constant=_no_constant)
    except ValueError as exc:
        raise Untranslatable(f"its {column} are not valid JSON ({exc})") from None
    if not isinstance(value, kind):
        raise Untranslatable(f"its {column} must be a JSON {'array' if kind is list else 'object'}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _aware(value: datetime | None, warnings: list[str]) -> datetime | None:
    """Beat's tables hold aware instants under USE_TZ; a naive one (a USE_TZ=False project) is read as UTC."""
    if value is None or value.tzinfo is not None:
        return value
    warning = "its times have no zone (a USE_TZ=False project); they were read as UTC"
    if warning not in warnings:
        warnings.append(warning)
    return value.replace(tzinfo=UTC)


def _ignored_options(row: dict[str, Any]) -> list[str]:
    """Beat's message options, which have no meaning here: said once per task, never a reason to skip it."""
    ignored = [
        f"{column} {row[column]!r} ignored: fires go to the lanes' queues"
        for column in ("queue", "exchange", "routing_key")
        if row[column]
    ]
    if row["priority"] is not None:
        ignored.append(f"priority {row['priority']} ignored: a broker message priority, not a schedule's (-100..100)")
    if row["expire_seconds"] is not None:
        ignored.append(f"expire_seconds {row['expire_seconds']} ignored: lateness is max_lateness_seconds here")
    if (row["headers"] or "{}").strip() not in ("{}", "null"):
        ignored.append("headers ignored: messages here carry the platform's own")
    return ignored


def describe_invalid(exc: ScheduleInvalid) -> str:
    return "; ".join(f"{name}: {' '.join(messages)}" for name, messages in exc.errors.items())


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


# --- writing ----------------------------------------------------------------------------------------------


class _Skipped(Exception):
    """Raised inside a task's transaction to undo what it wrote and skip it with this reason."""


def import_tasks(
    tenant: Tenant, rows: list[dict[str, Any]], handler_map: dict[str, str], *, dry_run: bool
) -> ImportReport:
    """Import every task, each in a transaction of its own; a dry run does exactly the same inside one transaction
    that is rolled back, so its counts are a real run's (quota and all) and nothing is written."""
    report = ImportReport(dry_run=dry_run)
    with transaction.atomic() if dry_run else contextlib.nullcontext():
        now = db_now()
        for row in rows:
            _import_one(tenant, row, handler_map, now, report)
        if dry_run:
            transaction.set_rollback(True)
    return report


def _import_one(
    tenant: Tenant, row: dict[str, Any], handler_map: dict[str, str], now: datetime, report: ImportReport
) -> None:
    name = row["name"]
    mapped = map_task(row, handler_map, now)
    if isinstance(mapped, str):
        report.skip(name, mapped)
        return
    matches = list(
        Schedule.objects.for_tenant(tenant).filter(name=name).exclude(state=ScheduleState.CANCELED).order_by("pk")[:2]
    )
    if len(matches) > 1:
        report.skip(name, "the tenant has several schedules of this name: cancel or rename all but one")
        return
    actor = f"{ACTOR}/task-{row['id']}"
    warnings = list(mapped.warnings)
    try:
        with transaction.atomic():
            if matches:
                outcome, detail = _update(matches[0], mapped, actor, row, warnings)
            else:
                outcome, detail = _create(tenant, mapped, actor, row)
    except _Skipped as exc:
        report.skip(name, str(exc))
        return
    except ScheduleInvalid as exc:
        report.skip(name, describe_invalid(exc))
        return
    except (QuotaExceeded, StateConflict) as exc:
        report.skip(name, exc.message)
        return
    report.record(outcome, name, detail)
    report.warn(name, warnings)


def _create(tenant: Tenant, mapped: Mapped, actor: str, row: dict[str, Any]) -> tuple[str, str]:
    schedule, _ = create_schedule(tenant=tenant, data=mapped.definition, actor=actor)
    if schedule.state == ScheduleState.COMPLETED:
        raise _Skipped("no fire is left in its window (start_time to expires): nothing left to run")
    if not mapped.enabled:
        pause_schedule(schedule, actor=actor, note=_state_note(row))
    return "imported", _summary(mapped)


def _update(
    schedule: Schedule, mapped: Mapped, actor: str, row: dict[str, Any], warnings: list[str]
) -> tuple[str, str]:
    """Change the fields the task decides that differ; then follow `enabled` where the import set the state."""
    definition = mapped.definition
    changes = {
        name: definition[name]
        for name in OWNED_FIELDS
        if definition[name] != getattr(schedule, name)
        # An interval without start_time keeps the anchor its first import gave it.
        and not (name == "anchor_at" and definition[name] is None and schedule.kind == definition["kind"])
    }
    if changes:
        schedule = update_schedule(schedule, changes, actor=actor)
    state = schedule.state
    wanted = ScheduleState.ACTIVE if mapped.enabled else ScheduleState.PAUSED
    moved = False
    if state in (ScheduleState.ACTIVE, ScheduleState.PAUSED) and state != wanted:
        setter = _state_setter(schedule)
        if setter.startswith(ACTOR):
            if mapped.enabled:
                resume_schedule(schedule, actor=actor, note=_state_note(row))
            else:
                pause_schedule(schedule, actor=actor, note=_state_note(row))
            moved = True
        else:
            warnings.append(
                f"{'enabled' if mapped.enabled else 'disabled'} in celery-beat but left {state} here: "
                f"{setter} set that, and the import changes only states it set itself"
            )
    if not changes and not moved:
        return "unchanged", ""
    detail = ", ".join([*sorted(changes), *(["enabled" if mapped.enabled else "disabled"] if moved else [])])
    return "updated", detail


def _state_setter(schedule: Schedule) -> str:
    """Who last set the schedule's state: the actor of its latest create, pause or resume."""
    last = (
        ScheduleVersion.objects.filter(
            schedule=schedule, change__in=[VersionChange.CREATE, VersionChange.PAUSE, VersionChange.RESUME]
        )
        .order_by("-version")
        .values_list("actor", flat=True)
        .first()
    )
    return last or ""


def _state_note(row: dict[str, Any]) -> str:
    state = "enabled" if row["enabled"] else "disabled"
    return f"celery-beat periodic task {row['id']} ({row['name']}) is {state}"


def _summary(mapped: Mapped) -> str:
    d = mapped.definition
    when = {
        Kind.CRON: f"cron {d['cron']!r} {d['timezone']}",
        Kind.INTERVAL: f"every {d['every_seconds']} s",
        Kind.ONCE: f"once at {_iso(d['run_at'])}" if d["run_at"] else "once",
    }[d["kind"]]
    paused = "" if mapped.enabled else ", paused"
    return f"{when} -> {d['handler']}{paused}"
