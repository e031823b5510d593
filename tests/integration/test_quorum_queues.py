"""The lanes on RabbitMQ quorum queues (SCHEDULER_QUEUE_TYPE=quorum): the relay and the workers declare the same
queue type, and fires flow end to end, each run once."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest

from core.clock import db_now
from dispatch.models import Attempt, Occurrence, OccurrenceState
from dispatch.queues import crowd_queue
from tests.integration.test_quotas_processes import STRICT, consumers, due_fires, fleet
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
__all__ = ["fleet"]  # the fixture, imported for this module's tests


def queue_types() -> dict[str, str]:
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "type"], capture_output=True, text=True, timeout=60
    )
    return dict(line.split("\t")[:2] for line in listing.stdout.splitlines() if "\t" in line)


def test_fires_run_once_through_quorum_queues(tenant_a, make_schedule, fleet):
    fleet("relay", SCHEDULER_QUEUE_TYPE="quorum")
    fleet("worker", SCHEDULER_QUEUE_TYPE="quorum")
    wait_for(lambda: consumers(STRICT) == 1, 60, "the worker to consume")
    types = queue_types()
    assert (types.get(STRICT), types.get(crowd_queue(STRICT))) == ("quorum", "quorum"), "the crowd queue is one too"

    occurrences = due_fires(make_schedule, tenant_a.tenant, 150, db_now() + timedelta(seconds=1))
    ids = [o.occurrence_id for o in occurrences]
    wait_for(
        lambda: Occurrence.objects.filter(occurrence_id__in=ids, state=OccurrenceState.SUCCEEDED).count() == 150,
        60,
        "every fire to run",
    )
    assert Attempt.objects.filter(occurrence_id__in=ids).count() == 150, "each ran once"
