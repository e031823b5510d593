"""Fleet operations (docs/API.md, "Fleet operations"): one verb applied to many schedules picked by a label selector
or by id (bulk), a tenant's schedules as a declarative document (export), and such a document made true (apply).

Every change goes through the control plane's verbs (schedules.services), so each schedule changed gets its own
version, note and actor, exactly as a single call would give it. Changes are made BATCH schedules per transaction,
each under its own savepoint: a refusal undoes that schedule only, and a commit per schedule is not paid 10,000 times.
Schedules are locked in id order, so two bulk calls over overlapping sets cannot deadlock.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from core.choices import Kind, ScheduleState
from core.labels import Selector
from schedules import services
from schedules.definitions import DEFAULTS, clean_definition
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.models import DEFINITION_FIELDS, Schedule, ScheduleQuerySet
from schedules.transitions import STATE_AFTER, changes, refusal
from tenants.models import Tenant
from tenants.services import schedules_held

logger = logging.getLogger(__name__)

# The most schedules one bulk call changes, or one apply document holds.
MAX_FLEET = 10_000
# Schedules changed per transaction (each under a savepoint of its own).
BATCH = 100
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


def _too_many(count: int, key: str) -> ScheduleInvalid:
    return ScheduleInvalid({key: [f"Picks {count:,} schedules; at most {MAX_FLEET:,} a call: narrow it."]})


def fleet_of(tenant: Tenant, selector: Selector | None) -> ScheduleQuerySet:
    """The tenant's schedules that are not canceled (history is not a fleet), picked by `selector`."""
    return Schedule.objects.for_tenant(tenant).exclude(state=ScheduleState.CANCELED).selected(selector or Selector())


def picked(tenant: Tenant, *, selector: Selector | None, ids: list[uuid.UUID] | None) -> list[Schedule]:
    """The tenant's schedules a bulk call names, in id order (the lock order). A selector picks among the
    schedules not canceled (history is not a fleet); ids pick whatever they name."""
    schedules = Schedule.objects.for_tenant(tenant)
    if ids is not None:
        chosen = list(schedules.filter(pk__in=set(ids)).order_by("id")[: MAX_FLEET + 1])
        key = "ids"
    else:
        chosen = list(fleet_of(tenant, selector).order_by("id")[: MAX_FLEET + 1])
        key = "selector"
    if len(chosen) > MAX_FLEET:
        raise _too_many(len(chosen), key)
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
) -> BulkResult:
    """Apply `verb` to every schedule picked; with `dry_run`, say what it would do and change nothing. An id the
    tenant has no schedule of is reported, not an error of the whole call."""
    chosen = picked(tenant, selector=selector, ids=ids)
    result = BulkResult(matched=len(chosen))
    if ids is not None:
        found = {schedule.pk for schedule in chosen}
        result.results.extend(
            BulkOutcome(id=pk, state=None, error="No such schedule.") for pk in _unique(ids) if pk not in found
        )
    verb_of = _verbs(actor, note)[verb]
    for start in range(0, len(chosen), BATCH):
        batch = chosen[start : start + BATCH]
        if dry_run:
            result.results.extend(_predicted(verb, schedule) for schedule in batch)
            continue
        with transaction.atomic():
            result.results.extend(_applied(verb_of, schedule) for schedule in batch)
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


def _verbs(actor: str, note: str) -> dict[str, Callable[[Schedule], tuple[Schedule, uuid.UUID | None]]]:
    return {
        "pause": lambda s: (services.pause_schedule(s, actor=actor, note=note), None),
        "resume": lambda s: (services.resume_schedule(s, actor=actor, note=note), None),
        "cancel": lambda s: (services.cancel_schedule(s, actor=actor, note=note).schedule, None),
        "trigger": lambda s: (s, services.trigger_schedule(s, actor=actor)),
    }


def _applied(verb_of: Callable[[Schedule], tuple[Schedule, uuid.UUID | None]], schedule: Schedule) -> BulkOutcome:
    version = schedule.version
    try:
        after, occurrence_id = verb_of(schedule)
    except StateConflict as exc:
        # The service's own savepoint undid this schedule's change; the state is read again (it may have moved).
        state = Schedule.objects.filter(pk=schedule.pk).values_list("state", flat=True).first()
        return BulkOutcome(id=schedule.pk, state=state, error=exc.message)
    if occurrence_id is not None:
        state = Schedule.objects.filter(pk=schedule.pk).values_list("state", flat=True).first()
        return BulkOutcome(id=schedule.pk, state=state, changed=True, occurrence_id=occurrence_id)
    return BulkOutcome(id=schedule.pk, state=after.state, changed=after.version != version)


def _predicted(verb: str, schedule: Schedule) -> BulkOutcome:
    refused = refusal(verb, schedule.state)
    if refused is not None:
        return BulkOutcome(id=schedule.pk, state=schedule.state, error=refused)
    if not changes(verb, schedule.state):
        return BulkOutcome(id=schedule.pk, state=schedule.state)
    return BulkOutcome(id=schedule.pk, state=STATE_AFTER[verb] or schedule.state, changed=True)


# --- export and apply ------------------------------------------------------------------------------------------

INSTANT_FIELDS = ("run_at", "anchor_at", "start_at", "end_at")


def definition_document(definition: dict[str, Any]) -> dict[str, Any]:
    """A definition as the export shows it and apply compares it: every definition field, instants in UTC with Z."""
    document = {name: definition[name] for name in DEFINITION_FIELDS}
    for name in INSTANT_FIELDS:
        value = document[name]
        if isinstance(value, datetime):
            document[name] = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return document


def stored_definition(schedule: Schedule) -> dict[str, Any]:
    return definition_document({name: getattr(schedule, name) for name in DEFINITION_FIELDS})


def export_schedules(tenant: Tenant, selector: Selector | None) -> list[dict[str, Any]]:
    """The tenant's schedules that are not canceled, picked by `selector`, by name: what apply takes back."""
    schedules = fleet_of(tenant, selector).order_by("name", "created_at", "id")
    return [stored_definition(schedule) for schedule in schedules.iterator(chunk_size=1000)]


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    canceled: list[str] = field(default_factory=list)


def apply_schedules(
    tenant: Tenant,
    documents: list[dict[str, Any]],
    *,
    selector: Selector | None,
    prune: bool,
    dry_run: bool,
    actor: str,
) -> ApplyResult:
    """Make the tenant's schedules what `documents` say, by name (the API's types already checked).

    1. Check everything before changing anything: each document by the definition rules, names unique in the
       document, and no name the tenant holds twice among its schedules that are not canceled (which would be the
       one to change is not for us to guess).
    2. Each listed name: created when the tenant has no such schedule; updated (a new version) when its definition
       differs; unchanged otherwise. A document's absent fields are the defaults, except an interval's anchor_at,
       which keeps the stored one (a new schedule is anchored now).
    3. With `prune`: the schedules the selector picks (every schedule without one) that are not canceled and not
       listed are canceled.
    """
    desired = _checked(documents)
    current = _current_by_name(tenant)
    held_twice = sorted(name for name, schedules in current.items() if len(schedules) > 1 and name in desired)
    pruned: list[Schedule] = []
    if prune:
        pruned = [schedule for schedule in fleet_of(tenant, selector).order_by("id") if schedule.name not in desired]
        held_twice += sorted({s.name for s in pruned if len(current.get(s.name, ())) > 1} - set(held_twice))
    if held_twice:
        raise ScheduleInvalid(
            {
                "schedules": [
                    f"The tenant holds more than one schedule named {name!r} that is not canceled: cancel or "
                    "rename all but one first."
                    for name in held_twice
                ]
            }
        )
    result = ApplyResult()
    plan: list[tuple[dict[str, Any], Schedule | None]] = []
    for name, definition in desired.items():
        existing = current.get(name, [None])[0]
        if existing is None:
            result.created.append(name)
            plan.append((definition, None))
            continue
        wanted = _with_stored_anchor(definition, existing)
        if definition_document(wanted) == stored_definition(existing):
            result.unchanged.append(name)
        else:
            result.updated.append(name)
            plan.append((wanted, existing))
    result.canceled = [schedule.name for schedule in pruned]
    for names in (result.created, result.updated, result.unchanged, result.canceled):
        names.sort()
    if dry_run:
        return result
    # Pruning first frees the quota slots the new schedules may need.
    _check_quota(tenant, len(result.created) - sum(s.state in _COUNTED for s in pruned))
    for start in range(0, len(pruned), BATCH):
        with transaction.atomic():
            for schedule in pruned[start : start + BATCH]:
                services.cancel_schedule(schedule, actor=actor, note="pruned by apply: not in the document")
    for start in range(0, len(plan), BATCH):
        with transaction.atomic():
            for definition, existing in plan[start : start + BATCH]:
                if existing is None:
                    services.create_schedule(tenant=tenant, data=definition, actor=actor)
                else:
                    services.update_schedule(existing, definition, actor=actor)
    logger.info(
        "%s applied %d schedules to tenant %s: %d created, %d updated, %d canceled",
        actor,
        len(desired),
        tenant.slug,
        len(result.created),
        len(result.updated),
        len(result.canceled),
        extra={"action": "apply_schedules"},
    )
    return result


_COUNTED = (ScheduleState.ACTIVE, ScheduleState.PAUSED)


def _checked(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each document cleaned by the definition rules, by name; every problem of every document in one 400."""
    if len(documents) > MAX_FLEET:
        raise _too_many(len(documents), "schedules")
    problems: list[str] = []
    desired: dict[str, dict[str, Any]] = {}
    names = Counter(document.get("name") for document in documents)
    for index, document in enumerate(documents):
        label = f"item {index} ({document.get('name')!r})"
        if names[document.get("name")] > 1:
            problems.append(f"{label}: the name appears more than once in the document.")
            continue
        try:
            desired[document["name"]] = clean_definition({**DEFAULTS, **document})
        except ScheduleInvalid as exc:
            problems.extend(
                f"{label}: {key}: {message}" for key, messages in exc.errors.items() for message in messages
            )
    if problems:
        raise ScheduleInvalid({"schedules": problems[:100]})
    return desired


def _current_by_name(tenant: Tenant) -> dict[str, list[Schedule]]:
    current: dict[str, list[Schedule]] = {}
    for schedule in fleet_of(tenant, None).order_by("created_at", "id").select_related("cursor"):
        current.setdefault(schedule.name, []).append(schedule)
    return current


def _with_stored_anchor(definition: dict[str, Any], existing: Schedule) -> dict[str, Any]:
    if definition["kind"] == Kind.INTERVAL and definition["anchor_at"] is None and existing.kind == Kind.INTERVAL:
        return {**definition, "anchor_at": existing.anchor_at}
    return definition


def _check_quota(tenant: Tenant, added: int) -> None:
    """Refuse before any write an apply whose new schedules would not fit the quota (each create checks again)."""
    if added <= 0:
        return
    held = schedules_held(tenant.pk)
    if held + added > tenant.max_schedules:
        raise QuotaExceeded(
            f"Applying adds {added} schedules to the {held} tenant {tenant.slug} holds; its quota is "
            f"{tenant.max_schedules}.",
            settings.SCHEDULER_QUOTA_RETRY_AFTER_SECONDS,
        )
