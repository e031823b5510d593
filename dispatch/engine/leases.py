"""Occurrence leases: one renewal thread per worker process (LeaseRenewer) and the reaper of expired leases.

A claim holds its occurrence for SCHEDULER_WORKER_LEASE_SECONDS; the renewer extends every lease the process
holds in one statement every third of that, and raises a handler's cancel event when its lease is lost, its
schedule was canceled or changed version, or its deadline passed (cooperative cancellation: the handler checks the
event and stops; docs/ARCHITECTURE.md rule 5). A handler that ignores that event does not hold its occurrence
forever: past SCHEDULER_LEASE_MAX_LIFETIME_SECONDS the renewer stops renewing it, the lease runs out, and the reaper
or the next claim fences the attempt. Leases of dead workers
(SIGKILL, OOM, lost network) expire, and the reaper returns those occurrences for another attempt; its pass also
drops the heartbeat rows of processes long gone and retry-budget minutes long past.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from core.clock import DB_NOW
from dispatch import counters
from dispatch.engine.outcomes import CancelReason
from dispatch.models import OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.quotas import release_running_slots
from dispatch.sql import claims as claim_sql
from dispatch.sql import leases as lease_sql
from dispatch.sql import quotas as quota_sql

logger = logging.getLogger(__name__)

# How often the renewal thread wakes to see whether a round is due (rounds run every lease/3).
RENEWER_NAP_SECONDS = 0.25
# A process heartbeat counts as live for two shard leases (the materializer's LIVE_PROCESSES); a row that has not
# been written for ten of those lifetimes belongs to a process that is gone (names carry host, pid and a random
# suffix: dispatch/engine/loop.py), and nothing else would ever delete it.
HEARTBEAT_TTL_LEASES = 2
HEARTBEAT_PRUNE_TTLS = 10
# Retry-budget minutes are kept this long after they passed, for an operator to look at; none is taken any more.
RETRY_WINDOWS_KEPT_SECONDS = 3600


class Leased(Protocol):
    """What the renewer needs of a claim (dispatch.engine.claims.Claim): which attempt holds which occurrence."""

    @property
    def occurrence_id(self) -> uuid.UUID: ...
    @property
    def scheduled_for(self) -> datetime: ...
    @property
    def generation(self) -> int: ...
    @property
    def attempt_id(self) -> int: ...


# --- renewal ----------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Ticket:
    """One running handler the renewer looks after; `reason` is why its cancel event was raised, if it was."""

    claim: Leased
    cancel_event: threading.Event
    deadline: float
    reason: str | None = None
    # Monotonic instant after which the lease is no longer renewed, whatever the handler does.
    renew_until: float = math.inf

    def signal(self, reason: CancelReason) -> None:
        if self.reason is None:
            self.reason = reason
            counters.WORKER_CANCEL_SIGNALS.labels(reason).inc()
            logger.warning(
                "cancelling handler of occurrence %s generation %d: %s",
                self.claim.occurrence_id,
                self.claim.generation,
                reason,
                extra={"action": "cancel_signal", "reason": reason, "occurrence_id": str(self.claim.occurrence_id)},
            )
        self.cancel_event.set()


class LeaseRenewer:
    """Renews the leases of every handler the process runs, in one statement per round (every lease/3)."""

    def __init__(self) -> None:
        self._tickets: dict[int, Ticket] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, claim: Leased, cancel_event: threading.Event, deadline: float) -> Ticket:
        return self.register_many([(claim, cancel_event)], deadline)[0]

    def register_many(self, entries: list[tuple[Leased, threading.Event]], deadline: float) -> list[Ticket]:
        """Look after the leases of several running handlers (an envelope's), under one lock acquisition."""
        renew_until = time.monotonic() + settings.SCHEDULER_LEASE_MAX_LIFETIME_SECONDS
        tickets = [Ticket(claim, event, deadline, renew_until=renew_until) for claim, event in entries]
        with self._lock:
            for ticket in tickets:
                self._tickets[ticket.claim.attempt_id] = ticket
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self._thread.start()
        return tickets

    def unregister(self, ticket: Ticket) -> None:
        self.unregister_many([ticket])

    def unregister_many(self, tickets: list[Ticket]) -> None:
        with self._lock:
            for ticket in tickets:
                self._tickets.pop(ticket.claim.attempt_id, None)

    def renew_once(self) -> int:
        """One round; returns how many leases were renewed."""
        with self._lock:
            tickets = list(self._tickets.values())
        if not tickets:
            return 0
        now = time.monotonic()
        for ticket in tickets:
            if now >= ticket.deadline:
                ticket.signal(CancelReason.DEADLINE)
            if now >= ticket.renew_until:
                # The handler outlived its deadline and kept running despite the cancel event: let the lease run
                # out, so the occurrence is fenced and goes on without this attempt.
                ticket.signal(CancelReason.LEASE_MAX_LIFETIME)
        tickets = [t for t in tickets if now < t.renew_until]
        if not tickets:
            return 0
        claims = [t.claim for t in tickets]
        with connection.cursor() as cursor:
            cursor.execute(
                lease_sql.RENEW_OCCURRENCE_LEASES,
                {
                    "occurrence_ids": [c.occurrence_id for c in claims],
                    "scheduled_fors": [c.scheduled_for for c in claims],
                    "generations": [c.generation for c in claims],
                    "attempt_ids": [c.attempt_id for c in claims],
                    "held_states": [OccurrenceState.RUNNING.value] * len(claims),
                    "lease": settings.SCHEDULER_WORKER_LEASE_SECONDS,
                },
            )
            renewed = {(occurrence_id, generation): current for occurrence_id, generation, current in cursor.fetchall()}
        with self._lock:
            # A handler that finished while the round ran was completed and unregistered: its row is no longer
            # running, which is no lost lease.
            still_running = [t for t in tickets if self._tickets.get(t.claim.attempt_id) is t]
        for ticket in still_running:
            current = renewed.get((ticket.claim.occurrence_id, ticket.claim.generation))
            if current is None:
                ticket.signal(CancelReason.LEASE_LOST)
            elif not current:
                ticket.signal(CancelReason.SCHEDULE_CHANGED)
        return len(renewed)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def _run(self) -> None:
        last = time.monotonic()
        try:
            # Short naps, so a changed lease length (settings, tests) takes effect at once, not after a long wait.
            while not self._stop.wait(RENEWER_NAP_SECONDS):
                if time.monotonic() - last < settings.SCHEDULER_WORKER_LEASE_SECONDS / 3:
                    continue
                last = time.monotonic()
                try:
                    close_old_connections()
                    self.renew_once()
                except Exception:
                    # A database hiccup: the next round retries; a lease that expires meanwhile is fenced.
                    logger.exception("lease renewal failed", extra={"action": "heartbeat_error"})
                    connection.close()
        finally:
            connection.close()


_renewer: LeaseRenewer | None = None
_renewer_pid: int | None = None
_renewer_lock = threading.Lock()


def lease_renewer() -> LeaseRenewer:
    """This process's renewer (a forked child gets its own: threads do not survive fork)."""
    global _renewer, _renewer_pid
    with _renewer_lock:
        if _renewer is None or _renewer_pid != os.getpid():
            _renewer, _renewer_pid = LeaseRenewer(), os.getpid()
        return _renewer


def stop_lease_renewer() -> None:
    global _renewer
    with _renewer_lock:
        renewer, _renewer = _renewer, None
    if renewer is not None and _renewer_pid == os.getpid():
        renewer.stop()


# --- reaper -----------------------------------------------------------------------------------------------------


def reap_expired_leases(now: datetime | None = None, limit: int = 1000) -> int:
    """Return occurrences whose worker died to retry_wait (with a new envelope), dead or canceled, with the reason;
    one batch, SKIP LOCKED. The same pass drops heartbeat rows of dead processes and retry-budget minutes long past.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        if now is None:
            cursor.execute(DB_NOW)
            now = cursor.fetchone()[0]
        cursor.execute(
            lease_sql.REAP_EXPIRED_LEASES,
            {"now": now, "limit": limit, "deadline": settings.SCHEDULER_OCCURRENCE_DEADLINE_SECONDS},
        )
        rows = cursor.fetchall()
        fires = [
            Fire.for_lane(
                occurrence_id, scheduled_for, tenant_id=tenant_id, lane=lane, available_at=now, priority=priority
            )
            for occurrence_id, scheduled_for, tenant_id, lane, priority, state, _, _ in rows
            if state == OccurrenceState.RETRY_WAIT
        ]
        enqueue(cursor, fires)
        # Upkeep on PostgreSQL's clock, not a driven `now`: a test's future instant would delete live rows.
        heartbeat_ttl = HEARTBEAT_TTL_LEASES * settings.SCHEDULER_LEASE_SECONDS
        cursor.execute(lease_sql.PRUNE_PROCESS_HEARTBEATS, {"older_than": HEARTBEAT_PRUNE_TTLS * heartbeat_ttl})
        pruned = cursor.rowcount
        cursor.execute(claim_sql.PRUNE_RETRY_WINDOWS, {"keep": RETRY_WINDOWS_KEPT_SECONDS})
        cursor.execute(quota_sql.PRUNE_CATCHUP_WINDOWS, {"keep": RETRY_WINDOWS_KEPT_SECONDS})
        # Last statement: the reaped occurrences' running slots go back (see dispatch/sql/quotas.py).
        release_running_slots(cursor, [row[2] for row in rows])
    if pruned > 0:
        logger.info("pruned %d heartbeats of dead processes", pruned, extra={"action": "prune_heartbeats"})
    for occurrence_id, _, _, _, _, state, generation, reason in rows:
        counters.WORKER_REAPED.labels(state).inc()
        logger.warning(
            "lease of occurrence %s generation %d expired: now %s%s",
            occurrence_id,
            generation,
            state,
            f" ({reason})" if reason else "",
            extra={"action": "reap_lease", "occurrence_id": str(occurrence_id)},
        )
    return len(rows)
