"""Celery configuration of the data plane: the queues workers consume, delivery guarantees, handler modules.

Applied as defaults under the Django CELERY_* settings (scheduler_project/celery.py), so a CELERY_* setting still
wins. `celery -A scheduler_project worker` with no options then consumes both lanes and their crowd queues.
"""

from __future__ import annotations

from typing import Any

from kombu import Exchange, Queue

# The relay publishes envelopes to the default exchange ("") with routing key = queue name, so the queues need no
# binding of their own. They are durable, with the x-arguments of dispatch.queues.queue_arguments (none for classic
# queues, x-queue-type for quorum ones): the relay declares the same queues with aio-pika, and RabbitMQ refuses a
# redeclaration whose flags or arguments differ (PRECONDITION_FAILED).
DEFAULT_EXCHANGE = Exchange("", type="direct")


def task_queues() -> tuple[Queue, ...]:
    # Imported here: queue names come from Django settings, which this module must not load (celery.py imports
    # it while the settings module itself may still be importing).
    from dispatch.queues import CONSUMED_QUEUES, queue_arguments

    return tuple(
        Queue(
            name,
            exchange=DEFAULT_EXCHANGE,
            routing_key=name,
            durable=True,
            auto_delete=False,
            queue_arguments=queue_arguments() or None,
        )
        for name in CONSUMED_QUEUES
    )


def handler_modules() -> list[str]:
    """Modules that register handlers with @handler: the built-in webhook plus SCHEDULER_HANDLER_MODULES
    (comma-separated; the tests use `tests.handlers`)."""
    from django.conf import settings

    return ["dispatch.handlers.webhook", *(name.strip() for name in settings.SCHEDULER_HANDLER_MODULES if name.strip())]


def celery_defaults() -> dict[str, Any]:
    """Evaluated lazily by Celery (app.add_defaults), after Django's settings are loaded."""
    from dispatch.queues import STRICT_QUEUE

    return {
        "task_queues": task_queues(),
        "task_default_queue": STRICT_QUEUE,
        "task_default_exchange": "",
        "task_default_routing_key": STRICT_QUEUE,
        # A message is acknowledged only after its envelope is done; a worker killed mid-envelope gets it
        # redelivered, and the redelivery re-offers only occurrences that are not terminal.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # Each envelope carries up to SCHEDULER_ENVELOPE_SIZE occurrences and occupies a process until they are
        # done or its turn ends (SCHEDULER_ENVELOPE_SLICE_SECONDS): reserving more would park envelopes behind a
        # slow one while other workers idle.
        "worker_prefetch_multiplier": 1,
        # Celery's Django fix-up closes every database connection before and after each task unless this is set:
        # a new connection (and its SET search_path) per envelope cost ~10 ms. Kept for 2 x this many tasks; a
        # connection that broke meanwhile is closed by the engine on its first error and opened again.
        "CELERY_DB_REUSE_MAX": 1000,
        # Keep Django's LOGGING (one format, the `action` field) instead of Celery's own root handler.
        "worker_hijack_root_logger": False,
        # Imported by the worker at start, so every handler the schedules name is registered before the first
        # message (dispatch.tasks registers the task; autodiscovery finds it too).
        "imports": ("dispatch.tasks", *handler_modules()),
    }
