"""What a schedule is doing now: its last run, its next fire from the time rules, and whether the cursor lags.

The schedule list shows these for the rows of one page (scheduler_project.console.PageChangeList): one query over
those rows, with a subquery per row on the (schedule_id, scheduled_for DESC) index of the occurrences.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import JSONField, OuterRef, Q, Subquery
from django.db.models.functions import JSONObject

from core.choices import Kind, ScheduleState
from core.cron_syntax import TimeRuleError
from core.exclusions import Exclusions
from dispatch.models import Occurrence, OccurrenceState
from schedules.models import Calendar, Schedule

# The materializer keeps the cursor a horizon ahead of now; a cursor this far in the past while the schedule is
# active means fires are due that nobody has materialized (the materializer is down or behind). Below it, a
# cursor can trail by one idle step of the materializer without anything being wrong.
CURSOR_BEHIND_TOLERANCE = timedelta(seconds=10)

# What became of a one-off's single fire, in the words of the state column ("fired — dead").
FIRE_OUTCOME: dict[str, str] = {
    OccurrenceState.SCHEDULED: "queued",
    OccurrenceState.ENQUEUED: "queued",
    OccurrenceState.RUNNING: "running",
    OccurrenceState.RETRY_WAIT: "retrying",
    OccurrenceState.SUCCEEDED: "succeeded",
    OccurrenceState.DEAD: "dead",
    OccurrenceState.MISSED: "missed",
    OccurrenceState.CANCELED: "canceled",
    OccurrenceState.SKIPPED_OVERLAP: "skipped (overlap)",
}


# "Last run" is the last fire that was due and went somewhere: ran, failed, was judged missed or skipped. A fire a
# schedule change (update, pause, cancel) withdrew before any worker claimed it never ran: it is history on the
# occurrence list, not the answer to "when did this last run?". One canceled while running did run, and counts.
WITHDRAWN_UNRUN = Q(state=OccurrenceState.CANCELED, attempt_count=0)


@dataclass(frozen=True)
class Run:
    """One occurrence, as the list shows it."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    state: str
    reason: str
    manual: bool

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Run | None:
        if not data:
            return None
        return cls(
            occurrence_id=uuid.UUID(data["id"]),
            scheduled_for=datetime.fromisoformat(data["at"]),
            state=data["state"],
            reason=data["reason"] or "",
            manual=bool(data["manual"]),
        )


@dataclass(frozen=True)
class RunStatus:
    now: datetime
    last_run: Run | None
    # A one-off's own fire (at its run_at, not a manual trigger): what "completed" really came to.
    one_off_fire: Run | None
    next_fire: datetime | None
    rule_error: str
    # How far the cursor (next_run_at) trails now, when it trails by more than the tolerance.
    cursor_behind: timedelta | None

    def state_text(self, schedule: Schedule) -> str:
        """The state, except that a completed one-off says what happened to its fire."""
        if schedule.kind == Kind.ONCE and schedule.state == ScheduleState.COMPLETED:
            fire = self.one_off_fire
            if fire is None:
                return "completed (no occurrence on record)"
            return f"fired — {FIRE_OUTCOME.get(fire.state, fire.state)}"
        if schedule.state == ScheduleState.PAUSED and schedule.resume_at is not None:
            return f"paused until {schedule.resume_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        return schedule.get_state_display()

    def state_key(self, schedule: Schedule) -> str:
        """The state the text stands for (an occurrence state for a fired one-off), for styling."""
        if schedule.kind == Kind.ONCE and schedule.state == ScheduleState.COMPLETED and self.one_off_fire:
            return self.one_off_fire.state
        return schedule.state


def _run_json(prefix: str = "") -> JSONObject:
    return JSONObject(
        id=f"{prefix}occurrence_id",
        at=f"{prefix}scheduled_for",
        state=f"{prefix}state",
        reason=f"{prefix}state_reason",
        manual=f"{prefix}manual",
    )


def run_statuses(schedules: Iterable[Schedule], now: datetime) -> dict[uuid.UUID, RunStatus]:
    """Last run, one-off fire, next fire and cursor lag of each schedule, with one query for all of them."""
    schedules = list(schedules)
    if not schedules:
        return {}
    # Only the retention period holds occurrences: the bound lets PostgreSQL prune older day partitions.
    since = now - timedelta(days=settings.SCHEDULER_RETENTION_DAYS + 1)
    last = (
        Occurrence.objects.filter(schedule_id=OuterRef("pk"), scheduled_for__gte=since, scheduled_for__lte=now)
        .exclude(WITHDRAWN_UNRUN)
        # An update withdraws the old version's fire and materializes the new version's at the same instant: the
        # newest version is the one that ran.
        .order_by("-scheduled_for", "-schedule_version")
        .values(run=_run_json())[:1]
    )
    # NULL for cron schedules (run_at IS NULL matches nothing), so only one-offs pay for this probe.
    fired = (
        Occurrence.objects.filter(schedule_id=OuterRef("pk"), scheduled_for=OuterRef("run_at"), manual=False)
        .order_by("-schedule_version")
        .values(run=_run_json())[:1]
    )
    rows = (
        Schedule.objects.filter(pk__in=[schedule.pk for schedule in schedules])
        .order_by()
        .values_list("pk")
        .annotate(
            last_run=Subquery(last, output_field=JSONField()),
            one_off_fire=Subquery(fired, output_field=JSONField()),
        )
    )
    found = {pk: (Run.from_json(last_run), Run.from_json(one_off)) for pk, last_run, one_off in rows}
    statuses = {}
    # The calendars of the page, read once per combination (Schedule.time_rule would read them once per row).
    calendars = {
        (row.tenant_id, tuple(row.exclude_calendars)): Calendar.objects.exclusions(row.tenant_id, row.exclude_calendars)
        for row in schedules
        if row.exclude_calendars
    }
    for schedule in schedules:
        last_run, one_off_fire = found.get(schedule.pk, (None, None))
        exclusions = calendars.get((schedule.tenant_id, tuple(schedule.exclude_calendars or ())))
        next_fire, rule_error = _next_fire(schedule, now, exclusions)
        statuses[schedule.pk] = RunStatus(
            now=now,
            last_run=last_run,
            one_off_fire=one_off_fire,
            next_fire=next_fire,
            rule_error=rule_error,
            cursor_behind=_cursor_behind(schedule, now),
        )
    return statuses


def _next_fire(schedule: Schedule, now: datetime, exclusions: Exclusions | None) -> tuple[datetime | None, str]:
    """The next fire the time rules give after now, less what the schedule's calendars exclude: the cursor can run
    a horizon ahead of it (fires already materialized) or trail it (the materializer is behind), so it is not the
    answer."""
    if schedule.state != ScheduleState.ACTIVE:
        return None, ""
    try:
        return dataclasses.replace(schedule.rhythm, exclusions=exclusions).next_after(now), ""
    except (TimeRuleError, ValueError) as exc:
        return None, str(exc)


def _cursor_behind(schedule: Schedule, now: datetime) -> timedelta | None:
    if schedule.state != ScheduleState.ACTIVE or schedule.next_run_at is None:
        return None
    behind = now - schedule.next_run_at
    return behind if behind > CURSOR_BEHIND_TOLERANCE else None


def duration_text(span: timedelta) -> str:
    """'3 min 12 s', '2 h 5 min', '4 d 1 h': how an operator reads a lag at a glance."""
    seconds = int(span.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"
