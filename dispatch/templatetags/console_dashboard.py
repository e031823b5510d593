"""`{% scheduler_dashboard %}`: the dashboard panels on the console's index (templates/admin/index.html), and `|utc`,
the one way the dashboard writes an instant (the console's UTC format, schedules/admin/formatting.py)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django import template
from django.http import HttpRequest

from core.clock import db_now
from dispatch import dashboard
from scheduler_project.console import parse_instant_text
from schedules.admin.formatting import format_utc
from tenants.access import scope_list, tenant_scope

register = template.Library()
logger = logging.getLogger(__name__)

# The page asks the browser to refresh the dashboard this often (dispatch/static/dispatch/dashboard.js).
REFRESH_SECONDS = 30


@register.filter
def utc(instant: datetime | None) -> str:
    """An instant in UTC, as the rest of the console writes it: '2026-12-06 04:10 UTC', seconds when not zero."""
    return format_utc(instant)


def _lag_window(request: HttpRequest | None, now: datetime) -> tuple[dashboard.LagWindow, str]:
    """The lag chart's window from the query string, and what was wrong with a custom range (then the default hour):
    ?lag=1h|6h|24h|7d, or ?lag_from=&lag_to= (UTC unless an offset is given; lag_to defaults to now)."""
    if request is None:
        return dashboard.lag_window(None), ""
    since_text, until_text = request.GET.get("lag_from", "").strip(), request.GET.get("lag_to", "").strip()
    if not since_text and not until_text:
        # An unknown ?lag= value is the default hour (never an error page).
        return dashboard.lag_window(request.GET.get("lag")), ""
    try:
        since = parse_instant_text(since_text)
        until = parse_instant_text(until_text) if until_text else now
        title = f"{format_utc(since)} to {format_utc(min(until, now))}"
        return dashboard.custom_lag_window(since, until, now=now, title=title), ""
    except ValueError as exc:
        return dashboard.lag_window(None), f"Range ignored: {exc}"


@register.inclusion_tag("admin/dispatch/dashboard.html", takes_context=True)
def scheduler_dashboard(context: dict[str, Any]) -> dict[str, Any]:
    request = context.get("request")
    try:
        window, range_error = _lag_window(request, db_now())
        scope = scope_list(tenant_scope(request)) if request is not None else []
        return {
            "dash": dashboard.build(lag=window, tenant_ids=scope),
            "request": request,
            "range_error": range_error,
            "refresh_seconds": REFRESH_SECONDS,
            "lag_from": request.GET.get("lag_from", "") if request is not None else "",
            "lag_to": request.GET.get("lag_to", "") if request is not None else "",
        }
    except Exception:
        # The index must still open (and link everywhere) when a figure cannot be read.
        logger.exception("dashboard failed", extra={"action": "dashboard"})
        return {"dash": None, "request": context.get("request"), "refresh_seconds": REFRESH_SECONDS}
