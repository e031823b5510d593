"""Real relays and Celery workers on queues of a test module's own, started and stopped as a supervisor would.

Every process of one fleet uses the same lane queue names (the suite's, with a suffix), so the envelopes they write
(retries, parked or yielded work) and the ones the test writes through `fleet.due` meet the same relay and worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from amqp.exceptions import NotFound
from django.conf import settings
from django.db import connection
from kombu import Connection

from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OccurrenceState
from dispatch.outbox import Fire, enqueue
from dispatch.queues import queue_for_lane, with_crowds
from tests.integration.processes import ROOT, manage, process_env, run_manage
from tests.support import wait_for


class Fleet:
    def __init__(self, suffix: str) -> None:
        self.strict = f"{queue_for_lane('strict')}.{suffix}"
        self.flexible = f"{queue_for_lane('flexible')}.{suffix}"
        self.processes: list[tuple[subprocess.Popen, Path]] = []

    def env(self, **overrides: str) -> dict[str, str]:
        return process_env(
            SCHEDULER_STRICT_QUEUE=self.strict,
            SCHEDULER_FLEXIBLE_QUEUE=self.flexible,
            SCHEDULER_HANDLER_MODULES="tests.handlers",
            PYTHONPATH=str(ROOT),
            **overrides,
        )

    def due(
        self, make_schedule: Any, tenant: Any, count: int, at: datetime, *, envelope: int, **schedule_fields: Any
    ) -> list[Occurrence]:
        """`due_on` this fleet's strict queue."""
        return due_on(self.strict, make_schedule, tenant, count, at, envelope=envelope, **schedule_fields)

    def relay(self, **env: str) -> subprocess.Popen:
        return self._manage_process("relay", **env)

    def materializer(self, **env: str) -> subprocess.Popen:
        """`manage.py materialize` under a name of its own (its heartbeat and shard leases carry it)."""
        return self._manage_process("materialize", **env)

    def _manage_process(self, command: str, **env: str) -> subprocess.Popen:
        """A long-running management command of this fleet, named fleet-<role>-<random>, its output in a log."""
        role = "materializer" if command == "materialize" else command
        log = _log_file(role)
        with log.open("wb") as out:
            name = f"fleet-{role}-{uuid.uuid4().hex[:6]}"
            process = manage(command, "--name", name, env=self.env(**env), stdout=out, stderr=subprocess.STDOUT)
        self.processes.append((process, log))
        return process

    def web(self, port: int, **env: str) -> subprocess.Popen:
        """The web process as the Procfile runs it (gunicorn, one worker process with threads) on 127.0.0.1:`port`,
        in a session of its own (its worker process goes with it)."""
        command = [sys.executable, "-m", "gunicorn", "scheduler_project.wsgi", "--bind", f"127.0.0.1:{port}"]
        command += ["--workers", "1", "--threads", "4"]
        log = _log_file("web")
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=self.env(**env), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes.append((process, log))
        return process

    def worker(self, concurrency: int = 2, **env: str) -> subprocess.Popen:
        """`celery -A scheduler_project worker -c <concurrency>` in a session of its own (its pool goes with it)."""
        command = [sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=prefork"]
        command += ["-c", str(concurrency), "--without-mingle", "--without-gossip", "--loglevel=INFO"]
        command += ["-n", f"fleet-{uuid.uuid4().hex[:8]}@%h"]
        log = _log_file("worker")
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=self.env(**env), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes.append((process, log))
        return process

    def manage(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        """A management command to completion, on this fleet's queues."""
        return run_manage(*args, env=self.env(**env))

    def wait_consuming(self, workers: int = 1) -> None:
        wait_for(lambda: consumers(self.strict) >= workers, 60, "the workers to consume")

    def purge(self) -> None:
        """Delete the queues: the processes declare them again."""
        with Connection(settings.CELERY_BROKER_URL) as conn:
            for name in with_crowds(self.strict, self.flexible):
                conn.default_channel.queue_delete(name)

    def stop(self) -> None:
        for process, _ in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(process.pid) == process.pid:
                        os.killpg(process.pid, signal.SIGTERM)
                    else:
                        process.terminate()
        for process, log in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL) if os.getpgid(process.pid) == process.pid else process.kill()
                process.wait(timeout=10)
            # Captured by pytest and shown only when the test failed.
            print(f"--- tail of {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-200:]))
            log.unlink(missing_ok=True)


@contextlib.contextmanager
def running_fleet(suffix: str) -> Iterator[Fleet]:
    fleet = Fleet(suffix)
    fleet.purge()
    try:
        yield fleet
    finally:
        fleet.stop()
        fleet.purge()


def due_on(
    queue: str,
    make_schedule: Any,
    tenant: Any,
    count: int,
    at: datetime,
    *,
    envelope: int | None = None,
    **schedule_fields: Any,
) -> list[Occurrence]:
    """`count` occurrences of one new schedule of `tenant`, released at `at` on `queue` in envelopes of `envelope`
    fires (the deployment's size when None), each at its own microsecond so they are distinct fires."""
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    schedule = make_schedule(tenant, name=name, max_lateness_seconds=3600, **schedule_fields)
    occurrences = Occurrence.objects.bulk_create(
        [
            Occurrence(
                occurrence_id=occurrence_id_for(schedule.id, schedule.version, at + timedelta(microseconds=n)),
                schedule=schedule,
                tenant_id=tenant.id,
                schedule_version=schedule.version,
                scheduled_for=at + timedelta(microseconds=n),
                available_at=at,
                lane=schedule.lane,
                priority=0,
                state=OccurrenceState.SCHEDULED,
            )
            for n in range(count)
        ]
    )
    fires = [Fire(o.occurrence_id, o.scheduled_for, tenant.id, queue, at, 0) for o in occurrences]
    with connection.cursor() as cursor:
        enqueue(cursor, fires, size=envelope)
    return occurrences


def _passive_declare(queue: str) -> Any:
    """RabbitMQ's account of a queue (message and consumer counts), or None when it does not exist."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, durable=True, passive=True)
        except NotFound:
            return None


def consumers(queue: str) -> int:
    declared = _passive_declare(queue)
    return declared.consumer_count if declared else 0


def queue_depth(queue: str) -> int:
    """Messages ready in a queue (0 when it does not exist)."""
    declared = _passive_declare(queue)
    return declared.message_count if declared else 0


def _log_file(role: str) -> Path:
    return Path(tempfile.mkstemp(prefix=f"fleet-{role}-", suffix=".log")[1])
