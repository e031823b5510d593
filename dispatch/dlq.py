"""The dead-letter queue: the dead occurrences an operator still has to act on, and the resolution that sets one
aside (docs/DESIGN.md, "Resolving from the DLQ").

An occurrence is in the DLQ while it is dead and no resolution was recorded for that death. The dashboard's tile,
the console's list, /metrics and `replay --dead` all read it so (dispatch/sql/__init__.py UNRESOLVED_DEAD, and
`in_dead_letter_queue` below for the ORM). Resolving is the operator's other answer to a dead fire, beside replay:
nothing more is to be done (its schedule is canceled, the work was done by hand, the payload was wrong). It changes
no state, so the engine, reconcile, the notifications and the public API see a dead occurrence as before; a replay
still runs it again under the same id, and a death after that is in the queue again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from dispatch.errors import ResolveRefused
from dispatch.models import Occurrence, OccurrenceResolution, OccurrenceState, OccurrenceWatch

logger = logging.getLogger(__name__)

# What a resolution's note may hold: the length of a note on a schedule's version (the console's note fields).
NOTE_MAX_LENGTH = 500


def _resolution_of_row() -> QuerySet[OccurrenceResolution]:
    """The resolution of the death of the outer occurrence row (its key and the generation it died at)."""
    return OccurrenceResolution.objects.filter(
        occurrence_id=OuterRef("occurrence_id"),
        scheduled_for=OuterRef("scheduled_for"),
        attempt_count=OuterRef("attempt_count"),
    )


def in_dead_letter_queue(queryset: QuerySet[Occurrence]) -> QuerySet[Occurrence]:
    """The occurrences of `queryset` in the DLQ: dead, that death not resolved. The watch's dead rows drive the read,
    each probing its occurrence's primary key (as the API's `?state=dead`), so no range is needed: the occurrence
    table has no index on state."""
    watched = OccurrenceWatch.objects.filter(
        occurrence_id=OuterRef("occurrence_id"), scheduled_for=OuterRef("scheduled_for"), state=OccurrenceState.DEAD
    )
    return queryset.filter(Exists(watched), ~Exists(_resolution_of_row()), state=OccurrenceState.DEAD)


def resolved_dead(queryset: QuerySet[Occurrence]) -> QuerySet[Occurrence]:
    """The occurrences of `queryset` that are dead and resolved: out of the DLQ, still replayable."""
    return queryset.filter(Exists(_resolution_of_row()), state=OccurrenceState.DEAD)


def current_resolutions(occurrences: Iterable[Occurrence]) -> dict[uuid.UUID, OccurrenceResolution]:
    """The resolution that holds now for each dead occurrence given (one that died again after it does not), in one
    query: a list page's badges."""
    deaths = {(o.occurrence_id, o.attempt_count): o for o in occurrences if o.state == OccurrenceState.DEAD}
    if not deaths:
        return {}
    rows = OccurrenceResolution.objects.filter(
        occurrence_id__in=[key[0] for key in deaths], scheduled_for__in={o.scheduled_for for o in deaths.values()}
    )
    return {row.occurrence_id: row for row in rows if (row.occurrence_id, row.attempt_count) in deaths}


def resolution_history(occurrence: Occurrence) -> list[OccurrenceResolution]:
    """Every resolution of the occurrence, oldest first: one per death an operator set aside (its timeline)."""
    return list(
        OccurrenceResolution.objects.filter(
            occurrence_id=occurrence.occurrence_id, scheduled_for=occurrence.scheduled_for
        ).order_by("resolved_at", "id")
    )


def current_resolution(occurrence: Occurrence, history: Iterable[OccurrenceResolution]) -> OccurrenceResolution | None:
    """The resolution among `history` that holds now: the occurrence is dead at the generation it was made for."""
    if occurrence.state != OccurrenceState.DEAD:
        return None
    return next((r for r in history if r.attempt_count == occurrence.attempt_count), None)


def resolve_dead_occurrence(occurrence_id: uuid.UUID, *, note: str, actor: str, now: datetime) -> OccurrenceResolution:
    """Set a dead occurrence aside: it leaves the DLQ with who, when and why recorded; its state and attempts stay.

    The occurrence row is locked, as a replay locks it (dispatch.occurrences.replay_dead_occurrence), so a resolve
    and a replay of the same occurrence serialise: a replay first leaves nothing dead to resolve, a resolve first is
    undone by the replay (the occurrence runs again; the resolution stays as history). ResolveRefused says why
    nothing was recorded.
    """
    note = note.strip()
    if not note:
        raise ResolveRefused("A resolution needs a note: why nothing more is to be done with this occurrence.")
    if len(note) > NOTE_MAX_LENGTH:
        raise ResolveRefused(f"The note has {len(note)} characters, at most {NOTE_MAX_LENGTH}.")
    with transaction.atomic():
        occurrence = Occurrence.objects.select_for_update().filter(occurrence_id=occurrence_id).first()
        if occurrence is None:
            raise ResolveRefused(f"No occurrence with id {occurrence_id}.")
        if occurrence.state != OccurrenceState.DEAD:
            raise ResolveRefused(
                f"Occurrence {occurrence_id} is {occurrence.state}; only a dead occurrence can be resolved."
            )
        earlier = current_resolution(occurrence, resolution_history(occurrence))
        if earlier is not None:
            raise ResolveRefused(
                f"Occurrence {occurrence_id} was already resolved by {earlier.resolved_by} at "
                f"{earlier.resolved_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC."
            )
        resolution = OccurrenceResolution.objects.create(
            occurrence_id=occurrence.occurrence_id,
            scheduled_for=occurrence.scheduled_for,
            attempt_count=occurrence.attempt_count,
            tenant_id=occurrence.tenant_id,
            resolved_at=now,
            resolved_by=actor,
            note=note,
        )
    logger.info(
        "resolved dead occurrence %s (attempt %d) by %s",
        occurrence_id,
        occurrence.attempt_count,
        actor,
        extra={"action": "resolve"},
    )
    return resolution
