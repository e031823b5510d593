"""Fleet operations (docs/API.md, "Fleet operations"): one verb applied to many schedules picked by a label selector
or by id (bulk).

Every change goes through the control plane's verbs (schedules.services), one schedule per transaction, so each gets
its own version, note and actor exactly as a single call would, and holds its locks (tenant, schedule, cursor,
calendars) in the order every other writer takes them: a fleet call never holds one schedule while it waits for
another, so it cannot deadlock with the materializer, a worker, a single call or another fleet call. A change that
fails (a refusal, a lock that could not be had) is reported on its schedule and the others go on. Export and apply
are schedules/documents.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import OperationalError

from core.choices import ScheduleState
from core.clock import db_now
from core.labels import Selector
from schedules import services
from schedules.errors import ScheduleInvalid, StateConflict
from schedules.models import Schedule, ScheduleQuerySet
from schedules.transitions import STATE_AFTER, changes, refusal
from tenants.models import Tenant

logger = logging.getLogger(__name__)

# The most schedules one bulk call changes, one export holds, or one apply document holds.
MAX_FLEET = 10_000
BULK_VERBS = ("pause", "resume", "cancel", "trigger")


@dataclass(frozen=True)
class BulkOutcome:
    id: uuid.UUID
    state: str | None
    error: str = ""
    changed: bool = False
    occurrence_id: uuid.UUID | None = None


@dataclass
class BulkResult:
    matched: int = 0
    changed: int = 0
    results: list[BulkOutcome] = field(default_factory=list)


def too_many(count: int, key: str) -> ScheduleInvalid:
    return ScheduleInvalid({key: [f"Picks {count:,} schedules; at most {MAX_FLEET:,} a call: narrow it."]})


LIVE_STATES = (ScheduleState.ACTIVE, ScheduleState.PAUSED)


def fleet_of(tenant: Tenant, selector: Selector | None) -> ScheduleQuerySet:
    """The tenant's live schedules, active or paused, picked by `selector`. Canceled and completed ones are history,
    not a fleet: a selector never reaches them (ids still do)."""
    return Schedule.objects.for_tenant(tenant).filter(state__in=LIVE_STATES).selected(selector or Selector())


def picked(tenant: Tenant, *, selector: Selector | None, ids: list[uuid.UUID] | None) -> list[Schedule]:
    """The tenant's schedules a bulk call names, in id order. A selector picks among the live schedules
    (fleet_of); ids pick whatever they name."""
    schedules = Schedule.objects.for_tenant(tenant)
    if ids is not None:
        chosen = list(schedules.filter(pk__in=set(ids)).defer("payload").order_by("id")[: MAX_FLEET + 1])
        key = "ids"
    else:
        chosen = list(fleet_of(tenant, selector).defer("payload").order_by("id")[: MAX_FLEET + 1])
        key = "selector"
    if len(chosen) > MAX_FLEET:
        raise too_many(len(chosen), key)
    return chosen


def bulk_change(
    tenant: Tenant,
    verb: str,
    *,
    selector: Selector | None = None,
    ids: list[uuid.UUID] | None = None,
    note: str = "",
    dry_run: bool = False,
    actor: str,
    trigger_key: str | None = None,
) -> BulkResult:
    """Apply `verb` to every schedule picked; with `dry_run`, say what it would do and change nothing. An id the
    tenant has no schedule of is reported, not an error of the whole call. `trigger_key` (the request's
    Idempotency-Key) makes a retried bulk trigger return the same occurrences instead of firing again."""
    chosen = picked(tenant, selector=selector, ids=ids)
    result = BulkResult(matched=len(chosen))
    if ids is not None:
        found = {schedule.pk for schedule in chosen}
        result.results.extend(
            BulkOutcome(id=pk, state=None, error="No such schedule.") for pk in _unique(ids) if pk not in found
        )
    verb_of = _verbs(actor, note, trigger_key)[verb]
    now = db_now()
    for schedule in chosen:
        result.results.append(_predicted(verb, schedule, now) if dry_run else _applied(verb_of, schedule))
    result.changed = sum(outcome.changed for outcome in result.results)
    if not dry_run:
        logger.info(
            "%s: bulk %s of %d schedules of tenant %s changed %d",
            actor,
            verb,
            result.matched,
            tenant.slug,
            result.changed,
            extra={"action": "bulk_change"},
        )
    return result


def _unique(ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    return list(dict.fromkeys(ids))


def _verbs(
    actor: str, note: str, trigger_key: str | None
) -> dict[str, Callable[[Schedule], tuple[Schedule, uuid.UUID | None]]]:
    return {
        "pause": lambda s: (services.pause_schedule(s, actor=actor, note=note), None),
        "resume": lambda s: (services.resume_schedule(s, actor=actor, note=note), None),
        "cancel": lambda s: (services.cancel_schedule(s, actor=actor, note=note).schedule, None),
        "trigger": lambda s: (s, services.trigger_schedule(s, actor=actor, trigger_key=trigger_key)),
    }


def _applied(verb_of: Callable[[Schedule], tuple[Schedule, uuid.UUID | None]], schedule: Schedule) -> BulkOutcome:
    version = schedule.version
    try:
        after, occurrence_id = verb_of(schedule)
    except (StateConflict, OperationalError) as exc:
        # The service's transaction undid this schedule's change; the state is read again (it may have moved). A
        # lock that could not be had (a deadlock victim, a timeout) is the same: this one only, try it again.
        message = exc.message if isinstance(exc, StateConflict) else f"Not changed, try again: {str(exc)[:200]}"
        state = Schedule.objects.filter(pk=schedule.pk).values_list("state", flat=True).first()
        return BulkOutcome(id=schedule.pk, state=state, error=message)
    if occurrence_id is not None:
        state = Schedule.objects.filter(pk=schedule.pk).values_list("state", flat=True).first()
        return BulkOutcome(id=schedule.pk, state=state, changed=True, occurrence_id=occurrence_id)
    return BulkOutcome(id=schedule.pk, state=after.state, changed=after.version != version)


def _predicted(verb: str, schedule: Schedule, now: datetime) -> BulkOutcome:
    refused = refusal(verb, schedule.state)
    if refused is not None:
        return BulkOutcome(id=schedule.pk, state=schedule.state, error=refused)
    if not changes(verb, schedule.state):
        return BulkOutcome(id=schedule.pk, state=schedule.state)
    # A resume leaves a schedule with no fire left completed (a one-off whose run_at passed while it was paused).
    after = services.resumed_state(schedule, now) if verb == "resume" else STATE_AFTER[verb] or schedule.state
    return BulkOutcome(id=schedule.pk, state=after, changed=True)
