"""/healthz: whether the platform keeps its promise now, not only whether the web process runs.

200 `ok` only when PostgreSQL and RabbitMQ answer, a materializer and a relay wrote a heartbeat recently, no
active cursor is more than SCHEDULER_HEALTH_BEHIND_SECONDS in the past, and no table that autovacuum does not look
after is ten times past its vacuum threshold. Otherwise 503: `unavailable` when the database or the broker is down,
`degraded` when they answer but fires would not go out on time (or soon would not), with the reasons.
A readiness and alerting signal for the platform; restarting the web process would mend none of these.

`autovacuum` says whether the server runs it; when it does not, `warnings` says so and the answer stays 200 as long
as the materializers' upkeep keeps the tables vacuumed (dispatch/upkeep.py). `warnings` also says when most of the
server's checkpoints were forced by WAL volume (max_wal_size too small for the load).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from kombu import Connection

from dispatch.metrics import live_heartbeat_seconds
from dispatch.sql import metrics as metrics_sql
from dispatch.upkeep import database_health

logger = logging.getLogger(__name__)

# Short: a health probe that hangs is worse than one that says "down".
BROKER_TIMEOUT_SECONDS = 2.0


def _engine() -> tuple[int, int, float] | None:
    """(live materializers, live relays, seconds the earliest cursor is behind now), or None: database down."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                metrics_sql.HEALTH_PROBE, {"ttl": live_heartbeat_seconds(), "shards": settings.SCHEDULER_SHARDS}
            )
            materializers, relays, behind = cursor.fetchone()
        return materializers, relays, float(behind or 0)
    except Exception:
        logger.warning("health check: database unreachable", exc_info=True, extra={"action": "healthz"})
        return None


def _database() -> tuple[str, list[str], list[str]] | None:
    """database_health's (autovacuum, warnings, reasons), or None when the database does not answer."""
    try:
        with connection.cursor() as cursor:
            return database_health(cursor)
    except Exception:
        logger.warning("health check: database unreachable", exc_info=True, extra={"action": "healthz"})
        return None


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
    engine = _engine()
    broker = _broker_ok()
    body: dict[str, object] = {"database": "ok" if engine else "down", "broker": "ok" if broker else "down"}
    reasons = []
    if not engine:
        reasons.append("PostgreSQL does not answer")
    if not broker:
        reasons.append("RabbitMQ does not answer")
    if engine:
        materializers, relays, behind = engine
        ttl = live_heartbeat_seconds()
        body["materializer"] = "ok" if materializers else "silent"
        body["relay"] = "ok" if relays else "silent"
        limit = settings.SCHEDULER_HEALTH_BEHIND_SECONDS
        body["materialization"] = "behind" if behind > limit else "ok"
        if not materializers:
            reasons.append(f"no materializer wrote a heartbeat in the last {ttl:.0f} s")
        if not relays:
            reasons.append(f"no relay wrote a heartbeat in the last {ttl:.0f} s")
        if behind > limit:
            reasons.append(f"the earliest active cursor is {behind:.0f} s behind now (limit {limit:.0f} s)")
    database = _database() if engine else None
    if database:
        body["autovacuum"], body["warnings"], database_reasons = database
        reasons.extend(database_reasons)
    status = "ok" if not reasons else ("unavailable" if not (engine and broker) else "degraded")
    return JsonResponse({"status": status, **body, "reasons": reasons}, status=200 if status == "ok" else 503)
