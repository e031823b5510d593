"""The one way to put work on the outbox: a `Fire` for each occurrence on its lane's queue (`Fire.for_lane`, or
`queue_for_lane` once per schedule where fires are made by the thousand), then `enqueue(cursor, fires)`.

Fires are grouped by (tenant, queue, release instant, priority) and cut into envelopes of SCHEDULER_ENVELOPE_SIZE,
each stored with its message body (dispatch/wire.py) in the caller's transaction: an occurrence that becomes
due commits together with the message that will carry it, so none is ever due without one.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings

from dispatch.queues import FLEXIBLE_QUEUE, queue_for_lane
from dispatch.sql import copy_rows
from dispatch.sql import outbox as outbox_sql
from dispatch.wire import encode_body


class Fire(NamedTuple):
    """An occurrence ready for its lane's queue, released at `available_at`. A named tuple, not a frozen dataclass:
    the materializer makes one per fire, and it is built three times as fast."""

    occurrence_id: uuid.UUID
    scheduled_for: datetime
    tenant_id: int
    queue: str
    available_at: datetime
    priority: int

    @classmethod
    def for_lane(
        cls,
        occurrence_id: uuid.UUID,
        scheduled_for: datetime,
        *,
        tenant_id: int,
        lane: str,
        available_at: datetime,
        priority: int,
    ) -> Fire:
        """The fire of one occurrence on its lane's queue: strict and flexible work never share a queue."""
        return cls(occurrence_id, scheduled_for, tenant_id, queue_for_lane(lane), available_at, priority)

    @classmethod
    def of(cls, occurrence: Any, *, available_at: datetime) -> Fire:
        """`for_lane` for anything that carries an occurrence's columns (a row, an expected fire, a stuck one)."""
        return cls.for_lane(
            occurrence.occurrence_id,
            occurrence.scheduled_for,
            tenant_id=occurrence.tenant_id,
            lane=occurrence.lane,
            available_at=available_at,
            priority=occurrence.priority,
        )


@dataclass(frozen=True)
class Envelope:
    tenant_id: int
    queue: str
    available_at: datetime
    priority: int
    fires: tuple[Fire, ...]

    def body(self) -> bytes:
        """The message body the relay will send untouched."""
        return encode_body(self.tenant_id, self.queue, ((f.occurrence_id, f.scheduled_for) for f in self.fires))

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


def enqueue(cursor, fires: list[Fire], size: int | None = None) -> int:
    """Pack fires into envelopes and insert them into the outbox, in the caller's transaction; returns envelopes."""
    envelopes = pack(fires, size)
    if envelopes:
        copy_rows(
            cursor,
            outbox_sql.COPY_OUTBOX,
            outbox_sql.COPY_OUTBOX_TYPES,
            (
                (e.tenant_id, e.queue, e.available_at, e.priority, e.occurrence_ids, e.scheduled_fors, e.body())
                for e in envelopes
            ),
        )
    return len(envelopes)
