"""A node lost mid-burst, and a benchmark that lives through it.

`bench burst --fault COMMAND` (and `bench drain`) starts a shell command FAULT_LEAD_SECONDS before the burst instant,
with that instant in its environment as `T0` (seconds since the epoch): the command does its slow part first (finding
a queue's leader or the primary) and strikes at T0, while the relay publishes and the workers consume:
`scripts/cluster/rabbitmq.sh kill-leader QUEUE --at $T0` loses the RabbitMQ node leading a queue,
`scripts/cluster/postgres.sh failover --at $T0` the PostgreSQL primary (docs/DEPLOYMENT.md). The run then measures
what it always measures (lag, lost, duplicates, execution, reconcile), so a node loss reads against the same run
without one.

The benchmark's own polls go through the same failover as the processes it measures: a poll that finds its
connection gone reconnects (libpq's multi-host URL lands on the new primary) instead of ending the run.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

from core.clock import db_now
from dispatch.bench.processes import PROJECT_ROOT

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long a poll keeps reconnecting: a failover's promotion plus libpq's connect_timeout, with room.
RECONNECT_SECONDS = 60.0
# How long before T0 the fault command starts: time for a rabbitmqctl or psql call or two before it waits for T0.
FAULT_LEAD_SECONDS = 10.0
# The fault command's own bound: a kill, a promotion, a rejoin of a node.
FAULT_TIMEOUT_SECONDS = 300.0


def through_failover(poll: Callable[[], T], seconds: float = RECONNECT_SECONDS) -> T:
    """`poll()`, reconnecting and trying again while the database is away (a primary lost, a standby promoting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return poll()
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@dataclass
class Fault:
    """A shell command started before T0 with T0 in its environment, run beside the benchmark, and what it did."""

    command: str
    result: dict[str, object] = field(default_factory=dict)
    _waiter: threading.Thread | None = None

    def start_before(self, t0: datetime, say: Callable[[str], None]) -> None:
        """Start the command FAULT_LEAD_SECONDS before T0 (PostgreSQL's clock, mapped onto this machine's) at the
        latest, and return: the benchmark goes on polling while it runs."""
        wait = (t0 - through_failover(db_now)).total_seconds()
        t0_epoch = time.time() + wait
        if wait > FAULT_LEAD_SECONDS:
            time.sleep(wait - FAULT_LEAD_SECONDS)
        say(f"fault (T0={t0_epoch:.3f}): {self.command}")
        self._waiter = threading.Thread(target=self._run, args=(t0_epoch,), name="fault", daemon=True)
        self._waiter.start()

    def _run(self, t0_epoch: float) -> None:
        started = time.monotonic()
        exit_code: int | str
        output = ""
        try:
            # A session of its own: a command that outlives its bound is stopped with everything it started.
            process = subprocess.Popen(
                self.command,
                shell=True,
                cwd=PROJECT_ROOT,
                env={**os.environ, "T0": f"{t0_epoch:.3f}"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                output, _ = process.communicate(timeout=FAULT_TIMEOUT_SECONDS)
                exit_code = process.returncode
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                output, _ = process.communicate()
                exit_code = f"timed out after {FAULT_TIMEOUT_SECONDS:g} s"
        except Exception as exc:  # it could not even start: the run reports it rather than losing the reason
            exit_code = f"failed: {exc!r}"
        self.result = {
            "command": self.command,
            "exit": exit_code,
            "seconds": round(time.monotonic() - started, 2),
            "output": (output or "").strip().splitlines()[-5:],
        }

    def finish(self) -> dict[str, object]:
        """Wait for the command (it is bounded); its exit code, duration and last output lines."""
        if self._waiter is None:
            return {"command": self.command, "exit": None}
        self._waiter.join()
        return self.result
