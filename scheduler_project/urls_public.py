"""Routes of the public host: the operator console, metrics and health."""

from django.contrib import admin
from django.urls import path

from scheduler_project.health import healthz
from scheduler_project.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("healthz", healthz, name="healthz"),
]
