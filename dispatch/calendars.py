"""The calendars of a materializer batch: what the `exclude_calendars` of its due schedules exclude, as the calendars
are now (a calendar change applies to the fires not yet materialized)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from core.exclusions import Exclusions
from dispatch.sql import materialize as materialize_sql

# (calendar id, revision) -> its parsed content. A revision's content never changes and an id is never reused (a
# calendar deleted and created again under its name is a new id), so the entries stay right; the bound only keeps a
# long-lived process from holding every calendar that ever changed.
_PARSED: dict[tuple[int, int], Exclusions] = {}
_PARSED_BOUND = 2000
# The same, merged per combination of calendars a schedule names.
_MERGED: dict[tuple[tuple[int, int], ...], Exclusions] = {}
# The materializer's batch threads share both.
_LOCK = threading.Lock()


def stored_exclusions(dates: str, ranges: str) -> Exclusions:
    """A calendar's content from its stored columns, read as JSON text (the SQL casts them: the connections of
    Django and of the engine decode jsonb differently)."""
    return Exclusions.stored(json.loads(dates), json.loads(ranges))


# (tenant_id, names) as a batch's rows give them.
Named = tuple[int, tuple[str, ...]]


def batch_exclusions(cursor: Any, named: Iterable[Named]) -> dict[Named, Exclusions]:
    """For each (tenant_id, names) the merged Exclusions of those calendars of the tenant (a name without a calendar
    excludes nothing: one in use cannot be deleted). One small query, two when a calendar changed since it was
    last read; none when no schedule names one. Safe across the materializer's batch threads: the caches are read
    and written under one lock, never while a query runs."""
    wanted = set(named)
    if not wanted:
        return {}
    pairs = sorted({(tenant_id, name) for tenant_id, names in wanted for name in names})
    named_pairs = {"tenant_ids": [pair[0] for pair in pairs], "names": [pair[1] for pair in pairs]}
    cursor.execute(materialize_sql.CALENDAR_REVISIONS, named_pairs)
    current = {(tenant_id, name): (id_, revision) for tenant_id, name, id_, revision in cursor.fetchall()}
    read: dict[tuple[int, int], Exclusions] = {}
    for _ in range(3):
        with _LOCK:
            missing = any(key not in _PARSED and key not in read for key in current.values())
        if missing:
            cursor.execute(materialize_sql.CALENDAR_CONTENTS, named_pairs)
            # The fresher answer: a calendar deleted since the first read is left out, as if gone before the batch.
            current = {}
            for tenant_id, name, id_, revision, dates, ranges in cursor.fetchall():
                read[(id_, revision)] = stored_exclusions(dates, ranges)
                current[(tenant_id, name)] = (id_, revision)
        with _LOCK:
            if len(_PARSED) + len(read) > _PARSED_BOUND:
                _PARSED.clear()
                _MERGED.clear()
            _PARSED.update(read)
            merged = _merge(wanted, current)
        if merged is not None:
            return merged
    raise RuntimeError("the calendars of a batch changed under three reads in a row")


def _merge(wanted: set[Named], current: dict[tuple[int, str], tuple[int, int]]) -> dict[Named, Exclusions] | None:
    """Each combination's merged Exclusions from the parsed contents (the lock held); None when one of the current
    contents is not parsed (another thread cleared the cache meanwhile: read again)."""
    merged: dict[Named, Exclusions] = {}
    for tenant_id, names in wanted:
        keys = tuple(current[(tenant_id, name)] for name in names if (tenant_id, name) in current)
        # One object per combination across batches: the walks and rules that share it compare it by identity.
        combined = _MERGED.get(keys)
        if combined is None:
            if any(key not in _PARSED for key in keys):
                return None
            combined = _MERGED[keys] = Exclusions.merged(_PARSED[key] for key in keys)
        merged[(tenant_id, names)] = combined
    return merged
