"""Project package; loads the Celery app so shared tasks bind to it."""

from scheduler_project.celery import app as celery_app

__all__ = ["celery_app"]
