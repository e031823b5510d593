"""Notifications: a tenant is told when a fire did not run (docs/API.md, "Notifications").

Events are written where they happen: `dead`, `missed` and `skipped_overlap` by the occurrence table's row
triggers as an occurrence reaches that state (dispatch migration 0020), `stuck` by `record_stuck` from the stuck
search; each once per (event, occurrence), for a tenant whose NotificationTarget names the event. Workers send
them: every worker process runs a NotificationSender thread, and SKIP LOCKED lets them share the table.

At least once: a notification is taken under a lease (its next_attempt_at moves ahead), POSTed signed like a
webhook (its `webhook-id` is `<event>-<occurrence_id>`, the same on every try: receivers deduplicate on it), and
marked delivered after a 2xx; a record is kept only while the taker's lease holds (a lease uuid on the row), and a
round stops calling once half its lease is spent, so no row is taken by two senders at once. A round takes at most
PER_TENANT rows of one tenant. A failure backs off (and holds back that tenant's other notifications of the round:
a target that is down is not called once per row); a 4xx other than 408/429, a target removed, or a day of
failures since the first call gives up, recorded on the row and shown by GET /api/v1/notifications/.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from core.clock import db_now
from dispatch.errors import CanceledError, PermanentError, TransientError
from dispatch.handlers.webhook import signed_call
from dispatch.identity import utc_key
from dispatch.sql import notifications as sql
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS, stuck_pages

logger = logging.getLogger(__name__)

SEND_BATCH = 100
PER_TENANT = 10
SCAN = 1000
LEASE_SECONDS = 120
# A round stops taking calls once this much of its lease is spent: what it did not try goes back, due at once.
ROUND_SECONDS = LEASE_SECONDS / 2
CALL_TIMEOUT_SECONDS = 5.0
# Given up after failing for this long since its first call (never before a call was made).
GIVE_UP_AFTER = timedelta(hours=24)
BACKOFF_BASE_SECONDS = 10
BACKOFF_CAP_SECONDS = 3600
# How often the stuck search runs (by one sender at a time), and how far back by scheduled_for: an occurrence
# scheduled in the last two hours and stuck is seen within STUCK_EVERY_SECONDS of becoming so.
STUCK_EVERY_SECONDS = 300.0
STUCK_LOOKBACK = timedelta(hours=2)
POLL_SECONDS = 1.0
FORGET_EVERY_SECONDS = 3600.0


@dataclass(frozen=True)
class Due:
    id: int
    tenant_id: int
    event: str
    occurrence_id: Any
    scheduled_for: datetime
    schedule_id: Any
    state: str
    state_reason: str
    attempts: int
    first_tried_at: datetime
    url: str | None
    last_error: str | None

    @property
    def message_id(self) -> str:
        return f"{self.event}-{self.occurrence_id}"

    def body(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "occurrence_id": str(self.occurrence_id),
            "schedule_id": str(self.schedule_id),
            "state": self.state,
            "state_reason": self.state_reason,
            "scheduled_for": utc_key(self.scheduled_for),
            "error": self.last_error or "",
        }


@dataclass
class Round:
    taken: int = 0
    delivered: int = 0
    retried: int = 0
    given_up: int = 0


def backoff_seconds(attempts: int) -> int:
    return min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** max(0, attempts - 1))


def record_stuck(now: datetime) -> int:
    """Write a `stuck` notification for each stuck occurrence of a subscribed tenant (each once, ever). One sender
    at a time searches (the others find the lock taken and skip); -1 when this one skipped."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.STUCK_SEARCH_LOCK)
        if not cursor.fetchone()[0]:
            return -1
        return _record_stuck(now)


def _record_stuck(now: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql.STUCK_SUBSCRIBERS)
        tenants = [row[0] for row in cursor.fetchall()]
    if not tenants:
        return 0
    written = 0
    for page in stuck_pages(
        since=now - STUCK_LOOKBACK,
        until=now,
        now=now,
        stuck_after_seconds=DEFAULT_STUCK_AFTER_SECONDS,
        tenant_ids=tenants,
    ):
        with connection.cursor() as cursor:
            cursor.execute(
                sql.RECORD_STUCK,
                {
                    "tenant_ids": [s.tenant_id for s in page],
                    "events": ["stuck"] * len(page),
                    "occurrence_ids": [s.occurrence_id for s in page],
                    "scheduled_fors": [s.scheduled_for for s in page],
                    "schedule_ids": [s.schedule_id for s in page],
                    "states": [s.state for s in page],
                    "reasons": [f"still {s.state} {s.stuck_for_seconds:.0f} s past its time" for s in page],
                },
            )
            written += cursor.rowcount
    return written


def send_due(now: datetime, cancel_event: threading.Event, *, limit: int = SEND_BATCH) -> Round:
    """One round: take the due notifications, send each, record what happened (only while the lease holds)."""
    lease = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            sql.TAKE_DUE,
            {"lease": lease, "lease_seconds": LEASE_SECONDS, "limit": limit, "per_tenant": PER_TENANT, "scan": SCAN},
        )
        taken = [Due(*row) for row in cursor.fetchall()]
    by_tenant: dict[int, list[Due]] = defaultdict(list)
    for due in taken:
        by_tenant[due.tenant_id].append(due)
    done = Round(taken=len(taken))
    ends = time.monotonic() + ROUND_SECONDS
    for rows in by_tenant.values():
        if time.monotonic() >= ends:
            # Out of time: what was not tried goes back at once, for this sender's next round or another's.
            _record(sql.RETRY_LATER, rows, lease, error="", delay=0)
            continue
        _send_tenant(rows, now, lease, cancel_event, done)
    return done


def _send_tenant(rows: list[Due], now: datetime, lease: uuid.UUID, cancel_event: threading.Event, done: Round) -> None:
    for index, due in enumerate(rows):
        if due.url is None:
            _record(sql.GIVE_UP, [due], lease, error="the tenant has no notification target any more")
            done.given_up += 1
            continue
        _record(sql.TRIED, [due], lease)
        try:
            signed_call(
                tenant_id=due.tenant_id,
                message_id=due.message_id,
                url=due.url,
                method="POST",
                raw=json.dumps(due.body(), separators=(",", ":")).encode(),
                headers={"Idempotency-Key": due.message_id},
                timeout=CALL_TIMEOUT_SECONDS,
                cancel_event=cancel_event,
            )
        except PermanentError as exc:
            _record(sql.GIVE_UP, [due], lease, error=str(exc))
            done.given_up += 1
        except Exception as exc:
            # Down, slow, canceled, or anything unforeseen (a secret no key opens, the database away): this one and
            # the tenant's others of the round wait, uncalled; a day of failures since the first call gives up.
            problem = (
                f"{type(exc).__name__}: {exc}" if not isinstance(exc, TransientError | CanceledError) else str(exc)
            )
            if now - due.first_tried_at > GIVE_UP_AFTER:
                _record(sql.GIVE_UP, [due], lease, error=f"failing for over {GIVE_UP_AFTER}: {problem}")
                done.given_up += 1
                later = rows[index + 1 :]
            else:
                later = rows[index:]
            if later:
                _record(sql.RETRY_LATER, later, lease, error=problem, delay=backoff_seconds(due.attempts + 1))
                done.retried += len(later)
            return
        else:
            _record(sql.DELIVERED, [due], lease)
            done.delivered += 1


def _record(statement: str, rows: list[Due], lease: uuid.UUID, *, error: str = "", delay: int = 0) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            statement, {"ids": [due.id for due in rows], "lease": lease, "error": error[:1000], "delay": delay}
        )


@dataclass(frozen=True)
class NotificationDelivery:
    pending: int
    given_up: int
    last_error: str


def notification_delivery(tenant_id: int) -> NotificationDelivery:
    """How a tenant's notifications fare: waiting to be sent, given up, and the latest failure in words."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DELIVERY_STATE, {"tenant_id": tenant_id})
        pending, given_up, last_error = cursor.fetchone()
    return NotificationDelivery(int(pending), int(given_up), last_error or "")


def forget_old() -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql.FORGET_OLD, {"days": settings.SCHEDULER_RETENTION_DAYS})


class NotificationSender:
    """The thread of a worker process that sends notifications; it waits on the monotonic clock."""

    def __init__(self, poll_seconds: float = POLL_SECONDS) -> None:
        self.poll_seconds = poll_seconds
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notification-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        next_stuck = next_forget = time.monotonic()
        try:
            while not self.stop_event.is_set():
                try:
                    close_old_connections()
                    now = db_now()
                    if time.monotonic() >= next_stuck:
                        record_stuck(now)
                        next_stuck = time.monotonic() + STUCK_EVERY_SECONDS
                    if time.monotonic() >= next_forget:
                        forget_old()
                        next_forget = time.monotonic() + FORGET_EVERY_SECONDS
                    # A full take: more may be due, so the next round starts at once.
                    busy = send_due(now, self.stop_event).taken >= SEND_BATCH
                except Exception:
                    # The database away, say: the next round tries again; nothing is lost (rows wait in the table).
                    logger.exception("notification round failed", extra={"action": "notify"})
                    busy = False
                if not busy:
                    self.stop_event.wait(self.poll_seconds)
        finally:
            connection.close()
