"""The answer to a request that failed: 503 with Retry-After when the database was away, else a plain 500.

A request that meets a database failover (the primary lost, the standby promoting: docs/DEPLOYMENT.md) fails on a
connection that is gone; the next request opens a new one on the new primary. That is the server being briefly
unavailable, not broken, so the client is told 503 and when to retry, instead of Django's 500. A tenant host serves
only the API, so its answers are JSON; the console host's are short text.
"""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

# Seconds a client waits before its retry: a promotion and the reconnect take about one (DEPLOYMENT.md, measured).
RETRY_AFTER_SECONDS = 2
UNAVAILABLE = "The database is unavailable for a moment (a failover or a restart). Retry shortly."


def database_was_away() -> bool:
    """The exception being handled is a lost or refused database connection."""
    return isinstance(sys.exc_info()[1], OperationalError | InterfaceError)


def api_server_error(request: HttpRequest) -> HttpResponse:
    """handler500 of a tenant host."""
    if database_was_away():
        return JsonResponse({"detail": UNAVAILABLE}, status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return JsonResponse({"detail": "Server error."}, status=500)


def console_server_error(request: HttpRequest) -> HttpResponse:
    """handler500 of the console host."""
    if database_was_away():
        return HttpResponse(
            UNAVAILABLE, status=503, content_type="text/plain", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    return HttpResponse("Server error.", status=500, content_type="text/plain")
