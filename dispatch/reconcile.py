"""The reconciler: recompute expected occurrences from ScheduleVersion history and the time rules, report every gap."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from core.clock import db_now
from core.cron_syntax import TimeRuleError
from dispatch.errors import ReconcileInputError
from dispatch.history import ExpectedFire, VersionSpan, expected_fires, expects, schedule_batches, version_spans
from dispatch.identity import occurrence_id_for
from dispatch.sql import maintenance as maintenance_sql
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS, StuckOccurrence, stuck_pages

# This module deliberately imports neither dispatch/planning.py nor the materializer: it is the independent second
# opinion of docs/ARCHITECTURE.md "Observability". A bug shared by both code paths would be invisible to it.

logger = logging.getLogger(__name__)

# Fires newer than this may legitimately not exist yet (the materializer runs one horizon ahead, but a batch in
# progress, a lease hand-over or a short stall can hold it back), so they are never reported as gaps.
RECONCILE_GRACE_SECONDS = 120
# Schedules whose versions are loaded at once; bounds memory together with EXPECTED_CHUNK.
SCHEDULE_BATCH = 500
# Expected fires looked up per query: the (occurrence_id, scheduled_for) arrays stay a few hundred kilobytes.
EXPECTED_CHUNK = 5000
# Gaps (and stuck occurrences) kept with their details; the counts are always exact.
GAP_SAMPLE_LIMIT = 1000
STUCK_SAMPLE_LIMIT = 1000
# Unexpected rows kept with their details (informational) and the sampling work spent finding them.
UNEXPECTED_SAMPLE_LIMIT = 50
UNEXPECTED_SAMPLE_PAGE = 1000
UNEXPECTED_SAMPLE_QUERIES = 200


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
    stuck_after_seconds: float = DEFAULT_STUCK_AFTER_SECONDS
    stuck: int = 0
    stuck_by_state: Counter[str] = field(default_factory=Counter)
    stuck_samples: list[StuckOccurrence] = field(default_factory=list)

    @property
    def found(self) -> int:
        return sum(self.found_by_state.values())

    @property
    def unexpected(self) -> int:
        return sum(self.unexpected_by_state.values())

    @property
    def ok(self) -> bool:
        """Every expected fire has a row, whatever its state (succeeded, dead, missed, canceled, ...), every
        version could be read (an unreadable one owes unknown fires, which must not pass for "none"), and no
        occurrence is stuck: a row that never runs is not accounted for."""
        return self.missing == 0 and not self.unreadable_versions and self.stuck == 0

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
            "stuck_after_seconds": self.stuck_after_seconds,
            "stuck": self.stuck,
            "stuck_by_state": dict(sorted(self.stuck_by_state.items())),
            "stuck_samples": [row.as_dict() for row in self.stuck_samples],
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
    stuck_after_seconds: float | None = None,
) -> ReconcileReport:
    """Compare the fires owed in [since, until) with the occurrence rows; `now` is PostgreSQL's clock by default.

    1. Cap `until` at now - grace: younger fires may be legitimately not materialized yet.
    2. For each batch of schedules with a version overlapping the window, stream each version's expected fires
       (snapshot + time rules) and look their (occurrence_id, scheduled_for) up in chunks: found by state, or a gap.
    3. Count every non-manual row of those schedules in the window; rows beyond the matched ones are unexpected
       (e.g. a fire materialized one horizon ahead and canceled by the next version): informational only.
    4. List the occurrences of the window that are stuck (dispatch/stuck.py): a row that never runs fails the
       run as a gap does.
    """
    if since.utcoffset() is None or until.utcoffset() is None:
        raise ReconcileInputError("since and until must carry an offset.")
    if since >= until:
        raise ReconcileInputError(f"since ({_iso(since)}) must be before until ({_iso(until)}).")
    now = now or db_now()
    checked_until = min(until, now - timedelta(seconds=grace_seconds))
    report = ReconcileReport(
        since=since,
        until=until,
        checked_until=checked_until,
        tenant_id=tenant_id,
        stuck_after_seconds=DEFAULT_STUCK_AFTER_SECONDS if stuck_after_seconds is None else stuck_after_seconds,
    )
    _find_stuck(report, since, until, now)
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


def _find_stuck(report: ReconcileReport, since: datetime, until: datetime, now: datetime) -> None:
    for page in stuck_pages(
        since=since, until=until, now=now, stuck_after_seconds=report.stuck_after_seconds, tenant_id=report.tenant_id
    ):
        report.stuck += len(page)
        for row in page:
            report.stuck_by_state[row.state] += 1
        report.stuck_samples.extend(page[: max(0, STUCK_SAMPLE_LIMIT - len(report.stuck_samples))])
    if report.stuck:
        logger.warning(
            "%d occurrences stuck for more than %.0fs",
            report.stuck,
            report.stuck_after_seconds,
            extra={"action": "reconcile_stuck"},
        )


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
            maintenance_sql.RECONCILE_FIND_EXPECTED,
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
        cursor.execute(
            maintenance_sql.RECONCILE_COUNT_ROWS, {"schedule_ids": schedule_ids, "since": since, "until": until}
        )
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
                maintenance_sql.RECONCILE_SAMPLE_ROWS,
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
