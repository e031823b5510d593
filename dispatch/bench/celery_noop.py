"""The floor any Celery-based platform sits on: a plain Celery worker running a noop task, one message per task.

1. Publish N messages of the task `bench.celery_noop` (publisher confirms, persistent, one per task, as a platform that
   sends each occurrence as its own Celery task would) to a durable queue of the benchmark's own.
2. Start `celery -A scheduler_project worker -c C` on that queue with acks_late and prefetch multiplier 1, the settings
   an at-least-once platform needs, importing this module (the task, and a counter of runs per pool process).
3. Each pool process writes how many tasks it ran and when its first and latest ran to a file of its own; the rate is
   N / (last run - first run) across the processes. Nothing touches the database: this is Celery and RabbitMQ alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.signals import task_postrun
from django.conf import settings
from kombu import Connection, Exchange, Producer, Queue
from tqdm import tqdm

from dispatch.bench.processes import PROJECT_ROOT, rss_peak_mb, start_child

NOOP_TASK = "bench.celery_noop"
# Where each pool process of the bench's worker reports its runs (the bench sets it for the worker it starts).
RUNS_DIR_ENV = "SCHEDULER_BENCH_RUNS_DIR"
REPORT_SECONDS = 0.05


@shared_task(name=NOOP_TASK, acks_late=True, ignore_result=True)
def celery_noop() -> None:
    """Nothing: what is measured is Celery's own cost per task."""


_runs = {"count": 0, "first": 0.0, "last": 0.0}
_reporter: threading.Thread | None = None


@task_postrun.connect
def _count_run(sender: Any = None, **_: Any) -> None:
    """Count in memory (a file write per task would be a cost of its own); a thread reports every 50 ms."""
    global _reporter
    if getattr(sender, "name", None) != NOOP_TASK or not os.environ.get(RUNS_DIR_ENV):
        return
    now = time.time()
    _runs["count"] += 1
    _runs["first"] = _runs["first"] or now
    _runs["last"] = now
    if _reporter is None:
        _reporter = threading.Thread(target=_report, daemon=True)
        _reporter.start()


def _report() -> None:
    path = Path(os.environ[RUNS_DIR_ENV]) / f"{os.getpid()}.json"
    scratch = path.with_suffix(".tmp")
    while True:
        # Written aside and renamed into place: a report read while it was being rewritten came back empty, and the
        # bench counted one pool process's runs as none (203 of 300 executed, seen in CI).
        scratch.write_text(json.dumps(_runs))
        os.replace(scratch, path)
        time.sleep(REPORT_SECONDS)


@dataclass
class CeleryNoopConfig:
    tasks: int
    concurrency: int = 2
    deadline_seconds: float = 600.0


class CeleryNoopBenchmark:
    def __init__(self, config: CeleryNoopConfig, out=sys.stdout) -> None:
        self.config = config
        self.out = out
        self.queue = f"bench.{settings.DATABASES['default']['NAME']}.celery_noop"
        self.runs_dir = Path(tempfile.mkdtemp(prefix="celery-noop-runs-"))

    def _declared(self) -> Queue:
        return Queue(self.queue, exchange=Exchange(""), routing_key=self.queue, durable=True)

    def publish(self) -> None:
        """N task messages, each confirmed by the broker (kombu's confirm_publish), on the bench queue."""
        with Connection(settings.CELERY_BROKER_URL, transport_options={"confirm_publish": True}) as broker:
            channel = broker.channel()
            self._declared()(channel).declare()
            channel.queue_purge(self.queue)
            producer = Producer(channel)
            body = [[], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
            with tqdm(total=self.config.tasks, desc="publish", unit="task", file=self.out, mininterval=2) as bar:
                for n in range(self.config.tasks):
                    task_id = str(uuid.uuid4())
                    producer.publish(
                        body,
                        exchange="",
                        routing_key=self.queue,
                        serializer="json",
                        delivery_mode=2,
                        headers={
                            "lang": "py",
                            "task": NOOP_TASK,
                            "id": task_id,
                            "root_id": task_id,
                            "parent_id": None,
                            "group": None,
                            "retries": 0,
                            "eta": None,
                            "expires": None,
                            "timelimit": [None, None],
                            "argsrepr": "()",
                            "kwargsrepr": "{}",
                        },
                    )
                    if n % 1000 == 0:
                        bar.update(min(1000, self.config.tasks - bar.n))
                bar.update(self.config.tasks - bar.n)

    def runs(self) -> tuple[int, float, float]:
        reports = []
        for path in self.runs_dir.glob("*.json"):
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        if not reports:
            return 0, 0.0, 0.0
        return (
            sum(r["count"] for r in reports),
            min(r["first"] for r in reports if r["first"]),
            max(r["last"] for r in reports),
        )

    def run(self) -> dict[str, Any]:
        self.publish()
        env = {**os.environ, RUNS_DIR_ENV: str(self.runs_dir), "PYTHONPATH": str(PROJECT_ROOT)}
        command = [sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=prefork"]
        command += ["-c", str(self.config.concurrency), "-Q", self.queue, "-I", __name__, "--loglevel=WARNING"]
        command += ["--without-mingle", "--without-gossip", "-n", f"bench-noop-{uuid.uuid4().hex[:6]}@%h"]
        worker = start_child(command, env=env, start_new_session=True)
        peak = None
        try:
            deadline = time.monotonic() + self.config.deadline_seconds
            with tqdm(total=self.config.tasks, desc="executed", unit="task", file=self.out, mininterval=2) as bar:
                while time.monotonic() < deadline:
                    done = self.runs()[0]
                    bar.update(done - bar.n)
                    if done >= self.config.tasks:
                        break
                    if worker.poll() is not None:
                        raise RuntimeError(f"the worker exited with code {worker.returncode}")
                    peak = rss_peak_mb(worker.pid) or peak
                    time.sleep(0.2)
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
            with Connection(settings.CELERY_BROKER_URL) as broker:
                broker.channel().queue_delete(self.queue)
        done, first, last = self.runs()
        span = last - first
        return {
            "tasks": self.config.tasks,
            "executed": done,
            "concurrency": self.config.concurrency,
            "executed_per_s": round(done / span, 1) if span > 0 else None,
            "worker_peak_rss_mb": peak,
            "cpu_count": os.cpu_count(),
        }
