"""Deterministic occurrence ids: the same fire gets the same id after every retry, failover, replay and backfill."""

from __future__ import annotations

import functools
import hashlib
import uuid
from datetime import UTC, datetime

# Fixed forever: changing it would give every future fire a new id and defeat downstream deduplication.
OCCURRENCE_NAMESPACE = uuid.UUID("6f1c2b8e-5a43-4d0e-9b7e-2c1f0a9d8e71")


@functools.lru_cache(maxsize=65536)
def utc_key(instant: datetime) -> str:
    """Canonical UTC text of an instant (microseconds kept, so distinct instants never share a key).

    Remembered: a top-of-hour burst names the same few instants for every fire (each twice: its id and its
    envelope), and formatting them was a tenth of the materializer's Python time.
    """
    if instant.tzinfo is None:
        raise ValueError("occurrence instants must be timezone-aware")
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_NAMESPACE_BYTES = OCCURRENCE_NAMESPACE.bytes


def occurrence_id_for(schedule_id: uuid.UUID, version: int, scheduled_for: datetime) -> uuid.UUID:
    """uuid5(OCCURRENCE_NAMESPACE, "{schedule_id}/{version}/{instant}"), spelled out: the materializer names every fire
    of a burst with it, and uuid.uuid5 rebuilds the namespace's bytes on each call."""
    name = f"{schedule_id}/{version}/{utc_key(scheduled_for)}".encode()
    return uuid.UUID(bytes=hashlib.sha1(_NAMESPACE_BYTES + name, usedforsecurity=False).digest()[:16], version=5)


def manual_occurrence_id_for(schedule_id: uuid.UUID, trigger_key: str) -> uuid.UUID:
    """A manual fire's id: derived from the caller's Idempotency-Key, or from the trigger instant without one.

    No version in it: the same key on the same schedule is the same business request after any PATCH, pause or
    resume, so it must meet the same occurrence (one effect), not mint a new one.
    """
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}/manual/{trigger_key}")
