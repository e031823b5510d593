"""What was down when a fire was missed, as far as the process heartbeat rows tell (dispatch_processheartbeat: each
materializer, relay and worker writes its row every few seconds while it runs). The occurrence timeline says it
(dispatch/timeline.py).

The rows prove presence, never absence: a process that stops cleanly deletes its row and old rows are pruned, so a
silence is only told when its start is on record (a row whose last heartbeat came before the fire fell due) and no
row covers the instant; otherwise nothing is said.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError

from dispatch.models import Occurrence, ProcessHeartbeat

logger = logging.getLogger(__name__)

# What stops when no process of a role reports.
ROLE_CONSEQUENCES = {
    "materializer": "fires were not planned",
    "relay": "due fires were not published",
    "worker": "no fire was claimed",
}


@dataclass(frozen=True)
class ProcessSpan:
    """What a heartbeat row says of one process: its role and name, and that it reported from `started_at` until
    its last heartbeat, `heartbeat_at`."""

    role: str
    name: str
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True)
class Silence:
    """No process of `role` reported for `seconds`: from `last`'s last heartbeat (before the fire fell due) until
    `resumed` started (None: until the fire was judged missed). `resumed_after` is that start minus the release."""

    role: str
    seconds: float
    last: ProcessSpan
    resumed: ProcessSpan | None = None
    resumed_after: timedelta = timedelta(0)


def process_spans() -> list[ProcessSpan]:
    """Every heartbeat row (a small table: one row per process, pruned a few minutes after it stops); none when the
    table cannot be read, so nothing is said of outages rather than a page failing."""
    try:
        rows = list(ProcessHeartbeat.objects.values_list("role", "name", "started_at", "heartbeat_at"))
    except DatabaseError:
        logger.warning("heartbeat rows unreadable", exc_info=True, extra={"action": "timeline"})
        return []
    return [ProcessSpan(*row) for row in rows]


def judged_at_planning(occurrence: Occurrence) -> bool:
    """Recorded missed by the materializer as it wrote the row (its finished_at is its created_at), not by a worker
    at its first delivery."""
    return occurrence.finished_at is not None and occurrence.finished_at == occurrence.created_at


def silences(occurrence: Occurrence, spans: Sequence[ProcessSpan], *, ttl: float) -> list[Silence]:
    """Per role (only the materializer's when it judged the fire at planning: nothing else had it yet), the silence
    around the fire's release instant: no span covers the instant (a span counts `ttl` past its last heartbeat, the
    liveness rule of /healthz), one ended before it, and the gap from that one's last heartbeat to the next start
    (or to the judgement) is longer than `ttl`."""
    due = occurrence.available_at
    judged = occurrence.finished_at or occurrence.created_at
    roles = ("materializer",) if judged_at_planning(occurrence) else tuple(ROLE_CONSEQUENCES)
    found = []
    for role in roles:
        mine = [span for span in spans if span.role == role]
        if any(span.started_at <= due <= span.heartbeat_at + timedelta(seconds=ttl) for span in mine):
            continue  # one was reporting when the fire fell due
        before = [span for span in mine if span.heartbeat_at < due]
        if not before:
            continue  # the silence's start is not on record
        last = max(before, key=lambda span: span.heartbeat_at)
        starts = [span for span in mine if last.heartbeat_at < span.started_at <= judged]
        resumed = min(starts, key=lambda span: span.started_at) if starts else None
        seconds = ((resumed.started_at if resumed else judged) - last.heartbeat_at).total_seconds()
        if seconds > ttl:
            after = resumed.started_at - due if resumed else timedelta(0)
            found.append(Silence(role, seconds, last, resumed, after))
    return found
