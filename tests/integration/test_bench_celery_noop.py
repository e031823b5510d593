"""`bench celery-noop`: Celery's own floor, one message per noop task, through a real worker and RabbitMQ."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from kombu import Connection

from dispatch.bench.celery_noop import CeleryNoopBenchmark, CeleryNoopConfig

pytestmark = pytest.mark.slow


def test_every_task_published_runs_once_and_the_rate_is_reported_and_the_queue_removed(settings):
    out = StringIO()

    call_command("bench", "celery-noop", "--tasks", "300", "--concurrency", "2", stdout=out)

    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert (result["tasks"], result["executed"], result["concurrency"]) == (300, 300, 2)
    assert result["executed_per_s"] > 0
    with Connection(settings.CELERY_BROKER_URL) as broker, pytest.raises(Exception, match="NOT_FOUND"):
        broker.channel().queue_declare(CeleryNoopBenchmark(CeleryNoopConfig(tasks=1)).queue, passive=True)


@pytest.mark.parametrize("option", ["--tasks", "--concurrency"])
def test_a_count_below_one_is_refused_with_its_name(option):
    args = {"--tasks": "10", "--concurrency": "2", option: "0"}
    with pytest.raises(CommandError, match=f"{option} must be at least 1"):
        call_command("bench", "celery-noop", *[x for pair in args.items() for x in pair])
