"""In-process priority timer: runs callables at monotonic deadlines, earliest and most urgent first."""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, NamedTuple

from dispatch.cancel import CancelEvent

logger = logging.getLogger(__name__)

TaskFn = Callable[[threading.Event], object]
State = Literal["pending", "running", "cancelled", "completed", "failed"]

PENDING: State = "pending"
RUNNING: State = "running"
CANCELLED: State = "cancelled"
COMPLETED: State = "completed"
FAILED: State = "failed"
_TERMINAL = frozenset({CANCELLED, COMPLETED, FAILED})
# The whole state machine. Anything else is a bug in this module, so it raises instead of being tolerated.
_ALLOWED: dict[str, frozenset[str]] = {
    PENDING: frozenset({RUNNING, CANCELLED}),
    RUNNING: frozenset({COMPLETED, FAILED}),
}

# Replacements and cancels leave stale heap entries behind (lazy deletion). Once the heap holds more than
# HEAP_FACTOR * live + HEAP_SLACK entries it is rebuilt from the map, so memory is O(live) however often a
# task is replaced. The slack keeps a timer with one or two live tasks from rebuilding on every call.
HEAP_FACTOR = 2
HEAP_SLACK = 64
# How many finished (cancelled/completed/failed) task ids state() still answers for. Older ones are
# forgotten: state() returns None and a later schedule() of that id starts again at version 1.
FINISHED_LIMIT = 10_000

_HeapEntry = tuple[float, float, int, Hashable, int]


class TimerClosed(RuntimeError):
    """schedule() or start() after close() has begun."""


class Claimed(NamedTuple):
    """A version that next() moved from pending to running; pass it back to complete() or run_claimed()."""

    task_id: Hashable
    version: int
    run_at: float
    priority: float


@dataclass(eq=False, slots=True)
class _Version:
    task_id: Hashable
    version: int
    seq: int
    run_at: float
    priority: float
    fn: TaskFn
    state: State = PENDING
    cancel_event: threading.Event | None = None
    pooled: bool = False  # claimed by the dispatcher: holds a worker slot until it finishes
    started: bool = False  # fn handed to a worker or run_claimed(): it must not be run twice


@dataclass(eq=False, slots=True)
class _Task:
    latest: _Version
    runs: dict[int, _Version] = field(default_factory=dict)  # versions currently running, by version


def _require_number(name: str, value: float) -> None:
    # NaN compares false with everything, which would silently break the heap invariant.
    if value != value:
        raise ValueError(f"{name} must not be NaN")


def _transition(version: _Version, new: State) -> None:
    if new not in _ALLOWED.get(version.state, frozenset()):
        raise RuntimeError(f"illegal transition {version.state} -> {new} for {version.task_id!r}")
    version.state = new


class PriorityTimer:
    """Single-node scheduler of callables keyed by (run_at, -priority, submission sequence).

    Data structures: a min-heap of (run_at, -priority, sequence, task_id, version) and a map task_id ->
    latest version with its state. The sequence is unique, so heap comparison never reaches task_id and
    never compares task objects. Replacing a task writes a new version; cancelling marks its state; neither
    touches the heap in place. next() discards stale, cancelled and replaced entries lazily as they reach
    the head; the heap is rebuilt from the map when it outgrows the live entries (see HEAP_FACTOR).

    Complexity, n = live pending entries: schedule O(log n) amortised; cancel O(1) amortised (plus one
    event per running version of that task id); next O(log n) amortised, since every stale entry is popped
    at most once and was paid for by the schedule/cancel that made it stale.

    Contract decisions:

    1. States per version: pending -> running -> completed | failed, and pending -> cancelled.
       state(task_id) is the state of the latest version.
    2. schedule() of a task id that is running creates a new pending version, due at its own run_at; the
       running version keeps running and is not signalled. Versions of one id may therefore overlap; a caller
       that forbids overlap cancels first or schedules after completion. Versions count from 1 per task id.
    3. cancel() returns True if it cancelled the pending latest version or set the cancel event of a running
       version of that id (again True on a repeated cancel while it still runs); False for unknown,
       cancelled or finished tasks. A running fn is only signalled: its completed/failed state is reported
       after it returns.
    4. Manual mode (start() never called): next() claims but runs nothing. The driver reports the outcome
       with complete(claimed, ok) or runs fn in its own thread with run_claimed(claimed). The same works
       after start(), but a manual claim then bypasses the worker limit and is the caller's to finish.
    5. close() cancels every pending version (they stay answerable by state()), rejects schedule() with
       TimerClosed, wakes the dispatcher, which stops claiming, and lets claimed work finish. wait=True joins
       the dispatcher and workers, except when called from one of them (that would deadlock). Manual claims
       are never waited for: a single-threaded driver finishes them itself.
    6. A finished task id leaves the map; state() still answers for the FINISHED_LIMIT most recently
       finished ids (oldest forgotten first), so memory is O(live + FINISHED_LIMIT).
    7. With an injected clock that is not time.monotonic, call wake() after moving it, so the dispatcher
       recomputes its wait; it otherwise sleeps the real seconds it computed from the old reading.

    All public methods are safe to call from any thread; task functions run without the lock held.
    """

    def __init__(
        self,
        workers: int = 4,
        clock: Callable[[], float] = time.monotonic,
        *,
        finished_limit: int = FINISHED_LIMIT,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if finished_limit < 0:
            raise ValueError("finished_limit must not be negative")
        self._workers = workers
        self._clock = clock
        self._finished_limit = finished_limit
        # One lock for heap, map and counters; the dispatcher waits on it for a due head, a free worker
        # slot, an earlier submission, a cancel, close() or wake().
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[_HeapEntry] = []
        self._tasks: dict[Hashable, _Task] = {}
        self._finished: OrderedDict[Hashable, tuple[int, State]] = OrderedDict()
        self._seq = itertools.count()
        self._live = 0  # pending versions, i.e. valid heap entries
        self._running = 0  # versions in state running, pooled or manual
        self._busy = 0  # worker slots held by dispatcher claims
        self._executing = 0  # fns executing right now, in workers or run_claimed()
        self._peak_workers = 0
        self._status = "open"  # open -> closing -> closed
        self._dispatcher: threading.Thread | None = None
        self._dispatcher_done = False
        self._dispatcher_waiting = False  # a gauge: lets a test submit while the dispatcher sleeps
        self._pool: list[threading.Thread] = []
        self._handoff: queue.SimpleQueue[_Version | None] = queue.SimpleQueue()
        self._counters = dict.fromkeys(
            ("claims", "completed", "failed", "cancelled", "replaced", "signalled", "rebuilds", "wakeups"), 0
        )

    # -- public API -----------------------------------------------------------------------------------

    def schedule(self, task_id: Hashable, run_at: float, priority: float, fn: TaskFn) -> int:
        """Add or replace task_id's pending version due at run_at (clock seconds); return its version."""
        _require_number("run_at", run_at)
        _require_number("priority", priority)
        with self._cond:
            if self._status != "open":
                raise TimerClosed("the timer is closing; no new work is accepted")
            task = self._tasks.get(task_id)
            if task is not None:
                previous = task.latest.version
                if task.latest.state == PENDING:
                    # Superseded, not cancelled: its heap entry goes stale and is dropped when it surfaces.
                    self._counters["replaced"] += 1
                    self._live -= 1
            else:
                remembered = self._finished.pop(task_id, None)
                previous = remembered[0] if remembered else 0
            version = _Version(task_id, previous + 1, next(self._seq), run_at, priority, fn)
            if task is None:
                self._tasks[task_id] = _Task(version)
            else:
                task.latest = version
            self._live += 1
            entry = (run_at, -priority, version.seq, task_id, version.version)
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                # The dispatcher may be sleeping until a later head; only a new head can shorten that sleep.
                self._cond.notify_all()
            self._maybe_compact()
            return version.version

    def cancel(self, task_id: Hashable) -> bool:
        """Cancel the pending version and signal running ones; True if either happened."""
        with self._cond:
            task = self._tasks.get(task_id)
            if task is None:
                return False
            prevented = task.latest.state == PENDING
            if prevented:
                self._cancel_pending(task.latest)
            for run in task.runs.values():
                assert run.cancel_event is not None
                run.cancel_event.set()
                self._counters["signalled"] += 1
            signalled = bool(task.runs)
            self._retire_if_idle(task)
            if prevented:
                self._cond.notify_all()
                self._maybe_compact()
            return prevented or signalled

    def next(self, now: float | None = None) -> Claimed | float | None:
        """Claim the earliest due pending version, else return seconds until the head is due, else None.

        now defaults to the clock. The claimed version is running; report it with complete()/run_claimed().
        """
        with self._cond:
            outcome = self._claim_locked(self._clock() if now is None else now)
        if isinstance(outcome, _Version):
            return Claimed(outcome.task_id, outcome.version, outcome.run_at, outcome.priority)
        return outcome

    def complete(self, claimed: Claimed, ok: bool = True) -> None:
        """Report the outcome of a manual claim without running its fn (completed if ok, else failed)."""
        with self._cond:
            version = self._claimed_version(claimed)
            self._finish_locked(version, ok)

    def run_claimed(self, claimed: Claimed) -> bool:
        """Run a manual claim's fn in the caller's thread and record the outcome; True if it returned.

        An exception from fn is logged and recorded as failed (not raised); BaseExceptions such as
        KeyboardInterrupt are recorded as failed and propagate.
        """
        with self._cond:
            version = self._claimed_version(claimed)
            version.started = True
        return self._execute(version)

    def state(self, task_id: Hashable) -> State | None:
        """The state of task_id's latest version, or None if unknown or forgotten (see FINISHED_LIMIT)."""
        with self._cond:
            task = self._tasks.get(task_id)
            if task is not None:
                return task.latest.state
            remembered = self._finished.get(task_id)
            return remembered[1] if remembered else None

    def start(self) -> None:
        """Start the dispatcher thread and `workers` worker threads."""
        with self._cond:
            if self._status != "open":
                raise TimerClosed("a closed timer cannot be started")
            if self._dispatcher is not None:
                raise RuntimeError("the timer is already started")
            self._pool = [
                threading.Thread(target=self._work, name=f"priority-timer-worker-{i}", daemon=True)
                for i in range(self._workers)
            ]
            self._dispatcher = threading.Thread(
                target=self._dispatch,
                name="priority-timer-dispatcher",
                daemon=True,
            )
            for thread in (*self._pool, self._dispatcher):
                thread.start()

    def wake(self) -> None:
        """Make the dispatcher re-read the clock now (for injected clocks that jumped)."""
        with self._cond:
            self._cond.notify_all()

    def close(self, wait: bool = True) -> None:
        """Reject new work, cancel pending versions, stop claiming; with wait, join all timer threads."""
        with self._cond:
            if self._status == "open":
                self._status = "closing"
                # Mark the map first: the heap entries then go stale, so clearing the heap loses nothing.
                for task in list(self._tasks.values()):
                    if task.latest.state == PENDING:
                        self._cancel_pending(task.latest)
                        self._retire_if_idle(task)
                self._heap.clear()
                self._maybe_mark_closed()
                self._cond.notify_all()
            dispatcher = self._dispatcher
            own_threads = (dispatcher, *self._pool)
        if wait and dispatcher is not None and threading.current_thread() not in own_threads:
            dispatcher.join()

    def stats(self) -> dict[str, object]:
        """Counters and gauges: live, heap, stale_ratio, peak_workers, claims, completed, failed, ..."""
        with self._cond:
            heap = len(self._heap)
            return {
                "live": self._live,
                "heap": heap,
                "stale_ratio": (heap - self._live) / heap if heap else 0.0,
                "running": self._running,
                "busy_workers": self._busy,
                "peak_workers": self._peak_workers,
                "workers": self._workers,
                "tasks": len(self._tasks),
                "finished_remembered": len(self._finished),
                "status": self._status,
                "dispatcher_waiting": self._dispatcher_waiting,
                **self._counters,
            }

    def __enter__(self) -> PriorityTimer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals: the caller holds self._cond unless the name says otherwise ------------------------

    def _claim_locked(self, now: float) -> _Version | float | None:
        while self._heap:
            run_at, _, seq, task_id, _ = self._heap[0]
            task = self._tasks.get(task_id)
            # Matching on the unique sequence, not the version, keeps a forgotten task id whose versions
            # restarted at 1 from resurrecting an old entry.
            if task is None or task.latest.seq != seq or task.latest.state != PENDING:
                heapq.heappop(self._heap)
                continue
            if run_at > now:
                return float(run_at - now)
            heapq.heappop(self._heap)
            version = task.latest
            _transition(version, RUNNING)
            version.cancel_event = CancelEvent()
            task.runs[version.version] = version
            self._live -= 1
            self._running += 1
            self._counters["claims"] += 1
            self._maybe_compact()
            return version
        return None

    def _claimed_version(self, claimed: Claimed) -> _Version:
        task = self._tasks.get(claimed.task_id)
        version = task.runs.get(claimed.version) if task else None
        if version is None or version.started:
            raise ValueError(f"{claimed!r} is not a running claim awaiting its outcome")
        return version

    def _cancel_pending(self, version: _Version) -> None:
        _transition(version, CANCELLED)
        self._live -= 1
        self._counters["cancelled"] += 1

    def _finish_locked(self, version: _Version, ok: bool) -> None:
        _transition(version, COMPLETED if ok else FAILED)
        task = self._tasks[version.task_id]
        del task.runs[version.version]
        self._running -= 1
        self._counters["completed" if ok else "failed"] += 1
        if version.pooled:
            self._busy -= 1
        self._retire_if_idle(task)
        self._maybe_mark_closed()
        # A freed slot or the last running version: the dispatcher or a closing timer may be waiting.
        self._cond.notify_all()

    def _retire_if_idle(self, task: _Task) -> None:
        if task.runs or task.latest.state not in _TERMINAL:
            return
        latest = task.latest
        del self._tasks[latest.task_id]
        if self._finished_limit:
            self._finished[latest.task_id] = (latest.version, latest.state)
            while len(self._finished) > self._finished_limit:
                self._finished.popitem(last=False)

    def _maybe_compact(self) -> None:
        if len(self._heap) <= HEAP_FACTOR * self._live + HEAP_SLACK:
            return
        self._heap = [
            (v.run_at, -v.priority, v.seq, task_id, v.version)
            for task_id, task in self._tasks.items()
            if (v := task.latest).state == PENDING
        ]
        heapq.heapify(self._heap)
        self._counters["rebuilds"] += 1

    def _maybe_mark_closed(self) -> None:
        threads_gone = self._dispatcher is None or self._dispatcher_done
        if self._status == "closing" and threads_gone and self._running == 0:
            self._status = "closed"

    def _wait(self, timeout: float | None) -> None:
        if timeout is not None:
            timeout = min(timeout, threading.TIMEOUT_MAX)  # an inf run_at would overflow the lock timeout
        self._dispatcher_waiting = True
        self._cond.wait(timeout)
        self._dispatcher_waiting = False
        self._counters["wakeups"] += 1

    def _dispatch_step(self) -> bool:
        """One dispatcher decision; False once the timer is closing."""
        if self._status != "open":
            return False
        if self._busy >= self._workers:
            # Claim only with a free slot: a task stays pending (and cancelable) while it waits for one.
            self._wait(None)
            return True
        outcome = self._claim_locked(self._clock())
        if isinstance(outcome, _Version):
            outcome.pooled = outcome.started = True
            self._busy += 1
            self._handoff.put(outcome)
            return True
        self._wait(outcome)
        return True

    # -- thread bodies (take the lock themselves) -----------------------------------------------------

    def _dispatch(self) -> None:
        try:
            with self._cond:
                while self._dispatch_step():
                    pass
        finally:
            # Workers drain claims already handed off before they meet their stop marker.
            for _ in self._pool:
                self._handoff.put(None)
            for worker in self._pool:
                worker.join()
            with self._cond:
                self._dispatcher_done = True
                self._maybe_mark_closed()
                self._cond.notify_all()

    def _work(self) -> None:
        while (version := self._handoff.get()) is not None:
            try:
                self._execute(version)
            except BaseException:
                # Already recorded as failed; a task raising SystemExit must not shrink the pool.
                logger.exception(
                    "timer task %r v%s raised a BaseException",
                    version.task_id,
                    version.version,
                    extra={"action": "timer_task_aborted"},
                )

    def _execute(self, version: _Version) -> bool:
        with self._cond:
            self._executing += 1
            self._peak_workers = max(self._peak_workers, self._executing)
        ok = False
        try:
            assert version.cancel_event is not None
            version.fn(version.cancel_event)
            ok = True
        except Exception:
            logger.exception(
                "timer task %r v%s failed",
                version.task_id,
                version.version,
                extra={"action": "timer_task_failed"},
            )
        finally:
            with self._cond:
                self._executing -= 1
                self._finish_locked(version, ok)
        return ok
