"""The operator console's answer to a locked-out login (django-axes): its own page, a 429 with Retry-After."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

logger = logging.getLogger(__name__)


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the login page's frame with the reason and how long to wait.

    Every attempt during a lockout starts the cool-off again (axes' default), so the whole period is the wait.
    """
    seconds = max(1, math.ceil(settings.AXES_COOLOFF_TIME.total_seconds()))
    minutes = math.ceil(seconds / 60)
    logger.warning("admin login locked out", extra={"action": "admin_login_lockout"})
    context = {
        **admin.site.each_context(request),
        "title": "Login locked",
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_minutes": minutes,
    }
    response = render(request, "admin/lockout.html", context, status=429)
    response["Retry-After"] = str(seconds)
    return response
