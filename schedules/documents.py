"""A tenant's schedules as a declarative document (docs/API.md, "Fleet operations"): export writes the live
schedules' definitions, apply makes a document true by name, so a team can keep its schedules in git and applying
an export again changes nothing.

Apply checks the whole document before it changes anything (each definition as a create, names unique, calendars
the tenant has, labels that meet the selector, the quota), then creates and updates one schedule per transaction
through the control plane's verbs (schedules.fleet says why one at a time), and prunes last, only when everything
else applied: a document that could not be applied whole cancels nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import OperationalError

from core.choices import Kind, ScheduleState
from core.labels import Selector
from schedules import services
from schedules.calendars import check_exclude_calendars
from schedules.definitions import DEFAULTS, clean_definition
from schedules.errors import QuotaExceeded, ScheduleInvalid, StateConflict
from schedules.fleet import LIVE_STATES, MAX_FLEET, fleet_of, too_many
from schedules.models import DEFINITION_FIELDS, Schedule
from tenants.models import Tenant
from tenants.services import schedules_held

logger = logging.getLogger(__name__)

INSTANT_FIELDS = ("run_at", "anchor_at", "start_at", "end_at")
# Problems listed in one 400: enough to fix a document, bounded for one of 10,000 definitions.
MAX_PROBLEMS = 100


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
    """The tenant's live schedules (active or paused) picked by `selector`, by name: what apply takes back.
    Completed one-offs are history, like canceled schedules: applied elsewhere they would fire again."""
    schedules = fleet_of(tenant, selector)
    count = schedules.count()
    if count > MAX_FLEET:
        raise too_many(count, "selector")
    return [stored_definition(s) for s in schedules.order_by("name", "created_at", "id").iterator(chunk_size=500)]


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    canceled: list[str] = field(default_factory=list)
    # A change refused while applying (a race the checks could not see): its name and why. Nothing is pruned then.
    failed: list[dict[str, str]] = field(default_factory=list)


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

    1. Check everything before changing anything (ScheduleInvalid, QuotaExceeded): each document by the definition
       rules and the tenant's calendars, names unique in the document, labels that meet `selector`, no name the
       tenant holds twice among its live schedules, no listed name whose schedule lies outside `selector`.
    2. Each listed name: created when the tenant has no such schedule; updated (a new version) when its definition
       differs; unchanged otherwise. A live schedule of the name is the one compared, else the latest completed one
       (a one-off that ran stays unchanged). Absent fields are the defaults, except an interval's anchor_at, which
       keeps the stored one.
    3. With `prune`, last and only if everything else applied: the live schedules `selector` picks (all of the
       tenant's without one) that are not listed are canceled.
    """
    chosen = selector or Selector()
    desired = _checked(tenant, documents, chosen)
    current = _current(tenant, list(desired))
    plan, result = _plan(desired, current, chosen)
    pruned = (
        [s for s in fleet_of(tenant, selector).only("id", "name", "state") if s.name not in desired] if prune else []
    )
    result.canceled = [schedule.name for schedule in pruned]
    _check_quota(tenant, added=len(result.created), freed=len(pruned))
    for names in (result.created, result.updated, result.unchanged, result.canceled):
        names.sort()
    if dry_run:
        return result
    # Pruning first only when the new schedules need the slots it frees; otherwise last, after the rest applied.
    prune_first = schedules_held(tenant.pk) + len(result.created) > tenant.max_schedules
    if prune_first:
        _prune(pruned, actor, result)
    for name, definition, existing in plan:
        try:
            if existing is None:
                services.create_schedule(tenant=tenant, data=definition, actor=actor)
            else:
                services.update_schedule(existing, definition, actor=actor)
        except (ScheduleInvalid, StateConflict, QuotaExceeded, OperationalError) as exc:
            result.failed.append({"name": name, "error": _words(exc)})
    if not prune_first:
        if result.failed:
            result.canceled = []
        else:
            _prune(pruned, actor, result)
    logger.info(
        "%s applied %d schedules to tenant %s: %d created, %d updated, %d canceled, %d failed",
        *(actor, len(desired), tenant.slug, len(result.created), len(result.updated), len(result.canceled)),
        len(result.failed),
        extra={"action": "apply_schedules"},
    )
    return result


def _words(exc: Exception) -> str:
    if isinstance(exc, ScheduleInvalid):
        return "; ".join(f"{key}: {message}" for key, messages in exc.errors.items() for message in messages)
    return getattr(exc, "message", None) or str(exc)[:300]


def _prune(pruned: list[Schedule], actor: str, result: ApplyResult) -> None:
    canceled = []
    for schedule in pruned:
        try:
            services.cancel_schedule(schedule, actor=actor, note="pruned by apply: not in the document")
            canceled.append(schedule.name)
        except OperationalError as exc:
            result.failed.append({"name": schedule.name, "error": f"Not canceled, try again: {str(exc)[:200]}"})
    result.canceled = sorted(canceled)


def _checked(tenant: Tenant, documents: list[dict[str, Any]], selector: Selector) -> dict[str, dict[str, Any]]:
    """Each document cleaned by the definition rules, by name; every problem of every document in one 400."""
    if len(documents) > MAX_FLEET:
        raise too_many(len(documents), "schedules")
    problems: list[str] = []
    desired: dict[str, dict[str, Any]] = {}
    names = Counter(document.get("name") for document in documents)
    for index, document in enumerate(documents):
        label = f"item {index} ({document.get('name')!r})"
        if names[document.get("name")] > 1:
            problems.append(f"{label}: the name appears more than once in the document.")
            continue
        try:
            definition = clean_definition({**DEFAULTS, **document})
            check_exclude_calendars(tenant.pk, definition["exclude_calendars"], lock=False)
        except ScheduleInvalid as exc:
            problems.extend(f"{label}: {key}: {text}" for key, texts in exc.errors.items() for text in texts)
            continue
        if not selector.matches(definition["labels"]):
            problems.append(f"{label}: its labels do not meet the selector {str(selector)!r}.")
            continue
        desired[definition["name"]] = definition
    if problems:
        raise ScheduleInvalid({"schedules": problems[:MAX_PROBLEMS]})
    return desired


def _current(tenant: Tenant, names: list[str]) -> dict[str, list[Schedule]]:
    """The tenant's schedules of the listed names that are live or completed, newest first."""
    current: dict[str, list[Schedule]] = {}
    schedules = Schedule.objects.for_tenant(tenant).filter(
        name__in=names, state__in=[*LIVE_STATES, ScheduleState.COMPLETED]
    )
    for schedule in schedules.order_by("-created_at", "-id"):
        current.setdefault(schedule.name, []).append(schedule)
    return current


def _plan(
    desired: dict[str, dict[str, Any]], current: dict[str, list[Schedule]], selector: Selector
) -> tuple[list[tuple[str, dict[str, Any], Schedule | None]], ApplyResult]:
    result = ApplyResult()
    plan: list[tuple[str, dict[str, Any], Schedule | None]] = []
    problems: list[str] = []
    for name, definition in desired.items():
        schedules = current.get(name, [])
        live = [s for s in schedules if s.state in LIVE_STATES]
        if len(live) > 1:
            problems.append(
                f"The tenant holds {len(live)} live schedules named {name!r}: cancel or rename all but one first."
            )
            continue
        existing = live[0] if live else (schedules[0] if schedules else None)
        if existing is None:
            result.created.append(name)
            plan.append((name, definition, None))
            continue
        if not selector.matches(existing.labels or {}):
            problems.append(f"The tenant's schedule {name!r} lies outside the selector {str(selector)!r}.")
            continue
        wanted = _with_stored_anchor(definition, existing)
        if definition_document(wanted) == stored_definition(existing):
            result.unchanged.append(name)
        else:
            result.updated.append(name)
            plan.append((name, wanted, existing))
    if problems:
        raise ScheduleInvalid({"schedules": problems[:MAX_PROBLEMS]})
    return plan, result


def _with_stored_anchor(definition: dict[str, Any], existing: Schedule) -> dict[str, Any]:
    if definition["kind"] == Kind.INTERVAL and definition["anchor_at"] is None and existing.kind == Kind.INTERVAL:
        return {**definition, "anchor_at": existing.anchor_at}
    return definition


def _check_quota(tenant: Tenant, *, added: int, freed: int) -> None:
    """Refuse before any write an apply whose new schedules would not fit the quota once it has pruned (each create
    checks again, under the tenant's lock)."""
    if added <= 0:
        return
    held = schedules_held(tenant.pk)
    if held - freed + added > tenant.max_schedules:
        raise QuotaExceeded(
            f"Applying adds {added} schedules (and prunes {freed}) to the {held} tenant {tenant.slug} holds; its "
            f"quota is {tenant.max_schedules}.",
            settings.SCHEDULER_QUOTA_RETRY_AFTER_SECONDS,
        )
