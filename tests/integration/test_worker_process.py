"""A real `celery -A scheduler_project worker`: envelopes run once, a SIGKILL mid-handler is recovered by the
reaper and a new attempt, and bad messages are logged and dropped while good ones keep flowing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client as DjangoClient
from kombu import Connection, Exchange, Queue

from core.clock import db_now
from dispatch.engine.leases import reap_expired_leases
from dispatch.identity import utc_key
from dispatch.models import Attempt, Occurrence, OccurrenceState, OutboxMessage, ProcessHeartbeat
from dispatch.outbox import Fire, enqueue
from dispatch.queues import queue_for_lane
from dispatch.wire import BODY_VERSION, RUN_ENVELOPE_TASK, message_headers, task_id_for
from scheduler_project.celery import app
from tests.handlers import effects, ensure_effects_table
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
# Queues of this module's own, named after the suite's (which a run may set per checkout): a relay test running at
# the same time on the suite's queues, or another checkout's suite on the same broker, is not disturbed.
STRICT = f"{queue_for_lane('strict')}.worker"
FLEXIBLE = f"{queue_for_lane('flexible')}.worker"
WORKER_QUEUE = {queue_for_lane("strict"): STRICT, queue_for_lane("flexible"): FLEXIBLE}
LEASE_SECONDS = 3
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


# --- the worker process ---------------------------------------------------------------------------------------


class WorkerProcess:
    """`celery -A scheduler_project worker` on the test database, in its own process group, logging to a file."""

    def __init__(self) -> None:
        params = connection.settings_dict
        self.log = Path(tempfile.mkstemp(prefix="celery-worker-", suffix=".log")[1])
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings_test",
            "DATABASE_URL": f"postgres://{params.get('USER') or 'postgres'}@{params.get('HOST') or '127.0.0.1'}:"
            f"{params.get('PORT') or 5432}/{params['NAME']}",
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "SCHEDULER_STRICT_QUEUE": STRICT,
            "SCHEDULER_FLEXIBLE_QUEUE": FLEXIBLE,
            "SCHEDULER_HANDLER_MODULES": "tests.handlers",
            "SCHEDULER_WORKER_LEASE_SECONDS": str(LEASE_SECONDS),
            "SCHEDULER_LOG_LEVEL": "INFO",
            # Counts reach PostgreSQL (and /metrics) within half a second.
            "SCHEDULER_HEARTBEAT_SECONDS": "0.5",
            "PYTHONPATH": str(ROOT),
        }
        # No -Q: with the defaults the worker must consume both lanes. Mingle and gossip only slow the start.
        command = [sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=prefork", "-c", "2"]
        # The node name: its pool processes heartbeat (and claim) as "<node>@<host>/<pid>".
        self.node = f"test-{uuid.uuid4().hex[:8]}"
        command += ["--loglevel=INFO", "--without-mingle", "--without-gossip", "-n", f"{self.node}@%h"]
        with self.log.open("wb") as out:
            # A session of its own: SIGKILL reaches the pool children too, as when a machine dies.
            self.process = subprocess.Popen(
                command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self) -> None:
        wait_for(lambda: consumers(STRICT) > 0 and consumers(FLEXIBLE) > 0, 60, "the worker to consume both lanes")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group: no warm shutdown, no acknowledgement, no last heartbeat."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM to the main process), then SIGKILL whatever is left of the group."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            # Captured by pytest and shown only when the test failed.
            print(f"--- tail of the worker log {self.log.name} ---\n" + "\n".join(self.text().splitlines()[-150:]))
            self.log.unlink(missing_ok=True)


@pytest.fixture
def start_worker() -> Iterator[Callable[[], WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess()
        started.append(worker)
        worker.wait_ready()
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture
def tenant(tenant):
    """The shared acme tenant, with the effects table ready and this module's queues empty."""
    ensure_effects_table()
    purge()
    return tenant


# --- broker helpers ---------------------------------------------------------------------------------------------


def broker() -> Connection:
    return Connection(settings.CELERY_BROKER_URL)


def declared(name: str) -> Queue:
    # Exactly as the workers and the relay declare them: durable, classic, no arguments.
    return Queue(name, exchange=Exchange(""), routing_key=name, durable=True)


def purge() -> None:
    with broker() as conn:
        channel = conn.default_channel
        for name in (STRICT, FLEXIBLE):
            declared(name)(channel).declare()
            channel.queue_purge(name)


def consumers(name: str) -> int:
    with broker() as conn:
        return conn.default_channel.queue_declare(queue=name, durable=True, passive=True).consumer_count


def publish(body: bytes, *, queue: str = STRICT, headers: dict[str, Any] | None = None, **properties: Any) -> None:
    """A raw AMQP publish to the default exchange, the way the relay publishes stored envelope bodies."""
    properties.setdefault("content_type", "application/json")
    properties.setdefault("content_encoding", "utf-8")
    with broker() as conn:
        conn.Producer().publish(
            body, exchange="", routing_key=queue, headers=headers or {}, delivery_mode=2, **properties
        )


def publish_outbox(envelope: OutboxMessage) -> None:
    """What the relay does with an outbox row (to this module's queues)."""
    task_id = task_id_for(envelope.id)
    publish(
        bytes(envelope.body),
        queue=WORKER_QUEUE[envelope.queue],
        headers=message_headers(task_id, len(envelope.occurrence_ids)),
        correlation_id=task_id,
    )


def scraped() -> dict[str, float]:
    """/metrics as a scraper reads it, by sample."""
    text = DjangoClient(HTTP_HOST="localhost").get("/metrics").content.decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


# --- data helpers -----------------------------------------------------------------------------------------------


@pytest.fixture
def occurrences_of(make_schedule, make_occurrence) -> Callable[..., list[Occurrence]]:
    """`count` occurrences, a second apart ten minutes ago, of a new schedule on `lane`."""

    def make(tenant, *, count: int, lane: str = "strict", **data: Any) -> list[Occurrence]:
        # Fires ten minutes back: a lateness the schedule accepts (the claim's misfire rule is not tested here).
        fields = {"name": f"proc-{uuid.uuid4().hex[:8]}", "lane": lane, "max_lateness_seconds": 3600, **data}
        schedule = make_schedule(tenant, **fields)
        base = db_now().replace(microsecond=0) - timedelta(minutes=10)
        return [
            # released together: one envelope per lane
            make_occurrence(schedule, at=base + timedelta(seconds=n), available_at=base, lane=lane)
            for n in range(count)
        ]

    return make


def write_outbox(occurrences: list[Occurrence]) -> list[OutboxMessage]:
    fires = [
        Fire(o.occurrence_id, o.scheduled_for, o.tenant_id, queue_for_lane(o.lane), o.available_at, 0)
        for o in occurrences
    ]
    ids = [o.occurrence_id for o in occurrences]
    with connection.cursor() as cursor:
        enqueue(cursor, fires)
    return list(OutboxMessage.objects.filter(occurrence_ids__overlap=ids).order_by("id"))


def states(occurrences: list[Occurrence]) -> set[str]:
    return set(Occurrence.objects.filter(pk__in=[o.pk for o in occurrences]).values_list("state", flat=True))


def envelope_body(*pairs: tuple[uuid.UUID, Any]) -> dict[str, Any]:
    fires: dict[str, list[str]] = {}
    for occurrence_id, at in pairs:
        fires.setdefault(utc_key(at), []).append(str(occurrence_id))
    return {"v": BODY_VERSION, "tenant_id": 0, "queue": STRICT, "fires": fires}


# --- tests ------------------------------------------------------------------------------------------------------


def test_published_envelopes_run_each_occurrence_once_despite_duplicate_deliveries(
    tenant, start_worker, occurrences_of
):
    strict = occurrences_of(tenant, count=4, handler="effect")
    flexible = occurrences_of(tenant, count=3, lane="flexible", handler="effect")
    envelopes = write_outbox(strict + flexible)
    assert [len(e.occurrence_ids) for e in envelopes] == [4, 3]
    before = scraped()
    worker = start_worker()

    for envelope in envelopes * 2:  # every envelope delivered twice, as after a relay crash before its stamp
        publish_outbox(envelope)

    wait_for(lambda: states(strict + flexible) == {OccurrenceState.SUCCEEDED}, 30, "every occurrence to succeed")
    wait_for(
        lambda: all(worker.text().count(f"envelope {task_id_for(e.id)} done") == 2 for e in envelopes),
        30,
        "the duplicate deliveries to be processed",
    )
    assert effects() == {o.occurrence_id: 1 for o in strict + flexible}
    assert Attempt.objects.filter(occurrence_id__in=[o.occurrence_id for o in strict + flexible]).count() == 7
    assert worker.text().count("dropped delivery of occurrence") == 7
    assert worker.process.poll() is None

    # The worker's pool processes count what they did into PostgreSQL: /metrics, served by another process, has it.
    claims = "scheduler_worker_claims_total"
    wait_for(lambda: scraped().get(claims, 0) >= before.get(claims, 0) + 7, 15, "the worker's counts in /metrics")
    after = scraped()

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew(claims) == 7
    assert grew('scheduler_worker_completions_total{outcome="succeeded"}') == 7
    drops = sum(grew(f'scheduler_worker_claim_drops_total{{reason="{r}"}}') for r in ("terminal", "duplicate"))
    assert drops == 7, "the duplicate deliveries (finished or still running when they came)"
    assert grew('scheduler_start_lag_seconds_count{lane="strict"}') == 4
    assert grew('scheduler_start_lag_seconds_bucket{lane="strict",le="300.0"}') == 0, "ten minutes late"
    # Each pool process keeps a heartbeat of its own (the gauge also counts any other test's worker still live).
    own = ProcessHeartbeat.objects.filter(role="worker", name__startswith=f"{worker.node}@")
    assert own.count() == 2, "each pool process keeps a heartbeat"
    assert after['scheduler_live_processes{role="worker"}'] >= 2


@pytest.mark.parametrize("task_returned", [False, True], ids=["while-its-task-waits", "after-its-task-returned"])
def test_a_worker_killed_mid_handler_is_reaped_and_a_new_attempt_runs_with_one_effect(
    tenant, start_worker, settings, occurrences_of, task_returned
):
    settings.SCHEDULER_WORKER_LEASE_SECONDS = LEASE_SECONDS
    (occurrence,) = occurrences_of(tenant, count=1, handler="sleep", payload={"seconds": 3, "effect": True})
    (envelope,) = write_outbox([occurrence])
    first = start_worker()
    publish_outbox(envelope)
    wait_for(lambda: states([occurrence]) == {OccurrenceState.RUNNING}, 30, "the first attempt to start")
    if task_returned:
        # The task left the slow handler running under its lease and returned: the message is acknowledged, and
        # only the lease brings the work back.
        wait_for(lambda: "'detached': 1" in first.text(), 10, "the task to return")

    first.kill()
    # No heartbeat renews the lease any more; the reaper (run by the materializer) takes it back once it expires.
    wait_for(lambda: reap_expired_leases() > 0, LEASE_SECONDS + 10, "the reaper to take the expired lease")
    occurrence.refresh_from_db()
    assert (occurrence.state, occurrence.attempt_count) == (OccurrenceState.RETRY_WAIT, 1)
    assert list(Attempt.objects.filter(occurrence_id=occurrence.occurrence_id).values_list("outcome", flat=True)) == [
        "expired"
    ]

    second = start_worker()
    # The reaper's new envelope, published here as the relay would. The original envelope may reach the new worker
    # too: RabbitMQ requeues it if the worker died before its task returned (a task returns, and the message is
    # acknowledged, once the handler is left running under its lease). Either way a late duplicate of it is
    # published once the retry has succeeded, and is dropped.
    retry = OutboxMessage.objects.filter(occurrence_ids__contains=[occurrence.occurrence_id]).exclude(pk=envelope.pk)
    publish_outbox(retry.get())
    wait_for(lambda: states([occurrence]) == {OccurrenceState.SUCCEEDED}, 30, "the second attempt to succeed")
    publish_outbox(envelope)
    wait_for(lambda: "dropped delivery of occurrence" in second.text(), 15, "the duplicate to be dropped")

    occurrence.refresh_from_db()
    assert occurrence.attempt_count == 2
    attempts = Attempt.objects.filter(occurrence_id=occurrence.occurrence_id).order_by("generation")
    assert [(a.generation, a.outcome) for a in attempts] == [(1, "expired"), (2, "succeeded")]
    assert effects() == {occurrence.occurrence_id: 1}


def test_bad_messages_are_logged_and_dropped_and_the_worker_keeps_processing(tenant, start_worker, occurrences_of):
    good = occurrences_of(tenant, count=2, handler="effect")
    unknown_id = uuid.uuid4()
    worker = start_worker()
    headers = message_headers("bad-1", 1)

    # An envelope naming an occurrence that does not exist.
    publish(json.dumps([[envelope_body((unknown_id, good[0].scheduled_for))], {}, {}]).encode(), headers=headers)
    # A body that is not JSON at all, JSON that is not a Celery call (each of these once stopped the whole worker),
    # a content type the worker does not accept, and a task message without an id.
    publish(b"{not json", headers=message_headers("bad-2", 1))
    for n, body in enumerate([b'"just a string"', b"null", b"5", b"{}", b'{"args": 5}', b"[1, 2]", b"[[], 1, {}]"]):
        publish(body, headers=message_headers(f"bad-3-{n}", 1))
    publish(b"\x80garbage", headers=message_headers("bad-pickle", 1), content_type="application/x-python-serialize")
    publish(json.dumps([[], {}, {}]).encode(), headers={k: v for k, v in headers.items() if k != "id"})
    # A body Celery can call, but with an argument that is not an envelope, and with too many arguments.
    publish(json.dumps([["garbage"], {}, {}]).encode(), headers=message_headers("bad-4", 1))
    publish(json.dumps([[{"v": 1, "occurrences": []}, 2], {}, {}]).encode(), headers=message_headers("bad-5", 1))
    # A task this worker does not know, and a message that is no task at all.
    publish(json.dumps([[], {}, {}]).encode(), headers={**message_headers("bad-6", 0), "task": "no.such.task"})
    publish(b"hello", headers={}, content_type="text/plain")
    # Then good work, through the relay's format and through Celery's own client.
    publish(
        json.dumps([[envelope_body((good[0].occurrence_id, good[0].scheduled_for))], {}, {}]).encode(),
        headers=message_headers("good-1", 1),
    )
    app.send_task(
        RUN_ENVELOPE_TASK,
        args=[envelope_body((good[1].occurrence_id, good[1].scheduled_for))],
        queue=declared(FLEXIBLE),
    )

    wait_for(lambda: states(good) == {OccurrenceState.SUCCEEDED}, 30, "the good envelopes to run")
    log = worker.text()
    assert worker.process.poll() is None, log[-3000:]
    assert f"dropped delivery of occurrence {unknown_id}: unknown" in log
    assert re.search(r"dropped malformed envelope \(task bad-4\)", log)
    assert re.search(r"dropped malformed envelope \(task bad-5\)", log)
    assert "dropped message of unknown task 'no.such.task'" in log
    assert "Can't decode message body" in log
    assert log.count("dropped a message that is not a task: body is not [args, kwargs, embed]") == 7
    assert "task message without an id header" in log
    assert effects() == {o.occurrence_id: 1 for o in good}
    with broker() as conn:
        # Nothing was left behind or requeued in a loop.
        wait_for(lambda: conn.default_channel.queue_declare(STRICT, passive=True).message_count == 0, 10, "empty")
