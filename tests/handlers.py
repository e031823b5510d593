"""Handlers for the worker tests, registered on import (the worker subprocess loads them through
SCHEDULER_HANDLER_MODULES=tests.handlers), and the raw `test_effects` table they write.

`test_effects` has one row per occurrence_id (the business effect, deduplicated on the idempotency key) and a
counter `n` of executions: at-least-once delivery may run a handler twice, but must leave one row.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from django.db import connection

from dispatch.errors import CanceledError, PermanentError, TransientError
from dispatch.handlers import handler

# The context of every call made in this process, in order (a worker subprocess has its own list).
CALLS: list[Any] = []
_calls_lock = threading.Lock()


def ensure_effects_table() -> None:
    """Create the table if needed and empty it; committed, so a worker subprocess writes into the same table."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS test_effects (occurrence_id uuid PRIMARY KEY, n int NOT NULL)")
        cursor.execute("TRUNCATE test_effects")


def record_effect(occurrence_id: uuid.UUID) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO test_effects (occurrence_id, n) VALUES (%s, 1) "
            "ON CONFLICT (occurrence_id) DO UPDATE SET n = test_effects.n + 1",
            [occurrence_id],
        )


def effects() -> dict[uuid.UUID, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT occurrence_id, n FROM test_effects")
        return dict(cursor.fetchall())


def _called(context: Any) -> None:
    with _calls_lock:
        CALLS.append(context)


@handler("effect")
def effect(context: Any) -> None:
    """The business effect, keyed by the occurrence's idempotency key."""
    _called(context)
    record_effect(context.occurrence_id)


@handler("sleep")
def sleep(context: Any) -> None:
    """Sleeps payload["seconds"], stopping early (CanceledError) when cancelled; then the effect if asked to."""
    _called(context)
    until = time.monotonic() + float(context.payload.get("seconds", 1))
    while (left := until - time.monotonic()) > 0:
        if context.cancel_event.wait(min(left, 0.05)):
            raise CanceledError("sleep interrupted by the cancel event")
    if context.payload.get("effect"):
        record_effect(context.occurrence_id)


@handler("fail_transient")
def fail_transient(context: Any) -> None:
    _called(context)
    raise TransientError(f"attempt {context.attempt} fails on purpose")


@handler("fail_permanent")
def fail_permanent(context: Any) -> None:
    _called(context)
    raise PermanentError("this input can never succeed")


@handler("fail_then_succeed")
def fail_then_succeed(context: Any) -> None:
    """Fails the first payload["failures"] attempts (default 1) with a transient error, then has its effect."""
    _called(context)
    if context.attempt <= int(context.payload.get("failures", 1)):
        raise TransientError(f"attempt {context.attempt} fails on purpose")
    record_effect(context.occurrence_id)


@handler("crash")
def crash(context: Any) -> None:
    """An unexpected exception (a bug in a handler): treated as transient."""
    _called(context)
    raise ZeroDivisionError("a bug")


def ensure_windows_table() -> None:
    """`test_windows`: when each run of the `timed` handler began and ended, on PostgreSQL's clock (committed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS test_windows (occurrence_id uuid, began timestamptz, ended timestamptz)"
        )
        cursor.execute("TRUNCATE test_windows")


def peak_concurrency() -> int:
    """The most `timed` runs that were inside their handler at one instant."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT began, ended FROM test_windows WHERE ended IS NOT NULL")
        rows = cursor.fetchall()
    running, peak = 0, 0
    for _, step in sorted([(began, 1) for began, _ in rows] + [(ended, -1) for _, ended in rows]):
        running += step
        peak = max(peak, running)
    return peak


@handler("timed")
def timed(context: Any) -> None:
    """Sleeps payload["seconds"] between two clock readings written to test_windows (its own transaction each)."""
    _called(context)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO test_windows (occurrence_id, began) VALUES (%s, clock_timestamp())", [context.occurrence_id]
        )
    time.sleep(float(context.payload.get("seconds", 0.2)))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE test_windows SET ended = clock_timestamp() WHERE occurrence_id = %s AND ended IS NULL",
            [context.occurrence_id],
        )
