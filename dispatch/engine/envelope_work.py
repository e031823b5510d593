"""One message's occurrences on a worker's pool: what has not started (per tenant), what runs, what finished and is
not completed yet, and the pool tasks serving it.

A message carries one envelope, or a bundle of small envelopes of several tenants that fell due at one instant on
one queue (the relay bundles them: dispatch/engine/publishing.py). Each tenant's occurrences wait in a queue of
their own, so a pool task holding a slot of one tenant's share (dispatch/engine/pool_share.py) takes only that
tenant's work, and a tenant whose share is full never holds back another's.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from datetime import datetime

from dispatch.engine.claims import Claim
from dispatch.engine.leases import Ticket
from dispatch.engine.retry import RunResult

# An envelope none of whose occurrences could start for this long hands them back, to be offered again after a
# recheck delay: its tenants' shares (or the whole pool) are held by handlers that are not ending.
STARVED_SECONDS = 0.5
# Once everything has started, the task waits this long for a result before it leaves the last (slow) handlers to
# complete themselves: fast handlers are done within it, so their completions stay batched.
TAIL_SECONDS = 0.1

# A pool task serving the message: (delivery token, sequence).
DrainId = tuple[str, int]


class Entry:
    """One occurrence of the message: a batched claim with its lease ticket, or a delivery left to try_claim."""

    __slots__ = ("claim", "pair", "ticket")

    def __init__(
        self,
        claim: Claim | None = None,
        ticket: Ticket | None = None,
        pair: tuple[uuid.UUID, datetime] | None = None,
    ) -> None:
        self.claim = claim
        self.ticket = ticket
        self.pair = pair


class EnvelopeWork:
    """The message's occurrences on the pool: not started (`todo`, per tenant), running, finished but not completed.

    `cond` guards everything; the methods that say "the caller holds `cond`" read without taking it.
    """

    def __init__(
        self,
        entries: list[tuple[int | None, Entry]],
        prechecked_at: float,
        envelopes: Mapping[uuid.UUID, int] | None = None,
    ) -> None:
        # The envelope each occurrence came in, where the message said (its completion copies a stamp from it).
        self.envelopes = envelopes
        self.todo: dict[int | None, deque[Entry]] = {}
        for tenant, entry in entries:
            queue = self.todo.get(tenant)
            if queue is None:  # not setdefault: that builds a deque per entry to throw away
                queue = self.todo[tenant] = deque()
            queue.append(entry)
        self.running = 0
        self.claiming = 0  # one-by-one deliveries whose claim is not decided yet
        self.results: list[tuple[Claim, RunResult, Ticket | None]] = []
        self.first_result_at: float | None = None
        self.alone_outcomes: Counter[str] = Counter()
        self.prechecked_at = prechecked_at
        self.progress_at = prechecked_at  # when a handler of the message last started or finished
        self.holding = 0  # pool tasks holding a slot of a tenant's share for this message
        self.detached = False  # the task went on: what still runs completes itself
        self.drains: dict[DrainId, tuple[int | None, bool]] = {}  # pool tasks serving it -> (tenant, started yet)
        self._waiting: Counter[int | None] = Counter()  # per tenant: its pool tasks not started yet
        self._started: Counter[int | None] = Counter()  # per tenant: its pool tasks started and not ended
        self.cond = threading.Condition()

    @property
    def tenants(self) -> list[int | None]:
        """The tenants with occurrences not started (the caller holds `cond`)."""
        return list(self.todo)

    def waiting_drains(self, tenant: int | None) -> int:
        """Pool tasks scheduled for `tenant` that have not started yet (the caller holds `cond`)."""
        return self._waiting[tenant]

    def drains_wanted(self, tenant: int | None, free: int) -> int:
        """How many more pool tasks to start for `tenant`, with `free` slots of its share (the caller holds `cond`).

        At most as many as already run for it, and one to begin with: a task takes the tenant's occurrences one after
        another, so fast handlers (most) are run by one task per tenant, while slow ones still reach every free slot
        within a few of the message's rounds (1, 2, 4, 8 tasks, a round every POLL_SECONDS at most). Starting one task
        per occurrence at once cost a pool hand-off per fire: ~15 % of the worker's Python time at 2,315 fires a
        second spread over 1,000 tenants (sampled; docs/BENCHMARKS.md "Settling a second later").
        """
        return min(self.todo_count(tenant), free, max(1, self._started[tenant])) - self._waiting[tenant]

    def todo_count(self, tenant: int | None) -> int:
        queue = self.todo.get(tenant)
        return len(queue) if queue else 0

    def take(self, tenant: int | None) -> Entry | None:
        with self.cond:
            queue = self.todo.get(tenant)
            if not queue:
                return None
            entry = queue.popleft()
            if not queue:
                del self.todo[tenant]
            self.running += 1
            self.progress_at = time.monotonic()
            if entry.claim is None:
                self.claiming += 1
            return entry

    def take_unstarted(self) -> list[Entry]:
        """Everything not started, removed (the caller holds `cond`)."""
        unstarted = [entry for queue in self.todo.values() for entry in queue]
        self.todo = {}
        return unstarted

    def claim_decided(self) -> None:
        with self.cond:
            self.claiming -= 1
            self.cond.notify_all()

    def put(self, claim: Claim, result: RunResult, ticket: Ticket | None) -> bool:
        """Report a batched claim's result; False once the task went on without it (the caller completes it)."""
        with self.cond:
            self.running -= 1
            if self.detached:
                return False
            self.progress_at = time.monotonic()
            if self.first_result_at is None:
                self.first_result_at = self.progress_at
            self.results.append((claim, result, ticket))
            self.cond.notify_all()
            return True

    def alone_done(self, outcome: str) -> None:
        with self.cond:
            self.running -= 1
            self.progress_at = time.monotonic()
            if not self.detached:
                self.alone_outcomes[outcome] += 1
            self.cond.notify_all()

    def drain_scheduled(self, task_id: DrainId, tenant: int | None) -> None:
        with self.cond:
            self.drains[task_id] = (tenant, False)
            self._waiting[tenant] += 1

    def drain_started(self, task_id: DrainId, holding: bool) -> None:
        with self.cond:
            # A task ended before it started (handed back) is still counted while it runs.
            tenant, started = self.drains.get(task_id, (None, False))
            if not started:
                if task_id in self.drains:
                    self._waiting[tenant] -= 1
                self._started[tenant] += 1
            self.drains[task_id] = (tenant, True)
            self.holding += holding

    def drain_ended(self, task_id: DrainId, holding: bool = False) -> None:
        with self.cond:
            drain = self.drains.pop(task_id, None)
            if drain is not None:
                tenant, started = drain
                (self._started if started else self._waiting)[tenant] -= 1
            self.holding -= holding
            self.cond.notify_all()

    def pending_drains(self) -> list[DrainId]:
        """Pool tasks not started yet (the caller holds `cond`)."""
        return [task_id for task_id, (_, started) in self.drains.items() if not started]

    def finished(self) -> bool:
        """Nothing left to start, run or complete (the caller holds `cond`)."""
        return not self.todo and not self.running and not self.results

    def starved(self, now: float) -> bool:
        """Occurrences wait, no pool task holds a slot for them, and none of them started for a while (the caller
        holds `cond`)."""
        return bool(self.todo) and not self.holding and now - self.progress_at >= STARVED_SECONDS

    def only_slow_left(self, now: float) -> bool:
        """Everything has started and the handlers still running have given no result for a while (the caller
        holds `cond`)."""
        return not self.todo and not self.results and now - self.progress_at >= TAIL_SECONDS
