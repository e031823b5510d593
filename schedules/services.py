"""The control plane's verbs: every change to a schedule goes through one of these functions.

Each verb locks the schedule row, writes the new state and an immutable ScheduleVersion in one transaction,
and withdraws unclaimed occurrences of older versions. `now` is PostgreSQL's clock unless a caller drives it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction

from core.choices import Kind, ScheduleState
from core.clock import db_now
from core.shards import shard_for
from core.timerules import TimeRule
from dispatch import services as dispatch_services
from schedules.calendars import check_exclude_calendars
from schedules.definitions import TIME_FIELDS, anchored_at_now, clean_definition, time_rule_of
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import DEFINITION_FIELDS, Calendar, Schedule, ScheduleVersion, VersionChange
from schedules.transitions import changes, refusal
from tenants.models import Tenant
from tenants.services import schedules_held

logger = logging.getLogger(__name__)

MAX_PREVIEW_COUNT = 100
# `_state_with_cursor` called without a cursor of its own: the schedule's.
_UNSET: Any = object()


@dataclass(frozen=True)
class CancelResult:
    schedule: Schedule
    in_flight: list[dispatch_services.InFlight]


def fingerprint(body: dict[str, Any]) -> str:
    """Stable hash of a request body: the same JSON object, in any key order, hashes the same."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- reading ----------------------------------------------------------------------------------------------


def preview_fires(rule: TimeRule, *, after: datetime, count: int) -> list[datetime]:
    """The next `count` fires strictly after `after` (UTC), for a saved or an unsaved definition."""
    fires: list[datetime] = []
    for fire in rule.iter_after(after):
        fires.append(fire)
        if len(fires) >= count:
            break
    return fires


def preview_definition(
    definition: dict[str, Any],
    *,
    after: datetime,
    count: int,
    now: datetime,
    runs_left: int | None = None,
    tenant_id: int | None = None,
) -> list[datetime]:
    """What a schedule with this definition would fire from `after` on, if created (or left active) now.

    The next fires strictly after `after` (an interval without anchor_at anchored at `now`, as create would), and
    one case more: a one-off whose run_at has already passed is created anyway and its misfire policy decides at
    once (dispatch.planning, the materializer's own rule) whether it fires now or is recorded missed. The preview
    shows the fire when it would run, so preview and create agree.

    Under max_runs only `runs_left` fires are listed (an unsaved definition: max_runs, counted from `after`). The
    calendars of `exclude_calendars` are the tenant's, as they are now (ScheduleInvalid naming one it lacks).
    """
    if runs_left is None:
        runs_left = definition.get("max_runs")
    if runs_left is not None:
        count = min(count, runs_left)
        if count <= 0:
            return []
    rule = definition_rule(definition, now=now, tenant_id=tenant_id)
    run_at = rule.run_at
    if rule.kind == Kind.ONCE and run_at is not None and run_at <= min(after, now):
        if not rule.allows(run_at):
            return []
        return [run_at] if dispatch_services.late_one_off_fires(definition, rule, now=now) else []
    return preview_fires(rule, after=after, count=count)


def definition_rule(definition: dict[str, Any], *, now: datetime, tenant_id: int | None) -> TimeRule:
    """The time rule of an unsaved definition (an interval anchored at `now`), its calendars read from the tenant."""
    names = definition.get("exclude_calendars")
    if names and tenant_id is None:
        raise ScheduleInvalid({"exclude_calendars": ["Calendars are a tenant's: preview with the tenant."]})
    if names and tenant_id is not None:
        check_exclude_calendars(tenant_id, names, lock=False)
    exclusions = Calendar.objects.exclusions(tenant_id, names) if tenant_id is not None else None
    return time_rule_of(anchored_at_now(definition, now), exclusions)


def runs_left_after(schedule: Schedule, after: datetime) -> int | None:
    """Under max_runs, how many of the schedule's fires after `after` still happen: the runs left, and the fires
    already written for after `after` (they took theirs). None: no limit."""
    remaining = schedule.remaining_runs_now
    if remaining is None:
        return None
    return remaining + dispatch_services.fires_written_after(schedule.id, after)


def _first_fire(rule: TimeRule, now: datetime) -> datetime | None:
    """The cursor for a new or resumed schedule. A one-off keeps its run_at even when it is already past, so
    the materializer applies the misfire policy to it rather than the fire vanishing unrecorded."""
    if rule.kind == Kind.ONCE:
        return rule.run_at if rule.run_at is not None and rule.allows(rule.run_at) else None
    return rule.next_after(now)


# --- writing ----------------------------------------------------------------------------------------------


def _record_version(schedule: Schedule, change: str, actor: str, now: datetime, note: str = "") -> None:
    ScheduleVersion.objects.filter(schedule=schedule, valid_to__isnull=True).update(valid_to=now)
    ScheduleVersion.objects.create(
        schedule=schedule,
        tenant_id=schedule.tenant_id,
        version=schedule.version,
        change=change,
        definition=schedule.definition(),
        valid_from=now,
        actor=actor,
        note=note,
    )


def _locked(schedule: Schedule) -> Schedule:
    return Schedule.objects.lock(schedule.pk)


def _lock_for_change(schedule: Schedule, now: datetime) -> Schedule:
    """Lock the row for a new version. Fires the current version still owes up to now (the materializer was
    behind) are first produced under its misfire policy, as the materializer would have: the cursor is about to
    move on, and a fire without a row would be a silent omission (docs/ARCHITECTURE.md rule 7)."""
    locked = _locked(schedule)
    if locked.state == ScheduleState.ACTIVE:
        # The runs left are the cursor's while the schedule is active: the version about to be saved starts from them.
        locked.remaining_runs = locked.remaining_runs_now
    if locked.state == ScheduleState.ACTIVE and locked.next_run_at is not None and locked.next_run_at <= now:
        locked.remaining_runs = dispatch_services.materialize_owed_fires(locked, now=now).remaining_runs
    return locked


# How a change reads in the reason of the occurrences it withdrew.
WITHDRAWN_BY: dict[str, str] = {
    VersionChange.UPDATE: "updated",
    VersionChange.PAUSE: "paused",
    VersionChange.RESUME: "resumed",
    VersionChange.CANCEL: "canceled",
}


def _bump(
    schedule: Schedule,
    change: str,
    actor: str,
    now: datetime,
    note: str = "",
    limit_change: tuple[int | None, int | None] | None = None,
) -> None:
    """Save a new version and withdraw what older versions left unclaimed (docs/ARCHITECTURE.md rule 9).

    Backfilled, replayed and manually triggered occurrences (forced) survive an update or pause, which they
    predate by design; a cancel withdraws them too.

    Under max_runs, each withdrawn fire gives its run back (it will not happen); then a changed limit (`limit_change`,
    old and new) moves the runs left; a schedule with none left stops here: its cursor is emptied and the
    maintenance pass completes it once its last occurrence has ended. (In that order: a fire written under no limit
    took no run, and one written under the old limit gives its run back before the new limit counts.)"""
    schedule.version += 1
    withdrawn = dispatch_services.invalidate_unclaimed_occurrences(
        schedule.id,
        schedule.version,
        now,
        include_forced=change == VersionChange.CANCEL,
        reason=f"withdrawn: schedule {WITHDRAWN_BY[change]} (version {schedule.version})",
        # A change affects only the fires after it: what was already due keeps its slot (on the flexible lane its
        # jittered release may still lie ahead) and runs. A cancel withdraws everything not yet claimed.
        keep_due_at=None if change == VersionChange.CANCEL else now,
    )
    if schedule.remaining_runs is not None and change != VersionChange.CANCEL:
        # Only unforced occurrences were withdrawn (the materializer's fires): manual triggers never took a run.
        schedule.remaining_runs += withdrawn
    if limit_change is not None:
        schedule.remaining_runs = _runs_left_after_limit_change(schedule.remaining_runs, *limit_change)
    if schedule.remaining_runs is not None and schedule.remaining_runs <= 0:
        schedule.remaining_runs = 0
        if schedule.state == ScheduleState.ACTIVE:
            schedule.next_run_at = None
    schedule.save()
    _record_version(schedule, change, actor, now, note)


def create_schedule(
    *,
    tenant: Tenant,
    data: dict[str, Any],
    actor: str,
    idempotency_key: str | None = None,
    request_fingerprint: str | None = None,
    now: datetime | None = None,
) -> tuple[Schedule, bool]:
    """Create a schedule; returns (schedule, created). A repeated Idempotency-Key returns the first schedule
    when the body matches and raises StateConflict when it does not."""
    definition = clean_definition(data)
    body_hash = request_fingerprint or fingerprint(data)
    if idempotency_key:
        existing = _existing_for_key(tenant, idempotency_key, body_hash)
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            now = now or db_now()
            locked_tenant = _claim_quota_slot(tenant.pk)
            check_exclude_calendars(tenant.pk, definition["exclude_calendars"])
            schedule = Schedule(tenant=locked_tenant, **anchored_at_now(definition, now))
            schedule.shard = shard_for(schedule.id)
            schedule.next_run_at = _first_fire(schedule.rhythm, now)
            schedule.state = _state_with_cursor(schedule, now)
            schedule.remaining_runs = schedule.max_runs
            schedule.idempotency_key = idempotency_key or None
            schedule.request_fingerprint = body_hash if idempotency_key else None
            schedule.created_by = actor
            schedule.save()
            _record_version(schedule, VersionChange.CREATE, actor, now)
    except IntegrityError:
        # Two requests with one Idempotency-Key raced; the unique constraint let one win. Answer as a retry.
        if idempotency_key:
            existing = _existing_for_key(tenant, idempotency_key, body_hash)
            if existing is not None:
                return existing, False
        raise
    logger.info("created schedule %s for tenant %s", schedule.id, tenant.slug, extra={"action": "create_schedule"})
    return schedule, True


def _lock_tenant(tenant_id: int) -> Tenant:
    return Tenant.objects.select_for_update().get(pk=tenant_id)


def _claim_quota_slot(tenant_id: int) -> Tenant:
    """Lock the tenant row and check that one more schedule fits its quota (active + paused); raise QuotaExceeded.

    The tenant row lock serialises the writers that add to the count (creates, reactivations), so two racing
    requests cannot both pass the check with one slot left.
    """
    locked_tenant = _lock_tenant(tenant_id)
    held = schedules_held(locked_tenant.pk)
    if held >= locked_tenant.max_schedules:
        raise QuotaExceeded(
            f"Tenant {locked_tenant.slug} holds {held} schedules, its quota is {locked_tenant.max_schedules}.",
            settings.SCHEDULER_QUOTA_RETRY_AFTER_SECONDS,
        )
    return locked_tenant


def _existing_for_key(tenant: Tenant, key: str, body_hash: str) -> Schedule | None:
    existing = Schedule.objects.for_tenant(tenant).filter(idempotency_key=key).first()
    if existing is not None and existing.request_fingerprint != body_hash:
        raise StateConflict("This Idempotency-Key was already used with a different request body.")
    return existing


def update_schedule(
    schedule: Schedule, changes: dict[str, Any], *, actor: str, now: datetime | None = None
) -> Schedule:
    """Apply a partial definition change as a new version; future fires follow it, older unclaimed ones go."""
    with transaction.atomic():
        now = now or db_now()
        if schedule.kind == Kind.ONCE or schedule.state == ScheduleState.COMPLETED:
            # An update may revive a completed one-off, which claims a quota slot on the tenant row. The tenant row
            # comes before the schedule row (docs/ARCHITECTURE.md, "Lock order"), as for a create and a tenant's
            # deletion, so this update and a deletion of its tenant cannot deadlock.
            _lock_tenant(schedule.tenant_id)
        schedule = _lock_for_change(schedule, now)
        if schedule.state == ScheduleState.CANCELED:
            raise StateConflict("A canceled schedule cannot be changed.")
        merged = {field: getattr(schedule, field) for field in DEFINITION_FIELDS}
        stored_run_at, stored_max_runs = schedule.run_at, schedule.max_runs
        merged.update(changes)
        # Switching kind drops the time fields of the old kind unless the caller set them explicitly (then they are
        # refused). A switch to interval without anchor_at is anchored now, as a create would be.
        for kind, fields in TIME_FIELDS.items():
            for field in fields if kind != merged["kind"] else ():
                if field not in changes:
                    merged[field] = None
        definition = anchored_at_now(clean_definition(merged), now)
        check_exclude_calendars(schedule.tenant_id, definition["exclude_calendars"])
        for field, value in definition.items():
            setattr(schedule, field, value)
        limit_change = (stored_max_runs, schedule.max_runs)
        # A schedule completed with no run left stays completed (nothing of it is pending, so nothing is given back).
        runs_left = _runs_left_after_limit_change(schedule.remaining_runs, *limit_change)
        used_up = schedule.state == ScheduleState.COMPLETED and runs_left is not None and runs_left <= 0
        if schedule.state in (ScheduleState.ACTIVE, ScheduleState.COMPLETED) and not used_up:
            was_counted = schedule.state == ScheduleState.ACTIVE
            # A zone or expression change affects only fires after now, under the new version. A one-off given a
            # run_at that has already passed keeps it as its cursor, as at create: the misfire policy decides.
            # Only a new run_at: a client resending the stored one (a whole GET body) must not fire it again.
            if schedule.kind == Kind.ONCE and changes.get("run_at") is not None and schedule.run_at != stored_run_at:
                schedule.next_run_at = _first_fire(schedule.rhythm, now)
            else:
                schedule.next_run_at = _next_fire_after_change(schedule.rhythm, now)
            schedule.state = _state_with_cursor(schedule, now)
            if schedule.state == ScheduleState.ACTIVE and not was_counted:
                # A completed one-off given a new run_at counts against the quota again.
                _claim_quota_slot(schedule.tenant_id)
        _bump(schedule, VersionChange.UPDATE, actor, now, limit_change=limit_change)
    logger.info("updated schedule %s to v%d", schedule.id, schedule.version, extra={"action": "update_schedule"})
    return schedule


def _runs_left_after_limit_change(remaining: int | None, old_limit: int | None, new_limit: int | None) -> int | None:
    """A raised or lowered max_runs moves the runs left by as much (below 0 is none left); a new limit counts from
    the change; no limit, none."""
    if new_limit is None:
        return None
    if old_limit is None or remaining is None:
        return new_limit
    return remaining + new_limit - old_limit


def _state_with_cursor(schedule: Schedule, now: datetime, next_run_at: Any = _UNSET) -> str:
    """Active while a fire is pending, or until its end_at while none is left in its window (the maintenance pass
    completes it then, once its last occurrence has ended); otherwise completed."""
    if (schedule.next_run_at if next_run_at is _UNSET else next_run_at) is not None:
        return ScheduleState.ACTIVE
    if schedule.kind != Kind.ONCE and schedule.end_at is not None and schedule.end_at > now:
        return ScheduleState.ACTIVE
    return ScheduleState.COMPLETED


def resumed_state(schedule: Schedule, now: datetime) -> str:
    """The state a resume at `now` would leave, without resuming: what a bulk dry run predicts."""
    return _state_with_cursor(schedule, now, _next_fire_after_change(schedule.rhythm, now))


def _next_fire_after_change(rule: TimeRule, now: datetime) -> datetime | None:
    if rule.kind == Kind.ONCE:
        return rule.run_at if rule.run_at and rule.run_at > now and rule.allows(rule.run_at) else None
    return rule.next_after(now)


def pause_schedule(
    schedule: Schedule,
    *,
    actor: str,
    note: str = "",
    now: datetime | None = None,
    resume_at: datetime | None = None,
) -> Schedule:
    """Stop firing from now; `note` (why, in the actor's words) is kept on the new version. With `resume_at`, the
    schedule resumes by itself then (resume_due_pauses); pausing a paused schedule again moves that instant."""
    with transaction.atomic():
        now = now or db_now()
        if resume_at is not None and resume_at <= now:
            raise ScheduleInvalid({"resume_at": [f"Must be in the future (now is {now.isoformat()})."]})
        schedule = _lock_for_change(schedule, now)
        if schedule.state == ScheduleState.PAUSED:
            if resume_at is not None and resume_at != schedule.resume_at:
                schedule.resume_at = resume_at
                Schedule.objects.filter(pk=schedule.pk).update(resume_at=resume_at)
            return schedule
        if (refused := refusal("pause", schedule.state)) is not None:
            raise StateConflict(refused)
        schedule.state = ScheduleState.PAUSED
        schedule.next_run_at = None
        schedule.resume_at = resume_at
        _bump(schedule, VersionChange.PAUSE, actor, now, note)
    logger.info("paused schedule %s", schedule.id, extra={"action": "pause_schedule"})
    return schedule


def resume_schedule(schedule: Schedule, *, actor: str, note: str = "", now: datetime | None = None) -> Schedule:
    """Resume from now: fires that fell in the pause are not caught up (the API contract)."""
    with transaction.atomic():
        now = now or db_now()
        schedule = _locked(schedule)
        if schedule.state == ScheduleState.ACTIVE:
            return schedule
        if (refused := refusal("resume", schedule.state)) is not None:
            raise StateConflict(refused)
        schedule.resume_at = None
        schedule.next_run_at = _next_fire_after_change(schedule.rhythm, now)
        schedule.state = _state_with_cursor(schedule, now)
        _bump(schedule, VersionChange.RESUME, actor, now, note)
        run_at = schedule.run_at
        if schedule.kind == Kind.ONCE and run_at is not None and run_at <= now and schedule.time_rule.allows(run_at):
            # Fires during a pause are not caught up (docs/API.md, "Schedules"), but a one-off's only fire is
            # recorded, never lost.
            dispatch_services.record_missed_fire(
                schedule, at=run_at, now=now, reason="run_at passed while the schedule was paused"
            )
    logger.info("resumed schedule %s", schedule.id, extra={"action": "resume_schedule"})
    return schedule


# Pauses ended per call of resume_due_pauses: the maintenance pass calls it every few seconds.
RESUME_BATCH = 100
AUTO_RESUME_ACTOR = "system:resume_at"


def resume_due_pauses(*, now: datetime | None = None, limit: int = RESUME_BATCH) -> int:
    """Resume the paused schedules whose resume_at has come, each as a resume would at that instant (its fires from
    then on; none of the pause caught up), as a new version whose note says so. Returns how many it resumed.

    The materializer's maintenance pass calls it, in every materializer process. Each schedule is taken in a
    transaction of its own, under its row lock (SKIP LOCKED: one another transaction holds is left for the next
    pass, so this never waits), and checked again there; one whose rule cannot be read is logged and passed over,
    never blocking the others."""
    now = now or db_now()
    due = Schedule.objects.filter(resume_at__lte=now, state=ScheduleState.PAUSED).order_by("resume_at")
    resumed = 0
    for pk in list(due.values_list("pk", flat=True)[:limit]):
        try:
            resumed += _resume_at_its_time(pk, now)
        except DatabaseError:
            raise  # the loop's outage handling owns a lost connection
        except Exception:
            logger.exception("could not resume schedule %s at its resume_at", pk, extra={"action": "resume_at"})
    return resumed


def _resume_at_its_time(pk: uuid.UUID, now: datetime) -> bool:
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(pk=pk, state=ScheduleState.PAUSED, resume_at__lte=now)
            .first()
        )
        if schedule is None or schedule.resume_at is None:
            return False  # resumed, changed or held elsewhere meanwhile
        resume_at = schedule.resume_at
        # At resume_at itself, unless a version began after it (a change while paused, before this pass ran):
        # versions follow one another in time. Read under the row lock, which every change takes first.
        current_from = ScheduleVersion.objects.filter(schedule_id=pk, valid_to__isnull=True).values_list(
            "valid_from", flat=True
        )
        note = f"resumed by itself at its resume_at ({resume_at.astimezone(UTC).isoformat().replace('+00:00', 'Z')})"
        resume_schedule(schedule, actor=AUTO_RESUME_ACTOR, note=note, now=max([resume_at, *current_from]))
    return True


def cancel_schedule(schedule: Schedule, *, actor: str, note: str = "", now: datetime | None = None) -> CancelResult:
    """Soft cancel: the row and its history stay; unclaimed work is withdrawn; claimed work is reported."""
    with transaction.atomic():
        now = now or db_now()
        schedule = _lock_for_change(schedule, now)
        if changes("cancel", schedule.state):
            schedule.state = ScheduleState.CANCELED
            schedule.next_run_at = None
            schedule.resume_at = None
            _bump(schedule, VersionChange.CANCEL, actor, now, note)
            logger.info("canceled schedule %s", schedule.id, extra={"action": "cancel_schedule"})
        in_flight = dispatch_services.in_flight_occurrences(schedule.id)
    return CancelResult(schedule=schedule, in_flight=in_flight)


def trigger_schedule(
    schedule: Schedule, *, actor: str, trigger_key: str | None = None, now: datetime | None = None
) -> uuid.UUID:
    """A manual fire now under the current version; refused on a canceled schedule."""
    with transaction.atomic():
        now = now or db_now()
        schedule = Schedule.objects.select_for_update().get(pk=schedule.pk)
        if (refused := refusal("trigger", schedule.state)) is not None:
            raise StateConflict(refused)
        occurrence_id = dispatch_services.trigger_manual_occurrence(schedule, now=now, trigger_key=trigger_key)
    logger.info("%s triggered schedule %s", actor, schedule.id, extra={"action": "trigger_schedule"})
    return occurrence_id
