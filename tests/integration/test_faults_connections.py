"""Real processes outlive their surroundings: a terminated database backend, a deleted queue, a broker restart.

Each test runs the product's own processes against committed rows and breaks what they depend on while they run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from kombu import Connection

from core.clock import db_now
from dispatch.models import Occurrence, OutboxMessage
from dispatch.queues import STRICT_QUEUE
from schedules.services import create_schedule
from tests.integration.processes import ROOT, manage, process_env

# seed_envelopes is a fixture of the relay tests, used here by name.
from tests.integration.test_relay_process import drain_queue, seed_envelopes  # noqa: F401
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Running:
    """A product process with its log in a file, stopped with SIGTERM at the end of the test."""

    def __init__(self, *args: str, command: list[str] | None = None, **env: str) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix=f"{args[0]}-", suffix=".log")[1])
        self._log = self.log_path.open("w")
        if command is None:
            self.process = manage(*args, env=process_env(**env), stdout=self._log, stderr=subprocess.STDOUT)
        else:
            self.process = subprocess.Popen(
                command, env=process_env(**env), cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def terminate_other_backends() -> int:
    """What a PostgreSQL restart or failover does to every client: their connections die mid-use."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def one_off_in(tenant, seconds: float, name: str):
    schedule, _ = create_schedule(
        tenant=tenant,
        data={"name": name, "kind": "once", "run_at": db_now() + timedelta(seconds=seconds), "handler": "noop"},
        actor="test",
    )
    return schedule


def published(schedule) -> bool:
    """The schedule's fire reached the broker (its envelope is stamped, or already settled onto the row)."""
    occurrence = Occurrence.objects.filter(schedule_id=schedule.id).first()
    if occurrence is None:
        return False
    if occurrence.enqueued_at is not None:
        return True
    return OutboxMessage.objects.filter(
        occurrence_ids__contains=[occurrence.occurrence_id], published_at__isnull=False
    ).exists()


def succeeded(schedule) -> bool:
    return Occurrence.objects.filter(schedule_id=schedule.id, state="succeeded").exists()


def test_materializer_relay_and_worker_reconnect_by_themselves_after_every_backend_is_terminated(tenant_a):
    drain_queue(STRICT_QUEUE)
    materializer = Running("materialize", "--name", "fault-materializer")
    relay = Running("relay", "--name", "fault-relay")
    node = f"fault-worker-{uuid.uuid4().hex[:6]}@%h"
    worker = Running(
        "worker",
        command=[sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=solo", "-n", node],
        PYTHONPATH=str(ROOT),
    )
    try:
        before = one_off_in(tenant_a.tenant, 2, "before-outage")
        wait_for(lambda: succeeded(before), 45, "a fire run through all three processes before the outage")

        assert terminate_other_backends() >= 3, "every process held a connection"
        after = one_off_in(tenant_a.tenant, 2, "after-outage")
        wait_for(lambda: succeeded(after), 60, "a fire run through all three processes after the outage")

        assert all(p.process.poll() is None for p in (materializer, relay, worker)), "nobody died"
    finally:
        codes = materializer.stop(), relay.stop()
        worker.stop()
    for process in (materializer, relay):
        log = process.text()
        assert log.count("step failed; retrying with backoff") == 1, f"one line per outage:\n{log[-3000:]}"
        assert "recovered after" in log, log[-3000:]
    assert codes == (0, 0), "SIGTERM after recovery is a clean stop"
    drain_queue(STRICT_QUEUE)


def delete_queue(name: str) -> None:
    with Connection(settings.CELERY_BROKER_URL) as broker:
        broker.default_channel.queue_delete(name)


def queue_exists(name: str) -> bool:
    with Connection(settings.CELERY_BROKER_URL) as broker:
        try:
            broker.default_channel.queue_declare(queue=name, passive=True)
        except Exception:
            return False
        return True


def test_a_queue_deleted_while_the_relay_runs_is_declared_again_and_nothing_is_stamped_unsent(tenant_a, request):
    """An unroutable (returned) message is a failed publish: the envelope stays unstamped and is sent again."""
    drain_queue(STRICT_QUEUE)
    relay = Running("relay", "--name", "queue-relay")
    try:
        wait_for(lambda: "queues declared" in relay.text(), 20, "the relay declared its queues")
        delete_queue(STRICT_QUEUE)
        expected = request.getfixturevalue("seed_envelopes")(tenant_a.tenant, 5)

        wait_for(lambda: not OutboxMessage.objects.filter(published_at__isnull=True).exists(), 45, "published")
        assert relay.process.poll() is None
    finally:
        relay.stop()
    delivered = {oid for message in drain_queue(STRICT_QUEUE) for oid in message["occurrences"]}
    assert delivered == expected, "every stamped envelope is really on the queue"
    log = relay.text()
    # A returned publish is the queue's refusal, not an outage of the broker: the envelope backs off on its own and
    # the relay says so once for the queue, then once when the queue accepts again.
    assert "refuses publishes to" in log and "accepts publishes again" in log, log[-3000:]


def rabbitmq(command: str) -> None:
    subprocess.run(["rabbitmqctl", command], check=True, capture_output=True, timeout=120)


@pytest.mark.exclusive  # stops the broker every other test uses
def test_a_broker_restart_mid_stream_loses_no_fire_and_the_relay_recovers_by_itself(tenant_a, request):
    drain_queue(STRICT_QUEUE)
    relay = Running("relay", "--name", "broker-relay")
    try:
        wait_for(lambda: "queues declared" in relay.text(), 20, "the relay declared its queues")
        rabbitmq("stop_app")
        try:
            expected = request.getfixturevalue("seed_envelopes")(tenant_a.tenant, 20)
            time.sleep(2)
            assert OutboxMessage.objects.filter(published_at__isnull=True).count() == 20, "nothing confirmed"
        finally:
            rabbitmq("start_app")
        wait_for(lambda: not OutboxMessage.objects.filter(published_at__isnull=True).exists(), 90, "published")
        assert relay.process.poll() is None
    finally:
        relay.stop()
    delivered = {oid for message in drain_queue(STRICT_QUEUE) for oid in message["occurrences"]}
    assert delivered == expected
    assert "recovered after" in relay.text(), relay.text()[-3000:]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, "not listening"


def test_the_web_process_answers_again_right_after_every_backend_is_terminated(tenants):
    port = free_port()
    web = Running(
        "web",
        command=[
            sys.executable,
            "-m",
            "gunicorn",
            "scheduler_project.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            "1",
        ],
        PYTHONPATH=str(ROOT),
    )
    url = f"http://127.0.0.1:{port}/healthz"

    def database_answers() -> bool:
        # No materializer or relay runs here, so /healthz is 503 "degraded"; what it says of PostgreSQL is the point.
        status, body = get(url)
        return status in (200, 503) and json.loads(body)["database"] == "ok"

    try:
        wait_for(lambda: get(url)[0] != 0 if web.process.poll() is None else True, 30, "gunicorn up")
        assert database_answers(), web.text()[-2000:]

        assert terminate_other_backends() >= 1, "the web worker kept its connection between requests"

        assert database_answers(), f"the first request after the outage failed: {get(url)}\n{web.text()[-2000:]}"
    finally:
        web.stop()
