"""The reconciler: recompute expected occurrences from ScheduleVersion history and the time rules, report every gap."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KT

from dispatch.identity import occurrence_id_for
from schedules.clock import db_now
from schedules.models import ScheduleVersion
from schedules.timerules import TimeRule, TimeRuleError

# This module deliberately imports neither dispatch/planning.py nor the materializer: it is the independent second
# opinion of ARCHITECTURE.md "Observability". A bug shared by both code paths would be invisible to it.

logger = logging.getLogger(__name__)

# Fires newer than this may legitimately not exist yet (the materializer runs one horizon ahead, but a batch in
# progress, a lease hand-over or a short stall can hold it back), so they are never reported as gaps.
RECONCILE_GRACE_SECONDS = 120
# Schedules whose versions are loaded at once; bounds memory together with EXPECTED_CHUNK.
SCHEDULE_BATCH = 500
# Expected fires looked up per query: the (occurrence_id, scheduled_for) arrays stay a few hundred kilobytes.
EXPECTED_CHUNK = 5000
# Gaps kept with their details; the count is always exact.
GAP_SAMPLE_LIMIT = 1000
# Unexpected rows kept with their details (informational) and the sampling work spent finding them.
UNEXPECTED_SAMPLE_LIMIT = 50
UNEXPECTED_SAMPLE_PAGE = 1000
UNEXPECTED_SAMPLE_QUERIES = 200

_ONE_MICROSECOND = timedelta(microseconds=1)

# Expected fires of one chunk that have a row. Both columns are matched: the table is partitioned by
# scheduled_for, and the explicit range lets PostgreSQL prune to the chunk's days before probing each
# partition's primary key (occurrence_id, scheduled_for).
FIND_EXPECTED = """
SELECT o.occurrence_id, o.state
FROM dispatch_occurrence AS o
JOIN unnest(%(ids)s::uuid[], %(fors)s::timestamptz[]) AS e(occurrence_id, scheduled_for)
  ON o.occurrence_id = e.occurrence_id AND o.scheduled_for = e.scheduled_for
WHERE o.scheduled_for >= %(low)s AND o.scheduled_for <= %(high)s
"""

# Every non-manual row of a batch of schedules in the window, counted per (schedule, version, state); minus the
# rows matched above this leaves the unexpected ones. Served by occurrence_schedule_recent.
COUNT_ROWS = """
SELECT schedule_id, schedule_version, state, count(*)
FROM dispatch_occurrence
WHERE schedule_id = ANY(%(schedule_ids)s::uuid[])
  AND scheduled_for >= %(since)s AND scheduled_for < %(until)s
  AND NOT manual
GROUP BY schedule_id, schedule_version, state
"""

SAMPLE_ROWS = """
SELECT occurrence_id, scheduled_for, state
FROM dispatch_occurrence
WHERE schedule_id = %(schedule_id)s AND schedule_version = %(version)s
  AND scheduled_for >= %(since)s AND scheduled_for < %(until)s
  AND NOT manual
ORDER BY scheduled_for
LIMIT %(limit)s
"""


class ReconcileInputError(ValueError):
    """A window or instant the reconciler (or backfill) cannot work with; the message is for the operator."""


def parse_instant(text: str, name: str) -> datetime:
    """An ISO 8601 instant with an offset or 'Z', as aware UTC; naive times are refused (which zone?)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReconcileInputError(
            f"{name} {text!r} is not an ISO 8601 instant; use e.g. 2026-03-01T00:00:00Z."
        ) from None
    if value.utcoffset() is None:
        raise ReconcileInputError(f"{name} {text!r} has no offset; add 'Z' or e.g. '+01:00'.")
    return value.astimezone(UTC)


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

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> VersionSpan:
        run_at, error = None, None
        if row["run_at"]:
            try:
                run_at = datetime.fromisoformat(row["run_at"]).astimezone(UTC)
            except ValueError:
                error = f"run_at {row['run_at']!r} is not an ISO 8601 instant"
        try:
            priority = int(row["priority"] or 0)
        except ValueError:
            priority, error = 0, f"priority {row['priority']!r} is not an integer"
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
            error=error,
        )

    @property
    def rule(self) -> TimeRule:
        return TimeRule(kind=self.kind, timezone=self.timezone, cron=self.cron, run_at=self.run_at)

    def once_applies(self) -> bool:
        """A one-off's run_at belongs to this version if the version could still reach it: the creating version
        keeps a run_at that is already past (the materializer records it), later versions only a future one."""
        if self.run_at is None:
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

    Only an active version fires. A cron version fires strictly after valid_from (create, update and resume set
    the cursor to the first fire after "now") and before valid_to (the next version takes over from there).
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
        if span.once_applies() and since <= span.run_at < end:
            yield _fire(span, span.run_at)
        return
    if span.kind != "cron" or not span.cron:
        raise ValueError(f"kind {span.kind!r} with cron {span.cron!r} has no fire times")
    # Fires are whole microseconds: "after since - 1 µs" is "at or after since".
    after = max(span.valid_from, since - _ONE_MICROSECOND)
    for fire in span.rule.iter_after(after):
        if fire >= end:
            return
        yield _fire(span, fire)


def expects(span: VersionSpan, at: datetime) -> bool:
    """Whether version `span` owes a fire at instant `at` (no window), i.e. a row at `at` is legitimate."""
    if span.error or span.state != "active":
        return False
    if span.kind == "once":
        return span.once_applies() and span.run_at == at
    if span.kind != "cron" or not span.cron:
        return False
    if at <= span.valid_from or (span.valid_to is not None and at >= span.valid_to):
        return False
    return span.rule.next_after(at - _ONE_MICROSECOND) == at


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


def _overlapping(since: datetime, until: datetime) -> Q:
    return Q(valid_from__lt=until) & (Q(valid_to__isnull=True) | Q(valid_to__gt=since))


def version_spans(schedule_ids: Iterable[uuid.UUID], since: datetime, until: datetime) -> list[VersionSpan]:
    """The versions of these schedules that overlap [since, until), by schedule then version.

    Only the time fields of the snapshot are read out of the JSON: a payload of up to 64 KiB per version would
    otherwise dominate the reconciler's memory.
    """
    rows = (
        ScheduleVersion.objects.filter(_overlapping(since, until), schedule_id__in=list(schedule_ids))
        .order_by("schedule_id", "version")
        .values(
            "schedule_id",
            "tenant_id",
            "version",
            "change",
            "valid_from",
            "valid_to",
            state=KT("definition__state"),
            kind=KT("definition__kind"),
            cron=KT("definition__cron"),
            run_at=KT("definition__run_at"),
            timezone=KT("definition__timezone"),
            lane=KT("definition__lane"),
            priority=KT("definition__priority"),
        )
    )
    return [VersionSpan.from_row(row) for row in rows]


def schedule_batches(
    since: datetime, until: datetime, *, tenant_id: int | None = None, batch_size: int = SCHEDULE_BATCH
) -> Iterator[list[uuid.UUID]]:
    """Ids of schedules with a version overlapping the window, in keyset-paginated batches (memory bounded)."""
    versions = ScheduleVersion.objects.filter(_overlapping(since, until))
    if tenant_id is not None:
        versions = versions.filter(tenant_id=tenant_id)
    last: uuid.UUID | None = None
    while True:
        page = versions if last is None else versions.filter(schedule_id__gt=last)
        ids = list(page.order_by("schedule_id").values_list("schedule_id", flat=True).distinct()[:batch_size])
        if not ids:
            return
        yield ids
        last = ids[-1]


@dataclass(frozen=True)
class Gap:
    """An expected fire without any occurrence row: the silent omission the reconciler exists to catch."""

    schedule_id: uuid.UUID
    tenant_id: int
    version: int
    scheduled_for: datetime
    occurrence_id: uuid.UUID

    def as_dict(self) -> dict[str, Any]:
        return {
            "schedule_id": str(self.schedule_id),
            "tenant_id": self.tenant_id,
            "version": self.version,
            "scheduled_for": _iso(self.scheduled_for),
            "occurrence_id": str(self.occurrence_id),
        }


@dataclass(frozen=True)
class UnexpectedRow:
    occurrence_id: uuid.UUID
    schedule_id: uuid.UUID
    version: int
    scheduled_for: datetime
    state: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "occurrence_id": str(self.occurrence_id),
            "schedule_id": str(self.schedule_id),
            "version": self.version,
            "scheduled_for": _iso(self.scheduled_for),
            "state": self.state,
        }


@dataclass(frozen=True)
class UnreadableVersion:
    schedule_id: uuid.UUID
    version: int
    error: str

    def as_dict(self) -> dict[str, Any]:
        return {"schedule_id": str(self.schedule_id), "version": self.version, "error": self.error}


@dataclass
class ReconcileReport:
    since: datetime
    until: datetime
    checked_until: datetime
    tenant_id: int | None = None
    schedules: int = 0
    versions: int = 0
    expected: int = 0
    found_by_state: Counter[str] = field(default_factory=Counter)
    missing: int = 0
    schedules_with_gaps: int = 0
    gaps: list[Gap] = field(default_factory=list)
    unexpected_by_state: Counter[str] = field(default_factory=Counter)
    unexpected_samples: list[UnexpectedRow] = field(default_factory=list)
    unreadable_versions: list[UnreadableVersion] = field(default_factory=list)

    @property
    def found(self) -> int:
        return sum(self.found_by_state.values())

    @property
    def unexpected(self) -> int:
        return sum(self.unexpected_by_state.values())

    @property
    def ok(self) -> bool:
        """Every expected fire has a row, whatever its state (succeeded, dead, missed, canceled, ...), and every
        version could be read: an unreadable one owes unknown fires, which must not pass for "none"."""
        return self.missing == 0 and not self.unreadable_versions

    def as_dict(self, gap_limit: int | None = None) -> dict[str, Any]:
        gaps = self.gaps if gap_limit is None else self.gaps[:gap_limit]
        return {
            "since": _iso(self.since),
            "until": _iso(self.until),
            "checked_until": _iso(self.checked_until),
            "grace_seconds": RECONCILE_GRACE_SECONDS,
            "tenant_id": self.tenant_id,
            "schedules": self.schedules,
            "versions": self.versions,
            "expected": self.expected,
            "found": self.found,
            "found_by_state": dict(sorted(self.found_by_state.items())),
            "missing": self.missing,
            "schedules_with_gaps": self.schedules_with_gaps,
            "gaps": [gap.as_dict() for gap in gaps],
            "unexpected": self.unexpected,
            "unexpected_by_state": dict(sorted(self.unexpected_by_state.items())),
            "unexpected_samples": [row.as_dict() for row in self.unexpected_samples],
            "unreadable_versions": [version.as_dict() for version in self.unreadable_versions],
            "ok": self.ok,
        }


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def reconcile(
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    now: datetime | None = None,
    grace_seconds: float = RECONCILE_GRACE_SECONDS,
    batch_size: int = SCHEDULE_BATCH,
) -> ReconcileReport:
    """Compare the fires owed in [since, until) with the occurrence rows; `now` is PostgreSQL's clock by default.

    1. Cap `until` at now - grace: younger fires may be legitimately not materialized yet.
    2. For each batch of schedules with a version overlapping the window, stream each version's expected fires
       (snapshot + time rules) and look their (occurrence_id, scheduled_for) up in chunks: found by state, or a gap.
    3. Count every non-manual row of those schedules in the window; rows beyond the matched ones are unexpected
       (e.g. a fire materialized one horizon ahead and canceled by the next version): informational only.
    """
    if since.utcoffset() is None or until.utcoffset() is None:
        raise ReconcileInputError("since and until must carry an offset.")
    if since >= until:
        raise ReconcileInputError(f"since ({_iso(since)}) must be before until ({_iso(until)}).")
    now = now or db_now()
    checked_until = min(until, now - timedelta(seconds=grace_seconds))
    report = ReconcileReport(since=since, until=until, checked_until=checked_until, tenant_id=tenant_id)
    if checked_until <= since:
        logger.info("reconcile window lies within the grace period; nothing to check", extra={"action": "reconcile"})
        return report

    for schedule_ids in schedule_batches(since, checked_until, tenant_id=tenant_id, batch_size=batch_size):
        _reconcile_batch(report, schedule_ids, since, checked_until)

    log = logger.warning if report.missing else logger.info
    log(
        "reconciled %s..%s: expected %d, found %d, missing %d, unexpected %d",
        _iso(since),
        _iso(checked_until),
        report.expected,
        report.found,
        report.missing,
        report.unexpected,
        extra={"action": "reconcile"},
    )
    return report


def _reconcile_batch(report: ReconcileReport, schedule_ids: list[uuid.UUID], since: datetime, until: datetime) -> None:
    spans = version_spans(schedule_ids, since, until)
    report.schedules += len(schedule_ids)
    report.versions += len(spans)
    found_per_version: Counter[tuple[uuid.UUID, int, str]] = Counter()
    gap_schedules: set[uuid.UUID] = set()

    chunk: list[ExpectedFire] = []
    for span in spans:
        try:
            for fire in expected_fires(span, since, until):
                chunk.append(fire)
                if len(chunk) >= EXPECTED_CHUNK:
                    _check_chunk(report, chunk, found_per_version, gap_schedules)
                    chunk = []
        except (TimeRuleError, ValueError) as exc:
            # One corrupt snapshot must not hide every other schedule's gaps: record it, fail the run, go on.
            report.unreadable_versions.append(UnreadableVersion(span.schedule_id, span.version, str(exc)))
            logger.error(
                "version %d of schedule %s cannot be read: %s",
                span.version,
                span.schedule_id,
                exc,
                extra={"action": "reconcile_unreadable"},
            )
    if chunk:
        _check_chunk(report, chunk, found_per_version, gap_schedules)
    report.schedules_with_gaps += len(gap_schedules)
    _count_unexpected(report, schedule_ids, spans, found_per_version, since, until)


def _check_chunk(
    report: ReconcileReport,
    chunk: list[ExpectedFire],
    found_per_version: Counter[tuple[uuid.UUID, int, str]],
    gap_schedules: set[uuid.UUID],
) -> None:
    fors = [fire.scheduled_for for fire in chunk]
    with connection.cursor() as cursor:
        cursor.execute(
            FIND_EXPECTED,
            {"ids": [fire.occurrence_id for fire in chunk], "fors": fors, "low": min(fors), "high": max(fors)},
        )
        states = dict(cursor.fetchall())
    report.expected += len(chunk)
    for fire in chunk:
        state = states.get(fire.occurrence_id)
        if state is None:
            report.missing += 1
            gap_schedules.add(fire.schedule_id)
            if len(report.gaps) < GAP_SAMPLE_LIMIT:
                report.gaps.append(
                    Gap(fire.schedule_id, fire.tenant_id, fire.version, fire.scheduled_for, fire.occurrence_id)
                )
        else:
            report.found_by_state[state] += 1
            found_per_version[(fire.schedule_id, fire.version, state)] += 1


def _count_unexpected(
    report: ReconcileReport,
    schedule_ids: list[uuid.UUID],
    spans: list[VersionSpan],
    found_per_version: Counter[tuple[uuid.UUID, int, str]],
    since: datetime,
    until: datetime,
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(COUNT_ROWS, {"schedule_ids": schedule_ids, "since": since, "until": until})
        rows = cursor.fetchall()
    # An expected id matches at most one row (the id is derived from the fire), so the difference is exact.
    surplus_versions: list[tuple[uuid.UUID, int]] = []
    for schedule_id, version, state, count in rows:
        surplus = count - found_per_version.get((schedule_id, version, state), 0)
        if surplus > 0:
            report.unexpected_by_state[state] += surplus
            if (schedule_id, version) not in surplus_versions:
                surplus_versions.append((schedule_id, version))
    if surplus_versions and len(report.unexpected_samples) < UNEXPECTED_SAMPLE_LIMIT:
        _sample_unexpected(report, surplus_versions, spans, since, until)


def _sample_unexpected(
    report: ReconcileReport,
    surplus_versions: list[tuple[uuid.UUID, int]],
    spans: list[VersionSpan],
    since: datetime,
    until: datetime,
) -> None:
    """Name a few unexpected rows, checking each row against its version; bounded work, first page per version."""
    by_version = {(span.schedule_id, span.version): span for span in spans}
    with connection.cursor() as cursor:
        for schedule_id, version in surplus_versions[:UNEXPECTED_SAMPLE_QUERIES]:
            if len(report.unexpected_samples) >= UNEXPECTED_SAMPLE_LIMIT:
                return
            cursor.execute(
                SAMPLE_ROWS,
                {
                    "schedule_id": schedule_id,
                    "version": version,
                    "since": since,
                    "until": until,
                    "limit": UNEXPECTED_SAMPLE_PAGE,
                },
            )
            # A version that does not overlap the window (not loaded) owes nothing in it.
            span = by_version.get((schedule_id, version))
            for occurrence_id, scheduled_for, state in cursor.fetchall():
                legitimate = (
                    span is not None
                    and expects(span, scheduled_for)
                    and occurrence_id == occurrence_id_for(schedule_id, version, scheduled_for)
                )
                if not legitimate:
                    report.unexpected_samples.append(
                        UnexpectedRow(occurrence_id, schedule_id, version, scheduled_for, state)
                    )
                    if len(report.unexpected_samples) >= UNEXPECTED_SAMPLE_LIMIT:
                        return
