"""How instants and rules read in the console: UTC and local wall-clock text, schedules and versions in words."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core.choices import Kind
from core.cron_syntax import TimeRuleError
from core.timerules import local_time
from schedules.cron_text import describe_cron
from schedules.models import Schedule


def _clock(value: datetime) -> str:
    # Cron fires land on whole minutes; seconds only appear when a one-off or an interval asked for them.
    return "%Y-%m-%d %H:%M:%S" if value.second or value.microsecond else "%Y-%m-%d %H:%M"


def format_utc(instant: datetime | None) -> str:
    if instant is None:
        return "—"
    instant = instant.astimezone(UTC)
    return f"{instant.strftime(_clock(instant))} UTC"


def format_local(instant: datetime | None, timezone: str, *, with_offset: bool = False) -> str:
    """Wall-clock time in the schedule's zone with its abbreviation, e.g. '2026-12-01 02:30 EST'."""
    if instant is None:
        return "—"
    try:
        local = local_time(instant, timezone)
    except TimeRuleError:
        return format_utc(instant)
    text = f"{local.strftime(_clock(local))} {local.tzname()}"
    if with_offset:
        text += f" (UTC{local.strftime('%z')[:3]}:{local.strftime('%z')[3:]})"
    return text


def every_text(seconds: int | None) -> str:
    """'every 90 s' reads worse than 'every 1 min 30 s': a period in the units an operator thinks in."""
    if not seconds:
        return "every ? s"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    return "every " + " ".join(f"{value} {unit}" for value, unit in parts if value)


def describe_schedule(schedule: Schedule) -> str:
    """'At 02:30 every day (America/New_York)', 'Once at 2026-12-01 09:00 EST (America/New_York)' or
    'Every 1 h 30 min from 2026-12-01 09:00 UTC, elapsed time (Europe/Madrid)'."""
    if schedule.kind == Kind.ONCE:
        return f"Once at {format_local(schedule.run_at, schedule.timezone)} ({schedule.timezone})"
    if schedule.kind == Kind.INTERVAL:
        every = every_text(schedule.every_seconds).capitalize()
        text = f"{every} from {format_utc(schedule.anchor_at)}, elapsed time ({schedule.timezone})"
        return (
            text + _window_text(schedule.start_at, schedule.end_at) + _runs_text(schedule) + _calendars_text(schedule)
        )
    try:
        text = describe_cron(schedule.cron or "")
    except TimeRuleError:
        text = schedule.cron or "?"
    policy = _dst_policy_text(schedule.dst_gap, schedule.dst_repeat)
    window = _window_text(schedule.start_at, schedule.end_at)
    return f"{text} ({schedule.timezone}){policy}{window}{_runs_text(schedule)}{_calendars_text(schedule)}"


def _calendars_text(schedule: Schedule) -> str:
    """'; except on es-holidays' for a schedule that names calendars."""
    names = schedule.exclude_calendars
    return f"; except on {', '.join(names)}" if names else ""


def _runs_text(schedule: Schedule) -> str:
    """'; 3 of 5 runs left' for a saved schedule under max_runs, '; at most 5 runs' for an unsaved one."""
    if schedule.max_runs is None:
        return ""
    remaining = schedule.remaining_runs_now if not schedule._state.adding else None
    if remaining is None:
        return f"; at most {schedule.max_runs} runs"
    return f"; {remaining} of {schedule.max_runs} runs left"


def _window_text(start: datetime | None, end: datetime | None) -> str:
    """'; from 2026-12-01 09:00 UTC until 2026-12-31 18:00 UTC', or less of it, or nothing."""
    parts = [f"from {format_utc(start)}" if start else "", f"until {format_utc(end)}" if end else ""]
    return "; " + " ".join(part for part in parts if part) if start or end else ""


def _dst_policy_text(gap: str | None, repeat: str | None) -> str:
    """A policy other than the default, in words: '; skipped times shifted, repeated times fire twice'."""
    words = []
    if gap == "shift":
        words.append("skipped local times shifted")
    if repeat == "last":
        words.append("repeated local times at their second instant")
    elif repeat == "both":
        words.append("repeated local times fire twice")
    return "; " + ", ".join(words) if words else ""


def summarize_definition(definition: dict[str, Any]) -> str:
    if definition.get("kind") == Kind.ONCE:
        when = f"once at {definition.get('run_at')}"
    elif definition.get("kind") == Kind.INTERVAL:
        when = f"{every_text(definition.get('every_seconds'))} from {definition.get('anchor_at')}"
    else:
        when = f"cron '{definition.get('cron')}'"
    return (
        f"{when} in {definition.get('timezone')}; handler {definition.get('handler')}; "
        f"{definition.get('lane')} lane; priority {definition.get('priority')}; state {definition.get('state')}"
    )
