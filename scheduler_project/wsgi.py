"""WSGI entry point for the web process."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
application = get_wsgi_application()
