"""The business effect of the crash matrix and the soak: one row per occurrence_id, however often it runs.

The handler upserts its effect keyed by the occurrence's idempotency key, as a real idempotent target would, and
counts its runs, so at-least-once delivery shows as re-runs while the effect itself stays single.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection

from dispatch.handlers import handler

EFFECT_HANDLER = "bench_effect"


def ensure_effects_table() -> None:
    """Create the effects table if needed, and empty it (committed: the workers write into it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_effects (occurrence_id uuid PRIMARY KEY, runs int NOT NULL,"
            " first_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        cursor.execute("TRUNCATE bench_effects")


def effects() -> dict[uuid.UUID, int]:
    """Every recorded effect: occurrence_id -> how many times the handler ran for it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT occurrence_id, runs FROM bench_effects")
        return dict(cursor.fetchall())


@handler(EFFECT_HANDLER)
def bench_effect(context: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_effects (occurrence_id, runs) VALUES (%s, 1)"
            " ON CONFLICT (occurrence_id) DO UPDATE SET runs = bench_effects.runs + 1",
            [context.occurrence_id],
        )
