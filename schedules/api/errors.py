"""Maps domain exceptions of the services to HTTP answers, so views never translate errors ad hoc."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import AuthenticationFailed, NotAuthenticated, Throttled
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from dispatch.services import ReplayRefused
from schedules.api.throttles import unauthenticated_wait
from schedules.errors import Gone, QuotaExceeded, ScheduleInvalid, StateConflict
from tenants.errors import ChangeRefused, FieldsInvalid, LimitReached


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ScheduleInvalid | FieldsInvalid):
        return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Gone):
        return Response({"detail": exc.message}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, StateConflict):
        return Response({"detail": exc.message}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ChangeRefused):
        return Response({"detail": exc.message}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ReplayRefused):
        # The data plane's own refusal: the occurrence is not dead, or its schedule is canceled.
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, QuotaExceeded | LimitReached):
        return Response(
            {"detail": exc.message},
            status=status.HTTP_429_TOO_MANY_REQUESTS,
            headers={"Retry-After": str(exc.retry_after_seconds)},
        )
    if isinstance(exc, NotAuthenticated | AuthenticationFailed) and "request" in context:
        # A missing or bad token spends its address's budget (see throttles.unauthenticated_wait).
        wait = unauthenticated_wait(context["request"], context.get("view"))
        if wait is not None:
            exc = Throttled(wait=wait)
    return drf_exception_handler(exc, context)
