"""Settings of a bare django-celery-beat project: the project a tenant migrates from, in the importer's tests.

Its default database is BEAT_DATABASE_URL and its only app django-celery-beat, so django-celery-beat's own
migrations build the tables and its own models write the rows that `manage.py import_celery_beat` then reads
(tests/integration/test_import_celery_beat.py). USE_TZ as in any current Django project: aware timestamps.
"""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "celery-beat-project-of-the-importer-tests"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {"default": dj_database_url.parse(os.environ["BEAT_DATABASE_URL"])}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
