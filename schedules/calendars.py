"""Holiday calendars: a tenant's named dates and ranges its schedules exclude (`exclude_calendars`). Every change
goes through these functions, which keep the calendar's history (CalendarRevision) in the same transaction: a
change applies to fires not yet materialized, and reconcile and backfill judge each fire by what the calendar said
when it was materialized (dispatch/history.py)."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime
from typing import Any

from django.db import IntegrityError, connection, transaction

from core.choices import ScheduleState
from core.clock import db_now
from core.timerules import EARLIEST_INSTANT, LATEST_INSTANT
from schedules.calendar_names import NAME_PATTERN, NAME_RULE
from schedules.errors import Gone, QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import Calendar, CalendarRevision, Schedule
from tenants.models import Tenant

logger = logging.getLogger(__name__)

# Bounds that keep a calendar a calendar (decades of holidays, a few maintenance windows a week) and the
# materializer's per-batch load of them small.
MAX_DATES = 5000
MAX_RANGES = 1000
MAX_DESCRIPTION = 500
MAX_CALENDARS_PER_TENANT = 200
# A calendar refused for this many seconds when the tenant holds MAX_CALENDARS_PER_TENANT (429 Retry-After).
QUOTA_RETRY_AFTER_SECONDS = 60


def clean_calendar(data: dict[str, Any], *, current: Calendar | None = None) -> dict[str, Any]:
    """Check a calendar's fields (all of a create's; a PATCH's given ones over `current`) and return them
    normalised: dates as sorted unique ISO dates, ranges as sorted {"start", "end"} in UTC. Raise ScheduleInvalid."""
    errors: dict[str, list[str]] = {}
    cleaned: dict[str, Any] = {}
    name = data.get("name", current.name if current else None)
    if current is not None and name != current.name:
        errors.setdefault("name", []).append("A calendar keeps its name: schedules refer to it by name.")
    elif not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        errors.setdefault("name", []).append(f"Required: {NAME_RULE}.")
    else:
        cleaned["name"] = name
    if "dates" in data or current is None:
        cleaned["dates"] = _dates(data.get("dates", []), errors)
    if "ranges" in data or current is None:
        cleaned["ranges"] = _ranges(data.get("ranges", []), errors)
    if "description" in data or current is None:
        description = data.get("description") or ""
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            errors.setdefault("description", []).append(f"At most {MAX_DESCRIPTION} characters.")
        cleaned["description"] = description
    if errors:
        raise ScheduleInvalid(errors)
    return cleaned


def _dates(value: Any, errors: dict[str, list[str]]) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_DATES:
        errors.setdefault("dates", []).append(f"A list of at most {MAX_DATES} ISO dates, e.g. ['2026-12-25'].")
        return []
    days: set[date] = set()
    for item in value:
        try:
            day = date.fromisoformat(item) if isinstance(item, str) and len(item) == 10 else None
        except ValueError:
            day = None
        if day is None or not EARLIEST_INSTANT.year <= day.year < LATEST_INSTANT.year:
            errors.setdefault("dates", []).append(
                f"{str(item)[:40]!r} is not a date YYYY-MM-DD from {EARLIEST_INSTANT.year} to "
                f"{LATEST_INSTANT.year - 1}."
            )
            return []
        days.add(day)
    return [day.isoformat() for day in sorted(days)]


def _ranges(value: Any, errors: dict[str, list[str]]) -> list[dict[str, str]]:
    example = "e.g. {'start': '2026-12-24T18:00:00Z', 'end': '2026-12-27T06:00:00Z'}"
    if not isinstance(value, list) or len(value) > MAX_RANGES:
        errors.setdefault("ranges", []).append(f"A list of at most {MAX_RANGES} ranges, {example}.")
        return []
    ranges: set[tuple[datetime, datetime]] = set()
    for item in value:
        start = _instant(item.get("start")) if isinstance(item, dict) else None
        end = _instant(item.get("end")) if isinstance(item, dict) else None
        if not isinstance(item, dict) or set(item) != {"start", "end"} or start is None or end is None:
            errors.setdefault("ranges", []).append(
                f"Each range is {{start, end}}, instants with an offset from {EARLIEST_INSTANT.year} to "
                f"{LATEST_INSTANT.year - 1}, {example}."
            )
            return []
        if end <= start:
            errors.setdefault("ranges", []).append(f"A range's end must be after its start: {_iso(start)}.")
            return []
        ranges.add((start, end))
    return [{"start": _iso(start), "end": _iso(end)} for start, end in sorted(ranges)]


def _instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        instant = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if instant.utcoffset() is None or not EARLIEST_INSTANT <= instant < LATEST_INSTANT:
        return None
    return instant.astimezone(UTC)


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def create_calendar(*, tenant: Tenant, data: dict[str, Any], actor: str, now: datetime | None = None) -> Calendar:
    """A new calendar of the tenant, in force from `now` (PostgreSQL's clock unless a caller drives it);
    StateConflict if the name is taken, QuotaExceeded past the tenant's bound."""
    cleaned = clean_calendar(data)
    try:
        with transaction.atomic():
            # The tenant row serialises creates, so two racing ones cannot both take the last place.
            locked = Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
            if Calendar.objects.filter(tenant=locked).count() >= MAX_CALENDARS_PER_TENANT:
                raise QuotaExceeded(
                    f"Tenant {locked.slug} holds {MAX_CALENDARS_PER_TENANT} calendars, the most it may.",
                    QUOTA_RETRY_AFTER_SECONDS,
                )
            calendar = Calendar.objects.create(tenant=locked, **cleaned)
            _open_revision(calendar, now or db_now())
    except IntegrityError:
        raise StateConflict(f"The tenant already has a calendar named {cleaned['name']!r}.") from None
    logger.info(
        "created calendar %s for tenant %s by %s", calendar.name, tenant.slug, actor, extra={"action": "calendar"}
    )
    return calendar


def update_calendar(
    calendar: Calendar, changes: dict[str, Any], *, actor: str, now: datetime | None = None
) -> Calendar:
    """Change dates, ranges or the description; a new content is a new revision, from now on."""
    cleaned = clean_calendar(changes, current=calendar)
    with transaction.atomic():
        calendar = _locked(calendar)
        content_changed = any(
            field in cleaned and cleaned[field] != getattr(calendar, field) for field in ("dates", "ranges")
        )
        for field, value in cleaned.items():
            setattr(calendar, field, value)
        if content_changed:
            calendar.revision += 1
            now = now or db_now()
            _close_revision(calendar, now)
            _open_revision(calendar, now)
        calendar.save()
    logger.info(
        "changed calendar %s (r%d) by %s", calendar.name, calendar.revision, actor, extra={"action": "calendar"}
    )
    return calendar


def delete_calendar(calendar: Calendar, *, actor: str, now: datetime | None = None) -> None:
    """Delete a calendar no active or paused schedule names (StateConflict naming a few that do). Its history
    stays: older versions of schedules name it, and reconcile judges their fires by it."""
    with transaction.atomic():
        calendar = _locked(calendar)
        users = list(schedules_naming(calendar.tenant_id, calendar.name).values_list("name", flat=True)[:5])
        if users:
            raise StateConflict(
                f"Calendar {calendar.name!r} is in use by schedules {', '.join(map(repr, users))}"
                f"{' and more' if len(users) == 5 else ''}; remove it from their exclude_calendars first."
            )
        _close_revision(calendar, now or db_now())
        calendar.delete()
    logger.info("deleted calendar %s by %s", calendar.name, actor, extra={"action": "calendar"})


def check_exclude_calendars(tenant_id: int, names: list[str] | None, *, lock: bool = True) -> None:
    """Every name is one of the tenant's calendars (ScheduleInvalid naming exclude_calendars otherwise). A schedule
    change calls it in its transaction with `lock`: the calendar rows stay locked to its end, so a deletion cannot
    slip between this check and the schedule's commit. (A preview reads without locking.)"""
    if not names:
        return
    if lock:
        # FOR SHARE: schedule changes naming one calendar do not wait for each other; a deletion (FOR UPDATE) waits.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name FROM schedules_calendar WHERE tenant_id = %s AND name = ANY(%s) FOR SHARE",
                [tenant_id, list(names)],
            )
            found = {row[0] for row in cursor.fetchall()}
    else:
        found = set(Calendar.objects.filter(tenant_id=tenant_id, name__in=names).values_list("name", flat=True))
    unknown = [name for name in names if name not in found]
    if unknown:
        raise ScheduleInvalid(
            {"exclude_calendars": [f"No calendar named {', '.join(map(repr, unknown))}; create it first."]}
        )


def _locked(calendar: Calendar) -> Calendar:
    """The calendar's row, locked, after its tenant's row, the order every schedule change takes (tenant, then the
    calendars it names: check_exclude_calendars). FOR NO KEY UPDATE on the tenant: the revision this change writes
    checks its foreign key with a KEY SHARE lock on the tenant at commit, which a schedule change's own commit also
    takes, and neither may wait for the other. StateConflict when the calendar was deleted meanwhile."""
    Tenant.objects.select_for_update(no_key=True).filter(pk=calendar.tenant_id).first()
    locked = Calendar.objects.select_for_update().filter(pk=calendar.pk).first()
    if locked is None:
        raise Gone(f"Calendar {calendar.name!r} was deleted meanwhile.")
    return locked


def schedules_naming(tenant_id: int, name: str):
    """The active or paused schedules of the tenant that name calendar `name`: what keeps it from being deleted."""
    return Schedule.objects.filter(
        tenant_id=tenant_id,
        state__in=[ScheduleState.ACTIVE, ScheduleState.PAUSED],
        exclude_calendars__contains=[name],
    )


def _open_revision(calendar: Calendar, now: datetime) -> None:
    CalendarRevision.objects.create(
        tenant_id=calendar.tenant_id,
        name=calendar.name,
        revision=calendar.revision,
        dates=calendar.dates,
        ranges=calendar.ranges,
        valid_from=now,
    )


def _close_revision(calendar: Calendar, now: datetime) -> None:
    CalendarRevision.objects.filter(tenant_id=calendar.tenant_id, name=calendar.name, valid_to__isnull=True).update(
        valid_to=now
    )
