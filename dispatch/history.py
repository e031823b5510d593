"""What each schedule version owed: its time-rule snapshot, its validity span and the fires it expected.

Derived only from the schedules' version history and the time rules, never from the materializer's code path: the
reconciler uses it as an independent second opinion, and backfill to recreate exactly the fires it would expect.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from core.exclusions import ExclusionHistory, Exclusions
from core.timerules import TimeRule
from dispatch.calendars import stored_exclusions
from dispatch.identity import occurrence_id_for
from dispatch.sql import control_plane as control_plane_sql

_ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class VersionSpan:
    """The part of a ScheduleVersion the reconciler needs: its time rule snapshot and its validity."""

    schedule_id: uuid.UUID
    tenant_id: int
    version: int
    change: str
    state: str
    kind: str
    cron: str | None
    run_at: datetime | None
    timezone: str
    lane: str
    priority: int
    valid_from: datetime
    valid_to: datetime | None
    # Why the snapshot cannot be read, if it cannot: its fires are then unknown, which is not "none owed".
    error: str | None = None
    every_seconds: int | None = None
    anchor_at: datetime | None = None
    # A cron version's DST policy (absent from snapshots older than the policy: the default).
    dst_gap: str | None = None
    dst_repeat: str | None = None
    # The version's window (absent from older snapshots: unbounded).
    start_at: datetime | None = None
    end_at: datetime | None = None
    # Under max_runs, the runs left when the version began: it owes at most that many fires (None: no limit).
    remaining_runs: int | None = None
    # The tenant's calendars it names (absent from older snapshots: none), and what they may have excluded over
    # time (version_spans loads it; calendar_history).
    exclude_calendars: tuple[str, ...] = ()
    exclusions: ExclusionHistory | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> VersionSpan:
        errors: list[str] = []
        run_at = _instant(row.get("run_at"), "run_at", errors)
        anchor_at = _instant(row.get("anchor_at"), "anchor_at", errors)
        start_at = _instant(row.get("start_at"), "start_at", errors)
        end_at = _instant(row.get("end_at"), "end_at", errors)
        priority = _integer(row["priority"], "priority", errors) or 0
        every_seconds = _integer(row.get("every_seconds"), "every_seconds", errors)
        remaining_runs = _integer(row.get("remaining_runs"), "remaining_runs", errors)
        calendars = _names(row.get("exclude_calendars"), "exclude_calendars", errors)
        return cls(
            schedule_id=row["schedule_id"],
            tenant_id=row["tenant_id"],
            version=row["version"],
            change=row["change"],
            state=row["state"] or "",
            kind=row["kind"] or "",
            cron=row["cron"] or None,
            run_at=run_at,
            timezone=row["timezone"] or "UTC",
            lane=row["lane"] or "strict",
            priority=priority,
            valid_from=row["valid_from"],
            valid_to=row["valid_to"],
            error="; ".join(errors) or None,
            every_seconds=every_seconds,
            anchor_at=anchor_at,
            dst_gap=row.get("dst_gap") or None,
            dst_repeat=row.get("dst_repeat") or None,
            start_at=start_at,
            end_at=end_at,
            remaining_runs=remaining_runs,
            exclude_calendars=tuple(calendars),
        )

    @property
    def rule(self) -> TimeRule:
        return TimeRule(
            kind=self.kind,
            timezone=self.timezone,
            cron=self.cron,
            run_at=self.run_at,
            every_seconds=self.every_seconds,
            anchor_at=self.anchor_at,
            dst_gap=self.dst_gap,
            dst_repeat=self.dst_repeat,
            start_at=self.start_at,
            end_at=self.end_at,
            exclusions=self.exclusions,
        )

    def recurring_rule(self) -> TimeRule | None:
        """The rule of a cron or interval version that has its time fields; None for another kind or a snapshot
        without them (a one-off is matched by once_applies, not walked)."""
        if self.kind == "cron" and self.cron:
            return self.rule
        if self.kind == "interval" and self.every_seconds is not None and self.anchor_at is not None:
            return self.rule
        return None

    def once_applies(self) -> bool:
        """A one-off's run_at belongs to this version if the version could still reach it: the creating version
        keeps a run_at that is already past (the materializer records it), later versions only a future one."""
        if self.run_at is None or not self.rule.allows(self.run_at):
            return False
        if self.change != "create" and self.run_at <= self.valid_from:
            return False
        return self.valid_to is None or self.run_at < self.valid_to


@dataclass(frozen=True)
class ExpectedFire:
    schedule_id: uuid.UUID
    tenant_id: int
    version: int
    scheduled_for: datetime
    occurrence_id: uuid.UUID
    lane: str
    priority: int


def expected_fires(span: VersionSpan, since: datetime, until: datetime) -> Iterator[ExpectedFire]:
    """The fires version `span` owes in [since, until), ascending; a generator, so long ranges cost no memory.

    Only an active version fires. A cron or interval version fires strictly after valid_from (create, update and
    resume set the cursor to the first fire after "now": an interval's anchor_at before that only sets its phase)
    and before valid_to (the next version takes over from there).
    Raises TimeRuleError or ValueError for a snapshot the time rules cannot read.
    """
    if span.error:
        raise ValueError(span.error)
    if span.state != "active":
        return
    end = until if span.valid_to is None else min(until, span.valid_to)
    if span.kind == "once":
        if span.run_at is None:
            raise ValueError("a one-off version without run_at")
        if span.once_applies() and since <= span.run_at < end and span.remaining_runs != 0:
            yield _fire(span, span.run_at)
        return
    rule = span.recurring_rule()
    if rule is None:
        raise ValueError(f"kind {span.kind!r} without its time fields has no fire times")
    if span.remaining_runs is not None:
        last = _last_owed_fire(span, rule, end)
        if last is None:
            return
        end = min(end, last + _ONE_MICROSECOND)
    # Fires are whole microseconds: "after since - 1 µs" is "at or after since".
    after = max(span.valid_from, since - _ONE_MICROSECOND)
    for fire in rule.iter_after(after):
        if fire >= end:
            return
        yield _fire(span, fire)


def expects(span: VersionSpan, at: datetime) -> bool:
    """Whether version `span` owes a fire at instant `at` (no window), i.e. a row at `at` is legitimate."""
    if span.error or span.state != "active":
        return False
    if span.kind == "once":
        return span.once_applies() and span.run_at == at and span.remaining_runs != 0
    rule = span.recurring_rule()
    if rule is None:
        return False
    if at <= span.valid_from or (span.valid_to is not None and at >= span.valid_to):
        return False
    if span.remaining_runs is not None:
        last = _last_owed_fire(span, rule, at + _ONE_MICROSECOND)
        if last is None or at > last:
            return False
    return rule.next_after(at - _ONE_MICROSECOND) == at


def _last_owed_fire(span: VersionSpan, rule: TimeRule, end: datetime) -> datetime | None:
    """Under max_runs, the last fire version `span` owes: its remaining_runs-th after valid_from; None when it owes
    none. An interval's by arithmetic (without calendars); otherwise by walking its fires, no further than `end`
    (the answer is then `end` itself: the limit does not bind before it)."""
    runs = span.remaining_runs or 0
    if span.exclusions:
        # A fire that only some content in force excluded may have been written, and taken a run: count it.
        rule = replace(rule, exclusions=span.exclusions.certain())
    first = rule.next_after(span.valid_from) if runs > 0 else None
    if first is None:
        return None
    if rule.kind == "interval" and rule.every_seconds and not span.exclusions:
        try:
            return first + timedelta(seconds=rule.every_seconds * (runs - 1))
        except OverflowError:
            return end
    fire: datetime | None = first
    for _ in range(runs - 1):
        if fire is None or fire >= end:
            return end
        fire = rule.next_after(fire)
    return fire if fire is not None else end


def _instant(text: str | None, name: str, errors: list[str]) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:
        errors.append(f"{name} {text!r} is not an ISO 8601 instant")
        return None


def _names(text: str | None, name: str, errors: list[str]) -> list[str]:
    """A JSON list of names (the snapshot's text of it), [] for none."""
    try:
        names = json.loads(text) if text else []
    except ValueError:
        names = None
    if names is None or not isinstance(names, list) or not all(isinstance(item, str) for item in names):
        errors.append(f"{name} {text!r} is not a list of names")
        return []
    return names


def _integer(text: str | None, name: str, errors: list[str]) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        errors.append(f"{name} {text!r} is not an integer")
        return None


def _fire(span: VersionSpan, at: datetime) -> ExpectedFire:
    return ExpectedFire(
        schedule_id=span.schedule_id,
        tenant_id=span.tenant_id,
        version=span.version,
        scheduled_for=at,
        occurrence_id=occurrence_id_for(span.schedule_id, span.version, at),
        lane=span.lane,
        priority=span.priority,
    )


def version_spans(schedule_ids: Iterable[uuid.UUID], since: datetime, until: datetime) -> list[VersionSpan]:
    """The versions of these schedules that overlap [since, until), by schedule then version, each with what its
    calendars may have excluded in the window."""
    with connection.cursor() as cursor:
        cursor.execute(
            control_plane_sql.VERSION_SPANS, {"schedule_ids": list(schedule_ids), "since": since, "until": until}
        )
        names = [column.name for column in cursor.description]
        rows = cursor.fetchall()
    spans = [VersionSpan.from_row(dict(zip(names, row, strict=True))) for row in rows]
    named = {(span.tenant_id, name) for span in spans for name in span.exclude_calendars}
    if not named:
        return spans
    # Under max_runs a version's runs are counted from its start, so its history goes back that far.
    counted_from = [span.valid_from for span in spans if span.exclude_calendars and span.remaining_runs is not None]
    history = calendar_history(named, min([since, *counted_from]), until)
    return [
        replace(
            span,
            exclusions=ExclusionHistory(
                tuple(entry for name in span.exclude_calendars for entry in history.get((span.tenant_id, name), ()))
            ),
        )
        if span.exclude_calendars
        else span
        for span in spans
    ]


# How far behind its fires the materializer may write one and still read calendars then (a batch in progress, a
# lease hand-over): a calendar content that began this long after a fire may still have decided it.
CALENDAR_LATE_SECONDS = 120


def calendar_history(
    named: set[tuple[int, str]], since: datetime, until: datetime
) -> dict[tuple[int, str], list[tuple[datetime, datetime | None, Exclusions]]]:
    """For each (tenant_id, calendar name), its contents that may have decided fires in [since, until), each with
    the fires it applies to: a content in force over [valid_from, valid_to) decided the fires the materializer wrote
    meanwhile, which lie in [valid_from - CALENDAR_LATE_SECONDS, valid_to + horizon) (ExclusionHistory)."""
    horizon = timedelta(seconds=settings.SCHEDULER_HORIZON_SECONDS)
    late = timedelta(seconds=CALENDAR_LATE_SECONDS)
    pairs = sorted(named)
    with connection.cursor() as cursor:
        cursor.execute(
            control_plane_sql.CALENDAR_HISTORY,
            {
                "tenant_ids": [tenant_id for tenant_id, _ in pairs],
                "names": [name for _, name in pairs],
                "since": since - horizon,
                "until": until + late,
            },
        )
        rows = cursor.fetchall()
    history: dict[tuple[int, str], list[tuple[datetime, datetime | None, Exclusions]]] = {}
    for tenant_id, name, dates, ranges, valid_from, valid_to in rows:
        applies_until = None if valid_to is None else valid_to + horizon
        history.setdefault((tenant_id, name), []).append(
            (valid_from - late, applies_until, stored_exclusions(dates, ranges))
        )
    return history


def schedule_batches(
    since: datetime, until: datetime, *, tenant_id: int | None = None, batch_size: int = 500
) -> Iterator[list[uuid.UUID]]:
    """Ids of schedules with a version overlapping the window, in keyset-paginated batches (memory bounded)."""
    last: uuid.UUID | None = None
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                control_plane_sql.SCHEDULES_WITH_VERSIONS,
                {"since": since, "until": until, "tenant_id": tenant_id, "after": last, "limit": batch_size},
            )
            ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return
        yield ids
        last = ids[-1]
