"""Envelopes: the unit the relay publishes. One AMQP message carries up to SCHEDULER_ENVELOPE_SIZE occurrences of
one tenant, queue, instant and priority.

Why: on two cores one Python process confirms about 3,500 persistent messages a second but 5,600 envelopes of
100 occurrences, i.e. ~560,000 occurrences a second (ARCHITECTURE.md, "Measured"). An envelope is transport
only: each occurrence in it keeps its own id, state, attempts and fencing, and a redelivered envelope
re-offers only occurrences that are not terminal.

The body is a Celery protocol-2 task call of `dispatch.run_envelope`, serialised once, when the occurrences are
materialized; the relay sends the stored bytes untouched.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

from dispatch.identity import utc_key
from dispatch.queues import FLEXIBLE_QUEUE

RUN_ENVELOPE_TASK = "dispatch.run_envelope"
BODY_VERSION = 1


@dataclass(frozen=True)
class Fire:
    """An occurrence ready for the queue."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    tenant_id: int
    queue: str
    available_at: datetime
    priority: int


@dataclass(frozen=True)
class Envelope:
    tenant_id: int
    queue: str
    available_at: datetime
    priority: int
    fires: tuple[Fire, ...]

    @property
    def occurrence_ids(self) -> list[uuid.UUID]:
        return [fire.occurrence_id for fire in self.fires]

    @property
    def scheduled_fors(self) -> list[datetime]:
        return [fire.scheduled_for for fire in self.fires]


def _release_instant(available_at: datetime) -> datetime:
    """Flexible fires are spread to the millisecond; rounding each up to the next whole second lets fires of one
    second share an envelope while none is released before its own available_at."""
    if available_at.microsecond == 0:
        return available_at
    return available_at.replace(microsecond=0) + timedelta(seconds=1)


def pack(fires: list[Fire], size: int | None = None) -> list[Envelope]:
    """Group fires by (tenant, queue, release instant, priority) and cut each group into envelopes of `size`.

    Keeping tenants apart lets the relay interleave tenants fairly at the hot instant.
    """
    size = size or settings.SCHEDULER_ENVELOPE_SIZE
    groups: dict[tuple[int, str, datetime, int], list[Fire]] = defaultdict(list)
    for fire in fires:
        # Only the flexible lane is rounded: strict fires (and manual ones) leave at their exact instant.
        release_at = _release_instant(fire.available_at) if fire.queue == FLEXIBLE_QUEUE else fire.available_at
        groups[(fire.tenant_id, fire.queue, release_at, fire.priority)].append(fire)
    envelopes = []
    for (tenant_id, queue, release_at, priority), members in groups.items():
        for start in range(0, len(members), size):
            envelopes.append(Envelope(tenant_id, queue, release_at, priority, tuple(members[start : start + size])))
    envelopes.sort(key=lambda e: (e.available_at, -e.priority))
    return envelopes


def encode_body(envelope: Envelope) -> bytes:
    """The Celery protocol-2 body: [args, kwargs, embed]; the single argument is the envelope's content."""
    content = {
        "v": BODY_VERSION,
        "tenant_id": envelope.tenant_id,
        "queue": envelope.queue,
        "occurrences": [[str(fire.occurrence_id), utc_key(fire.scheduled_for)] for fire in envelope.fires],
    }
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return json.dumps([[content], {}, embed], separators=(",", ":")).encode()


def message_headers(task_id: str, count: int) -> dict[str, Any]:
    """AMQP headers that make a stored body a Celery task message (protocol 2)."""
    return {
        "lang": "py",
        "task": RUN_ENVELOPE_TASK,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "shadow": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": f"<envelope of {count}>",
        "kwargsrepr": "{}",
        "origin": "scheduler-relay",
        "ignore_result": True,
    }


def task_id_for(outbox_id: int) -> str:
    return f"envelope-{outbox_id}"


class MalformedEnvelope(ValueError):
    """A message on our queues that is not an envelope we wrote: logged and dropped by the worker."""


def decode_content(content: Any) -> list[tuple[uuid.UUID, datetime]]:
    """The (occurrence_id, scheduled_for) pairs of an envelope argument; raises MalformedEnvelope."""
    if not isinstance(content, dict) or content.get("v") != BODY_VERSION:
        raise MalformedEnvelope(f"not an envelope of version {BODY_VERSION}: {str(content)[:200]!r}")
    pairs = content.get("occurrences")
    if not isinstance(pairs, list):
        raise MalformedEnvelope("envelope without an occurrences list")
    decoded = []
    for pair in pairs:
        try:
            occurrence_id, scheduled_for = pair
            instant = datetime.strptime(scheduled_for, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            decoded.append((uuid.UUID(occurrence_id), instant))
        except (TypeError, ValueError) as exc:
            raise MalformedEnvelope(f"bad occurrence entry {str(pair)[:100]!r}: {exc}") from None
    return decoded


def flexible_offset(occurrence_id: uuid.UUID, window_seconds: int) -> timedelta:
    """Deterministic jitter inside the flexible window: the same occurrence gets the same instant after every
    failover or replay, while correlated fires spread out. Millisecond resolution."""
    window_ms = max(1, window_seconds * 1000)
    return timedelta(milliseconds=occurrence_id.int % window_ms)


def spread(count: int, per_minute: int) -> list[timedelta]:
    """Offsets that pace `count` catch-up fires at `per_minute` (the tenant's catch-up quota)."""
    interval = 60.0 / max(1, per_minute)
    return [timedelta(seconds=math.floor(i * interval * 1000) / 1000) for i in range(count)]


def write_envelopes(cursor, fires: list[Fire], size: int | None = None) -> int:
    """Pack fires into envelopes and insert them into the outbox, in the caller's transaction."""
    from dispatch import sql

    envelopes = pack(fires, size)
    if envelopes:
        cursor.executemany(
            sql.INSERT_OUTBOX,
            [
                (e.tenant_id, e.queue, e.available_at, e.priority, e.occurrence_ids, e.scheduled_fors, encode_body(e))
                for e in envelopes
            ],
        )
    return len(envelopes)
