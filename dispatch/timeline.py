"""An occurrence's history in words, from the rows that exist: when it was due, released, published, tried and
finished, and why it ended as it did ("why didn't 09:00 run?").

Nothing here is stored: the occurrence row (its instants, flags and state_reason), its attempts, the schedule
version it belongs to, the operators' resolutions of its deaths (dispatch/dlq.py) and their re-runs of it
(dispatch/rerun.py) say all of it. Pure functions of those rows and `now`, so the console, a command or a test read
the same story.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatch.dlq import current_resolution
from dispatch.metrics import live_heartbeat_seconds
from dispatch.models import Attempt, Occurrence, OccurrenceRerun, OccurrenceResolution, OccurrenceState
from dispatch.outages import ROLE_CONSEQUENCES, ProcessSpan, Silence, process_spans, silences

__all__ = ["Event", "Verdict", "occurrence_timeline", "offset_text", "seconds_text", "verdict"]

# Released this long after its fire time by a path other than flexible spread or catch-up pacing: an operator's
# backfill (written long after the fact) rather than an ordinary fire.
BACKFILL_GAP = timedelta(minutes=1)
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Event:
    """One line of the timeline. `tone` is "", "ok", "warn" or "error"; `attempt` the generation it is about."""

    at: datetime | None
    label: str
    detail: str = ""
    tone: str = ""
    attempt: int | None = None


@dataclass(frozen=True)
class Verdict:
    """The answer in one or two sentences, for the top of the page."""

    headline: str
    detail: str = ""
    tone: str = ""


def seconds_text(span: timedelta) -> str:
    """A signed duration with millisecond precision: '+0.412 s', '+612.000 s', '-1.500 s'."""
    seconds = span.total_seconds()
    return f"{'+' if seconds >= 0 else '-'}{abs(seconds):.3f} s"


def offset_text(span: timedelta, reference: str) -> str:
    """How far an instant lies from a reference, in words that never read as a negative duration:
    '0.412 s after release', '1.171 s before its fire time'."""
    seconds = span.total_seconds()
    return f"{abs(seconds):.3f} s {'after' if seconds >= 0 else 'before'} {reference}"


def _utc(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _rule(definition: dict[str, Any] | None) -> str:
    if not definition:
        return ""
    return (
        f"misfire policy {definition.get('misfire_policy')}, max lateness {definition.get('max_lateness_seconds')} s, "
        f"overlap policy {definition.get('overlap_policy')}, max attempts {definition.get('max_attempts')}"
    )


def _origin(occurrence: Occurrence, *, rerun: bool = False) -> str:
    if rerun:  # forced by the re-run, not by a backfill or replay: its creation time says nothing of either
        return "the schedule's rhythm, re-run by an operator since (see below)"
    if occurrence.manual:
        return "a manual trigger (run now), outside the cron rhythm; forced: it runs whatever the schedule does next"
    if occurrence.forced and occurrence.created_at - occurrence.scheduled_for > BACKFILL_GAP:
        return "a backfill by an operator; forced: it runs even if the schedule changed since"
    if occurrence.forced:
        return "the schedule's rhythm, replayed by an operator since (forced: it runs even if the schedule changed)"
    return "the schedule's rhythm"


def _moved_after_publish(occurrence: Occurrence) -> bool:
    """Whether its release instant (available_at) was moved after its first publish (enqueued_at keeps the first
    stamp): a retry's due time, or a new offer after it waited for a running slot. Then enqueued_at - available_at
    is no delay of anything."""
    return occurrence.enqueued_at is not None and occurrence.available_at > occurrence.enqueued_at


def _release(occurrence: Occurrence, attempts: Sequence[Attempt]) -> tuple[str, str]:
    """The label and the why of the release instant when it is not the fire time."""
    delay = offset_text(occurrence.available_at - occurrence.scheduled_for, "its fire time")
    if occurrence.forced and any(a.started_at < occurrence.available_at for a in attempts):
        return "Released again", f"{delay}: replayed from the dead-letter queue, under the same id."
    if _moved_after_publish(occurrence):
        ended = [a for a in attempts if a.finished_at is not None and a.finished_at <= occurrence.available_at]
        if ended and ended[-1].outcome != "succeeded":
            return (
                "Retry due",
                f"{delay}: attempt {ended[-1].generation} {ended[-1].outcome or 'ended'}, and its retry waited out the "
                "backoff.",
            )
        # Parking keeps the attempts and clears nothing else: no attempt ended before it.
        return (
            "Offered again",
            f"{delay}: when a worker took it, it could not start there yet (its tenant already ran max_running "
            "occurrences, or its handlers held their share of the worker's pool, or its envelope's turn on the "
            "worker ended first), so it went back to wait and was offered again. That wait is the tenant's own "
            "quota and share, not platform lag.",
        )
    if occurrence.forced and not occurrence.manual:
        return "Released", f"{delay}: released when the operator's backfill wrote it (paced by catch-up)."
    if occurrence.lane == "flexible":
        return "Released", f"{delay}: its slot in the flexible lane's spread window."
    if occurrence.created_at > occurrence.scheduled_for:
        return "Released", f"{delay}: paced by the tenant's catch-up budget (max catch-up fires per minute)."
    return "Released", f"{delay}."


def occurrence_timeline(
    occurrence: Occurrence,
    attempts: Sequence[Attempt],
    *,
    definition: dict[str, Any] | None,
    now: datetime,
    resolutions: Sequence[OccurrenceResolution] = (),
    reruns: Sequence[OccurrenceRerun] = (),
    processes: Sequence[ProcessSpan] | None = None,
) -> list[Event]:
    """Every transition the rows record, in time order (ties keep the order of the life cycle). For a missed
    occurrence, what was down when it fell due, from `processes` (None: the heartbeat rows as they stand)."""
    events: list[Event] = [
        Event(
            occurrence.created_at,
            f"Created (version {occurrence.schedule_version})",
            f"From {_origin(occurrence, rerun=bool(reruns))}."
            + (
                " Kept through a schedule change: it was already due when the schedule changed."
                if occurrence.kept
                else ""
            ),
        ),
        Event(occurrence.scheduled_for, "Fire time (scheduled for)", "The instant the rule asked for."),
    ]
    events.extend(_rerun_event(rerun) for rerun in reruns)
    # A re-run releases the fire at its own instant: its line says so, and no other release line is true of it.
    if occurrence.available_at != occurrence.scheduled_for and not _released_by_rerun(occurrence, reruns):
        label, detail = _release(occurrence, attempts)
        events.append(Event(occurrence.available_at, label, detail))
    if occurrence.throttled:
        # Shown with the publish that may have waited: a later offer's when the release moved after the first.
        waited_at = occurrence.available_at if _moved_after_publish(occurrence) else occurrence.enqueued_at
        events.append(
            Event(
                waited_at or occurrence.available_at,
                "Throttled",
                "A publish of it waited for its tenant's max_fires_per_second quota (the relays release no more "
                "fires a second than that); the wait is the tenant's quota, not platform lag, and the misfire rule "
                "does not count it.",
                tone="warn",
            )
        )
    if occurrence.enqueued_at is not None:
        events.append(
            Event(occurrence.enqueued_at, "Published to the broker (enqueued)", _published_detail(occurrence))
        )
    for attempt in attempts:
        events.extend(_attempt_events(occurrence, attempt, now))
    current = current_resolution(occurrence, resolutions)
    for resolution in resolutions:
        events.append(_resolution_event(resolution, holds=resolution is current))
    if occurrence.state == OccurrenceState.MISSED:
        spans = process_spans() if processes is None else processes
        events.extend(map(_silence_event, silences(occurrence, spans, ttl=live_heartbeat_seconds())))
    final = _final_event(occurrence, attempts, definition, now, current)
    if final is not None:
        events.append(final)
    order = {id(event): index for index, event in enumerate(events)}
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(events, key=lambda event: (event.at or far, order[id(event)]))


def _silence_event(silence: Silence) -> Event:
    """What was down when a missed fire fell due (dispatch/outages.py), at the last heartbeat before the silence."""
    until = "before this fire was judged"
    if silence.resumed is not None:
        until = f"until {silence.resumed.name} started, {offset_text(silence.resumed_after, 'its release')}"
    return Event(
        silence.last.heartbeat_at,
        f"No {silence.role} heartbeat on record",
        f"No {silence.role} heartbeat on record covers the {silence.seconds:.0f} s {until}: if none was running, "
        f"{ROLE_CONSEQUENCES[silence.role]} meanwhile. This is the last heartbeat on record before it fell due "
        f"({silence.last.name}). The rows are what is known: a process that stopped cleanly removed its own.",
        tone="warn",
    )


def _published_detail(occurrence: Occurrence) -> str:
    assert occurrence.enqueued_at is not None
    since_fire = offset_text(occurrence.enqueued_at - occurrence.scheduled_for, "its fire time")
    if _moved_after_publish(occurrence):
        # enqueued_at is the first publish; available_at now is a later offer's, so their difference means nothing.
        return f"First published {since_fire}; its release instant moved later since (see below)."
    if occurrence.available_at == occurrence.scheduled_for:
        waited = f"{since_fire}."
    else:
        waited = f"{offset_text(occurrence.enqueued_at - occurrence.available_at, 'release')}, {since_fire}."
    if occurrence.throttled:
        waited += " Time after release was spent waiting for the tenant's max_fires_per_second quota."
    return waited


def _attempt_events(occurrence: Occurrence, attempt: Attempt, now: datetime) -> list[Event]:
    worker = f" by {attempt.worker}" if attempt.worker else ""
    events = [
        Event(
            attempt.started_at,
            f"Attempt {attempt.generation} started",
            f"Claimed{worker}, {offset_text(attempt.started_at - occurrence.scheduled_for, 'its fire time')}.",
            attempt=attempt.generation,
        )
    ]
    if attempt.finished_at is not None:
        duration = seconds_text(attempt.finished_at - attempt.started_at).lstrip("+")
        error = f" {attempt.error_class or 'error'}: {attempt.error}" if attempt.error or attempt.error_class else ""
        outcome = attempt.outcome or "finished"
        events.append(
            Event(
                attempt.finished_at,
                f"Attempt {attempt.generation} {outcome}",
                f"After {duration}.{error}",
                tone="ok" if outcome == "succeeded" else ("error" if outcome == "failed" else "warn"),
                attempt=attempt.generation,
            )
        )
    elif attempt.lease_expires_at is not None and attempt.lease_expires_at < now:
        events.append(
            Event(
                attempt.lease_expires_at,
                f"Attempt {attempt.generation}: lease expired",
                "Its worker stopped renewing the lease (it died or lost the database); the reaper retries the "
                "occurrence or ends it, and a later attempt takes over with the next generation.",
                tone="warn",
                attempt=attempt.generation,
            )
        )
    return events


def _rerun_event(rerun: OccurrenceRerun) -> Event:
    judged = f"{rerun.previous_state}: {rerun.previous_reason}" if rerun.previous_reason else rerun.previous_state
    return Event(
        rerun.rerun_at,
        f"Re-run by {rerun.rerun_by}",
        f"It was {judged}. Released again now under the same id, forced (its misfire policy does not judge it "
        f'again): "{rerun.note}".',
    )


def _released_by_rerun(occurrence: Occurrence, reruns: Sequence[OccurrenceRerun]) -> bool:
    return bool(reruns) and occurrence.available_at == reruns[-1].rerun_at


def _resolution_event(resolution: OccurrenceResolution, *, holds: bool) -> Event:
    after = f"after attempt {resolution.attempt_count}" if resolution.attempt_count else "before any attempt"
    since = "" if holds else " A replay ran it again since."
    return Event(
        resolution.resolved_at,
        f"Resolved by {resolution.resolved_by}",
        f'Set aside {after}, out of the dead-letter queue: "{resolution.note}".{since}',
        tone="ok" if holds else "",
    )


def _final_event(
    occurrence: Occurrence,
    attempts: Sequence[Attempt],
    definition: dict[str, Any] | None,
    now: datetime,
    resolution: OccurrenceResolution | None,
) -> Event | None:
    judged = verdict(occurrence, attempts, definition=definition, now=now, resolution=resolution)
    if occurrence.state in (OccurrenceState.SCHEDULED, OccurrenceState.ENQUEUED, OccurrenceState.RUNNING):
        return Event(now, f"Now: {occurrence.state}", judged.headline, tone=judged.tone)
    if occurrence.state == OccurrenceState.RETRY_WAIT:
        return Event(now, "Now: waiting (retry_wait)", judged.headline, tone=judged.tone)
    return Event(occurrence.finished_at, f"Finished: {occurrence.state}", judged.headline, tone=judged.tone)


def _reason(occurrence: Occurrence) -> str:
    return occurrence.state_reason.strip()


def verdict(
    occurrence: Occurrence,
    attempts: Sequence[Attempt],
    *,
    definition: dict[str, Any] | None,
    now: datetime,
    resolution: OccurrenceResolution | None = None,
) -> Verdict:
    """Why the occurrence is where it is, from its state_reason, the rule of its version and, for a dead one, the
    operator's resolution that holds (dispatch.dlq.current_resolution)."""
    state, reason = occurrence.state, _reason(occurrence)
    rule = _rule(definition)
    version = f"version {occurrence.schedule_version}"
    last = attempts[-1] if attempts else None
    if state == OccurrenceState.MISSED:
        if reason:
            return Verdict(f"missed: {reason}", f"Decided by the rule of {version}: {rule}." if rule else "", "error")
        late = (occurrence.finished_at or now) - occurrence.scheduled_for
        return Verdict(
            "missed (no reason recorded)",
            f"It was recorded {offset_text(late, 'its fire time')}; {version}: {rule}." if rule else "",
            "error",
        )
    if state == OccurrenceState.SKIPPED_OVERLAP:
        return Verdict(
            f"skipped: {reason or 'overlap with a running occurrence'}",
            f"The overlap policy of {version} ({(definition or {}).get('overlap_policy', '?')}) decided it.",
            "warn",
        )
    if state == OccurrenceState.CANCELED:
        return Verdict(
            f"canceled: {reason or 'withdrawn by a change of its schedule'}",
            "A schedule change (update, pause, cancel) withdrew it before any worker claimed it."
            if not attempts
            else "Its schedule changed while it was running; the worker stopped it.",
            "warn",
        )
    if state == OccurrenceState.DEAD:
        error = f"; last error {last.error_class or 'error'}: {last.error}" if last and last.error else ""
        headline = f"dead: {reason or 'failed'} after {occurrence.attempt_count} attempt(s){error}"
        if resolution is not None:
            return Verdict(
                f"{headline}; resolved by {resolution.resolved_by}",
                f'Resolved at {_utc(resolution.resolved_at)}: "{resolution.note}". It is out of the dead-letter '
                "queue; a replay still runs it again (same id).",
            )
        return Verdict(
            headline,
            "In the dead-letter queue: replay it (same id) once the cause is fixed, or resolve it (with a note) if "
            "nothing more is to be done.",
            "error",
        )
    if state == OccurrenceState.SUCCEEDED:
        took = ""
        if last is not None and last.finished_at is not None:
            took = f" in {seconds_text(last.finished_at - last.started_at).lstrip('+')}"
        started = ""
        if attempts:
            started = f", started {offset_text(attempts[0].started_at - occurrence.scheduled_for, 'its fire time')}"
        return Verdict(f"succeeded on attempt {occurrence.attempt_count}{took}{started}.", tone="ok")
    if state == OccurrenceState.RETRY_WAIT:
        if reason.startswith("throttled"):
            return Verdict(f"{reason}: it waits for a running slot and is offered again shortly.", tone="warn")
        if reason.startswith("overlap"):
            return Verdict(f"waiting: {reason}.", tone="warn")
        error = f" after {last.error_class or 'error'}: {last.error}" if last and last.error else ""
        return Verdict(
            f"waiting to retry (attempt {occurrence.attempt_count + 1} at {_utc(occurrence.available_at)}){error}.",
            tone="warn",
        )
    if state == OccurrenceState.RUNNING:
        return Verdict(f"running (attempt {occurrence.attempt_count}).")
    due = occurrence.available_at
    if due > now:
        return Verdict(f"waiting for its release at {_utc(due)}.")
    where = (
        "the broker holds it for a worker" if state == OccurrenceState.ENQUEUED else "the relay has not published it"
    )
    return Verdict(
        f"due {seconds_text(now - due).lstrip('+')} ago: {where}.", tone="warn" if now - due > BACKFILL_GAP else ""
    )


def occurrence_ids_in(text: str) -> list[str]:
    """The occurrence ids a reason names ("overlap: occurrence <id> still running"), to link them."""
    return UUID_PATTERN.findall(text)
