"""The shape every long-running process shares: step until idle, sleep on a monotonic clock, stop on a signal."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable

logger = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGTERM/SIGINT; sleeping processes wake at once instead of finishing their nap."""

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, *_: object) -> None:
        self._event.set()

    def sleep(self, seconds: float) -> None:
        """Wait on the monotonic clock (Event.wait uses it): wall-clock jumps neither stretch nor cut the nap."""
        self._event.wait(max(0.0, seconds))

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.set)
            signal.signal(signal.SIGINT, self.set)


def run_loop(
    step: Callable[[], bool],
    stop: StopFlag,
    *,
    idle_seconds: float | Callable[[], float],
    once: bool = False,
    error_backoff_seconds: float = 1.0,
) -> None:
    """Call `step` while it reports work; when idle, sleep `idle_seconds` (or what the callable says).

    With `once`, return at the first idle step. An exception in a step is logged and retried after a pause: a
    database restart must not end the process.
    """
    while not stop.is_set:
        try:
            did_work = step()
        except Exception:
            logger.exception("step failed; retrying in %.1fs", error_backoff_seconds, extra={"action": "step_error"})
            if once:
                raise
            stop.sleep(error_backoff_seconds)
            continue
        if did_work:
            continue
        if once:
            return
        stop.sleep(idle_seconds() if callable(idle_seconds) else idle_seconds)


def monotonic() -> float:
    return time.monotonic()


def default_process_name(role: str) -> str:
    """Unique across hosts, restarts and processes: leases, heartbeats and attempts name their owner by it."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
