"""`{% scheduler_dashboard %}`: the dashboard panels on the console's index (templates/admin/index.html)."""

from __future__ import annotations

import logging
from typing import Any

from django import template

from dispatch import dashboard
from tenants.access import scope_list, tenant_scope

register = template.Library()
logger = logging.getLogger(__name__)


@register.inclusion_tag("admin/dispatch/dashboard.html", takes_context=True)
def scheduler_dashboard(context: dict[str, Any]) -> dict[str, Any]:
    try:
        request = context.get("request")
        # ?lag= picks the lag chart's window; an unknown value is the default hour (never an error page).
        window = dashboard.lag_window(request.GET.get("lag") if request is not None else None)
        scope = scope_list(tenant_scope(request)) if request is not None else []
        return {"dash": dashboard.build(lag=window, tenant_ids=scope), "request": request}
    except Exception:
        # The index must still open (and link everywhere) when a figure cannot be read.
        logger.exception("dashboard failed", extra={"action": "dashboard"})
        return {"dash": None, "request": context.get("request")}
