"""Liveness of what the product depends on: /healthz answers 200 only when PostgreSQL and RabbitMQ answer."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from kombu import Connection

logger = logging.getLogger(__name__)

# Short: a health probe that hangs is worse than one that says "down".
BROKER_TIMEOUT_SECONDS = 2.0


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        logger.warning("health check: database unreachable", exc_info=True, extra={"action": "healthz"})
        return False


def _broker_ok() -> bool:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=BROKER_TIMEOUT_SECONDS) as broker:
            broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
        return True
    except Exception:
        logger.warning("health check: broker unreachable", exc_info=True, extra={"action": "healthz"})
        return False


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _database_ok(), "broker": _broker_ok()}
    healthy = all(checks.values())
    body = {
        "status": "ok" if healthy else "unavailable",
        **{k: "ok" if v else "down" for k, v in checks.items()},
    }
    return JsonResponse(body, status=200 if healthy else 503)
