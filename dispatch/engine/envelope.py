"""The worker's hot path: an envelope's occurrences through claim, run and completion, in batches.

An occurrence used to cost about fourteen round trips to PostgreSQL of its own (its claim transaction, a pre-check,
its completion transaction, a `SET search_path` for each new cursor, a connection health check), on a thread of its
own: 323 occurrences a second on two cores. Here an envelope of a hundred costs about a dozen:
1. `claim_many` claims what it can in one transaction. What needs another lock order (overlap policies other than
   allow) or another transaction's row goes the one-by-one way (`process_occurrence`) on the pool, as before.
2. One pre-check for all the claims right before their handlers start (ARCHITECTURE rule 5). A handler that starts
   more than PRECHECK_FRESH_SECONDS after it (the pool was busy with slow handlers) re-checks alone.
3. The handlers run on the process's pool, at most SCHEDULER_WORKER_THREADS at a time; each pool thread takes the
   envelope's next claim until none is left, so a thread is handed work once per envelope, not once per occurrence.
   The renewer looks after every claim's lease from the start, registered at once.
4. Results are completed in batches as they come (`complete_many`): whatever finished within COMPLETE_BATCH_SECONDS
   of the first result shares one transaction, and a slow handler never holds back the others' completion.
Fencing, attempts, the overlap and misfire rules and heartbeats are the one-by-one path's, applied to many rows.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, deque
from datetime import datetime
from functools import partial
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connection, connections

from dispatch.engine import worker
from dispatch.engine.claims import Claim, claim_many
from dispatch.engine.faults import crash_point
from dispatch.engine.leases import Ticket, lease_renewer
from dispatch.engine.retry import RunResult
from dispatch.engine.timer import PriorityTimer, TimerClosed

logger = logging.getLogger(__name__)

# How old the envelope's pre-check may be when a handler starts; older, the handler re-checks alone (rule 5).
PRECHECK_FRESH_SECONDS = 0.5
# How long the first finished result of a batch waits for others to share its completion transaction.
COMPLETE_BATCH_SECONDS = 0.05
# A result that is no outcome of the handler: the occurrence stays running under its lease (left to expire, then
# retried by the reaper) and the envelope goes back to the broker.
NOT_RUN = RunResult("not_run")
FAILED_TO_RUN = RunResult("error")


class _Claimed:
    """One envelope's claims in flight: those not started yet, and the results not completed yet."""

    def __init__(self, claims: list[tuple[Claim, Ticket]], prechecked_at: float) -> None:
        self.todo = deque(claims)
        self.results: list[tuple[Claim, RunResult, Ticket | None]] = []
        self.first_result_at: float | None = None
        self.prechecked_at = prechecked_at
        self.cond = threading.Condition()

    def take(self) -> tuple[Claim, Ticket] | None:
        with self.cond:
            return self.todo.popleft() if self.todo else None

    def put(self, claim: Claim, result: RunResult, ticket: Ticket | None) -> None:
        with self.cond:
            if self.first_result_at is None:
                self.first_result_at = time.monotonic()
            self.results.append((claim, result, ticket))
            self.cond.notify_all()


class _Alone:
    """The occurrences of an envelope decided one by one, in flight on the pool; the task waits for all of them."""

    def __init__(self, task_ids: list[tuple[str, int]]) -> None:
        self.pending = set(task_ids)
        self.outcomes: Counter[str] = Counter()
        self.cond = threading.Condition()

    def done(self, task_id: tuple[str, int], outcome: str) -> None:
        with self.cond:
            if task_id in self.pending:
                self.pending.discard(task_id)
                self.outcomes[outcome] += 1
                self.cond.notify_all()


class EnvelopeRunner:
    """A process-wide pool (seed 004's PriorityTimer): its threads, and the database connection each keeps, serve
    every envelope of the process instead of being created per envelope."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.timer = PriorityTimer(workers=workers)
        self.timer.start()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def run(self, pairs: list[tuple[uuid.UUID, datetime]], worker_name: str) -> Counter[str]:
        """Run an envelope's occurrences; returns the outcome counts (db_error and not_run: hand it back)."""
        outcomes: Counter[str] = Counter()
        token = uuid.uuid4().hex  # pool task ids unique per delivery: a duplicate envelope must not replace ours
        try:
            batch = claim_many(pairs, worker_name)
        except DatabaseError:
            logger.exception("database error claiming an envelope", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes["db_error"] += len(pairs)
            return outcomes
        if batch.drops:
            outcomes["dropped"] += len(batch.drops)
        alone = self._start_alone(token, batch.alone, worker_name)
        if batch.claims:
            crash_point("worker.after_claim")
            outcomes.update(self._run_claims(token, batch.claims))
        outcomes.update(self._wait_alone(alone))
        return outcomes

    # --- the batched path ----------------------------------------------------------------------------------------

    def _run_claims(self, token: str, claims: list[Claim]) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        try:
            verdicts = worker.precheck_many(claims)
        except DatabaseError:
            logger.exception("database error before the handlers ran", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes["db_error"] += len(claims)
            return outcomes
        runnable = [c for c in claims if c.occurrence_id not in verdicts]
        tickets = lease_renewer().register_many(
            [(claim, threading.Event()) for claim in runnable], worker.handler_deadline()
        )
        claimed = _Claimed(list(zip(runnable, tickets, strict=True)), prechecked_at=time.monotonic())
        for claim in claims:
            if claim.occurrence_id in verdicts:
                claimed.put(claim, verdicts[claim.occurrence_id], None)
        drains = []
        for n in range(min(self.workers, len(runnable))):
            task_id = (token, -1 - n)
            try:
                self.timer.schedule(task_id, time.monotonic(), 0, partial(self._drain, claimed))
            except TimerClosed:
                break
            drains.append(task_id)
        left = len(claims)
        while left:
            results = self._next_results(claimed, drains)
            if results is None:  # the pool closed before it started them: leases expire, the reaper retries them
                not_started = [entry for entry in claimed.todo]
                claimed.todo.clear()
                lease_renewer().unregister_many([ticket for _, ticket in not_started])
                outcomes["not_run"] += len(not_started)
                left -= len(not_started)
                continue
            left -= len(results)
            outcomes.update(self._complete(results))
        return outcomes

    def _next_results(
        self, claimed: _Claimed, drains: list[tuple[str, int]]
    ) -> list[tuple[Claim, RunResult, Ticket | None]] | None:
        """The results to complete together: everything finished within COMPLETE_BATCH_SECONDS of the first one (or
        at once when nothing else runs). None when claims are left that no pool thread will start."""
        with claimed.cond:
            while True:
                if claimed.results:
                    assert claimed.first_result_at is not None
                    waited = time.monotonic() - claimed.first_result_at
                    idle = not claimed.todo and self._drains_finished(drains)
                    if waited >= COMPLETE_BATCH_SECONDS or idle:
                        results, claimed.results, claimed.first_result_at = claimed.results, [], None
                        return results
                    claimed.cond.wait(COMPLETE_BATCH_SECONDS - waited)
                    continue
                if claimed.todo and self._drains_finished(drains):
                    return None
                claimed.cond.wait(0.25)

    def _drains_finished(self, drains: list[tuple[str, int]]) -> bool:
        return all(self.timer.state(task_id) in ("completed", "failed", "cancelled", None) for task_id in drains)

    def _drain(self, claimed: _Claimed, _pool_cancel: threading.Event) -> None:
        """A pool thread's share of the envelope: the next claim's handler until none is left."""
        close_old_connections()
        self._remember_connection()
        while (entry := claimed.take()) is not None:
            claim, ticket = entry
            try:
                verdict = None
                if time.monotonic() - claimed.prechecked_at > PRECHECK_FRESH_SECONDS:
                    verdict = worker.precheck(claim)
                result = verdict or worker.run_handler(claim, ticket.cancel_event, ticket)
            except DatabaseError:
                logger.exception(
                    "database error before the handler of occurrence %s",
                    claim.occurrence_id,
                    extra={"action": "occurrence_db_error", "occurrence_id": str(claim.occurrence_id)},
                )
                connection.close()
                result = NOT_RUN
            except Exception:
                # A bug, not an outage: the occurrence keeps its lease until it expires; the reaper retries it.
                logger.exception(
                    "error running occurrence %s",
                    claim.occurrence_id,
                    extra={"action": "occurrence_error", "occurrence_id": str(claim.occurrence_id)},
                )
                result = FAILED_TO_RUN
            claimed.put(claim, result, ticket)

    def _complete(self, results: list[tuple[Claim, RunResult, Ticket | None]]) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        tickets = [ticket for _, _, ticket in results if ticket is not None]
        finished = [(claim, result) for claim, result, _ in results if result not in (NOT_RUN, FAILED_TO_RUN)]
        for _, result, _ in results:
            if result is NOT_RUN:
                outcomes["db_error"] += 1
            elif result is FAILED_TO_RUN:
                outcomes["error"] += 1
        # These handlers are done: their leases need no renewal for the moment it takes to complete them (and one
        # left uncompleted expires and is retried by the reaper). Unregistered first, so a renewal round running
        # meanwhile does not take a completed row for a lost lease.
        lease_renewer().unregister_many(tickets)
        try:
            if finished:
                crash_point("worker.after_effect")
                outcomes.update(worker.complete_many(finished).values())
        except DatabaseError:
            logger.exception("database error completing an envelope", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes["db_error"] += len(finished)
        return outcomes

    # --- one by one ----------------------------------------------------------------------------------------------

    def _start_alone(self, token: str, pairs: list[tuple[uuid.UUID, datetime]], worker_name: str) -> _Alone:
        alone = _Alone([(token, index) for index in range(len(pairs))])
        for index, (occurrence_id, scheduled_for) in enumerate(pairs):
            task_id = (token, index)
            run = partial(self._run_one, alone, task_id, occurrence_id, scheduled_for, worker_name)
            try:
                # Due now; equal times run in envelope order (the timer's submission sequence).
                self.timer.schedule(task_id, time.monotonic(), 0, run)
            except TimerClosed:
                alone.done(task_id, "not_run")
        return alone

    def _wait_alone(self, alone: _Alone) -> Counter[str]:
        with alone.cond:
            while alone.pending:
                if not alone.cond.wait(timeout=1.0):
                    # A closing timer cancels what it has not started; those will never report back.
                    for task_id in list(alone.pending):
                        if self.timer.state(task_id) == "cancelled":
                            alone.pending.discard(task_id)
                            alone.outcomes["not_run"] += 1
        return alone.outcomes

    def _run_one(
        self,
        alone: _Alone,
        task_id: tuple[str, int],
        occurrence_id: uuid.UUID,
        scheduled_for: datetime,
        worker_name: str,
        cancel_event: threading.Event,
    ) -> None:
        outcome = "error"
        try:
            close_old_connections()
            self._remember_connection()
            outcome = worker.process_occurrence(occurrence_id, scheduled_for, worker_name, cancel_event)
        except DatabaseError:
            logger.exception(
                "database error processing occurrence %s",
                occurrence_id,
                extra={"action": "occurrence_db_error", "occurrence_id": str(occurrence_id)},
            )
            outcome = "db_error"
            connection.close()
        except Exception:
            # A bug, not an outage: redelivering would fail the same way; the reconciler reports the occurrence.
            logger.exception(
                "error processing occurrence %s",
                occurrence_id,
                extra={"action": "occurrence_error", "occurrence_id": str(occurrence_id)},
            )
        finally:
            alone.done(task_id, outcome)

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def _remember_connection(self) -> None:
        own = connections[DEFAULT_DB_ALIAS]  # this thread's wrapper (django.db.connection is a per-thread proxy)
        with self._lock:
            if own not in self._connections:
                # Closed by the thread that shuts the runner down, once the timer threads are gone.
                own.inc_thread_sharing()
                self._connections.append(own)

    def close(self) -> None:
        self.timer.close(wait=True)
        with self._lock:
            opened, self._connections = self._connections, []
        for conn in opened:
            conn.close()
            conn.dec_thread_sharing()
