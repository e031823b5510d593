"""Prometheus exposition at /metrics (public host): this process's registry plus the scheduler's DB gauges."""

from __future__ import annotations

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
    body = generate_latest(REGISTRY) + generate_latest(SCHEDULER_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
