"""The product's own relay and Celery worker on the clusters (quorum lanes over three RabbitMQ nodes, the multi-host
DATABASE_URL): a strict burst released while the node leading the strict queue is SIGKILLed runs every fire, each
under its own occurrence id, and the killed node rejoins. A small burst: the issue's 20,000-fire burst with p99 and
reconcile comes in a later increment (docs/DEPLOYMENT.md, "What is not measured yet")."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db.models import Count

from core.clock import db_now
from dispatch.models import Attempt, Occurrence, OccurrenceState
from tests import handlers as test_handlers
from tests.cluster.conftest import RabbitCluster, measured, wait_until
from tests.integration.fleet import Fleet, running_fleet

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]
# The workers load the test handlers (SCHEDULER_HANDLER_MODULES); this process needs them to create the schedules.
assert test_handlers.timed

FIRES = 2_000
ENVELOPE = 50
LEAD_SECONDS = 8.0


@pytest.fixture
def fleet(rabbit_cluster: RabbitCluster, pg_cluster) -> Iterator[Fleet]:
    with running_fleet(f"cluster-{uuid.uuid4().hex[:6]}") as fleet:
        yield fleet


def test_a_strict_burst_loses_nothing_when_the_strict_queues_leader_is_killed(
    rabbit_cluster: RabbitCluster, fleet: Fleet, tenant_a, make_schedule
):
    rabbit_cluster.assert_whole()
    fleet.relay(SCHEDULER_QUEUE_TYPE="quorum")
    fleet.worker(SCHEDULER_QUEUE_TYPE="quorum", concurrency=2)
    fleet.wait_consuming()
    leader = rabbit_cluster.node_of(rabbit_cluster.queue(1, fleet.strict)["leader"])

    release = db_now() + timedelta(seconds=LEAD_SECONDS)
    occurrences = fleet.due(make_schedule, tenant_a.tenant, FIRES, release, envelope=ENVELOPE)
    ids = [o.occurrence_id for o in occurrences]
    # At the release instant: the relay is publishing and the worker consuming when the leader's node goes.
    time.sleep(max(0.0, (release - db_now()).total_seconds()))
    rabbit_cluster.kill(leader)
    killed = time.monotonic()
    try:
        wait_until(
            lambda: Occurrence.objects.filter(occurrence_id__in=ids, state=OccurrenceState.SUCCEEDED).count() == FIRES,
            180,
            "every fire to run",
            every=1.0,
        )
        all_ran_after_kill = time.monotonic() - killed
        states = dict(
            Occurrence.objects.filter(occurrence_id__in=ids).values_list("state").annotate(n=Count("pk")).order_by()
        )
        runs = Attempt.objects.filter(occurrence_id__in=ids).values("occurrence_id").annotate(n=Count("pk"))
        rerun = sum(1 for row in runs if row["n"] > 1)
        # Enqueue lag: the broker's confirmation (enqueued_at, stamped by the relay) minus the release instant.
        lags = sorted(
            (enqueued - release).total_seconds()
            for enqueued in Occurrence.objects.filter(occurrence_id__in=ids).values_list("enqueued_at", flat=True)
        )
        measured(
            "product relay+worker, strict burst, strict-queue leader SIGKILLed at the release instant",
            fires=FIRES,
            succeeded=states.get(OccurrenceState.SUCCEEDED, 0),
            occurrences_run_more_than_once=rerun,
            seconds_from_kill_to_all_succeeded=round(all_ran_after_kill, 1),
            enqueue_lag_p50_s=round(lags[len(lags) // 2], 3),
            enqueue_lag_p99_s=round(lags[int(len(lags) * 0.99) - 1], 3),
            enqueue_lag_max_s=round(lags[-1], 3),
        )
        assert states == {OccurrenceState.SUCCEEDED: FIRES}
    finally:
        rabbit_cluster.rejoin(leader)
