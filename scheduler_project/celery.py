"""The Celery application: RabbitMQ broker, configuration from Django settings (CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery

from dispatch.celeryconfig import celery_defaults

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

app = Celery("scheduler_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The data plane's queues and worker behaviour; a CELERY_* Django setting still overrides each of them.
app.add_defaults(celery_defaults)
app.autodiscover_tasks()
