"""The drain benchmark: the burst through the real materializer, relay AND Celery workers, to the handler's effect.

What a user pays for is the fire running, not the message arriving. On top of the burst (dispatch/bench/burst.py):
1. Start W workers (`celery -A scheduler_project worker`) on the bench queues, the schedules' handler upserting its
   effect keyed by occurrence_id (dispatch/bench/effects.py).
2. Optionally SIGKILL one materializer, one relay and one worker (whole process group) once a quarter of the fires is
   confirmed: the survivors must take over (shard leases, SKIP LOCKED envelopes, redelivered messages, reaped
   occurrence leases).
3. Wait until every occurrence is terminal; measure execution rate, start and finish lag, lost fires, effects other
   than one per occurrence, and attempts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from tqdm import tqdm

from core.clock import db_now
from dispatch.bench.burst import BurstBenchmark, BurstConfig
from dispatch.bench.effects import EFFECT_HANDLER, effects, ensure_effects_table
from dispatch.bench.faults import through_failover
from dispatch.bench.processes import PROJECT_ROOT, children_rss_peak_mb, start_child
from dispatch.reconcile import reconcile

# Short occurrence leases, so the work of a killed worker is reaped and retried within seconds.
DRAIN_WORKER_LEASE_SECONDS = 5


@dataclass
class DrainConfig(BurstConfig):
    workers: int = 1
    concurrency: int = 1  # Celery pool processes per worker
    kill_one_of_each: bool = False
    drain_deadline_seconds: float = 300.0


class DrainBenchmark(BurstBenchmark):
    handler = EFFECT_HANDLER
    config: DrainConfig

    def __init__(self, config: DrainConfig, out=sys.stdout) -> None:
        super().__init__(config, out)
        self.workers: list[tuple[str, subprocess.Popen]] = []
        self.killed: list[str] = []

    def process_env(self, horizon: float) -> dict[str, str]:
        env = super().process_env(horizon)
        env["SCHEDULER_HANDLER_MODULES"] = "dispatch.bench.effects"
        env["SCHEDULER_WORKER_LEASE_SECONDS"] = str(DRAIN_WORKER_LEASE_SECONDS)
        env["PYTHONPATH"] = str(PROJECT_ROOT)
        return env

    def start_processes(self, horizon: float) -> None:
        super().start_processes(horizon)
        env = self.process_env(horizon)
        for n in range(self.config.workers):
            command = [sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=prefork"]
            command += ["-c", str(self.config.concurrency), "--without-mingle", "--without-gossip"]
            command += ["--loglevel=WARNING", "-n", f"bench-worker-{n + 1}-{uuid.uuid4().hex[:6]}@%h"]
            # A session of its own: a SIGKILL of the group takes the pool children too, as a machine's death would.
            process = start_child(command, env=env, start_new_session=True)
            self.workers.append((f"worker-{n + 1}", process))

    def stop_processes(self) -> dict[str, float | None]:
        peaks = {name: children_rss_peak_mb(proc.pid) for name, proc in self.workers}
        for _, proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        return {**super().stop_processes(), **peaks}

    def _check_alive(self) -> None:
        for name, proc in [*self.processes, *self.workers]:
            if proc.poll() is not None and name not in self.killed:
                raise RuntimeError(f"{name} exited with code {proc.returncode}")

    def _kill_one_of_each(self) -> None:
        for prefix in ("materializer", "relay", "worker"):
            name, proc = next((n, p) for n, p in [*self.processes, *self.workers] if n.startswith(prefix))
            if prefix == "worker":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            self.killed.append(name)
        self.say(f"SIGKILLed {', '.join(self.killed)} mid-burst")

    def _wait_confirmed(self, t0: datetime) -> int:
        if not self.config.kill_one_of_each:
            return super()._wait_confirmed(t0)
        deadline = time.monotonic() + self.config.deadline_seconds
        while time.monotonic() < deadline:
            if self.confirmed_fires() >= self.config.schedules // 4:
                break
            time.sleep(0.05)
        self._kill_one_of_each()
        return super()._wait_confirmed(t0)

    def _wait_drained(self, t0: datetime) -> None:
        total = self.config.schedules
        deadline = t0 + timedelta(seconds=self.config.drain_deadline_seconds)
        with tqdm(total=total, desc="executed", unit="occ", file=self.out, mininterval=2) as bar:
            while True:
                done = through_failover(self._terminal)
                bar.update(done - bar.n)
                if done >= total or through_failover(db_now) > deadline:
                    return
                self._check_alive()
                time.sleep(1.0)

    def _terminal(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM dispatch_occurrence WHERE tenant_id = ANY(%s)"
                " AND state IN ('succeeded', 'dead', 'missed', 'canceled', 'skipped_overlap')",
                [self.tenant_ids],
            )
            return cursor.fetchone()[0]

    def execution_stats(self, t0: datetime) -> dict[str, Any]:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                WITH first AS (
                    SELECT a.occurrence_id, min(a.started_at) AS started_at
                    FROM dispatch_attempt a JOIN dispatch_occurrence o
                      ON o.occurrence_id = a.occurrence_id AND o.scheduled_for = a.scheduled_for
                    WHERE o.tenant_id = ANY(%(t)s) GROUP BY a.occurrence_id
                )
                SELECT count(*) FILTER (WHERE o.state = 'succeeded'),
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY start_lag),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY start_lag),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY finish_lag),
                       EXTRACT(EPOCH FROM max(o.finished_at) - min(f.started_at)),
                       (SELECT count(*) FROM dispatch_attempt a2 JOIN dispatch_occurrence o2
                          ON o2.occurrence_id = a2.occurrence_id AND o2.scheduled_for = a2.scheduled_for
                        WHERE o2.tenant_id = ANY(%(t)s))
                FROM dispatch_occurrence o LEFT JOIN first f ON f.occurrence_id = o.occurrence_id,
                LATERAL (SELECT EXTRACT(EPOCH FROM f.started_at - o.scheduled_for) AS start_lag,
                                EXTRACT(EPOCH FROM o.finished_at - o.scheduled_for) AS finish_lag) AS l
                WHERE o.tenant_id = ANY(%(t)s)
                """,
                {"t": self.tenant_ids},
            )
            succeeded, start_p50, start_p99, finish_p99, span, attempts = cursor.fetchone()
        done = effects()
        if self.handler != EFFECT_HANDLER:
            # A handler without an effect table (noop): each succeeded attempt stands for one run of the effect.
            done = self._succeeded_attempts()
        span = float(span or 0)
        return {
            "executed": int(succeeded),
            "executed_per_s": round(int(succeeded) / span, 1) if span > 0 else None,
            "start_lag_p50_s": round(float(start_p50 or 0), 3),
            "start_lag_p99_s": round(float(start_p99 or 0), 3),
            "finish_p99_s": round(float(finish_p99 or 0), 3),
            "attempts": int(attempts),
            "effects": len(done),
            # The handler upserts by occurrence_id, so each id has one row; runs beyond the first are at-least-once.
            "duplicate_effects": max(0, len(done) - int(succeeded)),
            "reruns": sum(runs - 1 for runs in done.values()),
        }

    def _succeeded_attempts(self) -> dict[uuid.UUID, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT a.occurrence_id, count(*) FROM dispatch_attempt a JOIN dispatch_occurrence o"
                " ON o.occurrence_id = a.occurrence_id AND o.scheduled_for = a.scheduled_for"
                " WHERE o.tenant_id = ANY(%s) AND a.outcome = 'succeeded' GROUP BY 1",
                [self.tenant_ids],
            )
            return dict(cursor.fetchall())

    def run(self) -> dict[str, Any]:
        import dispatch.bench.effects  # noqa: F401  (registers the handler the bench schedules name)

        ensure_effects_table()
        return super().run()

    def after_confirmed(self, t0: datetime) -> dict[str, Any]:
        """Called by the burst's run between confirmation and stopping the processes."""
        self._wait_drained(t0)
        stats = self.execution_stats(t0)
        stats["lost"] = self.config.schedules - stats["executed"]
        # The workers consumed the messages, so the burst's read-back of the queues has nothing to count.
        stats["lost_on_broker"] = None
        stats["broker_messages"] = None
        stats["workers"] = self.config.workers
        stats["killed"] = self.killed
        stats["reconcile"] = self.reconcile(t0)
        return stats

    @staticmethod
    def reconcile(t0: datetime) -> dict[str, Any]:
        """`manage.py reconcile` over the burst's instant, every fire materialized and run (so no grace): the
        fires owed by the schedules' versions against the rows, and any stuck on the way."""
        # Stuck from the moment a fire is due: the drain ended, so anything not done by now is stuck.
        until = t0 + timedelta(seconds=1)
        report = through_failover(lambda: reconcile(since=t0, until=until, grace_seconds=0, stuck_after_seconds=0))
        return {
            "ok": report.ok,
            "expected": report.expected,
            "missing": report.missing,
            "stuck": report.stuck,
            "unexpected": report.unexpected,
        }
