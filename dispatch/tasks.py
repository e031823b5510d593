"""The Celery task of the data plane: run one envelope's occurrences through the worker service, in parallel."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from celery import shared_task
from celery.exceptions import InvalidTaskError, Reject
from celery.signals import (
    task_rejected,
    task_unknown,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from celery.worker.strategy import default as default_strategy
from django.conf import settings

from dispatch import counters
from dispatch.engine.envelope_runner import EnvelopeRunner
from dispatch.engine.leases import stop_lease_renewer
from dispatch.engine.outcomes import Tally
from dispatch.notifications import NotificationSender
from dispatch.wire import RUN_ENVELOPE_TASK, MalformedEnvelope, decode_content, envelope_id_of

logger = logging.getLogger(__name__)

ROLE = "worker"

# Pause before handing an envelope back to the broker after a database failure, so a database outage does not
# turn into a hot redelivery loop.
REQUEUE_PAUSE_SECONDS = 1.0


def guarded_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Any:
    """Celery's default strategy, after a check of the message's shape.

    Celery unpacks a protocol-2 body as [args, kwargs, embed] in the consumer itself, outside its error handling:
    a body such as `"text"` or `{}` raises there, which Celery treats as unrecoverable and stops the whole worker.
    Such a message is refused here as an invalid task instead: Celery logs it and rejects it (dropped).
    """
    handle = default_strategy(task, app, consumer, **options)

    def task_message_handler(message: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        if body is None:  # protocol 2: Celery decodes the body lazily; a DecodeError here is handled by Celery
            _check_task_message(message.headers or {}, message.payload)
        return handle(message, body, *args, **kwargs)

    return task_message_handler


def _check_task_message(headers: dict[str, Any], payload: Any) -> None:
    if not headers.get("id"):
        raise InvalidTaskError("task message without an id header")
    timelimit = headers.get("timelimit")
    if timelimit is not None and not (
        isinstance(timelimit, list | tuple)
        and len(timelimit) == 2
        and all(t is None or (isinstance(t, int | float) and not isinstance(t, bool)) for t in timelimit)
    ):
        raise InvalidTaskError(f"bad timelimit header {timelimit!r}")
    if not (isinstance(payload, list | tuple) and len(payload) == 3):
        raise InvalidTaskError(f"body is not [args, kwargs, embed]: {str(payload)[:200]!r}")
    args, kwargs, embed = payload
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict) or not isinstance(embed, dict | None):
        raise InvalidTaskError(f"body is not [args, kwargs, embed]: {str(payload)[:200]!r}")
    for key in ("callbacks", "errbacks", "chain"):
        if not isinstance((embed or {}).get(key), list | None):
            raise InvalidTaskError(f"bad {key} in the body: {str(embed)[:200]!r}")
    if not isinstance((embed or {}).get("chord"), dict | None):
        raise InvalidTaskError(f"bad chord in the body: {str(embed)[:200]!r}")


@shared_task(
    name=RUN_ENVELOPE_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    Strategy=f"{__name__}:guarded_strategy",
)
def run_envelope(self, *envelopes: Any, **unexpected_kwargs: Any) -> dict[str, int]:
    """Decode the envelope (or the bundle of small envelopes the relay sent as one message), run each occurrence
    (claim → handler → complete), return the outcome counts.

    Returns when every occurrence is finished, or at the end of the message's turn (dispatch/engine/envelope_runner.py),
    so the message is acknowledged after the work (acks_late): by then each occurrence in it is finished, running
    under a renewed lease (the reaper's if this process dies), or handed back with an envelope of its own.
    A message that is not an envelope is logged and dropped, never raised: raising would only fail it the same way
    again. A database failure hands the whole message back to the broker; the redelivery re-offers only the
    occurrences that are not terminal yet.
    """
    try:
        if not envelopes or unexpected_kwargs:
            raise MalformedEnvelope(
                f"expected envelope arguments, got {len(envelopes)} and {len(unexpected_kwargs)} keyword"
            )
        parts = [(_tenant_of(envelope), decode_content(envelope)) for envelope in envelopes]
        came_in = {
            occurrence_id: envelope_id
            for envelope, (_, pairs) in zip(envelopes, parts, strict=True)
            if (envelope_id := envelope_id_of(envelope)) is not None
            for occurrence_id, _ in pairs
        }
    except MalformedEnvelope as exc:
        counters.WORKER_DROPPED_MESSAGES.labels("malformed_envelope").inc()
        logger.error(
            "dropped malformed envelope (task %s): %s",
            self.request.id,
            exc,
            extra={"action": "malformed_envelope"},
        )
        return {}
    worker_name = f"{self.request.hostname or socket.gethostname()}/{os.getpid()}"
    outcomes = envelope_runner(worker_name).run_parts(parts, worker_name, came_in)
    retry = outcomes.get(Tally.DB_ERROR, 0) + outcomes.get(Tally.NOT_RUN, 0)
    if retry:
        logger.error(
            "envelope %s: %d of %d occurrences not processed; handing it back to the broker",
            self.request.id,
            retry,
            sum(len(part) for _, part in parts),
            extra={"action": "envelope_requeue"},
        )
        time.sleep(REQUEUE_PAUSE_SECONDS)
        raise Reject("database unavailable", requeue=True)
    counts = {str(outcome): count for outcome, count in outcomes.items()}  # the names, not the enums' reprs
    logger.info("envelope %s done: %s", self.request.id, counts, extra={"action": "envelope_done"})
    return counts


def _tenant_of(envelope: Any) -> int | None:
    """The tenant the envelope's body names; the claim reads it from the rows when it can (this is for when none
    could be read)."""
    tenant_id = envelope.get("tenant_id") if isinstance(envelope, dict) else None
    return tenant_id if isinstance(tenant_id, int) and not isinstance(tenant_id, bool) else None


_runner: EnvelopeRunner | None = None
_runner_pid: int | None = None
_runner_lock = threading.Lock()


def envelope_runner(worker_name: str) -> EnvelopeRunner:
    """This process's runner, created on first use (in a prefork child, after the fork). `worker_name` is the name
    its attempts carry; its heartbeat carries the same, so the console can tell which process holds which runs."""
    global _runner, _runner_pid
    with _runner_lock:
        if _runner is None or _runner_pid != os.getpid():
            _runner, _runner_pid = EnvelopeRunner(settings.SCHEDULER_WORKER_THREADS), os.getpid()
            # A pool process has no loop of its own: its flusher thread also keeps its heartbeat.
            counters.start_flushing(settings.SCHEDULER_HEARTBEAT_SECONDS, heartbeat=lambda: (worker_name[:200], ROLE))
        return _runner


def shutdown() -> None:
    """Finish running occurrences, stop the threads and close their connections (worker exit, test teardown)."""
    global _runner
    with _runner_lock:
        runner, _runner = _runner, None
    if runner is not None and _runner_pid == os.getpid():
        runner.close()
    stop_lease_renewer()
    counters.stop_flushing()


@worker_init.connect
def _lower_cpu_priority(**_: Any) -> None:
    """Before the pool starts, so every pool process inherits it (SCHEDULER_WORKER_NICENESS)."""
    if settings.SCHEDULER_WORKER_NICENESS:
        os.nice(settings.SCHEDULER_WORKER_NICENESS)


_notifier: NotificationSender | None = None


@worker_ready.connect
def _start_notifier(**_: Any) -> None:
    """One sender of notifications per worker (its main process, after the pool started: not forked into it)."""
    global _notifier
    if _notifier is None:
        _notifier = NotificationSender()
        _notifier.start()


@worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    shutdown()


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    global _notifier
    if _notifier is not None:
        _notifier.stop()
        _notifier = None
    shutdown()


@task_unknown.connect
def _on_unknown_task(name: str | None = None, **kwargs: Any) -> None:
    # Celery has already logged the body and rejected the message (dropped: our queues have no dead-letter exchange).
    counters.WORKER_DROPPED_MESSAGES.labels("unknown_task").inc()
    logger.error("dropped message of unknown task %r (id %s)", name, kwargs.get("id"), extra={"action": "unknown_task"})


@task_rejected.connect
def _on_rejected(message: Any = None, exc: Exception | None = None, **_: Any) -> None:
    # Celery has already logged the message (and, for a decodable one, why it is no task) and rejected it.
    counters.WORKER_DROPPED_MESSAGES.labels("invalid_message").inc()
    logger.error(
        "dropped a message that is not a task: %s",
        exc if exc is not None else "no task header",
        extra={"action": "invalid_message"},
    )
