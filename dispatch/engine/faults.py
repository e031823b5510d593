"""Named crash points for the fault suite: a process dies exactly there, as a SIGKILL or an OOM would kill it.

Off unless SCHEDULER_FAULT names a point; then the process calls os._exit at its SCHEDULER_FAULT_AFTER-th pass
through that point (no cleanup, no flush, no release of locks or leases). The harness (tests and `manage.py soak`)
restarts it and checks that nothing was lost and that every effect happened once.
"""

from __future__ import annotations

import logging
import os
import threading

from django.conf import settings

logger = logging.getLogger(__name__)

POINTS = (
    "materializer.before_insert",  # due schedules locked, occurrences planned, nothing written
    "materializer.after_commit",  # occurrences and envelopes committed, the loop not told
    "relay.after_publish",  # the broker confirmed, the envelope not yet stamped (re-published on restart)
    "relay.after_stamp",  # stamped and committed, the next step not started
    "worker.after_claim",  # the attempt is running, the handler not called (the lease expires)
    "worker.after_effect",  # the handler's effect is done, the completion not written
)
# The exit code of a process that died at a crash point, so the harness tells it from a real crash.
FAULT_EXIT_CODE = 86

_passes = 0
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Die here if SCHEDULER_FAULT names this point and this is its SCHEDULER_FAULT_AFTER-th pass."""
    if name != settings.SCHEDULER_FAULT:
        return
    global _passes
    with _lock:
        _passes += 1
        if _passes < settings.SCHEDULER_FAULT_AFTER:
            return
    logger.warning("crash point %s reached: exiting now", name, extra={"action": "crash_point"})
    os._exit(FAULT_EXIT_CODE)
