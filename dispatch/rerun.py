"""Re-running a fire that did not run, under its own id (docs/DESIGN.md, "Resolving from the DLQ").

A missed fire (its misfire policy judged it too late) or one its overlap policy skipped cannot be run again by the
other operator paths: a backfill finds its row and says "already present", and a run-now is a new fire with a new id,
which the handler cannot tell is this one. A re-run puts this very occurrence back in the queue: the same
occurrence_id (the handler's idempotency key), `forced` as a DLQ replay is, so the misfire policy does not judge it
again and it runs under its own version even if the schedule changed since; recorded, with who, when, why and the
judgement it set aside, as a resolution records an operator's decision on a dead fire (dispatch/dlq.py).

What `forced` does not do: exempt the fire from its schedule's overlap policy, which the claim applies to every
first delivery (dispatch/engine/claim_rules.py). A re-run that would meet a running sibling under skip_if_running
(or a full queue under queue_one) is refused here rather than skipped again at claim; see `_overlap_refusal`.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q

from core.choices import OverlapPolicy, ScheduleState
from dispatch.dlq import NOTE_MAX_LENGTH
from dispatch.models import Occurrence, OccurrenceRerun, OccurrenceState, OccurrenceWatch
from dispatch.outbox import Fire, enqueue
from dispatch.sql import control_plane as control_plane_sql

logger = logging.getLogger(__name__)

# The side exits that are a judgement of the engine's rules about a fire nobody ran: the operator may overrule them.
RERUNNABLE_STATES = (OccurrenceState.MISSED, OccurrenceState.SKIPPED_OVERLAP)
# What the row says between the re-run and its claim (which clears it): the API's state_reason, so a tenant sees why
# a missed fire is scheduled again. The operator's note stays in the console (like a resolution's).
RERUN_REASON = "re-run by an operator"


class RerunRefused(Exception):
    """The re-run was not done; the message says why (unknown, not missed or skipped, its schedule canceled or gone,
    its overlap policy would skip it again, or no note)."""


def refusal_of(state: str, schedule_state: str | None) -> str:
    """Why an occurrence in `state` whose schedule is in `schedule_state` (None: gone) cannot be re-run, or "".

    Only missed and skipped_overlap fires qualify. Not a `canceled` one: a withdrawal is the outcome of a decision
    (an update, pause or cancel of its schedule, or its tenant's deletion) that this fire of that version should not
    run, not of an outage; overruling it under the old id would run what the tenant withdrew. A fire the tenant wants
    after all is a new one: run now, under the schedule's current version. Not a dead one either: that is the DLQ's
    replay, which keeps its attempts' count; nor one that succeeded (its effect would happen twice) or has not ended.
    """
    if state == OccurrenceState.CANCELED:
        return (
            "canceled: a withdrawal by a change of its schedule (or its tenant's deletion) is a decision, not a "
            "failure; use Run now on the schedule for a new fire"
        )
    if state == OccurrenceState.DEAD:
        return "dead: replay it from the dead-letter queue instead (same id, its attempts counted)"
    if state == OccurrenceState.SUCCEEDED:
        return "succeeded: it ran already; a re-run would repeat its effect"
    if state not in RERUNNABLE_STATES:
        return f"{state}: it has not ended yet"
    if schedule_state is None:
        return "its schedule no longer exists (its tenant was deleted): no worker could claim it"
    if schedule_state == ScheduleState.CANCELED:
        return "its schedule is canceled: a worker withdraws every fire of a canceled schedule, so it would not run"
    return ""


def rerun_history(occurrence: Occurrence) -> list[OccurrenceRerun]:
    """Every re-run of the occurrence, oldest first (its timeline)."""
    return list(
        OccurrenceRerun.objects.filter(
            occurrence_id=occurrence.occurrence_id, scheduled_for=occurrence.scheduled_for
        ).order_by("rerun_at", "id")
    )


def rerun_occurrence(occurrence_id: uuid.UUID, *, note: str, actor: str, now: datetime) -> OccurrenceRerun:
    """Put a missed or overlap-skipped occurrence back in the queue under its own id: scheduled, forced, released at
    `now` with an envelope of its own, and the re-run recorded. RerunRefused says why nothing was done.

    It runs even if its schedule is paused or changed version since (forced, as a replay), unless the schedule is
    canceled. Its attempt count is untouched: these fires never ran, so the claim takes generation 1, and no attempt
    of that generation exists to make the worker drop the delivery as a duplicate. The notification of the earlier
    judgement was sent once for ever (UNIQUE(event, occurrence)): a re-run that succeeds sends nothing, one that dies
    is told as dead.

    Locks its schedule's row, then the occurrence's (the lock order of a claim under an overlap policy and of a
    cancel), so neither can change what this decided on before it commits.
    """
    note = note.strip()
    if not note:
        raise RerunRefused("A re-run needs a note: why this fire should run now after all.")
    if len(note) > NOTE_MAX_LENGTH:
        raise RerunRefused(f"The note has {len(note)} characters, at most {NOTE_MAX_LENGTH}.")
    # Found by id alone (one probe of each day's primary key), then locked by its full key.
    found = Occurrence.objects.filter(occurrence_id=occurrence_id).values_list("schedule_id", "scheduled_for").first()
    if found is None:
        raise RerunRefused(f"No occurrence with id {occurrence_id}.")
    schedule_id, scheduled_for = found
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(control_plane_sql.SCHEDULE_FOR_RERUN, {"schedule_id": schedule_id})
        schedule = cursor.fetchone()
        occurrence = (
            Occurrence.objects.select_for_update()
            .filter(occurrence_id=occurrence_id, scheduled_for=scheduled_for)
            .first()
        )
        if occurrence is None:  # its day was dropped meanwhile
            raise RerunRefused(f"No occurrence with id {occurrence_id}.")
        refusal = refusal_of(occurrence.state, schedule[0] if schedule else None) or _overlap_refusal(
            occurrence, schedule[1], now
        )
        if refusal:
            raise RerunRefused(f"Occurrence {occurrence_id} is not re-run: {refusal}.")
        # Conditional on the state observed (docs/ARCHITECTURE.md rule 14); under the row lock it cannot miss, and
        # should it, nothing is written.
        moved = Occurrence.objects.filter(
            occurrence_id=occurrence_id, scheduled_for=scheduled_for, state=occurrence.state
        ).update(
            state=OccurrenceState.SCHEDULED, available_at=now, finished_at=None, forced=True, state_reason=RERUN_REASON
        )
        if moved != 1:
            raise RerunRefused(f"Occurrence {occurrence_id} changed meanwhile; look at it again.")
        enqueue(cursor, [Fire.of(occurrence, available_at=now)])
        rerun = OccurrenceRerun.objects.create(
            occurrence_id=occurrence_id,
            scheduled_for=scheduled_for,
            tenant_id=occurrence.tenant_id,
            previous_state=occurrence.state,
            previous_reason=occurrence.state_reason,
            rerun_at=now,
            rerun_by=actor,
            note=note,
        )
    logger.info("re-ran %s occurrence %s by %s", occurrence.state, occurrence_id, actor, extra={"action": "rerun"})
    return rerun


def _overlap_refusal(occurrence: Occurrence, overlap_policy: str, now: datetime) -> str:
    """Why the claim's overlap rule would skip this fire again if it were delivered now, or "".

    `forced` exempts a fire from the misfire policy, not from the overlap policy: a first delivery (these have never
    run) meets it at claim like any other (dispatch/engine/claim_rules.overlap_verdict). This asks the same question
    of the same rows (the watch's running and held siblings) now, holding the schedule's row as that claim would, so
    the answer holds until the fire is delivered, seconds later, unless a sibling starts in between: then the claim
    skips it again and the timeline says so, and the operator may re-run it once more. A fire the rule would only hold
    (queue_one behind a running sibling) is not refused: it runs when the sibling is done.
    """
    if overlap_policy == OverlapPolicy.ALLOW:
        return ""
    siblings = OccurrenceWatch.objects.filter(schedule_id=occurrence.schedule_id).exclude(
        occurrence_id=occurrence.occurrence_id
    )
    running = (
        siblings.filter(state=OccurrenceState.RUNNING, lease_expires_at__gt=now)
        .values_list("occurrence_id", flat=True)
        .first()
    )
    pending = _pending_reruns(occurrence, now)
    if overlap_policy == OverlapPolicy.SKIP_IF_RUNNING:
        if running is None and not pending:
            return ""
        if running is None:
            return (
                f"occurrence {pending[0]} of its schedule was re-run and waits to run; its overlap policy "
                "(skip_if_running) would skip this one when both are delivered; re-run it once that one has ended"
            )
        return (
            f"occurrence {running} of its schedule is running and its overlap policy (skip_if_running) would skip "
            "this one again; re-run it once that one has ended"
        )
    held = (
        siblings.filter(state=OccurrenceState.RETRY_WAIT, attempt_count=0)
        .order_by("scheduled_for")
        .values_list("occurrence_id", "scheduled_for")
        .first()
    )
    if (running is not None) + (held is not None) + len(pending) >= 2:
        waiting = held[0] if held is not None else pending[0]
        return (
            f"occurrence {waiting} of its schedule already waits its turn (or was re-run and waits to run) and its "
            "overlap policy (queue_one) holds one at most: this one would be skipped again; re-run it once that one "
            "has run"
        )
    if held is None or (running is None and (occurrence.scheduled_for, occurrence.occurrence_id) < (held[1], held[0])):
        return ""
    return (
        f"occurrence {held[0]} of its schedule already waits its turn and its overlap policy (queue_one) holds one "
        "at most: this one would be skipped again; re-run it once that one has run"
    )


# How far back an operator's re-runs are looked at for ones still waiting to run (a re-run runs within seconds).
PENDING_RERUN_WINDOW = timedelta(hours=1)


def _pending_reruns(occurrence: Occurrence, now: datetime) -> list[uuid.UUID]:
    """Siblings an operator re-ran that have not run yet (scheduled or enqueued): the claim's overlap rule will meet
    them before this fire, though the watch table does not hold them yet. Read from the re-run records of the last
    hour (a small table), each probing its occurrence by key."""
    recent = OccurrenceRerun.objects.filter(
        tenant_id=occurrence.tenant_id, rerun_at__gte=now - PENDING_RERUN_WINDOW
    ).exclude(occurrence_id=occurrence.occurrence_id)
    keys = Q()
    for occurrence_id, scheduled_for in recent.values_list("occurrence_id", "scheduled_for")[:1000]:
        keys |= Q(occurrence_id=occurrence_id, scheduled_for=scheduled_for)
    if not keys:
        return []
    waiting = Occurrence.objects.filter(
        keys,
        schedule_id=occurrence.schedule_id,
        state__in=(OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED),
    )
    return list(waiting.values_list("occurrence_id", flat=True))
