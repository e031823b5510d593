"""PriorityTimer: differential tests against a sorted reference model, then the threaded dispatcher."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dispatch.timer import HEAP_FACTOR, HEAP_SLACK, Claimed, PriorityTimer, TimerClosed
from tests.support import examples, poll

# Generous: these bound waits for events that normally arrive in milliseconds; only a bug reaches them.
TIMEOUT = 10.0


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def set(self, now: float) -> None:
        with self._lock:
            self._now = now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def noop(cancel_event: threading.Event) -> None:
    return None


def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    """The shared poll, tried every 2 ms: these tests time a timer, so the wait must not blur its instants."""
    return poll(predicate, timeout, every=0.002)


def timer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("priority-timer")]


# -- the reference model --------------------------------------------------------------------------------


@dataclass
class ModelVersion:
    version: int
    seq: int
    run_at: float
    priority: float
    state: str = "pending"
    signalled: bool = False


class ReferenceTimer:
    """The contract as a list sorted on every call: slow and obviously right."""

    def __init__(self) -> None:
        self.seq = 0
        self.latest: dict[str, ModelVersion] = {}
        self.running: dict[tuple[str, int], ModelVersion] = {}

    def schedule(self, task_id: str, run_at: float, priority: float) -> int:
        previous = self.latest.get(task_id)
        version = previous.version + 1 if previous else 1
        self.latest[task_id] = ModelVersion(version, self.seq, run_at, priority)
        self.seq += 1
        return version

    def cancel(self, task_id: str) -> bool:
        latest = self.latest.get(task_id)
        prevented = latest is not None and latest.state == "pending"
        if prevented:
            latest.state = "cancelled"
        runs = [v for (tid, _), v in self.running.items() if tid == task_id]
        for run in runs:
            run.signalled = True
        return prevented or bool(runs)

    def next(self, now: float) -> Claimed | float | None:
        pending = sorted(
            ((v.run_at, -v.priority, v.seq), tid) for tid, v in self.latest.items() if v.state == "pending"
        )
        if not pending:
            return None
        (run_at, _, _), task_id = pending[0]
        if run_at > now:
            return run_at - now
        head = self.latest[task_id]
        head.state = "running"
        self.running[(task_id, head.version)] = head
        return Claimed(task_id, head.version, head.run_at, head.priority)

    def finish(self, claimed: Claimed, ok: bool) -> ModelVersion:
        run = self.running.pop((claimed.task_id, claimed.version))
        run.state = "completed" if ok else "failed"
        return run

    def state(self, task_id: str) -> str | None:
        latest = self.latest.get(task_id)
        return latest.state if latest else None

    def pending_count(self) -> int:
        return sum(v.state == "pending" for v in self.latest.values())


TASK_IDS = ["a", "b", "c", "d"]
# Few distinct instants and priorities, so equal keys and ties on run_at are the common case.
INSTANTS = st.integers(0, 8).map(float)
PRIORITIES = st.integers(-1, 2)


class TimerVersusReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.timer = PriorityTimer(workers=2, clock=self.clock)
        self.model = ReferenceTimer()
        self.claims: list[Claimed] = []
        self.raise_in_task = False
        self.saw_cancel: bool | None = None

    def task_fn(self, cancel_event: threading.Event) -> None:
        self.saw_cancel = cancel_event.is_set()
        if self.raise_in_task:
            raise RuntimeError("task failure injected by the test")

    @rule(task_id=st.sampled_from(TASK_IDS), run_at=INSTANTS, priority=PRIORITIES)
    def schedule(self, task_id: str, run_at: float, priority: int) -> None:
        got = self.timer.schedule(task_id, run_at, priority, self.task_fn)
        assert got == self.model.schedule(task_id, run_at, priority)

    @rule(task_id=st.sampled_from(TASK_IDS))
    def cancel(self, task_id: str) -> None:
        assert self.timer.cancel(task_id) == self.model.cancel(task_id)

    @rule(now=st.none() | INSTANTS)
    def next(self, now: float | None) -> None:
        got = self.timer.next(now)
        want = self.model.next(self.clock() if now is None else now)
        assert got == want
        assert type(got) is type(want)
        if isinstance(got, Claimed):
            self.claims.append(got)

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), how=st.sampled_from(["complete", "fail", "run", "run_and_raise"]))
    def finish_a_claim(self, data: st.DataObject, how: str) -> None:
        claimed = self.claims.pop(data.draw(st.integers(0, len(self.claims) - 1)))
        ok = how in ("complete", "run")
        if how.startswith("run"):
            self.raise_in_task = not ok
            self.saw_cancel = None
            assert self.timer.run_claimed(claimed) is ok
            run = self.model.finish(claimed, ok)
            assert self.saw_cancel is run.signalled
        else:
            self.timer.complete(claimed, ok=ok)
            self.model.finish(claimed, ok)

    @invariant()
    def states_match(self) -> None:
        for task_id in TASK_IDS:
            assert self.timer.state(task_id) == self.model.state(task_id)

    @invariant()
    def stats_match_and_heap_is_bounded(self) -> None:
        stats = self.timer.stats()
        assert stats["live"] == self.model.pending_count()
        assert stats["running"] == len(self.model.running)
        assert stats["heap"] <= HEAP_FACTOR * stats["live"] + HEAP_SLACK

    def teardown(self) -> None:
        self.timer.close()


def test_timer_matches_sorted_reference_under_random_operations() -> None:
    run_state_machine_as_test(
        TimerVersusReference,
        settings=settings(
            max_examples=examples(250),
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_timer_matches_reference_over_long_sequences_that_force_heap_rebuilds(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    timer = PriorityTimer(workers=2, clock=clock)
    model = ReferenceTimer()
    task_ids = [f"t{i}" for i in range(30)]
    claims: list[Claimed] = []
    for _ in range(4000):
        op = rng.random()
        if op < 0.55:
            task_id, run_at, priority = rng.choice(task_ids), float(rng.randint(0, 40)), rng.randint(0, 3)
            assert timer.schedule(task_id, clock() + run_at, priority, noop) == model.schedule(
                task_id, clock() + run_at, priority
            )
        elif op < 0.70:
            task_id = rng.choice(task_ids)
            assert timer.cancel(task_id) == model.cancel(task_id)
        elif op < 0.90:
            got = timer.next()
            assert got == model.next(clock())
            if isinstance(got, Claimed):
                claims.append(got)
        elif op < 0.95 and claims:
            claimed = claims.pop(rng.randrange(len(claims)))
            ok = rng.random() < 0.8
            timer.complete(claimed, ok=ok)
            model.finish(claimed, ok)
        else:
            clock.advance(rng.choice([0.5, 2.0, 7.0]))
        stats = timer.stats()
        assert stats["live"] == model.pending_count()
        assert stats["heap"] <= HEAP_FACTOR * stats["live"] + HEAP_SLACK
    assert all(timer.state(t) == model.state(t) for t in task_ids)
    assert timer.stats()["rebuilds"] > 0


# -- manual mode: named interleavings -------------------------------------------------------------------


def test_next_returns_none_when_nothing_is_pending_and_the_wait_when_nothing_is_due() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock(10.0))
    assert timer.next() is None
    timer.schedule("a", 12.5, 0, noop)
    assert timer.next() == 2.5
    assert timer.next(now=12.0) == 0.5
    assert timer.next(now=12.5) == Claimed("a", 1, 12.5, 0)
    assert timer.next(now=100.0) is None


def test_equal_keys_are_claimed_in_submission_order() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    for task_id in ["c", "a", "b"]:
        timer.schedule(task_id, 1.0, 5, noop)
    assert [timer.next(now=1.0).task_id for _ in range(3)] == ["c", "a", "b"]


def test_earliest_run_at_wins_then_highest_priority() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    timer.schedule("late-urgent", 2.0, 100, noop)
    timer.schedule("early-low", 1.0, 0, noop)
    timer.schedule("early-high", 1.0, 9, noop)
    order = [timer.next(now=5.0).task_id for _ in range(3)]
    assert order == ["early-high", "early-low", "late-urgent"]


def test_a_future_high_priority_task_does_not_jump_a_due_one() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock(1.0))
    timer.schedule("future-urgent", 3.0, 100, noop)
    timer.schedule("due-low", 1.0, 0, noop)
    assert timer.next().task_id == "due-low"
    assert timer.next() == 2.0


def test_replacement_before_the_old_entry_reaches_the_head_runs_only_the_new_version() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    timer.schedule("head", 1.0, 0, noop)
    assert timer.schedule("x", 2.0, 0, noop) == 1
    assert timer.schedule("x", 5.0, 3, noop) == 2
    assert timer.next(now=3.0).task_id == "head"
    assert timer.next(now=3.0) == 2.0  # the stale v1 at 2.0 is skipped, not claimed
    assert timer.next(now=5.0) == Claimed("x", 2, 5.0, 3)
    assert timer.next(now=99.0) is None


def test_replacement_can_move_a_task_earlier() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    timer.schedule("x", 50.0, 0, noop)
    timer.schedule("x", 1.0, 0, noop)
    assert timer.next(now=1.0) == Claimed("x", 2, 1.0, 0)
    assert timer.next(now=60.0) is None


def test_cancel_just_before_the_claim_means_the_task_never_starts() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    ran = threading.Event()
    timer.schedule("x", 0.0, 0, lambda ev: ran.set())
    assert timer.cancel("x") is True
    assert timer.next(now=0.0) is None
    assert timer.state("x") == "cancelled"
    assert timer.cancel("x") is False
    assert not ran.is_set()


def test_cancel_just_after_the_claim_only_signals_the_running_version() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    seen: list[bool] = []
    timer.schedule("x", 0.0, 0, lambda ev: seen.append(ev.is_set()))
    claimed = timer.next(now=0.0)
    assert timer.cancel("x") is True
    assert timer.state("x") == "running"
    assert timer.run_claimed(claimed) is True
    assert seen == [True]
    assert timer.state("x") == "completed"
    assert timer.cancel("x") is False


def test_scheduling_a_running_task_adds_a_pending_version_and_leaves_the_running_one_alone() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    seen: list[bool] = []
    timer.schedule("x", 0.0, 0, lambda ev: seen.append(ev.is_set()))
    first = timer.next(now=0.0)
    assert timer.schedule("x", 4.0, 0, noop) == 2
    assert timer.state("x") == "pending"
    assert timer.run_claimed(first) is True
    assert seen == [False]
    assert timer.state("x") == "pending"  # state() follows the latest version
    assert timer.next(now=4.0) == Claimed("x", 2, 4.0, 0)


def test_cancel_of_unknown_completed_or_failed_tasks_returns_false() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    assert timer.cancel("nobody") is False
    timer.schedule("ok", 0.0, 0, noop)
    timer.schedule("bad", 0.0, 0, noop)
    timer.complete(timer.next(now=0.0), ok=True)
    timer.complete(timer.next(now=0.0), ok=False)
    assert (timer.state("ok"), timer.state("bad")) == ("completed", "failed")
    assert timer.cancel("ok") is False
    assert timer.cancel("bad") is False


def test_run_claimed_records_an_exception_as_failed() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())

    def boom(cancel_event: threading.Event) -> None:
        raise ValueError("boom")

    timer.schedule("x", 0.0, 0, boom)
    assert timer.run_claimed(timer.next(now=0.0)) is False
    assert timer.state("x") == "failed"
    assert timer.stats()["failed"] == 1


def test_a_claim_can_be_reported_only_once() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    timer.schedule("x", 0.0, 0, noop)
    claimed = timer.next(now=0.0)
    timer.complete(claimed)
    with pytest.raises(ValueError):
        timer.complete(claimed)
    with pytest.raises(ValueError):
        timer.run_claimed(claimed)
    with pytest.raises(ValueError):
        timer.complete(Claimed("never-scheduled", 1, 0.0, 0))


def test_versions_keep_counting_after_a_task_finishes() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    assert timer.schedule("x", 0.0, 0, noop) == 1
    timer.complete(timer.next(now=0.0))
    assert timer.schedule("x", 0.0, 0, noop) == 2
    timer.cancel("x")
    assert timer.schedule("x", 0.0, 0, noop) == 3


def test_finished_states_are_remembered_for_a_bounded_number_of_tasks() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock(), finished_limit=2)
    for task_id in ["a", "b", "c"]:
        timer.schedule(task_id, 0.0, 0, noop)
        timer.complete(timer.next(now=0.0))
    assert timer.state("a") is None
    assert (timer.state("b"), timer.state("c")) == ("completed", "completed")
    assert timer.stats()["finished_remembered"] == 2
    assert timer.stats()["tasks"] == 0


def test_a_forgotten_task_id_does_not_resurrect_its_stale_heap_entry() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock(), finished_limit=0)
    timer.schedule("x", 1.0, 0, noop)
    timer.cancel("x")  # forgotten at once: its heap entry (x, v1) is still in the heap
    assert timer.schedule("x", 9.0, 0, noop) == 1
    assert timer.next(now=1.0) == 8.0


def test_nan_run_at_or_priority_is_rejected() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    with pytest.raises(ValueError):
        timer.schedule("x", float("nan"), 0, noop)
    with pytest.raises(ValueError):
        timer.schedule("x", 0.0, float("nan"), noop)


def test_close_in_manual_mode_cancels_pending_tasks_and_rejects_new_work() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    timer.schedule("claimed", 0.0, 0, noop)
    timer.schedule("waiting", 5.0, 0, noop)
    claimed = timer.next(now=0.0)
    timer.close()
    assert timer.state("waiting") == "cancelled"
    assert timer.next(now=10.0) is None
    with pytest.raises(TimerClosed):
        timer.schedule("late", 0.0, 0, noop)
    with pytest.raises(TimerClosed):
        timer.start()
    assert timer.stats()["status"] == "closing"  # the claimed version may still finish
    timer.complete(claimed)
    assert timer.stats()["status"] == "closed"
    assert timer.state("claimed") == "completed"


def test_the_heap_stays_bounded_under_100k_replacements_of_one_task() -> None:
    timer = PriorityTimer(workers=1, clock=FakeClock())
    largest = 0
    for i in range(100_000):
        timer.schedule("hot", float(i % 50), i % 7, noop)
        if i % 1000 == 0:
            largest = max(largest, timer.stats()["heap"])
    stats = timer.stats()
    assert max(largest, stats["heap"]) <= HEAP_FACTOR * 1 + HEAP_SLACK
    assert stats["live"] == 1
    assert stats["replaced"] == 99_999
    assert timer.next(now=100.0) == Claimed("hot", 100_000, float(99_999 % 50), 99_999 % 7)
    assert timer.next(now=100.0) is None


# -- started: the dispatcher and the worker pool ---------------------------------------------------------


@pytest.fixture
def make_timer() -> Iterator[Callable[..., PriorityTimer]]:
    timers: list[PriorityTimer] = []

    def make(**kwargs: object) -> PriorityTimer:
        timer = PriorityTimer(**kwargs)
        timers.append(timer)
        return timer

    yield make
    for timer in timers:
        timer.close(wait=True)
    assert timer_threads() == []


def test_the_pool_never_runs_more_functions_than_workers(make_timer: Callable[..., PriorityTimer]) -> None:
    timer = make_timer(workers=3)
    release = threading.Event()
    lock = threading.Lock()
    running = 0
    peak = 0

    def blocker(cancel_event: threading.Event) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(TIMEOUT)
        with lock:
            running -= 1

    for i in range(12):
        timer.schedule(f"t{i}", 0.0, 0, blocker)
    timer.start()
    assert wait_until(lambda: timer.stats()["peak_workers"] == 3)
    # The rest are still pending (not claimed and queued): nothing claims without a free slot.
    assert sum(timer.state(f"t{i}") == "pending" for i in range(12)) == 9
    release.set()
    assert wait_until(lambda: timer.stats()["completed"] == 12)
    assert peak == 3
    assert timer.stats()["peak_workers"] == 3


def test_a_task_cancelled_while_waiting_for_a_worker_slot_never_starts(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    timer = make_timer(workers=1)
    release = threading.Event()
    started = threading.Event()
    second_ran = threading.Event()
    timer.schedule("first", 0.0, 0, lambda ev: (started.set(), release.wait(TIMEOUT)))
    timer.schedule("second", 0.0, 0, lambda ev: second_ran.set())
    timer.start()
    assert started.wait(TIMEOUT)
    assert timer.state("second") == "pending"
    assert timer.cancel("second") is True
    release.set()
    assert wait_until(lambda: timer.state("first") == "completed")
    timer.close()
    assert not second_ran.is_set()
    assert timer.state("second") == "cancelled"


def test_an_earlier_submission_interrupts_the_wait_for_a_far_future_task(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    timer = make_timer(workers=2)
    far_ran = threading.Event()
    early_ran = threading.Event()
    timer.schedule("far", time.monotonic() + 3600, 0, lambda ev: far_ran.set())
    timer.start()
    # Only a dispatcher already asleep until the far task proves that a submission interrupts the wait.
    assert wait_until(lambda: timer.stats()["dispatcher_waiting"])
    wakeups = timer.stats()["wakeups"]
    timer.schedule("early", time.monotonic() + 0.05, 0, lambda ev: early_ran.set())
    assert early_ran.wait(TIMEOUT)
    assert timer.stats()["wakeups"] > wakeups
    assert not far_ran.is_set()
    assert timer.state("far") == "pending"


def test_cancelling_the_head_wakes_the_dispatcher_to_drop_the_stale_entry(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    timer = make_timer(workers=1)
    timer.schedule("far", time.monotonic() + 3600, 0, noop)
    timer.start()
    assert wait_until(lambda: timer.stats()["dispatcher_waiting"])
    wakeups = timer.stats()["wakeups"]
    assert timer.cancel("far") is True
    assert wait_until(lambda: timer.stats()["wakeups"] > wakeups and timer.stats()["dispatcher_waiting"])
    assert timer.stats()["heap"] == 0


def test_a_failing_function_is_marked_failed_and_the_dispatcher_keeps_running(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    timer = make_timer(workers=1)
    after = threading.Event()

    def boom(cancel_event: threading.Event) -> None:
        raise RuntimeError("task failure injected by the test")

    def exits(cancel_event: threading.Event) -> None:
        raise SystemExit(3)

    timer.start()
    timer.schedule("boom", 0.0, 5, boom)
    timer.schedule("exits", 0.0, 4, exits)
    timer.schedule("after", 0.0, 0, lambda ev: after.set())
    assert after.wait(TIMEOUT)
    assert wait_until(lambda: timer.state("after") == "completed")
    assert (timer.state("boom"), timer.state("exits")) == ("failed", "failed")
    assert timer.stats()["failed"] == 2
    assert [t.is_alive() for t in timer_threads()] == [True, True]


def test_cancelling_a_running_task_sets_its_event_and_completion_waits_for_the_return(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    timer = make_timer(workers=1)
    started = threading.Event()
    saw_cancel = threading.Event()
    release = threading.Event()

    def cooperative(cancel_event: threading.Event) -> None:
        started.set()
        if cancel_event.wait(TIMEOUT):
            saw_cancel.set()
        release.wait(TIMEOUT)

    timer.schedule("x", 0.0, 0, cooperative)
    timer.start()
    assert started.wait(TIMEOUT)
    assert timer.cancel("x") is True
    assert saw_cancel.wait(TIMEOUT)
    # Signalled, but fn has not returned: the timer must not call it finished yet.
    assert timer.state("x") == "running"
    assert timer.stats()["cancelled"] == 0
    release.set()
    assert wait_until(lambda: timer.state("x") == "completed")


def test_schedule_during_and_after_close_raises_timer_closed(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    timer = make_timer(workers=1)
    started = threading.Event()
    release = threading.Event()
    timer.schedule("busy", 0.0, 0, lambda ev: (started.set(), release.wait(TIMEOUT)))
    timer.start()
    assert started.wait(TIMEOUT)
    closer = threading.Thread(target=timer.close, name="test-closer")
    closer.start()
    assert wait_until(lambda: timer.stats()["status"] == "closing")
    with pytest.raises(TimerClosed):
        timer.schedule("during", 0.0, 0, noop)
    assert closer.is_alive()  # still waiting for the claimed task
    release.set()
    closer.join(TIMEOUT)
    assert not closer.is_alive()
    with pytest.raises(TimerClosed):
        timer.schedule("after", 0.0, 0, noop)
    assert timer.state("busy") == "completed"


def test_close_waits_for_running_work_cancels_pending_work_and_leaves_no_threads() -> None:
    timer = PriorityTimer(workers=2)
    started = threading.Event()
    finished = threading.Event()

    def slow(cancel_event: threading.Event) -> None:
        started.set()
        time.sleep(0.2)  # close() must sit through this, not cut it short
        finished.set()

    timer.schedule("slow", 0.0, 0, slow)
    timer.schedule("later", time.monotonic() + 3600, 0, noop)
    timer.start()
    assert started.wait(TIMEOUT)
    timer.close(wait=True)
    assert finished.is_set()
    assert timer.state("slow") == "completed"
    assert timer.state("later") == "cancelled"
    assert timer.stats()["status"] == "closed"
    assert timer_threads() == []


def test_close_called_from_inside_a_task_does_not_deadlock(make_timer: Callable[..., PriorityTimer]) -> None:
    timer = make_timer(workers=1)
    timer.schedule("closer", 0.0, 0, lambda ev: timer.close(wait=True))
    timer.start()
    assert wait_until(lambda: timer.stats()["status"] == "closed")
    assert timer.state("closer") == "completed"


def test_an_injected_clock_jump_runs_due_tasks_in_key_order_only_after_the_clock_gets_there(
    make_timer: Callable[..., PriorityTimer],
) -> None:
    clock = FakeClock(0.0)
    timer = make_timer(workers=1, clock=clock)
    order: list[str] = []
    for task_id, run_at, priority in [("c", 30.0, 0), ("b", 20.0, 0), ("a2", 10.0, 1), ("a1", 10.0, 9)]:
        timer.schedule(task_id, run_at, priority, lambda ev, t=task_id: order.append(t))
    timer.start()

    # Real time passing does not matter; only the injected clock does. Wait for a full dispatcher pass.
    clock.set(15.0)
    wakeups = timer.stats()["wakeups"]
    timer.wake()
    assert wait_until(lambda: timer.stats()["completed"] == 2 and timer.stats()["wakeups"] > wakeups)
    assert order == ["a1", "a2"]

    clock.set(5.0)  # a jump backwards delays nothing that already ran and runs nothing early
    wakeups = timer.stats()["wakeups"]
    timer.wake()
    assert wait_until(lambda: timer.stats()["wakeups"] > wakeups)
    assert (timer.state("b"), timer.state("c")) == ("pending", "pending")

    clock.set(1000.0)
    timer.wake()
    assert wait_until(lambda: timer.stats()["completed"] == 4)
    assert order == ["a1", "a2", "b", "c"]


def test_start_twice_is_an_error(make_timer: Callable[..., PriorityTimer]) -> None:
    timer = make_timer(workers=1)
    timer.start()
    with pytest.raises(RuntimeError):
        timer.start()
