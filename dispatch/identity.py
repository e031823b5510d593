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
# The version and variant bits of a name-based (SHA-1) UUID, as uuid.UUID(version=5) sets them (RFC 4122 4.3).
_KEEP_BITS = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_VERSION_5_BITS = (5 << 76) | (0x8000 << 48)


def occurrence_id_for(schedule_id: uuid.UUID, version: int, scheduled_for: datetime) -> uuid.UUID:
    """uuid5(OCCURRENCE_NAMESPACE, "{schedule_id}/{version}/{instant}"): the id of a fire."""
    return occurrence_id_of(name_prefix(str(schedule_id)), name_suffix(version, scheduled_for))


# The name hashed is "{schedule_id}/{version}/{instant}" after the namespace's bytes, in two parts: a burst names one
# fire of each of 500,000 schedules, and those fires share a handful of (version, instant) suffixes, so the
# materializer makes each suffix once per batch and the schedule's part from the id's text as PostgreSQL sent it.
# Spelled out rather than uuid.uuid5, which rebuilt the namespace's bytes, formatted both parts and validated its
# arguments on every call: a fifth of the materializer's Python time (py-spy, 500,000 fires). The same value, bit for
# bit (tests/unit/test_identity.py compares them).
def name_prefix(schedule_text: str) -> bytes:
    """The namespace's bytes and the schedule's id in its canonical text (lowercase, with hyphens)."""
    return _NAMESPACE_BYTES + schedule_text.encode()


def name_suffix(version: int, scheduled_for: datetime) -> bytes:
    return f"/{version}/{utc_key(scheduled_for)}".encode()


def occurrence_id_of(prefix: bytes, suffix: bytes) -> uuid.UUID:
    digest = hashlib.sha1(prefix + suffix, usedforsecurity=False).digest()
    return _uuid_of_int((int.from_bytes(digest[:16]) & _KEEP_BITS) | _VERSION_5_BITS)


def _uuid_of_int(value: int) -> uuid.UUID:
    """A UUID of a 128-bit value already carrying its version bits, without uuid.UUID.__init__'s argument checks:
    what __init__ itself stores (its two slots), set the way it sets them."""
    made = object.__new__(uuid.UUID)
    object.__setattr__(made, "int", value)
    object.__setattr__(made, "is_safe", uuid.SafeUUID.unknown)
    return made


def manual_occurrence_id_for(schedule_id: uuid.UUID, trigger_key: str) -> uuid.UUID:
    """A manual fire's id: derived from the caller's Idempotency-Key, or from the trigger instant without one.

    No version in it: the same key on the same schedule is the same business request after any PATCH, pause or
    resume, so it must meet the same occurrence (one effect), not mint a new one.
    """
    return uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}/manual/{trigger_key}")
