"""The Celery application: RabbitMQ broker, configuration from Django settings (CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

app = Celery("scheduler_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
