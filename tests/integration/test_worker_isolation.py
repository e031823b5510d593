"""The envelope runner keeps each tenant within its share of the process's pool and each envelope within one turn
of the process, on committed rows (its pool threads have connections of their own)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from core.clock import db_now
from dispatch import counters, tasks
from dispatch.engine.envelope_runner import EnvelopeRunner
from dispatch.models import Attempt, Occurrence, OccurrenceState, OutboxMessage
from schedules.models import Schedule
from schedules.services import cancel_schedule
from tests import handlers as test_handlers
from tests.handlers import effects, ensure_effects_table
from tests.support import wait_for

WORKER = "isolation-worker"
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, scope="module")
def _stop_worker_threads() -> Iterator[None]:
    """The lease renewer and the counters' flusher keep a thread (and a connection) per process."""
    yield
    tasks.shutdown()


@pytest.fixture(autouse=True)
def _tables(transactional_db) -> None:
    ensure_effects_table()
    test_handlers.ensure_windows_table()


@pytest.fixture
def runner() -> Iterator[EnvelopeRunner]:
    """A pool of eight threads, half of them one tenant's share at most."""
    pool = EnvelopeRunner(8, tenant_share=0.5)
    yield pool
    pool.close()


@pytest.fixture
def fires(make_schedule, make_occurrence) -> Callable[..., list[Occurrence]]:
    """`count` enqueued occurrences a second apart, minutes ago, of a new schedule of `tenant`."""

    def make(tenant, count: int, **fields: Any) -> list[Occurrence]:
        schedule = make_schedule(tenant, name=f"iso-{uuid.uuid4().hex[:8]}", max_lateness_seconds=3600, **fields)
        return [
            make_occurrence(schedule, at=BASE + timedelta(seconds=n), state=OccurrenceState.ENQUEUED)
            for n in range(count)
        ]

    return make


def run(runner: EnvelopeRunner, occurrences: list[Occurrence]) -> dict[str, int]:
    return dict(runner.run([(o.occurrence_id, o.scheduled_for) for o in occurrences], WORKER))


def rows(occurrences: list[Occurrence]) -> list[Occurrence]:
    return list(Occurrence.objects.filter(pk__in=[o.pk for o in occurrences]))


def states(occurrences: list[Occurrence]) -> set[str]:
    return {o.state for o in rows(occurrences)}


def attempts(occurrences: list[Occurrence]) -> list[tuple[int, str]]:
    found = Attempt.objects.filter(occurrence_id__in=[o.occurrence_id for o in occurrences])
    return sorted(found.values_list("generation", "outcome"))


def running_count(tenant) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT running FROM dispatch_tenant_running WHERE tenant_id = %s", [tenant.id])
        row = cursor.fetchone()
    return row[0] if row else 0


def claims_counted() -> float:
    return counters.stored_value("scheduler_worker_claims")


def test_a_tenants_handlers_never_hold_more_than_its_share_of_the_threads(tenant_a, fires, settings):
    settings.SCHEDULER_ENVELOPE_SLICE_SECONDS = 60  # every handler starts within the envelope's turn
    pool = EnvelopeRunner(8, tenant_share=0.25)
    try:
        occurrences = fires(tenant_a.tenant, 10, handler="timed", payload={"seconds": 0.2})

        outcomes = run(pool, occurrences)
        wait_for(lambda: states(occurrences) == {OccurrenceState.SUCCEEDED}, 15, "every handler to complete")
    finally:
        pool.close()

    # The last ones may be left to complete themselves once nothing else is left to start (slow handlers).
    assert outcomes.get(OccurrenceState.SUCCEEDED, 0) + outcomes.get("detached", 0) == 10, outcomes

    assert test_handlers.peak_concurrency() == 2, "two of eight threads, never more, and no fewer"
    assert attempts(occurrences) == [(1, "succeeded")] * 10


def test_at_the_end_of_its_turn_an_envelope_hands_back_what_has_not_started_and_leaves_the_rest_running(
    tenant_a, fires, runner, settings
):
    settings.SCHEDULER_ENVELOPE_SLICE_SECONDS = 0.5
    occurrences = fires(tenant_a.tenant, 6, handler="sleep", payload={"seconds": 2, "effect": True})
    claims_before = claims_counted()

    assert run(runner, occurrences) == {"handed_back": 2, "detached": 4}

    started = [o for o in rows(occurrences) if o.state == OccurrenceState.RUNNING]
    handed = [o for o in rows(occurrences) if o.state == OccurrenceState.RETRY_WAIT]
    assert (len(started), len(handed)) == (4, 2), "four ran on the tenant's share; the task returned without them"
    # Handed back under their own ids, as if never claimed: no attempt, the generation the next claim takes unchanged.
    assert {(o.attempt_count, o.state_reason) for o in handed} == {
        (0, "handed back: not started within the envelope's 0.5 s turn on the worker")
    }
    assert attempts(handed) == []
    (envelope,) = OutboxMessage.objects.filter(occurrence_ids__overlap=[o.occurrence_id for o in handed])
    assert sorted(envelope.occurrence_ids) == sorted(o.occurrence_id for o in handed)
    assert envelope.available_at <= db_now(), "due at once: behind what is queued, not after a wait"
    assert claims_counted() - claims_before == 4, "a claim handed back unstarted is not counted"

    # The handlers left running complete themselves, fenced and counted as ever.
    wait_for(lambda: states(started) == {OccurrenceState.SUCCEEDED}, 15, "the detached handlers to complete")
    assert running_count(tenant_a.tenant) == 0, "every running slot given back, the handed-back ones' too"
    # Delivered again, they run under the generation they would have had (the task leaves them running: they
    # are slow, and complete themselves).
    assert run(runner, handed) == {"detached": 2}
    wait_for(lambda: states(handed) == {OccurrenceState.SUCCEEDED}, 15, "the handed-back ones to run")
    assert attempts(occurrences) == [(1, "succeeded")] * 6
    assert effects() == {o.occurrence_id: 1 for o in occurrences}


def test_a_tenant_whose_share_is_held_by_slow_handlers_is_parked_at_claim_while_another_tenant_runs(
    tenant_a, tenant_b, fires, runner, settings
):
    settings.SCHEDULER_ENVELOPE_SLICE_SECONDS = 0.3
    hanging = fires(tenant_a.tenant, 4, handler="sleep", payload={"seconds": 3})
    assert run(runner, hanging) == {"detached": 4}
    wait_for(lambda: runner.share.blocked(tenant_a.tenant.id, 0.3), 5, "the handlers to count as slow")

    more = fires(tenant_a.tenant, 3, handler="effect")
    other = fires(tenant_b.tenant, 3, handler="effect")
    assert run(runner, more) == {"parked": 3}
    assert run(runner, other) == {OccurrenceState.SUCCEEDED: 3}

    assert states(hanging) == {OccurrenceState.RUNNING}, "tenant B ran while tenant A's handlers hung"
    assert {(o.state, o.attempt_count, o.state_reason) for o in rows(more)} == {
        (
            OccurrenceState.RETRY_WAIT,
            0,
            "waiting for the worker pool: its share of the worker's pool (4 of 8 threads) is held by slow handlers",
        )
    }
    assert attempts(more) == []
    (envelope,) = OutboxMessage.objects.filter(occurrence_ids__overlap=[o.occurrence_id for o in more])
    assert envelope.available_at > db_now(), "offered again after a recheck delay, not at once"
    assert effects() == {o.occurrence_id: 1 for o in other}
    wait_for(lambda: states(hanging) == {OccurrenceState.SUCCEEDED}, 15, "the slow handlers to end")


def test_a_bundle_of_two_tenants_runs_each_within_its_own_share_and_a_hanging_one_holds_back_only_itself(
    tenant_a, tenant_b, fires, runner, settings
):
    """The relay sends small envelopes due together as one message: each tenant's part waits in a queue of its own,
    so tenant A's hanging handlers take A's share and nothing of B's, and B's part is claimed and completed with
    A's in the same batches."""
    settings.SCHEDULER_ENVELOPE_SLICE_SECONDS = 1.0
    hanging = fires(tenant_a.tenant, 6, handler="sleep", payload={"seconds": 3})
    quick = fires(tenant_b.tenant, 5, handler="effect")
    parts = [
        (tenant_a.tenant.id, [(o.occurrence_id, o.scheduled_for) for o in hanging]),
        (tenant_b.tenant.id, [(o.occurrence_id, o.scheduled_for) for o in quick]),
    ]

    outcomes = dict(runner.run_parts(parts, WORKER))

    assert outcomes == {OccurrenceState.SUCCEEDED: 5, "detached": 4, "handed_back": 2}, outcomes
    assert effects() == {o.occurrence_id: 1 for o in quick}, "tenant B ran once each, beside A's hanging handlers"
    assert sorted(o.state for o in rows(hanging)) == [OccurrenceState.RETRY_WAIT] * 2 + [OccurrenceState.RUNNING] * 4
    wait_for(lambda: OccurrenceState.RUNNING not in states(hanging), 15, "the slow handlers to end")
    assert running_count(tenant_a.tenant) == running_count(tenant_b.tenant) == 0


def test_a_cancel_after_the_batched_claim_stops_every_handler_that_starts_later_than_half_a_second_after_it(
    tenant_a, fires, settings
):
    """The batched claim's own read of the schedule is the pre-check of handlers that start within half a second of
    it (no second read of the rows it has just written); one that starts later, here behind its tenant's single
    thread, checks again before its side effect, and a cancel since the claim wins."""
    settings.SCHEDULER_ENVELOPE_SLICE_SECONDS = 60  # every handler starts within the envelope's turn
    ensure_effects_table()
    pool = EnvelopeRunner(2, tenant_share=0.5)  # one thread for the tenant: the handlers run one after another
    ran: list[dict[str, int]] = []
    try:
        occurrences = fires(tenant_a.tenant, 3, handler="sleep", payload={"seconds": 0.8, "effect": True})
        schedule = Schedule.objects.get(pk=occurrences[0].schedule_id)
        envelope = threading.Thread(target=lambda: ran.append(run(pool, occurrences)))
        envelope.start()
        wait_for(lambda: effects() or OccurrenceState.RUNNING in states(occurrences), 10, "the envelope claimed")
        cancel_schedule(schedule, actor="test")
        envelope.join(30)
    finally:
        pool.close()
    started = [call.occurrence_id for call in test_handlers.CALLS if call.schedule_id == schedule.id]
    assert len(started) == 1, "only the handler that started at once ran; the later two were stopped by their check"
    later = [o for o in rows(occurrences) if o.occurrence_id not in started]
    assert {(o.state, o.state_reason) for o in later} == {(OccurrenceState.CANCELED, "schedule canceled")}
    assert set(effects()) <= set(started)
