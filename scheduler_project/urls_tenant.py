"""Routes of a tenant host: the REST API and health."""

from django.http import HttpRequest, JsonResponse
from django.urls import include, path

from scheduler_project.health import healthz
from scheduler_project.unavailable import api_server_error

urlpatterns = [
    path("api/v1/", include("schedules.api.urls")),
    path("healthz", healthz, name="tenant-healthz"),
]


def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """A path no route matches (say a malformed id, /api/v1/schedules/0.5/) answers as the API's own 404s do,
    in JSON, instead of with Django's HTML page: a tenant host serves only the API."""
    return JsonResponse({"detail": "Not found."}, status=404)


handler404 = not_found
handler500 = api_server_error
