"""Settings for peer benchmarks (`manage.py bench peer-beat`): the normal settings plus django-celery-beat."""

from __future__ import annotations

from scheduler_project.settings import *  # noqa: F403
from scheduler_project.settings import INSTALLED_APPS, SHARED_APPS

# Only the peer benchmark needs django-celery-beat (requirements-bench.txt); the product never runs beat.
# django-tenants creates a shared app's tables in the public schema only, which is where beat reads them.
SHARED_APPS = [*SHARED_APPS, "django_celery_beat"]
INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]

# Beat's publishes wait for the broker's confirm, as the relay's do: the lag of both is the time to a durable copy.
CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
