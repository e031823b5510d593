"""Routes of a tenant host: the REST API and health."""

from django.urls import include, path

from scheduler_project.health import healthz

urlpatterns = [
    path("api/v1/", include("schedules.api.urls")),
    path("healthz", healthz, name="tenant-healthz"),
]
