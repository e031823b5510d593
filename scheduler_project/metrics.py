"""Prometheus exposition at /metrics (public host): this process's registry plus the scheduler's DB gauges."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from dispatch.metrics import SchedulerCollector

# A registry of its own for the DB-derived gauges, so other processes importing prometheus_client's default
# registry never run these queries.
SCHEDULER_REGISTRY = CollectorRegistry(auto_describe=False)
SCHEDULER_REGISTRY.register(SchedulerCollector())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse("401 Unauthorized: send Authorization: Bearer <SCHEDULER_METRICS_TOKEN>.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        response["Content-Type"] = "text/plain; charset=utf-8"
        return response
    body = generate_latest(REGISTRY) + generate_latest(SCHEDULER_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def _allowed(request: HttpRequest) -> bool:
    """With SCHEDULER_METRICS_TOKEN set: its bearer token (compared in constant time), or a superuser's console
    session (the console links here); otherwise anyone."""
    token = settings.SCHEDULER_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_superuser)
