"""Tenant quotas hold across processes: two real relays share one tenant's max_fires_per_second and keep a small
tenant's fires on time beside a big burst; two real Celery workers share one tenant's max_running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from amqp.exceptions import NotFound
from django.conf import settings
from django.db import connection
from kombu import Connection

from core.clock import db_now
from dispatch.models import Attempt, Occurrence, OccurrenceState
from dispatch.queues import queue_for_lane, with_crowds
from tenants.models import Tenant
from tests import handlers as test_handlers
from tests.integration.fleet import due_on
from tests.integration.processes import ROOT, manage, process_env
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
# The workers load the test handlers (SCHEDULER_HANDLER_MODULES); this process needs them to create the schedules.
assert test_handlers.timed

# Queues of this module's own, so no other test's messages mix with these.
STRICT = f"{queue_for_lane('strict')}.quota"
FLEXIBLE = f"{queue_for_lane('flexible')}.quota"
ENVELOPE = settings.SCHEDULER_ENVELOPE_SIZE


def fleet_env(**overrides: str) -> dict[str, str]:
    return process_env(
        SCHEDULER_STRICT_QUEUE=STRICT,
        SCHEDULER_FLEXIBLE_QUEUE=FLEXIBLE,
        SCHEDULER_HANDLER_MODULES="tests.handlers",
        SCHEDULER_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
        **overrides,
    )


@pytest.fixture
def fleet() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start relays and workers on this module's queues; all stopped (and the queues deleted) at the end."""
    started: list[subprocess.Popen] = []

    def start(role: str, **env: str) -> subprocess.Popen:
        if role == "relay":
            process = manage("relay", "--name", f"quota-relay-{uuid.uuid4().hex[:6]}", env=fleet_env(**env))
        else:
            command = [sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=prefork"]
            command += ["-c", "2", "--without-mingle", "--without-gossip", "--loglevel=WARNING"]
            command += ["-n", f"quota-{uuid.uuid4().hex[:8]}@%h"]
            process = subprocess.Popen(command, env=fleet_env(**env), cwd=ROOT, start_new_session=True)
        started.append(process)
        return process

    purge()
    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM) if role_is_group(process) else process.terminate()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        purge()


def role_is_group(process: subprocess.Popen) -> bool:
    """Workers run in a session of their own (their pool children go with them)."""
    try:
        return os.getpgid(process.pid) == process.pid
    except ProcessLookupError:
        return False


def purge() -> None:
    """Delete this module's queues, crowd queues too: the processes declare them again, of the type their settings
    say (RabbitMQ refuses a classic declaration of a queue a quorum test left behind)."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        for name in with_crowds(STRICT, FLEXIBLE):
            channel.queue_delete(name)


def due_fires(make_schedule, tenant: Tenant, count: int, at, **schedule_fields) -> list[Occurrence]:
    """`count` occurrences of one schedule due at `at`, with their envelopes on this module's strict queue, written
    in two statements (one at a time, 2,400 rows would take longer than the lead before `at`)."""
    return due_on(STRICT, make_schedule, tenant, count, at, **schedule_fields)


def relays_connected() -> int:
    """Relays of this module with a PostgreSQL session (each names its connection after itself)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'quota-relay-%%'"
        )
        return cursor.fetchone()[0]


def consumers(queue: str) -> int:
    """Consumers of `queue`; 0 while nobody has declared it yet."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, durable=True, passive=True).consumer_count
        except NotFound:
            return 0


def enqueued_lags(tenant: Tenant) -> list[float]:
    """Broker confirmation minus release instant, per occurrence of `tenant`, once settled."""
    rows = Occurrence.objects.filter(tenant_id=tenant.id, enqueued_at__isnull=False)
    return sorted((o.enqueued_at - o.available_at).total_seconds() for o in rows)


@pytest.mark.exclusive  # its bounds are timings: measured on a box no other test is loading
def test_two_relays_hold_a_tenant_to_its_fire_rate_and_keep_another_tenant_on_time(
    tenant_a, tenant_b, make_schedule, fleet
):
    rate, fires = 400, 2400
    throttled_tenant, other = tenant_a.tenant, tenant_b.tenant
    Tenant.objects.filter(pk=throttled_tenant.pk).update(max_fires_per_second=rate)
    fleet("relay")
    fleet("relay")
    wait_for(lambda: relays_connected() == 2, 60, "both relays to connect")
    # Far enough ahead that both tenants' rows are in the outbox before T0 even on a busy box: written after their
    # instant, the other tenant's fires would be late before any relay saw them.
    t0 = db_now().replace(microsecond=0) + timedelta(seconds=6)
    due_fires(make_schedule, throttled_tenant, fires, t0)
    due_fires(make_schedule, other, 300, t0)
    assert db_now() < t0 - timedelta(seconds=1), "the setup took longer than the lead: the test proves nothing"

    expected = fires + 300
    wait_for(
        lambda: Occurrence.objects.filter(enqueued_at__isnull=False).count() >= expected, 60, "every fire enqueued"
    )

    throttled = enqueued_lags(throttled_tenant)
    # The rate holds across both relays: by any instant, at most one second's burst plus the rate since T0, plus
    # one envelope per relay (an envelope is never split). The stamps are the relays' monotonic readings mapped
    # onto PostgreSQL's clock: 50 ms of slack for that mapping.
    for n, lag in enumerate(throttled, start=1):
        assert n <= rate + rate * (max(lag, 0) + 0.05) + 2 * ENVELOPE, (n, lag)
    assert throttled[-1] >= (fires - rate - 2 * ENVELOPE) / rate - 0.05, "the excess waited for tokens"
    assert throttled[-1] <= fires / rate + 3, "and left as tokens came, not much later"
    assert len(throttled) == fires, "none dropped"
    assert enqueued_lags(other)[-1] < 1.0, "the other tenant's fires left at their instant"

    marked = Occurrence.objects.filter(tenant_id=throttled_tenant.id, throttled=True).count()
    assert marked >= fires - rate - 2 * ENVELOPE, "fires that waited for the quota are told apart"
    assert not Occurrence.objects.filter(tenant_id=other.id, throttled=True).exists()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT throttled_fires, dispatched_fires FROM dispatch_tenant_fire_bucket WHERE tenant_id = %s",
            [throttled_tenant.id],
        )
        throttled_count, dispatched = cursor.fetchone()
    assert throttled_count == marked
    assert dispatched == fires


def test_two_workers_never_run_more_than_max_running_and_every_occurrence_still_runs_once(
    tenant_a, make_schedule, fleet
):
    limit, count = 3, 24
    tenant = tenant_a.tenant
    Tenant.objects.filter(pk=tenant.pk).update(max_running=limit)
    fleet("relay")
    fleet("worker", SCHEDULER_RUNNING_RECHECK_SECONDS="0.2", SCHEDULER_RUNNING_RECHECK_MAX_SECONDS="1")
    fleet("worker", SCHEDULER_RUNNING_RECHECK_SECONDS="0.2", SCHEDULER_RUNNING_RECHECK_MAX_SECONDS="1")
    wait_for(lambda: consumers(STRICT) == 2, 60, "both workers to consume")
    t0 = db_now().replace(microsecond=0) + timedelta(seconds=1)
    test_handlers.ensure_windows_table()
    occurrences = due_fires(make_schedule, tenant, count, t0, handler="timed", payload={"seconds": 0.4})

    ids = [o.occurrence_id for o in occurrences]
    wait_for(
        lambda: Occurrence.objects.filter(occurrence_id__in=ids, state=OccurrenceState.SUCCEEDED).count() == count,
        90,
        "every occurrence to succeed",
    )

    attempts = list(Attempt.objects.filter(occurrence_id__in=ids))
    assert len(attempts) == count, "one attempt each: waiting for a slot consumed none"
    # Measured inside the handler (the attempt's own timestamps are read before its slot is taken or given back).
    peak = test_handlers.peak_concurrency()
    assert peak <= limit, f"{peak} ran at once under max_running {limit}"
    assert peak == limit, "the quota, not the workers, was the bound"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT running, throttled_claims FROM dispatch_tenant_running WHERE tenant_id = %s", [tenant.id]
        )
        running_now, throttled_claims = cursor.fetchone()
    assert running_now == 0, "every slot given back"
    assert throttled_claims > 0, "claims over the quota were counted"
