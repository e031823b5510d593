"""One tenant's slow handlers do not hold the workers: a real relay and a real `celery worker -c 2`, tenant A's
webhooks calling a target that answers one header line a second, tenant B's noop fires due meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from core.clock import db_now
from dispatch.models import TERMINAL_STATES, Attempt, Occurrence, OccurrenceState
from tests.integration.fleet import Fleet, running_fleet
from tests.integration.slow_target import SlowTarget, header_drip, slow_target
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMEOUT_SECONDS = 4
# What "on time" means here: the fire's handler started within this long of its release instant.
ON_TIME_SECONDS = 3.0


@pytest.fixture
def dripping() -> Iterator[SlowTarget]:
    """Answers 200, then one header line a second for two minutes: each line well within any read timeout."""
    yield from slow_target(header_drip(lines=120, every=1.0))


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with running_fleet("isolation") as running:
        yield running


@pytest.mark.exclusive  # its bounds are timings: measured on a box no other test is loading
def test_a_tenant_whose_webhooks_hang_does_not_delay_another_tenants_fires(
    tenant_a, tenant_b, make_schedule, fleet, dripping
):
    slow, other = tenant_a.tenant, tenant_b.tenant
    fleet.relay()
    fleet.worker(concurrency=2)
    fleet.wait_consuming()
    t0 = db_now().replace(microsecond=0) + timedelta(seconds=2)
    # Two envelopes, so both pool processes take one: on the old worker each held its process until the target
    # was done with it (two minutes), whatever timeout_seconds said.
    hanging = fleet.due(
        make_schedule,
        slow,
        24,
        t0,
        envelope=12,
        handler="webhook",
        payload={"url": dripping.url, "timeout_seconds": TIMEOUT_SECONDS},
        max_attempts=1,
    )
    on_time = [
        fleet.due(make_schedule, other, 10, t0 + timedelta(seconds=offset), envelope=250) for offset in (2, 5, 8)
    ]
    quick = [o for batch in on_time for o in batch]

    def finished(occurrences: list[Occurrence]) -> bool:
        ids = [o.occurrence_id for o in occurrences]
        return not Occurrence.objects.filter(occurrence_id__in=ids).exclude(state__in=TERMINAL_STATES).exists()

    wait_for(lambda: finished(quick), 40, "tenant B's fires to run")
    wait_for(lambda: finished(hanging), 120, "tenant A's calls to end")

    # B: every fire ran, and started within seconds of its instant, while A's calls were hanging.
    b_attempts = list(Attempt.objects.filter(occurrence_id__in=[o.occurrence_id for o in quick]))
    released = {o.occurrence_id: o.available_at for o in quick}
    assert len(b_attempts) == len(quick)
    assert {a.outcome for a in b_attempts} == {"succeeded"}
    late = {a.occurrence_id: (a.started_at - released[a.occurrence_id]).total_seconds() for a in b_attempts}
    assert max(late.values()) <= ON_TIME_SECONDS, sorted(late.values())[-5:]
    a_attempts = list(Attempt.objects.filter(occurrence_id__in=[o.occurrence_id for o in hanging]))
    # Every batch of B ran while A's backlog was outstanding; the first one while A's first calls were on the wire.
    # (Between A's rounds its envelopes wait for their share of the pool, so a later batch may fall in that wait.)
    started = {a.occurrence_id: a.started_at for a in b_attempts}
    starts = [min(started[o.occurrence_id] for o in batch) for batch in on_time]
    assert any(a.started_at < starts[0] < a.finished_at for a in a_attempts), "B ran while A's calls hung"
    a_window = (min(a.started_at for a in a_attempts), max(a.finished_at for a in a_attempts))
    assert all(a_window[0] < start < a_window[1] for start in starts), "B's later fires ran within A's backlog"

    # A: no call is a success; each ended at its deadline, one attempt each (waiting for a share of the pool, or
    # handed back to the queue, costs none).
    states = set(Occurrence.objects.filter(pk__in=[o.pk for o in hanging]).values_list("state", "state_reason"))
    assert states == {(OccurrenceState.DEAD, "attempts exhausted (1 of 1)")}
    assert len(a_attempts) == len(hanging)
    for attempt in a_attempts:
        assert (attempt.outcome, attempt.error_class) == ("failed", "transient")
        assert f"timed out: no complete answer within {TIMEOUT_SECONDS:.1f} s" in attempt.error
        took = (attempt.finished_at - attempt.started_at).total_seconds()
        assert TIMEOUT_SECONDS - 0.5 <= took <= TIMEOUT_SECONDS + 3, took
    calls = dripping.exchanges
    assert len(calls) == len(hanging)
    assert not any(call.answered for call in calls)
    assert all(call.sent_steps < 10 for call in calls), sorted(call.sent_steps for call in calls)
