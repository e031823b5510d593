"""The answer to a request that failed: 503 with Retry-After when the database was away, else a plain 500.

A request that meets a database failover (the primary lost, the standby promoting: docs/DEPLOYMENT.md) fails on a
connection that is gone; the next request opens a new one on the new primary. That is the server being briefly
unavailable, not broken, so the client is told 503 and when to retry, instead of Django's 500. A tenant host serves
only the API, so its answers are JSON; the console host's are short text (but a request that failed before its host
was looked up, which needs the database too, is answered as the API's).
"""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

# Seconds a client waits before its retry: a promotion and the reconnect take about one (DEPLOYMENT.md, measured).
RETRY_AFTER_SECONDS = 2
UNAVAILABLE = "The database is unavailable for a moment (a failover or a restart). Retry shortly."


# SQLSTATEs of a server going away: class 08 (connection exception) and 57P01-57P03 (admin or crash shutdown, cannot
# connect now: a standby still promoting). Other OperationalErrors (a deadlock, a statement timeout, a full disk, too
# many connections) are not a failover, and a retry in two seconds would not be the answer.
_AWAY_CLASS = "08"
_AWAY_STATES = {"57P01", "57P02", "57P03"}


def database_was_away() -> bool:
    """The exception being handled is a lost or refused database connection: a client-side failure (no SQLSTATE:
    the server closed the connection, refused it, or never answered) or one of the states above."""
    exc = sys.exc_info()[1]
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    if isinstance(exc, InterfaceError):
        return True  # the connection is already closed
    state = getattr(exc.__cause__, "sqlstate", None)
    return state is None or state.startswith(_AWAY_CLASS) or state in _AWAY_STATES


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
