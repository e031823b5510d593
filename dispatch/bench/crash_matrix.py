"""The crash-point matrix: the real processes die at each hand-off, are restarted, and nothing is lost or done twice.

For each crash point (dispatch/engine/faults.py) and each iteration:
1. Keep a materializer, a relay and a worker running on queues of the matrix's own; restart the process that hosts
   the point with SCHEDULER_FAULT naming it, so it dies there (os._exit) at its first to third pass.
2. Create F one-off schedules due a moment later, with a handler that records its business effect keyed by
   occurrence_id (an upsert, as a real idempotent target would) and counts its runs.
3. Once the faulted process died, start it again without the fault; wait until every fire succeeded.
4. Count: lost fires, effects other than one per expected occurrence, re-runs (at-least-once at work), the worst
   lag from scheduled time to broker confirmation, and whether reconcile (grace 0) is clean.

`manage.py soak` runs it for a number of iterations and prints a table; the fault suite runs it in CI. The matrix
acts as a tenant would: its fires enter through the control plane (schedules.services), like any API call.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings

from core.clock import db_now
from dispatch.bench.effects import EFFECT_HANDLER, effects, ensure_effects_table
from dispatch.bench.processes import PROJECT_ROOT, database_url, start_child
from dispatch.engine.faults import FAULT_EXIT_CODE, POINTS
from dispatch.identity import occurrence_id_for
from dispatch.models import Occurrence, OccurrenceState
from dispatch.queues import with_crowds
from dispatch.reconcile import reconcile
from schedules.services import create_schedule
from tenants.models import Tenant
from tenants.services import provision_tenant

MATRIX_TENANT = "bench-crash-matrix"
# Short leases, so a process that died holding one is taken over within seconds, not the production 15-30 s.
LEASE_SECONDS = 2
# How long one iteration may take before its fires count as lost.
SETTLE_DEADLINE_SECONDS = 60.0


@dataclass
class PointResult:
    point: str
    runs: int = 0
    reached: int = 0  # iterations in which the process really died at the point
    lost: int = 0
    duplicate_effects: int = 0
    reruns: int = 0
    unclean_reconciles: int = 0
    max_lag_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicate_effects == 0 and self.unclean_reconciles == 0


class Role:
    """One product process (materializer, relay or worker) that the matrix starts, kills and restarts."""

    def __init__(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.process: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkstemp(prefix=f"crash-{name}-", suffix=".log")[1])

    def start(self, fault: str | None = None) -> None:
        env = dict(self.env)
        if fault:
            env["SCHEDULER_FAULT"] = fault
            # Every role passes its point about once per iteration: the materializer and the relay once per batch,
            # the worker once per message it claims and per batch of results it completes (an iteration's fires
            # are claimed together and, run by one pool task per tenant, completed together). A later pass
            # would often not come within the iteration, which then tests nothing.
            env["SCHEDULER_FAULT_AFTER"] = "1"
        with self.log_path.open("ab") as log:
            self.process = start_child(
                self.command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class CrashMatrix:
    def __init__(self, *, fires: int = 10, seed: int | None = None) -> None:
        self.fires = fires
        random.seed(seed)
        strict = f"{settings.SCHEDULER_STRICT_QUEUE}.crash"
        flexible = f"{settings.SCHEDULER_FLEXIBLE_QUEUE}.crash"
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SCHEDULER_STRICT_QUEUE": strict,
            "SCHEDULER_FLEXIBLE_QUEUE": flexible,
            "SCHEDULER_HANDLER_MODULES": "dispatch.bench.effects",
            "SCHEDULER_LEASE_SECONDS": str(LEASE_SECONDS),
            "SCHEDULER_WORKER_LEASE_SECONDS": str(LEASE_SECONDS),
            "SCHEDULER_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(PROJECT_ROOT),
        }
        env.pop("SCHEDULER_FAULT", None)
        manage = [sys.executable, str(PROJECT_ROOT / "manage.py")]
        # The solo pool runs envelopes in the worker's main process, so a crash point takes the whole worker down
        # (a prefork child would be replaced by its parent with the same fault armed).
        node = f"crash-matrix-{uuid.uuid4().hex[:8]}@%h"
        worker = [sys.executable, "-m", "celery", "-A", "scheduler_project", "worker", "--pool=solo"]
        worker += [
            "--without-mingle",
            "--without-gossip",
            "--loglevel=WARNING",
            "-n",
            node,
            "-Q",
            ",".join(with_crowds(strict, flexible)),
        ]
        self.roles = {
            "materializer": Role("materializer", [*manage, "materialize", "--name", "crash-materializer"], env),
            "relay": Role("relay", [*manage, "relay", "--name", "crash-relay"], env),
            "worker": Role("worker", worker, env),
        }
        self.tenant: Tenant | None = None

    # --- setup -------------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        # Registers the effect handler in this process too: the control plane accepts only registered names.
        import dispatch.bench.effects  # noqa: F401

        ensure_effects_table()
        self.tenant = provision_tenant(MATRIX_TENANT, domain=f"{MATRIX_TENANT}.localhost", max_schedules=10**9).tenant
        for role in self.roles.values():
            role.start()

    def close(self) -> None:
        for role in self.roles.values():
            role.stop()

    # --- one iteration -----------------------------------------------------------------------------------------

    def run(
        self, points: tuple[str, ...] = POINTS, iterations: int = 10, progress: Callable[[], None] | None = None
    ) -> list[PointResult]:
        results = {point: PointResult(point) for point in points}
        self.prepare()
        try:
            for _ in range(iterations):
                for point in points:
                    self.iteration(point, results[point])
                    if progress:
                        progress()
        finally:
            self.close()
        return list(results.values())

    def iteration(self, point: str, result: PointResult) -> None:
        assert self.tenant is not None
        role = self.roles[point.split(".")[0]]
        role.stop()
        role.start(fault=point)
        for other in self.roles.values():
            if not other.alive and other is not role:
                other.start()
        ensure_effects_table()
        started = db_now()
        expected = self._create_fires(started + timedelta(seconds=1.5))
        deadline = time.monotonic() + SETTLE_DEADLINE_SECONDS
        while time.monotonic() < deadline and role.alive and self._succeeded(expected) < len(expected):
            time.sleep(0.1)
        result.runs += 1
        if role.process is not None and role.process.poll() == FAULT_EXIT_CODE:
            result.reached += 1
        elif not role.alive:
            result.notes.append(f"{role.name} exited with {role.process.returncode if role.process else '?'}")
        if not role.alive:
            role.start()
        while time.monotonic() < deadline and self._succeeded(expected) < len(expected):
            time.sleep(0.1)
        self._measure(expected, started, result)

    def _create_fires(self, at: datetime) -> dict[uuid.UUID, datetime]:
        assert self.tenant is not None
        expected = {}
        for n in range(self.fires):
            run_at = at + timedelta(milliseconds=n)
            schedule, _ = create_schedule(
                tenant=self.tenant,
                data={"name": f"crash-{n}", "kind": "once", "run_at": run_at, "handler": EFFECT_HANDLER},
                actor="crash-matrix",
            )
            expected[occurrence_id_for(schedule.id, schedule.version, run_at)] = run_at
        return expected

    @staticmethod
    def _succeeded(expected: dict[uuid.UUID, datetime]) -> int:
        return Occurrence.objects.filter(occurrence_id__in=list(expected), state=OccurrenceState.SUCCEEDED).count()

    def _measure(self, expected: dict[uuid.UUID, datetime], started: datetime, result: PointResult) -> None:
        assert self.tenant is not None
        rows = Occurrence.objects.filter(tenant_id=self.tenant.id, scheduled_for__gte=started)
        succeeded = {o.occurrence_id: o for o in rows if o.state == OccurrenceState.SUCCEEDED}
        result.lost += len(set(expected) - set(succeeded))
        extra_rows = rows.exclude(occurrence_id__in=list(expected)).count()
        done = effects()
        result.duplicate_effects += extra_rows + sum(1 for oid in done if oid not in expected)
        result.reruns += sum(runs - 1 for runs in done.values())
        lags = [(o.enqueued_at - o.scheduled_for).total_seconds() for o in succeeded.values() if o.enqueued_at]
        result.max_lag_s = max([result.max_lag_s, *lags])
        report = reconcile(since=started, until=db_now(), tenant_id=self.tenant.id, grace_seconds=0)
        if not report.ok:
            result.unclean_reconciles += 1
            result.notes.append(f"reconcile: missing {report.missing}, stuck {report.stuck}")


def table(results: list[PointResult]) -> str:
    """The soak's summary, one line per crash point."""
    header = f"{'point':<28} {'runs':>5} {'reached':>7} {'lost':>5} {'dup effects':>11} {'reruns':>6} {'max lag s':>9}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.point:<28} {r.runs:>5} {r.reached:>7} {r.lost:>5} {r.duplicate_effects:>11} {r.reruns:>6} "
            f"{r.max_lag_s:>9.2f}"
        )
    return "\n".join(lines)
