"""The worker service on the real database: claims, fencing, retries, overlap, cancel races, heartbeat, reaper."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.db.models import F

from core.choices import ScheduleState
from core.clock import db_now
from dispatch import counters, tasks
from dispatch.engine import execution, retry
from dispatch.engine.claims import Claim, Drop, EnvelopeClaim, claim_many, try_claim
from dispatch.engine.execution import complete, run_claimed
from dispatch.engine.leases import LeaseRenewer, reap_expired_leases
from dispatch.engine.retry import RunResult
from dispatch.engine.settler import SETTLE_AFTER_SECONDS, settle_params
from dispatch.identity import utc_key
from dispatch.models import Attempt, Occurrence, OccurrenceState, OutboxMessage
from dispatch.outbox import Fire, enqueue
from dispatch.sql import database_conninfo
from dispatch.sql import outbox as outbox_sql
from dispatch.wire import BODY_VERSION, encode_body
from schedules import services
from schedules.models import Schedule
from tests import handlers as test_handlers
from tests.handlers import effects, ensure_effects_table
from tests.support import wait_for

WORKER = "test-worker"
# Fires of the recent past: the materializer would have produced them; any partition (or DEFAULT) takes them.
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
LATE_OK = 24 * 3600
HOUR = timedelta(hours=1)


# --- fixtures and helpers -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _stop_worker_threads() -> Iterator[None]:
    """The envelope runner and the heartbeat keep threads (and connections) per process: end them with the module,
    or the test database could not be dropped at the end of the session."""
    yield
    tasks.shutdown()


@pytest.fixture
def committed(transactional_db, tenant_a):
    """Committed rows, which other threads and processes see; the transactional test's flush removes them."""
    ensure_effects_table()
    return tenant_a.tenant


@pytest.fixture
def make_schedule(make_schedule) -> Callable[..., Schedule]:
    """The shared factory, with a fresh name for each schedule of this module."""

    def make(tenant, **fields: Any) -> Schedule:
        # BASE lies 30 minutes back: a lateness these schedules accept, or the claim's misfire rule would end
        # every fire as missed (tests/integration/test_worker_misfire.py covers that rule).
        fields = {"name": f"worker-{uuid.uuid4().hex[:8]}", "max_lateness_seconds": LATE_OK, **fields}
        return make_schedule(tenant, **fields)

    return make


@pytest.fixture
def add_occurrence(make_occurrence) -> Callable[..., Occurrence]:
    """An occurrence `minute` minutes after BASE, enqueued (its envelope taken by the relay) unless told otherwise."""

    def add(schedule: Schedule, *, minute: int = 0, state: str = OccurrenceState.ENQUEUED, **fields: Any) -> Occurrence:
        return make_occurrence(schedule, at=BASE + timedelta(minutes=minute), state=state, **fields)

    return add


def claim_of(occurrence: Occurrence, now: datetime | None = None) -> Claim | None:
    outcome = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now)
    return outcome if isinstance(outcome, Claim) else None


def run_and_complete(claimed: Claim, now: datetime | None = None, *, renew_lease: bool = False) -> str:
    return complete(claimed, run_claimed(claimed, renew_lease=renew_lease), now=now)


def state_of(occurrence: Occurrence) -> str:
    occurrence.refresh_from_db()
    return occurrence.state


def attempts_of(occurrence: Occurrence) -> list[tuple[int, str, str]]:
    return list(
        Attempt.objects.filter(occurrence_id=occurrence.occurrence_id)
        .order_by("generation")
        .values_list("generation", "outcome", "error_class")
    )


def envelopes_for(occurrence: Occurrence) -> int:
    return OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence.occurrence_id]).count()


def metric(name: str, **labels: str) -> float:
    """A counter's total as /metrics serves it (stored, plus what this process has not flushed yet)."""
    return counters.stored_value(name.removesuffix("_total"), **labels)


def calls_of(occurrence: Occurrence) -> list[Any]:
    """Handler contexts this process passed for the occurrence (tests.handlers records them)."""
    return [c for c in list(test_handlers.CALLS) if c.occurrence_id == occurrence.occurrence_id]


def in_threads(*targets: Callable[[], Any]) -> list[Any]:
    """Run the targets at once (a barrier lines them up) and return their results; each thread closes its own
    database connection."""
    barrier = threading.Barrier(len(targets))
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def body(index: int, target: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = target()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return results


def settle_published(min_age: float = 0.0) -> int:
    """One settle statement of the relay over every envelope stamped `min_age` seconds ago or earlier; returns the
    occurrences it found."""
    with connection.cursor() as cursor:
        cursor.execute(outbox_sql.SETTLE_PUBLISHED, settle_params(1000, 1000, min_age))
        return cursor.fetchone()[0]


# --- claim, run, complete ---------------------------------------------------------------------------------------


def test_a_claimed_occurrence_runs_its_handler_once_and_succeeds(tenant, make_schedule, add_occurrence):
    ensure_effects_table()
    occurrence = add_occurrence(make_schedule(tenant, handler="effect", payload={"k": "v"}))

    claimed = claim_of(occurrence)
    assert claimed is not None
    assert (claimed.generation, claimed.payload, claimed.handler) == (1, {"k": "v"}, "effect")
    assert state_of(occurrence) == OccurrenceState.RUNNING
    assert occurrence.lease_expires_at > occurrence.scheduled_for

    assert run_and_complete(claimed) == OccurrenceState.SUCCEEDED

    assert state_of(occurrence) == OccurrenceState.SUCCEEDED
    assert occurrence.finished_at is not None and occurrence.lease_expires_at is None
    assert attempts_of(occurrence) == [(1, "succeeded", "")]
    assert effects() == {occurrence.occurrence_id: 1}


def test_a_scheduled_occurrence_not_yet_settled_by_the_relay_is_claimable(tenant, make_schedule, add_occurrence):
    occurrence = add_occurrence(make_schedule(tenant, handler="noop"), state=OccurrenceState.SCHEDULED)

    assert claim_of(occurrence) is not None


def test_a_duplicate_delivery_of_a_running_occurrence_is_dropped_and_counted(tenant, make_schedule, add_occurrence):
    occurrence = add_occurrence(make_schedule(tenant))
    before = metric("scheduler_worker_claim_drops_total", reason="duplicate")
    assert claim_of(occurrence) is not None

    duplicate = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER)

    assert duplicate == Drop("duplicate", OccurrenceState.RUNNING)
    assert metric("scheduler_worker_claim_drops_total", reason="duplicate") == before + 1
    assert attempts_of(occurrence) == [(1, "", "")]


@pytest.mark.parametrize(
    "state",
    [
        OccurrenceState.SUCCEEDED,
        OccurrenceState.DEAD,
        OccurrenceState.MISSED,
        OccurrenceState.CANCELED,
        OccurrenceState.SKIPPED_OVERLAP,
    ],
)
def test_a_delivery_of_a_terminal_occurrence_is_dropped_and_changes_nothing(
    tenant, state, make_schedule, add_occurrence
):
    occurrence = add_occurrence(make_schedule(tenant), state=state)

    assert try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER) == Drop("terminal", state)
    assert state_of(occurrence) == state
    assert attempts_of(occurrence) == []


def test_a_delivery_of_an_unknown_occurrence_is_dropped(tenant):
    outcome = try_claim(uuid.uuid4(), BASE, WORKER)

    assert outcome == Drop("unknown", None)


def test_a_retry_delivered_before_its_time_is_an_early_duplicate_and_dropped(tenant, make_schedule, add_occurrence):
    now = db_now()
    occurrence = add_occurrence(make_schedule(tenant), state=OccurrenceState.RETRY_WAIT, attempt_count=1)
    Occurrence.objects.filter(pk=occurrence.pk).update(available_at=now + timedelta(seconds=60))

    assert try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER, now=now).reason == "early"
    claimed = claim_of(occurrence, now=now + timedelta(seconds=60))
    assert claimed is not None and claimed.generation == 2


def test_an_old_generation_is_fenced_after_its_lease_expired_and_a_new_attempt_claimed(
    tenant, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = 30
    ensure_effects_table()
    occurrence = add_occurrence(make_schedule(tenant, handler="effect"))
    now = db_now()
    first = claim_of(occurrence, now=now)
    assert claim_of(occurrence, now=now + timedelta(seconds=29)) is None  # lease still live: a duplicate

    second = claim_of(occurrence, now=now + timedelta(seconds=31))
    assert second is not None and second.generation == 2

    assert complete(first, retry.RunResult("succeeded"), now=now + timedelta(seconds=32)) == "fenced"
    assert state_of(occurrence) == OccurrenceState.RUNNING
    assert occurrence.attempt_count == 2
    assert run_and_complete(second) == OccurrenceState.SUCCEEDED
    assert attempts_of(occurrence) == [(1, "fenced", ""), (2, "succeeded", "")]
    assert effects() == {occurrence.occurrence_id: 1}


def test_a_fenced_attempt_does_not_run_its_handler(tenant, make_schedule, add_occurrence):
    ensure_effects_table()
    occurrence = add_occurrence(make_schedule(tenant, handler="effect"))
    now = db_now()
    first = claim_of(occurrence, now=now)
    assert claim_of(occurrence, now=now + timedelta(hours=1)) is not None

    result = run_claimed(first, renew_lease=False)

    assert result.outcome == "fenced"
    assert effects() == {}


def test_transient_failures_back_off_with_equal_jitter_up_to_max_attempts_then_dead(
    tenant, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 10
    settings.SCHEDULER_RETRY_CAP_SECONDS = 25
    occurrence = add_occurrence(make_schedule(tenant, handler="fail_transient", max_attempts=3))
    now = db_now()

    for attempt, ceiling in ((1, 10), (2, 20)):
        claimed = claim_of(occurrence, now=now)
        assert claimed.generation == attempt
        assert run_and_complete(claimed, now=now) == OccurrenceState.RETRY_WAIT
        occurrence.refresh_from_db()
        assert occurrence.lease_expires_at is None and occurrence.finished_at is None
        wait = occurrence.available_at - now
        assert timedelta(seconds=ceiling / 2) <= wait <= timedelta(seconds=ceiling)
        assert envelopes_for(occurrence) == attempt  # each retry travels in a new envelope
        now = occurrence.available_at

    last = claim_of(occurrence, now=now)
    assert run_and_complete(last, now=now) == OccurrenceState.DEAD

    assert state_of(occurrence) == OccurrenceState.DEAD
    assert occurrence.finished_at == now
    assert attempts_of(occurrence) == [(n, "failed", "transient") for n in (1, 2, 3)]
    assert Attempt.objects.get(occurrence_id=occurrence.occurrence_id, generation=3).error == (
        "TransientError: attempt 3 fails on purpose"
    )
    assert envelopes_for(occurrence) == 2


def test_a_schedules_retry_policy_is_the_one_its_retries_wait_by(tenant, settings, make_schedule, add_occurrence):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 1
    settings.SCHEDULER_RETRY_CAP_SECONDS = 300
    schedule = make_schedule(tenant, handler="fail_transient", max_attempts=3, retry_base_seconds=60)
    occurrence = add_occurrence(schedule)
    now = db_now()

    assert run_and_complete(claim_of(occurrence, now=now), now=now) == OccurrenceState.RETRY_WAIT

    occurrence.refresh_from_db()
    # Its own base (60 s: the first wait is 30-60 s, not the platform's 0.5-1 s), under the platform's cap of 300 s
    # as its own cap is null.
    assert timedelta(seconds=30) <= occurrence.available_at - now <= timedelta(seconds=60)


def test_the_backoff_ceiling_doubles_per_attempt_up_to_the_cap():
    class Top:
        @staticmethod
        def uniform(low: float, high: float) -> float:
            return high

    ceilings = [retry.retry_backoff(n, base=1, cap=300, rng=Top()) for n in (1, 2, 3, 9, 10, 20)]

    assert ceilings == [1, 2, 4, 256, 300, 300]


def test_a_handler_that_fails_then_succeeds_has_one_effect_after_its_retries(
    tenant, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_RETRY_BASE_SECONDS = 0
    ensure_effects_table()
    occurrence = add_occurrence(make_schedule(tenant, handler="fail_then_succeed", payload={"failures": 2}))

    outcomes = [run_and_complete(claim_of(occurrence)) for _ in range(3)]

    assert outcomes == [OccurrenceState.RETRY_WAIT, OccurrenceState.RETRY_WAIT, OccurrenceState.SUCCEEDED]
    assert attempts_of(occurrence) == [(1, "failed", "transient"), (2, "failed", "transient"), (3, "succeeded", "")]
    assert effects() == {occurrence.occurrence_id: 1}


def test_an_unexpected_exception_is_retried_as_transient(tenant, make_schedule, add_occurrence):
    occurrence = add_occurrence(make_schedule(tenant, handler="crash"))

    assert run_and_complete(claim_of(occurrence)) == OccurrenceState.RETRY_WAIT
    assert attempts_of(occurrence) == [(1, "failed", "transient")]


def test_a_permanent_error_goes_dead_at_once_with_attempts_left(tenant, make_schedule, add_occurrence):
    occurrence = add_occurrence(make_schedule(tenant, handler="fail_permanent", max_attempts=5))

    assert run_and_complete(claim_of(occurrence)) == OccurrenceState.DEAD

    assert attempts_of(occurrence) == [(1, "failed", "permanent")]
    assert envelopes_for(occurrence) == 0


def test_an_unknown_handler_goes_dead(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant)
    # The control plane refuses unknown names; a handler module missing on this worker looks the same.
    Schedule.objects.filter(pk=schedule.pk).update(handler="not_deployed_here")
    occurrence = add_occurrence(schedule)

    assert run_and_complete(claim_of(occurrence)) == OccurrenceState.DEAD
    assert Attempt.objects.get(occurrence_id=occurrence.occurrence_id).error == "unknown handler 'not_deployed_here'"


def test_the_handler_receives_its_context(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant, handler="sleep", payload={"seconds": 0})
    occurrence = add_occurrence(schedule)
    claimed = claim_of(occurrence)

    run_and_complete(claimed)

    (context,) = calls_of(occurrence)
    assert (context.schedule_id, context.tenant_id, context.scheduled_for) == (
        schedule.id,
        tenant.id,
        occurrence.scheduled_for,
    )
    assert (context.attempt, context.payload, context.handler) == (1, {"seconds": 0}, "sleep")
    assert not context.cancel_event.is_set()
    assert context.deadline > claimed.claimed_at
    assert 0 < context.seconds_left() <= settings.SCHEDULER_HANDLER_TIMEOUT_SECONDS


# --- version re-check and cancel -----------------------------------------------------------------------------


def test_a_claim_cancels_an_occurrence_whose_schedule_was_canceled(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant)
    occurrence = add_occurrence(schedule)
    # As if the cancel's invalidation had not reached this row (e.g. the occurrence was inserted concurrently).
    Schedule.objects.filter(pk=schedule.pk).update(state=ScheduleState.CANCELED)

    assert try_claim(occurrence.occurrence_id, occurrence.scheduled_for, WORKER).reason == "schedule_changed"
    assert state_of(occurrence) == OccurrenceState.CANCELED
    assert attempts_of(occurrence) == []


def test_a_claim_cancels_an_occurrence_of_an_older_schedule_version(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant)
    occurrence = add_occurrence(schedule)
    Schedule.objects.filter(pk=schedule.pk).update(version=F("version") + 1)

    assert claim_of(occurrence) is None
    assert state_of(occurrence) == OccurrenceState.CANCELED


def test_a_forced_occurrence_of_an_older_version_runs_but_a_cancel_still_withdraws_it(
    tenant, make_schedule, add_occurrence
):
    """Backfill and replay set `forced`: an operator asked for that very fire, so a newer version does not
    withdraw it; a canceled schedule still does."""
    schedule = make_schedule(tenant)
    forced = add_occurrence(schedule, forced=True)
    Schedule.objects.filter(pk=schedule.pk).update(version=F("version") + 1)

    claimed = claim_of(forced)
    assert claimed is not None
    assert run_and_complete(claimed) == OccurrenceState.SUCCEEDED

    another = add_occurrence(schedule, minute=1, forced=True)
    Schedule.objects.filter(pk=schedule.pk).update(state=ScheduleState.CANCELED)
    assert claim_of(another) is None
    assert state_of(another) == OccurrenceState.CANCELED


def test_a_cancel_between_claim_and_side_effect_wins(tenant, make_schedule, add_occurrence):
    ensure_effects_table()
    schedule = make_schedule(tenant, handler="effect")
    occurrence = add_occurrence(schedule)
    claimed = claim_of(occurrence)

    result = services.cancel_schedule(schedule, actor="test")
    assert [i.occurrence_id for i in result.in_flight] == [occurrence.occurrence_id]

    assert run_and_complete(claimed) == OccurrenceState.CANCELED
    assert effects() == {}
    assert attempts_of(occurrence) == [(1, "canceled", "")]


def test_an_update_between_claim_and_side_effect_withdraws_the_old_version(tenant, make_schedule, add_occurrence):
    ensure_effects_table()
    schedule = make_schedule(tenant, handler="effect")
    occurrence = add_occurrence(schedule)
    claimed = claim_of(occurrence)

    services.update_schedule(schedule, {"priority": 5}, actor="test")

    assert run_and_complete(claimed) == OccurrenceState.CANCELED
    assert effects() == {}


# --- overlap policies -------------------------------------------------------------------------------------------


def test_skip_if_running_skips_an_occurrence_while_another_runs(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant, overlap_policy="skip_if_running")
    first, second = add_occurrence(schedule, minute=0), add_occurrence(schedule, minute=1)
    claimed = claim_of(first)

    assert try_claim(second.occurrence_id, second.scheduled_for, WORKER).reason == "overlap_skipped"
    assert state_of(second) == OccurrenceState.SKIPPED_OVERLAP
    assert second.finished_at is not None

    run_and_complete(claimed)
    third = add_occurrence(schedule, minute=2)
    assert claim_of(third) is not None


def test_skip_if_running_ignores_a_predecessor_whose_lease_expired(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant, overlap_policy="skip_if_running")
    first, second = add_occurrence(schedule, minute=0), add_occurrence(schedule, minute=1)
    now = db_now()
    claim_of(first, now=now)

    assert claim_of(second, now=now + timedelta(hours=1)) is not None


def test_queue_one_parks_one_occurrence_behind_a_running_one_and_skips_the_rest(
    tenant, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_OVERLAP_RECHECK_SECONDS = 5
    schedule = make_schedule(tenant, overlap_policy="queue_one")
    first, second, third = (add_occurrence(schedule, minute=n) for n in range(3))
    now = db_now()
    running = claim_of(first, now=now)

    assert try_claim(second.occurrence_id, second.scheduled_for, WORKER, now=now).reason == "overlap_waiting"
    assert state_of(second) == OccurrenceState.RETRY_WAIT
    assert (second.attempt_count, second.available_at) == (0, now + timedelta(seconds=5))
    assert envelopes_for(second) == 1
    assert try_claim(third.occurrence_id, third.scheduled_for, WORKER, now=now).reason == "overlap_skipped"
    assert state_of(third) == OccurrenceState.SKIPPED_OVERLAP

    # Rechecked while the predecessor still runs: it keeps waiting, with a new envelope.
    later = now + timedelta(seconds=5)
    assert try_claim(second.occurrence_id, second.scheduled_for, WORKER, now=later).reason == "overlap_waiting"
    assert envelopes_for(second) == 2

    complete(running, retry.RunResult("succeeded"), now=later)
    claimed = claim_of(second, now=later + timedelta(seconds=5))
    assert claimed is not None and claimed.generation == 1


def test_skip_if_running_lets_exactly_one_of_two_concurrent_claims_run(committed, make_schedule, add_occurrence):
    for _ in range(5):
        schedule = make_schedule(committed, overlap_policy="skip_if_running")
        occurrences = [add_occurrence(schedule, minute=n) for n in range(2)]

        claims = in_threads(*(lambda o=o: claim_of(o) for o in occurrences))

        assert sum(c is not None for c in claims) == 1
        assert Counter(state_of(o) for o in occurrences) == {
            OccurrenceState.RUNNING: 1,
            OccurrenceState.SKIPPED_OVERLAP: 1,
        }


def test_queue_one_under_concurrency_runs_one_parks_one_and_skips_one(committed, make_schedule, add_occurrence):
    for _ in range(3):
        schedule = make_schedule(committed, overlap_policy="queue_one")
        occurrences = [add_occurrence(schedule, minute=n) for n in range(3)]

        in_threads(*(lambda o=o: claim_of(o) for o in occurrences))

        assert Counter(state_of(o) for o in occurrences) == {
            OccurrenceState.RUNNING: 1,
            OccurrenceState.RETRY_WAIT: 1,
            OccurrenceState.SKIPPED_OVERLAP: 1,
        }


def test_a_cancel_racing_a_claim_ends_canceled_and_unrun_or_running_and_reported_in_flight(
    committed, make_schedule, add_occurrence
):
    seen = set()
    for _ in range(8):
        schedule = make_schedule(committed, handler="effect")
        occurrence = add_occurrence(schedule)

        claimed, canceled = in_threads(
            lambda occurrence=occurrence: claim_of(occurrence),
            lambda schedule=schedule: services.cancel_schedule(schedule, actor="test"),
        )

        in_flight = [i.occurrence_id for i in canceled.in_flight]
        if claimed is None:
            assert state_of(occurrence) == OccurrenceState.CANCELED
            assert in_flight == []
            seen.add("canceled")
        else:
            assert state_of(occurrence) == OccurrenceState.RUNNING
            assert in_flight == [occurrence.occurrence_id]
            # The re-check before the side effect still withdraws it.
            assert run_and_complete(claimed) == OccurrenceState.CANCELED
            seen.add("in_flight")
    assert effects() == {}
    assert seen  # which side wins is up to the scheduler of the machine; both are correct


# --- heartbeat --------------------------------------------------------------------------------------------------


def run_in_background(claimed: Claim) -> tuple[threading.Thread, dict[str, str]]:
    result: dict[str, str] = {}

    def body() -> None:
        try:
            result["outcome"] = run_and_complete(claimed, renew_lease=True)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, result


def test_the_heartbeat_renews_the_lease_so_the_reaper_leaves_a_long_handler_alone(
    committed, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = 1.5
    occurrence = add_occurrence(make_schedule(committed, handler="sleep", payload={"seconds": 3, "effect": True}))
    claimed = claim_of(occurrence)

    thread, result = run_in_background(claimed)
    reaped = 0
    while thread.is_alive():
        reaped += reap_expired_leases()
        thread.join(timeout=0.2)

    assert reaped == 0
    assert result == {"outcome": OccurrenceState.SUCCEEDED}
    attempt = Attempt.objects.get(occurrence_id=occurrence.occurrence_id)
    assert attempt.heartbeat_at > attempt.started_at + timedelta(seconds=1)
    assert effects() == {occurrence.occurrence_id: 1}


def test_a_lost_lease_raises_the_cancel_event_and_the_late_completion_is_fenced(
    committed, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = 1.5
    occurrence = add_occurrence(make_schedule(committed, handler="sleep", payload={"seconds": 20, "effect": True}))
    first = claim_of(occurrence)
    thread, result = run_in_background(first)
    wait_for(lambda: calls_of(occurrence))

    # Another worker takes over, as if the lease had run out while this one was paused.
    second = claim_of(occurrence, now=db_now() + timedelta(seconds=5))
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert result == {"outcome": "fenced"}
    assert second is not None and state_of(occurrence) == OccurrenceState.RUNNING
    assert attempts_of(occurrence) == [(1, "fenced", "transient"), (2, "", "")]
    assert effects() == {}


def test_a_schedule_canceled_while_its_handler_runs_cancels_the_handler(
    committed, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = 1.5
    schedule = make_schedule(committed, handler="sleep", payload={"seconds": 20, "effect": True})
    occurrence = add_occurrence(schedule)
    thread, result = run_in_background(claim_of(occurrence))
    wait_for(lambda: calls_of(occurrence))

    canceled = services.cancel_schedule(schedule, actor="test")
    thread.join(timeout=10)

    assert [i.occurrence_id for i in canceled.in_flight] == [occurrence.occurrence_id]
    assert result == {"outcome": OccurrenceState.CANCELED}
    assert attempts_of(occurrence) == [(1, "canceled", "")]
    assert effects() == {}


# --- reaper -----------------------------------------------------------------------------------------------------


def test_the_reaper_returns_an_expired_lease_to_retry_wait_with_a_new_envelope(
    tenant, settings, make_schedule, add_occurrence
):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = 30
    occurrence = add_occurrence(make_schedule(tenant))
    now = db_now()
    claim_of(occurrence, now=now)

    assert reap_expired_leases(now=now + timedelta(seconds=29)) == 0
    assert reap_expired_leases(now=now + timedelta(seconds=31)) >= 1

    assert state_of(occurrence) == OccurrenceState.RETRY_WAIT
    assert occurrence.available_at == now + timedelta(seconds=31)
    assert occurrence.lease_expires_at is None
    assert envelopes_for(occurrence) == 1
    assert attempts_of(occurrence) == [(1, "expired", "transient")]
    claimed = claim_of(occurrence, now=now + timedelta(seconds=32))
    assert claimed is not None and claimed.generation == 2


def test_the_reaper_sends_an_occurrence_without_attempts_left_to_dead(tenant, make_schedule, add_occurrence):
    occurrence = add_occurrence(make_schedule(tenant, max_attempts=1))
    now = db_now()
    claim_of(occurrence, now=now)

    reap_expired_leases(now=now + timedelta(hours=1))

    assert state_of(occurrence) == OccurrenceState.DEAD
    assert envelopes_for(occurrence) == 0


def test_the_reaper_cancels_an_expired_occurrence_whose_schedule_was_canceled(tenant, make_schedule, add_occurrence):
    schedule = make_schedule(tenant)
    occurrence = add_occurrence(schedule)
    now = db_now()
    claim_of(occurrence, now=now)
    services.cancel_schedule(schedule, actor="test")

    reap_expired_leases(now=now + timedelta(hours=1))

    assert state_of(occurrence) == OccurrenceState.CANCELED
    assert envelopes_for(occurrence) == 0


# --- the Celery task, called in-process ---------------------------------------------------------------------


def envelope_of(*occurrences: Occurrence) -> dict[str, Any]:
    """The task's argument as the relay delivers it: the envelope body the outbox stores."""
    tenant_id = occurrences[0].tenant_id if occurrences else 0
    body = encode_body(tenant_id, "scheduler.strict", [(o.occurrence_id, o.scheduled_for) for o in occurrences])
    return json.loads(body)[0][0]


def test_the_task_runs_every_occurrence_of_an_envelope_and_drops_unknown_ones(committed, make_schedule, add_occurrence):
    schedule = make_schedule(committed, handler="effect")
    occurrences = [add_occurrence(schedule, minute=n) for n in range(5)]
    content = envelope_of(*occurrences)
    content["fires"].setdefault(utc_key(BASE), []).append(str(uuid.uuid4()))

    outcomes = tasks.run_envelope(content)

    assert outcomes == {OccurrenceState.SUCCEEDED: 5, "dropped": 1}
    assert {state_of(o) for o in occurrences} == {OccurrenceState.SUCCEEDED}
    assert effects() == {o.occurrence_id: 1 for o in occurrences}
    assert tasks.run_envelope(content) == {"dropped": 6}  # a redelivery re-offers nothing terminal


def test_the_task_runs_the_occurrences_of_an_envelope_in_parallel(committed, make_schedule, add_occurrence, settings):
    # A turn long enough for all six to start (the end of a turn is tested in test_worker_isolation.py).
    settings.SCHEDULER_ENVELOPE_SLICE_SECONDS = 30
    schedule = make_schedule(committed, handler="sleep", payload={"seconds": 1})
    occurrences = [add_occurrence(schedule, minute=n) for n in range(6)]

    started = db_now()
    outcomes = tasks.run_envelope(envelope_of(*occurrences))
    # The task returns once only slow handlers are left; those complete themselves on the pool.
    wait_for(lambda: {state_of(o) for o in occurrences} == {OccurrenceState.SUCCEEDED})
    elapsed = (max(o.finished_at for o in occurrences) - started).total_seconds()

    assert outcomes.get(OccurrenceState.SUCCEEDED, 0) + outcomes.get("detached", 0) == 6, outcomes
    assert elapsed < 3.5


@pytest.mark.parametrize(
    "content",
    [
        None,
        "garbage",
        {"v": 99, "occurrences": []},
        {"v": BODY_VERSION, "fires": "nope"},
        {"v": BODY_VERSION, "fires": {"2026-01-01T00:00:00.000000Z": ["not-a-uuid"]}},
        {"v": BODY_VERSION, "fires": {"yesterday": [str(uuid.uuid4())]}},
    ],
    ids=["none", "string", "version", "not-a-list", "bad-uuid", "bad-instant"],
)
def test_the_task_logs_and_drops_a_malformed_envelope_without_raising(db, content, caplog):
    before = metric("scheduler_worker_dropped_messages_total", reason="malformed_envelope")

    assert tasks.run_envelope(content) == {}

    assert metric("scheduler_worker_dropped_messages_total", reason="malformed_envelope") == before + 1
    assert any(r.action == "malformed_envelope" for r in caplog.records if hasattr(r, "action"))


def test_the_task_drops_a_message_with_extra_arguments():
    assert tasks.run_envelope({"v": BODY_VERSION, "fires": {}}, "extra") == {}


# --- the batched path decides as the one-by-one path does -------------------------------------------------------


def mixed_situations(tenant, make_schedule, add_occurrence, make_occurrence) -> list[Occurrence]:
    """One occurrence per situation a delivery can meet; the same rows for either path."""
    ordinary = make_schedule(tenant)
    finished = add_occurrence(make_schedule(tenant), state=OccurrenceState.SUCCEEDED)
    canceled = make_schedule(tenant)
    canceled_fire = add_occurrence(canceled)
    services.cancel_schedule(canceled, actor="t")
    late = make_schedule(tenant, max_lateness_seconds=60)
    late_fire = make_occurrence(late, at=db_now() - timedelta(hours=2), state=OccurrenceState.ENQUEUED)
    early = add_occurrence(
        make_schedule(tenant), state=OccurrenceState.RETRY_WAIT, attempt_count=1, available_at=db_now() + HOUR
    )
    overlapping = make_schedule(tenant, overlap_policy="skip_if_running")
    running_sibling = add_occurrence(overlapping, minute=0)
    assert claim_of(running_sibling) is not None
    skipped = add_occurrence(overlapping, minute=1)
    expired = add_occurrence(
        make_schedule(tenant), state=OccurrenceState.RUNNING, attempt_count=1, lease_expires_at=db_now() - HOUR
    )
    Attempt.objects.create(
        occurrence_id=expired.occurrence_id,
        scheduled_for=expired.scheduled_for,
        generation=1,
        worker="gone",
        started_at=BASE,
    )
    return [add_occurrence(ordinary, minute=3), finished, canceled_fire, late_fire, early, skipped, expired]


def outcome_rows(occurrences: list[Occurrence]) -> list[tuple[str, int, str, list[tuple[int, str]]]]:
    rows = []
    for occurrence in occurrences:
        occurrence.refresh_from_db()
        attempts = [(a, o) for a, o, _ in attempts_of(occurrence)]
        reason = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", occurrence.state_reason)  # each path has its own rows
        rows.append((occurrence.state, occurrence.attempt_count, reason, attempts))
    return rows


def test_an_envelope_claimed_in_one_batch_ends_each_occurrence_as_one_by_one_claims_do(
    committed, make_schedule, add_occurrence, make_occurrence
):
    alone = mixed_situations(committed, make_schedule, add_occurrence, make_occurrence)
    batched = mixed_situations(committed, make_schedule, add_occurrence, make_occurrence)
    unknown = (uuid.uuid4(), BASE)

    for occurrence in alone:
        execution.process_occurrence(occurrence.occurrence_id, occurrence.scheduled_for, WORKER)
    content = envelope_of(*batched)
    content["fires"].setdefault(utc_key(BASE), []).append(str(unknown[0]))
    outcomes = tasks.run_envelope(content)

    assert outcome_rows(batched) == outcome_rows(alone)
    states = [row[0] for row in outcome_rows(batched)]
    assert states == [
        OccurrenceState.SUCCEEDED,  # ordinary
        OccurrenceState.SUCCEEDED,  # finished before: untouched
        OccurrenceState.CANCELED,
        OccurrenceState.MISSED,
        OccurrenceState.RETRY_WAIT,  # an early duplicate of a retry
        OccurrenceState.SKIPPED_OVERLAP,  # decided alone: its schedule's row is locked first
        OccurrenceState.SUCCEEDED,  # taken over from an expired lease, generation 2
    ]
    assert outcomes == {OccurrenceState.SUCCEEDED: 2, "dropped": 6}


def test_a_batched_completion_and_the_relay_settling_the_same_occurrences_never_deadlock(
    committed, make_schedule, add_occurrence
):
    """Both change many occurrence rows in one statement; they lock them in one order, whatever order they are given
    in. Before, a settle batch and a completion locking crosswise deadlocked (one rolled back, its envelope retried)."""
    schedule = make_schedule(committed)
    for round_ in range(6):
        occurrences = [add_occurrence(schedule, minute=1000 * round_ + n) for n in range(150)]
        claims = [claim_of(o) for o in occurrences]
        with connection.cursor() as cursor:
            # The envelope lists them in the reverse of the order the completion gives them in.
            enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in reversed(occurrences)], size=1000)
            cursor.execute("UPDATE dispatch_outboxmessage SET published_at = clock_timestamp()")

        done, settled = in_threads(
            lambda claims=claims: execution.complete_many([(c, RunResult("succeeded")) for c in claims]),
            settle_published,
        )

        assert set(done.values()) == {OccurrenceState.SUCCEEDED} and len(done) == 150
        assert settled == 150
        assert {state_of(o) for o in occurrences} == {OccurrenceState.SUCCEEDED}


def test_a_lease_renewal_and_the_relay_settling_the_same_occurrences_never_deadlock(
    committed, make_schedule, add_occurrence
):
    schedule = make_schedule(committed)
    for round_ in range(6):
        occurrences = [add_occurrence(schedule, minute=1000 * round_ + n) for n in range(150)]
        claims = [claim_of(o) for o in occurrences]
        renewer = LeaseRenewer()
        renewer.register_many([(c, threading.Event()) for c in reversed(claims)], time.monotonic() + 60)
        with connection.cursor() as cursor:
            enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in occurrences], size=1000)
            cursor.execute("UPDATE dispatch_outboxmessage SET published_at = clock_timestamp()")

        try:
            renewed, settled = in_threads(renewer.renew_once, settle_published)
        finally:
            renewer.stop()

        assert (renewed, settled) == (150, 150)
        OutboxMessage.objects.all().delete()


def test_a_batched_claim_and_the_relay_settling_the_same_occurrences_never_deadlock(
    committed, make_schedule, add_occurrence
):
    """Both lock many occurrence rows in one statement; given in opposite orders, each still locks in primary-key
    order, so one waits for the other and both finish with every row."""
    schedule = make_schedule(committed)
    for round_ in range(6):
        occurrences = [
            add_occurrence(schedule, minute=1000 * round_ + n, state=OccurrenceState.SCHEDULED) for n in range(150)
        ]
        with connection.cursor() as cursor:
            enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in occurrences], size=1000)
            cursor.execute("UPDATE dispatch_outboxmessage SET published_at = clock_timestamp()")
        pairs = [(o.occurrence_id, o.scheduled_for) for o in reversed(occurrences)]

        claimed, settled = in_threads(lambda pairs=pairs: claim_many(pairs, WORKER), settle_published)

        assert settled == 150
        assert len(claimed.claims) == 150 and claimed.alone == []
        assert not OutboxMessage.objects.exists()


def test_a_row_another_transaction_holds_is_waited_for_and_claimed_in_the_batch(
    committed, make_schedule, add_occurrence
):
    """Held rows used to be skipped and decided one by one afterwards: seven single-row statements each, ~3 % of the
    fires under steady load (the relay's settle step holds them for tens of milliseconds)."""
    schedule = make_schedule(committed)
    occurrences = [add_occurrence(schedule, minute=n, state=OccurrenceState.SCHEDULED) for n in range(5)]
    held = occurrences[2]
    result: list[EnvelopeClaim] = []

    def claim() -> None:
        try:
            result.append(claim_many([(o.occurrence_id, o.scheduled_for) for o in occurrences], WORKER))
        finally:
            connection.close()

    with psycopg.connect(database_conninfo()) as other:
        other.execute(
            "SELECT 1 FROM dispatch_occurrence WHERE occurrence_id = %s AND scheduled_for = %s FOR UPDATE",
            (held.occurrence_id, held.scheduled_for),
        )
        claimer = threading.Thread(target=claim)
        claimer.start()
        time.sleep(0.5)
        assert claimer.is_alive(), "the claim must wait for the held row, not leave it out"
        other.commit()
    claimer.join(timeout=10)

    (claimed,) = result
    assert claimed.alone == [] and claimed.drops == []
    assert sorted(c.occurrence_id for c in claimed.claims) == sorted(o.occurrence_id for o in occurrences)


def test_settling_leaves_a_fresh_stamp_for_the_workers_completion_and_takes_it_once_it_is_old_enough(
    tenant_a, make_schedule, add_occurrence
):
    """The relay settles an envelope SETTLE_AFTER_SECONDS after its stamp: settled at once, its occurrences were
    still being claimed, and the settle statement and the claim waited for each other's row locks and both wrote
    each row. A second later the worker has usually completed them and copied the stamp itself."""
    schedule = make_schedule(tenant_a.tenant)
    fresh, old = (add_occurrence(schedule, minute=n, state=OccurrenceState.SCHEDULED) for n in range(2))
    with connection.cursor() as cursor:
        enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in (fresh, old)], size=1)
        cursor.execute(
            "UPDATE dispatch_outboxmessage SET published_at = clock_timestamp() - CASE WHEN %s = ANY(occurrence_ids)"
            " THEN interval '5 seconds' ELSE interval '0 seconds' END",
            [old.occurrence_id],
        )
    assert settle_published(min_age=SETTLE_AFTER_SECONDS) == 1
    assert list(OutboxMessage.objects.values_list("occurrence_ids", flat=True)) == [[fresh.occurrence_id]]
    assert Occurrence.objects.get(pk=old.pk).state == OccurrenceState.ENQUEUED
    assert Occurrence.objects.get(pk=fresh.pk).state == OccurrenceState.SCHEDULED, "settled before its second passed"
    assert settle_published(min_age=0.0) == 1
    assert not OutboxMessage.objects.exists()
    assert Occurrence.objects.get(pk=fresh.pk).state == OccurrenceState.ENQUEUED


def test_a_bursts_big_envelopes_do_not_hold_back_the_small_ones_stamped_after_them(
    tenant_a, make_schedule, add_occurrence
):
    """Settling takes a statement's small envelopes and a few big ones each in stamp order, not all in one line: a
    burst's envelopes, full of fires, were rows to write ahead of every steady envelope stamped after them."""
    schedule = make_schedule(tenant_a.tenant)
    big_fires = outbox_sql.SMALL_ENVELOPE_FIRES + 1
    burst = [add_occurrence(schedule, minute=n, state=OccurrenceState.SCHEDULED) for n in range(2 * big_fires)]
    steady = [add_occurrence(schedule, minute=100 + n, state=OccurrenceState.SCHEDULED) for n in range(3)]
    with connection.cursor() as cursor:
        enqueue(cursor, [Fire.of(o, available_at=BASE) for o in burst], size=big_fires)
        enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in steady], size=1)
        cursor.execute(
            "UPDATE dispatch_outboxmessage SET published_at = clock_timestamp()"
            " - CASE WHEN cardinality(occurrence_ids) > 1 THEN interval '10 seconds' ELSE interval '5 seconds' END"
        )
        cursor.execute(outbox_sql.SETTLE_PUBLISHED, settle_params(len(steady), 1, 0.0))
    left = list(OutboxMessage.objects.values_list("occurrence_ids", flat=True))
    assert len(left) == 1 and len(left[0]) == big_fires, "one big envelope per statement of three small ones"
    settled = Occurrence.objects.filter(state=OccurrenceState.ENQUEUED).values_list("occurrence_id", flat=True)
    assert {o.occurrence_id for o in steady} <= set(settled), "the small envelopes stamped later were settled"
    assert len(settled) == len(steady) + big_fires


@pytest.mark.parametrize(
    ("limit", "big_limit", "index"), [(20, 0, "outbox_published_small"), (0, 20, "outbox_published_big")]
)
def test_each_settle_class_reads_its_own_index_of_stamped_envelopes(db, limit, big_limit, index):
    """Each class of SETTLE_PUBLISHED names its predicate as its partial index does, so its scan walks only its own
    envelopes: through one index for both, a small statement fetched every big envelope stamped before its own (a
    burst's thousands) to test its class, and settled the steady ones ten times slower per envelope for seconds."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the empty test table would be read whole otherwise
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN " + outbox_sql.SETTLE_PUBLISHED, settle_params(limit, big_limit, 1.0))
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert f"Index Scan using {index} on dispatch_outboxmessage" in plan


def test_a_completion_copies_its_stamped_envelopes_confirmation_and_settling_writes_the_row_no_more(
    tenant_a, make_schedule, add_occurrence
):
    """Under steady load the worker completes most fires before the relay's settle step reaches their envelope: the
    completion copies the stamp (and the throttled mark) onto the row it writes anyway, and settling then only
    deletes the envelope and counts the first publish, without a second write of the row. A fire whose envelope
    was not stamped yet, or that came without an envelope id, is settled as before."""
    schedule = make_schedule(tenant_a.tenant)
    stamped, unstamped, unnamed = (
        add_occurrence(schedule, minute=n, state=OccurrenceState.SCHEDULED) for n in range(3)
    )
    with connection.cursor() as cursor:
        enqueue(cursor, [Fire.of(o, available_at=o.available_at) for o in (stamped, unstamped, unnamed)], size=1)
    envelope = {
        o.occurrence_id: OutboxMessage.objects.get(occurrence_ids__contains=[o.occurrence_id]).id
        for o in (stamped, unstamped, unnamed)
    }
    confirmed_at = db_now()
    OutboxMessage.objects.filter(id__in=[envelope[stamped.occurrence_id], envelope[unnamed.occurrence_id]]).update(
        published_at=confirmed_at, throttled=True
    )
    claims = [claim_of(o) for o in (stamped, unstamped, unnamed)]
    assert all(claims)
    execution.complete_many(
        [(c, RunResult("succeeded")) for c in claims],
        envelopes={o.occurrence_id: envelope[o.occurrence_id] for o in (stamped, unstamped)},
    )
    stamped.refresh_from_db()
    assert (stamped.state, stamped.enqueued_at, stamped.throttled) == ("succeeded", confirmed_at, True)
    assert Occurrence.objects.get(pk=unstamped.pk).enqueued_at is None, "its envelope was not confirmed yet"
    assert Occurrence.objects.get(pk=unnamed.pk).enqueued_at is None, "the message did not name its envelope"

    OutboxMessage.objects.filter(id=envelope[unstamped.occurrence_id]).update(published_at=confirmed_at)
    with connection.cursor() as cursor:
        cursor.execute("SELECT occurrence_id, xmin::text FROM dispatch_occurrence")
        versions = dict(cursor.fetchall())
    assert settle_published() == 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT occurrence_id, xmin::text FROM dispatch_occurrence")
        rewritten = {key for key, xmin in cursor.fetchall() if versions[key] != xmin}
        cursor.execute(
            "SELECT labels ->> 'le', value FROM dispatch_metric_counter WHERE name = %s",
            ["scheduler_throttled_lag_seconds_count"],
        )
        throttled_counts = cursor.fetchall()
    assert rewritten == {unstamped.occurrence_id, unnamed.occurrence_id}, "the completed, stamped row is not rewritten"
    assert not OutboxMessage.objects.exists()
    assert {o.occurrence_id: Occurrence.objects.get(pk=o.pk).enqueued_at for o in (unstamped, unnamed)} == {
        unstamped.occurrence_id: confirmed_at,
        unnamed.occurrence_id: confirmed_at,
    }
    assert [value for _, value in throttled_counts] == [2.0], "both throttled first publishes counted once each"
