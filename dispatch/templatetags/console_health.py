"""`{% console_health %}`: the platform's health as a banner on the console's pages (templates/admin/base_site.html).

The same judgement as /healthz (scheduler_project/health.py assess), in words. The dashboard asks for a fresh one
and always shows it; every other page shows the latest assessment of its process (at most a few seconds old) and
only when something is wrong, so a page view costs no probe most of the time.
"""

from __future__ import annotations

import logging
from typing import Any

from django import template
from django.db import connection

from scheduler_project.health import assess, recent_health
from tenants.access import sees_every_tenant

register = template.Library()
logger = logging.getLogger(__name__)

HEADLINES = {
    "ok": "Healthy: every process reports and fires go out on time.",
    "degraded": "Degraded: fires are not going out on time.",
    "unavailable": "Unavailable: PostgreSQL or RabbitMQ does not answer.",
}


@register.inclusion_tag("admin/console_health.html", takes_context=True)
def console_health(context: dict[str, Any], fresh: bool = False) -> dict[str, Any]:
    """The banner for a signed-in operator (nothing for anyone else: the login and lockout pages show none).
    `fresh`: assess now and show it even when all is well (the dashboard)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    # Not in a related-object popup, nor in a request whose transaction failed (the probe could not run there and
    # would misreport the database as down).
    if user is None or not (user.is_active and user.is_staff) or context.get("is_popup") or connection.needs_rollback:
        return {"health": None}
    try:
        health = assess() if fresh else recent_health()
    except Exception:
        # A page must still open when its banner cannot be read.
        logger.exception("health banner failed", extra={"action": "healthz"})
        return {"health": None}
    return {
        "health": health,
        "show": fresh or not health.ok,
        "fresh": fresh,
        "headline": HEADLINES.get(health.status, health.status),
        # The reasons name platform processes, the relay's backlog and the database: the platform's operators' to
        # read. An operator scoped to some tenants gets the headline, as the dashboard shows them no process list.
        "details": request is not None and sees_every_tenant(request),
    }
