"""The worker's hot path: an envelope's occurrences through claim, run and completion, in batches, within their
tenant's share of the process's pool and one turn of the process.

An occurrence used to cost about fourteen round trips to PostgreSQL of its own (its claim transaction, a pre-check,
its completion transaction, a `SET search_path` for each new cursor, a connection health check), on a thread of its
own: 323 occurrences a second on two cores. Here an envelope of a hundred costs about a dozen:
1. `claim_many` claims what it can in one transaction. A tenant whose share of this process's pool is held by slow
   handlers (dispatch/engine/pool_share.py) is not claimed here: its occurrences wait in retry_wait, attempts
   untouched, for an envelope of their own, as over max_running. What needs another lock order (overlap policies
   other than allow) or another transaction's row goes the one-by-one way (`process_occurrence`) on the pool.
2. The claim's own read of each schedule's state and version is the pre-check (docs/ARCHITECTURE.md rule 5) of the
   handlers that start within PRECHECK_FRESH_SECONDS of it: they start right after the claim commits, and a second
   read of the rows just written cost a round trip and ~10 % of the worker's database time under steady load. A
   claim that took longer is checked again for all at once; a handler that starts later (the pool was busy with
   slow handlers) re-checks alone.
3. The handlers run on the process's pool, at most the tenant's share of its threads at a time: each pool thread
   that holds one of the tenant's slots takes the envelope's next occurrence until none is left, so a thread is
   handed work once per envelope, not once per occurrence. The renewer looks after every claim's lease from the
   start, registered at once.
4. Results are completed in batches as they come (`complete_many`): whatever finished within COMPLETE_BATCH_SECONDS
   of the first result shares one transaction, and a slow handler never holds back the others' completion.
5. The envelope has its Celery process for one turn (SCHEDULER_ENVELOPE_SLICE_SECONDS). A fast envelope is done
   long before; a slow one then hands back what has not started (dispatch/engine/hand_back.py: same ids, attempts
   untouched, an envelope due at once, so it queues behind what other tenants have waiting) and leaves its running
   handlers to finish on the pool, each completing its own result, fenced as always. The task returns, and the
   process takes its next message: no envelope holds a process for longer than its turn.
Fencing, attempts, the overlap and misfire rules and heartbeats are the one-by-one path's, applied to many rows.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connection, connections

from dispatch.cancel import CancelEvent
from dispatch.engine import execution
from dispatch.engine.claim_rules import recheck_delay
from dispatch.engine.claims import Claim, claim_many, count_started
from dispatch.engine.envelope_work import DrainId, Entry, EnvelopeWork
from dispatch.engine.faults import crash_point
from dispatch.engine.hand_back import hand_back
from dispatch.engine.leases import Ticket, lease_renewer
from dispatch.engine.outcomes import DropReason, RunOutcome, Tally
from dispatch.engine.pool_share import PoolShare
from dispatch.engine.retry import RunResult
from dispatch.timer import PriorityTimer, TimerClosed

logger = logging.getLogger(__name__)

# How old the envelope's pre-check may be when a handler starts; older, the handler re-checks alone
# (docs/ARCHITECTURE.md rule 5).
PRECHECK_FRESH_SECONDS = 0.5
# How long the first finished result of a batch waits for others to share its completion transaction.
COMPLETE_BATCH_SECONDS = 0.05
# How often an envelope's task looks at its turn: whether its occurrences can get a slot of their tenant's share
# (other handlers, possibly an earlier envelope's, free them as they end), and whether it should go on without them.
POLL_SECONDS = 0.05
# A result that is no outcome of the handler: the occurrence stays running under its lease (left to expire, then
# retried by the reaper) and the envelope goes back to the broker.
NOT_RUN = RunResult(RunOutcome.NOT_RUN)
FAILED_TO_RUN = RunResult(RunOutcome.ERROR)


class EnvelopeRunner:
    """A process-wide pool (the PriorityTimer, docs/ARCHITECTURE.md "The priority timer"): its threads, and the
    database connection each keeps, serve every envelope of the process instead of being created per envelope;
    `share` splits them among tenants."""

    def __init__(self, workers: int, *, tenant_share: float | None = None) -> None:
        self.workers = workers
        self.timer = PriorityTimer(workers=workers)
        self.timer.start()
        share = settings.SCHEDULER_WORKER_TENANT_SHARE if tenant_share is None else tenant_share
        self.share = PoolShare(workers, share)
        self._drain_ids = itertools.count()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def run(
        self, pairs: list[tuple[uuid.UUID, datetime]], worker_name: str, tenant_id: int | None = None
    ) -> Counter[str]:
        """Run one envelope's occurrences for at most one turn; returns the outcome counts (db_error and not_run:
        hand the message back to the broker). `tenant_id` is the envelope's, as its body says."""
        return self.run_parts([(tenant_id, pairs)], worker_name)

    def run_parts(
        self,
        parts: list[tuple[int | None, list[tuple[uuid.UUID, datetime]]]],
        worker_name: str,
        envelopes: Mapping[uuid.UUID, int] | None = None,
    ) -> Counter[str]:
        """Run a message's occurrences for at most one turn: one envelope, or a bundle of several tenants' small
        envelopes (each part: its tenant as the body says, its occurrences), claimed in one transaction and
        completed in shared batches, each tenant within its own share of the pool. `envelopes`: the envelope (outbox
        row) each occurrence came in, where the message names them."""
        outcomes: Counter[str] = Counter()
        token = uuid.uuid4().hex  # pool task ids unique per delivery: a duplicate envelope must not replace ours
        turn = settings.SCHEDULER_ENVELOPE_SLICE_SECONDS
        pairs = [pair for _, part in parts for pair in part]
        tenant_of_pair = {pair: tenant for tenant, part in parts for pair in part}
        try:
            batch = claim_many(pairs, worker_name, blocked=lambda tenant: self.share.blocked(tenant, turn))
        except DatabaseError:
            logger.exception("database error claiming an envelope", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes[Tally.DB_ERROR] += len(pairs)
            return outcomes
        for _, drop in batch.drops:
            outcomes[Tally.PARKED if drop.reason == DropReason.POOL_SHARE else Tally.DROPPED] += 1
        if batch.claims:
            crash_point("worker.after_claim")
        if batch.claims or batch.alone:
            if len(parts) == 1:
                # One envelope: its tenant as its rows say when the claim could read one, else as its body says.
                tenant = batch.tenant_id if batch.tenant_id is not None else parts[0][0]
                alone = [(tenant, pair) for pair in batch.alone]
            else:
                alone = [(tenant_of_pair.get(pair), pair) for pair in batch.alone]
            outcomes.update(self._run(token, batch.claims, alone, worker_name, turn, envelopes, batch.checked_at))
        return outcomes

    def _run(
        self,
        token: str,
        claims: list[Claim],
        alone: list[tuple[int | None, tuple[uuid.UUID, datetime]]],
        worker_name: str,
        turn: float,
        envelopes: Mapping[uuid.UUID, int] | None = None,
        claimed_at: float = 0.0,
    ) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        verdicts: dict[uuid.UUID, RunResult] = {}
        # The claim checked the schedule's state and version as it decided (claimed_at); handlers starting within
        # PRECHECK_FRESH_SECONDS of that check need no second one, the rest re-check alone as they start. Only a
        # claim older than that by now (a slow claim transaction) is checked again here, for all at once.
        prechecked_at = claimed_at
        try:
            if time.monotonic() - claimed_at > PRECHECK_FRESH_SECONDS:
                prechecked_at = time.monotonic()
                verdicts = execution.precheck_many(claims)
        except DatabaseError:
            logger.exception("database error before the handlers ran", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes[Tally.DB_ERROR] += len(claims)
            claims = []
        runnable = [c for c in claims if c.occurrence_id not in verdicts]
        tickets = lease_renewer().register_many(
            [(claim, CancelEvent()) for claim in runnable], execution.handler_deadline()
        )
        entries = [(claim.tenant_id, Entry(claim, ticket)) for claim, ticket in zip(runnable, tickets, strict=True)]
        work = EnvelopeWork(
            entries + [(tenant, Entry(pair=pair)) for tenant, pair in alone],
            prechecked_at=prechecked_at,
            envelopes=envelopes,
        )
        for claim in claims:
            if claim.occurrence_id in verdicts:
                count_started(claim)
                work.results.append((claim, verdicts[claim.occurrence_id], None))
                work.first_result_at = work.first_result_at or time.monotonic()
        turn_ends = time.monotonic() + turn
        waiting = self._blocked(work.tenants, turn)  # why none of the work can start here soon, if it cannot
        while not waiting:
            if not self._add_drains(work, token, worker_name):
                break  # the pool is closing: what has not started goes back now
            results = self._next_results(work, turn_ends)
            if results:
                outcomes.update(self._complete(results, work.envelopes))
            now = time.monotonic()
            with work.cond:
                if work.finished():
                    outcomes.update(work.alone_outcomes)
                    return outcomes
                if work.starved(now):
                    waiting = self.share.busy(work.tenants[0])
                    break
                if work.only_slow_left(now):
                    break
            if now >= turn_ends:
                break
        outcomes.update(self._end_turn(work, turn, waiting))
        return outcomes

    def _blocked(self, tenants: list[int | None], turn: float) -> str | None:
        """Why none of these tenants' handlers can start here soon (each one's share, or the whole pool, is held by
        slow handlers), or None when one of them can."""
        reasons = [self.share.blocked(tenant, turn) for tenant in tenants]
        return reasons[0] if reasons and all(reasons) else None

    # --- the pool ------------------------------------------------------------------------------------------------

    def _add_drains(self, work: EnvelopeWork, token: str, worker_name: str) -> bool:
        """Start pool tasks on the message for each of its tenants, up to its free slots, ramped up over the
        message's rounds (EnvelopeWork.drains_wanted); False if the pool is closed."""
        with work.cond:
            wanted = {tenant: work.drains_wanted(tenant, self.share.free(tenant)) for tenant in work.tenants}
        for tenant, count in wanted.items():
            for _ in range(count):
                task_id = (token, next(self._drain_ids))
                work.drain_scheduled(task_id, tenant)
                try:
                    self.timer.schedule(
                        task_id, time.monotonic(), 0, partial(self._drain, work, task_id, tenant, worker_name)
                    )
                except TimerClosed:
                    work.drain_ended(task_id)
                    return False
        return True

    def _next_results(self, work: EnvelopeWork, turn_ends: float) -> list[tuple[Claim, RunResult, Ticket | None]]:
        """The results to complete together: everything finished within COMPLETE_BATCH_SECONDS of the first one (or
        at once when nothing else runs). Empty when none came within POLL_SECONDS, so the caller can look at its
        turn (start pool tasks for slots freed meanwhile, go on without slow handlers)."""
        with work.cond:
            while True:
                now = time.monotonic()
                if work.results:
                    assert work.first_result_at is not None
                    waited = now - work.first_result_at
                    idle = not work.todo and not work.running
                    if waited >= COMPLETE_BATCH_SECONDS or idle or now >= turn_ends:
                        results, work.results, work.first_result_at = work.results, [], None
                        return results
                    work.cond.wait(COMPLETE_BATCH_SECONDS - waited)
                    continue
                if work.finished() or now >= turn_ends:
                    return []
                work.cond.wait(min(POLL_SECONDS, turn_ends - now))
                if not work.results:
                    return []

    def _drain(
        self,
        work: EnvelopeWork,
        task_id: DrainId,
        tenant: int | None,
        worker_name: str,
        _pool_cancel: threading.Event,
    ) -> None:
        """A pool thread's share of the message: while it holds one of `tenant`'s slots, that tenant's next
        occurrence until none is left."""
        slot = self.share.acquire(tenant)
        work.drain_started(task_id, holding=slot is not None)
        try:
            if slot is None:
                return  # the tenant's share is full: the message's loop starts another task when a slot frees
            close_old_connections()
            self._remember_connection()
            while (entry := work.take(tenant)) is not None:
                slot.begin(time.monotonic())
                try:
                    if entry.claim is not None:
                        self._run_claim(work, entry.claim, entry.ticket)
                    else:
                        assert entry.pair is not None
                        work.alone_done(self._run_alone(work, *entry.pair, worker_name))
                finally:
                    slot.end()
        finally:
            if slot is not None:
                self.share.release(slot)
            work.drain_ended(task_id, holding=slot is not None)

    def _run_claim(self, work: EnvelopeWork, claim: Claim, ticket: Ticket | None) -> None:
        assert ticket is not None
        count_started(claim)
        try:
            verdict = None
            if time.monotonic() - work.prechecked_at > PRECHECK_FRESH_SECONDS:
                verdict = execution.precheck(claim)
            result = verdict or execution.run_handler(claim, ticket.cancel_event, ticket)
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
        if not work.put(claim, result, ticket):
            # The envelope's turn ended while this handler ran: its result is completed here, on its own.
            self._complete([(claim, result, ticket)], work.envelopes)

    def _run_alone(
        self, work: EnvelopeWork, occurrence_id: uuid.UUID, scheduled_for: datetime, worker_name: str
    ) -> str:
        try:
            return execution.process_occurrence(
                occurrence_id, scheduled_for, worker_name, on_claimed=work.claim_decided
            )
        except DatabaseError:
            logger.exception(
                "database error processing occurrence %s",
                occurrence_id,
                extra={"action": "occurrence_db_error", "occurrence_id": str(occurrence_id)},
            )
            connection.close()
            return Tally.DB_ERROR
        except Exception:
            # A bug, not an outage: redelivering would fail the same way; the reconciler reports the occurrence.
            logger.exception(
                "error processing occurrence %s",
                occurrence_id,
                extra={"action": "occurrence_error", "occurrence_id": str(occurrence_id)},
            )
            return Tally.ERROR

    def _complete(
        self,
        results: list[tuple[Claim, RunResult, Ticket | None]],
        envelopes: Mapping[uuid.UUID, int] | None = None,
    ) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        tickets = [ticket for _, _, ticket in results if ticket is not None]
        finished = [(claim, result) for claim, result, _ in results if result not in (NOT_RUN, FAILED_TO_RUN)]
        for _, result, _ in results:
            if result is NOT_RUN:
                outcomes[Tally.DB_ERROR] += 1
            elif result is FAILED_TO_RUN:
                outcomes[Tally.ERROR] += 1
        # These handlers are done: their leases need no renewal for the moment it takes to complete them (and one
        # left uncompleted expires and is retried by the reaper). Unregistered first, so a renewal round running
        # meanwhile does not take a completed row for a lost lease.
        lease_renewer().unregister_many(tickets)
        try:
            if finished:
                crash_point("worker.after_effect")
                outcomes.update(execution.complete_many(finished, envelopes=envelopes).values())
        except DatabaseError:
            logger.exception("database error completing an envelope", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes[Tally.DB_ERROR] += len(finished)
        return outcomes

    # --- the end of a turn ---------------------------------------------------------------------------------------

    def _end_turn(self, work: EnvelopeWork, turn: float, waiting: str | None) -> Counter[str]:
        """Hand back what has not started, leave what runs to finish on the pool, and let the task return.

        One-by-one deliveries still deciding their claim are waited for (a claim that failed would have nobody
        left to hand its message back). Unstarted work goes back due at once, behind whatever other tenants have
        queued; when none of it could start here (`waiting` says why), after a recheck delay instead, as its
        tenant's next envelope would be parked at claim.
        """
        outcomes: Counter[str] = Counter()
        with work.cond:
            while work.claiming:
                work.cond.wait(0.25)
            unstarted = work.take_unstarted()
            results, work.results = work.results, []
            work.detached = True
            running = work.running
            outcomes.update(work.alone_outcomes)
            pending = work.pending_drains()
        for task_id in pending:
            self.timer.cancel(task_id)
        if results:
            outcomes.update(self._complete(results, work.envelopes))
        claims = [entry.claim for entry in unstarted if entry.claim is not None]
        lease_renewer().unregister_many([entry.ticket for entry in unstarted if entry.ticket is not None])
        unclaimed = [entry.pair for entry in unstarted if entry.pair is not None]
        if waiting:
            reason, delay = f"waiting for the worker pool: {waiting}", recheck_delay(0.0)
        else:
            reason, delay = f"handed back: not started within the envelope's {turn:g} s turn on the worker", 0.0
        try:
            handed = hand_back(claims, unclaimed, reason=reason, delay=delay) if unstarted else 0
        except DatabaseError:
            # The claims stay running under leases nobody renews (the reaper retries them); the message goes back
            # to the broker for the deliveries never claimed.
            logger.exception("database error handing back an envelope", extra={"action": "occurrence_db_error"})
            connection.close()
            outcomes[Tally.NOT_RUN] += len(unstarted)
        else:
            if handed:
                outcomes[Tally.HANDED_BACK] += handed
            if len(unstarted) > handed:
                outcomes[Tally.DROPPED] += len(unstarted) - handed  # ended or claimed elsewhere meanwhile
        if running:
            outcomes[Tally.DETACHED] += running
        return outcomes

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
